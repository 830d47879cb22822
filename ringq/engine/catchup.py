"""Catching up: how a reader's index learns what other processes did -- new segments, new records
(validated by ``ringq_seg_scan``, read into the per-slot arrays and lanes of ringq/engine/views.py), jobs
returned to READY -- cheaply when nothing moved.  A :class:`CatchUp` belongs to one
:class:`ringq.engine.index.Index`: it fills the index's views and known ids and hands jobs to its
ordering (``park``, ``queue_lane``, ``queue_lane_next``); the catch-up stamp and the scan buffer
are its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ringq import codec

from . import records
from .deps import lost_word
from .lifecycle import key_of, key_problem, keys_of_plain
from .meta import KIND_META
from .transitions import gone
from .views import Lane, View, key_id, lane_key, lane_keys, now_ms
from .words import (
    ST_DEAD,
    ST_EMPTY,
    ST_LEASED,
    ST_READY,
    WHY_NONE,
    np_cancel_flag,
    np_state,
    pack,
    split_position,
    state,
)

if TYPE_CHECKING:  # pragma: no cover
    from .index import Index
    from .ring import Ring
    from .segment import Segment

__all__ = ["CatchUp", "FEW", "FULL_CATCH_UP"]

FEW = 8  # records an ingest reads field by field rather than through numpy arrays
FULL_CATCH_UP = 1.0  # seconds: a catch-up looks at every segment at least this often


class CatchUp:
    """Catching up ``index`` with other processes."""

    def __init__(self, index: Index) -> None:
        self.index = index
        self.ring: Ring = index.ring
        self._few = records.FewScanner(FEW)
        self._stamp: tuple[int, int] | None = None  # control words at the last catch-up
        self._stamp_until = 0.0
        self.supersede_later: set[int] = set()  # copies whose originals were found leased
        # Called for every record read in that may name other jobs -- of kind 3, or superseding
        # another -- (ringq/engine/deps.py notes dependents and reruns).
        self.on_dependent: Callable[[View, int], None] | None = None

    def forget(self) -> None:
        """The next catch-up runs in full (the views were dropped)."""
        self._stamp = None

    def quick_until(self) -> float:
        """The monotonic time until which a quick catch-up finds nothing new while the control
        file's stamp (Control.stamp) reads as at the last catch-up; after it, one runs in full."""
        return self._stamp_until if self._stamp is not None else 0.0

    def catch_up(self, quick: bool = False) -> list[View]:
        """Catch up with other processes: new segments, new records, jobs returned to READY.
        Returns the views seen sealed for the first time (the caller may relocate from them).

        Cheap when nothing moved: every append and every return to READY bumps the control file's
        wake word after it is visible, and every rotation and retirement its ring generation, so
        while both (and the tail segment) read as at the last catch-up there is nothing new to
        see.  With ``quick`` (the lease path) a catch-up is skipped then; it still runs in full at
        least every ``FULL_CATCH_UP`` seconds.  Never quick under the writer lock: a writer that
        released the lock bumps the wake word a moment later, and a caller holding the lock must
        see what it published (idempotent enqueue)."""
        try:
            ring = self.ring
            ctl = ring.ctl
            stamp = ctl.stamp()
            t = time.monotonic()
            last = self._stamp
            if quick and t < self._stamp_until and last is not None and stamp[1] == last[1]:
                if stamp[0] == last[0]:
                    return []
                # Only appends or returns since the last catch-up: no segment was created, sealed or
                # retired (each of those bumps the ring generation), so only the unsealed views can
                # have new records, and no view is newly sealed.
                self._stamp = stamp
                for view in self.index.views.values():
                    if not view.sealed and view.seg.tail() > view.scanned:
                        self._ingest(view)
                self._look_for_returned()
                return []
            self._stamp, self._stamp_until = stamp, t + FULL_CATCH_UP
            dropped = False
            for seq in ring.refresh():
                dropped |= self.index.views.pop(seq, None) is not None
            segs = ring.segs
            if len(segs) != len(self.index.views):
                for seq in [s for s in self.index.views if s not in segs]:
                    del self.index.views[seq]
                    dropped = True
                for seg in segs:
                    if seg.seq not in self.index.views:
                        self.index.views[seg.seq] = View(seg)
            if (
                dropped
            ):  # forget the ids of retired segments, or a long-lived process grows without bound
                self.index.ids = {
                    jid: loc for jid, loc in self.index.ids.items() if loc[0] in self.index.views
                }
            newly_sealed: list[View] = []
            for view in self.index.views.values():
                if view.sealed:
                    continue
                seg = view.seg
                sealed = seg.sealed()  # acquire: the final tail is visible after this
                if seg.tail() > view.scanned:
                    self._ingest(view)
                view.sealed = sealed
                if sealed:
                    newly_sealed.append(view)
            self._look_for_returned()
            return newly_sealed
        except BaseException:
            # Cut short (a signal handler's exception, between two records): records may be
            # half read in, or passed over by the scan position.  Read everything again.
            self.index.reset()
            raise

    def _look_for_returned(self) -> None:
        change = self.ring.ctl.change_counter()
        if change != self.index.seen_change:
            self.index.seen_change = change
            for view in self.index.views.values():
                c = view.seg.change()
                if c != view.change:
                    view.change = c
                    self._find_returned(view)

    def read_through(self, view: View, slot: int, held: bool = False) -> None:
        """Make sure the record at head ``slot`` of ``view`` is read in (a record a C call leased
        may be published before the wake word that announces it moves, so a quick catch-up can
        miss it).  ``held``: the caller holds (or held) that job's lease, so when it is next in its
        lane and still LEASED the lane's cursor moves past it at once, instead of queueing the
        lane for a job that is not READY (one that comes back to READY later gets its own entry,
        as any job behind a cursor)."""
        if view.scanned <= slot:
            try:
                self._ingest(view, slot if held else -1)
            except BaseException:
                self.index.reset()  # as in catch_up
                raise

    def _ingest(self, view: View, held: int = -1) -> None:
        seg = view.seg
        tail = seg.bounded_tail()
        if tail - view.scanned <= FEW:
            self._ingest_few(view, tail, held)
            return
        infos, nxt = records.scan(seg, view.scanned)
        view.scanned = nxt
        if not len(infos):
            return
        # Few numpy calls on the common path (a handful of fresh, valid, plain records): a woken
        # consumer runs this once per wake-up, so it sets the fan-out latency.
        status = infos["status"]
        if status.any():
            for row in infos[status != 0]:
                self.ring.mark_bad(
                    seg, int(row["slot"]), "record failed validation (magic, length or CRC)"
                )
            infos = infos[status == 0]
            if not len(infos):
                return
        ok = infos
        slots = ok["slot"]
        view.prio[slots] = ok["priority"]
        view.seq[slots] = ok["seq"]
        view.enq[slots] = ok["enqueued_us"]
        view.avail[slots] = ok["available_ms"]
        view.maxatt[slots] = ok["max_attempts"]
        view.attb[slots] = ok["attempts_before"]
        view.idlen[slots] = ok["id_len"]
        # Delayed jobs, and relocated copies (appended among younger jobs of their lane), are
        # ordered individually by their own keys.
        view.parkme[slots] = (ok["available_ms"] > ok["enqueued_us"] // 1000) | (
            ok["supersedes"] != 0
        )
        view.plain[slots] = (
            ~view.parkme[slots] & (ok["kind"] == records.KIND_JOB) & (ok["attempts_before"] == 0)
        )
        view.heads.extend(slots)
        view.head_seqs.extend(ok["seq"])
        view.lanekey[slots] = ok["priority"]
        st = np_state(ok["state"])
        codecs = ok["codec"]
        keyed = (codecs == codec.KEYED) | (codecs == codec.IN_META)  # a key may be in the block
        unusual = (st == ST_EMPTY) | (ok["id_len"] > 0) | (ok["supersedes"] != 0) | keyed
        if unusual.any():
            # A valid record below the tail whose state word is EMPTY: a power loss kept the record
            # but not its state page.  It was published (the tail says so): publish it again.
            for row in ok[st == ST_EMPTY]:
                slot = int(row["slot"])
                seg.cas_state(slot, 0, self._lost(seg, slot, row))
            for row in ok[ok["id_len"] > 0]:
                slot = int(row["slot"])
                self.index.ids[
                    records.read_id(seg, slot, int(row["id_len"])).decode("utf-8", "replace")
                ] = (seg.seq, slot)
            rows = ok[keyed]
            # Only a plain job record holds its key envelope first in its payload: an expiry
            # prefix or a metadata block (ringq/engine/meta.py) comes before it in the others.
            plain = (rows["codec"] == codec.KEYED) & (rows["kind"] == records.KIND_JOB)
            if plain.any():
                self._keyed_plain(view, rows[plain])
            if not plain.all():  # a key behind a metadata block: read one by one
                rows = rows[~plain]
                for slot, prio in zip(rows["slot"].tolist(), rows["priority"].tolist()):
                    self._keyed(view, slot, prio)
            now = now_ms()
            for row in ok[ok["supersedes"] != 0]:
                self._complete_supersede(int(row["supersedes"]))
                # A copy sits in its lane behind younger jobs: give it its own entry now, keyed
                # by its original place, rather than when the lane's cursor reaches it.
                self.index.park(view, int(row["slot"]), now)
        lks = view.lanekey[slots]
        first = int(lks[0])
        groups = (
            [first] if len(lks) == 1 or (lks == first).all() else [int(p) for p in np.unique(lks)]
        )
        for p in groups:
            lane = view.lanes.get(p)
            mine = slots if len(groups) == 1 else slots[lks == p]
            if lane is None:
                lane = view.lanes[p] = Lane(int(view.prio[mine[0]]), p)
            view.lanepos[mine] = np.arange(lane.slots.n, lane.slots.n + len(mine), dtype=np.uint32)
            lane.slots.extend(mine)
            self.index.queue_lane(view, lane)
        if self.on_dependent is not None and unusual.any():
            for row in ok[(ok["kind"] == KIND_META) | (ok["supersedes"] != 0)]:
                self.on_dependent(view, int(row["slot"]))

    def _lost(self, seg: Segment, slot: int, row: object) -> int:
        """The word to publish again for a record whose state word is EMPTY (deps.lost_word)."""
        avail = int(row["available_ms"])  # type: ignore[index]
        if int(row["kind"]) != KIND_META:  # type: ignore[index]
            return pack(ST_READY, WHY_NONE, 0, avail - seg.epoch_ms)
        return lost_word(seg, slot, avail)

    def _keyed_plain(self, view: View, rows: np.ndarray) -> None:
        """:meth:`_keyed` for many records of codec KEYED at once (scanned ``rows``)."""
        slots = rows["slot"]
        keys, which = keys_of_plain(view.seg, slots, rows["id_len"], rows["payload_len"])
        kids = np.zeros(len(keys), np.int64)
        for i, key in enumerate(keys):
            if key is not None:
                kids[i] = kid = key_id(key)
                self.index.note_key(kid, key)
            else:
                for slot in slots[which == i].tolist():
                    self._unkeyable(view, slot)
        kid = kids[which]
        view.lanekey[slots] = lane_keys(rows["priority"].astype(np.int64), kid)
        if kid.any():
            self.index.keyed()

    def _keyed(self, view: View, slot: int, prio: int) -> int:
        """Put the keyed job at ``slot`` in its key's lane (fair scheduling across keys,
        ringq/engine/index.py); returns its lane key."""
        key = key_of(view.seg, slot)
        if key is None:
            self._unkeyable(view, slot)
            return prio
        kid = key_id(key)
        self.index.note_key(kid, key)
        lk = lane_key(prio, kid)
        view.lanekey[slot] = lk
        self.index.keyed()
        return lk

    def _unkeyable(self, view: View, slot: int) -> None:
        """A keyed record whose key does not read (bytes no enqueue writes) is quarantined as
        it is read in while READY, as a record that fails its CRC is: never leased, counted as
        corrupt, reported by the open that found it."""
        why = key_problem(view.seg, slot)
        if why is not None and state(view.seg.load_state(slot)) == ST_READY:
            self.ring.mark_bad(view.seg, slot, why)

    def _ingest_few(self, view: View, tail: int, held: int = -1) -> None:
        """:meth:`_ingest` for a handful of records, field by field (what a consumer woken for
        the job just appended runs: no numpy call per field).  Same effects, record by record;
        the lane's cursor passes over slot ``held`` (read_through) when it is next in its lane."""
        seg = view.seg
        n, view.scanned = self._few.scan(seg, view.scanned, tail)
        infos = self._few.infos
        now = None
        for i in range(n):
            r = infos[i]
            slot = r.slot
            if r.status != 0:
                self.ring.mark_bad(seg, slot, "record failed validation (magic, length or CRC)")
                continue
            prio, seq, avail, sup = r.priority, r.seq, r.available_ms, r.supersedes
            view.prio[slot] = prio
            view.seq[slot] = seq
            view.enq[slot] = r.enqueued_us
            view.avail[slot] = avail
            view.maxatt[slot] = r.max_attempts
            view.attb[slot] = r.attempts_before
            view.idlen[slot] = r.id_len
            park = avail > r.enqueued_us // 1000 or sup != 0
            view.parkme[slot] = park
            view.plain[slot] = not park and r.kind == records.KIND_JOB and r.attempts_before == 0
            view.heads.append(slot)
            view.head_seqs.append(seq)
            lk = prio
            view.lanekey[slot] = prio
            if r.codec == codec.KEYED or r.codec == codec.IN_META:
                lk = self._keyed(view, slot, prio)
            if state(r.state) == ST_EMPTY:  # published, its state page lost (see _ingest)
                seg.cas_state(
                    slot,
                    0,
                    lost_word(seg, slot, avail)
                    if r.kind == KIND_META
                    else pack(ST_READY, WHY_NONE, 0, avail - seg.epoch_ms),
                )
            if r.id_len:
                self.index.ids[records.read_id(seg, slot, r.id_len).decode("utf-8", "replace")] = (
                    seg.seq,
                    slot,
                )
            lane = view.lanes.get(lk)
            if lane is None:
                lane = view.lanes[lk] = Lane(prio, lk)
            view.lanepos[slot] = lane.slots.n
            if slot == held and lane.cursor == lane.slots.n and state(r.state) == ST_LEASED:
                # Leased when the scan read it: a cursor may pass a job that is not READY, since
                # its return to READY moves the change counters (_look_for_returned).
                lane.cursor += 1
            lane.slots.append(slot)
            if sup:
                self._complete_supersede(sup)
                now = now_ms() if now is None else now
                self.index.park(view, slot, now)
            self.index.queue_lane_next(view, lane)
            if (r.kind == KIND_META or sup) and self.on_dependent is not None:
                self.on_dependent(view, slot)

    def _complete_supersede(self, ref: int) -> None:
        """A requeued or relocated record names the record it replaces: make sure that one is GONE."""
        seq, slot = split_position(ref)
        seg = self.ring.segs.segment(seq)
        if seg is None:
            return
        w = seg.load_state(slot)
        # DEAD: a requeue or a relocation of a dead job; READY: a relocated delayed job.  A leased
        # original is left alone (a lease after a clock jump): its holder finishes it.  It is
        # looked at again after the next reaper pass (retry_supersedes): after a power loss the
        # original's state word may be an older LEASED one whose holder is dead, which the reaper
        # turns back into READY or DEAD, and then this copy must still replace it.
        if state(w) == ST_LEASED:
            self.supersede_later.add(ref)
        elif state(w) in (ST_DEAD, ST_READY) and seg.cas_state(slot, w, gone(w))[0]:
            self.ring.segs.note_finished(seg)

    def retry_supersedes(self) -> None:
        """After a reaper pass: complete the supersedes skipped while their originals were leased."""
        pending, self.supersede_later = self.supersede_later, set()
        for ref in pending:
            self._complete_supersede(ref)

    def _find_returned(self, view: View) -> None:
        """Jobs of ``view`` back in READY behind their lane's cursor: give each its own heap entry,
        keyed by its own (new) available-at, so a retried job is ordered as nobroker orders it."""
        heads = view.heads.view()
        if not len(heads):
            return
        words = view.seg.states[heads, 0]
        # DEFERRED jobs (READY with the cancel flag) stay behind the cursor until released; jobs
        # with an entry already (view.entered) need none.
        ready = heads[(np_state(words) == ST_READY) & ~np_cancel_flag(words) & ~view.entered[heads]]
        if not len(ready):
            return
        lks = view.lanekey[ready]
        pos = view.lanepos[ready]
        now = now_ms()
        for p, lane in view.lanes.items():
            for slot in ready[(lks == p) & (pos < lane.cursor)].tolist():
                self.index.park(view, slot, now)
