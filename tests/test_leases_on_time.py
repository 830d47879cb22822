"""Expired leases are leasable on time, and read-only calls see what a reclaim would do.

Real processes: a holder that is SIGSTOPped (alive, its lease expiring) or SIGKILLed (dead), and
other processes that lease or only look.
"""

import glob
import os
import signal
import subprocess
import time

from procs import spawn

from ringq import JobState, Queue, Worker

HOLDER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=float(sys.argv[2]))
job = q.lease_one()
print(job.id, repr(job.lease_deadline), flush=True)
time.sleep(600)
"""

WAITER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=60)
print("ready", flush=True)
sys.stdin.readline()  # go: the job is leased by the holder now
job = q.lease_one(wait=20)
print(job.id if job else "-", repr(time.time()), flush=True)
"""


def test_an_expired_lease_is_leasable_right_after_its_deadline(qdir):
    with Queue(qdir, visibility_timeout=60) as q:
        q.enqueue("slow")
        waiter = spawn(WAITER, qdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert waiter.stdout.readline().strip() == "ready"
        holder = spawn(HOLDER, qdir, "1.0", stdout=subprocess.PIPE, text=True)
        try:
            jid, deadline = holder.stdout.readline().split()
            deadline = float(deadline)
            holder.send_signal(signal.SIGSTOP)  # alive but stuck: only the deadline ends its lease
            # The waiter starts waiting only now, while the holder holds the job.
            waiter.stdin.write("go\n")
            waiter.stdin.flush()
            assert q.lease() == []  # this process has just looked: its periodic scan is not due
            # The sleeping waiter wakes at the deadline itself (not at its next periodic look).
            got, at = waiter.communicate(timeout=30)[0].split()
            assert got == jid
            assert 0 <= float(at) - deadline < 0.05, (
                f"leased {float(at) - deadline:.3f} s after the deadline"
            )
        finally:
            holder.kill()
            holder.wait()


def test_a_process_that_looked_just_before_the_deadline_leases_just_after_it(qdir):
    with Queue(qdir, visibility_timeout=60) as q:
        q.enqueue("slow")
        holder = spawn(HOLDER, qdir, "1.0", stdout=subprocess.PIPE, text=True)
        try:
            jid, deadline = holder.stdout.readline().split()
            deadline = float(deadline)
            holder.send_signal(signal.SIGSTOP)
            while time.time() < deadline - 0.1:  # within one REAP_INTERVAL of the deadline
                time.sleep(0.005)
            assert q.lease() == []  # not expired yet
            while time.time() < deadline + 0.01:
                time.sleep(0.001)
            got = q.lease()  # a non-blocking lease, 10 ms after the deadline
            assert [j.id for j in got] == [jid]
            assert "expired" in got[0].last_error
        finally:
            holder.kill()
            holder.wait()


def _files(qdir):
    return {p: open(p, "rb").read() for p in sorted(glob.glob(os.path.join(qdir, "*.seg")))}


def test_monitors_see_dead_holders_and_expired_leases_without_writing(qdir):
    with Queue(qdir, visibility_timeout=60) as q:
        q.enqueue("dies")
        q.enqueue("stalls", priority=-1)
        monitor = Queue(qdir)  # a long-lived handle that only looks
        killed = spawn(HOLDER, qdir, "60", stdout=subprocess.PIPE, text=True)
        dead_id = killed.stdout.readline().split()[0]
        stuck = spawn(HOLDER, qdir, "0.2", stdout=subprocess.PIPE, text=True)
        try:
            stuck_id, deadline = stuck.stdout.readline().split()
            stuck.send_signal(signal.SIGSTOP)
            assert monitor.stats().leased == 2
            killed.kill()
            killed.wait()
            while time.time() < float(deadline) + 0.01:
                time.sleep(0.005)
            before = _files(qdir)
            st = monitor.stats()
            assert (st.ready, st.leased) == (2, 0)
            assert st.ready + st.delayed + st.leased + st.done + st.dead == st.total == 2
            died, expired = monitor.get(dead_id), monitor.get(stuck_id)
            assert died.state is JobState.READY and "died" in died.last_error
            assert expired.state is JobState.READY and "expired" in expired.last_error
            assert {j.id for j in monitor.list_jobs("ready")} == {dead_id, stuck_id}
            assert monitor.list_jobs("leased") == []
            assert _files(qdir) == before  # nothing written: reads only
            # And the first lease does reclaim them, as the monitor said.
            assert sorted(j.id for j in q.lease(5)) == sorted([dead_id, stuck_id])
        finally:
            monitor.close()
            stuck.kill()
            stuck.wait()


def test_stats_under_load_come_from_one_snapshot(qdir):
    n = 20000
    with Queue(qdir, durability="none") as q:
        for i in range(0, n, 1000):
            q.enqueue_many(list(range(i, i + 1000)))
        consumers = [
            spawn(
                """
import sys
from ringq import Queue
with Queue(sys.argv[1], durability="none") as q:
    while jobs := q.lease(3):
        for j in jobs:
            q.ack(j)
""",
                qdir,
            )
            for _ in range(2)
        ]
        samples = 0
        try:
            while any(c.poll() is None for c in consumers):
                st = q.stats()
                samples += 1
                assert st.delayed == 0, st  # nothing is ever delayed on this queue
                assert st.ready + st.delayed + st.leased + st.done + st.dead == st.total, st
                assert st.acked_total <= st.enqueued_total == n
        finally:
            for c in consumers:
                c.wait(60)
        assert samples > 50
        assert q.stats().acked_total == n


def test_heartbeats_never_report_a_job_their_worker_acked(qdir, caplog):
    with Queue(qdir, visibility_timeout=0.3, durability="none") as q:
        q.enqueue_many(list(range(3000)))
        # A short heartbeat (10 ms) against short jobs: beats race their own acks all the time.
        w = Worker(
            q,
            lambda job: time.sleep(0.0005),
            concurrency=4,
            idle_timeout=0.5,
            heartbeat=0.01,
            handle_signals=False,
        )
        with caplog.at_level("WARNING", logger="ringq.worker"):
            stats = w.run()
    assert stats.succeeded == 3000 and stats.lost_leases == 0
    assert not [r for r in caplog.records if "heartbeat failed" in r.getMessage()]


def test_a_reclaim_a_read_shows_is_never_counted_as_delayed(qdir):
    # A read shows an expired lease as READY and due at the instant of the read; every count
    # and filter of that read must use that same instant, however the clock ticks meanwhile.
    with Queue(qdir, visibility_timeout=60) as q, Queue(qdir) as monitor:
        q.enqueue("expires")
        job = q.lease_one(visibility_timeout=0.05)
        while time.time() < job.lease_deadline + 0.01:
            time.sleep(0.005)
        for _ in range(3000):  # each read spans a millisecond tick now and then
            st = monitor.stats()
            assert (st.ready, st.delayed, st.leased) == (1, 0, 0), st
            assert monitor.list_jobs("delayed") == []
        assert monitor.get(job.id).state is JobState.READY
