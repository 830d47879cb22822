"""The reader's index: this process's private, incremental view of what it can lease.

Built from validated scans of newly published records (never by iterating jobs in Python):

* per segment and priority, a *lane*: the head slots of that priority in enqueue order, with a
  cursor.  ``ringq_next_ready`` (C) skips slots that are not READY, so taking the next job costs one
  C call however many other processes are leasing from the same lane.
* a heap with one entry per non-empty lane, keyed ``(-priority, available_at, seq)`` of the lane's
  current candidate, plus individual entries for delayed jobs that came due.
* a scheduled heap of READY jobs whose available-at is in the future, so a delayed job never
  blocks a due one.
* when a job anywhere returns to READY (nack, expired lease, dead holder), the returner bumps its
  segment's change counter; readers seeing it move give those jobs individual entries.

The index decides *which* job to try next; claiming it (the CAS) is the caller's.
"""

from __future__ import annotations

import heapq
import re
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import errors, records
from ._native import ffi, lib
from .segment import Segment
from .transitions import gone
from .words import (
    ST_DEAD,
    ST_DONE,
    ST_EMPTY,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    WHY_NONE,
    lease_count,
    np_state,
    pack,
    rel_time,
    split_position,
    state,
)

if TYPE_CHECKING:  # pragma: no cover
    from .ring import Ring

__all__ = ["Index", "View", "Direct", "now_ms", "order", "due"]

FEW = 8  # records an ingest reads field by field rather than through numpy arrays
FULL_CATCH_UP = 1.0  # seconds: a catch-up looks at every segment at least this often
CLAIMED = lib.RINGQ_CLAIMED
CLAIM_NONE = lib.RINGQ_CLAIM_NONE

AUTO_ID = re.compile(r"^[0-9a-f]{16}$")
RETAINED = (ST_READY, ST_LEASED, ST_DONE, ST_DEAD)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Direct:
    """How :meth:`Index.take` leases plain candidates itself: for ``vt_ms`` milliseconds, with
    owner word ``owner_base`` (ringq/words.py owner_pack with lease count 0); ``made(view, slot,
    word)`` returns the caller's result for a job just leased (or None to drop it); ``taken``
    counts the jobs leased so (the caller resets it)."""

    __slots__ = ("vt_ms", "owner_base", "made", "taken")

    def __init__(self, vt_ms: int, owner_base: int, made: Callable[[View, int, int], Any]) -> None:
        self.vt_ms = vt_ms
        self.owner_base = owner_base
        self.made = made
        self.taken = 0


class Grow:
    """A growable numpy vector with a stable C pointer (``ptr``) between appends."""

    __slots__ = ("a", "n", "ptr", "cptr")

    def __init__(self, dtype: str, cap: int = 64) -> None:
        self.a = np.empty(cap, dtype)
        self.n = 0
        self.ptr = self.a.ctypes.data
        self.cptr = ffi.cast("uint32_t *", self.ptr)  # for uint32 vectors: what the C helper takes

    def extend(self, values: np.ndarray) -> None:
        k = len(values)
        if self.n + k > len(self.a):
            bigger = np.empty(max(2 * len(self.a), self.n + k), self.a.dtype)
            bigger[: self.n] = self.a[: self.n]
            self.a = bigger
            self.ptr = bigger.ctypes.data
            self.cptr = ffi.cast("uint32_t *", self.ptr)
        self.a[self.n : self.n + k] = values
        self.n += k

    def append(self, value: int) -> None:
        if self.n == len(self.a):
            self.extend(np.array([value], self.a.dtype))
            return
        self.a[self.n] = value
        self.n += 1

    def view(self) -> np.ndarray:
        return self.a[: self.n]


class Lane:
    __slots__ = ("prio", "slots", "cursor", "queued")

    def __init__(self, prio: int) -> None:
        self.prio = prio
        self.slots = Grow("<u4")
        self.cursor = 0
        self.queued = False  # an entry for this lane is in the ready heap


