"""ringq.aio: an asyncio task queue with errand's API, on ringq's engine.

    from ringq.aio import Job, Queue, Status

    queue = Queue("./jobs")

    @queue.handler("double", concurrency=4)
    async def double(job: Job) -> int:
        return job.payload["x"] * 2

    async with queue:                       # reruns what a previous process left unfinished
        job_id = queue.submit("double", {"x": 21})
        await asyncio.sleep(0)
        queue.get(job_id).result            # 42, stored durably

Theory of operation
-------------------
Storage is two kinds of ordinary ringq queues in the directory (``ringq stats/list`` see them):

* one *job queue* per kind, ``<name>-j-<kind>`` (``<name>-jh-<hash>`` for a kind that is not
  ``[A-Za-z0-9_]{1,40}``), whose records are ``{"kind": kind, "payload": payload}``.  A queue
  per kind lets a process lease only the kinds it has a handler and free capacity for, so a
  concurrency limit never makes it hold other processes' work, and the engine's FIFO order is the
  "rest wait in submission order" of the limit;
* one *results queue* ``<name>-r`` whose records are the finished jobs (status, result or
  error, times), appended with ``job_id=<job id>`` so that a job can finish only once;
* nothing else: a job is unfinished while its job record is READY or LEASED, finished once its
  result record exists, and pruned (by retention) once the result record is DONE.

Running a job: lease it (a CAS: one process at a time) -> if a result already exists (a crash
came between writing it and the ack), just ack -> run the handler -> check the lease is still ours
-> append the result (durable) -> ack.  A failure with retries left is a ``nack`` with the
handler's backoff delay instead.  A heartbeat extends the leases of running handlers; a process
that dies loses its leases at once (the engine's owner locks) and one that is stuck loses them
after the visibility timeout, and either way another process reruns the job.

The event loop is never blocked by a wait.  Leasing is a non-blocking ``Queue.lease`` on the
loop's thread (microseconds), so capacity is counted in one place and ``submit`` can start its job
at once.  Waiting for work happens in one thread per served kind, sleeping in the engine's futex
wait (``Queue.wait_for_wake``) and asking the loop to lease when woken.  Appends (``submit`` and
results) are done inline on the loop's thread: ``submit`` is synchronous and durable by
contract, and a result is durable before ``get`` reports it; each costs one msync (tens of µs on
tmpfs, about 0.1-2 ms on an SSD).  docs/aio.md has the whole story.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import hashlib
import inspect
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from . import forksafe
from .backoff import BackoffPolicy
from .errors import (
    JobNotFoundError,
    NotLeasedError,
    QueueClosedError,
    RingqError,
    SerializationError,
)
from .job import Job as _EngineJob
from .job import JobState
from .queue import Queue as _SyncQueue

__all__ = ["Job", "Queue", "Status"]

log = logging.getLogger("ringq.aio")

F = TypeVar("F", bound=Callable[..., Any])

NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,20}$")
PLAIN_KIND = re.compile(r"^[A-Za-z0-9_]{1,40}$")
ENGINE_MAX_ATTEMPTS = 0xFFFF  # the engine never dead-letters aio jobs: giving up is decided here
WAIT_CAP = 0.5  # seconds a waiter thread sleeps at most: bounds the reclaim latency when idle
LEASE_BATCH = 64  # jobs leased per call while filling free capacity
SWEEP_BATCH = 256  # result records examined per retention step
_PRUNED = object()
RESULT_KEYS = {"id", "kind", "payload", "status", "result", "error", "created_at", "finished_at", "attempts"}


class Status(str, enum.Enum):
    """Where a job is.  ``RUNNING`` covers every unfinished job: queued, delayed, running, or
    interrupted and awaiting a rerun."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one job; changing it changes nothing.

    Attributes:
        id: the job id (``submit``'s ``id=``, or 32 hex digits).
        kind: the handler kind it was submitted for.
        payload: the JSON value given to ``submit``.
        status: :class:`Status` when the snapshot was taken.
        result: the handler's return value (JSON) once DONE, else None.
        error: ``"ExceptionType: message"`` once FAILED, else None.
        created_at: when it was submitted (timezone-aware UTC).
        finished_at: when it finished (timezone-aware UTC), else None.
        attempts: times a handler was started for it (leases, counting ones lost to crashes).
        progress: the fraction in [0, 1] its running handler last reported with
            :meth:`Queue.progress`, else None.
    """

    id: str
    kind: str
    payload: Any
    status: Status
    result: Any = None
    error: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    attempts: int = 0
    progress: float | None = None


CANCELLED_ERROR = "Cancelled: cancelled by Queue.cancel"


def _utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


@dataclass(eq=False)
class _Handler:
    """One registered kind: its handler, policies, and this process's running jobs of it."""

    kind: str
    fn: Callable[[Job], Any]
    concurrency: int | None
    retries: int
    backoff: BackoffPolicy
    timeout: float | None
    running: dict[tuple[str, int], tuple[asyncio.Task, _EngineJob]] = field(default_factory=dict)
    queue: _SyncQueue | None = None
    waiter: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    pump_pending: bool = False

    def free(self) -> int:
        if self.concurrency is None:
            return LEASE_BATCH
        return self.concurrency - len(self.running)


class Queue:
    """An asyncio task queue in ringq directory ``path``: errand's API, durable and multi-process.

    Args:
        path: the queue directory (created if missing).
        name: ``[A-Za-z0-9_]{1,20}``; several aio queues may share a directory.
        visibility_timeout: seconds a running job stays claimed without a heartbeat; a process
            that is alive but stuck this long loses its jobs to the others (default 30).
        keep_seconds: finished jobs are kept (``get`` returns them) this long, then pruned;
            None keeps them regardless of age (default one day).
        keep_jobs: at most this many finished jobs are kept, oldest pruned first; None for no
            limit (default 100,000).  With both None, disk use grows with every job.
        max_attempts: a job whose handler was started this many times without finishing (its
            process died, it was interrupted) fails with an error saying so, unless its handler's
            ``retries`` allow more (default 20).
        durability: the engine's durability strategy for job and result records (default
            ``"msync"``: durable against power loss when ``submit`` returns).
        slot_size, slot_count: geometry of the engine queues, used when they are created.
        sweep_interval: seconds between retention sweeps (default: a tenth of ``keep_seconds``,
            between 0.05 and 60).

    Raises:
        ValueError: a bad name or setting.  ringq.ForeignQueueError: ``path`` is a SQLite database
        file (errand keeps its queue in one); the message says to choose a directory path instead.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        name: str = "default",
        *,
        visibility_timeout: float = 30.0,
        keep_seconds: float | None = 86400.0,
        keep_jobs: int | None = 100_000,
        max_attempts: int = 20,
        durability: str = "msync",
        slot_size: int = 256,
        slot_count: int = 16384,
        sweep_interval: float | None = None,
    ) -> None:
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError(f"aio queue name must match [A-Za-z0-9_]{{1,20}}, got {name!r}")
        if not visibility_timeout > 0:
            raise ValueError(f"visibility_timeout must be > 0 seconds, got {visibility_timeout!r}")
        if keep_seconds is not None and not keep_seconds >= 0:
            raise ValueError(f"keep_seconds must be >= 0 or None, got {keep_seconds!r}")
        if keep_jobs is not None and (not isinstance(keep_jobs, int) or keep_jobs < 0):
            raise ValueError(f"keep_jobs must be an int >= 0 or None, got {keep_jobs!r}")
        if not isinstance(max_attempts, int) or not 1 <= max_attempts < ENGINE_MAX_ATTEMPTS:
            raise ValueError(f"max_attempts must be an int in [1, {ENGINE_MAX_ATTEMPTS - 1}], got {max_attempts!r}")
        self.path = os.fspath(path)
        from .foreign import check_not_foreign

        check_not_foreign(self.path, "")  # an errand SQLite file at `path`: say so now, not at open
        self.name = name
        self.visibility_timeout = float(visibility_timeout)
        self.keep_seconds = keep_seconds
        self.keep_jobs = keep_jobs
        self.max_attempts = max_attempts
        if sweep_interval is None:
            sweep_interval = 60.0 if keep_seconds is None else min(60.0, max(0.05, keep_seconds / 10))
        self.sweep_interval = sweep_interval
        self._engine_opts = dict(durability=durability, visibility_timeout=self.visibility_timeout,
                                 slot_size=slot_size, slot_count=slot_count)
        self._handlers: dict[str, _Handler] = {}
        self._queues: dict[str, _SyncQueue] = {}  # engine queue name -> open queue
        self._qlock = threading.Lock()  # guards _queues: submit may come from other threads
        self._results: _SyncQueue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._closing = False
        self._lost: set[tuple[str, int]] = set()
        self._cancelling: set[tuple[str, int]] = set()  # running jobs whose cancel was requested
        self._chores: list[asyncio.Task] = []
        self._sweep_fd = -1
        self._sweeping: asyncio.Future | None = None
        self._sweep_lock = threading.Lock()
        forksafe.register(self)

    def drop_inherited_locks(self) -> None:
        """In a forked child (ringq/forksafe.py): close the copy of the sweep lock's descriptor,
        which would otherwise keep a dead parent's flock held."""
        if self._sweep_fd >= 0:
            os.close(self._sweep_fd)
        self._sweep_fd = -1
        self._sweep_lock = threading.Lock()

    # -- names ----------------------------------------------------------------------------------

    def queue_name(self, kind: str) -> str:
        """The ringq queue holding jobs of ``kind`` (for ``ringq stats --queue NAME``)."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"kind must be a non-empty string, got {kind!r}")
        if PLAIN_KIND.match(kind):
            return f"{self.name}-j-{kind}"
        return f"{self.name}-jh-{hashlib.sha256(kind.encode('utf-8', 'surrogatepass')).hexdigest()[:24]}"

    @property
    def results_queue_name(self) -> str:
        """The ringq queue holding finished jobs' results."""
        return f"{self.name}-r"

    # -- registration ---------------------------------------------------------------------------

    def handler(
        self,
        kind: str,
        concurrency: int | None = None,
        *,
        retries: int = 0,
        backoff: BackoffPolicy | None = None,
        timeout: float | None = None,
    ) -> Callable[[F], F]:
        """Register ``async def fn(job: Job) -> result`` for jobs of ``kind`` (a decorator).

        Args:
            kind: the job kind (a non-empty string).
            concurrency: at most this many jobs of the kind run at once in this process; the
                rest wait in submission order.  None: no limit.
            retries: failed runs retried this many times, after ``backoff`` delays (default 0:
                a raised exception fails the job).  Runs lost to a crash count as attempts too.
            backoff: delay policy between retries (default ``BackoffPolicy()``, as ringq.Queue).
            timeout: seconds a run may take; a run that takes longer is cancelled and fails
                with ``"TimeoutError: ..."`` (retried if ``retries`` allow).

        A plain ``def`` handler runs in a worker thread (``asyncio.to_thread``).
        """
        self.queue_name(kind)
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ValueError(f"concurrency must be an int >= 1 or None, got {concurrency!r}")
        if not isinstance(retries, int) or not 0 <= retries < ENGINE_MAX_ATTEMPTS - 1:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")

        def register(fn: F) -> F:
            if kind in self._handlers and self._handlers[kind].waiter is not None:
                raise ValueError(f"a handler for {kind!r} is already serving")
            h = _Handler(kind, fn, concurrency, retries, backoff or BackoffPolicy(), timeout)
            self._handlers[kind] = h
            if self._results is not None and not self._closing:
                self._serve(h)
            return fn

        return register

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> Queue:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def is_open(self) -> bool:
        return self._results is not None and not self._closing

    async def open(self) -> None:
        """Open the engine queues and start serving every registered kind: jobs that a previous
        process left unfinished run again.  Must be called on the loop that will run handlers."""
        if self._results is not None:
            raise RuntimeError("this aio Queue is already open")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._closing = False
        self._results = self._open_engine(self.results_queue_name)
        try:
            self._sweep_fd = os.open(os.path.join(self.path, f"{self.results_queue_name}.sweep"),
                                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._chores = [asyncio.create_task(self._heartbeat(), name="ringq.aio heartbeat"),
                            asyncio.create_task(self._retention(), name="ringq.aio retention")]
            for h in self._handlers.values():
                self._serve(h)
            # Lease what a previous process left unfinished now, not when a waiter thread gets
            # round to it: the reruns then start on the loop's next iteration, as errand's do.
            for kind in list(self._handlers):
                self._pump(kind)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Cancel running handlers (their jobs stay unfinished and rerun later), then close."""
        if self._results is None or self._closing:
            return
        self._closing = True
        tasks = [t for h in self._handlers.values() for t, _ in h.running.values()]
        for t in tasks + self._chores:
            t.cancel()
        await asyncio.gather(*tasks, *self._chores, return_exceptions=True)
        if self._sweeping is not None:
            await asyncio.wait([self._sweeping])  # a sweep in its thread ends at its next batch
            self._sweeping = None
        for h in self._handlers.values():
            for _task, ej in h.running.values():  # cancelled before their first step
                try:
                    h.queue.nack(ej, error="Interrupted: the queue was closed before the handler started", delay=0)
                except (NotLeasedError, JobNotFoundError):
                    pass
            h.running.clear()
        self._lost.clear()
        for h in self._handlers.values():
            h.stop.set()
        for h in self._handlers.values():
            if h.waiter is not None:
                h.queue.wake()
        for h in self._handlers.values():
            if h.waiter is not None:
                await asyncio.to_thread(h.waiter.join)
                h.waiter = None
            h.stop = threading.Event()
            h.queue = None
        with self._qlock:
            for q in self._queues.values():
                q.close()
            self._queues.clear()
        self._results.close()
        self._results = None
        if self._sweep_fd >= 0:
            os.close(self._sweep_fd)
        self._sweep_fd = -1
        self._chores = []
        self._closing = False

    def _check_open(self) -> None:
        if self._results is None or self._closing:
            raise QueueClosedError(f"aio queue {self.name!r} in {self.path} is not open (use `async with queue:`)")

    def _open_engine(self, qname: str) -> _SyncQueue:
        with self._qlock:
            q = self._queues.get(qname)
            if q is None:
                q = _SyncQueue(self.path, qname, max_attempts=ENGINE_MAX_ATTEMPTS, **self._engine_opts)
                if qname != self.results_queue_name:
                    self._queues[qname] = q
            return q

    def _kind_queues(self) -> list[_SyncQueue]:
        """Every job queue of this aio queue in the directory (other processes may have added kinds)."""
        prefixes = (f"{self.name}-j-", f"{self.name}-jh-")
        for fname in os.listdir(self.path):
            if fname.endswith(".ctl") and fname.startswith(prefixes):
                qname = fname[:-4]
                if qname not in self._queues:
                    self._open_engine(qname)
        with self._qlock:
            return list(self._queues.values())

    def _serve(self, h: _Handler) -> None:
        h.queue = self._open_engine(self.queue_name(h.kind))
        h.pump_pending = False
        h.waiter = threading.Thread(target=self._wait_loop, args=(h, h.queue, h.stop),
                                    name=f"ringq.aio waiter {h.kind}", daemon=True)
        h.waiter.start()

    # -- submitting -----------------------------------------------------------------------------

    def submit(self, kind: str, payload: Any = None, *, id: str | None = None, delay: float = 0.0) -> str:
        """Store a job durably and start it; returns its id.  Not a coroutine.

        From the loop's thread the job starts on the loop at once (``await asyncio.sleep(0)`` lets
        a handler that does not wait finish).  Safe from any other thread too: the job is durable
        when this returns and the loop starts it on its next iteration.

        Args:
            kind: which handler runs it.  A kind with no handler in this process waits for a
                process that has one.
            payload: a JSON value.
            id: an idempotency key: if a job with this id is retained, nothing is stored and its
                id is returned.
            delay: seconds before the job may start.

        Raises:
            QueueClosedError (not open), SerializationError (payload not JSON), ValueError.
        """
        self._check_open()
        if id is not None:
            if not isinstance(id, str) or not id:
                raise ValueError(f"id must be a non-empty string, got {id!r}")
            if self._locate(id) is not None:
                return id
        job_id = id if id is not None else uuid.uuid4().hex
        q = self._open_engine(self.queue_name(kind))
        q.enqueue({"kind": kind, "payload": payload}, job_id=job_id, delay=delay)
        if threading.get_ident() == self._loop_thread:
            self._pump(kind)
        else:
            self._loop.call_soon_threadsafe(self._pump, kind)
        if delay > 0:
            self._loop.call_soon_threadsafe(self._loop.call_later, delay, self._pump, kind)
        return job_id

    # -- reading --------------------------------------------------------------------------------

    def get(self, id: str) -> Job | None:
        """A snapshot of job ``id``, or None if there is none (never submitted, or pruned)."""
        self._check_open()
        found = self._locate(id)
        return found if isinstance(found, Job) else None

    def running(self) -> list[Job]:
        """Unfinished jobs of every kind, including interrupted ones awaiting a rerun, oldest first."""
        self._check_open()
        out = []
        for q in self._kind_queues():
            for state in (JobState.READY, JobState.LEASED):
                for ej in q.list_jobs(state):
                    if not isinstance(self._result(ej.id), Job):
                        out.append(self._unfinished(ej, q))
        out.sort(key=lambda j: (j.created_at, j.id))
        return out

    def _result(self, job_id: str) -> Job | object | None:
        """The finished job from the results queue; _PRUNED if retention removed it; else None."""
        try:
            rj = self._results.get(job_id)
        except JobNotFoundError:
            return None
        if rj.state not in (JobState.READY, JobState.LEASED):
            return _PRUNED
        r = rj.payload
        if not isinstance(r, dict) or not RESULT_KEYS <= r.keys():
            log.error("result record %r in %s is not an aio result; ignored", job_id, self.results_queue_name)
            return _PRUNED
        return Job(id=r["id"], kind=r["kind"], payload=r["payload"], status=Status(r["status"]),
                   result=r["result"], error=r["error"], created_at=_utc(r["created_at"]),
                   finished_at=_utc(r["finished_at"]), attempts=r["attempts"])

    def _locate(self, job_id: str) -> Job | object | None:
        """The job as a snapshot, _PRUNED if it finished and was pruned, None if unknown."""
        found = self._result(job_id)
        if found is not None:
            return found
        for q in self._kind_queues():
            try:
                ej = q.get(job_id)
            except JobNotFoundError:
                continue
            if ej.state in (JobState.READY, JobState.LEASED):
                return self._unfinished(ej, q)
            if ej.state in (JobState.CANCELLED, JobState.EXPIRED):
                kind, payload = self._decode(ej, q)
                return Job(id=ej.id, kind=kind, payload=payload, status=Status.FAILED, result=None,
                           error=CANCELLED_ERROR, created_at=_utc(ej.enqueued_at), finished_at=None,
                           attempts=ej.attempts)
            if ej.state is JobState.DEAD:
                # Only a record created outside aio (its own max_attempts) can be dead-lettered by
                # the engine: its runs were lost (killed, closed) that many times.  It has failed.
                kind, payload = self._decode(ej, q)
                return Job(id=ej.id, kind=kind, payload=payload, status=Status.FAILED, result=None,
                           error=(f"GaveUp: started {ej.attempts} times without finishing (the record allowed "
                                  f"max_attempts={ej.max_attempts}); last: {ej.last_error}"),
                           created_at=_utc(ej.enqueued_at), finished_at=None, attempts=ej.attempts)
            # DONE: its result was written first; read again (it may have been written just now).
            return self._result(job_id) or _PRUNED
        return None

    def _decode(self, ej: _EngineJob, q: _SyncQueue) -> tuple[str, Any]:
        rec = ej.payload
        if isinstance(rec, dict) and rec.keys() == {"kind", "payload"}:
            return rec["kind"], rec["payload"]
        # A record put there by other means (``ringq enqueue --queue <name>-j-<kind>``): the
        # whole record is the payload.
        prefix = f"{self.name}-j-"
        return (q.name[len(prefix):] if q.name.startswith(prefix) else q.name), rec

    def _unfinished(self, ej: _EngineJob, q: _SyncQueue) -> Job:
        kind, payload = self._decode(ej, q)
        return Job(id=ej.id, kind=kind, payload=payload, status=Status.RUNNING,
                   created_at=_utc(ej.enqueued_at), attempts=ej.attempts, progress=ej.progress)

    # -- lifecycle: cancel, pause, progress (docs/lifecycle.md) ---------------------------------

    def cancel(self, id: str) -> bool:
        """Cancel job ``id``: a queued or delayed one never runs (FAILED, error ``"Cancelled: ..."``);
        a running one has its handler task cancelled at the next heartbeat, in whichever process
        runs it, and is recorded the same way.  Returns False if the job is unknown or finished."""
        self._check_open()
        if isinstance(self._result(id), Job):
            return False
        for q in self._kind_queues():
            try:
                q.cancel(id)
                return True
            except JobNotFoundError:
                continue
            except RingqError:  # finished meanwhile
                return False
        return False

    def pause(self, kind: str) -> None:
        """Stop starting jobs of ``kind`` in every process (a pause of its engine queue, durable
        across restarts) until :meth:`resume`.  Running handlers finish; submits still succeed."""
        self._check_open()
        self._open_engine(self.queue_name(kind)).pause()

    def resume(self, kind: str) -> None:
        """Undo :meth:`pause` for ``kind``; waiting processes start its jobs at once."""
        self._check_open()
        self._open_engine(self.queue_name(kind)).resume()

    def progress(self, job: Job, fraction: float, message: str | None = None) -> None:
        """Report the progress of a job this process is running (``fraction`` in [0, 1]); shown as
        ``Job.progress`` by :meth:`get`.  Raises JobNotFoundError if this process does not run it,
        NotLeasedError if its lease was lost, ValueError for a fraction outside [0, 1]."""
        self._check_open()
        for h in self._handlers.values():
            for _task, ej in list(h.running.values()):
                if ej.id == job.id:
                    h.queue.progress(ej, fraction, message)
                    return
        raise JobNotFoundError(f"job {job.id!r} is not running in this process")

    # -- running --------------------------------------------------------------------------------

    def _wait_loop(self, h: _Handler, q: _SyncQueue, stop: threading.Event) -> None:
        """Thread: sleep in the engine's futex wait, ask the loop to lease whenever woken."""
        while not stop.is_set():
            try:
                token = q.wake_token()
                if not h.pump_pending:
                    h.pump_pending = True
                    self._loop.call_soon_threadsafe(self._pump, h.kind)
                q.wait_for_wake(token, WAIT_CAP)
            except (QueueClosedError, RuntimeError):  # queue closed, or the loop is gone
                return

    def _pump(self, kind: str) -> None:
        """Loop thread: lease jobs of ``kind`` while there is free capacity, and start them."""
        h = self._handlers.get(kind)
        if h is None:
            return
        h.pump_pending = False  # first: a pump skipped while closing must not silence the next session
        if h.queue is None or self._closing:
            return
        started = 0
        while (free := min(h.free(), LEASE_BATCH)) > 0:
            try:
                jobs = h.queue.lease(free, visibility_timeout=self.visibility_timeout)
            except RingqError as exc:  # damage is reported by the engine; keep serving what is sound
                log.error("leasing %r jobs from %s failed: %s", kind, self.path, exc)
                return
            for ej in jobs:
                task = self._loop.create_task(self._run(h, ej), name=f"ringq.aio {kind} {ej.id}")
                h.running[(ej.id, ej.lease_token)] = (task, ej)
            started += len(jobs)
            if len(jobs) < free:
                return
            if started >= 4 * LEASE_BATCH:  # let the loop breathe; carry on next iteration
                self._loop.call_soon(self._pump, kind)
                return

    async def _run(self, h: _Handler, ej: _EngineJob) -> None:
        key = (ej.id, ej.lease_token)
        q = h.queue
        try:
            kind, payload = self._decode(ej, q)
            job = Job(id=ej.id, kind=kind, payload=payload, status=Status.RUNNING,
                      created_at=_utc(ej.enqueued_at), attempts=ej.attempts)
            if self._result(ej.id) is not None:  # finished before: a crash came before its ack
                self._ack(q, ej)
                return
            if ej.attempts > max(self.max_attempts, h.retries + 1):
                self._finish(q, ej, job, Status.FAILED, None,
                             f"GaveUp: started {ej.attempts - 1} times without finishing; last: {ej.last_error}")
                return
            try:
                async with asyncio.timeout(h.timeout) as deadline:
                    if inspect.iscoroutinefunction(h.fn):
                        result = await h.fn(job)
                    else:
                        result = await asyncio.to_thread(h.fn, job)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the handler's failure is data, not ours
                if h.timeout is not None and deadline.expired():
                    error = f"TimeoutError: handler for {kind!r} did not finish within {h.timeout:g} s"
                else:
                    error = f"{type(exc).__name__}: {exc}"
                if ej.attempts <= h.retries:
                    wait = h.backoff.delay_for(ej.attempts)
                    log.info("job %s (%s) failed, retrying in %.3g s: %s", ej.id, kind, wait, error)
                    try:
                        q.nack(ej, error=error, delay=wait)
                    except (NotLeasedError, JobNotFoundError):
                        pass
                    self._loop.call_later(wait, self._pump, h.kind)
                    return
                log.warning("job %s (%s) failed: %s", ej.id, kind, error)
                self._finish(q, ej, job, Status.FAILED, None, error)
                return
            self._finish(q, ej, job, Status.DONE, result, None)
        except RingqError as exc:  # storing the outcome failed (disk full, lock timeout, ...)
            log.error("job %s: could not store its outcome (%s); it runs again after a delay", ej.id, exc)
            try:
                q.nack(ej, error=f"{type(exc).__name__}: storing the outcome failed: {exc}", delay=1.0)
            except RingqError:
                pass  # the lease then expires after the visibility timeout
        except asyncio.CancelledError:
            if key in self._cancelling and not self._closing:  # Queue.cancel asked for it
                asyncio.current_task().uncancel()
                self._finish(q, ej, job, Status.FAILED, None, CANCELLED_ERROR)
                return
            if key not in self._lost:  # interrupted (closing): let the job run again, anywhere
                try:
                    q.nack(ej, error="Interrupted: the queue was closed while the handler ran", delay=0)
                except (NotLeasedError, JobNotFoundError):
                    pass
            raise
        finally:
            h.running.pop(key, None)
            self._lost.discard(key)
            self._cancelling.discard(key)
            if not self._closing:
                self._loop.call_soon(self._pump, h.kind)

    def _finish(self, q: _SyncQueue, ej: _EngineJob, job: Job, status: Status, result: Any, error: str | None) -> None:
        try:
            q.extend(ej, self.visibility_timeout)  # fencing: a stale holder must not record a result
        except (NotLeasedError, JobNotFoundError):
            log.warning("job %s: lease lost before its result was stored; the job runs again elsewhere", ej.id)
            return
        rec = {"id": job.id, "kind": job.kind, "payload": job.payload, "status": status.value, "result": result,
               "error": error, "created_at": ej.enqueued_at, "finished_at": time.time(), "attempts": ej.attempts}
        try:
            self._results.enqueue(rec, job_id=job.id)
        except SerializationError as exc:  # the result is not JSON, or too large
            rec.update(status=Status.FAILED.value, result=None, error=f"{type(exc).__name__}: handler result: {exc}")
            self._results.enqueue(rec, job_id=job.id)
        self._ack(q, ej)

    @staticmethod
    def _ack(q: _SyncQueue, ej: _EngineJob) -> None:
        try:
            q.ack(ej)
        except (NotLeasedError, JobNotFoundError):
            pass  # reclaimed meanwhile: its result is stored, so the rerun only acks

    async def _heartbeat(self) -> None:
        """Extend the leases of running handlers; cancel a handler whose lease was lost."""
        period = max(0.02, self.visibility_timeout / 3)
        while True:
            await asyncio.sleep(period)
            for h in list(self._handlers.values()):
                for key, (task, ej) in list(h.running.items()):
                    try:
                        ext = h.queue.extend(ej, self.visibility_timeout)
                        if ext.cancel_requested and key not in self._cancelling:
                            self._cancelling.add(key)
                            task.cancel()
                    except (NotLeasedError, JobNotFoundError):
                        log.warning("job %s: lease lost (this process was stuck longer than the visibility "
                                    "timeout); cancelling its handler here", ej.id)
                        self._lost.add(key)
                        task.cancel()

    # -- retention ------------------------------------------------------------------------------

    async def _retention(self) -> None:
        if self.keep_seconds is None and self.keep_jobs is None:
            return
        while True:
            await asyncio.sleep(self.sweep_interval)
            # In a worker thread: examining the oldest results costs O(retained) (~50 ms at 100,000).
            self._sweeping = self._loop.run_in_executor(None, self._prune_locked)
            try:
                await asyncio.shield(self._sweeping)
            except RingqError as exc:
                log.error("retention sweep of %s failed: %s", self.path, exc)

    def prune(self) -> int:
        """Prune finished jobs beyond the retention limits now; returns how many.  One process
        prunes at a time (a flock); the others return 0 at once.  Runs on its own every
        ``sweep_interval`` seconds while the queue is open."""
        self._check_open()
        return self._prune_locked()

    def _prune_locked(self) -> int:
        if not self._sweep_lock.acquire(blocking=False):  # flock would let our own threads in
            return 0
        try:
            try:
                fcntl.flock(self._sweep_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            try:
                return self._sweep()
            finally:
                fcntl.flock(self._sweep_fd, fcntl.LOCK_UN)
        finally:
            self._sweep_lock.release()

    def _sweep(self) -> int:
        # Results are appended in finish order and leased FIFO, and nobody else leases them, so
        # under the sweep lock a lease of n takes exactly the n oldest: ack them and they are gone.
        rq = self._results
        pruned = 0
        while not self._closing:
            batch = rq.list_jobs(JobState.READY, limit=SWEEP_BATCH)
            if not batch:
                return pruned
            excess = 0 if self.keep_jobs is None else max(0, rq.stats().ready - self.keep_jobs)
            old = 0
            if self.keep_seconds is not None:
                cutoff = time.time() - self.keep_seconds
                while old < len(batch) and batch[old].enqueued_at < cutoff:
                    old += 1
            n = min(len(batch), max(excess, old))
            if n == 0:
                return pruned
            want = {j.id for j in batch[:n]}
            for rj in rq.lease(n, visibility_timeout=max(60.0, self.visibility_timeout)):
                if rj.id in want:
                    rq.ack(rj)
                    pruned += 1
                else:
                    rq.nack(rj, delay=0)
            if n < SWEEP_BATCH:
                return pruned
        return pruned

    def __repr__(self) -> str:
        return f"ringq.aio.Queue({self.path!r}, name={self.name!r})"
