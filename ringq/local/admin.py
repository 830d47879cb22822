"""Whole-queue operations: listing, counting, requeueing the dead, purging, compaction, introspection.

Reads show a lease that a reclaim would end (expired, or held by a dead process) as what the
reclaim would make it, without writing (ringq/engine/reaper.py, ``show_reclaimed``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ringq.backend import CompactionResult, QueueStats, SearchPage, check_limit
from ringq.engine import search, snapshot, transitions
from ringq.engine.index import Index, View, now_ms
from ringq.engine.reaper import Reaper
from ringq.engine.relocate import Relocator, superseding_copy
from ringq.engine.snapshot import STATE_OF, state_of
from ringq.engine.words import (
    END_EXPIRED,
    ST_BAD,
    ST_CONT,
    ST_DEAD,
    ST_DONE,
    ST_EMPTY,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    is_deferred,
    np_cancel_flag,
    np_deferred,
    np_rel_time,
    np_state,
    np_why,
    rel_time,
    state,
)
from ringq.errors import CompactionError, CorruptionError, NotLeasedError, SerializationError
from ringq.ids import renamed
from ringq.job import Job, JobState

if TYPE_CHECKING:  # pragma: no cover
    from ringq.engine.ring import Ring
    from ringq.engine.segment import Segment

    from .context import QueueContext

__all__ = [
    "Admin",
    "list_jobs",
    "counts",
    "requeue",
    "purge",
    "segment_bytes",
    "introspect",
    "shown_word",
    "compact",
]


def shown_word(reaper: Reaper, view: View, slot: int) -> int:
    """The state word of ``slot`` as a read shows it."""
    tbl = np.array(view.seg.states[slot : slot + 1])
    reaper.show_reclaimed(view, tbl, np.array([slot]))
    return int(tbl[0, 0])


def list_jobs(
    ring: Ring, index: Index, reaper: Reaper, which: JobState | str | None, limit: int | None
) -> list[Job]:
    """Retained jobs in enqueue order (see Queue.list_jobs).  Raises ValueError for an unknown state."""
    want = {ST_READY, ST_LEASED, ST_DONE, ST_DEAD}
    delayed = which == "delayed"
    if delayed:
        want = {ST_READY}
    elif which is not None:
        try:
            js = JobState(which)
        except ValueError:
            raise ValueError(
                f"state must be one of {[s.value for s in JobState] + ['delayed']}, got {which!r}"
            ) from None
        if js in (JobState.CANCELLED, JobState.EXPIRED):
            want = {ST_DONE}
        elif js is JobState.DEFERRED:
            want = {ST_READY}
        else:
            want = {k for k, v in STATE_OF.items() if v is js}
    now = now_ms()
    out: list[Job] = []
    # One instant for the whole read: reclaims shown are due at ``now``, never delayed past it.
    for _rank, view, slot, word in index.heads(want, partial(reaper.show_reclaimed, now=now)):
        if limit is not None and len(out) >= limit:
            break
        if delayed and (view.seg.epoch_ms + rel_time(word) <= now or is_deferred(word)):
            continue
        if which is not None and not delayed and state_of(word) is not JobState(which):
            continue  # DONE words include cancelled and expired jobs
        try:
            out.append(snapshot.job_at(ring, view.seg, slot, word))
        except (CorruptionError, SerializationError):
            continue
    return out


def counts(ring: Ring, index: Index, reaper: Reaper) -> tuple[int, ...]:
    """The fields of QueueStats: each segment's counts from one copy of its state table."""
    now = now_ms()
    c = np.zeros(8, np.int64)
    delayed = cancelled = expired = deferred = 0
    for view in index.views.values():
        seg = view.seg
        # One copy of the live table: every count below comes from the same instant of this
        # segment (two reads of the shared words could see a job in two states).
        tbl = np.array(seg.states[: seg.bounded_tail()])
        reaper.show_reclaimed(view, tbl, now=now)  # the instant ``delayed`` is counted at
        words = tbl[:, 0]
        st = np_state(words)
        c += np.bincount(st.astype(np.int64), minlength=8)
        ready = words[st == ST_READY]
        if len(ready):
            waiting = np_deferred(ready)
            n_def = int(np.count_nonzero(waiting))
            deferred += n_def
            if n_def:
                ready = ready[~waiting]
            delayed += int(np.count_nonzero(np_rel_time(ready) + seg.epoch_ms > now))
        unrun = words[(st == ST_DONE) & np_cancel_flag(words)]
        if len(unrun):
            n_exp = int(np.count_nonzero(np_why(unrun) == END_EXPIRED))
            expired += n_exp
            cancelled += len(unrun) - n_exp
    total = int(c[ST_READY] + c[ST_LEASED] + c[ST_DONE] + c[ST_DEAD])
    tot = ring.ctl.totals()
    return (
        int(c[ST_READY]) - delayed - deferred,
        delayed,
        int(c[ST_LEASED]),
        int(c[ST_DONE]) - cancelled - expired,
        int(c[ST_DEAD]),
        total,
        int(c[ST_BAD]),
        tot["enqueued"],
        tot["acked"],
        tot["dead"],
        cancelled,
        expired,
        deferred,
    )


