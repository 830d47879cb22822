"""A Worker thread whose handler is given up (its hard timeout passed, or a drain's grace period
ran out) gives back the leases its stream holds and has not handed out: they go back to READY
uncharged at once, instead of staying leased by a thread that may never return for them (and
being reclaimed at their visibility timeout with an attempt counted).  Real threads, a real
queue directory."""

from __future__ import annotations

import threading
import time

from ringq import BackoffPolicy, JobState, Queue, Worker

NOBACKOFF = BackoffPolicy(base=0, jitter=0)


def _drive(tmp_path, **worker_options):
    """300 fast jobs (the stream's batches grow to tens of jobs), then one batch of
    [fast, hang, fast x 200], all with max_attempts=1; returns (queue, jobs of the batch, the
    hanging job's release, the runner thread, the worker)."""
    release = threading.Event()

    def handler(job):
        if job.payload == "hang":
            release.wait(30)

    q = Queue(tmp_path / "q", backoff=NOBACKOFF, visibility_timeout=4.0)
    q.enqueue_many(["warm"] * 300, max_attempts=1)
    w = Worker(q, handler, handle_signals=False, **worker_options)
    runner = threading.Thread(target=w.run)
    runner.start()
    deadline = time.monotonic() + 20
    while q.stats().acked_total < 300 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert q.stats().acked_total == 300
    jobs = q.enqueue_many(["fast", "hang"] + ["fast"] * 200, max_attempts=1)
    return q, jobs, release, runner, w


def _others_done(q, jobs, hang_id, within: float) -> list[tuple[JobState, int]]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        states = [q.get(j.id) for j in jobs if j.id != hang_id]
        if all(j.state is JobState.DONE for j in states):
            break
        time.sleep(0.01)
    return [(j.state, j.attempts) for j in (q.get(j.id) for j in jobs if j.id != hang_id)]


def test_a_timed_out_threads_unstarted_batch_goes_back_uncharged(tmp_path):
    q, jobs, release, runner, w = _drive(tmp_path, timeout=0.5)
    try:
        # Within the 4 s visibility timeout: nothing waited for the batch's leases to expire.
        others = _others_done(q, jobs, jobs[1].id, within=3.0)
        assert {s for s, _ in others} == {JobState.DONE}, others
        assert {a for _, a in others} == {1}
        hang = q.get(jobs[1].id)
        assert hang.state is JobState.DEAD and hang.last_error == "timeout after 0.5 s"
        assert q.stats().dead == 1
    finally:
        release.set()
        w.stop()
        runner.join(30)
        q.close()
    assert not runner.is_alive()


def test_a_drain_past_its_grace_gives_back_the_stuck_threads_batch_uncharged(tmp_path):
    q, jobs, release, runner, w = _drive(tmp_path, grace=0.3)
    try:
        deadline = time.monotonic() + 10
        while q.get(jobs[1].id).state is not JobState.LEASED and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # the handler is in its wait
        w.stop()
        runner.join(10)  # returns after the grace period, the handler still stuck
        assert not runner.is_alive()
        hang = q.get(jobs[1].id)  # handed back, its attempt counted (docs/operations.md)
        assert hang.state is JobState.DEAD and "grace period" in (hang.last_error or "")
        assert w.stats.dead == 1  # handed back on its last attempt: counted as dead-lettered
        left = [q.get(j.id) for j in jobs[2:]]
        # Every job after the stuck one is READY again with no attempt counted (or was run
        # before the stop), none leased and waiting for its visibility timeout.
        assert [j for j in left if j.state is JobState.LEASED] == []
        assert {(j.state, j.attempts) for j in left} <= {(JobState.READY, 0), (JobState.DONE, 1)}
        assert any(j.state is JobState.READY for j in left)
    finally:
        release.set()
        q.close()


def _hangs(job, every: int) -> bool:
    """The jobs that hang past the timeout on their first attempt: one in ``every``."""
    return job.attempts == 1 and int(job.id, 16) % every == 3


def _check_history(q, seen: list[tuple[str, str, int]], n: int, every: int) -> None:
    """Every handler call got a (job, fencing token) pair no other call got; every job is done,
    a hanging one after exactly two attempts, every other one after exactly one."""
    pairs = [(jid, tok) for jid, tok, _ in seen]
    assert len(pairs) == len(set(pairs)), "a lease handed to two handlers"
    jobs = q.list_jobs(limit=n + 10)
    assert len(jobs) == n and {j.state for j in jobs} == {JobState.DONE}, q.stats()
    for j in jobs:
        assert j.attempts == (2 if int(j.id, 16) % every == 3 else 1), (j.id, j.attempts)


def test_timeouts_under_concurrency_hand_out_each_lease_once_and_charge_only_the_hung(tmp_path):
    # Four threads, four jobs hanging past the timeout until the end (each stuck thread is
    # replaced, up to `concurrency` of them): each give-up closes
    # a stream from the heartbeat thread while the other threads lease, run and ack around it.
    # A stream left open would keep its batch leased until the 3 s visibility timeout, and those
    # jobs would come back charged.
    seen: list[tuple[str, str, int]] = []
    release = threading.Event()

    def handler(job):
        seen.append((job.id, job.lease_token, job.attempts))
        if _hangs(job, 40):
            release.wait(20)

    n = 160
    with Queue(tmp_path / "q", backoff=NOBACKOFF, visibility_timeout=3.0) as q:
        q.enqueue_many([{"i": i} for i in range(n)], max_attempts=3)
        w = Worker(q, handler, concurrency=4, timeout=0.15, handle_signals=False)
        runner = threading.Thread(target=w.run)
        runner.start()
        try:
            deadline = time.monotonic() + 15
            while q.stats().acked_total < n and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            release.set()
            w.stop()
            runner.join(30)
        assert not runner.is_alive()
        _check_history(q, seen, n, 40)


def test_process_kills_hand_out_each_lease_once_and_charge_only_the_hung(tmp_path):
    # Two children, a job in eight hanging: each hang kills its child, whose batch goes back.
    log = tmp_path / "handled"

    def handler(job):
        with open(log, "a") as f:
            f.write(f"{job.id} {job.lease_token} {job.attempts}\n")
        if _hangs(job, 8):
            time.sleep(30)  # until its child is killed

    n = 80
    with Queue(tmp_path / "q", backoff=NOBACKOFF, visibility_timeout=30.0) as q:
        q.enqueue_many([{"i": i} for i in range(n)], max_attempts=3)
        w = Worker(
            q, handler, processes=2, timeout=0.3, idle_timeout=1.5, handle_signals=False
        )
        w.run()
        seen = [tuple(line.split()) for line in log.read_text().splitlines()]
        _check_history(q, [(a, b, int(c)) for a, b, c in seen], n, 8)
        assert w.pool is not None and w.pool.timeouts == n // 8
