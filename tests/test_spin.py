"""Queue(spin=...): a blocking lease polls the wake word before it sleeps on the futex.

A job appended by another process during the spin is leased (no futex wake-up was needed: the
producer saw no registered sleeper); one appended after the spin ran out wakes the futex sleeper
as before; and the setting is checked and handed on with the queue's options."""

from __future__ import annotations

import subprocess
import time

import pytest
from procs import spawn

from ringq import Queue

CONSUMER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], durability="none", spin=float(sys.argv[2]))
print("ready", flush=True)
job = q.lease_one(wait=30)
print(job.payload if job else "none", flush=True)
"""


@pytest.mark.parametrize("spin, pause", [(0.5, 0.05), (0.01, 0.3)])
def test_a_spinning_or_sleeping_consumer_gets_a_job_from_another_process(tmp_path, spin, pause):
    Queue(tmp_path, durability="none").close()
    child = spawn(CONSUMER, str(tmp_path), str(spin), stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(pause)  # within the spin (0.05 < 0.5), or after it ran out (0.3 > 0.01)
        with Queue(tmp_path, durability="none") as q:
            q.enqueue("hello")
        out, _ = child.communicate(timeout=30)
        assert out.strip() == "hello"
    finally:
        if child.poll() is None:
            child.kill()


def test_spin_is_checked_and_kept_in_the_options(tmp_path):
    for bad in (-0.1, 1.5, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="spin"):
            Queue(tmp_path, spin=bad)
    with Queue(tmp_path, spin=0.001) as q:
        assert q.options.spin == 0.001
        assert q.lease_one(wait=0.01) is None  # spins 1 ms, then sleeps out the rest
        with Queue(tmp_path, **q.options.to_kwargs()) as again:
            assert again.spin == 0.001


def test_a_bad_wait_or_count_is_refused_before_anything_is_leased(tmp_path):
    with Queue(tmp_path, durability="none") as q:
        q.enqueue_many([1, 2])
        for kw in (dict(count=5, wait=float("nan")), dict(count=True), dict(count=2, wait="1")):
            with pytest.raises(ValueError):
                q.lease(**kw)
        assert q.stats().leased == 0 and len(q.lease(5)) == 2
