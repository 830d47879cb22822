"""Invariants 3, 5, 6 and 7 of docs/design.md (Invariants), each with a test that can fail.

(1, 2 and 4 are enumerated in test_crash_torn.py / test_crash_bits.py and hammered by the torture.)
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from crashkit import NAME, drain, open_queue, verify

from ringq.errors import LockTimeoutError, NotLeasedError

# -- 3: at most one live lease; a stale holder is rejected, loudly ----------------------------------------


def test_stale_holder_is_rejected_after_expiry(tmp_path):
    with open_queue(str(tmp_path)) as a, open_queue(str(tmp_path)) as b:
        a.enqueue("j")
        old = a.lease_one(visibility_timeout=0.05)
        time.sleep(0.1)
        new = b.lease_one(wait=2)  # expiry is noticed by the next reaper pass (0.25 s)
        assert new is not None and int(new.lease_token) == int(old.lease_token) + 1
        for op in (lambda: a.ack(old), lambda: a.nack(old), lambda: a.extend(old, 5)):
            with pytest.raises(NotLeasedError, match="stale|not leased"):
                op()
        b.ack(new)
        assert b.lease_one() is None and a.lease_one() is None


DIE_HOLDING = textwrap.dedent("""
    import json, os, sys, time
    sys.path[:0] = json.loads(sys.argv[2])
    import crashkit
    q = crashkit.open_queue(sys.argv[1])
    job = q.lease_one()
    print(job.payload, flush=True)
    time.sleep(60)
""")


def test_dead_holders_lease_comes_back_at_once(tmp_path):
    with open_queue(str(tmp_path)) as q:  # visibility timeout 600 s: only death can free it
        q.enqueue("held")
        child = subprocess.Popen(
            [sys.executable, "-c", DIE_HOLDING, str(tmp_path), __import__("json").dumps(sys.path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout.readline().strip() == "held"
        assert q.lease_one() is None  # a live holder keeps it
        child.send_signal(signal.SIGKILL)
        child.wait()
        t = time.monotonic()
        job = q.lease_one(wait=5)
        assert job is not None and job.payload == "held" and time.monotonic() - t < 2
        assert job.last_error and "died" in job.last_error
        q.ack(job)


# -- 5: readers never need the lock; writers never cache kernel state across it ----------------------------


def test_readers_work_while_the_writer_lock_is_held(tmp_path):
    with open_queue(str(tmp_path)) as q:
        q.enqueue_many(list(range(5)))
        fd = os.open(os.path.join(tmp_path, f"{NAME}.lock"), os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # another holder (a stuck producer)
        with pytest.raises(LockTimeoutError):  # opening recovers under the lock: it waits, typed
            open_queue(str(tmp_path), lock_timeout=0.2)
        try:
            jobs = q.lease(5)
            for j in jobs[:2]:
                q.ack(j)
            q.nack(jobs[2], delay=0)
            q.extend(jobs[3], 10)
            assert q.stats().done == 2 and not verify(q).damaged
        finally:
            os.close(fd)


def test_two_writers_interleaving_never_overwrite_each_other(tmp_path):
    with open_queue(str(tmp_path)) as a, open_queue(str(tmp_path)) as b:
        for i in range(30):  # each append reads the tail afresh under the lock: rotations included
            (a if i % 3 else b).enqueue_many([i] * (1 + i % 4))
        got = drain(a)
    assert sorted(got) == sorted(x for i in range(30) for x in [i] * (1 + i % 4))


# -- 6: values decided by a writer are stored absolute; reopening never re-decides them ---------------------


def test_delays_and_backoff_survive_reopening_unchanged(tmp_path):
    with open_queue(str(tmp_path)) as q:
        d = q.enqueue("delayed", delay=30)
        q.enqueue("retry")
        job = q.lease_one()
        back = q.nack(job)  # jittered backoff, decided now
    time.sleep(0.05)
    with open_queue(str(tmp_path)) as q:
        assert q.get(d.id).available_at == d.available_at
        assert q.get(back.id).available_at == back.available_at
        assert q.get(back.id).attempts == 1


# -- 7: disk use bounded by live jobs plus a constant number of segments ------------------------------------


def _segments(path):
    return [f for f in os.listdir(path) if f.endswith(".seg")]


def test_disk_bounded_when_everything_finishes(tmp_path):
    with open_queue(str(tmp_path), durability="none") as q:
        for i in range(200):
            q.enqueue_many([i] * 5)
            for j in q.lease(5):
                q.ack(j)
        assert len(_segments(tmp_path)) <= 2


@pytest.mark.parametrize("straggler", ["delayed", "dead"])
def test_disk_bounded_with_stragglers(tmp_path, straggler):
    """Stragglers (long-delayed or dead-lettered jobs) of finished segments are relocated to the
    tail, so one of them never keeps a whole segment alive; they stay retrievable with their
    attempts and last error."""
    with open_queue(str(tmp_path), durability="none", max_attempts=1) as q:
        for i in range(20):
            if straggler == "delayed":
                q.enqueue("later", delay=3600)
            else:
                q.enqueue("doomed")
                q.nack(q.lease_one())  # max_attempts=1: dead-lettered
            q.enqueue_many([i] * 7)
            for j in q.lease(7):
                q.ack(j)
        # 20 live jobs fit in 3 segments; the ring should not hold one segment per straggler.
        assert len(_segments(tmp_path)) <= 6
        st = q.stats()
        assert (st.delayed, st.dead) == ((20, 0) if straggler == "delayed" else (0, 20))
        jobs = q.list_jobs("dead" if straggler == "dead" else "ready")
        assert len(jobs) == 20 and len({j.id for j in jobs}) == 20
        if straggler == "dead":
            assert all(j.attempts == 1 and j.last_error is None for j in jobs)
            assert q.requeue_dead() == 20 and q.stats().ready == 20
        else:
            assert all(j.available_at > time.time() + 3000 for j in jobs)
    with open_queue(str(tmp_path), durability="none") as q:  # and after reopening
        st = q.stats()
        assert st.ready + st.delayed + st.dead == 20 and st.leased == 0


def test_claimer_killed_between_its_two_cas_does_not_strand_the_job(tmp_path):
    """A claim stores the state word, then the owner word; a claimer SIGKILLed in between leaves
    a lease with no owner, which must come back after CLAIM_GRACE, not after the visibility
    timeout (600 s here)."""
    from ringq.engine.reaper import CLAIM_GRACE
    from ringq.engine.segment import Segment, segment_name
    from ringq.engine.words import ST_LEASED, pack

    with open_queue(str(tmp_path)) as q:
        q.enqueue("stranded")
        seg = Segment(os.path.join(str(tmp_path), segment_name(q.name, q.introspect()["tail_segment"])))
        w = seg.load_state(0)
        far = int(time.time() * 1000) + 600_000 - seg.epoch_ms
        assert seg.cas_state(0, w, pack(ST_LEASED, 0, 1, far))[0]  # ...and then the kill
        seg.close()
    with open_queue(str(tmp_path)) as q:
        t = time.monotonic()
        job = q.lease_one(wait=CLAIM_GRACE + 3)
        assert job is not None and job.payload == "stranded" and job.lease_token == "2"
        assert time.monotonic() - t < CLAIM_GRACE + 2
        q.ack(job)