def requeue(ring: Ring, targets: list[tuple[int, View, int, int]]) -> int:
    """Under the writer lock: re-append each dead job (attempts reset) superseding it; how many."""
    recs, olds = [], []
    for _rank, view, slot, word in targets:
        recs.append(superseding_copy(ring, view.seg, slot)[1])
        olds.append((view.seg, slot, word))
    if not recs:
        return 0
    ring.append(recs)
    for seg, slot, word in olds:
        if seg.cas_state(slot, word, transitions.gone(word))[0]:
            ring.segs.note_finished(seg)
    return len(recs)


def purge(ring: Ring, index: Index) -> int:
    """GONE (with the purge reason) for every retained or damaged record; returns the jobs purged."""
    n = 0
    for view in list(index.views.values()):
        seg = view.seg
        finished = 0
        for slot in view.heads.view().tolist():
            while True:
                w = seg.load_state(slot)
                st = state(w)
                if st in (ST_GONE, ST_EMPTY, ST_CONT):
                    break
                if seg.cas_state(slot, w, transitions.gone(w, purged=True))[0]:
                    n += st != ST_BAD
                    finished += st != ST_DONE
                    break
        if finished:
            ring.segs.note_finished(seg, finished)
    return n


def discard_dead(ring: Ring, seg: Segment, slot: int) -> bool:
    """GONE (with the purge reason) for the DEAD job at ``slot``; False if it is not DEAD."""
    w = seg.load_state(slot)
    if state(w) != ST_DEAD or not seg.cas_state(slot, w, transitions.gone(w, purged=True))[0]:
        return False
    ring.segs.note_finished(seg)
    return True


def compact(
    what: str, ring: Ring, index: Index, relocator: Relocator, refresh: Callable[[], None]
) -> None:
    """Relocate stragglers of every sealed segment, then retire every finished one (thorough).

    Raises CompactionError (no job moved or lost) if a file operation fails.
    """
    try:
        for view in list(index.views.values()):
            if view.sealed:
                relocator.offer(view)
        ring.segs.retire_finished(thorough=True)
        refresh()
    except OSError as exc:
        raise CompactionError(f"compacting {what}: {exc}; no job was moved or lost") from exc


def segment_bytes(ring: Ring) -> int:
    """Bytes of the queue's segment files (those this process has mapped)."""
    total = 0
    for seg in ring.segs.ordered():
        try:
            total += os.path.getsize(seg.path)
        except OSError:
            pass  # retired meanwhile by another process
    return total


def introspect(ring: Ring) -> dict[str, Any]:
    """See Queue.introspect."""
    ctl = ring.ctl
    return {
        "tail_segment": ctl.tail_seq(),
        "next_seq": ctl.next_seq(),
        "slot_size": ctl.slot_size,
        "slot_count": ctl.slot_count,
        "lock_waiters": ctl.lock_waiters(),
        "synced_position": ring.dur.synced_position(),
        "segments": {
            seg.seq: {
                "tail": seg.tail(),
                "records": seg.nrecords(),
                "sealed": seg.sealed(),
                "retired": seg.retired(),
            }
            for seg in ring.segs.ordered()
            if seg.mm is not None
        },
    }


