"""Worker(processes=N): forked children that each open the queue and run a Worker, counted in
shared memory as they go, and replaced (within a restart budget) when one is killed."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ringq.backend import QueueBackend

__all__ = ["ProcessPool", "WorkerStats"]

log = logging.getLogger("ringq.worker")


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
        self.children: list[BaseProcess] = []
        self.rows: tuple[Any, list[str]] | None = None  # during the run: the shared counters

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
        max_jobs = self.options.get("max_jobs")
        ctx = multiprocessing.get_context("fork")
        # Each child slot has a row of counters in shared memory that its children update as they
        # go: the work of a child killed by a signal is counted up to its last finished job.
        fields = list(WorkerStats().to_dict())
        shared = ctx.Array("q", self.processes * len(fields), lock=False)
        self.rows = (shared, fields)
        restarts = self.restarts = 0

        def start(slot: int) -> BaseProcess:
            opts = dict(self.options)
            if max_jobs is not None:  # a replacement takes over what its slot had left
                opts["max_jobs"] = max_jobs - shared[slot * len(fields) + fields.index("leased")]
            # Children start with SIGINT/SIGTERM blocked: until they install their own handlers they
            # would run the parent's (copied by fork), or die of a SIGTERM sent by an early stop().
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                p = ctx.Process(
                    target=_child_main,
                    args=(spec, self.make_worker, opts, (shared, slot, fields), mask),
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
                for slot, p in enumerate(self.children):
                    if not running[slot] or p.is_alive():
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
                time.sleep(0.05)
        except BaseException:  # a second SIGINT: abort, leaving nobody behind
            for p in self.children:
                if p.is_alive() and p.pid is not None:
                    os.kill(p.pid, signal.SIGKILL)
                p.join()
            raise
        self.restarts = restarts
        self.rows = None
        for slot in range(self.processes):
            stats.add(**{f: shared[slot * len(fields) + i] for i, f in enumerate(fields)})
        return stats


class _SharedRowStats(WorkerStats):
    """A child's stats, mirrored into its slot's row of shared counters as they change."""

    def __init__(self, shared: Any, slot: int, fields: list[str]) -> None:
        super().__init__()
        self._shared = shared
        self._base = slot * len(fields)
        self._index = {f: i for i, f in enumerate(fields)}

    def add(self, **counts: int) -> None:
        super().add(**counts)
        with self._lock:
            for k, v in counts.items():
                i = self._index.get(k)
                if i is not None:
                    self._shared[self._base + i] += v


def _child_main(
    spec: dict[str, Any],
    make_worker: Callable[[QueueBackend, dict[str, Any]], Any],
    opts: dict[str, Any],
    row: tuple[Any, int, list[str]],
    mask: set[int | signal.Signals],
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
