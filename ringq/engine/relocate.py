"""Straggler relocation (docs/guarantees.md, invariant 7): the few live jobs that keep a sealed
segment alive are re-appended at the tail, as records that supersede them, so the segment retires.

A straggler is a dead-lettered job, or a READY job not due for ``RELOCATE_AFTER`` seconds, or a
READY job already due that jobs of higher priority enqueued after it have overtaken.  When a sealed
segment's live jobs are all stragglers and at most half of its records, they are moved: disk use
then stays within about twice the live jobs plus the tail, whatever the oldest straggler.  A
straggler is copied at most once per half segment of new records (write amplification at most 2x).
Leased, deferred, soon-due (not overtaken) and damaged (BAD) records are never moved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ringq.errors import CorruptionError

from . import records, transitions
from .index import Index, View, due, now_ms
from .records import NewRecord
from .segment import Segment
from .snapshot import last_error
from .words import (
    ST_DEAD,
    ST_DONE,
    ST_GONE,
    ST_READY,
    WHY_PURGED,
    lease_count,
    np_deferred,
    np_rel_time,
    np_state,
    position,
    state,
    why,
)

if TYPE_CHECKING:  # pragma: no cover
    from .ring import Ring

__all__ = ["Relocator", "superseding_copy", "RELOCATE_AFTER", "RELOCATE_DUE_RATIO"]

RELOCATE_AFTER = (
    5.0  # seconds: a READY job due later than this may be moved out of a finished segment
)
# A sealed segment whose live jobs include READY jobs already due (low-priority jobs that others
# keep overtaking) is relocated only when they are at most 1/RELOCATE_DUE_RATIO of its records: a
# backlog being worked off is not copied, and disk use stays within about this many times the
# slots of such jobs.
RELOCATE_DUE_RATIO = 16
HOT_RECHECK = 64  # an ack looks for stragglers again once 1/64 of the segment's records finished


MAX_CARRIED = 0xFFFF  # the record header's attempts-carried-over field is 16-bit


def superseding_copy(
    ring: Ring,
    seg: Segment,
    slot: int,
    attempts: int | None = None,
    st: int = ST_READY,
    at_ms: int | None = None,
) -> tuple[Any, NewRecord]:
    """A new record of the job at ``slot`` that supersedes it: same id, payload, priority and max
    attempts.  ``attempts`` is added to the carried-over count (None: reset to 0, as requeue does);
    ``st``/``at_ms`` as in NewRecord.  Raises CorruptionError (the record is marked BAD)."""
    try:
        info, id_bytes, payload = records.read_record(seg, slot)
    except CorruptionError:
        ring.mark_bad(seg, slot, "failed validation on read")
        raise
    jid = bytes(id_bytes) if info.id_len else f"{info.seq:016x}".encode()
    # The record's field is 16 bits; a damaged state word can claim far more leases.  Past 65535
    # every max_attempts is used up, so the clamped count means the same.
    carried = 0 if attempts is None else min(info.attempts_before + attempts, MAX_CARRIED)
    return info, NewRecord(
        bytes(payload),
        info.codec,
        jid,
        info.priority,
        0,
        info.max_attempts,
        carried,
        position(seg.seq, slot),
        state=st,
        at_ms=at_ms,
        enqueued_us=info.enqueued_us,
        kind=info.kind,
    )


class Relocator:
    """Moves stragglers out of sealed segments.  ``catch_up`` re-reads what other processes
    published (the queue's refresh without relocation), called under the writer lock."""

    def __init__(self, ring: Ring, index: Index, catch_up: Callable[[], None]) -> None:
        self.ring = ring
        self.index = index
        self.catch_up = catch_up
        self._looked: dict[int, int] = {}  # segment seq -> its finished count when last looked at
        # Segment seq -> the finished count below which a hot offer returns 0 at once: an ack
        # compares with it before calling :meth:`offer` (a missing entry: call it).
        self.hot_from: dict[int, int] = {}

    def _note_look(self, segseq: int, finished: int) -> None:
        if len(self._looked) > 4096:
            self._looked.clear()
            self.hot_from.clear()
        self._looked[segseq] = finished

    def offer(self, view: View, hot: bool = False, finished: int | None = None) -> int:
        """Relocate ``view``'s stragglers if the rule above allows it; returns how many moved.

        ``hot`` (an ack or nack): look at the segment's state table only if ``1/HOT_RECHECK`` of its
        records finished since it was last looked at in vain, so that acking through a long
        sealed segment costs O(1) per ack, not O(segment); the reaper's passes offer every sealed
        segment without ``hot``.  ``finished``: the segment's finished count, if the caller just
        read it (an ack): then a hot offer that is not due yet reads no shared word."""
        seg = view.seg
        if hot and finished is not None:
            # The index read ``heads.n`` records (at most the segment's count): not due before
            # 1/HOT_RECHECK of those finished since the last look.
            due_at = self._looked.get(seg.seq, -(1 << 62)) + max(1, view.heads.n // HOT_RECHECK)
            if finished < due_at:
                self.hot_from[seg.seq] = due_at
                return 0
        if not view.sealed or seg.mm is None or seg.retired():
            return 0
        nrec = seg.nrecords()
        finished = seg.finished()
        live = nrec - finished
        if hot:
            if finished - self._looked.get(seg.seq, -nrec) < max(1, nrec // HOT_RECHECK):
                return 0
            self._note_look(seg.seq, finished)  # a hot look counts, whatever it decides
        if live <= 0 or 2 * live > nrec:  # moving must at least halve what the segment holds
            return 0
        if not hot:
            self._note_look(seg.seq, finished)
        slots, soon = self.stragglers(view)
        if not slots or (soon and RELOCATE_DUE_RATIO * live > nrec):
            return 0
        with self.ring.locked():  # excludes requeue_dead and other relocators
            # Under the writer lock nobody appends: after this catch-up we know every copy that any
            # (possibly killed) relocator already wrote, and whose supersede we just completed.
            self.catch_up()
            if seg.mm is None or seg.retired():  # retired and unmapped by that catch-up
                return 0
            # A job a newer record already supersedes (a rerun's predecessor, found leased when
            # the rerun was read in) is superseded now if it can be, never copied.
            self.index.catchup.retry_supersedes()
            slots, soon = self.stragglers(view)
            if soon and RELOCATE_DUE_RATIO * (nrec - seg.finished()) > nrec:
                return 0
            return self._relocate(view, slots) if slots else 0

    def stragglers(self, view: View) -> tuple[list[int], bool]:
        """``(head slots, any due)``: ``view``'s live jobs if none is leased, else ``([], False)``.

        ``any due``: some of them are READY and due within ``RELOCATE_AFTER`` (not only dead or
        long-delayed ones); those count only if overtaken by a finished job of higher priority."""
        seg = view.seg
        heads = view.heads.view()
        words = seg.states[heads, 0]
        st = np_state(words)
        alive = (st != ST_DONE) & (st != ST_GONE)
        if not alive.any():
            return [], False
        lw, lst = words[alive], st[alive]
        at = np_rel_time(lw) + seg.epoch_ms
        if not ((lst == ST_DEAD) | (lst == ST_READY)).all():
            return [], False  # a leased (or damaged) job: it finishes, or stays for the operator
        if np_deferred(lw).any():
            # A DEFERRED job keeps its segment until it is released, as a leased one does: its
            # tree of fired edges lives in its own slots (ringq/engine/deps.py).
            return [], False
        soon = (lst == ST_READY) & (at <= now_ms() + int(RELOCATE_AFTER * 1000))
        if soon.any():
            # A due READY job is moved only if it was overtaken: a job of higher priority enqueued
            # after it in this segment has finished.  The rest of a backlog being worked off in
            # order is about to be leased, and copying it would only double the writes.
            prios = view.prio[heads].astype(np.int64)
            floor = np.iinfo(np.int64).min
            done_prio = np.where(st == ST_DONE, prios, floor)
            after = np.full(len(heads), floor, np.int64)
            after[:-1] = np.maximum.accumulate(done_prio[::-1])[::-1][1:]
            if not (prios[alive][soon] < after[alive][soon]).all():
                return [], False
        return heads[alive].tolist(), bool(soon.any())

    def _relocate(self, view: View, slots: list[int]) -> int:
        """Under the writer lock: copy each straggler to the tail, then mark the original GONE.

        A READY straggler due within ``RELOCATE_AFTER`` seconds is first *held*: its available-at
        is moved ``RELOCATE_AFTER`` ahead by CAS (readers never lease a READY job before its
        available-at), and the copy keeps the original available-at, so the job keeps its place.
        A relocator killed after the hold delays that job by at most ``RELOCATE_AFTER``.  The final
        CAS expects the exact word seen (or held) before the copy; if it fails (purged, or leased
        after a clock jump) the copy is withdrawn, so at most one live copy remains.  A relocator
        killed between the append and the CAS leaves two copies until any reader ingests the new
        one and completes the supersede.
        """
        ring, seg = self.ring, view.seg
        recs, olds, errs = [], [], []
        hold_ms = now_ms() + int(RELOCATE_AFTER * 1000)
        for slot in slots:
            w = seg.load_state(slot)
            st, lc = state(w), lease_count(w)
            if st not in (ST_READY, ST_DEAD):
                continue
            at_ms = due(view, slot, w)
            if st == ST_READY and at_ms <= hold_ms:
                held = transitions.held(w, hold_ms - seg.epoch_ms)
                if not seg.cas_state(slot, w, held)[0]:
                    continue  # leased meanwhile: it is not a straggler any more
                w = held
            try:
                info, rec = superseding_copy(ring, seg, slot, lc, st, at_ms)
            except CorruptionError:
                continue
            recs.append(rec)
            olds.append((slot, w))
            errs.append(last_error(ring, seg, slot, why(w), lc, st, info.attempts_before))
        if not recs:
            return 0
        placed = ring.append(recs)
        for (slot, w), p, err in zip(olds, placed, errs):
            nseg = ring.segs.segment(p[0])
            if err and nseg is not None:
                ring.write_error(nseg, p[1], 0, err)
            ok, cur = seg.cas_state(slot, w, transitions.gone(w))
            if ok:
                ring.segs.note_finished(seg)
            elif nseg is not None and not (state(cur) == ST_GONE and why(cur) != WHY_PURGED):
                # The original changed under us (purged, or leased after a clock jump): withdraw the
                # copy.  (GONE without the purge reason means a reader completed our supersede.)
                w2 = nseg.load_state(p[1])
                if (
                    state(w2) in (ST_READY, ST_DEAD)
                    and nseg.cas_state(p[1], w2, transitions.gone(w2, purged=True))[0]
                ):
                    ring.segs.note_finished(nseg)
        return len(recs)
