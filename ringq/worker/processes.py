"""Worker(processes=N): forked children that each open the queue and run a Worker, counted in
shared memory as they go, and replaced (within a restart budget) when one is killed.  The parent
also enforces hard timeouts and the end of a drain's grace period: it reads which job each
child's threads run (ringq/worker/board.py), kills a child whose job ran past its deadline (and
replaces it, outside the restart budget) or that outlived the grace period, and hands that child's
jobs back itself."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from ringq import tracing
from ringq.errors import JobNotFoundError, NotLeasedError
from ringq.job import Job, JobState

from .board import Board, Entry

if TYPE_CHECKING:  # pragma: no cover
    from ringq.backend import QueueBackend

__all__ = ["ProcessPool", "WorkerStats", "timeout_error", "KILL_MARGIN"]

log = logging.getLogger("ringq.worker")

# Seconds past its own grace period that a draining child may take to exit (handing back its jobs)
# before the parent kills it and hands them back itself.
KILL_MARGIN = 5.0


def timeout_error(seconds: float) -> str:
    """The error a job is nacked with when an attempt runs past its timeout."""
    return f"timeout after {seconds:g} s"


def log_failure(
    job_id: str, attempts: int, after: Job, text: str, exc: BaseException | None = None
) -> None:
    """The lines a failed attempt logs: ``job ID failed (attempt N of M): error`` (a warning; the
    traceback of ``exc`` at debug level), and nobroker's ``job ID exhausted M attempts and moved
    to the DLQ`` (an error) when the nack dead-lettered it (``after``: the job as the nack left
    it) -- a program that watches for that line keeps working."""
    log.warning(
        "job %s failed (attempt %d of %d): %s",
        job_id,
        attempts,
        after.max_attempts,
        text,
        exc_info=exc if exc is not None and log.isEnabledFor(logging.DEBUG) else None,
    )
    if after.state is JobState.DEAD:
        log.error("job %s exhausted %d attempts and moved to the DLQ", job_id, after.max_attempts)


@dataclass
class WorkerStats:
    """What a worker did (nobroker's fields).

    ``failed`` counts handler exceptions; ``dead`` those that dead-lettered the job;
    ``lost_leases`` acks/nacks refused because the lease was lost (expired, purged, reclaimed).
    """

    leased: int = 0
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    lost_leases: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def one(self, name: str) -> None:
        """Count one more of ``name`` (a field): what the Worker does per job."""
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def to_dict(self) -> dict[str, int]:
        return {
            "leased": self.leased,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "dead": self.dead,
            "lost_leases": self.lost_leases,
        }


class ProcessPool:
    """``Worker(processes=N)``: N forked children, each opening the queue again
    (``connect(queue.location, queue.name, **queue.reopen_options())``) and running the worker
    ``make_worker(queue, options)`` builds there with ``options`` (the parent's settings).  A child
    killed by a signal or failing is replaced while ``max_restarts`` allows; ``stop`` (the
    parent's) ends the run.  Each child counts its work in a row of shared counters as it goes."""

    def __init__(
        self,
        queue: QueueBackend,
        processes: int,
        max_restarts: int,
        options: dict[str, Any],
        stop: threading.Event,
        make_worker: Callable[[QueueBackend, dict[str, Any]], Any],
    ) -> None:
        self.queue = queue
        self.processes = processes
        self.max_restarts = max_restarts
        self.options = options
        self.stop_event = stop
        self.make_worker = make_worker
        self.restarts = 0  # children replaced during the run
        self.timeouts = 0  # children killed (and replaced) because a job ran past its timeout
        self.children: list[BaseProcess] = []
        self.rows: tuple[Any, list[str]] | None = None  # during the run: the shared counters
        self.board: Board | None = None  # during the run: what each child's threads run

    def signal_children(self) -> None:
        """Ask every running child to finish its in-flight handlers and exit (SIGTERM)."""
        for p in list(self.children):
            if p.is_alive() and p.pid is not None:  # alive: started, so it has a pid
                os.kill(p.pid, signal.SIGTERM)

    def live_stats(self) -> dict[str, int] | None:
        """The children's counters summed, while the run goes on; None outside it."""
        rows = self.rows
        if rows is None:
            return None
        shared, fields = rows
        n = len(fields)
        return {
            f: sum(shared[slot * n + i] for slot in range(len(shared) // n))
            for i, f in enumerate(fields)
        }

    def run(self, stats: WorkerStats) -> WorkerStats:
        """Run the children until every one has finished; their counts are added to ``stats``."""
        q = self.queue
        spec = dict(path=q.location, name=q.name, **q.reopen_options())
        _warm(q)
        max_jobs = self.options.get("max_jobs")
        ctx = multiprocessing.get_context("fork")
        # Each child slot has a row of counters in shared memory that its children update as they
        # go: the work of a child killed by a signal is counted up to its last finished job.
        fields = list(WorkerStats().to_dict())
        shared = ctx.Array("q", self.processes * len(fields), lock=False)
        self.rows = (shared, fields)
        board = self.board = Board(ctx, self.processes, int(self.options.get("concurrency", 1)))
        grace = float(self.options.get("grace", 30.0))
        stop_seen: float | None = None
        restarts = self.restarts = 0
        self.timeouts = 0

        def count(slot: int, **counts: int) -> None:
            for k, v in counts.items():
                shared[slot * len(fields) + fields.index(k)] += v

        def start(slot: int) -> BaseProcess:
            opts = dict(self.options)
            if max_jobs is not None:  # a replacement takes over what its slot had left
                opts["max_jobs"] = max_jobs - shared[slot * len(fields) + fields.index("leased")]
            # Children start with SIGINT/SIGTERM blocked: until they install their own handlers they
            # would run the parent's (copied by fork), or die of a SIGTERM sent by an early stop().
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                board.clear(slot)
                p = ctx.Process(
                    target=_child_main,
                    args=(spec, self.make_worker, opts, (shared, slot, fields), mask, board),
                    daemon=False,
                )
                p.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return p

        self.children = [start(i) for i in range(self.processes)]
        running = [True] * self.processes
        if self.stop_event.is_set():
            self.signal_children()
        try:
            while any(running):
                if stop_seen is None and self.stop_event.is_set():
                    stop_seen = time.monotonic()
                for slot, p in enumerate(self.children):
                    if running[slot] and p.is_alive():
                        late = self._late(slot, stop_seen, grace)
                        if late is None:
                            continue
                        replace = bool(late) and not self.stop_event.is_set()
                        self._kill_and_hand_back(p, slot, late, count)
                        if replace:
                            self.timeouts += 1
                            self.children[slot] = start(slot)
                            log.error(
                                "worker process %d killed: a job ran past its timeout; "
                                "replaced by %d",
                                p.pid,
                                self.children[slot].pid,
                            )
                        else:
                            running[slot] = False
                        continue
                    if not running[slot]:
                        continue
                    p.join()
                    running[slot] = False
                    code = p.exitcode or 0
                    if code == 0:
                        continue
                    how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
                    left = (
                        None
                        if max_jobs is None
                        else (max_jobs - shared[slot * len(fields) + fields.index("leased")])
                    )
                    if self.stop_event.is_set() or (left is not None and left <= 0):
                        log.error("worker process %d %s", p.pid, how)
                    elif restarts >= self.max_restarts:
                        log.error(
                            "worker process %d %s; not replaced: the restart budget (%d) is spent",
                            p.pid,
                            how,
                            self.max_restarts,
                        )
                    else:
                        restarts += 1
                        self.restarts = restarts
                        self.children[slot] = start(slot)
                        running[slot] = True
                        log.error(
                            "worker process %d %s; replaced by %d (restart %d of %d)",
                            p.pid,
                            how,
                            self.children[slot].pid,
                            restarts,
                            self.max_restarts,
                        )
                # Back as soon as a child exits (its sentinel is ready), else within 50 ms for the
                # deadlines and the stop event.
                alive = [p.sentinel for slot, p in enumerate(self.children) if running[slot]]
                if alive:
                    multiprocessing.connection.wait(alive, 0.05)
        except BaseException:  # a second SIGINT: abort, leaving nobody behind
            for p in self.children:
                if p.is_alive() and p.pid is not None:
                    os.kill(p.pid, signal.SIGKILL)
                p.join()
            raise
        self.restarts = restarts
        self.rows = None
        self.board = None
        for slot in range(self.processes):
            stats.add(**{f: shared[slot * len(fields) + i] for i, f in enumerate(fields)})
        return stats

    def _late(self, slot: int, stop_seen: float | None, grace: float) -> list[Entry] | None:
        """Why the child in ``slot`` must be killed now: the entries whose deadline passed (a
        timeout), ``[]`` when it outlived a drain's grace period, or None to leave it be."""
        assert self.board is not None  # during run()
        entries = self.board.read(slot)
        now_ms = int(time.time() * 1000)
        late = [e for e in entries if e.deadline_ms and e.deadline_ms <= now_ms]
        if late:
            return late
        if stop_seen is not None and time.monotonic() - stop_seen > grace + KILL_MARGIN:
            return []
        return None

    def _kill_and_hand_back(
        self, p: BaseProcess, slot: int, late: list[Entry], count: Callable[..., None]
    ) -> None:
        """Stop the child in ``slot`` and settle the jobs its threads ran: each ``late`` one
        nacked with its timeout error (retried or dead-lettered as any failure, counted as failed),
        the others handed back for immediate redelivery; the jobs it leased but had not started
        returned to READY uncharged as it is killed (``kill_and_give_back``); SIGKILL in any case.

        The child is frozen (SIGSTOP) first and killed only after the nacks: alive, it keeps its
        owner lock, so no reaper (this process's own included) reclaims its leases as a dead
        holder's in between, and frozen, it runs no more of a handler that was given up."""
        assert self.board is not None and p.pid is not None  # during run(), started
        os.kill(p.pid, signal.SIGSTOP)
        try:  # returns once it is stopped (or gone), reaping nothing: join() below does that
            os.waitid(os.P_PID, p.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        timed = {(e.job_id, e.token) for e in late}
        running = self.board.read(slot)
        for e in running:
            if e.job_id is None:
                continue  # an id too long for the board: its lease ends it (holder died)
            job = Job(id=e.job_id, payload=None, attempts=e.attempts, lease_token=str(e.token))
            if (e.job_id, e.token) in timed:
                why, delay = timeout_error(e.timeout_ms / 1000), None
            else:
                why, delay = "worker process killed while the job ran; handed back", 0.0
            try:
                out = self.queue.nack(job, error=why, delay=delay)
            except (NotLeasedError, JobNotFoundError) as exc:
                log.warning("job %s: %s", e.job_id, exc)
                continue
            except Exception:
                log.exception("job %s: could not be handed back", e.job_id)
                continue
            if (e.job_id, e.token) in timed:
                count(slot, failed=1, **({"dead": 1} if out.state is JobState.DEAD else {}))
                log_failure(e.job_id, e.attempts, out, why)
            else:
                if out.state is JobState.DEAD:  # handed back on its last attempt
                    count(slot, dead=1)
                log.warning("job %s: %s", e.job_id, why)
        # Jobs the child leased in a batch but never started are on no board: they go back
        # uncharged while the frozen child still holds its owner lock (and its pid).  Not when
        # the board could not name a running job (an id longer than it holds): that job is among
        # the child's leases, and handed back uncharged it would run, and time out, forever; all
        # are then left to the reaper, as a dead holder's (an attempt counted for each).
        unnamed = any(e.job_id is None for e in running)
        try:
            back = 0 if unnamed else self.queue.kill_and_give_back(p.pid)
        except Exception:
            log.exception("worker process %d: its unstarted leases could not be given back", p.pid)
        else:
            if back:
                log.warning(
                    "worker process %d: %d leased job(s) it had not started went back uncharged",
                    p.pid,
                    back,
                )
        os.kill(p.pid, signal.SIGKILL)
        os.kill(p.pid, signal.SIGCONT)  # a stopped process dies of SIGKILL anyway; be explicit
        p.join()
        self.board.clear(slot)


def _warm(q: QueueBackend) -> None:
    """Import here, once, what each child would import on its first lease and job (the queue's
    reader, the tracing API): forked children inherit the modules."""
    q.preload()
    tracing.warm()


class _SharedRowStats(WorkerStats):
    """A child's stats, mirrored into its slot's row of shared counters as they change."""

    def __init__(self, shared: Any, slot: int, fields: list[str]) -> None:
        super().__init__()
        # A memoryview of the shared row: its item stores cost a third of the ctypes array's,
        # and a child counts twice per job.
        self._shared = memoryview(shared).cast("B").cast("q")
        self._base = slot * len(fields)
        self._index = {f: i for i, f in enumerate(fields)}

    def add(self, **counts: int) -> None:
        super().add(**counts)
        with self._lock:
            for k, v in counts.items():
                i = self._index.get(k)
                if i is not None:
                    self._shared[self._base + i] += v

    def one(self, name: str) -> None:
        i = self._base + self._index[name]
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)
            self._shared[i] += 1


def _child_main(
    spec: dict[str, Any],
    make_worker: Callable[[QueueBackend, dict[str, Any]], Any],
    opts: dict[str, Any],
    row: tuple[Any, int, list[str]],
    mask: set[int | signal.Signals],
    board: Board,
) -> None:
    from ringq.connect import connect

    stopping = threading.Event()
    worker: Any = None

    def on_term(_signum: int, _frame: Any) -> None:
        stopping.set()
        if worker is not None:
            worker.stop()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it sends SIGTERM
    signal.signal(signal.SIGTERM, on_term)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # blocked by the parent around fork
    parent = os.getppid()
    with connect(spec.pop("path"), spec.pop("name"), **spec) as q:
        worker = make_worker(q, opts)
        worker.stats = _SharedRowStats(*row)
        worker.inflight_board = (board, row[1])
        if stopping.is_set():
            worker.stop()

        def orphan_watch() -> None:
            # A parent killed with SIGKILL sends no SIGTERM: stop (gracefully) once it is gone.
            while not worker.stopping:
                if os.getppid() != parent:
                    worker.stop()
                    return
                time.sleep(0.5)

        threading.Thread(target=orphan_watch, name="ringq-orphan-watch", daemon=True).start()
        worker.run()
