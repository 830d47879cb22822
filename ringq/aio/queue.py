"""ringq.aio: an asyncio task queue with errand's API, on ringq's engine.

    from ringq.aio import Job, Queue, Status

    queue = Queue("./jobs")                 # or Queue("redis://host:6379/0")

    @queue.handler("double", concurrency=4)
    async def double(job: Job) -> int:
        return job.payload["x"] * 2

    async with queue:                       # reruns what a previous process left unfinished
        job_id = queue.submit("double", {"x": 21})
        await asyncio.sleep(0)
        queue.get(job_id).result            # 42, stored durably

Theory of operation
-------------------
Storage is two kinds of ordinary ringq queues (``ringq stats/list`` see them), in a directory or
on a Redis server (ringq/aio/store.py is the only code that knows which):

* one *job queue* per kind, ``<name>-j-<kind>`` (``<name>-jh-<hash>`` for a kind that is not
  ``[A-Za-z0-9_]{1,40}``), whose records are ``{"kind": kind, "payload": payload}``.  A queue
  per kind lets a process lease only the kinds it has a handler and free capacity for, so a
  concurrency limit never makes it hold other processes' work, and the engine's FIFO order is the
  "rest wait in submission order" of the limit;
* one *results queue* ``<name>-r`` whose records are the finished jobs (status, result or
  error, times; the payload only if small, else it stays in the job record), appended with
  ``job_id=<job id>`` so that a job can finish only once;
* nothing else: a job is unfinished while its job record is READY or LEASED, finished once its
  result record exists, and pruned (by retention, ringq/aio/retention.py) once the result record
  is DONE.

A job submitted with ``depends_on`` waits DEFERRED in its kind's queue for one *gate* per parent
there (ringq/aio/gates.py), which settles by the parent's aio status, so parents of any kind
work and a FAILED parent cancels its dependents.

Running a job: lease it (one process at a time) -> if a result already exists (a crash came
between writing it and the ack), just ack -> run the handler -> check the lease is still ours
-> append the result (durable) -> ack.  A failure with retries left is a ``nack`` with the
handler's backoff delay instead.  A heartbeat extends the leases of running handlers; a process
that dies loses its leases (on a directory at once, by the engine's owner locks; on Redis after
the visibility timeout), one that is stuck loses them after the visibility timeout, and either
way another process reruns the job.

The event loop is never blocked by a wait.  Leasing is a non-blocking ``lease`` on the loop's
thread, so capacity is counted in one place and ``submit`` can start its job at once.  Waiting
for work happens in one thread per served kind, sleeping in the engine queue's
``wait_for_wake`` (a futex on a directory, ``BLPOP`` on Redis) and asking the loop to lease when
woken.  Appends (``submit`` and results) are done inline on the loop's thread: ``submit`` is
synchronous and durable by contract, and a result is durable before ``get`` reports it.
docs/aio.md has the whole story.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ringq import codec, tracing
from ringq.backend import (
    DEFAULT_VISIBILITY_TIMEOUT,
    check_allow_failure,
    check_count,
    check_progress,
    check_replace,
    check_seconds,
    check_visibility_timeout,
    timeout_ms,
)
from ringq.backoff import BackoffPolicy
from ringq.engine import records
from ringq.engine.ring import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE
from ringq.errors import (
    JobNotFoundError,
    NotLeasedError,
    QueueClosedError,
    RingqError,
    SerializationError,
)
from ringq.job import Job as _EngineJob

from . import gates
from . import job as aio_job
from .job import CANCELLED_ERROR, Job, Status
from .retention import Retention
from .store import store_for

__all__ = ["Job", "Queue", "Status"]

log = logging.getLogger("ringq.aio")

F = TypeVar("F", bound=Callable[..., Any])

NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,20}$")
PLAIN_KIND = re.compile(r"^[A-Za-z0-9_]{1,40}$")
ENGINE_MAX_ATTEMPTS = 0xFFFF  # the engine never dead-letters aio jobs: giving up is decided here
WAIT_CAP = 0.5  # seconds a waiter thread sleeps at most: bounds the reclaim latency when idle
LEASE_BATCH = 64  # jobs leased per call while filling free capacity

_RunKey = tuple[str, str | None]  # a running job: (job id, lease token)


@dataclass(eq=False)
class _Handler:
    """One registered kind: its handler, policies, and this process's running jobs of it."""

    kind: str
    fn: Callable[[Job], Any]
    concurrency: int | None
    retries: int
    backoff: BackoffPolicy
    timeout: float | None
    running: dict[_RunKey, tuple[asyncio.Task[None], _EngineJob]] = field(default_factory=dict)
    queue: Any = None  # the kind's engine queue while serving
    waiter: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    pump_pending: bool = False

    def free(self) -> int:
        if self.concurrency is None:
            return LEASE_BATCH
        return self.concurrency - len(self.running)

    def wait_loop(self, stop: threading.Event, ask_pump: Callable[[], Any], where: str) -> None:
        """Thread: sleep in the engine queue's wake-up wait; ``ask_pump()`` (the loop leases)
        whenever woken.  Ends when ``stop`` is set."""
        q = self.queue
        while not stop.is_set():
            if self.free() <= 0:
                # Full: a finishing job pumps by itself, and on Redis a wake-up taken now would be
                # one another process with room for the job never gets.
                stop.wait(WAIT_CAP)
                continue
            try:
                token = q.wake_token()
                if not self.pump_pending:
                    self.pump_pending = True
                    ask_pump()
                q.wait_for_wake(token, WAIT_CAP)
            except (QueueClosedError, RuntimeError):  # queue closed, or the loop is gone
                return
            except RingqError as exc:  # a Redis connection dropped: keep serving once it is back
                log.warning("waiting for %r jobs at %s failed: %s", self.kind, where, exc)
                stop.wait(WAIT_CAP)


