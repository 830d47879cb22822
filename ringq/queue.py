"""The public queue: enqueue, lease, ack, nack, and what they stand on.

Theory of operation
-------------------
Producers append records through the engine (ringq/ring.py) under its flock.  Everything else is
lock-free: a job's mutable state is one 8-byte state word (ringq/words.py) and every change is a CAS
on it that the job state machine allows (ringq/transitions.py), so any number of processes lease,
ack and reclaim concurrently and a CAS that fails simply means another process got there first.

This class is the public API and the only coordinator of the modules below it: the reader's
index (ringq/index.py), the reaper (ringq/reaper.py), straggler relocation (ringq/relocate.py),
job snapshots (ringq/snapshot.py) and the engine (ringq/ring.py).

Leases carry a fencing token (the job's lease count); ack/nack/extend CAS on a word that includes
it, so a stale holder is refused with NotLeasedError.  A lease also records its holder's owner index
(ringq/owner.py); a lease whose owner process is gone is reclaimed at once by whoever notices,
otherwise when its visibility timeout passes.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import random
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from . import forksafe, lifecycle, snapshot, transitions
from .admin import AdminMethods, CompactionResult, QueueStats
from .backoff import BackoffPolicy
from .errors import JobNotFoundError, LimitError, NotLeasedError, QueueClosedError
from .index import Index
from .job import Job
from .leases import Leases
from .lifecycle import LifecycleMethods
from .limits import LimitGate, LimitMethods
from .options import QueueOptions
from .owner import OwnerRegistry
from .producer import MAX_ATTEMPTS_LIMIT, MAX_DELAY, Producer, check_attempts
from .reaper import REAP_INTERVAL, Reaper
from .recovery import RecoveryReport
from .relocate import Relocator
from .results import DEFAULT_RESULT_TTL, Results
from .ring import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE, Ring
from .schedule import ScheduleMethods
from .segment import check_geometry
from .words import ST_DONE, TIME_MAX, lease_count, state

__all__ = ["CompactionResult", "Queue", "QueueStats", "QueueOptions", "DEFAULT_VISIBILITY_TIMEOUT", "MAX_ATTEMPTS_LIMIT",
           "DEFAULT_MAX_ATTEMPTS"]

_NO_RESULT: Any = object()  # ack() without a result (None is a result: JSON null)
DEFAULT_VISIBILITY_TIMEOUT = 30.0
DEFAULT_MAX_ATTEMPTS = 5


class GeometryWarning(UserWarning):
    """Queue() was given a slot geometry other than the existing queue's; the queue keeps its own."""


def due_delay(delay: Any) -> Any:
    """An enqueue's ``delay`` as stored: a negative number of seconds means "due now" (nobroker's
    rule, so ``run_at - time.time()`` works once ``run_at`` passed); anything else unchanged, for
    the caller's range check (NaN and values past the limit stay errors)."""
    if isinstance(delay, (int, float)) and not isinstance(delay, bool) and -math.inf < delay < 0:
        return 0.0
    return delay