class Admin:
    """Reads and whole-queue operations of one local queue (the API is :class:`ringq.Queue`'s)."""

    def __init__(self, ctx: QueueContext) -> None:
        self.ctx = ctx

    def sync_counters(self) -> dict[str, int]:
        """As :meth:`ringq.Queue.sync_counters`."""
        self.ctx.live()
        return {
            **self.ctx.ring.dur.counters(),
            "queue_append_syncs": self.ctx.ring.ctl.sync_count(),
        }

    def introspect(self) -> dict[str, Any]:
        """As :meth:`ringq.Queue.introspect`."""
        self.ctx.live()
        with self.ctx.live_lock:
            self.ctx.refresh(relocate=False)
            return {
                **introspect(self.ctx.ring),
                "known_ids": len(self.ctx.index.ids),
                "claiming": len(self.ctx.owners.claiming),
            }

    def import_jobs(self, jobs: Sequence[Job], *, source: str | None = None) -> int:
        """As :meth:`ringq.Queue.import_jobs`."""
        self.ctx.live()
        return self.ctx.producer.import_jobs(renamed(jobs, source))

    def get(self, job_id: str) -> Job:
        """As :meth:`ringq.Queue.get`."""
        self.ctx.live()
        with self.ctx.live_lock:
            self.ctx.refresh()
            view, slot, _ = self.ctx.leases.locate(job_id, self.ctx.name)
            return self.ctx.job_at(view.seg.seq, slot, shown_word(self.ctx.reaper, view, slot))

    def list_jobs(
        self, state: JobState | str | None = None, *, limit: int | None = None
    ) -> list[Job]:
        """As :meth:`ringq.Queue.list_jobs`."""
        self.ctx.live()
        limit = check_limit(limit)
        with self.ctx.live_lock:
            self.ctx.refresh()
            return list_jobs(self.ctx.ring, self.ctx.index, self.ctx.reaper, state, limit)

    def search(self, query: search.Query, after: str | None, limit: int | None) -> SearchPage:
        """As :meth:`ringq.Queue.search`."""
        self.ctx.live()
        limit = check_limit(limit)
        with self.ctx.live_lock:
            self.ctx.refresh()
            jobs, total, nxt = search.search(
                self.ctx.ring,
                self.ctx.index,
                self.ctx.reaper.show_reclaimed,
                query,
                after,
                limit,
                now_ms(),
            )
            return SearchPage(jobs, total, nxt)

    def dlq(self, *, limit: int | None = None) -> list[Job]:
        """As :meth:`ringq.Queue.dlq`."""
        return self.list_jobs(JobState.DEAD, limit=limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """As :meth:`ringq.Queue.requeue_dead`."""
        self.ctx.live()
        with self.ctx.live_lock:
            self.ctx.settle()
        with self.ctx.live_lock, self.ctx.ring.locked():
            self.ctx.refresh()
            if job_id is not None:
                view, slot, _ = self.ctx.leases.locate(job_id, self.ctx.name)
                w = view.seg.load_state(slot)
                if state(w) != ST_DEAD:
                    raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")
                targets = [(0, view, slot, w)]
            else:
                targets = self.ctx.index.heads({ST_DEAD})
            n = requeue(self.ctx.ring, targets)
            self.ctx.refresh()
            return n

    def discard_dead(self, job_id: str) -> None:
        """As :meth:`ringq.Queue.discard_dead`."""
        self.ctx.live()
        with self.ctx.live_lock:
            self.ctx.settle()
            view, slot, _ = self.ctx.leases.locate(job_id, self.ctx.name)
            if not discard_dead(self.ctx.ring, view.seg, slot):
                raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")

    def purge(self) -> int:
        """As :meth:`ringq.Queue.purge`."""
        self.ctx.live()
        with self.ctx.live_lock, self.ctx.ring.locked():
            self.ctx.refresh(relocate=False)
            n = purge(self.ctx.ring, self.ctx.index)
            self.ctx.owners.held.clear()
            self.ctx.owners.forget_kept()  # and the leases closed objects of this process kept
            self.ctx.gate.release_all_kept()
            self.ctx.ring.segs.retire_finished()
            self.ctx.refresh()
            return n

    def compact(self) -> CompactionResult:
        """As :meth:`ringq.Queue.compact`."""
        self.ctx.live()
        with self.ctx.live_lock:
            self.ctx.settle()
            before_bytes, before = segment_bytes(self.ctx.ring), self.stats()
            compact(
                f"queue {self.ctx.name!r} in {self.ctx.path}",
                self.ctx.ring,
                self.ctx.index,
                self.ctx.relocator,
                self.ctx.refresh,
            )
            after = self.stats()
            return CompactionResult(
                before_bytes,
                segment_bytes(self.ctx.ring),
                after.total - after.done,
                max(0, before.done - after.done),
            )

    def stats(self) -> QueueStats:
        """As :meth:`ringq.Queue.stats`."""
        self.ctx.live()
        with self.ctx.live_lock:
            self.ctx.refresh()
            return QueueStats(*counts(self.ctx.ring, self.ctx.index, self.ctx.reaper))
