"""Retention for :mod:`ringq.aio`: prune the oldest result records beyond the limits.

Results are appended in finish order and leased in FIFO order (the same priority, no delay), and
nobody but a sweeper leases them; so while one process holds the sweep lock, a lease of n takes
exactly the n oldest, and acking them prunes them.  A record leased that was not among the n
expected (a result appended meanwhile cannot be older, but a lock lost to a stall can let another
sweeper in) is put back at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ringq.errors import RingqError
from ringq.job import JobState

SWEEP_BATCH = 256  # result records examined per step


def prune_results(
    rq: Any,
    keep_seconds: float | None,
    keep_jobs: int | None,
    lease_timeout: float,
    keep_going: Callable[[], bool],
) -> int:
    """Prune result records of engine queue ``rq`` older than ``keep_seconds`` or beyond the newest
    ``keep_jobs``; returns how many.  The caller holds the sweep lock; ``keep_going()`` is asked
    before each batch of ``SWEEP_BATCH`` (False when closing, or when the lock was lost).
    ``lease_timeout``: seconds a record stays leased if this process dies mid-batch."""
    pruned = 0
    while keep_going():
        batch = rq.list_jobs(JobState.READY, limit=SWEEP_BATCH)
        if not batch:
            return pruned
        excess = 0 if keep_jobs is None else max(0, rq.stats().ready - keep_jobs)
        old = 0
        if keep_seconds is not None:
            cutoff = time.time() - keep_seconds
            while old < len(batch) and batch[old].enqueued_at < cutoff:
                old += 1
        n = min(len(batch), max(excess, old))
        if n == 0:
            return pruned
        want = {j.id for j in batch[:n]}
        for rj in rq.lease(n, visibility_timeout=lease_timeout):
            if rj.id in want:
                rq.ack(rj)
                pruned += 1
            else:
                rq.nack(rj, delay=0)
        if n < SWEEP_BATCH:
            return pruned
    return pruned


log = logging.getLogger("ringq.aio")


class Retention:
    """The retention sweeps of one :class:`ringq.aio.Queue`: finished jobs beyond ``keep_seconds``
    or ``keep_jobs`` are pruned every ``sweep_interval`` seconds, in a worker thread, by one
    process at a time (``store``'s sweep lock).  ``visibility_timeout`` bounds how long a job
    another process still runs may look finished."""

    def __init__(
        self,
        store: Any,
        keep_seconds: float | None,
        keep_jobs: int | None,
        sweep_interval: float,
        visibility_timeout: float,
    ) -> None:
        self.store = store
        self.keep_seconds = keep_seconds
        self.keep_jobs = keep_jobs
        self.sweep_interval = sweep_interval
        self.visibility_timeout = visibility_timeout
        self.sweeping: asyncio.Future[int] | None = None  # the sweep running in its thread
        self._lock = threading.Lock()  # a flock would let this process's own threads in

    async def run(
        self, loop: asyncio.AbstractEventLoop, results: Any, closing: Callable[[], bool]
    ) -> None:
        """Sweep every ``sweep_interval`` seconds until cancelled (none without limits)."""
        if self.keep_seconds is None and self.keep_jobs is None:
            return
        while True:
            await asyncio.sleep(self.sweep_interval)
            # In a worker thread: examining the oldest results costs O(retained) (~50 ms at 100,000).
            self.sweeping = loop.run_in_executor(None, self.prune, results, closing)
            try:
                await asyncio.shield(self.sweeping)
            except RingqError as exc:
                log.error("retention sweep at %s failed: %s", self.store.where, exc)

    async def finished(self) -> None:
        """Wait for a sweep running in its thread (it stops at its next batch once closing)."""
        if self.sweeping is not None:
            await asyncio.wait([self.sweeping])
            self.sweeping = None

    def prune(self, results: Any, closing: Callable[[], bool]) -> int:
        """Prune now, unless another thread or process is sweeping (then 0)."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            lock = self.store.sweep_lock()
            if not lock.acquire():
                return 0
            try:
                return prune_results(
                    results,
                    self.keep_seconds,
                    self.keep_jobs,
                    max(60.0, self.visibility_timeout),
                    lambda: not closing() and lock.renew(),
                )
            finally:
                lock.release()
        finally:
            self._lock.release()
