"""Hard timeouts and the graceful drain (docs/operations.md).

Timeouts: in threads the handler's ``job.cancelled`` is set and its lease given up at the deadline
(the thread runs on; another takes its place); in processes mode the child is killed and
replaced and the job nacked with ``"timeout after N s"``; the job's own ``timeout`` wins over the
Worker's.  Drain: SIGTERM stops leasing at once, lets handlers finish within ``grace``, hands back
what still runs for immediate redelivery and exits 0 -- with real signals and a handler that
ignores them.  Timings are short (timeouts and grace of a fraction of a second).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
import uuid

import pytest
from procs import spawn

from ringq import BackoffPolicy, JobState, Queue, Worker

NOBACKOFF = BackoffPolicy(base=0, jitter=0)


@pytest.fixture
def make_queue(queue_factory):
    return lambda **kw: queue_factory(backoff=NOBACKOFF, **kw)


def test_thread_timeout_sets_cancelled_gives_up_the_lease_and_a_new_thread_serves(make_queue):
    q = make_queue()
    stuck = q.enqueue({"n": "stuck"}, max_attempts=2)
    other = q.enqueue({"n": "other"})
    release = threading.Event()
    seen: dict[str, list] = {"stuck": [], "other": []}

    def handler(job):
        seen[job.payload["n"]].append(job.attempts)
        if job.payload["n"] == "stuck" and job.attempts == 1:
            # Ignores its deadline until told by the test; the timeout does not wait for it.
            assert job.cancelled.wait(5)
            release.wait(30)

    w = Worker(q, handler, concurrency=1, timeout=0.3, idle_timeout=1.0, handle_signals=False)
    t0 = time.monotonic()
    runner = threading.Thread(target=w.run)
    runner.start()
    # The other job and the retry ran while the first handler was still stuck in its thread.
    deadline = time.monotonic() + 30  # a busy host; the loop ends as soon as both are done
    while q.get(stuck.id).state is not JobState.DONE and time.monotonic() < deadline:
        time.sleep(0.02)
    assert q.get(stuck.id).state is JobState.DONE and q.get(other.id).state is JobState.DONE
    assert seen == {"stuck": [1, 2], "other": [1]}
    assert q.get(stuck.id).attempts == 2
    assert time.monotonic() - t0 < 30
    release.set()
    runner.join(10)
    assert not runner.is_alive()
    assert w.stats.failed == 1 and w.stats.succeeded == 2 and w.stats.lost_leases == 0


def test_the_jobs_own_timeout_wins_and_the_error_says_so(make_queue):
    q = make_queue()
    job = q.enqueue("slow", timeout=0.2, max_attempts=1)
    assert job.timeout == 0.2
    done = threading.Event()

    def handler(j):
        j.cancelled.wait(5)  # returns once the 0.2 s timeout fires, not the Worker's 30 s
        done.set()

    w = Worker(q, handler, timeout=30, idle_timeout=0.6, handle_signals=False)
    t0 = time.monotonic()
    w.run()
    assert done.is_set() and time.monotonic() - t0 < 3
    got = q.get(job.id)
    assert got.state is JobState.DEAD and got.last_error == "timeout after 0.2 s"
    assert w.stats.failed == 1 and w.stats.dead == 1


def test_processes_timeout_kills_and_replaces_the_child(make_queue, caplog):
    caplog.set_level(logging.WARNING, logger="ringq.worker")
    q = make_queue()
    hang = q.enqueue({"n": "hang"}, timeout=0.5, max_attempts=1)
    slow = q.enqueue({"n": "slow"}, max_attempts=3)
    after = q.enqueue({"n": "after"})
    log_path = f"/tmp/ringq-pids-{uuid.uuid4().hex}"

    def handler(job):
        with open(log_path, "a") as fh:
            fh.write(f"{os.getpid()} {job.payload['n']} {job.attempts}\n")
        if job.payload["n"] == "hang":
            time.sleep(60)  # holds its child until the parent kills it
        if job.payload["n"] == "slow" and job.attempts == 1:
            time.sleep(1.5)

    w = Worker(q, handler, concurrency=2, processes=1, idle_timeout=1.0, handle_signals=False)
    t0 = time.monotonic()
    w.run()
    assert time.monotonic() - t0 < 20
    lines = [ln.split() for ln in open(log_path).read().splitlines()]
    os.unlink(log_path)
    got = q.get(hang.id)
    assert got.state is JobState.DEAD and got.last_error == "timeout after 0.5 s"
    assert q.get(slow.id).state is JobState.DONE and q.get(slow.id).attempts == 2
    assert q.get(after.id).state is JobState.DONE
    # The hanging job's child died; the retry of "slow" ran in its replacement.
    pids = {n: {pid for pid, name, _a in lines if name == n} for n in ("hang", "slow")}
    first = next(pid for pid, name, _a in lines if name == "hang")
    assert pids["hang"] == {first} and len(pids["slow"]) == 2
    assert w.pool is not None and w.pool.timeouts == 1 and w.restarts == 0
    assert w.stats.failed >= 1 and w.stats.dead == 1
    # The lines a failure logs in threads mode, nobroker's dead-letter line among them.
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert (logging.WARNING, f"job {hang.id} failed (attempt 1 of 1): timeout after 0.5 s") in said
    assert (logging.ERROR, f"job {hang.id} exhausted 1 attempts and moved to the DLQ") in said


def test_worker_timeout_and_grace_are_validated(make_queue):
    q = make_queue()
    for kw in ({"timeout": 0}, {"timeout": -1}, {"grace": -1}, {"grace": "5"}):
        with pytest.raises(ValueError):
            Worker(q, print, **kw)


# -- the drain: real signals, a handler that ignores them ---------------------------------------

DRAIN = r"""
import json, sys, time
from ringq import Worker, connect
where, name, grace, procs = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
q = connect(where, name)

