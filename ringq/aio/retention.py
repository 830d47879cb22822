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


class RetentionMethods:
    """The retention part of :class:`ringq.aio.Queue` (a mixin; the queue owns ``keep_seconds``,
    ``keep_jobs``, ``sweep_interval``, ``visibility_timeout``, ``_results``, ``_store``,
    ``_sweep_lock``, ``_sweeping``, ``_loop``, ``_closing`` and ``_check_open``)."""

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
                log.error("retention sweep at %s failed: %s", self._store.where, exc)

    def prune(self) -> int:
        """Prune finished jobs beyond the retention limits now; returns how many.  One process
        prunes at a time (the store's sweep lock); the others return 0 at once.  Runs on its own
        every ``sweep_interval`` seconds while the queue is open."""
        self._check_open()
        return self._prune_locked()

    def _prune_locked(self) -> int:
        if not self._sweep_lock.acquire(blocking=False):  # a flock would let our own threads in
            return 0
        try:
            lock = self._store.sweep_lock()
            if not lock.acquire():
                return 0
            try:
                return prune_results(
                    self._results,
                    self.keep_seconds,
                    self.keep_jobs,
                    max(60.0, self.visibility_timeout),
                    lambda: not self._closing and lock.renew(),
                )
            finally:
                lock.release()
        finally:
            self._sweep_lock.release()