class Queue:
    """An asyncio task queue at ``target``: errand's API, durable and multi-process.

    Args:
        target: a queue directory (created if missing), or a Redis server's ``redis://host:port/db``,
            ``rediss://...`` (TLS) or ``unix:///path/to/socket`` URL (needs ``ringq[redis]``).
        name: ``[A-Za-z0-9_]{1,20}``; several aio queues may share a directory or server.
        visibility_timeout: seconds a running job stays claimed without a heartbeat; a process
            that is alive but stuck this long loses its jobs to the others, as does (on Redis) one
            that died (default 30).
        keep_seconds: finished jobs are kept (``get`` returns them) this long, then pruned;
            None keeps them regardless of age (default one day).
        keep_jobs: at most this many finished jobs are kept, oldest pruned first; None for no
            limit (default 100,000).  With both None, storage grows with every job.
        max_attempts: a job whose handler was started this many times without finishing (its
            process died, it was interrupted) fails with an error saying so, unless its handler's
            ``retries`` allow more (default 20).
        durability: the engine's durability strategy for job and result records on a directory
            (default ``"msync"``: durable against power loss when ``submit`` returns).  On Redis
            durability is the server's own (docs/scale-out.md) and this is ignored.
        slot_size, slot_count: geometry of a directory's engine queues, used when they are created.
            Their product (4 MiB by default) is ``max_record_bytes``, the largest job or result
            record (64-byte header + id + encoded payload or result) on both backends: ``submit``
            refuses a larger job, and a larger result fails its job.
        sweep_interval: seconds between retention sweeps (default: a tenth of ``keep_seconds``,
            between 0.05 and 60).

    Raises:
        ValueError: a bad name or setting, or an unknown ``scheme://``.  ImportError: a Redis URL
        without redis-py.  ringq.ForeignQueueError: ``target`` is a SQLite database file (errand
        keeps its queue in one); the message says to choose a directory path instead.
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        name: str = "default",
        *,
        visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT,
        keep_seconds: float | None = 86400.0,
        keep_jobs: int | None = 100_000,
        max_attempts: int = 20,
        durability: str = "msync",
        slot_size: int = DEFAULT_SLOT_SIZE,
        slot_count: int = DEFAULT_SLOT_COUNT,
        sweep_interval: float | None = None,
    ) -> None:
        _check_settings(name, visibility_timeout, keep_seconds, keep_jobs, max_attempts)
        self._store = store_for(target, name)
        self.path = os.fspath(target)
        self.name = name
        self._prefix = f"{name}-j-"  # a kind queue's name is this and the kind (unless hashed)
        self.visibility_timeout = float(visibility_timeout)
        self.keep_seconds = None if keep_seconds is None else float(keep_seconds)
        self.keep_jobs = None if keep_jobs is None else int(keep_jobs)
        self.max_attempts = int(max_attempts)
        self.sweep_interval = (
            _sweep_default(self.keep_seconds)
            if sweep_interval is None
            else check_seconds(sweep_interval, "sweep_interval")
        )
        # The largest record (64-byte header + id + encoded payload), in bytes, on both backends:
        # what one segment of the directory geometry holds (ringq/engine/ring.py max_record_bytes).
        self.max_record_bytes = min(int(slot_size) * int(slot_count), records.MAX_RECORD_FIELD)
        self._engine_opts = dict(
            durability=durability,
            visibility_timeout=self.visibility_timeout,
            slot_size=slot_size,
            slot_count=slot_count,
            max_attempts=ENGINE_MAX_ATTEMPTS,
        )
        self._handlers: dict[str, _Handler] = {}
        self._queues: dict[str, Any] = {}  # engine queue name -> open job queue
        self._qlock = threading.Lock()  # guards _queues: submit may come from other threads
        self._results: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._closing = False
        self._lost: set[_RunKey] = set()
        self._cancelling: set[_RunKey] = set()  # running jobs whose cancel was requested
        # Engine queues where this process made or settled gates (ringq/aio/gates.py): a job
        # finishing here nudges its gates there.
        self._gated: set[str] = set()
        self._chores: list[asyncio.Task[None]] = []
        self._retention = Retention(
            self._store,
            self.keep_seconds,
            self.keep_jobs,
            self.sweep_interval,
            self.visibility_timeout,
        )

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
        _check_handler(concurrency, retries, timeout)

        def register(fn: F) -> F:
            if kind in self._handlers and self._handlers[kind].waiter is not None:
                raise ValueError(f"a handler for {kind!r} is already serving")
            h = _Handler(
                kind,
                fn,
                None if concurrency is None else int(concurrency),
                int(retries),
                backoff or BackoffPolicy(),
                None if timeout is None else float(timeout),
            )
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
        process left unfinished run again.  Must be called on the loop that will run handlers.
        Raises ConnectionLostError if a Redis server cannot be reached."""
        if self._results is not None:
            raise RuntimeError("this aio Queue is already open")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._closing = False
        try:
            self._store.start()
            self._results = self._store.open(
                self.results_queue_name, **self._engine_opts, auto_ids=False
            )
        except BaseException:
            self._store.close()
            raise
        try:
            self._chores = [
                asyncio.create_task(
                    _heartbeat(
                        self._handlers, self.visibility_timeout, self._lost, self._cancelling
                    ),
                    name="ringq.aio heartbeat",
                ),
                asyncio.create_task(
                    self._retention.run(self._loop, self._results, lambda: self._closing),
                    name="ringq.aio retention",
                ),
            ]
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
        await self._retention.finished()
        for h in self._handlers.values():
            for _task, ej in h.running.values():  # cancelled before their first step
                why = "Interrupted: the queue was closed before the handler started"
                _quietly(_release, h.queue, ej, why)
            h.running.clear()
            h.stop.set()
        self._lost.clear()
        for h in self._handlers.values():
            if h.waiter is not None:
                _quietly(h.queue.wake)
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
        self._store.close()
        self._chores = []
        self._closing = False

    # -- cancel, pause, progress (the engine queue of each kind does the work: docs/lifecycle.md) --

    def cancel(self, id: str) -> bool:
        """Cancel job ``id``: a queued or delayed one never runs (FAILED, error ``"Cancelled: ..."``);
        a running one has its handler task cancelled at the next heartbeat, in whichever process
        runs it, and is recorded the same way.  Returns False if the job is unknown or finished."""
        self._check_open()
        if isinstance(aio_job.find_result(self._results, id), Job):
            return False
        for q in self._kind_queues():
            try:
                q.cancel(id)
            except JobNotFoundError:
                continue
            except RingqError:  # finished meanwhile
                return False
            self._nudge(id)
            return True
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
        """Report the progress of a job this process is running (``fraction`` a number from 0 to
        1, ``message`` a str or None); shown as ``Job.progress`` by :meth:`get`.  Raises
        JobNotFoundError if this process does not run it, NotLeasedError if its lease was lost,
        ValueError for a fraction that is not a number from 0 to 1 (NaN, a bool, a str),
        TypeError for a message that is not a str."""
        self._check_open()
        fraction, message = check_progress(fraction, message)
        for h in self._handlers.values():
            for _task, ej in list(h.running.values()):
                if ej.id == job.id:
                    h.queue.progress(ej, fraction, message)
                    return
        raise JobNotFoundError(f"job {job.id!r} is not running in this process")

    def prune(self) -> int:
        """Prune finished jobs beyond the retention limits now; returns how many.  One process
        prunes at a time (the store's sweep lock); the others return 0 at once.  Runs on its own
        every ``sweep_interval`` seconds while the queue is open."""
        self._check_open()
        return self._retention.prune(self._results, lambda: self._closing)

    def _check_open(self) -> None:
        if self._results is None or self._closing:
            raise QueueClosedError(
                f"aio queue {self.name!r} at {self._store.where} is not open (use `async with queue:`)"
            )

    def _opened_loop(self) -> asyncio.AbstractEventLoop:
        """The loop :meth:`open` was called on (kept after :meth:`aclose`, until the next open)."""
        loop = self._loop
        if loop is None:
            raise QueueClosedError(
                f"aio queue {self.name!r} at {self._store.where} was never opened"
            )
        return loop

    def _open_engine(self, qname: str) -> Any:
        with self._qlock:
            q = self._queues.get(qname)
            if q is None:
                q = self._queues[qname] = self._store.open(qname, **self._engine_opts)
            return q

    def _kind_queues(self) -> list[Any]:
        """Every job queue of this aio queue (other processes may have added kinds)."""
        for qname in self._store.queue_names((self._prefix, f"{self.name}-jh-")):
            if qname not in self._queues:
                self._open_engine(qname)
        with self._qlock:
            return list(self._queues.values())

    def _serve(self, h: _Handler) -> None:
        h.queue = self._open_engine(self.queue_name(h.kind))
        h.pump_pending = False

        def ask_pump() -> None:  # looks up _pump at each call: the loop's current one
            self._opened_loop().call_soon_threadsafe(self._pump, h.kind)

        h.waiter = threading.Thread(
            target=h.wait_loop,
            args=(h.stop, ask_pump, self._store.where),
            name=f"ringq.aio waiter {h.kind}",
            daemon=True,
        )
        h.waiter.start()

    # -- submitting -----------------------------------------------------------------------------

    def submit(
        self,
        kind: str,
        payload: Any = None,
        *,
        id: str | None = None,
        delay: float = 0.0,
        timeout: float | None = None,
        depends_on: Any = None,
        allow_failure: bool = False,
        debounce: float | None = None,
        replace: bool = False,
    ) -> str:
        """Store a job durably and start it; returns its id.  Not a coroutine.

        From the loop's thread the job starts on the loop at once (``await asyncio.sleep(0)`` lets
        a handler that does not wait finish).  Safe from any other thread too: the job is durable
        when this returns and the loop starts it on its next iteration.

        Args:
            kind: which handler runs it.  A kind with no handler in this process waits for a
                process that has one.
            payload: a JSON value.
            id: an idempotency key: if a job with this id is retained, nothing is stored and its
                id is returned.  An id may not start with ``"~after:"`` (ValueError).
            delay: seconds before the job may start.
            timeout: seconds one run of this job may take; it wins over its handler's ``timeout``
                (the run is cancelled and fails as a handler timeout does).  Stored with the job.
            depends_on: jobs (ids or :class:`Job` snapshots, of any kind) this one waits for: it
                stays RUNNING without starting until every one of them is DONE, then starts once.
                One that FAILED (or was cancelled) fails it, with ``"Cancelled: parent job 'ID'
                failed"``, and its own dependents in turn, unless ``allow_failure``: then it
                starts once every parent finished, either way.  A parent already finished
                counts as it ended; a pruned one as DONE.  It starts within a few milliseconds
                of its last parent finishing in the same process, and within
                ``ringq.aio.gates.POLL_MAX`` (5 s) of one finishing in another
                (ringq/aio/gates.py).
            debounce: with ``id``: seconds.  While job ``id`` waits to start (queued, delayed,
                waiting for its parents, or for a retry), this submit *replaces* it -- this
                payload and these arguments, started ``debounce`` seconds from now -- so a burst
                of submits runs once, after the burst, with the last payload.  Once it has
                finished nothing is stored (as without ``debounce``); while it runs, the
                replacement takes the place of a retry, and is dropped if the run finishes.
                ``replace=True``: the same, started after ``delay``.  The kind must be that of
                the job replaced (ValueError).

        With ``ringq[otel]`` installed the trace context current here is stored with the job and
        its handler runs in a span that continues it (docs/operations.md, "Traces").

        Raises:
            QueueClosedError (not open), SerializationError (payload not JSON), RecordTooLargeError
            (the record exceeds ``max_record_bytes``, on either backend), ValueError,
            JobNotFoundError (a parent was never submitted: nothing stored),
            ConnectionLostError (Redis unreachable: the job may or may not be stored; pass an ``id``
            to make a retry safe).
        """
        self._check_open()
        if id is not None:
            if not isinstance(id, str) or not id:
                raise ValueError(f"id must be a non-empty string, got {id!r}")
            if id.startswith(gates.GATE_PREFIX):
                raise ValueError(f"job ids starting with {gates.GATE_PREFIX!r} are reserved")
        job_id = id if id is not None else uuid.uuid4().hex
        parents = gates.parent_ids(depends_on, job_id)
        check_allow_failure(allow_failure, parents)
        wait = check_replace(debounce, replace, id, delay, None)
        if id is not None:
            found = self._locate(id)
            if isinstance(found, Job) and wait is not None and found.status is Status.RUNNING:
                if found.kind != kind:
                    raise ValueError(
                        f"job {id!r} is of kind {found.kind!r}: a replacement keeps the kind"
                    )
            elif found is not None:
                return id
        for pid in parents or ():
            if self._locate(pid) is None:
                raise JobNotFoundError(f"no job {pid!r} in aio queue {self.name!r} to depend on")
        q = self._open_engine(self.queue_name(kind))
        rec = {"kind": kind, "payload": payload}
        try:
            self._check_record_size(q.name, rec, job_id)
        except SerializationError as exc:
            raise _as_submitted(exc) from None
        gate_ids = None
        if parents is not None:
            self._gated.add(q.name)
            gate_ids = [gates.GATE_PREFIX + pid for pid in parents]
            q.enqueue_many(  # idempotent by id: a gate another dependent made is kept
                [gates.gate_record(pid) for pid in parents],
                job_ids=gate_ids,
                priority=gates.GATE_PRIORITY,
            )
        try:
            q.enqueue(
                rec,
                job_id=job_id,
                delay=delay if wait is None else 0.0,
                timeout=timeout,
                depends_on=gate_ids,
                allow_failure=allow_failure,
                debounce=wait,
            )
        except SerializationError as exc:
            raise _as_submitted(exc) from None
        if wait is not None:
            delay = wait
        loop = self._opened_loop()
        if threading.get_ident() == self._loop_thread:
            self._pump(kind)
        else:
            loop.call_soon_threadsafe(self._pump, kind)
        if delay > 0:
            loop.call_soon_threadsafe(loop.call_later, delay, self._pump, kind)
        return job_id

    def _nudge(self, job_id: str) -> None:
        """Job ``job_id`` finished: its gates in the queues this process gates look now."""
        if self._gated:
            with self._qlock:
                queues = [self._queues[n] for n in self._gated if n in self._queues]
            gates.nudge(queues, job_id)

    # -- reading --------------------------------------------------------------------------------

    def get(self, id: str) -> Job | None:
        """A snapshot of job ``id``, or None if there is none (never submitted, or pruned)."""
        self._check_open()
        found = self._locate(id)
        return found if isinstance(found, Job) else None

    def running(self) -> list[Job]:
        """Unfinished jobs of every kind, including interrupted ones awaiting a rerun, oldest first."""
        self._check_open()
        return aio_job.unfinished_jobs(self._results, self._kind_queues(), self._prefix)

    def _locate(self, job_id: str) -> Job | object | None:
        """The job as a snapshot, aio_job.PRUNED if it finished and was pruned, None if unknown."""
        return aio_job.locate(self._results, self._kind_queues, job_id, self._prefix)

    # -- running --------------------------------------------------------------------------------

    def _pump(self, kind: str) -> None:
        """Loop thread: lease jobs of ``kind`` while there is free capacity, and start them."""
        h = self._handlers.get(kind)
        if h is None:
            return
        # First: a pump skipped while closing must not silence the next session.
        h.pump_pending = False
        if h.queue is None or self._closing:
            return
        started = 0
        while (free := min(h.free(), LEASE_BATCH)) > 0:
            try:
                jobs = h.queue.lease(free, visibility_timeout=self.visibility_timeout)
            except RingqError as exc:  # damage, a lost connection: keep serving what is sound
                log.error("leasing %r jobs at %s failed: %s", kind, self._store.where, exc)
                return
            for ej in jobs:
                task = self._opened_loop().create_task(
                    self._run(h, ej), name=f"ringq.aio {kind} {ej.id}"
                )
                h.running[(ej.id, ej.lease_token)] = (task, ej)
            started += len(jobs)
            if len(jobs) < free:
                return
            if started >= 4 * LEASE_BATCH:  # let the loop breathe; carry on next iteration
                self._opened_loop().call_soon(self._pump, kind)
                return

    async def _run(self, h: _Handler, ej: _EngineJob) -> None:
        key = (ej.id, ej.lease_token)
        q = h.queue
        try:
            parent = gates.parent_of(ej)
            if parent is not None:  # a gate: settled, never run (ringq/aio/gates.py)
                self._gated.add(q.name)
                gates.settle(q, ej, self._locate(parent))
                return
            job = aio_job.unfinished(ej, *aio_job.decode(ej, q.name, self._prefix))
            if (
                aio_job.find_result(self._results, ej.id) is not None
            ):  # finished before: a crash came before its ack
                self._nudge(ej.id)
                _ack(q, ej)
                return
            if ej.attempts > max(self.max_attempts, h.retries + 1):
                self._finish(
                    q,
                    ej,
                    job,
                    Status.FAILED,
                    None,
                    f"GaveUp: started {ej.attempts - 1} times without finishing; last: {ej.last_error}",
                )
                return
            with tracing.processing(q.name, ej, lambda: q.first_attempt_trace(ej)) as span:
                result, error = await _call_handler(h, job, ej.timeout)
                if error is not None:
                    tracing.failed(span, error)
                    if ej.attempts == 1 and (tp := tracing.traceparent_of(span)) is not None:
                        _quietly(q.trace_first_attempt, ej, tp)
            if error is not None and ej.attempts <= h.retries:
                wait = h.backoff.delay_for(ej.attempts)
                log.info("job %s (%s) failed, retrying in %.3g s: %s", ej.id, job.kind, wait, error)
                _release(q, ej, error, wait)
                self._opened_loop().call_later(wait, self._pump, h.kind)
                return
            if error is not None:
                log.warning("job %s (%s) failed: %s", ej.id, job.kind, error)
            self._finish(q, ej, job, Status.DONE if error is None else Status.FAILED, result, error)
        except RingqError as exc:  # storing the outcome failed (disk full, connection lost, ...)
            log.error(
                "job %s: could not store its outcome (%s); it runs again after a delay", ej.id, exc
            )
            _quietly(
                _release, q, ej, f"{type(exc).__name__}: storing the outcome failed: {exc}", 1.0
            )
        except asyncio.CancelledError:
            if key in self._cancelling and not self._closing:  # Queue.cancel asked for it
                task = asyncio.current_task()
                assert task is not None  # _run always runs as a task (_pump's create_task)
                task.uncancel()
                self._finish(q, ej, job, Status.FAILED, None, CANCELLED_ERROR)
                return
            if key not in self._lost:  # interrupted (closing): let the job run again, anywhere
                _quietly(_release, q, ej, "Interrupted: the queue was closed while the handler ran")
            raise
        finally:
            h.running.pop(key, None)
            self._lost.discard(key)
            self._cancelling.discard(key)
            if not self._closing:
                self._opened_loop().call_soon(self._pump, h.kind)

    def _finish(
        self, q: Any, ej: _EngineJob, job: Job, status: Status, result: Any, error: str | None
    ) -> None:
        try:  # fencing: a stale holder must not record a result
            q.extend(ej, self.visibility_timeout)
        except (NotLeasedError, JobNotFoundError):
            log.warning(
                "job %s: lease lost before its result was stored; the job runs again elsewhere",
                ej.id,
            )
            return
        rec = aio_job.result_record(ej, job, status, result, error)
        try:
            self._check_record_size(self._results.name, rec, job.id)
            self._results.enqueue(rec, job_id=job.id)
        except SerializationError as exc:  # the result is not JSON, or too large
            rec.update(
                status=Status.FAILED.value,
                result=None,
                error=f"{type(exc).__name__}: handler result: {exc}",
            )
            self._results.enqueue(rec, job_id=job.id)
        self._nudge(job.id)
        _ack(q, ej)

    def _check_record_size(self, qname: str, rec: Any, job_id: str) -> None:
        """Raise RecordTooLargeError if ``rec`` exceeds ``max_record_bytes`` on a backend whose
        engine queues do not refuse it themselves (Redis), as a directory's would."""
        if self._store.checks_record_size:
            return
        codec_id, data = codec.encode(rec)
        records.check_sizes(
            [records.NewRecord(data, codec_id, job_id.encode("utf-8", "strict"))],
            self.max_record_bytes,
            qname,
        )

    # -- retention ------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"ringq.aio.Queue({self._store.where!r}, name={self.name!r})"


