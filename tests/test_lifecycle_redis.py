"""Cancellation, expiry, whole-queue pause and progress on the Redis backend, against a real
redis-server (docs/lifecycle.md, "On the Redis backend")."""

import threading
import time
import uuid

import pytest
from procs import run_py

import ringq
from ringq import JobFinishedError, JobState, NotLeasedError, Worker


def _q(url, **kw):
    return ringq.connect(url, f"l{uuid.uuid4().hex[:12]}", **kw)


def test_cancel_on_redis(redis_url):
    with _q(redis_url, visibility_timeout=0.3) as q:
        a, b, c = q.enqueue("a"), q.enqueue("b", delay=60), q.enqueue("c")
        assert q.cancel(a).state is JobState.CANCELLED
        assert q.cancel(b.id).state is JobState.CANCELLED
        assert q.cancel(a.id).state is JobState.CANCELLED  # again: harmless
        job = q.lease_one()
        assert job.id == c.id and q.lease_one() is None
        marked = q.cancel(job)
        assert marked.state is JobState.LEASED and marked.cancel_requested
        assert q.extend(job, 5).cancel_requested
        q.ack(job)
        assert q.get(c.id).state is JobState.CANCELLED
        with pytest.raises(NotLeasedError, match="cancelled"):
            q.nack(job)
        d = q.enqueue("d")
        q.ack(q.lease_one())
        with pytest.raises(JobFinishedError, match="done"):
            q.cancel(d.id)
        # nack and an expired lease of a cancel-requested job end it cancelled, never retried
        e, f = q.enqueue("e"), q.enqueue("f")
        je, jf = q.lease(2)
        q.cancel(e)
        q.cancel(f)
        assert q.nack(je).state is JobState.CANCELLED
        assert q.lease_one(wait=1.0) is None  # jf's lease expires meanwhile: cancelled, not leased
        assert q.get(f.id).state is JobState.CANCELLED
        st = q.stats()
        assert (st.cancelled, st.done, st.ready, st.leased) == (5, 1, 0, 0)
        assert {j.id for j in q.list_jobs("cancelled")} == {a.id, b.id, c.id, e.id, f.id}


def test_expiry_on_redis(redis_url):
    with _q(redis_url) as q:
        soon = q.enqueue("soon", expires_in=0.05)
        later = q.enqueue("later", expires_at=time.time() + 600)
        time.sleep(0.1)
        got = q.lease(5)
        assert [j.id for j in got] == [later.id]
        assert got[0].expires_at == pytest.approx(later.expires_at)
        assert q.get(soon.id).state is JobState.EXPIRED
        assert q.stats().expired == 1


def test_pause_on_redis_holds_every_process_until_resumed(redis_url):
    with _q(redis_url) as q:
        q.enqueue("x")
        q.pause()
        assert q.paused() == {"queue": True, "keys": []}
        r = run_py(
            "import sys, ringq\nq = ringq.connect(sys.argv[1], sys.argv[2])\n"
            "print(len(q.lease(5, wait=0.3)))\nq.close()",
            redis_url,
            q.name,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "0"
        with pytest.raises(ValueError):
            q.pause(key="k")
        got = {}
        waiter = threading.Thread(target=lambda: got.setdefault("j", q.lease_one(wait=30)))
        waiter.start()
        time.sleep(0.2)
        q2 = ringq.connect(redis_url, q.name)
        q2.resume()
        q2.close()
        waiter.join(30)
        assert got["j"].payload == "x"


def test_progress_on_redis_is_fenced(redis_url):
    with _q(redis_url, visibility_timeout=0.2) as q:
        q.enqueue("p")
        job = q.lease_one()
        q.progress(job, 0.5, "half")
        assert (q.get(job.id).progress, q.get(job.id).progress_message) == (0.5, "half")
        time.sleep(0.25)
        again = q.lease_one(wait=2)
        assert again.progress is None
        with pytest.raises(NotLeasedError):
            q.progress(job, 0.9)
        with pytest.raises(ValueError):
            q.progress(again, -0.1)


def test_a_worker_on_redis_sees_a_cancel_within_a_heartbeat(redis_url):
    with _q(redis_url, visibility_timeout=3) as q:
        job = q.enqueue("long")
        seen = threading.Event()

        def handler(j):
            seen.set()
            assert j.cancelled.wait(30)

        w = Worker(q, handler, heartbeat=0.2, idle_timeout=0.5, handle_signals=False)
        runner = threading.Thread(target=w.run)
        runner.start()
        assert seen.wait(30)
        q.cancel(job.id)
        runner.join(60)
        assert not runner.is_alive()
        assert q.get(job.id).state is JobState.CANCELLED
        assert w.stats.succeeded == 1


def test_results_on_redis(redis_url):
    from ringq import ResultNotFoundError

    with _q(redis_url) as q:
        job = q.enqueue({"n": 2})
        got = {}
        waiter = threading.Thread(target=lambda: got.setdefault("r", q.result(job.id, wait=30)))
        waiter.start()
        r = run_py(
            "import sys, ringq\nq = ringq.connect(sys.argv[1], sys.argv[2])\n"
            "j = q.lease_one(wait=10)\nq.ack(j, result=j.payload['n'] * 21)\nq.close()",
            redis_url,
            q.name,
        )
        assert r.returncode == 0, r.stderr
        waiter.join(30)
        assert got["r"] == 42
        assert q.get(job.id).state is JobState.DONE
        other = q.enqueue("o")
        q.cancel(other)
        with pytest.raises(ResultNotFoundError, match="cancelled"):
            q.result(other.id, wait=10)
        q.enqueue("s")
        held = q.lease_one()
        stale = ringq.Job.from_dict(dict(held.to_dict(), lease_token="99"))
        with pytest.raises(NotLeasedError):
            q.ack(stale, result=1)
        with pytest.raises(ResultNotFoundError):
            q.result(held.id)


def test_a_result_stored_while_its_lease_ran_out_is_never_the_jobs_on_redis(redis_url):
    # A result large enough that storing it outlasts the lease: the holder's check passes, the
    # result is written, the ack is refused; the job's result is the next holder's, while the
    # job is kept and once it is gone (retain_done=0: at once).
    from ringq import JobNotFoundError

    big = bytes(32 << 20)
    with _q(redis_url, retain_done=0) as q, ringq.connect(redis_url, f"{q.name}-results") as rq:
        for _ in range(5):  # until the store outlasted the lease (the check passing first)
            job = q.enqueue("x")
            held = q.lease_one(visibility_timeout=0.02)
            try:
                q.ack(held, result=big)
            except NotLeasedError:
                try:
                    rq.get(f"~{held.seq}.1~{job.id}")
                except JobNotFoundError:
                    continue  # refused at the check: nothing stored, try again
                break
        else:
            pytest.fail("the lease never ran out while its result was stored")
        again = q.lease_one(wait=2)
        assert again is not None and again.id == job.id and again.lease_token == "2"
        q.ack(again, result="fresh")
        with pytest.raises(JobNotFoundError):
            q.get(job.id)
        assert q.result(job.id) == "fresh"