class View:
    """What this process knows of one segment: immutable record fields, lanes, scan position."""

    __slots__ = (
        "seg",
        "scanned",
        "sealed",
        "change",
        "lanes",
        "heads",
        "head_seqs",
        "prio",
        "seq",
        "enq",
        "avail",
        "maxatt",
        "attb",
        "idlen",
        "lanepos",
        "parkme",
        "plain",
        "plain_ptr",
    )

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.scanned = 0
        self.sealed = False
        self.change = seg.change()
        self.lanes: dict[int, Lane] = {}
        self.heads = Grow("<u4")
        self.head_seqs = Grow("<u8")
        n = seg.slot_count
        self.prio = np.zeros(n, "<i4")
        self.seq = np.zeros(n, "<u8")
        self.enq = np.zeros(n, "<i8")  # enqueued at, µs (a relocated copy keeps its original's)
        self.avail = np.zeros(n, "<i8")  # available-at from the record header, ms
        self.maxatt = np.zeros(n, "<u2")
        self.attb = np.zeros(n, "<u2")
        self.idlen = np.zeros(n, "<u2")
        self.lanepos = np.zeros(n, "<u4")  # index of each head slot in its lane
        self.parkme = np.zeros(
            n, bool
        )  # enqueued with a delay: ordered individually, not by its lane
        # 1: no policy applies to the job at this head slot (never delayed, no expiry, not a copy,
        # no carried attempts), so ringq_claim_next may lease it directly when it comes first.
        self.plain = np.zeros(n, np.uint8)
        self.plain_ptr = ffi.cast("uint8_t *", self.plain.ctypes.data)


def order(view: View, slot: int) -> int:
    """FIFO rank of a job among jobs of equal priority and available-at: its enqueue time (µs),
    then its seq.  A relocated copy keeps its original's enqueue time, so it keeps its place."""
    return (int(view.enq[slot]) << 32) | (int(view.seq[slot]) & 0xFFFFFFFF)


def due(view: View, slot: int, w: int) -> int:
    """Available-at (ms since the epoch) of the READY job at ``slot`` with state word ``w``.

    A state word's time cannot go below its segment's epoch: a relocated copy of a job that was
    due before the copy's segment existed reads as due at that epoch.  Its record header keeps
    the exact time; use it, so the copy keeps its place among jobs due in between."""
    rel = rel_time(w)
    if rel == 0 and not lease_count(w):
        return min(view.seg.epoch_ms, int(view.avail[slot]))
    return view.seg.epoch_ms + rel


