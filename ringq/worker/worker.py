"""Worker: lease jobs, run a handler, ack on return, nack on exception.

Threads lease with blocking waits (futex wake-ups, not sleeps), a heartbeat thread extends the
leases of handlers still running so a slow healthy handler is not redelivered, and ``stop()``,
SIGINT or SIGTERM let in-flight handlers finish and ack before ``run()`` returns (a second SIGINT
aborts).  ``processes=N`` runs N worker processes, each opening the queue itself (a forked child
must never share its parent's lock or owner identity) with ``concurrency`` threads.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ringq.backend import FEATURE_SCHEDULES, QueueBackend
from ringq.errors import JobNotFoundError, NotLeasedError, QueueClosedError
from ringq.job import Job, JobState

from .processes import ProcessPool, WorkerStats

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("ringq.worker")

# While leasing keeps failing (the Redis server is down, the disk is unreadable), each thread retries
# after an exponential backoff from LEASE_RETRY_MIN to LEASE_RETRY_MAX seconds, and the worker logs
# the first failure, then at most one line every LEASE_LOG_EVERY seconds, then one on recovery:
# an outage costs a few log lines, not one traceback per thread per poll.
LEASE_RETRY_MIN = 0.05
LEASE_RETRY_MAX = 1.0
LEASE_LOG_EVERY = 5.0


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

    Periodic jobs (:meth:`ringq.Queue.schedule`) are fired by every Worker of a local queue: each
    lease-loop iteration reads the earliest next tick (one load from shared memory), fires what is
    due, and waits for a lease no longer than until the next tick.  However many workers serve
    the queue, each tick enqueues one job (docs/schedules.md).

    Raises:
        ValueError: concurrency < 1, processes < 0, heartbeat <= 0, max_restarts < 0,
            metrics_port not an int from 0 to 65535.
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
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if processes < 0:
            raise ValueError(f"processes must be >= 0, got {processes}")
        if metrics_port is not None and (
            isinstance(metrics_port, bool)
            or not isinstance(metrics_port, int)
            or not 0 <= metrics_port <= 65535
        ):
            raise ValueError(f"metrics_port must be a TCP port 0..65535, got {metrics_port!r}")
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.max_jobs = max_jobs
        self.idle_timeout = idle_timeout
        self.handle_signals = handle_signals
        self.heartbeat = heartbeat if heartbeat is not None else queue.visibility_timeout / 3
        if not self.heartbeat > 0:
            raise ValueError(f"heartbeat must be > 0 seconds, got {self.heartbeat!r}")
        self.processes = processes
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        self.max_restarts = max_restarts
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

    def stop(self) -> None:
        """Ask the worker to finish in-flight handlers, ack them, and return from ``run()``."""
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
            threads = [
                threading.Thread(target=self._loop, name=f"ringq-worker-{i}", daemon=True)
                for i in range(self.concurrency)
            ]
            beat = threading.Thread(
                target=self._heartbeat_loop, name="ringq-heartbeat", daemon=True
            )
            for t in threads:
                t.start()
            beat.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.1)  # a timed join keeps the main thread responsive to signals
            self._stop.set()
            self._drained.set()
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

    def _loop(self) -> None:
        retry = LEASE_RETRY_MIN
        while not self._stop.is_set():
            jobs = None
            try:
                wait = self._fire_schedules() if self._schedules else self.poll_interval
                # A stream of leases (QueueBackend.consume): leases not handed to a handler when
                # it ends (stopping, max_jobs, a periodic job due) go back to the queue unused.
                jobs = self.queue.consume(wait=wait, stop=self._stop)
                until = time.monotonic() + wait  # back to the periodic jobs at least this often
                got = False
                while True:
                    if not self._reserve():  # max_jobs: what the stream holds goes back
                        self._stop.set()
                        return
                    job = next(jobs, None)
                    if job is None:
                        self._unreserve()
                        break
                    got = True
                    if self._lease_outage is not None:
                        self._lease_recovered()
                    self.stats.add(leased=1)
                    self._run_one(job)
                    if self._schedules and time.monotonic() >= until:
                        break
            except QueueClosedError:
                self._stop.set()
                return
            except Exception as exc:  # keep serving: a transient failure (EMFILE, lock timeout) must not end the thread
                self._lease_failed(exc)
                self._stop.wait(retry)
                retry = min(LEASE_RETRY_MAX, retry * 2)
                continue
            finally:
                if jobs is not None:
                    jobs.close()
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

    def _run_one(self, job: Job) -> None:
        key = threading.get_ident()
        # Set by the heartbeat when Queue.cancel asks this job's holder to stop (docs/lifecycle.md).
        job.cancelled = threading.Event()
        with self._inflight_lock:
            self._inflight[key] = job
            self._last_busy = time.monotonic()
        started = time.monotonic()
        try:
            try:
                self.handler(job)
            except BaseException as exc:  # the handler's failure is data, not ours
                self._finished_handler(key)
                self._observe("failed", time.monotonic() - started)
                self._fail(job, exc)
                if not isinstance(exc, Exception):  # SystemExit and the like: nack, then stop
                    self._stop.set()
            else:
                self._finished_handler(key)
                self._observe("succeeded", time.monotonic() - started)
                self._settle(self.queue.ack, job, succeeded=1)
        finally:
            with self._inflight_lock:
                self._inflight.pop(key, None)
                self._last_busy = time.monotonic()

    def _finished_handler(self, key: int) -> None:
        # No more beats for this job: its ack or nack follows, and a beat racing it would fail
        # on a job that is no longer leased -- an outcome, not a lost lease.
        with self._inflight_lock:
            if key in self._inflight:
                self._inflight[key] = None

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

    def _settle(self, op: Callable[[Job], Any], job: Job, **count: int) -> Any:
        """Run ack/nack; a lost lease or a queue error is counted and logged, never raised."""
        try:
            result = op(job)
        except (NotLeasedError, JobNotFoundError) as exc:  # expired, reclaimed, purged or retired
            self.stats.add(lost_leases=1)
            log.warning("job %s: %s", job.id, exc)
            return None
        except QueueClosedError:
            return None
        except Exception:
            self.stats.add(lost_leases=1)
            log.exception("job %s: could not record its outcome", job.id)
            return None
        self.stats.add(**count)
        return result

    def _fail(self, job: Job, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        result = self._settle(lambda j: self.queue.nack(j, error=text), job, failed=1)
        if result is not None:
            # The traceback is for whoever asked for debug output (`ringq work -v`); the one-line
            # warning is always there.
            log.warning(
                "job %s failed (attempt %d of %d): %s",
                job.id,
                job.attempts,
                job.max_attempts,
                text,
                exc_info=exc if log.isEnabledFor(logging.DEBUG) else None,
            )
            if result.state is JobState.DEAD:
                self.stats.add(dead=1)
                # nobroker's Worker logs this line too; a program that watches for it keeps working.
                log.error(
                    "job %s exhausted %d attempts and moved to the DLQ", job.id, result.max_attempts
                )

    def _heartbeat_loop(self) -> None:
        # Beats until every handler thread has returned, so that handlers still running after
        # stop() keep their leases while they finish.
        while not self._drained.wait(self.heartbeat):
            self._beat()

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
