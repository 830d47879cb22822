"""Retention for :mod:`ringq.aio`: prune the oldest result records beyond the limits.

Results are appended in finish order and leased in FIFO order (the same priority, no delay), and
nobody but a sweeper leases them; so while one process holds the sweep lock, a lease of n takes
exactly the n oldest, and acking them prunes them.  A record leased that was not among the n
expected (a result appended meanwhile cannot be older, but a lock lost to a stall can let another
sweeper in) is put back at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .job import JobState

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
