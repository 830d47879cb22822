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
        left = [q.get(j.id) for j in jobs[2:]]
        # Every job after the stuck one is READY again with no attempt counted (or was run
        # before the stop), none leased and waiting for its visibility timeout.
        assert [j for j in left if j.state is JobState.LEASED] == []
        assert {(j.state, j.attempts) for j in left} <= {(JobState.READY, 0), (JobState.DONE, 1)}
        assert any(j.state is JobState.READY for j in left)
    finally:
        release.set()
        q.close()