def _as_submitted(exc: SerializationError) -> SerializationError:
    """``exc`` naming the caller's payload as ``payload``, not as the field of the record it is
    stored in (``payload['payload']``)."""
    return type(exc)(str(exc).replace("payload['payload']", "payload"))


def _check_settings(
    name: Any, visibility_timeout: Any, keep_seconds: Any, keep_jobs: Any, max_attempts: Any
) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"aio queue name must match [A-Za-z0-9_]{{1,20}}, got {name!r}")
    check_visibility_timeout(visibility_timeout)
    if keep_seconds is not None:
        check_seconds(keep_seconds, "keep_seconds", zero=True)
    if keep_jobs is not None:
        check_count(keep_jobs, "keep_jobs")
    check_count(max_attempts, "max_attempts", 1, ENGINE_MAX_ATTEMPTS - 1)


def _sweep_default(keep_seconds: float | None) -> float:
    """Seconds between retention sweeps: a tenth of ``keep_seconds``, between 0.05 and 60."""
    return 60.0 if keep_seconds is None else min(60.0, max(0.05, keep_seconds / 10))


def _check_handler(concurrency: Any, retries: Any, timeout: Any) -> None:
    if concurrency is not None:
        check_count(concurrency, "concurrency", 1)
    check_count(retries, "retries", 0, ENGINE_MAX_ATTEMPTS - 2)
    timeout_ms(timeout)  # None, or seconds > 0 up to MAX_TIMEOUT: ValueError


