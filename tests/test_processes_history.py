"""Whole histories of real processes and threads, checked against the queue's semantics.

Each case runs one seeded workload of tests/history.py -- 1-4 processes of 1-8 threads,
producers and consumers in the same process and in others, lease_one and lease(n) with and
without waits, ack, nack, extend, abandoned leases, cancel, stats, list_jobs, purge, Worker
threads, short visibility timeouts and SIGKILLs -- and judges the whole history: no lease held
by two holders at once, no stale ack accepted, no job lost or invented, and the counts of
stats(), list_jobs() and purge() agreeing with it.  The seeds come from the run's seed (the
``ringq seed`` in pytest's header); a failing case names its own seed, which
``python tests/history.py --seed N -v`` replays (the same workload; its timing differs).
The long run is ``python tests/history.py --runs 500``.
"""

from __future__ import annotations

import random

import history
import pytest
from conftest import SEED

RUNS = 14  # about a minute on 2 cores
SEEDS = [random.Random(SEED).randrange(2**32) for _ in range(RUNS)]


@pytest.mark.parametrize("seed", SEEDS)
def test_history(seed):
    run = history.run(seed)
    assert run.stats["enqueued"] > 0 and run.stats["grants"] > 0, (run.stats, run.violations[:5])
    assert not run.violations, (
        f"seed {seed} (replay: python tests/history.py --seed {seed} -v), plan {run.cfg}:\n"
        + "\n".join(run.violations[:20])
    )
