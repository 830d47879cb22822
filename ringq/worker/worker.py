"""Worker: lease jobs, run a handler, ack on return, nack on exception.

Threads lease with blocking waits (futex wake-ups, not sleeps), a heartbeat thread extends the
leases of handlers still running so a slow healthy handler is not redelivered, and ``stop()``,
SIGINT or SIGTERM stop leasing at once and let in-flight handlers finish and ack within ``grace``
seconds; what still runs then is handed back for immediate redelivery and ``run()`` returns (a
second SIGINT aborts).  A hard ``timeout`` (the job's own, or the Worker's) ends an attempt that
runs too long: in a thread its ``job.cancelled`` is set and its lease given up, in processes mode
its child process is killed and replaced.  ``processes=N`` runs N worker processes, each opening
the queue itself (a forked child must never share its parent's lock or owner identity) with
``concurrency`` threads.  With ``ringq[otel]`` each handler runs in an OpenTelemetry span
(ringq/tracing.py).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from ringq import tracing
from ringq.backend import (
    FEATURE_SCHEDULES,
    QueueBackend,
    check_count,
    check_port,
    check_seconds,
    timeout_ms,
)
from ringq.errors import JobNotFoundError, NotLeasedError, QueueClosedError
from ringq.job import Job, JobState

from .board import Board
from .cancelled import CancelEvent
from .processes import ProcessPool, WorkerStats, log_failure, timeout_error

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("ringq.worker")

# While leasing keeps failing (the Redis server is down, the disk is unreadable), each thread retries
# after an exponential backoff from LEASE_RETRY_MIN to LEASE_RETRY_MAX seconds, and the worker logs
# the first failure, then at most one line every LEASE_LOG_EVERY seconds, then one on recovery:
# an outage costs a few log lines, not one traceback per thread per poll.
LEASE_RETRY_MIN = 0.05
LEASE_RETRY_MAX = 1.0
LEASE_LOG_EVERY = 5.0


class _Stream:
    """A lease-loop thread's stream of leases (``QueueBackend.consume``), which another thread may
    close when it gives up that thread's handler: closing returns the leases the stream holds and
    has not handed out (a local queue leases in batches) to the queue unused, instead of leaving
    them leased by a thread that may never come back for them."""

    __slots__ = ("jobs", "lock")

    def __init__(self, jobs: Generator[Job, None, None]) -> None:
        self.jobs = jobs
        self.lock = threading.Lock()  # next() and close() never run at once

    def next(self) -> Job | None:
        with self.lock:
            return next(self.jobs, None)  # None once closed

    def close(self) -> None:
        with self.lock:
            self.jobs.close()

    def close_if_idle(self) -> None:
        """Close it unless its thread is inside ``next`` right now (then that thread is not stuck
        in a handler, and closes it itself)."""
        if self.lock.acquire(blocking=False):
            try:
                self.jobs.close()
            finally:
                self.lock.release()


MAX_THREADS = 4096  # handler threads per process: each is an OS thread and its stack
MAX_PROCESSES = 1024  # worker processes of one Worker


class Worker:
    """Run ``handler(job)`` for jobs leased from ``queue``.

    The first seven parameters may be given by position, in nobroker's order (its Worker is a
    dataclass): ``Worker(queue, handler, 4)`` runs four threads.

    Args:
        queue: a :class:`ringq.Queue` or a Redis queue from :func:`ringq.connect`.
        handler: callable taking a :class:`Job`; its return acks, an exception nacks with
            ``"ExceptionType: message"`` as ``last_error``.
            The job's ``cancelled`` attribute is a ``threading.Event`` that the heartbeat sets
            when :meth:`Queue.cancel` asks for the job to stop (seen within one heartbeat); a
            handler that checks it and returns ends the job CANCELLED (docs/lifecycle.md).
        concurrency: handler threads (per process).
        poll_interval: seconds; the longest a thread sleeps before re-checking ``stop()`` when
            idle.  Wake-ups for new jobs come from the producer's futex wake, not from polling.
        max_jobs: stop after leasing this many jobs (per process in process mode).
        idle_timeout: stop after this many seconds in which no handler ran (none running, none
            started or finished).
        handle_signals: install SIGINT/SIGTERM handlers while ``run()`` runs (main thread only).
        heartbeat: seconds between lease extensions of running handlers (default: a third of
            the queue's visibility timeout).  Each beat moves a running handler's lease deadline
            to now + the visibility timeout (never further), so a worker process that stops
            beating (suspended, or stuck holding the GIL) loses its leases one visibility timeout
            after its last beat.  A handler thread stuck while its process runs keeps its lease.
        processes: 0 runs in this process; N >= 1 runs N child processes (forked; each opens
            the queue itself and runs ``concurrency`` threads; ``max_jobs`` and
            ``idle_timeout`` apply to each process).  A child that dies of a signal or exits
            with an error is replaced by a new one (which gets what its predecessor had left of
            ``max_jobs``), at most ``max_restarts`` times per ``run()`` in all; ``restarts`` says
            how many.  Children count their work in shared memory as they go, so ``run()``'s
            stats include what a killed child finished (its in-flight jobs come back to the
            queue and are counted by whoever runs them again).
        max_restarts: the restart budget of ``processes`` mode (default 10; 0 never replaces).
        metrics_port: serve Prometheus metrics (the queue's and this worker's: leases, outcomes,
            handler seconds) at ``http://127.0.0.1:PORT/metrics`` while ``run()`` runs; 0 picks a
            free port (``metrics_address`` says which).  Needs ``ringq[metrics]``.  With
            ``processes=N`` the counters are the children's sums; handler seconds are observed
            only by in-process threads.
        progress: show live progress (done, failed, rate) on stderr: True, False, or None (the
            default) for "when stderr is a terminal".  Needs ``ringq[progress]`` (rich).
        timeout: seconds one attempt of a handler may run (default None: no limit).  A job's own
            ``enqueue(..., timeout=)`` wins over it.  Past it the job is nacked with error
            ``"timeout after N s"`` (retried with backoff, or dead-lettered, as any failure):
            with ``processes=N`` its child process is killed and replaced first (the child's
            other running jobs are handed back for immediate redelivery); in this process the
            handler's ``job.cancelled`` is set and the lease given up at the deadline, but the
            thread cannot be killed: it runs on until the handler returns (its outcome is then
            ignored), and a new thread takes its place (at most ``concurrency`` such threads at
            once), so a handler should check ``job.cancelled``.
        grace: seconds in-flight handlers may take to finish after ``stop()``, SIGTERM or SIGINT
            (default 30).  Leasing stops at once; a handler still running after ``grace`` has its
            job handed back (nacked with no delay, so another worker runs it at once rather than
            after the visibility timeout; the attempt counts, as a holder's death does) and
            ``run()`` returns.  With ``processes=N`` a child still alive a few seconds after its
            own grace ran out is killed and its jobs handed back by the parent.

    Periodic jobs (:meth:`ringq.Queue.schedule`) are fired by every Worker of a local queue: each
    lease-loop iteration reads the earliest next tick (one load from shared memory), fires what is
    due, and waits for a lease no longer than until the next tick.  However many workers serve
    the queue, each tick enqueues one job (docs/schedules.md).

    Raises:
        ValueError: concurrency (at most 4096) or max_jobs not an int >= 1, processes (at
            most 1024) or max_restarts not an int >= 0, heartbeat or poll_interval not a number of seconds > 0, idle_timeout or
            grace not one >= 0 (NaN and inf are not), metrics_port not an int from 0 to 65535,
            timeout not > 0.
    """

    def __init__(
        self,
        queue: QueueBackend,
        handler: Callable[[Job], Any],
        concurrency: int = 1,
        poll_interval: float = 0.1,
        max_jobs: int | None = None,
        idle_timeout: float | None = None,
        handle_signals: bool = True,
        *,
        heartbeat: float | None = None,
        processes: int = 0,
        max_restarts: int = 10,
        metrics_port: int | None = None,
        progress: bool | None = None,
        timeout: float | None = None,
        grace: float = 30.0,
    ) -> None:
        self.concurrency = check_count(concurrency, "concurrency", 1, MAX_THREADS)
        self.processes = check_count(processes, "processes", 0, MAX_PROCESSES)
        if metrics_port is not None:
            check_port(metrics_port, "metrics_port")
        timeout_ms(timeout)  # validates: ValueError
        self.timeout = None if timeout is None else float(timeout)
        self.grace = check_seconds(grace, "grace", zero=True)
        self.queue = queue
        self.handler = handler
        self.poll_interval = check_seconds(poll_interval, "poll_interval")
        self.max_jobs = None if max_jobs is None else check_count(max_jobs, "max_jobs", 1)
        self.idle_timeout = (
            None if idle_timeout is None else check_seconds(idle_timeout, "idle_timeout", zero=True)
        )
        self.handle_signals = handle_signals
        self.heartbeat = check_seconds(
            heartbeat if heartbeat is not None else queue.visibility_timeout / 3, "heartbeat"
        )
        self.max_restarts = check_count(max_restarts, "max_restarts")
        self.restarts = 0  # children replaced during the last run()
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._drained = threading.Event()  # every handler thread has returned: heartbeats end
        # thread ident -> the job its handler runs (None once its lease is known to be lost)
        self._inflight: dict[int, Job | None] = {}
        self._inflight_lock = threading.Lock()
        self._last_busy = time.monotonic()
        self._taken = 0
        self._taken_lock = threading.Lock()
        self._signals = 0
        self.metrics_port = metrics_port
        self.metrics_address: tuple[str, int] | None = None  # where metrics are served during run()
        self.progress = progress
        self.pool: ProcessPool | None = None  # processes mode: the children of the last run()
        # Called after each handler returns or raises, with ("succeeded" | "failed", seconds).
        self.observers: list[Callable[[str, float], None]] = []
        # Periodic jobs (docs/schedules.md): fired from the lease loop of a local queue.
        self._schedules = FEATURE_SCHEDULES in queue.features
        self._schedule_error_logged = -math.inf
        # Lease failures shared by the threads: (monotonic time of the first, of the last log line, count)
        self._lease_outage: tuple[float, float, int] | None = None
        self._lease_outage_lock = threading.Lock()
        # processes mode, in a child: the parent's board of running jobs and this child's slot
        # there (ringq/worker/board.py); the parent then enforces timeouts by killing the child.
        self.inflight_board: tuple[Board, int] | None = None
        self._stop_at: float | None = None  # monotonic time stop() was first asked for
        # thread key -> (monotonic deadline, job, timeout seconds, loop index) of handlers with a
        # timeout
        self._deadlines: dict[int, tuple[float, Job, float, int]] = {}
        # thread key -> whether another thread replaced it: handlers whose job was given up
        # (timed out, or handed back at the end of a drain), whose outcome is then ignored
        self._given_up: dict[int, bool] = {}
        # Each lease-loop thread's current stream, by thread ident (under _inflight_lock).
        self._streams: dict[int, _Stream] = {}
        self._spans: dict[int, Any] = {}  # thread key -> the span its handler runs in
        self._serving: list[threading.Thread] = []  # loop threads run() waits for
        self._abandoned = 0  # threads still running a timed-out handler, replaced by others
        self._wake = threading.Event()  # wakes the heartbeat thread: a deadline was added

    def stop(self) -> None:
        """Stop leasing now; let in-flight handlers finish and ack within ``grace`` seconds, hand
        back what still runs then, and return from ``run()``."""
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        self._stop.set()
        if self.pool is not None:
            self.pool.signal_children()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> WorkerStats:
        """Work until stopped, ``max_jobs`` reached or ``idle_timeout`` passed; returns the stats."""
        restore = self._install_signals()
        from .progress import attach  # metrics endpoint and progress display, for this run only

        detach = attach(self)
        try:
            if self.processes:
                opts = dict(
                    concurrency=self.concurrency,
                    poll_interval=self.poll_interval,
                    max_jobs=self.max_jobs,
                    idle_timeout=self.idle_timeout,
                    heartbeat=self.heartbeat,
                    timeout=self.timeout,
                    grace=self.grace,
                )
                handler = self.handler
                self.pool = ProcessPool(
                    self.queue,
                    self.processes,
                    self.max_restarts,
                    opts,
                    self._stop,
                    lambda q, o: Worker(q, handler, handle_signals=False, progress=False, **o),
                )
                try:
                    return self.pool.run(self.stats)
                finally:
                    self.restarts = self.pool.restarts
            self._last_busy = time.monotonic()
            beat = threading.Thread(
                target=self._heartbeat_loop, name="ringq-heartbeat", daemon=True
            )
            for i in range(self.concurrency):
                self._start_loop(i)
            beat.start()
            while True:
                with self._inflight_lock:
                    alive = [t for t in self._serving if t.is_alive()]
                if not alive:
                    break
                at = self._stop_at
                if at is not None and time.monotonic() - at >= self.grace:
                    self._hand_back_running()
                    break
                alive[0].join(0.05)  # a timed join keeps the main thread responsive to signals
            self._stop.set()
            self._drained.set()
            self._wake.set()
            beat.join()
            return self.stats
        finally:
            detach()
            restore()

    # -- threads ----------------------------------------------------------------------------------

    def _reserve(self) -> bool:
        with self._taken_lock:
            if self.max_jobs is not None and self._taken >= self.max_jobs:
                return False
            self._taken += 1
            return True

    def _unreserve(self) -> None:
        with self._taken_lock:
            self._taken -= 1

    def _start_loop(self, index: int, replacing: int | None = None) -> None:
        """Start lease-loop thread number ``index``; ``replacing``: the ident of the stuck thread
        it takes the place of, swapped for it in one step (run() ends when no serving thread is
        left, and must never see the list between the two)."""
        t = threading.Thread(
            target=self._loop, args=(index,), name=f"ringq-worker-{index}", daemon=True
        )
        with self._inflight_lock:
            if replacing is not None:
                self._serving = [s for s in self._serving if s.ident != replacing]
            self._serving.append(t)
            t.start()  # under the lock: run() never sees a serving thread that has not started

    def _loop(self, index: int) -> None:
        retry = LEASE_RETRY_MIN
        key = threading.get_ident()
        while not self._stop.is_set():
            stream = None
            try:
                wait = self._fire_schedules() if self._schedules else self.poll_interval
                if self.idle_timeout is not None:  # an idle worker ends on time, not a poll later
                    wait = min(wait, max(0.001, self.idle_timeout - self._idle_for()))
                # A stream of leases (QueueBackend.consume): leases not handed to a handler when
                # it ends (stopping, max_jobs) go back to the queue unused.
                stream = _Stream(self.queue.consume(wait=wait, stop=self._stop))
                with self._inflight_lock:
                    self._streams[key] = stream
                until = time.monotonic() + wait  # back to the periodic jobs at least this often
                got = False
                while True:
                    if not self._reserve():  # max_jobs: what the stream holds goes back
                        self._stop.set()
                        return
                    job = stream.next()
                    if job is None:
                        self._unreserve()
                        break
                    got = True
                    if self._lease_outage is not None:
                        self._lease_recovered()
                    if (
                        self._stop_at is not None
                    ):  # leased as stop() came: not started, handed back now
                        self._unreserve()
                        self._release(
                            job, "worker stopping: handed back before its handler started"
                        )
                        continue
                    self.stats.one("leased")
                    if not self._run_one(job, index):
                        return  # its handler timed out and a new thread took this one's place
                    if self._schedules and time.monotonic() >= until:
                        # Periodic jobs come due while the stream runs: fired here, without
                        # ending the stream (which would hand its leased batch back).
                        until = time.monotonic() + self._fire_schedules()
            except QueueClosedError:
                self._stop.set()
                return
            except Exception as exc:  # keep serving: a transient failure (EMFILE, lock timeout) must not end the thread
                self._lease_failed(exc)
                self._stop.wait(retry)
                retry = min(LEASE_RETRY_MAX, retry * 2)
                continue
            finally:
                if stream is not None:
                    stream.close()
                    with self._inflight_lock:
                        if self._streams.get(key) is stream:
                            del self._streams[key]
            retry = LEASE_RETRY_MIN
            if self._lease_outage is not None:
                self._lease_recovered()
            if not got and self.idle_timeout is not None and self._idle_for() >= self.idle_timeout:
                self._stop.set()

    def _fire_schedules(self) -> float:
        """Fire due periodic jobs; returns how long the next lease may wait (seconds): the poll
        interval, cut short by the next tick.  A failure is logged (once a minute) and retried on
        the next iteration; jobs keep being served meanwhile."""
        try:
            due = self.queue.next_schedule_fire()  # one read of shared memory
            if due is not None and due <= 0:
                self.queue.run_schedules()
                due = self.queue.next_schedule_fire()
        except QueueClosedError:
            raise
        except Exception as exc:
            now = time.monotonic()
            if now - self._schedule_error_logged > 60:
                self._schedule_error_logged = now
                # One line (the error says what is damaged and what to do); the traceback only
                # when debugging (-v or RINGQ_DEBUG=1), since the loop retries this every poll.
                debug = log.isEnabledFor(logging.DEBUG) or bool(os.environ.get("RINGQ_DEBUG"))
                log.error(
                    "periodic jobs could not be fired (retried; logged at most once a minute): "
                    "%s: %s",
                    type(exc).__name__,
                    exc,
                    exc_info=exc if debug else None,
                )
            return self.poll_interval
        return self.poll_interval if due is None else min(self.poll_interval, max(due, 0.0) + 0.001)

    def _idle_for(self) -> float:
        """Seconds since a handler last started or finished; 0 while any handler runs."""
        with self._inflight_lock:
            if self._inflight:
                return 0.0
            return time.monotonic() - self._last_busy

    def _run_one(self, job: Job, index: int) -> bool:
        """Run the handler on ``job`` and record its outcome; False if the thread must stop
        serving (its handler timed out and another thread was started in its place)."""
        key = threading.get_ident()
        # Set by the heartbeat when Queue.cancel asks this job's holder to stop (docs/lifecycle.md),
        # and at its timeout.
        job.cancelled = CancelEvent()
        limit = job.timeout if job.timeout is not None else self.timeout
        board = self.inflight_board
        started = time.monotonic()
        with self._inflight_lock:
            self._inflight[key] = job
            self._last_busy = started
            if limit is not None and board is None:
                self._deadlines[key] = (started + limit, job, limit, index)
        if board is not None:
            board[0].start(
                board[1], index, job.id, int(job.lease_token or 0), job.attempts, timeout_ms(limit)
            )
        elif limit is not None:
            self._wake.set()  # the heartbeat thread now sleeps no longer than this deadline
        queue = self.queue
        try:
            try:
                with tracing.processing(
                    queue.name, job, lambda: queue.first_attempt_trace(job)
                ) as span:
                    if span is not None:
                        self._spans[key] = span
                    self.handler(job)
            except BaseException as exc:  # the handler's failure is data, not ours
                mine = self._finished_handler(key)
                if self.observers:
                    self._observe("failed", time.monotonic() - started)
                if mine:
                    self._note_first_attempt(job, key)
                    self._fail(job, f"{type(exc).__name__}: {exc}", exc)
                if not isinstance(exc, Exception):  # SystemExit and the like: nack, then stop
                    self._stop.set()
            else:
                mine = self._finished_handler(key)
                if self.observers:
                    self._observe("succeeded", time.monotonic() - started)
                if mine:
                    self._settle(self.queue.ack, job, "succeeded")
        finally:
            if board is not None:
                board[0].end(board[1], index)
            with self._inflight_lock:
                self._inflight.pop(key, None)
                self._deadlines.pop(key, None)
                self._spans.pop(key, None)
                self._last_busy = time.monotonic()
                replaced = self._given_up.pop(key, False)
                if replaced:
                    self._abandoned -= 1
        return not replaced

    def _finished_handler(self, key: int) -> bool:
        """The handler returned: no more beats or deadline for its job (its ack or nack follows,
        and a beat racing it would fail on a job no longer leased -- an outcome, not a lost
        lease).  False if the job was given up meanwhile (timed out, or handed back): its
        outcome was recorded then, and the handler's is ignored."""
        with self._inflight_lock:
            self._deadlines.pop(key, None)
            if key in self._given_up:
                return False
            if key in self._inflight:
                self._inflight[key] = None
            return True

    def _note_first_attempt(self, job: Job, key: int) -> None:
        """Keep the span of a failed first attempt, for the link its retry's span makes."""
        if job.attempts != 1:
            return
        tp = tracing.traceparent_of(self._spans.get(key))
        if tp is None:
            return
        try:
            self.queue.trace_first_attempt(job, tp)
        except Exception as exc:  # tracing never fails a job
            log.debug("job %s: first attempt's span not kept: %s", job.id, exc)

    def _expire_due(self) -> None:
        """Give up every handler past its deadline (thread mode): ``job.cancelled`` is set, the
        job nacked with ``"timeout after N s"``, and a new lease-loop thread started in the
        stuck one's place while fewer than ``concurrency`` are stuck."""
        now = time.monotonic()
        with self._inflight_lock:
            due = [(k, j, t, i) for k, (d, j, t, i) in self._deadlines.items() if d <= now]
            for k, _j, _t, _i in due:
                del self._deadlines[k]
                self._inflight[k] = None  # no more beats: the lease is given up below
                replace = not self._stop.is_set() and self._abandoned < self.concurrency
                self._given_up[k] = replace
                if replace:
                    self._abandoned += 1
        for k, job, limit, index in due:
            if job.cancelled is not None:
                job.cancelled.set()
            text = timeout_error(limit)
            log.warning(
                "job %s: %s; its thread cannot be killed and runs on until the handler returns",
                job.id,
                text,
            )
            self._note_first_attempt(job, k)
            self._fail(job, text, None)
            self._return_unstarted(k)
            if self._given_up.get(k):
                self._start_loop(index, replacing=k)

    def _hand_back_running(self) -> None:
        """The grace period of a drain ran out: hand back every job whose handler still runs
        (nacked with no delay and no attempt spared, for immediate redelivery elsewhere)."""
        with self._inflight_lock:
            running = [(k, j) for k, j in self._inflight.items() if j is not None]
            for k, _j in running:
                self._given_up.setdefault(k, False)
                self._inflight[k] = None
                self._deadlines.pop(k, None)
        for k, job in running:
            if job.cancelled is not None:
                job.cancelled.set()
            self._release(
                job,
                f"worker stopped: handler still running after the {self.grace:g} s grace "
                "period; handed back",
            )
            self._return_unstarted(k)

    def _return_unstarted(self, key: int) -> None:
        """The handler of thread ``key`` was given up: the leases its stream holds and has not
        handed out go back to the queue unused (their attempts not counted), rather than stay
        leased by a thread that may never ask for them; logged, never raised."""
        with self._inflight_lock:
            stream = self._streams.get(key)
        if stream is None:
            return
        try:
            stream.close_if_idle()
        except Exception:
            log.exception("the leases a given-up handler's thread held could not be given back")

    def _release(self, job: Job, why: str) -> None:
        """Hand ``job`` back for immediate redelivery (a nack with no delay); logged, never raised."""
        try:
            out = self.queue.nack(job, error=why, delay=0)
        except (NotLeasedError, JobNotFoundError, QueueClosedError) as exc:
            log.warning("job %s: not handed back: %s", job.id, exc)
            return
        except Exception:
            log.exception("job %s: could not be handed back", job.id)
            return
        if out.state is JobState.DEAD:  # its last attempt: dead-lettered, and counted so
            self.stats.one("dead")
        log.warning("job %s: %s", job.id, why)

    def _lease_failed(self, exc: BaseException) -> None:
        """Log a failed lease: the first of an outage as one warning line (the traceback at debug
        level, ``ringq work -v``), then at most one line every ``LEASE_LOG_EVERY`` seconds."""
        now = time.monotonic()
        text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        with self._lease_outage_lock:
            if self._lease_outage is None:
                self._lease_outage = (now, now, 1)
                log.warning(
                    "lease failed: %s (retrying with backoff up to %g s)",
                    text,
                    LEASE_RETRY_MAX,
                    exc_info=exc if log.isEnabledFor(logging.DEBUG) else None,
                )
                return
            first, logged, count = self._lease_outage
            count += 1
            if now - logged >= LEASE_LOG_EVERY:
                logged = now
                log.warning(
                    "lease still failing after %.1f s (%d failures): %s", now - first, count, text
                )
            self._lease_outage = (first, logged, count)

    def _lease_recovered(self) -> None:
        """Log, once, that leasing works again after an outage."""
        with self._lease_outage_lock:
            if self._lease_outage is None:
                return
            first, _logged, count = self._lease_outage
            self._lease_outage = None
        log.warning("lease works again after %.1f s (%d failures)", time.monotonic() - first, count)

    def _settle(self, op: Callable[[Job], Any], job: Job, outcome: str) -> Any:
        """Run ack/nack; counts ``outcome`` (a stats field) if it went in.  A lost lease or a
        queue error is counted and logged, never raised."""
        try:
            result = op(job)
        except (NotLeasedError, JobNotFoundError) as exc:  # expired, reclaimed, purged or retired
            self.stats.one("lost_leases")
            log.warning("job %s: %s", job.id, exc)
            return None
        except QueueClosedError:
            return None
        except Exception:
            self.stats.one("lost_leases")
            log.exception("job %s: could not record its outcome", job.id)
            return None
        self.stats.one(outcome)
        return result

    def _fail(self, job: Job, text: str, exc: BaseException | None) -> None:
        result = self._settle(lambda j: self.queue.nack(j, error=text), job, "failed")
        if result is not None:
            # The traceback is for whoever asked for debug output (`ringq work -v`); the one-line
            # warning is always there.
            log_failure(job.id, job.attempts, result, text, exc)
            if result.state is JobState.DEAD:
                self.stats.one("dead")

    def _heartbeat_loop(self) -> None:
        # Beats until every handler thread has returned, so that handlers still running after
        # stop() keep their leases while they finish; wakes at each handler's deadline too.
        next_beat = time.monotonic() + self.heartbeat
        while not self._drained.is_set():
            with self._inflight_lock:
                soonest = min((d[0] for d in self._deadlines.values()), default=math.inf)
            wait = max(0.0, min(next_beat, soonest) - time.monotonic())
            self._wake.wait(wait)
            self._wake.clear()
            if self._drained.is_set():
                return
            if self._deadlines:
                self._expire_due()
            if time.monotonic() >= next_beat:
                self._beat()
                next_beat = time.monotonic() + self.heartbeat

    def _beat(self) -> None:
        with self._inflight_lock:
            running = [(k, j) for k, j in self._inflight.items() if j is not None]
        vt = self.queue.visibility_timeout
        for key, job in running:
            # extend() pushes max(deadline, now) + seconds: ask for exactly now + vt.
            now = time.time()
            seconds = max(0.001, now + vt - max(job.lease_deadline or now, now))
            try:
                extended = self.queue.extend(job, seconds)
            except QueueClosedError:
                return
            except (
                Exception
            ) as exc:  # lost (expired, purged, reclaimed) or a queue error: stop beating it
                with self._inflight_lock:
                    racing = self._inflight.get(key) is not job
                if not racing:  # (a beat that raced its own handler's ack or nack failed by design)
                    log.warning("job %s: heartbeat failed: %s", job.id, exc)
                extended = None
            if extended is not None:
                extended.cancelled = job.cancelled
                if extended.cancel_requested and job.cancelled is not None:
                    job.cancelled.set()
            with self._inflight_lock:
                if self._inflight.get(key) is job:
                    self._inflight[key] = extended

    # -- signals ------------------------------------------------------------------------------------

    def _install_signals(self) -> Callable[[], None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_signal(signum: int, _frame: Any) -> None:
            self._signals += 1
            if signum == signal.SIGINT and self._signals > 1:
                raise KeyboardInterrupt
            self.stop()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore

    # -- live numbers (ringq/worker/progress.py, ringq/web/metrics.py) ------------------------------------------

    def live_stats(self) -> dict[str, int]:
        """What this run has done so far (``WorkerStats.to_dict()`` form); in processes mode the
        sum of the children's shared counters."""
        pool = self.pool
        live = None if pool is None else pool.live_stats()
        return self.stats.to_dict() if live is None else live

    def _observe(self, outcome: str, seconds: float) -> None:
        for fn in self.observers:
            fn(outcome, seconds)
