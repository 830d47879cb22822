"""Whole-queue operations: listing, counting, requeueing the dead, purging, compaction, introspection.

Reads show a lease that a reclaim would end (expired, or held by a dead process) as what the
reclaim would make it, without writing (ringq/reaper.py, ``show_reclaimed``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ringq.engine import snapshot, transitions
from ringq.engine.index import Index, View, now_ms
from ringq.engine.reaper import Reaper
from ringq.engine.relocate import Relocator, superseding_copy
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
    np_cancel_flag,
    np_rel_time,
    np_state,
    np_why,
    rel_time,
    state,
)
from ringq.errors import CompactionError, CorruptionError, NotLeasedError, SerializationError
from ringq.ids import renamed
from ringq.job import STATE_OF, Job, JobState, state_of

if TYPE_CHECKING:  # pragma: no cover
    from ringq.engine.ring import Ring
    from ringq.engine.segment import Segment

__all__ = [
    "AdminMethods",
    "CompactionResult",
    "QueueStats",
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
) -> list:
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
        else:
            want = {k for k, v in STATE_OF.items() if v is js}
    now = now_ms()
    out = []
    # One instant for the whole read: reclaims shown are due at ``now``, never delayed past it.
    for _rank, view, slot, word in index.heads(want, partial(reaper.show_reclaimed, now=now)):
        if limit is not None and len(out) >= limit:
            break
        if delayed and view.seg.epoch_ms + rel_time(word) <= now:
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
    delayed = cancelled = expired = 0
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
            delayed += int(np.count_nonzero(np_rel_time(ready) + seg.epoch_ms > now))
        unrun = words[(st == ST_DONE) & np_cancel_flag(words)]
        if len(unrun):
            n_exp = int(np.count_nonzero(np_why(unrun) == END_EXPIRED))
            expired += n_exp
            cancelled += len(unrun) - n_exp
    total = int(c[ST_READY] + c[ST_LEASED] + c[ST_DONE] + c[ST_DEAD])
    tot = ring.ctl.totals()
    return (
        int(c[ST_READY]) - delayed,
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
    queue: Any, ring: Ring, index: Index, relocator: Relocator, refresh: Callable[[], None]
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
        raise CompactionError(
            f"compacting queue {queue.name!r} in {queue.path}: {exc}; no job was moved or lost"
        ) from exc


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


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of retained jobs by state, and cumulative counters since the queue was created.

    ``ready`` .. ``corrupt``, ``cancelled`` and ``expired`` count the jobs retained now, each
    segment's from one copy of its state table (``done`` counts neither cancelled nor expired jobs;
    ``total`` includes them).  ``delayed`` jobs are READY with a future ``available_at``; ``total`` is the sum
    of the five job states.  ``corrupt`` counts records quarantined as damaged (not included in
    ``total``).  Jobs stay counted as ``done`` until their segment retires, so ``done`` and
    ``total`` fall as segments retire.  A lease that expired or whose holder died counts as
    ``ready`` (``dead`` if its attempts are used up), as reclaiming it will make it.

    ``enqueued_total``, ``acked_total`` and ``dead_lettered_total`` never fall: jobs enqueued
    (requeues and relocation copies not counted), acks, and moves to the dead-letter queue, since
    the queue was created, by all processes.  They live in the control file and are bumped right
    after the state change they count: a process killed between the two leaves its counter one
    short (never over); a power loss may lose the increments since the control page was last
    synced (at each segment rotation); a control file rebuilt from the segments restarts them at 0.
    """

    ready: int = 0
    delayed: int = 0
    leased: int = 0
    done: int = 0
    dead: int = 0
    total: int = 0
    corrupt: int = 0
    enqueued_total: int = 0
    acked_total: int = 0
    dead_lettered_total: int = 0
    cancelled: int = 0
    expired: int = 0

    def to_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What :meth:`Queue.compact` gave back (nobroker's type, same fields).

    ``bytes_before``/``bytes_after``: bytes of the queue's segment files; ``jobs_kept``: unfinished
    jobs (ready, delayed, leased, dead); ``jobs_dropped``: finished jobs whose records went with
    their segments.
    """

    bytes_before: int
    bytes_after: int
    jobs_kept: int
    jobs_dropped: int

    @property
    def bytes_reclaimed(self) -> int:
        return self.bytes_before - self.bytes_after

    def describe(self) -> str:
        """One line for people: ``compacted B -> A bytes (P% reclaimed), kept K jobs, dropped D completed``."""
        pct = 100.0 * self.bytes_reclaimed / self.bytes_before if self.bytes_before else 0.0
        return (f"compacted {self.bytes_before} -> {self.bytes_after} bytes ({pct:.1f}% reclaimed), "
                f"kept {self.jobs_kept} jobs, dropped {self.jobs_dropped} completed")


class AdminMethods:
    """Reads and whole-queue operations: that part of :class:`ringq.Queue`'s API (a mixin; ``Queue``
    owns the attributes it uses: ``_lock``, ``_ring``, ``_index``, ``_leases``, ``_producer``,
    ``_reaper``, ``_relocator``, ``_settle``, ``_refresh`` and ``_live``)."""

    def sync_counters(self) -> dict[str, int]:
        """Durability counters (for tests and tools): this process's ``append_syncs``, ``covered``
        (appends another producer's sync covered), ``state_syncs``, ``pending`` and ``flusher``
        (1 while its flusher runs), and ``queue_append_syncs`` by every process since creation."""
        self._live()
        return {**self._ring.dur.counters(), "queue_append_syncs": self._ring.ctl.sync_count()}

    def introspect(self) -> dict[str, Any]:
        """Read-only engine words (for tests and tools): ``tail_segment``, ``next_seq``,
        ``slot_size``, ``slot_count``, ``lock_waiters``, ``synced_position``, ``segments`` (seq ->
        tail, records, sealed, retired) and ``known_ids`` (ids this process's index remembers)."""
        self._live()
        with self._lock:
            self._refresh(relocate=False)
            return {**introspect(self._ring), "known_ids": len(self._index.ids)}

    def import_jobs(self, jobs: Sequence[Job], *, source: str | None = None) -> int:
        """Store jobs brought from elsewhere (another queue's snapshot), keeping their state.

        ``source`` names the queue they come from (``ringq.ids.source_tag(queue)``): a job whose id
        has the automatic form (16 hex digits, unique only within its own queue) is stored as
        ``<source>-<id>`` (``ringq.ids.migrated_id``), the same on every run.  Without ``source``
        such an id is refused (ValueError, nothing written).

        Each job keeps its ``id``, ``payload``, ``priority``, ``attempts``, ``max_attempts``,
        ``last_error`` and ``available_at`` (an absolute time: a past one is due at once); a DEAD
        job is stored in the dead-letter queue, any other state as READY.  Ids make it idempotent:
        a job whose id is retained is not written again, so an import killed midway can simply be
        rerun.  All of it is one append under the writer lock (one durability sync); every payload
        is encoded first.

        Returns:
            How many jobs were written (those whose id was not retained yet).
        Raises:
            SerializationError (nothing written), ValueError (an empty id, attempts out of range),
            RecordTooLargeError, QueueFullError, QueueClosedError.
        """
        self._live()
        return self._producer.import_jobs(renamed(jobs, source))

    def get(self, job_id: str) -> Job:
        """The job with this id (a snapshot).  Raises JobNotFoundError if it is not retained."""
        self._live()
        with self._lock:
            self._refresh()
            view, slot, _ = self._leases.locate(job_id, self.name)
            return self._job_at(view.seg.seq, slot, shown_word(self._reaper, view, slot))

    def list_jobs(self, state: JobState | str | None = None, *, limit: int | None = None) -> list[Job]:
        """Retained jobs in enqueue order, optionally only those in ``state``, at most ``limit``.

        ``state`` is a :class:`JobState` (or its value) or ``"delayed"``: READY jobs not yet due
        (``"ready"`` includes them, as in nobroker).  ``limit=None`` means all.  Raises ValueError
        for an unknown state or a negative limit.
        """
        self._live()
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
        with self._lock:
            self._refresh()
            return list_jobs(self._ring, self._index, self._reaper, state, limit)

    def dlq(self, *, limit: int | None = None) -> list[Job]:
        """Dead-lettered jobs, oldest first."""
        return self.list_jobs(JobState.DEAD, limit=limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """Move dead-lettered jobs (one, or all) back to READY with attempts reset; returns how many.

        The job keeps its id; it is re-appended as a new record that supersedes the dead one.
        Raises JobNotFoundError, or NotLeasedError if ``job_id`` is not dead.
        """
        self._live()
        with self._lock:
            self._settle()
        with self._lock, self._ring.locked():
            self._refresh()
            if job_id is not None:
                view, slot, _ = self._leases.locate(job_id, self.name)
                w = view.seg.load_state(slot)
                if state(w) != ST_DEAD:
                    raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")
                targets = [(0, view, slot, w)]
            else:
                targets = self._index.heads({ST_DEAD})
            n = requeue(self._ring, targets)
            self._refresh()
            return n

    def discard_dead(self, job_id: str) -> None:
        """Remove one job of the dead-letter queue for good (DEAD -> GONE, as :meth:`purge` does
        to every job).  Raises JobNotFoundError, or NotLeasedError if the job is not dead."""
        self._live()
        with self._lock:
            self._settle()
            view, slot, _ = self._leases.locate(job_id, self.name)
            if not discard_dead(self._ring, view.seg, slot):
                raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")

    def purge(self) -> int:
        """Remove every retained job (ready, delayed, leased, done, dead); returns how many: every
        job :meth:`stats` would have counted in ``total`` just before.

        Runs under the writer lock, after catching up, so no record (a job enqueued, a straggler's
        relocated copy) is published between what it reads and what it removes.  Nothing is
        reclaimed, relocated or retired first: a purge removes jobs in whatever state they are."""
        self._live()
        with self._lock, self._ring.locked():
            self._refresh(relocate=False)
            n = purge(self._ring, self._index)
            self._owners.held.clear()
            self._ring.segs.retire_finished()
            self._refresh()
            return n

    def compact(self) -> CompactionResult:
        """Give back disk space now: retire every finished segment and relocate stragglers.

        nobroker rewrites its log without finished jobs; ringq never rewrites a segment.  Instead
        every sealed segment whose jobs are all finished is unlinked, and sealed segments kept
        alive only by a few dead-lettered or long-delayed jobs have those jobs re-appended at the
        tail first (straggler relocation: see docs/design-notes.md), then retired.  The tail
        segment is never retired, and finished jobs in segments that still hold live jobs stay
        (``get`` finds them) until those segments retire.

        Returns:
            A :class:`CompactionResult`: segment bytes before and after, jobs kept (unfinished:
            ready, delayed, leased, dead) and finished jobs dropped.
        Raises:
            QueueClosedError; CompactionError if a segment could not be unlinked (the jobs are
            untouched: a segment is unlinked only once none of its jobs is live).
        """
        self._live()
        with self._lock:
            self._settle()
            before_bytes, before = segment_bytes(self._ring), self.stats()
            compact(self, self._ring, self._index, self._relocator, self._refresh)
            after = self.stats()
            return CompactionResult(before_bytes, segment_bytes(self._ring), after.total - after.done,
                                    max(0, before.done - after.done))

    def stats(self) -> QueueStats:
        """Counts by state, each segment's from one copy of its state table, plus the cumulative
        counters.  Read-only: a lease that has expired or whose holder died is counted as what
        reclaiming it will make it (ready, or dead if its attempts are used up), though nothing is
        written until some process leases.  Raises QueueClosedError."""
        self._live()
        with self._lock:
            self._refresh()
            return QueueStats(*counts(self._ring, self._index, self._reaper))

    def __len__(self) -> int:
        """Number of retained jobs (``stats().total``)."""
        return self.stats().total