def handler(job):
    sys.stdout.write(json.dumps({"started": job.id}) + "\n")  # one write: threads never interleave
    sys.stdout.flush()
    if job.payload == "quick":
        time.sleep(0.2)
        return
    time.sleep(60)  # ignores SIGTERM: only the grace period ends its job here

w = Worker(q, handler, concurrency=2, processes=procs, grace=grace)
stats = w.run()
print(json.dumps({"stats": stats.to_dict()}), flush=True)
"""


@pytest.mark.parametrize("procs", [0, 1])
def test_sigterm_drains_finishes_quick_hands_back_stuck_and_exits_0(make_queue, procs):
    q = make_queue()
    stuck = q.enqueue("stuck", max_attempts=5)
    quick = q.enqueue("quick")
    proc = spawn(DRAIN, q.location, q.name, "0.5", str(procs), stdout=subprocess.PIPE, text=True)
    started = {json.loads(proc.stdout.readline())["started"] for _ in range(2)}
    assert started == {stuck.id, quick.id}
    later = q.enqueue("never")  # enqueued before the signal, not leased after it
    time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    took = time.monotonic() - t0
    assert proc.returncode == 0
    assert took < 0.5 + (ringq_kill_margin() if procs else 0) + 4
    stats = json.loads(out.strip().splitlines()[-1])["stats"]
    assert stats["succeeded"] == 1  # the quick one finished within the grace period
    got = q.get(stuck.id)
    # handed back: READY now, not leased until its visibility timeout
    assert got.state is JobState.READY and got.available_at <= time.time()
    assert "grace" in (got.last_error or "") or "handed back" in (got.last_error or "")
    assert q.get(quick.id).state is JobState.DONE
    again = q.lease_one(wait=1)
    assert again is not None and again.id in (stuck.id, later.id)
    assert q.get(later.id).attempts == (1 if again.id == later.id else 0)


def ringq_kill_margin() -> float:
    from ringq.worker.processes import KILL_MARGIN

    return KILL_MARGIN


def test_stop_leases_nothing_after_it(qdir):
    with Queue(qdir) as q:
        for i in range(3):
            q.enqueue(i)
        ran = []

        def handler(job):
            ran.append(job.payload)
            w.stop()

        w = Worker(q, handler, concurrency=1, grace=0.5, handle_signals=False)
        w.run()
        assert ran == [0]
        assert q.stats().ready == 2 and q.stats().leased == 0


def test_aio_job_timeout_wins_over_its_handlers(tmp_path):
    import asyncio

    from ringq.aio import Queue as AioQueue
    from ringq.aio import Status

    queue = AioQueue(str(tmp_path / "aio"))

    @queue.handler("sleepy", timeout=30)
    async def sleepy(job):
        await asyncio.sleep(10)

    async def main():
        async with queue:
            jid = queue.submit("sleepy", None, timeout=0.2)
            t0 = time.monotonic()
            while queue.get(jid).status is Status.RUNNING:
                await asyncio.sleep(0.02)
            assert time.monotonic() - t0 < 3
            got = queue.get(jid)
            assert got.status is Status.FAILED
            assert got.error == "TimeoutError: handler for 'sleepy' did not finish within 0.2 s"

    asyncio.run(main())
