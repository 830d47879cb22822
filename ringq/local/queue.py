"""The public queue: enqueue, lease, ack, nack, and what they stand on.

Theory of operation
-------------------
Producers append records through the engine (ringq/engine/ring.py) under its flock.  Everything else is
lock-free: a job's mutable state is one 8-byte state word (ringq/engine/words.py) and every change is a CAS
on it that the job state machine allows (ringq/engine/transitions.py), so any number of processes lease,
ack and reclaim concurrently and a CAS that fails simply means another process got there first.

This class is the public API and the only coordinator of the modules below it: the reader's
index (ringq/engine/index.py), the reaper (ringq/engine/reaper.py), straggler relocation (ringq/engine/relocate.py),
job snapshots (ringq/engine/snapshot.py) and the engine (ringq/engine/ring.py).

Leases carry a fencing token (the job's lease count); ack/nack/extend CAS on a word that includes
it, so a stale holder is refused with NotLeasedError.  A lease also records its holder's owner index
(ringq/engine/owner.py); a lease whose owner process is gone is reclaimed at once by whoever notices,
otherwise when its visibility timeout passes.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import sys
import time
import warnings
from collections.abc import Callable, Generator, Iterable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, overload

from ringq import tracing
from ringq.backend import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RESULT_TTL,
    DEFAULT_VISIBILITY_TIMEOUT,
    FEATURE_COMPACT,
    FEATURE_LIMITS,
    FEATURE_SCHEDULES,
    NO_RESULT,
    CompactionResult,
    QueueStats,
    SearchPage,
    Stop,
    as_int,
    check_allow_failure,
    check_attempts,
    check_consume,
    check_depends_on,
    check_extension,
    check_job_ids,
    check_job_refs,
    check_lease_args,
    check_payloads,
    check_replace,
    check_reschedule,
    check_retry_delay,
    check_stopped_child,
    check_visibility_timeout,
    due_delay,
    expiry_ms,
    handle_stream,
    refuse_reserved,
    stream_leases,
    timeout_ms,
)
from ringq.backoff import BackoffPolicy
from ringq.engine import forksafe, meta, transitions
from ringq.engine.recovery import RecoveryReport
from ringq.engine.ring import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE, Ring
from ringq.engine.segment import check_geometry
from ringq.engine.words import lease_count
from ringq.errors import JobNotFoundError, LimitError, NotLeasedError
from ringq.job import Job, JobState
from ringq.results import Results

from .context import QueueContext, reader_types
from .options import QueueOptions
from .producer import check_args

if TYPE_CHECKING:  # pragma: no cover
    from .admin import Admin
    from .lifecycle import Lifecycle
    from .limits import LimitInfo, Limits
    from .schedule import Schedule, Schedules
    from .workflows import Workflows

__all__ = ["Queue", "QueueOptions", "GeometryWarning"]

FEATURES = frozenset({FEATURE_SCHEDULES, FEATURE_LIMITS, FEATURE_COMPACT})


class GeometryWarning(UserWarning):
    """Queue() was given a slot geometry other than the existing queue's; the queue keeps its own."""


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
        sync_acks: make every ack and nack durable before it returns (default False); leases and
            extends are not synced (losing one to a power loss only hands the job out again sooner).
        state_flush_interval: unsynced state changes reach the disk within this many seconds
            (default 1.0; off for ``"none"``; None turns it off).
        visibility_timeout: seconds a lease lasts before the job is handed out again (default 30).
        max_attempts: leases allowed per job before it moves to the dead-letter queue (default 5).
        backoff: retry delay policy for nack (default ``BackoffPolicy()``).
        lock_timeout: seconds to wait for the writer lock (LockTimeoutError after; default 10):
            a number >= 0, where 0 tries once without waiting and ``math.inf`` waits as long as
            it takes.
        slot_size: bytes per slot for a new queue (multiple of 64, default 256).
        slot_count: slots per segment for a new queue (default 16384; 4 MiB of slots).  Both are
            validated on every open (ValueError); on an existing queue a value other than the
            default that differs from the queue's own is ignored with a :class:`GeometryWarning`
            (the geometry is fixed at creation; ``q.options`` shows the one in use).
        mode: permission bits of files created (default 0o600; directories get matching x bits):
            an int from 0 to 0o777, so no setuid, setgid or sticky bit.
        allow_network_fs: allow NFS/SMB (refused by default: flock does not work across hosts).
        allow_foreign: open the queue even in a directory holding a nobroker queue (a log
            ``<name>.NNNNNN.log``) not yet imported there; refused by default, whatever ``name``,
            with ForeignQueueError, whose message says to run ``ringq import-nobroker DIR``
            (ringq/local/foreign.py check_not_foreign).
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
        options: the frozen :class:`~ringq.local.options.QueueOptions` the queue was opened with.

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

            check_not_foreign(
                path, name
            )  # before anything is created: never an empty queue beside old jobs
        if durability is None:
            durability = "msync" if fsync else "none"
        visibility_timeout = check_visibility_timeout(visibility_timeout)
        max_attempts = check_attempts(max_attempts)
        if not isinstance(spin, (int, float)) or isinstance(spin, bool) or not 0 <= spin <= 1:
            raise ValueError(f"spin must be a number of seconds from 0 to 1, got {spin!r}")
        self.spin = float(spin)
        # Checked on every open, not only at creation, so a bad argument never passes silently.
        for arg, value in (("slot_size", slot_size), ("slot_count", slot_count)):
            if as_int(value) is None:
                raise ValueError(f"{arg} must be an int, got {value!r}")
        slot_size, slot_count = int(slot_size), int(slot_count)
        check_geometry(slot_size, slot_count)
        self.path = pathlib.Path(
            path
        )  # the queue directory (nobroker: its log file; ringq has none)
        self.dir = self.path
        self.name = name
        self.visibility_timeout = float(visibility_timeout)
        self.max_attempts = max_attempts
        self.backoff = backoff or BackoffPolicy()
        ring = Ring(
            path,
            name,
            slot_size=slot_size,
            slot_count=slot_count,
            durability=durability,
            flush_interval=flush_interval,
            sync_acks=sync_acks,
            state_flush_interval=state_flush_interval,
            lock_timeout=lock_timeout,
            mode=mode,
            allow_network_fs=allow_network_fs,
        )
        ctl = ring.ctl
        for arg, given, default, stored in (
            ("slot_size", slot_size, DEFAULT_SLOT_SIZE, ctl.slot_size),
            ("slot_count", slot_count, DEFAULT_SLOT_COUNT, ctl.slot_count),
        ):
            if given not in (default, stored):  # asked for explicitly, yet the queue has another
                warnings.warn(
                    f"queue {name!r} in {path} was created with {arg}={stored}; {arg}={given} is "
                    "ignored (the geometry is fixed when a queue is created)",
                    GeometryWarning,
                    stacklevel=2,
                )
        self.durability = durability
        self.options = QueueOptions.of_queue(
            self,
            ring,
            flush_interval,
            sync_acks,
            lock_timeout,
            mode,
            allow_network_fs,
            allow_foreign,
            auto_ids,
            spin,
        )
        self._ctx = QueueContext(ring, name, str(self.path), mode, auto_ids)
        self._results = Results(name, self._companion, self.get)
        self._rng = random.Random()
        forksafe.register(self)
        # OpenTelemetry, if installed, is looked for now rather than by the first enqueue: an
        # exception a signal's handler raises inside an import can leave the interpreter's import
        # lock held, so the calls a program makes over and over import nothing.
        tracing.warm()

    # The parts behind the reads, the lifecycle calls, the limits and the periodic jobs are made
    # (and their modules imported) on first use: a queue used only to enqueue loads none of them.

    @cached_property
    def _admin(self) -> Admin:
        from .admin import Admin

        return Admin(self._ctx)

    @cached_property
    def _lifecycle(self) -> Lifecycle:
        from .lifecycle import Lifecycle

        return Lifecycle(self._ctx, self._results, self.get)

    @cached_property
    def _limits(self) -> Limits:
        from .limits import Limits

        return Limits(self._ctx)

    @cached_property
    def _workflows(self) -> Workflows:
        from .workflows import Workflows

        return Workflows(self._ctx)

    @cached_property
    def _schedules(self) -> Schedules:
        from .schedule import Schedules

        return Schedules(self)

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def recovery(self) -> RecoveryReport:
        """What opening and scanning found: quarantined files, damaged records, repairs."""
        return self._ctx.ring.report

    @property
    def closed(self) -> bool:
        return self._ctx.closed

    @property
    def features(self) -> frozenset[str]:
        """The optional features of ringq/backend.py this queue has: all of them."""
        return FEATURES

    @property
    def location(self) -> str:
        """The queue's directory."""
        return str(self.path)

    def preload(self) -> None:
        """Import what leasing from this queue needs (the reader's classes, numpy among them, and
        the periodic jobs' module) without building anything: a Worker's parent calls it before
        forking its child processes, which then share those modules instead of each importing
        them on its first lease."""
        reader_types()
        from . import schedule  # noqa: F401  (what the Worker asks about periodic jobs)

    def reopen_options(self) -> dict[str, Any]:
        """Keyword arguments that open this queue again with the same settings (``self.options``)."""
        return self.options.to_kwargs()

    def close(self) -> None:
        """Close the queue (idempotent).  Leases taken through it stay held by this process: ack,
        nack or extend them through any queue object (a new one of this process takes them over
        as its own); they end at their visibility timeout, or at once when the process dies."""
        with self._ctx.lock:
            if self._ctx.closed:
                return
            self._ctx.close()  # waits for the threads asleep in lease or wait_for_wake to leave
            self._results.close()
            if "_schedules" in self.__dict__:
                self._schedules.close()

    def drop_inherited_locks(self) -> None:
        """In a forked child (ringq/engine/forksafe.py): a parent thread may have been inside a call of
        this queue at the fork, holding its lock, which no thread of the child will ever release."""
        self._ctx.new_lock()

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
        # there: the exit hook of ringq/engine/durability.py already flushed, and the OS drops the
        # descriptors, mappings and flocks.  Otherwise close only if the queue lock is free.
        try:
            if self._ctx.closed or sys.is_finalizing():
                return
            if not self._ctx.lock.acquire(blocking=False):
                return
            try:
                self.close()
            finally:
                self._ctx.lock.release()
        except Exception:
            pass

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
        expires_in: float | None = None,
        expires_at: float | None = None,
        timeout: float | None = None,
        depends_on: Sequence[Job | str] | None = None,
        allow_failure: bool = False,
        debounce: float | None = None,
        replace: bool = False,
    ) -> Job:
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
            timeout: seconds one attempt of the job may run in a :class:`ringq.Worker` (or
                ``ringq.aio``) before it is stopped and nacked with ``"timeout after N s"``; it
                wins over the Worker's own ``timeout`` (docs/operations.md).  Stored in the record.

            depends_on: jobs (or ids) this one waits for: it is DEFERRED, never leased, until
                every one of them is DONE, then READY once, whichever process finishes the last
                (docs/workflows.md).  One that ends dead, cancelled or expired cancels it (its
                error names that parent), and its own dependents in turn, unless
                ``allow_failure``: then it becomes READY once every parent finished, whatever
                their outcome.  A parent already done counts as done; at most 100,000 parents.
            debounce: with ``job_id``: seconds.  While the job with that id is waiting (ready,
                delayed, deferred, or a retry after a nack: not leased) or dead-lettered, this
                enqueue *replaces* it -- this payload and these arguments, run at now +
                ``debounce`` -- so a burst of enqueues runs once, after the burst, with the last
                payload (docs/workflows.md has the table).  Once it was leased, this is a new
                run after it: it waits until the current run ends (acked, dead-lettered,
                cancelled, or nacked: it takes the retry's place), then runs.  A finished job is
                not changed: the new run follows it.  ``replace=True``: the same, run at now +
                ``delay``.

        With ``ringq[otel]`` installed and a span current, the W3C trace context is stored with
        the job too (``Job.trace_context``; docs/operations.md, "Traces").

        Returns:
            The job (``state`` READY, or DEFERRED: it waits for its parents, or for the run it
            replaces).
        Raises:
            SerializationError (nothing written), RecordTooLargeError, QueueFullError,
            LockTimeoutError, QueueClosedError, ValueError for out-of-range arguments,
            LimitError (a bad ``unique_for``, or ``unique_for`` without ``key``),
            DuplicateJobError (a unique window is open and its job already retired),
            JobNotFoundError (a parent is not retained: nothing written).
        """
        if (
            payload.__class__ is dict
            and priority.__class__ is int
            and priority == 0
            and delay.__class__ is float
            and delay == 0.0
            and max_attempts is None
            and job_id is None
            and key is None
            and unique_for is None
            and expires_in is None
            and expires_at is None
            and timeout is None
            and depends_on is None
            and debounce is None
            and replace is False
            and allow_failure is False
            and tracing.carrier() is None
        ):  # the common case: a dict payload, no argument; appended in one C call where it can
            job = self._ctx.producer.express(payload, self.max_attempts)
            if job is not None:
                return job
        if depends_on is not None or debounce is not None or replace or allow_failure:
            return self._enqueue_workflow(
                payload,
                priority,
                delay,
                max_attempts,
                job_id,
                key,
                unique_for,
                meta.of(expiry_ms(expires_in, expires_at), timeout_ms(timeout), tracing.carrier()),
                depends_on,
                allow_failure,
                debounce,
                replace,
            )
        if unique_for is None and job_id is None:  # the common case, without enqueue_many's lists
            if self._ctx.closed:
                self._ctx.live()
            trace = tracing.carrier()
            return self._ctx.producer.enqueue_one(
                payload,
                priority,
                delay,
                self.max_attempts if max_attempts is None else max_attempts,
                key,
                None
                if expires_in is None and expires_at is None and timeout is None and trace is None
                else meta.of(expiry_ms(expires_in, expires_at), timeout_ms(timeout), trace),
            )

        def add() -> Job:
            return self.enqueue_many(
                [payload],
                priority=priority,
                delay=delay,
                max_attempts=max_attempts,
                job_ids=None if job_id is None else [job_id],
                key=key,
                expires_in=expires_in,
                expires_at=expires_at,
                timeout=timeout,
            )[0]

        if unique_for is None:
            return add()
        if key is None:
            raise LimitError("unique_for needs a key: enqueue(..., key=..., unique_for=seconds)")
        self._ctx.live()
        return self._ctx.gate.enqueue_unique(key, unique_for, add, self.get)

    def _enqueue_workflow(
        self,
        payload: Any,
        priority: int,
        delay: float,
        max_attempts: int | None,
        job_id: str | None,
        key: str | None,
        unique_for: float | None,
        m: meta.Meta | None,
        depends_on: Sequence[Job | str] | None,
        allow_failure: bool,
        debounce: float | None,
        replace: bool,
    ) -> Job:
        """:meth:`enqueue` with parents, or replacing a waiting job (ringq/local/workflows.py)."""
        from .leases import check_origin

        parents = check_depends_on(depends_on, job_id)
        for parent in [depends_on] if isinstance(depends_on, Job) else depends_on or ():
            if isinstance(parent, Job):  # a parent is named by id: not another queue's job
                check_origin(self._ctx.ring, parent, self.name)
        check_allow_failure(allow_failure, parents)
        wait = check_replace(debounce, replace, job_id, delay, unique_for)
        attempts = self.max_attempts if max_attempts is None else max_attempts
        delay_ms = check_args(
            priority,
            due_delay(delay if wait is None else wait),
            attempts,
            None if job_id is None else [job_id],
            self.options.auto_ids,
        )
        self._ctx.live()
        if self._ctx.producer.reserved:
            refuse_reserved(self.name)

        def add() -> Job:
            return self._workflows.enqueue(
                payload,
                priority=priority,
                delay_ms=delay_ms,
                attempts=attempts,
                job_id=job_id,
                key=key,
                m=m,
                parents=parents,
                allow_failure=allow_failure,
                replacing=wait is not None,
            )

        if unique_for is None:
            return add()
        if key is None:
            raise LimitError("unique_for needs a key: enqueue(..., key=..., unique_for=seconds)")
        return self._ctx.gate.enqueue_unique(key, unique_for, add, self.get)

    def enqueue_many(
        self,
        payloads: Sequence[Any],
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_attempts: int | None = None,
        job_ids: Sequence[str] | None = None,
        key: str | None = None,
        expires_in: float | None = None,
        expires_at: float | None = None,
        timeout: float | None = None,
    ) -> list[Job]:
        """Add many jobs with one lock hold and one durability sync.  Same arguments as :meth:`enqueue`
        (``key`` applies to every job of the batch; ``unique_for`` is for single enqueues).

        ``payloads`` is a list, a tuple or another ordered iterable of payloads, and ``job_ids``
        (one per payload) too.  Every payload is encoded before anything is written: if one
        fails, none is stored.

        Raises:
            TypeError: ``payloads`` or ``job_ids`` is a str, bytes, a dict, a set or not iterable
            (a str or a dict is one payload: :meth:`enqueue` takes it); nothing is stored.  And
            what :meth:`enqueue` raises.
        """
        payloads = check_payloads(payloads)
        ids = check_job_ids(job_ids)
        self._ctx.live()
        attempts = self.max_attempts if max_attempts is None else max_attempts
        return self._ctx.producer.enqueue(
            payloads,
            priority,
            due_delay(delay),
            attempts,
            ids,
            key,
            meta.of(expiry_ms(expires_in, expires_at), timeout_ms(timeout), tracing.carrier()),
        )

    # -- catching up ----------------------------------------------------------------------------------

    # -- lease --------------------------------------------------------------------------------------

    def lease(
        self,
        count: int = 1,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        detach: bool = False,
    ) -> list[Job]:
        """Lease up to ``count`` due jobs, highest priority first, then by available_at and FIFO.

        A leased job is invisible to every other process until acked, nacked, its holder dies, or
        ``visibility_timeout`` seconds pass.  Each job's ``lease_token`` is its fencing token.

        Args:
            count: most jobs to return (>= 1).
            visibility_timeout: seconds (default: the queue's).
            wait: if no job is due, block up to this many seconds for one (woken by producers'
                futex wake, not by polling), and return as soon as at least one is leased (with
                whatever else is due by then, up to ``count``).  None, 0 or a negative number
                returns at once.
            detach: do not tie the leases to this process: they outlive it and end only by
                ack/nack or the visibility timeout (for a process that exits right after
                leasing, such as ``ringq lease``; otherwise its leases come back as soon as it exits).

        Returns:
            Between 0 and ``count`` jobs (LEASED).
        Raises:
            QueueClosedError; ValueError for bad arguments.
        """
        ctx = self._ctx
        if ctx.closed:
            ctx.live()
        # Checked before anything is leased: a NaN wait would fail in the sleep, after the lease.
        if (
            count.__class__ is int
            and count >= 1
            and visibility_timeout is None
            and (detach is False or detach is True)
            and (
                wait is None
                or (wait.__class__ is int and wait < 1 << 53)  # exact as a float
                or (wait.__class__ is float and wait == wait)  # not NaN
            )
        ):
            vt = self.visibility_timeout  # checked when the queue was opened; exact types only
        else:
            count, wait, vt = check_lease_args(
                count,
                wait,
                self.visibility_timeout if visibility_timeout is None else visibility_timeout,
                detach,
            )
        deadline = None if not wait else time.monotonic() + wait
        got: list[Job] = []
        ctl = ctx.ring.ctl
        pause = ctx.pause
        reaper = ctx.reaper
        quiet = ctx.quiet
        direct = None
        seen = 0
        counted = False
        job = leased = None  # a lease the wait took in C, and the job made of it, not yet in got
        try:
            while True:
                with ctx.lock:  # ctx.live_lock, spelt out on the hot path
                    if ctx.closed:
                        ctx.live()
                    if deadline is not None:
                        # Read before looking for work: nothing appended after it is slept through.
                        seen = ctl.wake_word()
                    # Nothing appended, returned, rotated, paused or limited since a look that found
                    # nothing paused and no limit: that look's answers stand (ringq/local/quiet.py).
                    t = time.monotonic()
                    clear = quiet.quiet(t)
                    if not clear:
                        quiet.begin()
                        ctx.refresh(quick=True)
                    if t >= reaper.quiet_until and reaper.due() and ctx.reap():
                        ctx.refresh()  # the reclaimed jobs moved their segments' change counters
                    direct = None
                    queue_paused = keys_paused = False
                    if not clear:
                        queue_paused, keys_paused = pause.paused()
                        if not queue_paused and not keys_paused and not ctx.gate.active():
                            quiet.clear()
                            clear = True
                    # No limit and no paused key: plain jobs are leased in one C call each.
                    if clear:
                        direct = ctx.leases.direct(vt, detach)
                        if count == 1 and not ctx.gate.holding():
                            top = ctx.index.take_top(direct)
                            if top:
                                # In ``got`` before the lock's exit, a call: an exception raised
                                # there gives the job back.
                                got += top
                                return got
                        got += ctx.index.take(
                            count - len(got), direct.claim, ctx.gate, None, direct
                        )
                    elif not queue_paused:  # a paused queue leases nothing; resume wakes sleepers
                        got += ctx.index.take(
                            count - len(got),
                            self._claimer(vt, detach),
                            ctx.gate,
                            (lambda v, s: pause.blocks(v.seg, s)) if keys_paused else None,
                        )
                    if got or deadline is None:  # blocks only while nothing at all is leasable
                        return got
                    next_due = ctx.index.next_due_ms()
                    # Under the lock: the control page it reads is unmapped by a close.
                    floor_nap = reaper.until_floor()
                left = deadline - time.monotonic()
                if left <= 0:
                    return got
                # Dead holders: seen within the reaper's interval.
                nap = min(left, reaper.interval, floor_nap)
                if next_due is not None:
                    nap = min(nap, max(0.0, next_due / 1000 - time.time()) + 0.001)
                held_back = ctx.gate.nap()  # until a limit that holds a job back may let it go
                if held_back is not None:
                    nap = min(nap, held_back)
                outside = ctx.outside
                with ctx.lock:
                    if ctx.closed:
                        ctx.live()
                    # No call between the count and its note: an exception (a signal's
                    # handler) comes before both or after both, and the handler counts out.
                    outside.enter_held()
                    counted = True  # in ctx.users, until counted out once whatever happens
                if direct is None or ctx.index.heap:
                    ctl.sleep(seen, nap, self.spin)
                else:  # nothing leasable known: wait, and lease a job appended meanwhile in C
                    leased = ctx.leases.wait_claim(seen, nap, self.spin, direct)
                    if leased is not None:
                        # Counted out under the hold of the lock that hands the lease out or
                        # gives it back: a close that came meanwhile waits for that, so the
                        # mappings are there; and nothing runs between the lease's extension
                        # and its return.
                        with ctx.lock:
                            outside.leave_held()
                            counted = False
                            if ctx.closed or (
                                not quiet.quiet(time.monotonic(), True)
                                and (ctx.gate.active() or any(pause.paused()))
                            ):
                                # Closed (the next pass raises), or a limit or a pause appeared
                                # while we slept: the C call knew nothing of it.  Forgotten
                                # first: an exception after this unclaim must not run another,
                                # which could take back the job from a thread that leased it
                                # since (every thread of the process tags a lease alike).
                                given, leased = leased, None
                                ctx.leases.unclaim(given, direct)
                            else:
                                job = ctx.leases.waited(leased, direct)
                                leased = None
                if counted:
                    with ctx.lock:
                        outside.leave_held()
                        counted = False
                if job is not None:
                    got.append(job)
                    job = None
                if len(got) >= count:  # else the next pass adds what else is due, not waiting
                    return got
        except BaseException:
            # A signal's handler (KeyboardInterrupt) raised after jobs were leased: nobody will
            # see them, so they go back unleased, no attempt counted.  No ``finally`` in the
            # loop: an exception raised in one would lose the jobs being returned.
            self._unreturned(leased, job, got, counted, direct)
            raise

    def _unreturned(
        self, leased: Any, job: Job | None, got: list[Job], counted: bool, direct: Any
    ) -> None:
        """As an exception leaves :meth:`lease`: give back what it leased and will not return --
        the lease its wait took in C (``leased``, not yet a ``job``), ``job`` made of it, and the
        jobs of ``got`` -- unless the queue object closed and its mappings went (the leases then
        end with this process).  ``counted``: the thread is still among the mappings' users
        (counted out here)."""
        ctx = self._ctx
        with ctx.lock:
            try:
                if ctx.closed and not counted:
                    return  # unmapped
                if leased is not None and job is None:
                    ctx.leases.unclaim(leased, direct)
                back = got if job is None else [*got, job]
                if back and not ctx.closed:
                    ctx.leases.give_back(back)
            finally:
                if counted:
                    ctx.outside.leave_held()

    def _claimer(self, vt: float, detach: bool) -> Callable[[Any, int, int, int], Job | None]:
        """Index.take's ``claim`` for the general path: a lease of ``vt`` seconds (``detach``)."""
        claim = self._ctx.leases.claim
        return lambda v, s, w, now: claim(v, s, w, now, vt, detach)

    def wake_token(self) -> int:
        """The queue's wake counter: it moves whenever a job is appended or returns to READY.

        Read it *before* looking for work and pass it to :meth:`wait_for_wake`, so that a job
        appended in between is never slept through.  For callers that lease without blocking
        (an event loop) and wait for work in another thread.
        """
        with self._ctx.live_lock:
            return self._ctx.ring.ctl.wake_word()

    def wait_for_wake(self, token: int, timeout: float) -> None:
        """Block until the wake counter moves from ``token``, a delayed job seen by this process's
        last lease comes due, or ``timeout`` seconds pass (a futex wait, not polling).

        A delayed job that is already due does not cut the sleep short: the caller was woken for
        it once and may have chosen not to lease (no free capacity), and must not spin.  Takes no
        lock while sleeping, so other threads keep using the queue.  Spurious returns are
        allowed: callers look for work again and wait again.
        """
        with self._ctx.live_lock:
            nap = min(timeout, self._ctx.reaper.until_floor())  # the control page: under the lock
            next_due = self._ctx.index.next_due_ms()
            if next_due is not None and next_due / 1000 > time.time():
                nap = min(nap, next_due / 1000 - time.time() + 0.001)
        ctx = self._ctx
        counted = False
        try:
            with ctx.lock:
                if ctx.closed:
                    ctx.live()
                ctx.outside.enter_held()
                counted = True  # no call since the count: see lease
            ctx.ring.ctl.sleep(token, nap, self.spin)
        finally:
            if counted:
                with ctx.lock:
                    ctx.outside.leave_held()

    def wake(self) -> None:
        """Wake every thread and process sleeping in :meth:`lease` or :meth:`wait_for_wake` on this queue."""
        with self._ctx.live_lock:
            self._ctx.ring.ctl.wake()

    def lease_one(
        self,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        detach: bool = False,
    ) -> Job | None:
        """Lease one job, or return None if none is due (after waiting up to ``wait`` seconds)."""
        jobs = self.lease(1, visibility_timeout=visibility_timeout, wait=wait, detach=detach)
        return jobs[0] if jobs else None

    @overload
    def consume(
        self,
        handler: None = None,
        *,
        count: int | None = None,
        wait: float | None = None,
        stop: Stop | None = None,
        visibility_timeout: float | None = None,
    ) -> Generator[Job, None, None]: ...

    @overload
    def consume(
        self,
        handler: Callable[[Job], Any],
        *,
        count: int | None = None,
        wait: float | None = None,
        stop: Stop | None = None,
        visibility_timeout: float | None = None,
    ) -> int: ...

    def consume(
        self,
        handler: Callable[[Job], Any] | None = None,
        *,
        count: int | None = None,
        wait: float | None = None,
        stop: Stop | None = None,
        visibility_timeout: float | None = None,
    ) -> Generator[Job, None, None] | int:
        """Stream leases: an iterator of leased jobs (``handler`` None; the caller acks or nacks
        each), or a loop that runs ``handler(job)`` on each, acks it when the handler returns and
        nacks it (``"<ExceptionType>: <message>"`` as its error) when it raises.

        The stream leases jobs in batches, one C call per run of plain jobs, sized to how long
        the consumer takes per job (at most 256, about 2 ms of handling, so that other consumers
        get their share), and hands them out one at a time.  A job it leased but did not hand out
        -- the stream stopped, the iterator was closed, or a quarter of the visibility timeout
        passed since its batch was leased -- goes back to READY unused: its attempt is not
        counted, and it keeps its place in the order.

        Args:
            handler: None for an iterator; a callable for the callback loop.
            count: end after this many jobs (None: no limit).
            wait: when no job is due, block up to this many seconds for one (woken by the
                producer's futex wake); the stream ends when that wait finds nothing.  None, 0 or
                a negative number: end as soon as no job is due.
            stop: a ``threading.Event`` (or a callable returning True) checked before each job:
                the stream ends when it is set.
            visibility_timeout: seconds each lease lasts (default: the queue's).

        Returns:
            The iterator; or, with ``handler``, how many jobs the handler returned from.  An
            exception that is not an ``Exception`` (KeyboardInterrupt, SystemExit) is raised
            after its job is nacked.
        Raises:
            ValueError for bad arguments; QueueClosedError.
        """
        stopped = check_consume(count, wait, stop)
        vt = check_visibility_timeout(
            self.visibility_timeout if visibility_timeout is None else visibility_timeout
        )
        self._ctx.live()

        def lease(n: int) -> list[Job]:
            return self.lease(n, visibility_timeout=vt, wait=wait)

        jobs = stream_leases(lease, count, stopped, vt, self._give_back)
        if handler is None:
            return jobs
        return handle_stream(self, jobs, handler)

    def _give_back(self, jobs: list[Job]) -> None:
        """Return leases the stream took but never handed out (Leases.give_back)."""
        if self._ctx.closed:
            return  # a closed queue's leases end with their holder
        with self._ctx.live_lock:
            self._ctx.leases.give_back(jobs)

    # -- ack / nack / extend ------------------------------------------------------------------------

    def ack(
        self, job: Job | str, *, result: Any = NO_RESULT, result_ttl: float = DEFAULT_RESULT_TTL
    ) -> None:
        """Mark a leased job done.  Acking it again (same token, or by bare id) is harmless.

        Passing the :class:`Job` checks its fencing token; passing a bare id does not (for
        operators).  With ``sync_acks=True`` the ack is durable when this returns.

        ``result`` (any payload ringq stores: JSON, bytes, a numpy array) is kept for
        ``result_ttl`` seconds (default 3600; above 0 and below 30 years, so not ``math.inf``) in
        the companion queue ``<name>-results``, where :meth:`result` finds it.  It is stored under
        the lease after the lease is checked and before the ack, so a result is never lost to a
        crash after the ack, and the job's result is that of the lease whose ack went in: a holder
        whose lease runs out while it stores a result is refused at the ack, and its result is
        never returned.

        Raises NotLeasedError (not leased, or stale token), JobNotFoundError, SerializationError
        (a result that cannot be stored: the job is not acked), ValueError (a ``result_ttl`` out
        of range: nothing stored, the job not acked).
        """
        if result is not NO_RESULT:
            self._ack_with_result(job, result, result_ttl)
            return
        ctx = self._ctx
        with ctx.lock:  # ctx.live_lock, spelt out on the hot path
            if ctx.closed:
                ctx.live()
            ctx.leases.ack(job, self.name)  # reclaiming first where it must (its docstring)
        dur = ctx.ring.dur
        if dur.sync_acks:
            dur.sync_acks_now()

    def _ack_with_result(self, job: Job | str, result: Any, result_ttl: float) -> None:
        """:meth:`ack` with a result: the lease checked, its result stored under it, the ack, and
        then the record that names the lease whose ack went in (ringq/results.py)."""
        from .leases import Retired

        ctx = self._ctx
        ctx.live()
        with ctx.live_lock:  # fencing first: a stale holder must not store a result
            try:
                view, slot, w, job_id, token = ctx.leases.word_for(job, self.name, "ack")
            except Retired:  # this snapshot was acked before its segment retired
                repeated = True
            else:
                repeated = transitions.acked_by(w, token)
                if not repeated:
                    transitions.require_lease(w, job_id, token, "ack")
        if repeated:  # a repeated ack is harmless and stores nothing
            self.ack(job)
            return

        def ack() -> bool:
            with ctx.live_lock:
                went_in = ctx.leases.ack(job, self.name) is not None
            if ctx.ring.dur.sync_acks:
                ctx.ring.dur.sync_acks_now()
            return went_in

        lease = (view.seq.item(slot), lease_count(w))
        self._results.ack(job_id, lease, token is None, result, result_ttl, ack)

    def ack_many(self, jobs: Iterable[Job | str]) -> None:
        """Ack every job of ``jobs`` (as :meth:`ack`), with one sync for all of them under
        ``sync_acks=True``.  Every job that can be acked is; then the first refusal
        (NotLeasedError, JobNotFoundError) is raised.  An item that is neither a Job nor a job
        id raises TypeError before any job is acked, and so does a str or bytes given for
        ``jobs`` (one id, not a list of them)."""
        self._ctx.live()
        jobs = check_job_refs(jobs)
        first: Exception | None = None
        with self._ctx.live_lock:
            for job in jobs:  # each reclaims first where it must (Leases.ack)
                try:
                    self._ctx.leases.ack(job, self.name)
                except (NotLeasedError, JobNotFoundError) as exc:
                    first = first or exc
        self._ctx.ring.dur.sync_acks_now()
        if first is not None:
            raise first

    def nack(self, job: Job | str, *, error: str | None = None, delay: float | None = None) -> Job:
        """Report a leased job as failed: retry after a backoff delay, or dead-letter it.

        Args:
            job: the leased job (token checked) or its id.
            error: text kept as the job's ``last_error`` (any other object is kept as ``str(error)``:
                an exception as its message).
            delay: seconds before the retry, instead of the backoff policy's.

        Returns:
            The job in its new state (READY, or DEAD if it used up ``max_attempts``).  A run
            queued behind this one (``debounce``/``replace`` of a leased job) takes the retry's
            place: that run is returned (docs/workflows.md).
        Raises:
            NotLeasedError, JobNotFoundError, ValueError (negative delay).
        """
        self._ctx.live()
        delay = check_retry_delay(delay)
        with self._ctx.live_lock:
            self._ctx.settle(force=False)
            out = self._ctx.leases.nack(job, self.name, error, delay, self.backoff, self._rng)
        self._ctx.ring.dur.sync_acks_now()
        if out.state is JobState.READY and self._ctx.ring.ctl.deps_count():
            # A run queued behind this one (a debounce or replace of a leased job) takes the
            # retry's place: the job is that run now, as get() shows it.
            newest = self._admin.get(out.id)
            if newest.seq != out.seq:
                return newest
        return out

    def reschedule(
        self, job: Job | str, *, priority: int | None = None, delay: float | None = None
    ) -> Job:
        """Change a waiting job (ready, delayed or deferred): its priority, its run time (now +
        ``delay`` seconds), or both.  The job keeps its id, payload, attempts, last error and
        enqueue time; a new priority alone keeps its FIFO place (by enqueue time), a new delay
        places it by its new run time; a deferred one still waits for its parents (and runs at
        its new time once released) (docs/workflows.md).

        Returns:
            The job after the change.
        Raises:
            JobNotWaitingError: it is leased, or finished.  JobNotFoundError (also for another
            queue's snapshot).  ValueError for a bad priority or a bad or negative delay, or
            neither given.
        """
        prio, wait = check_reschedule(priority, delay)
        self._ctx.live()
        return self._workflows.reschedule(job, prio, wait)

    def dependents(self, job: Job | str) -> list[str]:
        """Ids of the retained jobs enqueued with ``depends_on`` naming ``job`` (the job or its
        id), in enqueue order (``ringq get`` shows them); ``[]`` for a job that has none or is
        not retained.  Raises QueueClosedError."""
        self._ctx.live()
        return self._workflows.dependents(job)

    def extend(self, job: Job | str, seconds: float) -> Job:
        """Push a lease's deadline to ``max(deadline, now) + seconds``.  Raises NotLeasedError if lost."""
        self._ctx.live()
        seconds = check_extension(seconds)
        with self._ctx.live_lock:
            self._ctx.settle(force=False)
            return self._ctx.leases.extend(job, self.name, seconds)

    def kill_and_give_back(self, pid: int) -> int:
        """Kill the stopped child process ``pid`` (SIGKILL) and return every job it held leased
        to READY, uncharged: a lease of count ``n`` becomes READY with count ``n - 1`` (its
        attempt is not counted), due at once (a first lease at its own available-at, so it keeps
        its place).  For a parent killing a child that leased jobs it never started (a consumer's
        batch): ``Worker(processes=N)`` calls it for a child past its timeout or its drain's grace
        period, after nacking the jobs the child ran.  A lease asked to cancel, and a detached
        lease, are left alone.

        The leases go back while the child is frozen, and it is killed before this returns: a
        given-back lease's next holder gets the same fencing token, which the child must never
        use again.  Frozen, the child still holds its owner lock, so no reaper reclaims (and
        charges) its leases meanwhile.  A lease is taken as the child's only if its owner word
        carries ``pid`` and an owner index the child holds locked (the kernel's list of its
        locks): the pid alone is a tag that a process of another PID namespace sharing the queue
        may carry too.

        Returns:
            How many leases went back.
        Raises:
            ValueError for a pid that is not a process id, or names a process that is not a
            stopped child of this one (nothing is given back, nothing killed); QueueClosedError.
        """
        self._ctx.live()
        pid = check_stopped_child(pid)
        try:
            with self._ctx.live_lock:
                self._ctx.refresh()  # segments and records appended since this process looked
                return self._ctx.leases.give_back_leases_of(pid)
        finally:
            os.kill(pid, signal.SIGKILL)

    # -- reads and whole-queue operations, lifecycle, limits, periodic jobs -------------------------

    def sync_counters(self) -> dict[str, int]:
        """Durability counters (for tests and tools): this process's ``append_syncs``, ``covered``
        (appends another producer's sync covered), ``state_syncs``, ``pending`` and ``flusher``
        (1 while its flusher runs), and ``queue_append_syncs`` by every process since creation."""
        return self._admin.sync_counters()

    def introspect(self) -> dict[str, Any]:
        """Read-only engine words (for tests and tools): ``tail_segment``, ``next_seq``,
        ``slot_size``, ``slot_count``, ``lock_waiters``, ``synced_position``, ``segments`` (seq ->
        tail, records, sealed, retired), ``known_ids`` (ids this process's index remembers) and
        ``claiming`` (threads of this queue object waiting in the C call that may lease a job
        before the queue records it)."""
        return self._admin.introspect()

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
        return self._admin.import_jobs(jobs, source=source)

    def get(self, job_id: str) -> Job:
        """The job with this id (a snapshot).  Raises JobNotFoundError if it is not retained."""
        return self._admin.get(job_id)

    def list_jobs(
        self, state: JobState | str | None = None, *, limit: int | None = None
    ) -> list[Job]:
        """Retained jobs in enqueue order, optionally only those in ``state``, at most ``limit``.

        ``state`` is a :class:`JobState` (or its value) or ``"delayed"``: READY jobs not yet due
        (``"ready"`` includes them, as in nobroker).  ``limit=None`` means all.  A lease that
        expired is listed as what reclaiming it makes it, as :meth:`stats` counts it.  Raises
        ValueError for an unknown state or a negative limit.
        """
        return self._admin.list_jobs(state, limit=limit)

    def search(
        self,
        *,
        state: str | None = None,
        key: str | None = None,
        priority: int | None = None,
        job_id: str | None = None,
        error: str | None = None,
        after: str | None = None,
        limit: int | None = 50,
    ) -> SearchPage:
        """Find jobs: those matching every filter given, in enqueue order (as :meth:`list_jobs`),
        ``limit`` per page (None: all).

        Args:
            state: ``ready`` (delayed jobs included), ``delayed``, ``leased``, ``done``, ``dead``,
                ``cancelled`` or ``expired``.
            key: the job's key, exactly.  priority: exactly.  job_id: exactly.
            error: a substring of the job's ``last_error`` (ASCII letters compared without
                regard to case).
            after: the ``next`` cursor of the page before.

        Returns:
            A :class:`ringq.backend.SearchPage`: the page's jobs, the number of matches in the
            whole queue, and the cursor of the next page.  Costs a pass over the state tables and
            record headers (no payload decoded) and one read of each error side file when
            ``error`` is given: docs/benchmarks.md ("Search") has the figures.
        Raises:
            ValueError: an unknown state, a bad cursor or limit.
        """
        from ringq.engine.search import Query  # numpy: loaded by the first search, not at import

        return self._admin.search(Query(state, key, priority, job_id, error), after, limit)

    def dlq(self, *, limit: int | None = None) -> list[Job]:
        """Dead-lettered jobs, oldest first."""
        return self._admin.dlq(limit=limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """Move dead-lettered jobs (one, or all) back to READY with attempts reset; returns how many.

        The job keeps its id; it is re-appended as a new record that supersedes the dead one.
        Raises JobNotFoundError, or NotLeasedError if ``job_id`` is not dead.
        """
        return self._admin.requeue_dead(job_id)

    def discard_dead(self, job_id: str) -> None:
        """Remove one job of the dead-letter queue for good (DEAD -> GONE, as :meth:`purge` does
        to every job).  Raises JobNotFoundError, or NotLeasedError if the job is not dead."""
        return self._admin.discard_dead(job_id)

    def purge(self) -> int:
        """Remove every retained job (ready, delayed, leased, done, dead); returns how many: every
        job :meth:`stats` would have counted in ``total`` just before.

        Runs under the writer lock, after catching up, so no record (a job enqueued, a straggler's
        relocated copy) is published between what it reads and what it removes.  Nothing is
        reclaimed, relocated or retired first: a purge removes jobs in whatever state they are."""
        return self._admin.purge()

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
        return self._admin.compact()

    def stats(self) -> QueueStats:
        """Counts by state, each segment's from one copy of its state table, plus the cumulative
        counters.  Read-only: a lease that has expired or whose holder died is counted as what
        reclaiming it will make it (ready, or dead if its attempts are used up), though nothing is
        written until some process leases.  Raises QueueClosedError."""
        return self._admin.stats()

    def cancel(self, job: Job | str) -> Job:
        """Cancel a job.  A READY (pending or delayed) job becomes CANCELLED: terminal, never
        leased.  A LEASED job is marked cancel-requested: its holder sees ``cancel_requested``
        on its next :meth:`extend` (a Worker's heartbeat sets ``job.cancelled``), and its ack, nack
        or lost lease ends it CANCELLED instead of DONE or a retry.  Cancelling again is harmless.

        Returns:
            The job's snapshot after the cancel (CANCELLED, or LEASED with ``cancel_requested``).
        Raises:
            JobFinishedError (done, expired or dead-lettered), JobNotFoundError, QueueClosedError.
        """
        return self._lifecycle.cancel(job)

    def pause(self, key: str | None = None) -> None:
        """Stop leases of the whole queue (``key=None``) or of the jobs of one key, in every
        process at once and across restarts, until :meth:`resume`.  Enqueues still succeed.
        Raises ValueError for a key longer than 56 bytes or when 63 keys are paused already."""
        return self._lifecycle.pause(key)

    def resume(self, key: str | None = None) -> None:
        """Undo :meth:`pause` (of the queue, or of one key) and wake every sleeping lease."""
        return self._lifecycle.resume(key)

    def paused(self) -> dict[str, Any]:
        """``{"queue": bool, "keys": sorted list of paused keys}``."""
        return self._lifecycle.paused()

    def progress(self, job: Job | str, fraction: float, message: str | None = None) -> None:
        """Report a leased job's progress: ``fraction`` a number from 0 to 1 and an optional
        message (a str), shown as ``Job.progress``/``progress_message`` by :meth:`get` and
        :meth:`list_jobs` for the rest of this lease.  Fenced like :meth:`ack`: a stale holder is
        refused with NotLeasedError.  Raises ValueError for a fraction that is not a number from 0
        to 1 (NaN, a bool, a str such as ``"0.5"``), TypeError for a message that is neither a str
        nor None (both before anything is written), JobNotFoundError."""
        return self._lifecycle.progress(job, fraction, message)

    def trace_first_attempt(self, job: Job | str, traceparent: str) -> None:
        """Keep ``traceparent`` (a W3C traceparent) as the span of ``job``'s first attempt, for the
        link a retry's span makes to it (ringq/tracing.py; a Worker calls this when a first
        attempt fails in its handler).  Best effort; raises JobNotFoundError."""
        return self._lifecycle.trace_first_attempt(job, traceparent)

    def first_attempt_trace(self, job: Job | str) -> str | None:
        """The traceparent kept by :meth:`trace_first_attempt` for ``job``, or None.  Raises
        JobNotFoundError."""
        return self._lifecycle.first_attempt_trace(job)

    def result(self, job_id: str | Job, *, wait: float | None = None) -> Any:
        """The result stored by ``ack(job, result=...)`` for ``job_id``.

        Args:
            job_id: the job (or its id).
            wait: seconds to block until the result is stored (woken by the storing process's
                futex wake, not by polling); None, 0 or a negative number returns at once, as
                :meth:`lease` takes it.

        Raises:
            ResultNotFoundError (a JobNotFoundError): none stored within ``wait``, its ``result_ttl``
            passed, or the job finished without one (dead-lettered, cancelled, expired, or acked
            without a result: then it is raised at once).  ValueError: ``wait`` is not None or a
            number of seconds (NaN, a bool, a str), as for :meth:`lease`.  QueueClosedError.
        """
        return self._lifecycle.result(job_id, wait=wait)

    def limit(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
        burst: int | None = None,
    ) -> None:
        """Set the limit of key ``name`` (or of every job of this queue, when ``name`` is the
        queue's name), for every process on the host at once; it persists in ``<name>.limits``.

        Args:
            name: a job key (``enqueue(..., key=name)``) or this queue's name.
            concurrency: most leases of such jobs held at once (1..4096).  A holder's slot is
                freed by its ack or nack, or at once when its process dies.
            rate: ``(count, per)``: ``count`` leases per ``per`` seconds, spaced evenly (a token
                bucket, exact across processes): in any span of ``t`` seconds at most
                ``burst + t * count / per`` leases.  A 2-tuple: an int count (not a bool) in
                1..2**32-1 and a finite number of seconds > 0.
            burst: tokens the bucket holds when full: how many leases may start at once after
                an idle spell (default: the tokens of 50 ms, at least 2, so that a consumer
                woken a few ms late does not lose its token).
            Neither ``concurrency`` nor ``rate``: remove the limit.
        Raises:
            LimitError: bad values, or all 64 limits of the queue in use.  LimitsFileError: the
            limits file is damaged.  QueueClosedError.
        """
        return self._limits.limit(name, concurrency=concurrency, rate=rate, burst=burst)

    def limits(self) -> list[LimitInfo]:
        """Every limit of this queue with its live use (``running`` leases, next token)."""
        return self._limits.limits()

    def schedule(
        self,
        name: str,
        payload: Any,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        priority: int = 0,
        max_attempts: int | None = None,
    ) -> Schedule:
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
            The :class:`Schedule` (``next_fire``: seconds since the Unix epoch).
        Raises:
            ValueError for a bad name, cron expression, time zone (not a str naming a known
            IANA zone), interval or priority;
            SerializationError for the payload; ScheduleFileError for a damaged schedule file.
        """
        return self._schedules.schedule(
            name,
            payload,
            cron=cron,
            every=every,
            tz=tz,
            priority=priority,
            max_attempts=max_attempts,
        )

    def schedules(self) -> list[Schedule]:
        """The periodic jobs of this queue (:class:`Schedule`), oldest first."""
        return self._schedules.schedules()

    def unschedule(self, name: str) -> None:
        """Delete the periodic job ``name`` (jobs it already enqueued stay).

        Raises:
            ScheduleNotFoundError (a KeyError) if there is none.
        """
        return self._schedules.unschedule(name)

    def run_schedules(self) -> list[Job]:
        """Enqueue the job of every periodic job whose tick is due; returns those enqueued.

        ``Worker`` calls this itself; scripts without a worker call it now and then (at the latest
        by :meth:`next_schedule_fire`).  Safe to call from any number of processes at once.
        """
        return self._schedules.run_schedules()

    def next_schedule_fire(self) -> float | None:
        """Seconds until the earliest tick of any periodic job (<= 0: due now), or None if there
        are none.  Cheap: one read of shared memory."""
        return self._schedules.next_schedule_fire()

    def __len__(self) -> int:
        """Number of retained jobs (``stats().total``)."""
        return self.stats().total

    def __repr__(self) -> str:
        return f"Queue({str(self.path)!r}, name={self.name!r}, durability={self.durability!r})"
