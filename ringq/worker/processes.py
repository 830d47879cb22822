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
from typing import Any

__all__ = ["ProcessesMethods", "WorkerStats"]

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
        return {"leased": self.leased, "succeeded": self.succeeded, "failed": self.failed, "dead": self.dead,
                "lost_leases": self.lost_leases}


class ProcessesMethods:
    """``processes=N`` mode of :class:`ringq.Worker` (a mixin; the worker owns the settings and
    ``stats``, ``restarts``, ``_rows``, ``_children``, ``_stop`` and ``stop``)."""

    def _run_processes(self) -> WorkerStats:
        q = self.queue
        # Every setting the queue was opened with (a local queue's frozen options), so that the
        # children behave as the parent's queue does.
        options = getattr(q, "options", None)
        if options is not None:
            spec = dict(path=q.path, name=q.name, **options.to_kwargs())
        else:
            spec = dict(path=q.path, name=q.name, visibility_timeout=q.visibility_timeout,
                        max_attempts=q.max_attempts, backoff=q.backoff)
        ctx = multiprocessing.get_context("fork")
        # Each child slot has a row of counters in shared memory that its children update as they
        # go: the work of a child killed by a signal is counted up to its last finished job.
        fields = list(WorkerStats().to_dict())
        shared = ctx.Array("q", self.processes * len(fields), lock=False)
        self._rows = (shared, fields)
        restarts = self.restarts = 0

        def start(slot: int) -> multiprocessing.Process:
            opts = dict(concurrency=self.concurrency, poll_interval=self.poll_interval, max_jobs=self.max_jobs,
                        idle_timeout=self.idle_timeout, heartbeat=self.heartbeat)
            if self.max_jobs is not None:  # a replacement takes over what its slot had left
                opts["max_jobs"] = self.max_jobs - shared[slot * len(fields) + fields.index("leased")]
            # Children start with SIGINT/SIGTERM blocked: until they install their own handlers they
            # would run the parent's (copied by fork), or die of a SIGTERM sent by an early stop().
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                p = ctx.Process(target=_child_main, args=(spec, self.handler, opts, (shared, slot, fields), mask),
                                daemon=False)
                p.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return p

        self._children = [start(i) for i in range(self.processes)]
        running = [True] * self.processes
        if self._stop.is_set():
            self.stop()
        try:
            while any(running):
                for slot, p in enumerate(self._children):
                    if not running[slot] or p.is_alive():
                        continue
                    p.join()
                    running[slot] = False
                    if p.exitcode == 0:
                        continue
                    how = f"killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exited with status {p.exitcode}"
                    left = None if self.max_jobs is None else (
                        self.max_jobs - shared[slot * len(fields) + fields.index("leased")])
                    if self._stop.is_set() or (left is not None and left <= 0):
                        log.error("worker process %d %s", p.pid, how)
                    elif restarts >= self.max_restarts:
                        log.error("worker process %d %s; not replaced: the restart budget (%d) is spent",
                                  p.pid, how, self.max_restarts)
                    else:
                        restarts += 1
                        self.restarts = restarts
                        self._children[slot] = start(slot)
                        running[slot] = True
                        log.error("worker process %d %s; replaced by %d (restart %d of %d)", p.pid, how,
                                  self._children[slot].pid, restarts, self.max_restarts)
                time.sleep(0.05)
        except BaseException:  # a second SIGINT: abort, leaving nobody behind
            for p in self._children:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
                p.join()
            raise
        self.restarts = restarts
        self._rows = None
        for slot in range(self.processes):
            self.stats.add(**{f: shared[slot * len(fields) + i] for i, f in enumerate(fields)})
        return self.stats


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


def _child_main(spec: dict, handler: Callable, opts: dict, row: tuple, mask: set) -> None:
    from ringq.connect import connect

    from .worker import Worker  # the child runs a Worker of its own

    stopping = threading.Event()
    worker: Worker | None = None

    def on_term(_signum: int, _frame: Any) -> None:
        stopping.set()
        if worker is not None:
            worker.stop()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it sends SIGTERM
    signal.signal(signal.SIGTERM, on_term)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # blocked by the parent around fork
    parent = os.getppid()
    with connect(spec.pop("path"), spec.pop("name"), **spec) as q:
        worker = Worker(q, handler, handle_signals=False, progress=False, **opts)
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