class Index:
    """The views of every mapped segment, the ready and scheduled heaps, and known job ids."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.views: dict[int, View] = {}
        self.heap: list[tuple] = []
        self.sched: list[tuple] = []
        self.parked: set[tuple[int, int]] = (
            set()
        )  # jobs with an individual entry (scheduled or due)
        self.ids: dict[str, tuple[int, int]] = {}
        self.seen_change = -1
        self._claim_out = ffi.new("ringq_claim_out *")
        self._few = records.FewScanner(FEW)
        self._stamp: tuple[int, int] | None = None  # control words at the last catch-up
        self._stamp_until = 0.0

    def clear(self) -> None:
        self.views.clear()
        self._stamp = None

    # -- catching up ------------------------------------------------------------------------------

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
        ring = self.ring
        ctl = ring.ctl
        stamp = (ctl.wake_word(), ctl.ring_gen())
        t = time.monotonic()
        last = self._stamp
        if quick and t < self._stamp_until and last is not None and stamp[1] == last[1]:
            if stamp[0] == last[0]:
                return []
            # Only appends or returns since the last catch-up: no segment was created, sealed or
            # retired (each of those bumps the ring generation), so only the unsealed views can
            # have new records, and no view is newly sealed.
            self._stamp = stamp
            for view in self.views.values():
                if not view.sealed and view.seg.tail() > view.scanned:
                    self._ingest(view)
            self._look_for_returned()
            return []
        self._stamp, self._stamp_until = stamp, t + FULL_CATCH_UP
        dropped = False
        for seq in ring.refresh():
            dropped |= self.views.pop(seq, None) is not None
        segs = ring.segs
        if len(segs) != len(self.views):
            for seq in [s for s in self.views if s not in segs]:
                del self.views[seq]
                dropped = True
            for seg in segs:
                if seg.seq not in self.views:
                    self.views[seg.seq] = View(seg)
        if (
            dropped
        ):  # forget the ids of retired segments, or a long-lived process grows without bound
            self.ids = {jid: loc for jid, loc in self.ids.items() if loc[0] in self.views}
        newly_sealed: list[View] = []
        for view in self.views.values():
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

    def _look_for_returned(self) -> None:
        change = self.ring.ctl.change_counter()
        if change != self.seen_change:
            self.seen_change = change
            for view in self.views.values():
                c = view.seg.change()
                if c != view.change:
                    view.change = c
                    self._find_returned(view)

    def read_through(self, view: View, slot: int) -> None:
        """Make sure the record at head ``slot`` of ``view`` is read in (a record a C call leased
        may be published before the wake word that announces it moves, so a quick catch-up can
        miss it)."""
        if view.scanned <= slot:
            self._ingest(view)

    def _ingest(self, view: View) -> None:
        seg = view.seg
        tail = seg.bounded_tail()
        if tail - view.scanned <= FEW:
            self._ingest_few(view, tail)
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
        st = np_state(ok["state"])
        unusual = (st == ST_EMPTY) | (ok["id_len"] > 0) | (ok["supersedes"] != 0)
        if unusual.any():
            # A valid record below the tail whose state word is EMPTY: a power loss kept the record
            # but not its state page.  It was published (the tail says so): publish it again.
            for row in ok[st == ST_EMPTY]:
                seg.cas_state(
                    int(row["slot"]),
                    0,
                    pack(ST_READY, WHY_NONE, 0, int(row["available_ms"]) - seg.epoch_ms),
                )
            for row in ok[ok["id_len"] > 0]:
                slot = int(row["slot"])
                self.ids[
                    records.read_id(seg, slot, int(row["id_len"])).decode("utf-8", "replace")
                ] = (seg.seq, slot)
            now = now_ms()
            for row in ok[ok["supersedes"] != 0]:
                self._complete_supersede(int(row["supersedes"]))
                # A copy sits in its lane behind younger jobs: give it its own entry now, keyed
                # by its original place, rather than when the lane's cursor reaches it.
                self.park(view, int(row["slot"]), now)
        prios = ok["priority"]
        first = int(prios[0])
        groups = (
            [first]
            if len(prios) == 1 or (prios == first).all()
            else [int(p) for p in np.unique(prios)]
        )
        for p in groups:
            lane = view.lanes.get(p)
            if lane is None:
                lane = view.lanes[p] = Lane(p)
            mine = slots if len(groups) == 1 else slots[prios == p]
            view.lanepos[mine] = np.arange(lane.slots.n, lane.slots.n + len(mine), dtype=np.uint32)
            lane.slots.extend(mine)
            self._queue_lane(view, lane)

    def _ingest_few(self, view: View, tail: int) -> None:
        """:meth:`_ingest` for a handful of records, field by field (what a consumer woken for
        the job just appended runs: no numpy call per field).  Same effects, record by record."""
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
            if state(r.state) == ST_EMPTY:  # published, its state page lost (see _ingest)
                seg.cas_state(slot, 0, pack(ST_READY, WHY_NONE, 0, avail - seg.epoch_ms))
            if r.id_len:
                self.ids[records.read_id(seg, slot, r.id_len).decode("utf-8", "replace")] = (seg.seq, slot)
            lane = view.lanes.get(prio)
            if lane is None:
                lane = view.lanes[prio] = Lane(prio)
            view.lanepos[slot] = lane.slots.n
            lane.slots.append(slot)
            if sup:
                self._complete_supersede(sup)
                now = now_ms() if now is None else now
                self.park(view, slot, now)
            self._queue_lane_next(view, lane)

    def _complete_supersede(self, ref: int) -> None:
        """A requeued or relocated record names the record it replaces: make sure that one is GONE."""
        seq, slot = split_position(ref)
        seg = self.ring.segs.segment(seq)
        if seg is None:
            return
        w = seg.load_state(slot)
        # DEAD: a requeue or a relocation of a dead job; READY: a relocated delayed job.  A leased
        # original is left alone (a lease after a clock jump): its holder finishes it.
        if state(w) in (ST_DEAD, ST_READY) and seg.cas_state(slot, w, gone(w))[0]:
            self.ring.segs.note_finished(seg)

    def _find_returned(self, view: View) -> None:
        """Jobs of ``view`` back in READY behind their lane's cursor: give each its own heap entry,
        keyed by its own (new) available-at, so a retried job is ordered as nobroker orders it."""
        heads = view.heads.view()
        if not len(heads):
            return
        ready = heads[np_state(view.seg.states[heads, 0]) == ST_READY]
        if not len(ready):
            return
        prios = view.prio[ready]
        pos = view.lanepos[ready]
        now = now_ms()
        for p, lane in view.lanes.items():
            for slot in ready[(prios == p) & (pos < lane.cursor)].tolist():
                self.park(view, slot, now)

    # -- ordering -------------------------------------------------------------------------------

    def park(self, view: View, slot: int, now: int) -> None:
        """Give one READY job an individual entry: scheduled if not due yet, else in the ready heap."""
        seg = view.seg
        key = (seg.seq, slot)
        if key in self.parked:
            return
        w = seg.load_state(slot)
        if state(w) != ST_READY:
            return
        at = due(view, slot, w)
        self.parked.add(key)
        if at > now:
            heapq.heappush(
                self.sched, (at, -int(view.prio[slot]), order(view, slot), seg.seq, slot)
            )
        else:
            heapq.heappush(
                self.heap, (-int(view.prio[slot]), at, order(view, slot), 1, seg.seq, 0, slot, 0)
            )

    def _schedule(self, view: View, slot: int, due_ms: int) -> None:
        key = (view.seg.seq, slot)
        if key in self.parked:
            return
        self.parked.add(key)
        heapq.heappush(
            self.sched, (due_ms, -int(view.prio[slot]), order(view, slot), view.seg.seq, slot)
        )

    def _lane_key(self, view: View, lane: Lane, now: int | None = None) -> tuple | None:
        """Advance the lane's cursor to its next due READY job and return that job's heap key.

        READY jobs that are not yet due are moved to the scheduled heap on the way, so a delayed
        job never hides due ones behind it.
        """
        seg = view.seg
        if now is None:
            now = now_ms()
        out = ffi.new("uint64_t *")
        arr = lane.slots
        while True:
            idx = lib.ringq_next_ready(
                seg.ptr,
                seg.size,
                seg.geom,
                ffi.cast("uint32_t *", arr.ptr),
                arr.n,
                lane.cursor,
                out,
            )
            if idx < 0 or idx >= arr.n:
                lane.cursor = arr.n
                return None
            slot = int(arr.a[idx])
            w = out[0]
            if lease_count(w) or view.parkme[slot] or seg.epoch_ms + rel_time(w) > now:
                # A retried or delayed job orders by its own available-at, not its lane position.
                self.park(view, slot, now)
                lane.cursor = idx + 1
                continue
            lane.cursor = idx
            return (
                -lane.prio,
                due(view, slot, w),
                order(view, slot),
                0,
                seg.seq,
                lane.prio,
                slot,
                w,
            )

    def _queue_lane_next(self, view: View, lane: Lane) -> None:
        """Queue a lane whose candidate was just leased, keyed by the next slot in lane order
        without looking at its state word (no C call): ringq_claim_next checks it when it comes
        first, and hands back any other candidate."""
        if lane.queued or lane.cursor >= lane.slots.n:
            return
        slot = int(lane.slots.a[lane.cursor])
        if not view.plain[slot]:
            self._queue_lane(view, lane)
            return
        lane.queued = True
        heapq.heappush(
            self.heap,
            (-lane.prio, int(view.avail[slot]), order(view, slot), 0, view.seg.seq, lane.prio, slot, 0),
        )

    def _queue_lane(self, view: View, lane: Lane, now: int | None = None) -> None:
        if lane.queued:
            return
        key = self._lane_key(view, lane, now)
        if key is not None:
            lane.queued = True
            heapq.heappush(self.heap, key)

    def next_due_ms(self) -> int | None:
        """When the earliest scheduled (delayed) job this process knows of comes due, or None."""
        return self.sched[0][0] if self.sched else None

    def take(
        self,
        want: int,
        claim: Callable[[View, int, int, int], Any],
        held_back: Any,
        skip: Callable[[View, int], bool] | None = None,
        direct: Direct | None = None,
    ) -> list[Any]:
        """Try candidates best first until ``want`` claims succeed or none is left.

        ``claim(view, slot, word, now)`` attempts one job and returns a result or None (lost the
        race, or not leasable after all).  ``held_back`` is the limits gate (ringq/limits.py):
        jobs it held back are offered again (``reoffer()``), and a lane moves past a job it holds
        (``blocked(segseq, slot)``), which then waits in the gate, not in the lane.
        ``skip(view, slot)``, if given, passes over a job for this call (a paused key): it keeps
        an individual entry and is tried again next time.  ``direct``, if given (only when no limit
        and no pause can apply), leases a lane's plain candidate in one C call
        (``ringq_claim_next``) and hands it to ``direct.made``; everything else goes to ``claim``.
        """
        now = now_ms()
        passed: list[tuple[View, int]] = []
        sched, heap = self.sched, self.heap
        while sched and sched[0][0] <= now:
            at, nprio, seq, segseq, slot = heapq.heappop(sched)
            heapq.heappush(heap, (nprio, at, seq, 1, segseq, 0, slot, 0))
        for entry in held_back.reoffer():  # jobs a limit held back: worth another try
            heapq.heappush(heap, entry)
        out: list[Any] = []
        while len(out) < want and heap:
            entry = heapq.heappop(heap)
            kind, segseq, prio, slot = entry[3], entry[4], entry[5], entry[6]
            view = self.views.get(segseq)
            if view is None:
                continue
            if kind == 0:
                lane = view.lanes[prio]
                lane.queued = False
                if direct is not None:
                    seg = view.seg
                    arr = lane.slots
                    co = self._claim_out
                    errors.check(
                        lib.ringq_claim_next(seg.ptr, seg.size, seg.geom, arr.cptr, arr.n, lane.cursor,
                                             slot, view.plain_ptr, max(0, now - seg.epoch_ms),
                                             max(0, now + direct.vt_ms - seg.epoch_ms), direct.owner_base, co),
                        seg.path,
                    )
                    if co.status == CLAIMED:
                        direct.taken += 1
                        lane.cursor = co.index + 1
                        got = direct.made(view, co.slot, co.word)
                        if got is not None:
                            out.append(got)
                        self._queue_lane_next(view, lane)
                        continue
                    if co.status == CLAIM_NONE:
                        lane.cursor = arr.n
                        continue
                    # Another candidate, or one that needs a decision: the general path below.
                key = self._lane_key(view, lane, now)
                if key is None:
                    continue
                slot, w = key[6], key[7]
                if key[:3] > entry[:3]:  # the lane's candidate changed: re-queue at its real place
                    lane.queued = True
                    heapq.heappush(heap, key)
                    continue
                if skip is not None and skip(view, slot):
                    lane.cursor += 1
                    passed.append((view, slot))
                    self._queue_lane(view, lane, now)
                    continue
                got = claim(view, slot, w, now)
                if got is not None or held_back.blocked(segseq, slot):
                    lane.cursor += 1
                if got is not None:
                    out.append(got)
                self._queue_lane(view, lane, now)
            else:
                self.parked.discard((segseq, slot))
                w = view.seg.load_state(slot)
                if state(w) != ST_READY:
                    continue
                at = due(view, slot, w)
                if at > now:
                    self._schedule(view, slot, at)
                    continue
                if (-int(view.prio[slot]), at, order(view, slot)) > entry[:3]:
                    self.park(view, slot, now)  # its available-at moved: re-queue at its real place
                    continue
                if skip is not None and skip(view, slot):
                    passed.append((view, slot))
                    continue
                got = claim(view, slot, w, now)
                if got is not None:
                    out.append(got)
        for view, slot in passed:
            self.park(view, slot, now)
        return out

    # -- finding jobs ---------------------------------------------------------------------------

    def find(self, job_id: str) -> tuple[int, int] | None:
        """Location ``(segment seq, slot)`` of the retained record of ``job_id``, or None.

        A purged (GONE) record is not retained: its id is free again.
        """
        loc = self.ids.get(job_id)
        if loc is not None:
            view = self.views.get(loc[0])
            if view is not None and self.retained(view, loc[1]):
                return loc
            if view is None or state(view.seg.load_state(loc[1])) == ST_GONE:
                del self.ids[job_id]
            return None
        if AUTO_ID.match(job_id):
            seq = int(job_id, 16)
            for view in self.views.values():
                hs = view.head_seqs
                if hs.n and hs.a[0] <= seq <= hs.a[hs.n - 1]:
                    i = int(np.searchsorted(hs.view(), seq))
                    if i < hs.n and hs.a[i] == seq:
                        slot = int(view.heads.a[i])
                        if view.idlen[slot] == 0 and self.retained(view, slot):
                            return (view.seg.seq, slot)
        return None

    @staticmethod
    def retained(view: View, slot: int) -> bool:
        return state(view.seg.load_state(slot)) in RETAINED

    def heads(
        self,
        states: Iterable[int],
        shown: Callable[[View, np.ndarray, np.ndarray], None] | None = None,
    ) -> list[tuple[int, View, int, int]]:
        """(rank, view, slot, word) of retained heads whose state is in ``states``, in enqueue order.

        ``shown(view, rows, slots)``, if given, may rewrite the private copy of the state-table rows
        first (reads show expired leases as what reclaiming them will make them)."""
        wanted = np.array(sorted(states), dtype=np.uint64)
        rows = []
        for view in self.views.values():
            heads = view.heads.view()
            if not len(heads):
                continue
            tbl = view.seg.states[heads]  # a copy (fancy indexing): never written back
            if shown is not None:
                shown(view, tbl, heads)
            words = tbl[:, 0]
            sel = np.isin(np_state(words), wanted)
            for slot, word in zip(heads[sel].tolist(), words[sel].tolist()):
                rows.append((order(view, slot), view, slot, word))
        rows.sort(key=lambda r: r[0])
        return rows
