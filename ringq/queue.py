"""The public queue: enqueue, lease, ack, nack, and what they stand on.

Theory of operation
-------------------
Producers append records through the engine (ringq/ring.py) under its flock.  Everything else is
lock-free: a job's mutable state is one 8-byte state word (ringq/job.py) and every change is a CAS
on it, so any number of processes lease, ack and reclaim concurrently and a CAS that fails simply
means another process got there first.

Each process keeps a private, incremental index of what it has seen, built from validated scans of
new records (never by iterating jobs in Python):

* per segment and priority, a *lane*: the head slots of that priority in enqueue order, with a
  cursor.  ``ringq_next_ready`` (C) skips slots that are not READY, so taking the next job costs one
  C call however many other processes are leasing from the same lane.
* a heap with one entry per non-empty lane, keyed ``(-priority, available_at, seq)`` of the lane's
  current candidate, plus individual entries for delayed jobs that came due.
* a scheduled heap of READY jobs whose available-at is in the future, so a delayed job never
  blocks a due one.
* when a job anywhere returns to READY (nack, expired lease, dead holder), the returner bumps its
  segment's change counter; readers seeing it move rewind that segment's lane cursors.

Leases carry a fencing token (the job's lease count); ack/nack/extend CAS on a word that includes
it, so a stale holder is refused with NotLeasedError.  A lease also records its holder's owner index
(ringq/owner.py); a lease whose owner process is gone is reclaimed at once by whoever notices,
otherwise when its visibility timeout passes.
"""

from __future__ import annotations

import heapq
import os
import pathlib
import random
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import codec
from ._native import ffi, lib
from .backoff import BackoffPolicy
from .errors import (
    CompactionError,
    CorruptionError,
    JobNotFoundError,
    LimitError,
    NotLeasedError,
    QueueClosedError,
    QueueFullError,
    SerializationError,
)
from .job import (
    LC_MASK,
    ST_BAD,
    ST_CONT,
    ST_DEAD,
    ST_DONE,
    ST_EMPTY,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    STATE_OF,
    TIME_MAX,
    TIME_SHIFT,
    WHY_DIED,
    WHY_EXPIRED,
    WHY_NONE,
    WHY_PURGED,
    Job,
    JobState,
    pack,
)
from .limits import LimitGate, LimitInfo
from .owner import OwnerRegistry
from .ring import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE, NewRecord, RecoveryReport, Ring
from .segment import (
    OFF_CHANGE,
    OFF_FINISHED,
    OFF_NRECORDS,
    OFF_RETIRED,
    OFF_SEALED,
    OFF_TAIL,
    Segment,
)

__all__ = ["CompactionResult", "Queue", "QueueStats", "DEFAULT_VISIBILITY_TIMEOUT", "DEFAULT_MAX_ATTEMPTS"]

DEFAULT_VISIBILITY_TIMEOUT = 30.0
DEFAULT_MAX_ATTEMPTS = 5
MAX_ATTEMPTS_LIMIT = 0xFFFF
RELOCATE_AFTER = 5.0  # seconds: a READY job due later than this may be moved out of a finished segment
# A sealed segment whose live jobs include READY jobs already due (low-priority jobs that others
# keep overtaking) is relocated only when they are at most 1/RELOCATE_DUE_RATIO of its records: a
# backlog being worked off is not copied, and disk use stays within about this many times the
# slots of such jobs (docs/guarantees.md, invariant 7).
RELOCATE_DUE_RATIO = 16
REAP_INTERVAL = 0.25  # seconds between scans for expired leases and dead holders
FLOOR_RESCAN = 0.005  # seconds between scans while the lease-deadline floor stays in the past
CLAIM_GRACE = 2.0  # seconds a lease may stay without its owner word before it counts as orphaned
AUTO_ID = re.compile(r"^[0-9a-f]{16}$")
_NONE = object()


class _Retired(JobNotFoundError):
    """The job's segment was retired: every job in it had finished."""


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of retained jobs by state, and cumulative counters since the queue was created.

    ``ready`` .. ``corrupt`` count the jobs retained now, each segment's from one copy of its
    state table.  ``delayed`` jobs are READY with a future ``available_at``; ``total`` is the sum
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


class _Grow:
    """A growable numpy vector with a stable C pointer (``ptr``) between appends."""

    __slots__ = ("a", "n", "ptr")

    def __init__(self, dtype: str, cap: int = 64) -> None:
        self.a = np.empty(cap, dtype)
        self.n = 0
        self.ptr = self.a.ctypes.data

    def extend(self, values: np.ndarray) -> None:
        k = len(values)
        if self.n + k > len(self.a):
            bigger = np.empty(max(2 * len(self.a), self.n + k), self.a.dtype)
            bigger[: self.n] = self.a[: self.n]
            self.a = bigger
            self.ptr = bigger.ctypes.data
        self.a[self.n : self.n + k] = values
        self.n += k

    def view(self) -> np.ndarray:
        return self.a[: self.n]


class _Lane:
    __slots__ = ("prio", "slots", "cursor", "queued")

    def __init__(self, prio: int) -> None:
        self.prio = prio
        self.slots = _Grow("<u4")
        self.cursor = 0
        self.queued = False  # an entry for this lane is in the ready heap


class _View:
    """What this process knows of one segment: immutable record fields, lanes, scan position."""

    __slots__ = ("seg", "scanned", "sealed", "change", "lanes", "heads", "head_seqs", "prio", "seq", "enq", "avail", "maxatt",
                 "attb", "idlen", "lanepos", "parkme")

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.scanned = 0
        self.sealed = False
        self.change = seg.load64(OFF_CHANGE)
        self.lanes: dict[int, _Lane] = {}
        self.heads = _Grow("<u4")
        self.head_seqs = _Grow("<u8")
        n = seg.slot_count
        self.prio = np.zeros(n, "<i4")
        self.seq = np.zeros(n, "<u8")
        self.enq = np.zeros(n, "<i8")  # enqueued at, µs (a relocated copy keeps its original's)
        self.avail = np.zeros(n, "<i8")  # available-at from the record header, ms
        self.maxatt = np.zeros(n, "<u2")
        self.attb = np.zeros(n, "<u2")
        self.idlen = np.zeros(n, "<u2")
        self.lanepos = np.zeros(n, "<u4")  # index of each head slot in its lane
        self.parkme = np.zeros(n, bool)  # enqueued with a delay: ordered individually, not by its lane


def _order(view: _View, slot: int) -> int:
    """FIFO rank of a job among jobs of equal priority and available-at: its enqueue time (µs),
    then its seq.  A relocated copy keeps its original's enqueue time, so it keeps its place."""
    return (int(view.enq[slot]) << 32) | (int(view.seq[slot]) & 0xFFFFFFFF)


