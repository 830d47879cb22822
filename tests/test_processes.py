"""Real OS processes against one queue directory: concurrency, SIGKILL, SIGSTOP, wake-ups."""

import signal
import subprocess
import time

from procs import spawn

from ringq import Queue

PRODUCER = """
import sys
from ringq import Queue
qdir, me, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with Queue(qdir, slot_size=128, slot_count=256) as q:
    for i in range(n):
        q.enqueue({"p": me, "i": i})
"""

CONSUMER = """
import sys, time
from ringq import Queue
qdir, total = sys.argv[1], int(sys.argv[2])
taken = []
with Queue(qdir, slot_size=128, slot_count=256) as q:
    deadline = time.monotonic() + 120  # a loaded machine may start the producers late
    while time.monotonic() < deadline:
        jobs = q.lease(7, wait=0.2)
        for j in jobs:
            taken.append(j.id)
            q.ack(j)
        if q.stats().acked_total >= total:  # cumulative: done falls as segments retire
            break
print("\\n".join(taken))
"""


def test_four_producers_four_consumers_disjoint_and_complete(qdir):
    Queue(qdir, slot_size=128, slot_count=256).close()  # small segments: rotation and retirement happen
    cons = [spawn(CONSUMER, qdir, "2000", stdout=subprocess.PIPE, text=True) for _ in range(4)]
    prods = [spawn(PRODUCER, qdir, str(p), "500") for p in range(4)]
    assert all(p.wait(120) == 0 for p in prods)
    outs = [c.communicate(timeout=120)[0].split() for c in cons]
    assert all(c.returncode == 0 for c in cons)
    sets = [set(o) for o in outs]
    assert sum(len(o) for o in outs) == sum(len(s) for s in sets)  # nobody took a job twice
    union = set().union(*sets)
    assert len(union) == 2000 and sum(len(s) for s in sets) == 2000  # disjoint and complete
    with Queue(qdir) as q:
        st = q.stats()
        assert st.ready == st.leased == st.dead == 0
        assert (st.enqueued_total, st.acked_total, st.dead_lettered_total) == (2000, 2000, 0)


HOLDER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=float(sys.argv[2]))
jobs = q.lease(5)
print(" ".join(j.id for j in jobs), flush=True)
time.sleep(600)
"""


def test_sigkilled_consumer_leases_come_back_at_once(qdir):
    with Queue(qdir, visibility_timeout=60) as q:
        q.enqueue_many(list(range(8)))
        holder = spawn(HOLDER, qdir, "60", stdout=subprocess.PIPE, text=True)
        held = holder.stdout.readline().split()
        assert len(held) == 5
        assert q.stats().leased == 5
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        t = time.monotonic()
        got = []
        while len(got) < 8 and time.monotonic() - t < 10:
            got += q.lease(8, wait=0.5)
        assert time.monotonic() - t < 5  # far less than the 60 s visibility timeout
        assert sorted(j.payload for j in got) == list(range(8))
        back = [j for j in got if j.id in held]
        assert len(back) == 5 and all(j.attempts == 2 and "died" in j.last_error for j in back)


def test_stuck_consumer_leases_come_back_after_the_visibility_timeout(qdir):
    with Queue(qdir, visibility_timeout=1.0) as q:
        q.enqueue_many(list(range(5)))
        holder = spawn(HOLDER, qdir, "1.0", stdout=subprocess.PIPE, text=True)
        held = holder.stdout.readline().split()
        holder.send_signal(signal.SIGSTOP)  # alive but stuck: its owner lock stays held
        try:
            t = time.monotonic()
            assert q.lease(5) == []
            got = q.lease(5, wait=5)
            waited = time.monotonic() - t
            assert sorted(j.id for j in got) == sorted(held)
            assert 0.7 <= waited < 4.5
            assert all("expired" in j.last_error for j in got)
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()


KILLED_PRODUCER = """
import sys
from ringq import Queue
with Queue(sys.argv[1], slot_size=128, slot_count=64) as q:
    i = 0
    while True:
        job = q.enqueue({"i": i})
        print(job.id, flush=True)   # printed only after enqueue returned (msync done)
        i += 1
"""


def test_sigkilled_producer_loses_no_returned_enqueue(qdir):
    prod = spawn(KILLED_PRODUCER, qdir, stdout=subprocess.PIPE, text=True)
    returned = []
    while len(returned) < 300:
        returned.append(prod.stdout.readline().strip())
    prod.send_signal(signal.SIGKILL)
    rest = prod.communicate()[0].split()
    returned += rest
    with Queue(qdir) as q:
        ids = {j.id for j in q.list_jobs()}
        assert set(returned) <= ids
        assert q.recovery.clean
        q.enqueue("still works")


IDEM = """
import sys
from ringq import Queue
with Queue(sys.argv[1]) as q:
    for i in range(50):
        q.enqueue({"from": sys.argv[2]}, job_id=f"key-{i}")
"""


def test_idempotent_enqueue_of_one_key_from_four_processes(qdir):
    Queue(qdir).close()
    procs = [spawn(IDEM, qdir, str(n)) for n in range(4)]
    assert all(p.wait(60) == 0 for p in procs)
    with Queue(qdir) as q:
        jobs = q.list_jobs()
        assert sorted(j.id for j in jobs) == sorted(f"key-{i}" for i in range(50))


WAITER = """
import sys, time
from ringq import Queue
with Queue(sys.argv[1]) as q:
    print("ready", flush=True)
    taken = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        job = q.lease_one(wait=2.0)
        if job is None:
            break
        taken.append(job.payload)
        time.sleep(0.05)  # a handler's worth of work, so the burst is shared
        q.ack(job)
    print(" ".join(map(str, taken)), flush=True)
"""


def test_blocking_leases_in_four_processes_wake_for_a_burst(qdir):
    Queue(qdir).close()
    waiters = [spawn(WAITER, qdir, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    for w in waiters:
        assert w.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # they are asleep in futex waits now
    with Queue(qdir) as q:
        q.enqueue_many(list(range(200)))
    outs = [w.communicate(timeout=60)[0].split() for w in waiters]
    taken = [int(x) for o in outs for x in o]
    assert sorted(taken) == list(range(200))  # each exactly once
    assert all(outs)  # every sleeper woke and took part