class Queue(AdminMethods, LifecycleMethods, LimitMethods, ScheduleMethods):
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
        sync_acks: make every ack and nack durable before it returns (default False); leases and
            extends are not synced (losing one to a power loss only hands the job out again sooner).
        state_flush_interval: unsynced state changes reach the disk within this many seconds
            (default 1.0; off for ``"none"``; None turns it off).
        visibility_timeout: seconds a lease lasts before the job is handed out again (default 30).
        max_attempts: leases allowed per job before it moves to the dead-letter queue (default 5).
        backoff: retry delay policy for nack (default ``BackoffPolicy()``).
        lock_timeout: seconds to wait for the writer lock (LockTimeoutError after).
        slot_size: bytes per slot for a new queue (multiple of 64, default 256).
        slot_count: slots per segment for a new queue (default 16384; 4 MiB of slots).  Both are
            validated on every open (ValueError); on an existing queue a value other than the
            default that differs from the queue's own is ignored with a :class:`GeometryWarning`
            (the geometry is fixed at creation; ``q.options`` shows the one in use).
        mode: permission bits of files created (default 0o600; directories get matching x bits).
        allow_network_fs: allow NFS/SMB (refused by default: flock does not work across hosts).
        allow_foreign: open the queue even in a directory holding a nobroker queue (a log
            ``<name>.NNNNNN.log``) not yet imported there; refused by default, whatever ``name``,
            with ForeignQueueError, whose message says to run ``ringq import-nobroker DIR``
            (ringq/foreign.py check_not_foreign).
        auto_ids: False for a queue whose every job has a caller id (a companion queue keyed by
            another queue's job ids, such as a results queue): enqueue without an id is refused,
            and ids of the automatic form are allowed, since none is ever made here (ringq/ids.py).
        spin: seconds a blocking lease (``wait=``) or :meth:`wait_for_wake` that found nothing
            polls the queue's wake word before it sleeps on the futex (default 0: sleep at once;
            at most 1).  A job appended during the spin is seen within about a microsecond rather
            than after a futex wake-up (tens of microseconds on a busy host), but the spin keeps a
            core busy: it pays when jobs arrive less than ``spin`` apart and cores are spare
            (docs/benchmarks.md, fan-out).

    Attributes:
        options: the frozen :class:`~ringq.options.QueueOptions` the queue was opened with.

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
        auto_ids: bool = True,
        spin: float = 0.0,
    ) -> None:
        if not allow_foreign:
            from .foreign import check_not_foreign

            check_not_foreign(path, name)  # before anything is created: never an empty queue beside old jobs
        if durability is None:
            durability = "msync" if fsync else "none"
        if not 0 < visibility_timeout < TIME_MAX / 1000:
            raise ValueError(f"visibility_timeout must be > 0 seconds, got {visibility_timeout!r}")
        check_attempts(max_attempts)
        if not isinstance(spin, (int, float)) or isinstance(spin, bool) or not 0 <= spin <= 1:
            raise ValueError(f"spin must be a number of seconds from 0 to 1, got {spin!r}")
        self.spin = float(spin)
        # Checked on every open, not only at creation, so a bad argument never passes silently.
        for arg, value in (("slot_size", slot_size), ("slot_count", slot_count)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{arg} must be an int, got {value!r}")
        check_geometry(slot_size, slot_count)
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
        ctl = self._ring.ctl
        for arg, given, default, stored in (("slot_size", slot_size, DEFAULT_SLOT_SIZE, ctl.slot_size),
                                            ("slot_count", slot_count, DEFAULT_SLOT_COUNT, ctl.slot_count)):
            if given not in (default, stored):  # asked for explicitly, yet the queue has another
                warnings.warn(f"queue {name!r} in {path} was created with {arg}={stored}; {arg}={given} is "
                              "ignored (the geometry is fixed when a queue is created)", GeometryWarning,
                              stacklevel=2)
        self.durability = durability
        self.options = QueueOptions.of_queue(self, self._ring, flush_interval, sync_acks, lock_timeout, mode,
                                             allow_network_fs, allow_foreign, auto_ids, spin)
        self._owners = OwnerRegistry(os.path.join(self.path, f"{name}.owners"), mode)
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)  # notified when the last waiting thread left
        self._waiters = 0  # threads asleep in lease or wait_for_wake, outside the lock
        self._closed = False
        self._index = Index(self._ring)
        self._reaper = Reaper(self._ring, self._index, self._owners)
        self._relocator = Relocator(self._ring, self._index, lambda: self._refresh(relocate=False))
        self._gate = LimitGate(self.path, name, mode)  # concurrency caps, rate limits, unique windows
        self._leases = Leases(self._ring, self._index, self._owners, self._relocator, self._refresh, self._gate)
        self._producer = Producer(self._ring, self._index, self._lock, self._refresh, auto_ids)
        self._pause = lifecycle.PauseFile(self._ring)
        self._results = Results(name, self._companion)
        self._rng = random.Random()
        forksafe.register(self)
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
            if self._waiters:
                # Threads asleep in lease or wait_for_wake hold pointers into the mappings: wake
                # them (they then see the queue closed) and let them leave before unmapping.
                self._ring.ctl.wake()
                self._idle.wait_for(lambda: not self._waiters, timeout=10)
            self._index.clear()
            self._gate.close()
            self._ring.close()
            self._owners.close()
            self._pause.close()
            self._results.close()

    @contextlib.contextmanager
    def _asleep(self) -> Iterator[None]:
        """Around a sleep outside the queue lock on the shared mappings: counted, so that
        :meth:`close` wakes the sleeper and waits for it to leave before unmapping.  Raises
        QueueClosedError if the queue is closed already."""
        with self._lock:
            self._live()
            self._waiters += 1
        try:
            yield
        finally:
            with self._lock:
                self._waiters -= 1
                if not self._waiters:
                    self._idle.notify_all()

    def drop_inherited_locks(self) -> None:
        """In a forked child (ringq/forksafe.py): a parent thread may have been inside a call of
        this queue at the fork, holding its lock, which no thread of the child will ever release."""
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._waiters = 0
        self._producer.lock = self._lock

    def _companion(self, name: str) -> Queue:
        """A queue in the same directory with this one's settings (the results queue)."""
        return Queue(self.path, name, **{**self.options.to_kwargs(), "auto_ids": False})

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Never blocks.  During interpreter shutdown daemon threads (a worker's, a flusher's) are
        # frozen wherever they stood and may hold any lock close() takes, so nothing is done
        # there: the exit hook of ringq/durability.py already flushed, and the OS drops the
        # descriptors, mappings and flocks.  Otherwise close only if the queue lock is free.
        try:
            if self._closed or sys.is_finalizing():
                return
            if not self._lock.acquire(blocking=False):
                return
            try:
                self.close()
            finally:
                self._lock.release()
        except Exception:
            pass

    def _live(self) -> None:
        if self._closed:
            raise QueueClosedError(f"queue {self.name!r} in {self.path} is closed")

    # -- enqueue ------------------------------------------------------------------------------------

    def enqueue(self, payload: Any, *, priority: int = 0, delay: float = 0.0, max_attempts: int | None = None,
                job_id: str | None = None, key: str | None = None, unique_for: float | None = None,
                expires_in: float | None = None, expires_at: float | None = None) -> Job:
        """Add one job; durable (per the durability strategy) when this returns.

        Args:
            payload: a JSON value, ``bytes``, or a numpy array.
            priority: higher leases first (a signed 32-bit int).
            delay: seconds before the job may be leased; a negative delay means now (as nobroker),
                so ``run_at - time.time()`` may be passed once ``run_at`` has passed.
            max_attempts: leases allowed before dead-lettering (default: the queue's).
            job_id: idempotency key: if a job with this id is retained, it is returned and nothing
                is written (across processes and restarts).  Without one the job gets an automatic
                id, its sequence number as 16 hex digits; so an id of 16 hex digits is refused
                (ValueError), or it could name a second job (ringq/ids.py).
            key: the job's limit key (at most 128 UTF-8 bytes): the concurrency cap and rate
                limit set by ``limit(key, ...)`` apply to it; ``Job.key`` gives it back.
            unique_for: with ``key``: seconds of a unique window.  While the window that an
                enqueue of this key opened is open, another enqueue of the key writes nothing
                and returns the job that opened it (docs/limits.md).
            expires_in: seconds from now after which the job, if nobody leased it yet, is never
                leased: it becomes EXPIRED (docs/lifecycle.md).  ``expires_at``: the same as a time,
                seconds since the Unix epoch.  Give at most one.

        Returns:
            The job (``state`` READY).
        Raises:
            SerializationError (nothing written), RecordTooLargeError, QueueFullError,
            LockTimeoutError, QueueClosedError, ValueError for out-of-range arguments,
            LimitError (a bad ``unique_for``, or ``unique_for`` without ``key``),
            DuplicateJobError (a unique window is open and its job already retired).
        """
        if unique_for is None and job_id is None:  # the common case, without enqueue_many's lists
            if self._closed:
                self._live()
            return self._producer.enqueue_one(
                payload, priority, due_delay(delay), self.max_attempts if max_attempts is None else max_attempts,
                key, None if expires_in is None and expires_at is None else expiry_ms(expires_in, expires_at))

        def add() -> Job:
            return self.enqueue_many([payload], priority=priority, delay=delay, max_attempts=max_attempts,
                                     job_ids=None if job_id is None else [job_id], key=key,
                                     expires_in=expires_in, expires_at=expires_at)[0]

        if unique_for is None:
            return add()
        if key is None:
            raise LimitError("unique_for needs a key: enqueue(..., key=..., unique_for=seconds)")
        self._live()
        return self._gate.enqueue_unique(key, unique_for, add, self.get)

    def enqueue_many(self, payloads: Sequence[Any], *, priority: int = 0, delay: float = 0.0,
                     max_attempts: int | None = None, job_ids: Sequence[str] | None = None,
                     key: str | None = None, expires_in: float | None = None,
                     expires_at: float | None = None) -> list[Job]:
        """Add many jobs with one lock hold and one durability sync.  Same arguments as :meth:`enqueue`
        (``key`` applies to every job of the batch; ``unique_for`` is for single enqueues).

        Every payload is encoded before anything is written: if one fails, none is stored.
        """
        self._live()
        attempts = self.max_attempts if max_attempts is None else max_attempts
        return self._producer.enqueue(list(payloads), priority, due_delay(delay), attempts,
                                      None if job_ids is None else list(job_ids), key,
                                      expiry_ms(expires_in, expires_at))

    # -- catching up ----------------------------------------------------------------------------------

    def _refresh(self, relocate: bool = True, quick: bool = False) -> None:
        """Catch up with other processes; segments seen sealed for the first time are offered for
        straggler relocation (unless ``relocate`` is False), and any copies read in.  ``quick``:
        skip it if nothing was appended, returned or rotated since the last one (Index.catch_up)."""
        sealed = self._index.catch_up(quick)
        if relocate and sum(self._relocator.offer(view) for view in sealed):
            self._refresh(relocate=False)  # map and read the copies (they may have rotated the tail)

    def _reap(self, force: bool = False) -> int:
        before = self._reaper.last
        n = self._reaper.reap(force)
        if self._reaper.last != before:  # a pass ran: offer sealed segments for relocation too
            if self._index.supersede_later:
                self._index.retry_supersedes()
            moved = 0
            for view in list(self._index.views.values()):
                if view.sealed:
                    moved += self._relocator.offer(view)
            if moved:  # read the copies in: what follows (a purge, a count) must see them
                self._refresh(relocate=False)
        return n

    def _settle(self, force: bool = True) -> None:
        """Catch up and reclaim expired and dead holders' leases, before a call that changes
        state: read-only calls already show such a lease as what reclaiming makes it (READY or
        DEAD), so a change must act on that state, not on the word still stored.  ``force``
        scans now; otherwise the reaper's own schedule decides (cheap: the hot ack path, which
        catches up only when a scan is due -- the job it settles is found, or caught up with, by
        ringq/leases.py's locate)."""
        if force or self._reaper.due():
            self._refresh()
            if self._reap(force):
                self._refresh()

    def _job_at(self, segseq: int, slot: int, word: int | None = None) -> Job:
        return snapshot.job_at(self._ring, self._index.views[segseq].seg, slot, word)

    # -- lease --------------------------------------------------------------------------------------

    def lease(self, count: int = 1, *, visibility_timeout: float | None = None, wait: float | None = None,
              detach: bool = False) -> list[Job]:
        """Lease up to ``count`` due jobs, highest priority first, then by available_at and FIFO.

        A leased job is invisible to every other process until acked, nacked, its holder dies, or
        ``visibility_timeout`` seconds pass.  Each job's ``lease_token`` is its fencing token.

        Args:
            count: most jobs to return (>= 1).
            visibility_timeout: seconds (default: the queue's).
            wait: if no job is due, block up to this many seconds for one (woken by producers'
                futex wake, not by polling), and return as soon as at least one is leased (with
                whatever else is due by then, up to ``count``).  None or 0 returns at once.
            detach: do not tie the leases to this process: they outlive it and end only by
                ack/nack or the visibility timeout (for a process that exits right after
                leasing, such as ``ringq lease``; otherwise its leases come back as soon as it exits).

        Returns:
            Between 0 and ``count`` jobs (LEASED).
        Raises:
            QueueClosedError; ValueError for bad arguments.
        """
        self._live()
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        if wait is not None and (not isinstance(wait, (int, float)) or wait != wait):
            # Checked before anything is leased: a NaN would fail in the sleep, after the lease.
            raise ValueError(f"wait must be a number of seconds or None, got {wait!r}")
        vt = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        if not 0 < vt < TIME_MAX / 1000:
            raise ValueError(f"visibility_timeout must be > 0 seconds, got {vt!r}")
        deadline = None if not wait else time.monotonic() + wait
        got: list[Job] = []
        ctl = self._ring.ctl
        claim = self._leases.claim
        pause = self._pause
        skip = lambda v, s: pause.blocks(v.seg, s)  # noqa: E731  (per-key pause)
        direct = None
        while True:
            seen = ctl.wake_word()
            with self._lock:
                self._live()
                self._refresh(quick=True)
                if self._reap():
                    self._refresh()  # the reclaimed jobs moved their segments' change counters
                direct = None
                if not pause.queue_paused():  # a paused queue leases nothing; resume wakes sleepers
                    # With no limit and no paused key, plain jobs are leased in one C call each.
                    direct = (None if self._gate.active() or pause.paused_keys()
                              else self._leases.direct(vt, detach))
                    floor_ms = time.time_ns() // 1_000_000 + int(vt * 1000)
                    if direct is not None:
                        direct.taken = 0
                    got.extend(self._index.take(count - len(got),
                                                lambda v, s, w, now: claim(v, s, w, now, vt, detach), self._gate,
                                                skip, direct))
                    if direct is not None and direct.taken:  # they expire no sooner than this
                        ctl.lower_deadline_floor(floor_ms)
                next_due = self._index.next_due_ms()
            if got or deadline is None:  # blocks only while nothing at all is leasable
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            nap = min(left, REAP_INTERVAL, self._reaper.until_floor())  # dead holders: seen within REAP_INTERVAL
            if next_due is not None:
                nap = min(nap, max(0.0, next_due / 1000 - time.time()) + 0.001)
            held_back = self._gate.nap()  # until a limit that holds a job back may let it go
            if held_back is not None:
                nap = min(nap, held_back)
            with self._asleep():
                if direct is None or self._index.heap:
                    ctl.sleep(seen, nap, self.spin)
                    leased = None
                else:  # nothing leasable known: wait, and lease a job appended meanwhile in C
                    leased = self._leases.wait_claim(seen, nap, self.spin, direct)
            if leased is not None:
                with self._lock:
                    self._live()
                    if self._gate.active() or pause.queue_paused() or pause.paused_keys():
                        # A limit or a pause appeared while we slept: the C call knew nothing of it.
                        self._leases.unclaim(leased)
                        continue
                    self._refresh(quick=True)  # reads the new record in
                    job = self._leases.waited(leased, direct)
                if job is not None:
                    got.append(job)  # the next pass adds what else is due, without waiting

    def wake_token(self) -> int:
        """The queue's wake counter: it moves whenever a job is appended or returns to READY.

        Read it *before* looking for work and pass it to :meth:`wait_for_wake`, so that a job
        appended in between is never slept through.  For callers that lease without blocking
        (an event loop) and wait for work in another thread.
        """
        self._live()
        return self._ring.ctl.wake_word()

    def wait_for_wake(self, token: int, timeout: float) -> None:
        """Block until the wake counter moves from ``token``, a delayed job seen by this process's
        last lease comes due, or ``timeout`` seconds pass (a futex wait, not polling).

        A delayed job that is already due does not cut the sleep short: the caller was woken for
        it once and may have chosen not to lease (no free capacity), and must not spin.  Takes no
        lock while sleeping, so other threads keep using the queue.  Spurious returns are
        allowed: callers look for work again and wait again.
        """
        self._live()
        nap = min(timeout, self._reaper.until_floor())
        with self._lock:
            next_due = self._index.next_due_ms()
            if next_due is not None and next_due / 1000 > time.time():
                nap = min(nap, next_due / 1000 - time.time() + 0.001)
        with self._asleep():
            self._ring.ctl.sleep(token, nap, self.spin)

    def wake(self) -> None:
        """Wake every thread and process sleeping in :meth:`lease` or :meth:`wait_for_wake` on this queue."""
        self._live()
        self._ring.ctl.wake()

    def lease_one(self, *, visibility_timeout: float | None = None, wait: float | None = None,
                  detach: bool = False) -> Job | None:
        """Lease one job, or return None if none is due (after waiting up to ``wait`` seconds)."""
        jobs = self.lease(1, visibility_timeout=visibility_timeout, wait=wait, detach=detach)
        return jobs[0] if jobs else None

    # -- ack / nack / extend ------------------------------------------------------------------------

    def ack(self, job: Job | str, *, result: Any = _NO_RESULT, result_ttl: float = DEFAULT_RESULT_TTL) -> None:
        """Mark a leased job done.  Acking it again (same token, or by bare id) is harmless.

        Passing the :class:`Job` checks its fencing token; passing a bare id does not (for
        operators).  With ``sync_acks=True`` the ack is durable when this returns.

        ``result`` (any payload ringq stores: JSON, bytes, a numpy array) is kept for
        ``result_ttl`` seconds (default 3600) in the companion queue ``<name>-results``, where
        :meth:`result` finds it.  It is stored after the lease is checked and before the ack, so a
        result is never lost to a crash after the ack; the first result stored for a job is kept.

        Raises NotLeasedError (not leased, or stale token), JobNotFoundError, SerializationError
        (a result that cannot be stored: the job is not acked).
        """
        self._live()
        if result is not _NO_RESULT:
            with self._lock:  # fencing first: a stale holder must not store a result
                view, slot, w, job_id, token = self._leases.word_for(job, self.name, "ack")
                repeated = state(w) == ST_DONE and (token is None or lease_count(w) == token)
                if not repeated:
                    transitions.require_lease(w, job_id, token, "ack")
            if not repeated:  # a repeated ack is harmless and stores nothing
                self._results.store(job_id, result, result_ttl)
        with self._lock:
            self._settle(force=False)
            self._leases.ack(job, self.name)
        self._ring.dur.sync_acks_now()

    def ack_many(self, jobs: Iterable[Job | str]) -> None:
        """Ack every job of ``jobs`` (as :meth:`ack`), with one sync for all of them under
        ``sync_acks=True``.  Every job that can be acked is; then the first refusal
        (NotLeasedError, JobNotFoundError) is raised."""
        self._live()
        first: Exception | None = None
        with self._lock:
            self._settle(force=False)
            for job in jobs:
                try:
                    self._leases.ack(job, self.name)
                except (NotLeasedError, JobNotFoundError) as exc:
                    first = first or exc
        self._ring.dur.sync_acks_now()
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
        if delay is not None and not 0 <= delay <= MAX_DELAY:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        with self._lock:
            self._settle(force=False)
            out = self._leases.nack(job, self.name, error, delay, self.backoff, self._rng)
        self._ring.dur.sync_acks_now()
        return out

    def extend(self, job: Job | str, seconds: float) -> Job:
        """Push a lease's deadline to ``max(deadline, now) + seconds``.  Raises NotLeasedError if lost."""
        self._live()
        if not 0 < seconds < TIME_MAX / 1000:
            raise ValueError(f"seconds must be > 0 (and finite), got {seconds!r}")
        with self._lock:
            self._settle(force=False)
            return self._leases.extend(job, self.name, seconds)

    def __repr__(self) -> str:
        return f"Queue({str(self.path)!r}, name={self.name!r}, durability={self.durability!r})"


def expiry_ms(expires_in: float | None, expires_at: float | None) -> int | None:
    """The absolute expiry (ms since the Unix epoch) of ``expires_in``/``expires_at``; ValueError
    for both, a negative or non-finite value."""
    if expires_in is not None and expires_at is not None:
        raise ValueError("give expires_in or expires_at, not both")
    if expires_in is not None:
        if not 0 <= expires_in < TIME_MAX / 1000:
            raise ValueError(f"expires_in must be a finite number of seconds from 0 to about 34 years, got {expires_in!r}")
        return int(time.time() * 1000 + expires_in * 1000)
    if expires_at is not None:
        if not 0 <= expires_at < 2**62 / 1000:
            raise ValueError(f"expires_at must be seconds since the Unix epoch, got {expires_at!r}")
        return int(expires_at * 1000)
    return None