def _due(view: _View, slot: int, w: int) -> int:
    """Available-at (ms since the epoch) of the READY job at ``slot`` with state word ``w``.

    A state word's time cannot go below its segment's epoch: a relocated copy of a job that was
    due before the copy's segment existed reads as due at that epoch.  Its record header keeps
    the exact time; use it, so the copy keeps its place among jobs due in between."""
    rel = w >> TIME_SHIFT
    if rel == 0 and not (w >> 6) & LC_MASK:
        return min(view.seg.epoch_ms, int(view.avail[slot]))
    return view.seg.epoch_ms + rel


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Queue:
    """A durable job queue: directory ``path``, queue ``name``.  Same API as ``nobroker.Queue``.

    Safe to use from many threads and many processes at once.  Delivery is at-least-once: a job
    whose holder dies after its side effects but before its ack runs again, so handlers must be
    idempotent.

    Args:
        path: queue directory (created 0700 if missing).
        name: queue name ``[A-Za-z0-9_-]{1,64}``; names in one directory are independent.
        fsync: nobroker's spelling: False means ``durability="none"``.
        durability: ``"msync"`` (default; enqueue returns after msync(MS_SYNC) of its record),
            ``"fdatasync"``, ``"group"`` (group commit: concurrent producers share syncs),
            ``"interval"`` (a flusher thread syncs every ``flush_interval`` seconds) or ``"none"``
            (survives process crashes, not power loss).  See docs/durability.md.
        flush_interval: seconds between syncs for ``durability="interval"`` (default 0.05).
        sync_acks: msync every ack and nack before it returns (default False); leases and extends
            are not synced (losing one to a power loss only hands the job out again sooner).
        state_flush_interval: unsynced state changes reach the disk within this many seconds
            (default 1.0; off for ``"none"``; None turns it off).
        visibility_timeout: seconds a lease lasts before the job is handed out again (default 30).
        max_attempts: leases allowed per job before it moves to the dead-letter queue (default 5).
        backoff: retry delay policy for nack (default ``BackoffPolicy()``).
        lock_timeout: seconds to wait for the writer lock (LockTimeoutError after).
        slot_size: bytes per slot for a new queue (multiple of 64, default 256).
        slot_count: slots per segment for a new queue (default 16384; 4 MiB of slots).
        mode: permission bits of files created (default 0o600; directories get matching x bits).
        allow_network_fs: allow NFS/SMB (refused by default: flock does not work across hosts).
        allow_foreign: create the queue even where another library's queue of the same name lives
            (a nobroker log ``<name>.NNNNNN.log``); refused by default with ForeignQueueError,
            whose message says to run ``ringq import-nobroker DIR``.

    Raises:
        ValueError: invalid name or settings.  OSError: directory not creatable/writable (the
        message names the path).  CorruptionError / FormatVersionError: unusable files.
        UnsupportedFilesystemError: network file system.  ForeignQueueError: ``path`` is an
        errand SQLite file, or holds a nobroker queue named ``name`` and no ringq one.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        name: str = "default",
        *,
        fsync: bool = True,
        durability: str | None = None,
        flush_interval: float = 0.05,
        sync_acks: bool = False,
        state_flush_interval: float | None | object = ...,
        visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: BackoffPolicy | None = None,
        lock_timeout: float = 10.0,
        slot_size: int = DEFAULT_SLOT_SIZE,
        slot_count: int = DEFAULT_SLOT_COUNT,
        mode: int = 0o600,
        allow_network_fs: bool = False,
        allow_foreign: bool = False,
    ) -> None:
        if not allow_foreign and not os.path.exists(os.path.join(path, f"{name}.ctl")):
            from .foreign import check_not_foreign

            check_not_foreign(path, name)  # before anything is created: never an empty queue beside old jobs
        if durability is None:
            durability = "msync" if fsync else "none"
        if not 0 < visibility_timeout < TIME_MAX / 1000:
            raise ValueError(f"visibility_timeout must be > 0 seconds, got {visibility_timeout!r}")
        self._check_attempts(max_attempts)
        self.path = pathlib.Path(path)  # the queue directory (nobroker: its log file; ringq has none)
        self.dir = self.path
        self.name = name
        self.visibility_timeout = float(visibility_timeout)
        self.max_attempts = max_attempts
        self.backoff = backoff or BackoffPolicy()
        self._ring = Ring(
            path, name, slot_size=slot_size, slot_count=slot_count, durability=durability,
            flush_interval=flush_interval, sync_acks=sync_acks, state_flush_interval=state_flush_interval,
            lock_timeout=lock_timeout, mode=mode, allow_network_fs=allow_network_fs,
        )
        self.durability = durability
        self._owners = OwnerRegistry(os.path.join(self.path, f"{name}.owners"), mode)
        self._lock = threading.RLock()
        self._closed = False
        self._views: dict[int, _View] = {}
        self._heap: list[tuple] = []
        self._sched: list[tuple] = []
        self._parked: set[tuple[int, int]] = set()  # jobs with an individual entry (scheduled or due)
        self._ids: dict[str, tuple[int, int]] = {}
        self._held: dict[tuple[int, int], int] = {}
        self._seen_change = -1
        self._last_reap = 0.0
        self._unowned: dict[tuple[int, int, int], float] = {}  # (seg, slot, word) -> first seen
        self._rng = random.Random()
        self._gate = LimitGate(self.path, name, mode)  # concurrency caps, rate limits, unique windows
        with self._lock:
            self._refresh()
            self._reap(force=True)

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def recovery(self) -> RecoveryReport:
        """What opening and scanning found: quarantined files, damaged records, repairs."""
        return self._ring.report

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the queue (idempotent).  Leases held are not released: they expire or are reclaimed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._views.clear()
            self._gate.close()
            self._ring.close()
            self._owners.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    def _live(self) -> None:
        if self._closed:
            raise QueueClosedError(f"queue {self.name!r} in {self.path} is closed")

    @staticmethod
    def _check_attempts(n: int) -> None:
        if not isinstance(n, int) or not 1 <= n <= MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts must be an int in [1, {MAX_ATTEMPTS_LIMIT}], got {n!r}")

    # -- enqueue ------------------------------------------------------------------------------------

    def enqueue(
        self,
        payload: Any,
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_attempts: int | None = None,
        job_id: str | None = None,
        key: str | None = None,
        unique_for: float | None = None,
    ) -> Job:
        """Add one job; durable (per the durability strategy) when this returns.

        Args:
            payload: a JSON value, ``bytes``, or a numpy array.
            priority: higher leases first (a signed 32-bit int).
            delay: seconds before the job may be leased (>= 0).
            max_attempts: leases allowed before dead-lettering (default: the queue's).
            job_id: idempotency key: if a job with this id is retained, it is returned and nothing
                is written (across processes and restarts).
            key: the job's limit key (at most 128 UTF-8 bytes): the concurrency cap and rate
                limit set by ``limit(key, ...)`` apply to it; ``Job.key`` gives it back.
            unique_for: with ``key``: seconds of a unique window.  While the window that an
                enqueue of this key opened is open, another enqueue of the key writes nothing
                and returns the job that opened it (docs/limits.md).

        Returns:
            The job (``state`` READY).
        Raises:
            SerializationError (nothing written), RecordTooLargeError, QueueFullError,
            LockTimeoutError, QueueClosedError, ValueError for out-of-range arguments,
            LimitError (a bad ``unique_for``, or ``unique_for`` without ``key``),
            DuplicateJobError (a unique window is open and its job already retired).
        """
        def add() -> Job:
            return self.enqueue_many([payload], priority=priority, delay=delay, max_attempts=max_attempts,
                                     job_ids=None if job_id is None else [job_id], key=key)[0]
        if unique_for is None:
            return add()
        if key is None:
            raise LimitError("unique_for needs a key: enqueue(..., key=..., unique_for=seconds)")
        self._live()
        return self._gate.enqueue_unique(key, unique_for, add, self.get)

    def enqueue_many(
        self,
        payloads: Sequence[Any],
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_attempts: int | None = None,
        job_ids: Sequence[str] | None = None,
        key: str | None = None,
    ) -> list[Job]:
        """Add many jobs with one lock hold and one durability sync.  Same arguments as :meth:`enqueue`
        (``key`` applies to every job of the batch; ``unique_for`` is for single enqueues).

        Every payload is encoded before anything is written: if one fails, none is stored.
        """
        self._live()
        payloads = list(payloads)
        if job_ids is not None:
            job_ids = list(job_ids)
            if len(job_ids) != len(payloads):
                raise ValueError(f"job_ids has {len(job_ids)} ids for {len(payloads)} payloads")
            for jid in job_ids:
                if not isinstance(jid, str) or not jid:
                    raise ValueError(f"job ids must be non-empty strings, got {jid!r}")
        if not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
            raise ValueError(f"priority must be a 32-bit signed int, got {priority!r}")
        if not 0 <= delay <= TIME_MAX / 1000 - 86400 * 366:
            raise ValueError(f"delay must be between 0 and about 33 years (in seconds), got {delay!r}")
        attempts = self.max_attempts if max_attempts is None else max_attempts
        self._check_attempts(attempts)
        delay_ms = int(round(delay * 1000))
        recs = []
        for i, payload in enumerate(payloads):
            kind, data = codec.encode(payload)
            if key is not None:
                kind, data = codec.wrap_key(key, kind, data)
            id_bytes = b""
            if job_ids is not None:
                id_bytes = job_ids[i].encode("utf-8", "strict") if _valid_text(job_ids[i]) else None
                if id_bytes is None:
                    raise SerializationError(f"job id {job_ids[i]!r} is not valid Unicode text")
            recs.append(NewRecord(data, kind, id_bytes, priority, delay_ms, attempts))
        self._ring.check_sizes(recs)  # the whole batch, before a byte of it is allocated or written
        bufs = [self._ring.build(r) for r in recs]
        if not recs:
            return []
        if job_ids is None:
            with self._lock:
                try:
                    placed, ticket = self._ring.append_nowait(recs, bufs)
                except QueueFullError:
                    if not self._make_room():
                        raise
                    placed, ticket = self._ring.append_nowait(recs, bufs)
            # Sync outside our lock, so that other threads append meanwhile (and share the sync).
            self._ring.count("enqueued", len(recs))
            self._ring.finish(ticket)
            return [replace(self._fresh_job(r, p, payloads[i]), key=key) for i, (r, p) in enumerate(zip(recs, placed))]
        with self._lock:
            # Idempotent path: decide under the writer lock, after reading everything published.
            with self._ring.locked():
                self._refresh()
                result: list[Any] = [None] * len(recs)
                todo, todo_bufs, todo_idx, batch_ids = [], [], [], {}
                for i, jid in enumerate(job_ids):
                    loc = self._find(jid)
                    if loc is not None:
                        result[i] = loc
                    elif jid in batch_ids:
                        result[i] = ("dup", batch_ids[jid])
                    else:
                        batch_ids[jid] = i
                        todo.append(recs[i])
                        todo_bufs.append(bufs[i])
                        todo_idx.append(i)
                try:
                    placed = self._ring.append(todo, todo_bufs) if todo else []
                except QueueFullError:
                    if not self._make_room():
                        raise
                    placed = self._ring.append(todo, todo_bufs)
                self._ring.count("enqueued", len(placed))
                for i, p in zip(todo_idx, placed):
                    result[i] = replace(self._fresh_job(recs[i], p, payloads[i]), key=key)
                    self._ids[job_ids[i]] = (p[0], p[1])
            out = []
            for r in result:
                if isinstance(r, Job):
                    out.append(r)
                elif isinstance(r, tuple) and r[0] == "dup":
                    out.append(result[r[1]])
                else:
                    out.append(self._job_at(*r))
            return out

    def import_jobs(self, jobs: Sequence[Job]) -> int:
        """Store jobs brought from elsewhere (another queue's snapshot), keeping their state.

        Each job keeps its ``id``, ``payload``, ``priority``, ``attempts``, ``max_attempts``,
        ``last_error`` and ``available_at`` (an absolute time: a past one is due at once); a DEAD job is stored in the
        dead-letter queue, any other state as READY.  Ids make it idempotent: a job whose id is
        retained is not written again, so an import killed midway can simply be rerun.  All of it is
        one append under the writer lock (one durability sync); every payload is encoded first.

        Returns:
            How many jobs were written (those whose id was not retained yet); ``ringq migrate``
            and ``ringq import-nobroker`` use it.
        Raises:
            SerializationError (nothing written), ValueError (an empty id, attempts out of range),
            RecordTooLargeError, QueueFullError, QueueClosedError.
        """
        self._live()
        recs, ids = [], []
        for job in jobs:
            if not isinstance(job.id, str) or not job.id or not _valid_text(job.id):
                raise ValueError(f"job ids must be non-empty Unicode strings, got {job.id!r}")
            self._check_attempts(job.max_attempts)
            kind, data = codec.encode(job.payload)
            dead = job.state is JobState.DEAD
            at_ms = _now_ms() if dead else int(job.available_at * 1000)
            recs.append(NewRecord(data, kind, job.id.encode(), int(job.priority), 0, job.max_attempts,
                                  min(max(int(job.attempts), 0), MAX_ATTEMPTS_LIMIT),
                                  state=ST_DEAD if dead else ST_READY, at_ms=at_ms))
            ids.append(job.id)
        bufs = [self._ring.build(r) for r in recs]
        with self._lock, self._ring.locked():
            self._refresh()
            todo, todo_bufs, errs, seen = [], [], [], set()
            for job, jid, rec, buf in zip(jobs, ids, recs, bufs):
                fresh = jid not in seen and self._find(jid) is None
                seen.add(jid)
                if fresh:
                    todo.append(rec)
                    todo_bufs.append(buf)
                    errs.append(job.last_error)
            placed = self._ring.append(todo, todo_bufs) if todo else []
            for p, err in zip(placed, errs):
                nseg = self._ring.segment(p[0])
                if err and nseg is not None:
                    self._ring.write_error(nseg, p[1], 0, str(err))
            self._refresh()
            return len(todo)

    def _make_room(self) -> bool:
        """After a QueueFullError: retire every finished segment, the tail included (a volume
        with room for one segment), and drop our mappings of them so that their space returns.
        True if anything was retired (the append is then worth one more try)."""
        with self._ring.locked():
            self._refresh(relocate=False)
            n = self._ring.retire_finished(thorough=True) + self._ring.retire_finished_tail()
        if n:
            self._refresh(relocate=False)  # unmaps them: an unlinked file's space returns at its last unmap
        return bool(n)

    def _fresh_job(self, rec: NewRecord, placed: tuple, payload: Any) -> Job:
        segseq, slot, seq, enq_us, avail_ms = placed
        return Job(
            id=rec.id_bytes.decode() if rec.id_bytes else f"{seq:016x}", payload=payload, priority=rec.priority,
            state=JobState.READY, attempts=0, max_attempts=rec.max_attempts, available_at=avail_ms / 1000,
            enqueued_at=enq_us / 1e6, seq=seq, _loc=(segseq, slot),
        )

    # -- the reader index ------------------------------------------------------------------------------

    def _refresh(self, relocate: bool = True) -> None:
        """Catch up with other processes: new segments, new records, jobs returned to READY.

        Segments seen sealed for the first time are offered for straggler relocation (unless
        ``relocate`` is False); if anything moved, the copies are read in before returning.
        """
        ring = self._ring
        ring.refresh_segments()
        dropped = False
        for seq in ring.drop_retired():
            dropped |= self._views.pop(seq, None) is not None
        if len(ring.segments) != len(self._views):
            for seq in [s for s in self._views if s not in ring.segments]:
                del self._views[seq]
                dropped = True
            for seq, seg in ring.segments.items():
                if seq not in self._views:
                    self._views[seq] = _View(seg)
        if dropped:  # forget the ids of retired segments, or a long-lived process grows without bound
            self._ids = {jid: loc for jid, loc in self._ids.items() if loc[0] in self._views}
        newly_sealed: list[_View] = []
        for view in self._views.values():
            if view.sealed:
                continue
            seg = view.seg
            sealed = seg.load32(OFF_SEALED)  # acquire: the final tail is visible after this
            if seg.load32(OFF_TAIL) > view.scanned:
                self._ingest(view)
            view.sealed = bool(sealed)
            if view.sealed:
                newly_sealed.append(view)
        change = ring.change_counter()
        if change != self._seen_change:
            self._seen_change = change
            for view in self._views.values():
                c = view.seg.load64(OFF_CHANGE)
                if c != view.change:
                    view.change = c
                    self._find_returned(view)
        if relocate and sum(self._maybe_relocate(view) for view in newly_sealed):
            self._refresh(relocate=False)  # map and read the copies (they may have rotated the tail)

    # -- straggler relocation (invariant 7) ----------------------------------------------------------

    def _maybe_relocate(self, view: _View) -> int:
        """Move the few live jobs that keep a sealed segment alive to the tail; returns how many.

        A straggler is a dead-lettered job, or a READY job not due for ``RELOCATE_AFTER`` seconds.
        When a sealed segment's live jobs are all stragglers and at most half of its records, they
        are re-appended (new records that supersede the old ones) so the segment can retire: disk
        use then stays within about twice the live jobs plus the tail, whatever the oldest
        straggler.  A straggler is copied at most once per half segment of new records (write
        amplification at most 2x).  Leased, soon-due and damaged (BAD) records are never moved.
        """
        seg = view.seg
        if not view.sealed or seg.mm is None or seg.load32(OFF_RETIRED):
            return 0
        nrec = seg.load64(OFF_NRECORDS)
        live = nrec - seg.load64(OFF_FINISHED)
        if live <= 0 or 2 * live > nrec:  # moving must at least halve what the segment holds
            return 0
        slots, due = self._stragglers(view)
        if not slots or (due and RELOCATE_DUE_RATIO * live > nrec):
            return 0
        with self._ring.locked():  # excludes requeue_dead and other relocators
            # Under the writer lock nobody appends: after this refresh we know every copy that any
            # (possibly killed) relocator already wrote, and whose supersede we just completed.
            self._refresh(relocate=False)
            if seg.mm is None or seg.load32(OFF_RETIRED):  # retired and unmapped by that refresh
                return 0
            slots, due = self._stragglers(view)
            if due and RELOCATE_DUE_RATIO * (nrec - seg.load64(OFF_FINISHED)) > nrec:
                return 0
            return self._relocate(view, slots) if slots else 0

    def _stragglers(self, view: _View) -> tuple[list[int], bool]:
        """``(head slots, any due)``: ``view``'s live jobs if none is leased, else ``([], False)``.

        ``any due``: some of them are READY and due within ``RELOCATE_AFTER`` (not only dead or
        long-delayed ones); those count only if overtaken by a finished job of higher priority,
        and need a stricter ratio (RELOCATE_DUE_RATIO) and a hold."""
        seg = view.seg
        heads = view.heads.view()
        words = seg.states[heads, 0]
        st = words & np.uint64(7)
        alive = (st != ST_DONE) & (st != ST_GONE)
        if not alive.any():
            return [], False
        lw, lst = words[alive], st[alive]
        due = (lw >> np.uint64(TIME_SHIFT)).astype(np.int64) + seg.epoch_ms
        if not ((lst == ST_DEAD) | (lst == ST_READY)).all():
            return [], False  # a leased (or damaged) job: it finishes, or stays for the operator
        soon = (lst == ST_READY) & (due <= _now_ms() + int(RELOCATE_AFTER * 1000))
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

    def _relocate(self, view: _View, slots: list[int]) -> int:
        """Under the writer lock: copy each straggler to the tail, then mark the original GONE.

        A READY straggler due within ``RELOCATE_AFTER`` seconds is first *held*: its available-at
        is moved ``RELOCATE_AFTER`` ahead by CAS (readers never lease a READY job before its
        available-at), and the copy keeps the original available-at, so the job keeps its place.
        A relocator killed after the hold delays that job by at most ``RELOCATE_AFTER``.  Other
        stragglers are not due for ``RELOCATE_AFTER`` seconds anyway.  The final CAS expects the
        exact word seen (or held) before the copy; if it fails (purged, or leased after a clock
        jump) the copy is withdrawn, so at most one live copy remains.  A relocator killed between
        the append and the CAS leaves two copies until any reader ingests the new one and
        completes the supersede.
        """
        seg = view.seg
        recs, olds, errs = [], [], []
        now = _now_ms()
        hold_ms = now + int(RELOCATE_AFTER * 1000)
        for slot in slots:
            w = seg.load64(seg.state_off_of(slot))
            st, lc = w & 7, (w >> 6) & LC_MASK
            if st not in (ST_READY, ST_DEAD):
                continue
            at_ms = _due(view, slot, w)
            if st == ST_READY and at_ms <= hold_ms:
                held = pack(ST_READY, (w >> 3) & 3, lc, hold_ms - seg.epoch_ms)
                ok, _ = seg.cas64(seg.state_off_of(slot), w, held)
                if not ok:
                    continue  # leased meanwhile: it is not a straggler any more
                w = held
            try:
                info, rec = self._superseding_copy(seg, slot, lc, st, at_ms)
            except CorruptionError:
                continue
            recs.append(rec)
            olds.append((slot, w))
            errs.append(self._last_error(seg, slot, (w >> 3) & 3, lc, st, info.attempts_before))
        if not recs:
            return 0
        placed = self._ring.append(recs)
        for (slot, w), p, err in zip(olds, placed, errs):
            nseg = self._ring.segment(p[0])
            if err and nseg is not None:
                self._ring.write_error(nseg, p[1], 0, err)
            ok, cur = seg.cas64(seg.state_off_of(slot), w, (w & ~0x1F) | ST_GONE)
            if ok:
                self._ring.note_finished(seg)
            elif nseg is not None and not (cur & 7 == ST_GONE and (cur >> 3) & 3 != WHY_PURGED):
                # The original changed under us (purged, or leased after a clock jump): withdraw the
                # copy.  (GONE without the purge reason means a reader completed our supersede.)
                off2 = nseg.state_off_of(p[1])
                w2 = nseg.load64(off2)
                if w2 & 7 in (ST_READY, ST_DEAD) and nseg.cas64(off2, w2, (w2 & ~0x1F) | ST_GONE | (WHY_PURGED << 3))[0]:
                    self._ring.note_finished(nseg)
        return len(recs)

    def _superseding_copy(self, seg: Segment, slot: int, attempts: int | None = None, state: int = ST_READY,
                          at_ms: int | None = None) -> tuple[Any, NewRecord]:
        """A new record of the job at ``slot`` that supersedes it: same id, payload, priority and
        max attempts.  ``attempts`` is added to the carried-over count (None: reset to 0, as
        requeue does); ``state``/``at_ms`` as in NewRecord.  Raises CorruptionError."""
        info, id_bytes, payload = self._ring.read_record(seg, slot)
        jid = bytes(id_bytes) if info.id_len else f"{info.seq:016x}".encode()
        carried = 0 if attempts is None else info.attempts_before + attempts
        return info, NewRecord(bytes(payload), info.codec, jid, info.priority, 0, info.max_attempts, carried,
                               (seg.seq << 24) | slot, state=state, at_ms=at_ms, enqueued_us=info.enqueued_us)

    def _find_returned(self, view: _View) -> None:
        """Jobs of ``view`` back in READY behind their lane's cursor: give each its own heap entry.

        Keyed by its own (new) available-at, so a retried job is ordered as nobroker orders it.
        """
        seg = view.seg
        heads = view.heads.view()
        if not len(heads):
            return
        words = seg.states[heads, 0]
        ready = heads[(words & np.uint64(7)) == ST_READY]
        if not len(ready):
            return
        prios = view.prio[ready]
        pos = view.lanepos[ready]
        now = _now_ms()
        for p, lane in view.lanes.items():
            for slot in ready[(prios == p) & (pos < lane.cursor)].tolist():
                self._park(view, slot, now)

    def _park(self, view: _View, slot: int, now: int) -> None:
        """Give one READY job an individual entry: scheduled if not due yet, else in the ready heap."""
        seg = view.seg
        key = (seg.seq, slot)
        if key in self._parked:
            return
        w = seg.load64(seg.state_off_of(slot))
        if w & 7 != ST_READY:
            return
        due = _due(view, slot, w)
        self._parked.add(key)
        if due > now:
            heapq.heappush(self._sched, (due, -int(view.prio[slot]), _order(view, slot), seg.seq, slot))
        else:
            heapq.heappush(self._heap, (-int(view.prio[slot]), due, _order(view, slot), 1, seg.seq, 0, slot, 0))

    def _ingest(self, view: _View) -> None:
        seg = view.seg
        infos, nxt = self._ring.scan(seg, view.scanned)
        view.scanned = nxt
        if not len(infos):
            return
        # Few numpy calls on the common path (a handful of fresh, valid, plain records): a woken
        # consumer runs this once per wake-up, so it sets the fan-out latency.
        status = infos["status"]
        if status.any():
            for row in infos[status != 0]:
                self._ring.mark_bad(seg, int(row["slot"]), "record failed validation (magic, length or CRC)")
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
        view.parkme[slots] = (ok["available_ms"] > ok["enqueued_us"] // 1000) | (ok["supersedes"] != 0)
        view.heads.extend(slots)
        view.head_seqs.extend(ok["seq"])
        unusual = ((ok["state"] & 7) == ST_EMPTY) | (ok["id_len"] > 0) | (ok["supersedes"] != 0)
        if unusual.any():
            # A valid record below the tail whose state word is EMPTY: a power loss kept the record
            # but not its state page.  It was published (the tail says so): publish it again.
            for row in ok[(ok["state"] & 7) == ST_EMPTY]:
                word = pack(ST_READY, WHY_NONE, 0, int(row["available_ms"]) - seg.epoch_ms)
                seg.cas64(seg.state_off_of(int(row["slot"])), 0, word)
            for row in ok[ok["id_len"] > 0]:
                slot = int(row["slot"])
                base = seg.data_off + slot * seg.slot_size + 64
                jid = bytes(seg.mm[base : base + int(row["id_len"])]).decode("utf-8", "replace")
                self._ids[jid] = (seg.seq, slot)
            now = _now_ms()
            for row in ok[ok["supersedes"] != 0]:
                self._complete_supersede(int(row["supersedes"]))
                # A copy sits in its lane behind younger jobs: give it its own entry now, keyed
                # by its original place, rather than when the lane's cursor reaches it.
                self._park(view, int(row["slot"]), now)
        prios = ok["priority"]
        first = int(prios[0])
        groups = [first] if len(prios) == 1 or (prios == first).all() else [int(p) for p in np.unique(prios)]
        for p in groups:
            lane = view.lanes.get(p)
            if lane is None:
                lane = view.lanes[p] = _Lane(p)
            mine = slots if len(groups) == 1 else slots[prios == p]
            view.lanepos[mine] = np.arange(lane.slots.n, lane.slots.n + len(mine), dtype=np.uint32)
            lane.slots.extend(mine)
            self._queue_lane(view, lane)

    def _complete_supersede(self, ref: int) -> None:
        """A requeued or relocated record names the record it replaces: make sure that one is GONE."""
        seg = self._ring.segment(ref >> 24)
        if seg is None:
            return
        off = seg.state_off_of(ref & 0xFFFFFF)
        w = seg.load64(off)
        # DEAD: a requeue or a relocation of a dead job; READY: a relocated delayed job.  A leased
        # original is left alone (a lease after a clock jump): its holder finishes it.
        if w & 7 in (ST_DEAD, ST_READY) and seg.cas64(off, w, (w & ~7) | ST_GONE)[0]:
            self._ring.note_finished(seg)

    def _lane_key(self, view: _View, lane: _Lane, now: int | None = None) -> tuple | None:
        """Advance the lane's cursor to its next due READY job and return that job's heap key.

        READY jobs that are not yet due are moved to the scheduled heap on the way, so a delayed
        job never hides due ones behind it.
        """
        seg = view.seg
        if now is None:
            now = _now_ms()
        state = ffi.new("uint64_t *")
        arr = lane.slots
        while True:
            idx = lib.ringq_next_ready(seg.ptr, seg.size, seg.geom, ffi.cast("uint32_t *", arr.ptr),
                                       arr.n, lane.cursor, state)
            if idx < 0 or idx >= arr.n:
                lane.cursor = arr.n
                return None
            slot = int(arr.a[idx])
            w = state[0]
            if (w >> 6) & LC_MASK or view.parkme[slot] or seg.epoch_ms + (w >> TIME_SHIFT) > now:
                # A retried or delayed job orders by its own available-at, not its lane position.
                self._park(view, slot, now)
                lane.cursor = idx + 1
                continue
            due = _due(view, slot, w)
            lane.cursor = idx
            return (-lane.prio, due, _order(view, slot), 0, seg.seq, lane.prio, slot, w)

    def _queue_lane(self, view: _View, lane: _Lane, now: int | None = None) -> None:
        if lane.queued:
            return
        key = self._lane_key(view, lane, now)
        if key is not None:
            lane.queued = True
            heapq.heappush(self._heap, key)

    def _find(self, job_id: str) -> tuple[int, int] | None:
        """Location ``(segment seq, slot)`` of the retained record of ``job_id``, or None.

        A purged (GONE) record is not retained: its id is free again.
        """
        loc = self._ids.get(job_id)
        if loc is not None:
            view = self._views.get(loc[0])
            if view is not None and self._retained(view, loc[1]):
                return loc
            if view is None or view.seg.load64(view.seg.state_off_of(loc[1])) & 7 == ST_GONE:
                del self._ids[job_id]
            return None
        if AUTO_ID.match(job_id):
            seq = int(job_id, 16)
            for view in self._views.values():
                hs = view.head_seqs
                if hs.n and hs.a[0] <= seq <= hs.a[hs.n - 1]:
                    i = int(np.searchsorted(hs.view(), seq))
                    if i < hs.n and hs.a[i] == seq:
                        slot = int(view.heads.a[i])
                        if view.idlen[slot] == 0 and self._retained(view, slot):
                            return (view.seg.seq, slot)
        return None

    @staticmethod
    def _retained(view: _View, slot: int) -> bool:
        return view.seg.load64(view.seg.state_off_of(slot)) & 7 in STATE_OF

    def _locate(self, job: Job | str) -> tuple[_View, int, str]:
        if isinstance(job, Job):
            segseq, slot = job._loc
            view = self._views.get(segseq)
            if view is None:
                self._refresh()
                view = self._views.get(segseq)
            if view is not None and (job.seq == 0 or int(view.seq[slot]) == job.seq):
                return view, slot, job.id
            if view is None and segseq and segseq < self._ring.tail_seq() and not os.path.exists(self._ring.seg_path(segseq)):
                raise _Retired(job.id)
            job_id = job.id
        else:
            job_id = job
        loc = self._find(job_id)
        if loc is None:
            self._refresh()
            loc = self._find(job_id)
        if loc is None:
            raise JobNotFoundError(f"no job {job_id!r} in queue {self.name!r} (never enqueued, or retired)")
        return self._views[loc[0]], loc[1], job_id

    # -- materialising jobs --------------------------------------------------------------------------

    def _job_at(self, segseq: int, slot: int, word: int | None = None, decode: bool = True) -> Job:
        view = self._views[segseq]
        seg = view.seg
        info, id_bytes, payload = self._ring.read_record(seg, slot)
        if word is None:
            word = seg.load64(seg.state_off_of(slot))
        st, why, lc, trel = word & 7, (word >> 3) & 3, (word >> 6) & LC_MASK, word >> TIME_SHIFT
        if st not in STATE_OF:
            raise JobNotFoundError(f"job at {seg.path} slot {slot} is no longer retained")
        when = (seg.epoch_ms + trel) / 1000
        state = STATE_OF[st]
        return Job(
            key=codec.split_key(info.codec, payload)[0],
            id=id_bytes.decode("utf-8", "replace") if info.id_len else f"{info.seq:016x}",
            payload=codec.decode(info.codec, payload) if decode else None,
            priority=info.priority,
            state=state,
            attempts=info.attempts_before + lc,
            max_attempts=info.max_attempts,
            available_at=when if st == ST_READY else info.available_ms / 1000,
            enqueued_at=info.enqueued_us / 1e6,
            lease_deadline=when if st == ST_LEASED else None,
            lease_token=str(lc) if lc else None,
            last_error=self._last_error(seg, slot, why, lc, st, info.attempts_before),
            seq=info.seq,
            version=2 * lc - (st == ST_LEASED),
            _loc=(segseq, slot),
        )

    def _last_error(self, seg: Segment, slot: int, why: int, lc: int, st: int, carried: int = 0) -> str | None:
        if why == WHY_EXPIRED:
            return "lease expired: visibility timeout passed before ack"
        if why == WHY_DIED:
            return "lease holder died: its process exited without ack"
        if not carried and (lc == 0 or (st == ST_LEASED and lc == 1)):
            return None  # in its first lease no nack can have happened: spare the side-file read
        entries = self._ring.read_errors(seg.seq).get(slot)
        if not entries:
            return None
        best = [e for e in entries if e[0] <= lc]
        return max(best)[1] if best else None

    # -- lease ------------------------------------------------------------------------------------------

    def lease(self, count: int = 1, *, visibility_timeout: float | None = None, wait: float | None = None,
              detach: bool = False) -> list[Job]:
        """Lease up to ``count`` due jobs, highest priority first, then by available_at and FIFO.

        A leased job is invisible to every other process until acked, nacked, its holder dies, or
        ``visibility_timeout`` seconds pass.  Each job's ``lease_token`` is its fencing token.

        Args:
            count: most jobs to return (>= 1).
            visibility_timeout: seconds (default: the queue's).
            wait: if no job is due, block up to this many seconds for one (woken by producers'
                futex wake, not by polling).  None or 0 returns at once.
            detach: do not tie the leases to this process: they outlive it and end only by
                ack/nack or the visibility timeout (for a process that exits right after
                leasing, such as ``ringq lease``; otherwise its leases come back as soon as it exits).

        Returns:
            Between 0 and ``count`` jobs (LEASED).
        Raises:
            QueueClosedError; ValueError for bad arguments.
        """
        self._live()
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        vt = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        if not 0 < vt < TIME_MAX / 1000:
            raise ValueError(f"visibility_timeout must be > 0 seconds, got {vt!r}")
        deadline = None if not wait else time.monotonic() + wait
        got: list[Job] = []
        while True:
            seen = self._ring.wake_word()
            with self._lock:
                self._live()
                got.extend(self._take(count - len(got), vt, detach))
                next_due = self._sched[0][0] if self._sched else None
            if len(got) >= count or deadline is None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            nap = min(left, REAP_INTERVAL * 4, self._until_floor())
            if next_due is not None:
                nap = min(nap, max(0.0, next_due / 1000 - time.time()) + 0.001)
            held_back = self._gate.nap()  # until a limit that holds a job back may let it go
            if held_back is not None:
                nap = min(nap, held_back)
            self._ring.sleep(seen, nap)

    def _until_floor(self) -> float:
        """Seconds until the earliest lease of the queue may expire (plus 1 ms), if that is ahead."""
        floor_ms = self._ring.deadline_floor()[1]
        ahead = floor_ms / 1000 - time.time()
        return ahead + 0.001 if ahead > 0 else REAP_INTERVAL

    def wake_token(self) -> int:
        """The queue's wake counter: it moves whenever a job is appended or returns to READY.

        Read it *before* looking for work and pass it to :meth:`wait_for_wake`, so that a job
        appended in between is never slept through.  For callers that lease without blocking
        (an event loop) and wait for work in another thread.
        """
        self._live()
        return self._ring.wake_word()

    def wait_for_wake(self, token: int, timeout: float) -> None:
        """Block until the wake counter moves from ``token``, a delayed job seen by this process's
        last lease comes due, or ``timeout`` seconds pass (a futex wait, not polling).

        A delayed job that is already due does not cut the sleep short: the caller was woken for
        it once and may have chosen not to lease (no free capacity), and must not spin.  Takes no
        lock while sleeping, so other threads keep using the queue.  Spurious returns are
        allowed: callers look for work again and wait again.
        """
        self._live()
        nap = min(timeout, self._until_floor())
        with self._lock:
            if self._sched:
                due = self._sched[0][0] / 1000 - time.time()
                if due > 0:
                    nap = min(nap, due + 0.001)
        self._ring.sleep(token, nap)

    def wake(self) -> None:
        """Wake every thread and process sleeping in :meth:`lease` or :meth:`wait_for_wake` on this queue."""
        self._live()
        self._ring.wake()

    def lease_one(self, *, visibility_timeout: float | None = None, wait: float | None = None,
                  detach: bool = False) -> Job | None:
        """Lease one job, or return None if none is due (after waiting up to ``wait`` seconds)."""
        jobs = self.lease(1, visibility_timeout=visibility_timeout, wait=wait, detach=detach)
        return jobs[0] if jobs else None

    def _take(self, want: int, vt: float, detach: bool = False) -> list[Job]:
        self._refresh()
        if self._reap():
            self._refresh()  # the reclaimed jobs moved their segments' change counters
        now = _now_ms()
        sched, heap = self._sched, self._heap
        while sched and sched[0][0] <= now:
            due, nprio, seq, segseq, slot = heapq.heappop(sched)
            heapq.heappush(heap, (nprio, due, seq, 1, segseq, 0, slot, 0))
        for entry in self._gate.reoffer():  # jobs a limit held back: worth another try
            heapq.heappush(heap, entry)
        out: list[Job] = []
        while len(out) < want and heap:
            entry = heapq.heappop(heap)
            kind, segseq, prio, slot = entry[3], entry[4], entry[5], entry[6]
            view = self._views.get(segseq)
            if view is None:
                continue
            seg = view.seg
            if kind == 0:
                lane = view.lanes[prio]
                lane.queued = False
                key = self._lane_key(view, lane, now)
                if key is None:
                    continue
                slot, w = key[6], key[7]
                if key[:3] > entry[:3]:  # the lane's candidate changed: re-queue at its real place
                    lane.queued = True
                    heapq.heappush(heap, key)
                    continue
                job = self._claim(view, slot, w, now, vt, detach)
                if job is not None or self._gate.blocked(seg.seq, slot):
                    lane.cursor += 1  # a job held back by a limit waits in the gate, not the lane
                if job is not None:
                    out.append(job)
                self._queue_lane(view, lane, now)
            else:
                self._parked.discard((segseq, slot))
                w = seg.load64(seg.state_off_of(slot))
                if w & 7 != ST_READY:
                    continue
                due = _due(view, slot, w)
                if due > now:
                    self._schedule(view, slot, due)
                    continue
                if (-int(view.prio[slot]), due, _order(view, slot)) > entry[:3]:
                    self._park(view, slot, now)  # its available-at moved: re-queue at its real place
                    continue
                job = self._claim(view, slot, w, now, vt, detach)
                if job is not None:
                    out.append(job)
        return out

    def _schedule(self, view: _View, slot: int, due_ms: int) -> None:
        key = (view.seg.seq, slot)
        if key in self._parked:
            return
        self._parked.add(key)
        heapq.heappush(self._sched, (due_ms, -int(view.prio[slot]), _order(view, slot), view.seg.seq, slot))

    def _claim(self, view: _View, slot: int, w: int, now: int, vt: float, detach: bool = False) -> Job | None:
        seg = view.seg
        off = seg.state_off_of(slot)
        lc = ((w >> 6) & LC_MASK) + 1
        if lc > LC_MASK:
            return None
        new = pack(ST_LEASED, (w >> 3) & 3, lc, now + int(vt * 1000) - seg.epoch_ms)
        key = (seg.seq, slot)
        # A detached lease has no owner process (owner index 0): reapers leave it to the
        # visibility timeout alone.
        owner = 0 if detach else self._owners.acquire()
        ticket = self._gate.admit(seg, slot, lambda: (-int(view.prio[slot]), _due(view, slot, w), _order(view, slot),
                                                     1, seg.seq, 0, slot, 0))
        if ticket is False:
            return None  # a limit holds it back: it stays READY
        if owner:
            self._held[key] = lc  # before the CAS: our own reaper must never see this lease unowned
        ok, _cur = seg.cas64(off, w, new)
        if not ok:
            self._gate.undo(ticket)
            self._held.pop(key, None)
            return None
        self._gate.bind(ticket, seg, slot, lc)
        self._ring.lower_deadline_floor(seg.epoch_ms + (new >> TIME_SHIFT))
        self._ring.note_state(seg, slot, final=False)
        # The owner word, tagged with the lease count.  A detached lease is tagged with owner
        # index 0: known to have no owner process, so only its visibility timeout ends it -- unlike
        # a lease whose claimer died before this store (left untagged: see CLAIM_GRACE in _reap).
        old_owner = seg.load64(off + 8)
        seg.cas64(off + 8, old_owner, owner | (lc << 16) | ((os.getpid() & 0x3FFFFFFF) << 34))
        if seg.load64(off) != new:
            # Stalled past CLAIM_GRACE between the two CAS: the lease was reclaimed as orphaned.
            self._held.pop(key, None)
            self._gate.release(key)
            return None
        try:
            return self._job_at(seg.seq, slot, new)
        except (CorruptionError, SerializationError) as exc:
            self._held.pop(key, None)
            self._gate.release(key)
            self._ring.mark_bad(seg, slot, str(exc))
            return None

    # -- ack / nack / extend ---------------------------------------------------------------------------

    def _word_for(self, job: Job | str, op: str) -> tuple[_View, int, int, str, int | None]:
        view, slot, job_id = self._locate(job)
        token = _token_number(job.lease_token) if isinstance(job, Job) else None
        seg = view.seg
        w = seg.load64(seg.state_off_of(slot))
        return view, slot, w, job_id, token

    def _require_lease(self, w: int, job_id: str, token: int | None, op: str) -> None:
        """Raise NotLeasedError saying what happened unless ``w`` is a lease held with ``token``."""
        st, why, lc = w & 7, (w >> 3) & 3, (w >> 6) & LC_MASK
        name = {ST_READY: "ready", ST_LEASED: "leased", ST_DONE: "done", ST_DEAD: "dead-lettered",
                ST_GONE: "purged", ST_BAD: "quarantined as damaged"}.get(st, "not a job")
        if token is not None and token != lc:
            if token < 0 or token > lc:
                latest = "it was never leased" if lc == 0 else f"its latest token is {lc}"
                given = "the fencing token given" if token < 0 else f"fencing token {token}"
                raise NotLeasedError(
                    f"cannot {op} job {job_id!r}: {given} was never issued for it ({latest}; it is {name})"
                )
            raise NotLeasedError(
                f"cannot {op} job {job_id!r}: fencing token {token} is stale: the job was leased again since "
                f"(latest token {lc}) and is now {name}"
            )
        if st == ST_LEASED:
            return
        if st == ST_READY:
            if lc == 0:
                cause = "it was never leased"
            elif why == WHY_EXPIRED:
                cause = "its lease expired (visibility timeout passed) and it waits to be leased again"
            elif why == WHY_DIED:
                cause = "its lease holder's process died and it waits to be leased again"
            else:
                cause = "it was nacked and waits for its retry"
        elif st == ST_DONE:
            cause = "it was already acked"
        elif st == ST_DEAD:
            cause = "it used up its attempts and is in the dead-letter queue"
        elif st == ST_GONE:
            cause = "it was purged"
        else:
            cause = "its record failed validation"
        raise NotLeasedError(f"cannot {op} job {job_id!r}: it is {name}, not leased ({cause})")

    def ack(self, job: Job | str) -> None:
        """Mark a leased job done.  Acking it again (same token, or by bare id) is harmless.

        Passing the :class:`Job` checks its fencing token; passing a bare id does not (for
        operators).  Raises NotLeasedError (not leased, or stale token), JobNotFoundError.
        """
        self._live()
        with self._lock:
            try:
                view, slot, w, job_id, token = self._word_for(job, "ack")
            except _Retired:
                return  # its segment retired, so it was finished: a repeated ack
            seg = view.seg
            off = seg.state_off_of(slot)
            if self._gate.release((seg.seq, slot)):
                self._ring.wake()  # a cap slot is free: leases waiting for it may go
            while True:
                if w & 7 == ST_DONE and (token is None or (w >> 6) & LC_MASK == token):
                    return  # a repeated ack; a stale holder's ack of a job done by another is refused below
                self._require_lease(w, job_id, token, "ack")
                done = pack(ST_DONE, (w >> 3) & 3, (w >> 6) & LC_MASK, _now_ms() - seg.epoch_ms)
                ok, w = seg.cas64(off, w, done)
                if ok:
                    break
            self._ring.note_state(seg, slot, final=True)
            self._ring.count("acked")
            self._held.pop((seg.seq, slot), None)
            self._ring.note_finished(seg)
            if view.sealed:
                self._maybe_relocate(view)

    def ack_many(self, jobs: Iterable[Job | str]) -> None:
        """Ack each job in turn (as :meth:`ack`).  Every job that can be acked is; then the first
        refusal (NotLeasedError, JobNotFoundError) is raised."""
        first: Exception | None = None
        for job in jobs:
            try:
                self.ack(job)
            except (NotLeasedError, JobNotFoundError) as exc:
                first = first or exc
        if first is not None:
            raise first

    def nack(self, job: Job | str, *, error: str | None = None, delay: float | None = None) -> Job:
        """Report a leased job as failed: retry after a backoff delay, or dead-letter it.

        Args:
            job: the leased job (token checked) or its id.
            error: text kept as the job's ``last_error``.
            delay: seconds before the retry, instead of the backoff policy's.

        Returns:
            The job in its new state (READY, or DEAD if it used up ``max_attempts``).
        Raises:
            NotLeasedError, JobNotFoundError, ValueError (negative delay).
        """
        self._live()
        if delay is not None and not 0 <= delay <= TIME_MAX / 1000 - 86400 * 366:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        with self._lock:
            view, slot, w, job_id, token = self._word_for(job, "nack")
            seg = view.seg
            off = seg.state_off_of(slot)
            if self._gate.release((seg.seq, slot)):
                self._ring.wake()  # a cap slot is free: leases waiting for it may go
            self._require_lease(w, job_id, token, "nack")
            lc = (w >> 6) & LC_MASK
            attempts = int(view.attb[slot]) + lc
            if error is not None:
                self._ring.write_error(seg, slot, lc, str(error))
            now = _now_ms()
            while True:
                if attempts >= int(view.maxatt[slot]):
                    new = pack(ST_DEAD, WHY_NONE, lc, now - seg.epoch_ms)
                else:
                    wait = self.backoff.delay_for(attempts, self._rng) if delay is None else delay
                    new = pack(ST_READY, WHY_NONE, lc, now + int(wait * 1000) - seg.epoch_ms)
                ok, w2 = seg.cas64(off, w, new)
                if ok:
                    break
                self._require_lease(w2, job_id, token, "nack")
                w = w2
            self._ring.note_state(seg, slot, final=True)
            self._held.pop((seg.seq, slot), None)
            if new & 7 == ST_READY:
                self._ring.note_returned(seg)
            else:
                self._ring.count("dead")
            job = self._job_at(seg.seq, slot, new)
            if view.sealed:
                self._maybe_relocate(view)
            return job

    def extend(self, job: Job | str, seconds: float) -> Job:
        """Push a lease's deadline to ``max(deadline, now) + seconds``.  Raises NotLeasedError if lost."""
        self._live()
        if not 0 < seconds < TIME_MAX / 1000:
            raise ValueError(f"seconds must be > 0 (and finite), got {seconds!r}")
        with self._lock:
            view, slot, w, job_id, token = self._word_for(job, "extend")
            seg = view.seg
            off = seg.state_off_of(slot)
            while True:
                self._require_lease(w, job_id, token, "extend")
                deadline = max(seg.epoch_ms + (w >> TIME_SHIFT), _now_ms()) + int(seconds * 1000)
                new = (w & ((1 << TIME_SHIFT) - 1)) | (min(deadline - seg.epoch_ms, TIME_MAX) << TIME_SHIFT)
                ok, w = seg.cas64(off, w, new)
                if ok:
                    self._ring.note_state(seg, slot, final=False)
                    return self._job_at(seg.seq, slot, new)

    # -- reclaiming ----------------------------------------------------------------------------------------

    def _reap(self, force: bool = False) -> int:
        """Return expired leases and leases of dead holders to READY (or DEAD); retire finished segments."""
        t = time.monotonic()
        now = _now_ms()
        floor_word, floor_ms = self._ring.deadline_floor()
        # Scan when the earliest lease of the queue may have expired (the floor), so an expired
        # lease is leasable again within milliseconds; otherwise every REAP_INTERVAL, for dead
        # holders.  FLOOR_RESCAN spaces scans while the floor stays in the past (a scan could not
        # raise it because leases were taken meanwhile).
        if not force and t - self._last_reap < REAP_INTERVAL and (now <= floor_ms or t - self._last_reap < FLOOR_RESCAN):
            return 0
        self._last_reap = t
        earliest = Ring.FLOOR_NEVER
        mine = self._owners.index if self._owners.pid == os.getpid() else 0
        reclaimed = 0
        unowned: dict[tuple[int, int, int], float] = {}
        suspects: dict[int, list[tuple[_View, int, int]]] = {}
        for view in list(self._views.values()):
            seg = view.seg
            tail = min(seg.load32(OFF_TAIL), seg.slot_count)
            tbl = seg.states[:tail]
            words = tbl[:, 0]
            leased = np.flatnonzero((words & 7) == ST_LEASED)
            if not len(leased):
                continue
            w = words[leased]
            owners = tbl[leased, 1]
            deadlines = (w >> np.uint64(TIME_SHIFT)).astype(np.int64) + seg.epoch_ms
            expired = deadlines < now
            if not expired.all():
                earliest = min(earliest, int(deadlines[~expired].min()))
            for slot, word in zip(leased[expired].tolist(), w[expired].tolist()):
                reclaimed += self._reclaim(view, slot, word, WHY_EXPIRED, now)
            tagged = ((owners >> np.uint64(16)) & np.uint64(LC_MASK)) == ((w >> np.uint64(6)) & np.uint64(LC_MASK))
            # A claim is two CAS: the state word, then the owner word.  A claimer killed between
            # them leaves a lease nobody owns, which only the visibility timeout would free (found
            # by the SIGKILL torture).  A claimer is alive for microseconds there: a lease still
            # unowned after CLAIM_GRACE seconds is orphaned, and reclaimed as its holder's death.
            for slot, word in zip(leased[~expired & ~tagged].tolist(), w[~expired & ~tagged].tolist()):
                key = (seg.seq, slot, word)
                first = unowned[key] = self._unowned.get(key, t)
                if t - first >= CLAIM_GRACE:
                    reclaimed += self._reclaim(view, slot, word, WHY_DIED, now)
            live = ~expired & tagged
            for slot, word, own in zip(leased[live].tolist(), w[live].tolist(), owners[live].tolist()):
                idx = own & 0xFFFF
                if not idx:
                    continue  # a detached lease: only its visibility timeout ends it
                if idx == mine:
                    if (seg.seq, slot) not in self._held:  # left by a dead process that had our index
                        reclaimed += self._reclaim(view, slot, word, WHY_DIED, now)
                elif idx:
                    suspects.setdefault(idx, []).append((view, slot, word))
        for idx, leases in suspects.items():
            if self._owners.is_alive(idx):
                continue
            if not self._owners.try_hold(idx):
                continue  # a new process took the index in between: it reclaims these itself
            try:
                for view, slot, word in leases:
                    reclaimed += self._reclaim(view, slot, word, WHY_DIED, now)
            finally:
                self._owners.release(idx)
        self._unowned = unowned
        self._ring.raise_deadline_floor(floor_word, earliest)
        self._ring.retire_finished(thorough=force)
        for view in list(self._views.values()):
            if view.sealed:
                self._maybe_relocate(view)
        return reclaimed

    def _reclaim(self, view: _View, slot: int, word: int, why: int, now: int) -> int:
        seg = view.seg
        lc = (word >> 6) & LC_MASK
        if int(view.attb[slot]) + lc >= int(view.maxatt[slot]):
            new = pack(ST_DEAD, why, lc, now - seg.epoch_ms)
        else:
            new = pack(ST_READY, why, lc, now - seg.epoch_ms)
        ok, _ = seg.cas64(seg.state_off_of(slot), word, new)
        if ok and new & 7 == ST_READY:
            self._ring.note_returned(seg)
        elif ok:
            self._ring.count("dead")
        return int(ok)

    # -- reads and admin -------------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """The job with this id (a snapshot).  Raises JobNotFoundError if it is not retained."""
        self._live()
        with self._lock:
            self._refresh()
            view, slot, _ = self._locate(job_id)
            tbl = np.array(view.seg.states[slot : slot + 1])
            self._as_reclaimed(view, tbl, _now_ms(), np.array([slot]))
            return self._job_at(view.seg.seq, slot, int(tbl[0, 0]))

    def _heads(self, states: Iterable[int], as_reclaimed: bool = True) -> list[tuple[int, _View, int, int]]:
        """(seq, view, slot, word) of retained heads whose state is in ``states``, in seq order.

        ``as_reclaimed``: show leases a reclaim would end as what it would make them (for reads;
        never for a caller that CASes on the words returned)."""
        wanted = np.array(sorted(states), dtype=np.uint64)
        rows = []
        now = _now_ms()
        for view in self._views.values():
            heads = view.heads.view()
            if not len(heads):
                continue
            tbl = view.seg.states[heads]  # a copy (fancy indexing): reclaims are shown, never written
            if as_reclaimed:
                self._as_reclaimed(view, tbl, now, heads)
            words = tbl[:, 0]
            sel = np.isin(words & np.uint64(7), wanted)
            for slot, word in zip(heads[sel].tolist(), words[sel].tolist()):
                rows.append((_order(view, slot), view, slot, word))
        rows.sort(key=lambda r: r[0])
        return rows

    def list_jobs(self, state: JobState | str | None = None, *, limit: int | None = None) -> list[Job]:
        """Retained jobs in enqueue order, optionally only those in ``state``, at most ``limit``.

        ``state`` is a :class:`JobState` (or its value) or ``"delayed"``: READY jobs not yet due
        (``"ready"`` includes them, as in nobroker).  ``limit=None`` means all.  Raises ValueError
        for an unknown state or a negative limit.
        """
        self._live()
        want = {ST_READY, ST_LEASED, ST_DONE, ST_DEAD}
        delayed = state == "delayed"
        if delayed:
            want = {ST_READY}
        elif state is not None:
            try:
                js = JobState(state)
            except ValueError:
                raise ValueError(f"state must be one of {[s.value for s in JobState] + ['delayed']}, got {state!r}") from None
            want = {k for k, v in STATE_OF.items() if v is js}
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
        with self._lock:
            self._refresh()
            now = _now_ms()
            out = []
            for _seq, view, slot, word in self._heads(want):
                if limit is not None and len(out) >= limit:
                    break
                if delayed and view.seg.epoch_ms + (word >> TIME_SHIFT) <= now:
                    continue
                try:
                    out.append(self._job_at(view.seg.seq, slot, word))
                except (CorruptionError, SerializationError):
                    continue
            return out

    def dlq(self, *, limit: int | None = None) -> list[Job]:
        """Dead-lettered jobs, oldest first."""
        return self.list_jobs(JobState.DEAD, limit=limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """Move dead-lettered jobs (one, or all) back to READY with attempts reset; returns how many.

        The job keeps its id; it is re-appended as a new record that supersedes the dead one.
        Raises JobNotFoundError, or NotLeasedError if ``job_id`` is not dead.
        """
        self._live()
        with self._lock, self._ring.locked():
            self._refresh()
            if job_id is not None:
                view, slot, _ = self._locate(job_id)
                w = view.seg.load64(view.seg.state_off_of(slot))
                if w & 7 != ST_DEAD:
                    raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")
                targets = [(0, view, slot, w)]
            else:
                targets = self._heads({ST_DEAD}, as_reclaimed=False)
            recs, olds = [], []
            for _seq, view, slot, word in targets:
                seg = view.seg
                recs.append(self._superseding_copy(seg, slot)[1])
                olds.append((view, slot, word))
            if not recs:
                return 0
            self._ring.append(recs)
            for view, slot, word in olds:
                seg = view.seg
                if seg.cas64(seg.state_off_of(slot), word, (word & ~7) | ST_GONE)[0]:
                    self._ring.note_finished(seg)
            self._refresh()
            return len(recs)

    def purge(self) -> int:
        """Remove every retained job (ready, delayed, leased, done, dead); returns how many."""
        self._live()
        with self._lock:
            self._refresh()
            n = 0
            for view in list(self._views.values()):
                seg = view.seg
                finished = 0
                for slot in view.heads.view().tolist():
                    off = seg.state_off_of(slot)
                    while True:
                        w = seg.load64(off)
                        st = w & 7
                        if st in (ST_GONE, ST_EMPTY, ST_CONT):
                            break
                        if seg.cas64(off, w, (w & ~0x1F) | ST_GONE | (WHY_PURGED << 3))[0]:
                            n += st != ST_BAD
                            finished += st not in (ST_DONE,)
                            break
                if finished:
                    self._ring.note_finished(seg, finished)
            self._held.clear()
            self._ring.retire_finished()
            self._refresh()
            return n

    def compact(self) -> CompactionResult:
        """Give back disk space now: retire every finished segment and relocate stragglers.

        nobroker rewrites its log without finished jobs; ringq never rewrites a segment.  Instead
        every sealed segment whose jobs are all finished is unlinked, and sealed segments kept
        alive only by a few dead-lettered or long-delayed jobs have those jobs re-appended at the
        tail first (the rule of straggler relocation: see docs/design-notes.md), then retired.
        The tail segment is never retired, and finished jobs in segments that still hold live
        jobs stay (``get`` finds them) until those segments retire.

        Returns:
            A :class:`CompactionResult`: segment bytes before and after, jobs kept (unfinished:
            ready, delayed, leased, dead) and finished jobs dropped.
        Raises:
            QueueClosedError; CompactionError if a segment could not be unlinked (the jobs are
            untouched: a segment is unlinked only once none of its jobs is live).
        """
        self._live()
        with self._lock:
            self._refresh()
            before_bytes, before = self._segment_bytes(), self.stats()
            try:
                for view in list(self._views.values()):
                    if view.sealed:
                        self._maybe_relocate(view)
                self._ring.retire_finished(thorough=True)
                self._refresh()
            except OSError as exc:
                raise CompactionError(f"compacting queue {self.name!r} in {self.path}: {exc}; no job was moved "
                                      "or lost") from exc
            after = self.stats()
            return CompactionResult(
                bytes_before=before_bytes,
                bytes_after=self._segment_bytes(),
                jobs_kept=after.total - after.done,
                jobs_dropped=max(0, before.done - after.done),
            )

    def _segment_bytes(self) -> int:
        total = 0
        for seg in self._ring.all_segments():
            try:
                total += os.path.getsize(seg.path)
            except OSError:
                pass  # retired meanwhile by another process
        return total

    def stats(self) -> QueueStats:
        """Counts by state, each segment's from one copy of its state table, plus the cumulative
        counters.  Read-only: a lease that has expired or whose holder died is counted as what
        reclaiming it will make it (ready, or dead if its attempts are used up), though nothing is
        written until some process leases.  Raises QueueClosedError."""
        self._live()
        with self._lock:
            self._refresh()
            now = _now_ms()
            c = np.zeros(8, np.int64)
            delayed = 0
            for view in self._views.values():
                seg = view.seg
                tail = min(seg.load32(OFF_TAIL), seg.slot_count)
                # One copy of the live table: every count below comes from the same instant of
                # this segment (two reads of the shared words could see a job in two states).
                tbl = np.array(seg.states[:tail])
                words = tbl[:, 0]
                self._as_reclaimed(view, tbl, now)
                st = words & np.uint64(7)
                c += np.bincount(st.astype(np.int64), minlength=8)
                ready = words[st == ST_READY]
                if len(ready):
                    delayed += int(np.count_nonzero((ready >> np.uint64(TIME_SHIFT)).astype(np.int64) + seg.epoch_ms > now))
            ready = int(c[ST_READY]) - delayed
            total = int(c[ST_READY] + c[ST_LEASED] + c[ST_DONE] + c[ST_DEAD])
            tot = self._ring.totals()
            return QueueStats(ready, delayed, int(c[ST_LEASED]), int(c[ST_DONE]), int(c[ST_DEAD]), total,
                              int(c[ST_BAD]), tot["enqueued"], tot["acked"], tot["dead"])

    def _as_reclaimed(self, view: _View, tbl: np.ndarray, now: int, slots_of: np.ndarray | None = None) -> None:
        """Rewrite, in ``tbl``, a private copy of rows of ``view``'s state table (state and owner
        word; row i is slot ``slots_of[i]``, or slot i if None), each lease that a reclaim would end -- expired, or held by a dead process -- as the
        word the reclaim would write.  Never writes to the queue."""
        words = tbl[:, 0]
        leased = np.flatnonzero((words & np.uint64(7)) == ST_LEASED)
        if not len(leased):
            return
        seg = view.seg
        w = words[leased]
        own = tbl[leased, 1]
        lc = (w >> np.uint64(6)) & np.uint64(LC_MASK)
        expired = (w >> np.uint64(TIME_SHIFT)).astype(np.int64) + seg.epoch_ms < now
        why = np.where(expired, WHY_EXPIRED, WHY_DIED).astype(np.uint64)
        idx = own & np.uint64(0xFFFF)
        tagged = ((own >> np.uint64(16)) & np.uint64(LC_MASK)) == lc
        mine = self._owners.index if self._owners.pid == os.getpid() else 0
        gone = np.zeros(len(leased), bool)
        for i in np.unique(idx[tagged & ~expired & (idx != 0)]).tolist():
            if i != mine and not self._owners.is_alive(int(i)):
                gone |= tagged & (idx == i)
        hit = expired | gone
        if not hit.any():
            return
        rows = leased[hit]
        slots = rows if slots_of is None else slots_of[rows]
        maxatt = view.maxatt[slots].astype(np.int64)
        out_of_tries = (maxatt > 0) & (view.attb[slots].astype(np.int64) + lc[hit].astype(np.int64) >= maxatt)
        state = np.where(out_of_tries, ST_DEAD, ST_READY).astype(np.uint64)
        rel = np.uint64(max(now - seg.epoch_ms, 0))
        words[rows] = state | (why[hit] << np.uint64(3)) | (lc[hit] << np.uint64(6)) | (rel << np.uint64(TIME_SHIFT))

    def __len__(self) -> int:
        """Number of retained jobs (``stats().total``)."""
        return self.stats().total

    def __repr__(self) -> str:
        return f"Queue({str(self.path)!r}, name={self.name!r}, durability={self.durability!r})"

    # -- periodic jobs (ringq/schedule.py) -----------------------------------------------------------

    def _scheduler(self) -> Any:
        with self._lock:
            sch = self.__dict__.get("_schedules_obj")
            if sch is None:
                from .schedule import Scheduler

                sch = self._schedules_obj = Scheduler(self)
            return sch

    def schedule(self, name: str, payload: Any, *, cron: str | None = None, every: float | None = None,
                 tz: str = "UTC", priority: int = 0, max_attempts: int | None = None) -> Any:
        """Create or replace the periodic job ``name``: one job with ``payload`` per tick.

        Give exactly one of ``every`` (seconds; ticks at creation + k * every) or ``cron`` (a
        5-field cron expression, or 6 with seconds first, evaluated in time zone ``tz``, an IANA
        name).  Every tick enqueues exactly one job, whichever and however many processes serve
        the queue (a ``Worker``, or :meth:`run_schedules`), with the idempotent id
        ``schedule:<name>:<tick ms since the Unix epoch>``; ticks missed while nothing ran give one
        catch-up job.  Calling it again with the same arguments changes nothing; with another
        payload, priority or max_attempts it replaces those and keeps the ticks; with other
        timing it starts the ticks afresh.  Stored durably in ``<name>.sched`` (docs/schedules.md).

        Returns:
            The :class:`ringq.schedule.Schedule` (``next_fire``: seconds since the Unix epoch).
        Raises:
            ValueError for a bad name, cron expression, time zone, interval or priority;
            SerializationError for the payload; ScheduleFileError for a damaged schedule file.
        """
        return self._scheduler().add(name, payload, cron=cron, every=every, tz=tz, priority=priority,
                                     max_attempts=max_attempts)

    def schedules(self) -> list[Any]:
        """The periodic jobs of this queue (:class:`ringq.schedule.Schedule`), oldest first."""
        return self._scheduler().list()

    def unschedule(self, name: str) -> None:
        """Delete the periodic job ``name`` (jobs it already enqueued stay).

        Raises:
            ScheduleNotFoundError (a KeyError) if there is none.
        """
        self._scheduler().remove(name)

    def run_schedules(self) -> list[Job]:
        """Enqueue the job of every periodic job whose tick is due; returns those enqueued.

        ``Worker`` calls this itself; scripts without a worker call it now and then (at the latest
        by :meth:`next_schedule_fire`).  Safe to call from any number of processes at once.
        """
        self._live()
        return self._scheduler().run_due()

    def next_schedule_fire(self) -> float | None:
        """Seconds until the earliest tick of any periodic job (<= 0: due now), or None if there
        are none.  Cheap: one read of shared memory."""
        self._live()
        return self._scheduler().due_in()


    # -- limits (ringq/limits.py) --------------------------------------------------------------------

    def limit(self, name: str, *, concurrency: int | None = None, rate: tuple[int, float] | None = None,
              burst: int | None = None) -> None:
        """Set the limit of key ``name`` (or of every job of this queue, when ``name`` is the
        queue's name), for every process on the host at once; it persists in ``<name>.limits``.

        Args:
            name: a job key (``enqueue(..., key=name)``) or this queue's name.
            concurrency: most leases of such jobs held at once (1..4096).  A holder's slot is
                freed by its ack or nack, or at once when its process dies.
            rate: ``(count, per)``: ``count`` leases per ``per`` seconds, spaced evenly (a token
                bucket, exact across processes): in any span of ``t`` seconds at most
                ``burst + t * count / per`` leases.
            burst: tokens the bucket holds when full: how many leases may start at once after
                an idle spell (default: the tokens of 50 ms, at least 2, so that a consumer
                woken a few ms late does not lose its token).
            Neither ``concurrency`` nor ``rate``: remove the limit.
        Raises:
            LimitError: bad values, or all 64 limits of the queue in use.  LimitsFileError: the
            limits file is damaged.
        """
        self._live()
        self._gate.set_limit(name, concurrency, rate, burst)
        self._ring.wake()  # a raised or removed limit may free held-back jobs

    def limits(self) -> list[LimitInfo]:
        """Every limit of this queue with its live use (``running`` leases, next token)."""
        self._live()
        return self._gate.describe()

    def discard_dead(self, job_id: str) -> None:
        """Remove one job of the dead-letter queue for good (DEAD -> GONE, as :meth:`purge` does
        to every job).  Raises JobNotFoundError, or NotLeasedError if the job is not dead."""
        self._live()
        with self._lock:
            view, slot, _ = self._locate(job_id)
            seg = view.seg
            off = seg.state_off_of(slot)
            w = seg.load64(off)
            if w & 7 != ST_DEAD or not seg.cas64(off, w, (w & ~0x1F) | ST_GONE | (WHY_PURGED << 3))[0]:
                raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")
            self._ring.note_finished(seg)


def _token_number(token: object) -> int | None:
    """A fencing token as the lease count it stands for; -1 for text that no lease ever issued."""
    if token is None:
        return None
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    text = str(token)
    return int(text) if text.isdigit() and len(text) < 12 else -1


def _valid_text(s: str) -> bool:
    try:
        s.encode("utf-8", "strict")
        return True
    except UnicodeEncodeError:
        return False
