"""Closing a queue while other threads are inside its calls: every such call returns, or raises
QueueClosedError, and nothing touches the unmapped files (which would be a segmentation fault).

The threads lease with and without waiting, enqueue (whose sync runs outside the queue lock),
ack, read, pause and set limits while the main thread closes; each round in a child process,
so that a crash fails the test instead of the run.
"""

from __future__ import annotations

from procs import run_py

RACE = """
import sys, threading, time
from ringq import Queue, QueueClosedError

def round_(d, i, mode):
    q = Queue(d, name=f"q{i}", durability=sys.argv[2])
    if mode == "calls":
        q.enqueue_many(list(range(50)))
    stop = threading.Event()
    errors = []

    def loop(op):
        while not stop.is_set():
            try:
                op()
            except QueueClosedError:
                return
            except Exception as exc:  # anything else is a finding
                errors.append(repr(exc))
                return

    def lease_ack():
        job = q.lease_one(wait=0.01)
        if job is not None:
            q.ack(job)

    if mode == "calls":
        ops = [lease_ack, lambda: q.lease(5), lambda: q.enqueue({"x": 1}), q.stats, q.list_jobs,
               q.wake_token, q.wake, lambda: q.wait_for_wake(q.wake_token(), 0.01), q.paused,
               lambda: (q.pause("k"), q.resume("k")), q.limits, lambda: q.lease_one(wait=0.2)]
        settle = 0.05 + 0.01 * (i % 5)
    else:  # "sleepers": short waits on an empty queue, each working out its sleep
        ops = [lambda: q.lease_one(wait=0.0005)] * 4 + [
            lambda: q.wait_for_wake(q.wake_token(), 0.0005)
        ] * 4
        settle = 0.005 + 0.002 * (i % 5)
    threads = [threading.Thread(target=loop, args=(op,)) for op in ops]
    for t in threads:
        t.start()
    time.sleep(settle)
    q.close()
    stop.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "a thread did not return after close"
    assert not errors, errors

for i in range(int(sys.argv[3])):
    round_(sys.argv[1], i, sys.argv[4])
print("ok")
"""


def test_closing_while_threads_are_inside_calls_never_crashes(tmp_path):
    for durability in ("none", "msync"):
        out = run_py(RACE, str(tmp_path / durability), durability, "12", "calls", timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-3000:])


def test_closing_while_threads_go_to_sleep_on_an_empty_queue_never_crashes(tmp_path):
    """Threads looping through short waits on an empty queue (lease_one(wait=), wait_for_wake)
    each work out how long to sleep from the control page's lease-deadline floor: that read was
    made outside the queue lock, and a close in between unmapped the page under it (SIGSEGV in
    about half the runs of 60 rounds on a loaded 2-core machine, rarely on an idle one)."""
    out = run_py(RACE, str(tmp_path), "none", "60", "sleepers", timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-3000:])


COUNTED = """
import sys, threading, time
from ringq import Queue, QueueClosedError

d, durability, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(rounds):
    q = Queue(d, name=f"q{i}", durability=durability)
    returned = []

    def produce(many):
        while True:
            try:
                if many:
                    returned.extend(j.id for j in q.enqueue_many([{"n": 1}, {"n": 2}]))
                else:
                    returned.append(q.enqueue({"n": 0}).id)
            except QueueClosedError:
                return

    threads = [threading.Thread(target=produce, args=(m,)) for m in (False, True)]
    for t in threads:
        t.start()
    time.sleep(0.001 * (i % 7))
    q.close()
    for t in threads:
        t.join(10)
    with Queue(d, name=f"q{i}") as again:
        stored = {j.id for j in again.list_jobs()}
    assert stored == set(returned), (durability, i, len(stored), len(returned))
print("ok")
"""


def test_an_enqueue_that_a_close_overtakes_returns_its_jobs_or_writes_none(tmp_path):
    """Producers enqueue (singly and in batches) while the main thread closes: each call returns
    its jobs or raises QueueClosedError having written nothing, whatever the durability.  The sync
    after an append runs outside the lock: a close in between waits for it, rather than making the
    call raise with its jobs written (a retry would store them twice)."""
    for durability in ("none", "group", "interval", "msync"):
        out = run_py(COUNTED, str(tmp_path / durability), durability, "14", timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "ok", (durability, out.stderr[-3000:])
