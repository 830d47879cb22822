"""Reclaiming leases: expired ones, and those whose holder process died.

A vectorised pass over the state tables finds LEASED words whose deadline passed (reclaimed as
*expired*) and leases whose holder is gone (reclaimed as *holder died*): the owner index in the
owner word is probed with ``F_OFD_GETLK`` (ringq/engine/owner.py); an unlocked index means the holder is
dead.  The reclaimer holds that index's lock itself while it reclaims, so no new process can adopt
the index mid-way.  Reclaiming CASes ``LEASED(n)`` to ``READY(n)`` with the reason, or to ``DEAD(n)``
when the attempts are used up.  Reads show leases a reclaim would end as what it would make them
(:meth:`Reaper.show_reclaimed`), without writing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from . import transitions
from .control import Control
from .index import Index, View, now_ms
from .owner import OwnerRegistry
from .words import (
    END_RECLAIMED,
    FLAG_CANCEL,
    ST_DEAD,
    ST_DONE,
    ST_LEASED,
    ST_READY,
    WHY_DIED,
    WHY_EXPIRED,
    lease_count,
    np_cancel_flag,
    np_lease_count,
    np_owner_index,
    np_owner_lease_count,
    np_pack,
    np_rel_time,
    np_state,
    owner_index,
    state,
)

if TYPE_CHECKING:  # pragma: no cover
    from .ring import Ring

__all__ = ["Reaper", "REAP_INTERVAL", "CLAIM_GRACE"]

REAP_INTERVAL = 0.25  # seconds between scans for expired leases and dead holders
FLOOR_RESCAN = 0.005  # seconds between scans while the lease-deadline floor stays in the past
# Seconds the schedule check may use a floor it read before (a lease or ack in a tight loop then
# loads the shared word once a millisecond, not per call); an expiry is seen at most this late.
FLOOR_READ_EVERY = 0.001
CLAIM_GRACE = 2.0  # seconds a lease may stay without its owner word before it counts as orphaned


class Reaper:
    """Reclaims leases of one queue for this process.  ``owners.held`` are the leases this process
    holds (never reclaimed as a dead predecessor's)."""

    interval = REAP_INTERVAL  # a sleeping lease looks again at least this often (seconds)

    def __init__(
        self,
        ring: Ring,
        index: Index,
        owners: OwnerRegistry,
        on_changed: Callable[[View, int, int], None] | None = None,
    ) -> None:
        self.ring = ring
        self.index = index
        self.owners = owners
        # Told of each lease a pass ended (view, slot, new word), after the pass: the jobs that
        # wait for it (ringq/engine/deps.py).
        self.on_changed = on_changed
        self._changed: list[tuple[View, int, int]] = []
        self.last = 0.0
        self._floor = (-1.0, 0)  # (monotonic time read, floor ms) for the schedule check
        # Monotonic time before which due() is known to be False (read by the lease path, which
        # calls due() only from then on).
        self.quiet_until = 0.0
        self.unowned: dict[tuple[int, int, int], float] = {}  # (seg, slot, word) -> first seen

    def until_floor(self) -> float:
        """Seconds until the earliest lease of the queue may expire (plus 1 ms), if that is ahead."""
        ahead = self.ring.ctl.deadline_floor()[1] / 1000 - time.time()
        return ahead + 0.001 if ahead > 0 else REAP_INTERVAL

    def due(self) -> bool:
        """True if :meth:`reap` without ``force`` would scan now (its schedule, below)."""
        t = time.monotonic()
        if t < self.quiet_until:  # the last answer was False and cannot change before then
            return False
        if t - self.last >= REAP_INTERVAL:
            return True
        if t - self.last < FLOOR_RESCAN:
            self.quiet_until = self.last + FLOOR_RESCAN
            return False
        read_at, floor_ms = self._floor
        if t - read_at >= FLOOR_READ_EVERY:
            read_at, floor_ms = t, self.ring.ctl.deadline_floor()[1]
            self._floor = (read_at, floor_ms)
        ahead_ms = floor_ms - now_ms()
        if ahead_ms < 0:
            return True
        # No sooner than the next read of the floor, the floor itself, or the interval's end.
        self.quiet_until = min(
            read_at + FLOOR_READ_EVERY, t + ahead_ms / 1000, self.last + REAP_INTERVAL
        )
        return False

    def reap(self, force: bool = False) -> int:
        """Return expired leases and leases of dead holders to READY (or DEAD); returns how many.

        Runs when the earliest lease of the queue may have expired (the control file's deadline
        floor), so an expired lease is leasable again within milliseconds; otherwise every
        REAP_INTERVAL, for dead holders.  FLOOR_RESCAN spaces scans while the floor stays in the
        past (a scan could not raise it because leases were taken meanwhile)."""
        ctl: Control = self.ring.ctl
        if not force and not self.due():
            return 0
        t = time.monotonic()
        now = now_ms()
        floor_word = ctl.deadline_floor()[0]  # read fresh: the scan may raise it (below)
        self.last = t
        self.quiet_until = 0.0
        earliest = Control.FLOOR_NEVER
        mine = self.owners.mine()
        held = self.owners.held
        reclaimed = 0
        unowned: dict[tuple[int, int, int], float] = {}
        suspects: dict[int, list[tuple[View, int, int]]] = {}
        for view, leased, w, owners in self.index.leases():
            seg = view.seg
            deadlines = np_rel_time(w) + seg.epoch_ms
            expired = deadlines < now
            if not expired.all():
                earliest = min(earliest, int(deadlines[~expired].min()))
            for slot, word in zip(leased[expired].tolist(), w[expired].tolist()):
                reclaimed += self.reclaim(view, slot, word, WHY_EXPIRED, now)
            tagged = np_owner_lease_count(owners) == np_lease_count(w)
            # A claim is two CAS: the state word, then the owner word.  A claimer killed between
            # them leaves a lease nobody owns, which only the visibility timeout would free.  A
            # claimer is alive for microseconds there: a lease still unowned after CLAIM_GRACE
            # seconds is orphaned, and reclaimed as its holder's death.
            for slot, word in zip(
                leased[~expired & ~tagged].tolist(), w[~expired & ~tagged].tolist()
            ):
                key = (seg.seq, slot, word)
                first = unowned[key] = self.unowned.get(key, t)
                if t - first >= CLAIM_GRACE:
                    reclaimed += self.reclaim(view, slot, word, WHY_DIED, now)
            live = ~expired & tagged
            for slot, word, own in zip(
                leased[live].tolist(), w[live].tolist(), owners[live].tolist()
            ):
                idx = owner_index(own)
                if not idx:
                    continue  # a detached lease: only its visibility timeout ends it
                if idx == mine:
                    # Ours, yet neither held nor being claimed: a dead predecessor's (our index).
                    if (seg.seq, slot) not in held and not self.owners.is_claiming(seg.seq, slot):
                        reclaimed += self.reclaim(view, slot, word, WHY_DIED, now)
                else:
                    suspects.setdefault(idx, []).append((view, slot, word))
        for idx, leases in suspects.items():
            if self.owners.is_alive(idx) or not self.owners.try_hold(idx):
                continue  # alive, or a new process took the index in between: it reclaims these itself
            try:
                for view, slot, word in leases:
                    reclaimed += self.reclaim(view, slot, word, WHY_DIED, now)
            finally:
                self.owners.release(idx)
        self.unowned = unowned
        ctl.raise_deadline_floor(floor_word, earliest)
        changed, self._changed = self._changed, []
        if self.on_changed is not None:
            for view, slot, word in changed:
                self.on_changed(view, slot, word)
        self.ring.segs.retire_finished(thorough=force)
        return reclaimed

    def reclaim(self, view: View, slot: int, word: int, reason: int, now: int) -> int:
        """CAS one lease ``word`` back to READY (DEAD if its attempts are used up); 1 if done.

        The attempts come from the index's copy of the record: a lease of a record this index has
        not read yet (appended and leased by others since its last catch-up) is read in first.
        A record that does not read in keeps its job READY: its attempts are not known."""
        seg = view.seg
        if state(word) != ST_LEASED:
            return 0  # the live table moved between the scan and the copy: not a lease any more
        self.index.read_through(view, slot)
        maxatt = int(view.maxatt[slot])
        dead = maxatt > 0 and int(view.attb[slot]) + lease_count(word) >= maxatt
        new = transitions.failed(word, reason, dead, now - seg.epoch_ms)
        ok, _ = seg.cas_state(slot, word, new)
        if ok:
            self._changed.append((view, slot, new))
        if ok and state(new) == ST_READY:
            self.ring.note_returned(seg)
        elif ok and state(new) == ST_DONE:  # a cancel-requested lease ends cancelled
            self.ring.segs.note_finished(seg)
        elif ok:
            self.ring.ctl.count("dead")
        return int(ok)

    def show_reclaimed(
        self,
        view: View,
        tbl: np.ndarray,
        slots_of: np.ndarray | None = None,
        now: int | None = None,
    ) -> None:
        """Rewrite, in ``tbl`` -- a private copy of rows of ``view``'s state table (state and owner
        word; row i is slot ``slots_of[i]``, or slot i if None) -- each lease that a reclaim would
        end (expired, or held by a dead process) as the word the reclaim would write, as of ``now``
        (ms since the epoch; default: the clock now).  A caller that also compares the shown words
        with a time must pass that same time: a shown reclaim is due at ``now``, so a later clock
        reading here would make it look delayed.  Never writes to the queue."""
        words = tbl[:, 0]
        leased = np.flatnonzero(np_state(words) == ST_LEASED)
        if not len(leased):
            return
        if now is None:
            now = now_ms()
        seg = view.seg
        w = words[leased]
        own = tbl[leased, 1]
        lc = np_lease_count(w)
        expired = np_rel_time(w) + seg.epoch_ms < now
        why = np.where(expired, WHY_EXPIRED, WHY_DIED)
        idx = np_owner_index(own)
        tagged = np_owner_lease_count(own) == lc
        mine = self.owners.mine()
        dead_owner = np.zeros(len(leased), bool)
        for i in np.unique(idx[tagged & ~expired & (idx != 0)]).tolist():
            if i != mine and not self.owners.is_alive(int(i)):
                dead_owner |= tagged & (idx == i)
        hit = expired | dead_owner
        if not hit.any():
            return
        rows = leased[hit]
        slots = rows if slots_of is None else slots_of[rows]
        maxatt = view.maxatt[slots].astype(np.int64)
        out_of_tries = (maxatt > 0) & (
            view.attb[slots].astype(np.int64) + lc[hit].astype(np.int64) >= maxatt
        )
        st = np.where(out_of_tries, ST_DEAD, ST_READY)
        shown = np_pack(st, why[hit], lc[hit], max(now - seg.epoch_ms, 0))
        # A cancel-requested lease that a reclaim ends is cancelled (transitions.failed).
        cancel = np_cancel_flag(w[hit])
        if cancel.any():
            shown[cancel] = np_pack(
                np.full(int(cancel.sum()), ST_DONE),
                np.full(int(cancel.sum()), END_RECLAIMED),
                lc[hit][cancel],
                max(now - seg.epoch_ms, 0),
            ) | np.uint64(FLAG_CANCEL)
        words[rows] = shown
