"""A SIGKILLed holder's leases come back at the next scan for dead holders, not after their
visibility timeout (README).  A process scans in its lease calls, once REAP_INTERVAL passed since
its last scan: a consumer blocked in ``lease(wait=...)`` wakes for it, so it gets them within a
second; consumers busy in ``consume()`` or a ``Worker`` lease between jobs, so with short jobs they
are back within 2 s; with no consumer running they wait for the next one, whose first lease gets
them."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from procs import spawn

from ringq import Queue
from ringq.engine.reaper import REAP_INTERVAL
from ringq.engine.verify import examine

HOLDER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=600)
job = q.lease_one()
print(job.id, flush=True)
time.sleep(600)
"""


def test_a_waiting_consumer_gets_a_killed_holders_job_soon(tmp_path):
    with Queue(tmp_path, visibility_timeout=600) as q:
        q.enqueue("held")
        holder = spawn(HOLDER, str(tmp_path), stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip()
        assert q.lease_one() is None  # the only job is held: this consumer will wait
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        t = time.monotonic()
        job = q.lease_one(wait=5)
        took = time.monotonic() - t
        assert job is not None and job.payload == "held"
        assert took < 3 * REAP_INTERVAL + 0.25, took  # was up to 4 x REAP_INTERVAL asleep


HOLD_FIVE = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=600)
print(" ".join(j.id for j in q.lease(5)), flush=True)
time.sleep(600)
"""

# A consumer kept busy: every job takes 20 ms, and the backlog outlasts the test, so it is always
# handling a job or leasing the next, never waiting in a lease.
BUSY = """
import sys, time
from ringq import Queue, Worker
q = Queue(sys.argv[1], visibility_timeout=600)
def handle(job):
    if job.payload == 5:  # its first job (the holder has 0-4)
        print("busy", flush=True)
    time.sleep(0.02)
if sys.argv[2] == "consume":
    q.consume(handle)
else:
    Worker(q, handle, concurrency=2).run()
"""


def _states(path: str, pid: int) -> tuple[int, int]:
    """(leases still recorded under process ``pid``, ready jobs), read from the files as they are:
    a read that reclaims nothing (``examine``), so that only the consumers' own scans count."""
    records = [r for seg in examine(path, "default").segments for r in seg.records]
    return (
        sum(1 for r in records if r.state == "leased" and r.owner_pid == pid),
        sum(1 for r in records if r.state == "ready"),
    )


@pytest.mark.parametrize("consumer", ["consume", "worker"])
def test_busy_consumers_get_a_killed_holders_jobs_within_two_seconds(tmp_path, consumer):
    path = str(tmp_path)
    with Queue(path) as q:
        q.enqueue_many(list(range(400)))  # 20 ms each: 8 s of work for one consumer
    holder = spawn(HOLD_FIVE, path, stdout=subprocess.PIPE, text=True)
    busy = None
    try:
        assert len(holder.stdout.readline().split()) == 5
        busy = spawn(BUSY, path, consumer, stdout=subprocess.PIPE, text=True)
        assert busy.stdout.readline().strip() == "busy"
        assert _states(path, holder.pid)[0] == 5  # a live holder keeps them
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        t = time.monotonic()
        while (left := _states(path, holder.pid))[0] and time.monotonic() - t < 10:
            time.sleep(0.005)
        took = time.monotonic() - t
        assert left[0] == 0 and left[1] > 0, left  # back, while the consumer still had a backlog
        assert took < 2.0, took
    finally:
        for proc in (holder, busy):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


def test_with_no_consumer_the_next_consumers_first_lease_gets_a_killed_holders_jobs(tmp_path):
    path = str(tmp_path)
    with Queue(path) as q:
        q.enqueue_many(list(range(5)))
    holder = spawn(HOLD_FIVE, path, stdout=subprocess.PIPE, text=True)
    held = holder.stdout.readline().split()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    time.sleep(2 * REAP_INTERVAL)
    assert _states(path, holder.pid)[0] == 5  # nobody leased since: nobody scanned
    with Queue(path) as q:
        got = q.lease(5)  # no wait: this first lease call scans, then leases
        assert sorted(j.id for j in got) == sorted(held)
        assert all("died" in j.last_error for j in got)