async def _heartbeat(
    handlers: dict[str, _Handler], vt: float, lost: set[_RunKey], cancelling: set[_RunKey]
) -> None:
    """Every ``vt / 3`` seconds extend the leases of running handlers by ``vt``; cancel a handler
    whose lease was lost (adding its key to ``lost``, so its job is not released again), or whose
    job's cancel was requested (adding its key to ``cancelling``: it ends FAILED, cancelled)."""
    while True:
        await asyncio.sleep(max(0.02, vt / 3))
        for h in list(handlers.values()):
            for key, (task, ej) in list(h.running.items()):
                try:
                    ext = h.queue.extend(ej, vt)
                    if getattr(ext, "cancel_requested", False) and key not in cancelling:
                        cancelling.add(key)
                        task.cancel()
                except (NotLeasedError, JobNotFoundError):
                    log.warning(
                        "job %s: lease lost (this process was stuck longer than the visibility "
                        "timeout); cancelling its handler here",
                        ej.id,
                    )
                    lost.add(key)
                    task.cancel()
                except RingqError as exc:  # a dropped connection: the next beat tries again
                    log.warning("job %s: extending its lease failed: %s", ej.id, exc)


async def _call_handler(
    h: _Handler, job: Job, own_timeout: float | None = None
) -> tuple[Any, str | None]:
    """Run ``h``'s handler on ``job`` under its timeout (the job's own, ``own_timeout``, wins over
    the handler's): (result, None), or (None, error text)."""
    limit = own_timeout if own_timeout is not None else h.timeout
    try:
        async with asyncio.timeout(limit) as deadline:
            if inspect.iscoroutinefunction(h.fn):
                return await h.fn(job), None
            return await asyncio.to_thread(h.fn, job), None
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the handler's failure is data, not ours
        if limit is not None and deadline.expired():
            return (
                None,
                f"TimeoutError: handler for {job.kind!r} did not finish within {limit:g} s",
            )
        return None, f"{type(exc).__name__}: {exc}"


def _ack(q: Any, ej: _EngineJob) -> None:
    try:
        q.ack(ej)
    except (NotLeasedError, JobNotFoundError):
        pass  # reclaimed meanwhile: its result is stored, so the rerun only acks


def _release(q: Any, ej: _EngineJob, error: str, delay: float = 0.0) -> None:
    """Nack ``ej`` so it runs again after ``delay`` seconds; a lease already lost is someone else's."""
    try:
        q.nack(ej, error=error, delay=delay)
    except (NotLeasedError, JobNotFoundError):
        pass


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn`` where a failure must not stop closing or releasing: the job's lease then expires."""
    try:
        fn(*args)
    except RingqError as exc:
        log.warning(
            "%s failed: %s; the job runs again after its visibility timeout", fn.__name__, exc
        )
