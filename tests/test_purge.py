"""purge(): every job that stats() counts is removed, whatever reads and relocations came before.

The seeded sequences mix enqueues (some delayed an hour, some already expired, priorities -1 to 1),
leases, acks and nacks over 8-slot segments, with ``stats()`` between the steps, so segments
rotate, seal, relocate their stragglers and retire all the time.  Seed 814 is the sequence that
left two relocated jobs behind a purge (a reaper pass had relocated them without the index
reading the copies in, and purge went by the index).
"""

from __future__ import annotations

import random
import time

import pytest

from ringq import BackoffPolicy, Queue

HOUR = 3600.0


def _mixed(q: Queue, seed: int, with_stats: bool) -> None:
    r = random.Random(seed)
    held = []
    for _ in range(r.randint(3, 25)):
        op = r.choice(["enq", "enq", "enq", "lease", "ack", "nack"])
        if op == "enq":
            kw = dict(priority=r.choice([-1, 0, 1]), delay=r.choice([0, 0, HOUR]))
            if r.random() < 0.15:
                kw["expires_at"] = time.time() - 1
            q.enqueue(len(held), **kw)
        elif op == "lease":
            held += q.lease(r.randint(1, 3))
        elif op == "ack" and held:
            q.ack(held.pop(r.randrange(len(held))))
        elif op == "nack" and held:
            q.nack(held.pop(r.randrange(len(held))), delay=r.choice([0, HOUR]))
        if with_stats:
            q.stats()


@pytest.mark.parametrize("with_stats", [True, False])
@pytest.mark.parametrize("seed", [814, *range(0, 120)])
def test_purge_removes_every_job_that_stats_counts(tmp_path, seed, with_stats):
    q = Queue(tmp_path, "m", visibility_timeout=HOUR, max_attempts=3, slot_size=128, slot_count=8,
              backoff=BackoffPolicy(base=HOUR, factor=1, jitter=0))
    try:
        _mixed(q, seed, with_stats)
        total, listed = q.stats().total, len(q.list_jobs())
        assert listed == total
        assert q.purge() == total
        assert (q.stats().total, q.list_jobs(), q.lease(10)) == (0, [], [])
        assert q.purge() == 0
    finally:
        q.close()

