"""Queue semantics: ordering, delays, retries, DLQ, fencing, payloads, errors, lifecycle."""

import math
import os
import random
import threading

import numpy as np
import pytest
from conftest import SEED

import ringq
from ringq import (
    BackoffPolicy,
    Queue,
    RecordTooLargeError,
)

NOBACKOFF = BackoffPolicy(base=0, jitter=0)


@pytest.fixture
def q(qdir):
    with Queue(qdir, backoff=NOBACKOFF) as queue:
        yield queue


def drain(q, n=1000):
    out = []
    while True:
        jobs = q.lease(n)
        if not jobs:
            return out
        for j in jobs:
            q.ack(j)
        out += jobs


def test_fifo_ties_across_segments(qdir):
    with Queue(qdir, slot_size=128, slot_count=4) as q:
        q.enqueue_many(list(range(50)))
        assert [j.payload for j in drain(q, 7)] == list(range(50))


def _rank(job):
    """The order a lease takes jobs in: priority, then available-at (ms), then FIFO."""
    return (-job.priority, round(job.available_at * 1000), round(job.enqueued_at * 1e6), job.seq)


_seeds = random.Random(SEED)
ORDER_SEEDS = [_seeds.randrange(2**32) for _ in range(3)]


@pytest.mark.parametrize("seed", ORDER_SEEDS)
def test_each_single_lease_takes_the_job_the_order_names_on_a_random_history(qdir, seed):
    # Runs of jobs of mixed priorities across small segments, single jobs, retries (nacked at
    # once) and acks, in a random order (its seed in the test's id): every lease_one() returns
    # the ready job first by priority, then available-at, then FIFO (a model of the order).
    rnd = random.Random(seed)
    ready: dict[str, ringq.Job] = {}
    with Queue(qdir, slot_size=128, slot_count=16, backoff=NOBACKOFF) as q:
        for step in range(600):
            op = rnd.random()
            if op < 0.25:
                prios = [rnd.choice([-1, 0, 0, 3]) for _ in range(rnd.randint(1, 20))]
                for p in set(prios):
                    jobs = q.enqueue_many([step] * prios.count(p), priority=p)
                    ready.update((j.id, j) for j in jobs)
            elif op < 0.35:
                j = q.enqueue(step, priority=rnd.choice([-1, 0, 3]))
                ready[j.id] = j
            else:
                job = q.lease_one()
                if not ready:
                    assert job is None
                    continue
                best = min(ready.values(), key=_rank)
                assert job is not None and (job.id, step) == (best.id, step)
                del ready[job.id]
                if rnd.random() < 0.3:
                    again = q.nack(job, delay=0)  # dead-lettered on its last attempt
                    if again.state is ringq.JobState.READY:
                        ready[again.id] = again
                else:
                    q.ack(job)


def test_nack_with_explicit_delay_and_backoff_jitter_bounds():
    b = BackoffPolicy(base=1, factor=2, max_delay=10, jitter=0.5)
    for attempts, raw in [(1, 1), (2, 2), (3, 4), (10, 10)]:
        for _ in range(50):
            assert raw * 0.5 <= b.delay_for(attempts) <= raw
    with pytest.raises(ValueError):
        BackoffPolicy(jitter=2)


def test_record_too_large_names_the_limit_in_bytes(qdir):
    with Queue(qdir, slot_size=128, slot_count=8) as q:
        with pytest.raises(RecordTooLargeError, match="1024 bytes"):
            q.enqueue(b"x" * 1000)
        q.enqueue(b"x" * (1024 - 64))
        assert len(q.lease_one().payload) == 960


def test_directory_that_cannot_be_created_names_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match=str(blocker)):
        Queue(str(blocker / "q"))


def test_files_are_private_by_default(qdir):
    with Queue(qdir) as q:
        q.enqueue(1)
        q.lease_one()
    assert os.stat(qdir).st_mode & 0o777 == 0o700
    for f in os.listdir(qdir):
        assert os.stat(os.path.join(qdir, f)).st_mode & 0o777 == 0o600, f


def test_fsync_false_means_not_durable(qdir):
    with Queue(qdir, fsync=False) as q:
        assert q.durability == "none"
        q.enqueue(1)
        assert q.lease_one().payload == 1


def test_array_payload_is_read_with_one_copy_out_of_the_mapping(q):
    q.enqueue(np.arange(1000, dtype="<f8"))
    arr = q.lease_one().payload
    # wraps the buffer copied out of the segment: no second copy, and writable
    assert not arr.flags.owndata and arr.flags.writeable
    assert arr.sum() == 499500.0


@pytest.mark.parametrize(
    "kw",
    [
        dict(slot_size=0),
        dict(slot_count=0),
        dict(slot_size=100),
        dict(slot_size=-64),
        dict(slot_count=1.5),
    ],
)
def test_invalid_geometry_is_refused_even_when_the_queue_exists(tmp_path, kw):
    ringq.Queue(str(tmp_path)).close()
    with pytest.raises(ValueError, match="slot_"):
        ringq.Queue(str(tmp_path), **kw)


def test_a_geometry_whose_segment_holds_no_job_is_refused_and_the_smallest_that_does_works(
    tmp_path,
):
    # One 64-byte slot is a record header and nothing else: every enqueue would be refused.
    with pytest.raises(ValueError, match="holds no job"):
        ringq.Queue(str(tmp_path / "a"), slot_size=64, slot_count=1)
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
    q = ringq.Queue(str(tmp_path / "b"), slot_size=64, slot_count=2)
    q.enqueue_many([1, 2])
    assert [j.payload for j in q.lease(5)] == [1, 2]


@pytest.mark.parametrize(
    "lock_timeout", [float("nan"), -1, -0.001, -math.inf, True, None, "10"], ids=repr
)
def test_a_bad_lock_timeout_is_refused_before_anything_is_created(tmp_path, lock_timeout):
    path = tmp_path / "q"
    with pytest.raises(ValueError, match="lock_timeout must be a number of seconds >= 0"):
        ringq.Queue(str(path), lock_timeout=lock_timeout)
    assert not path.exists()
    from ringq.engine.upgrade import upgrade

    with pytest.raises(ValueError, match="lock_timeout"):
        upgrade(tmp_path, lock_timeout=lock_timeout)


def test_another_valid_geometry_on_an_existing_queue_is_ignored_with_a_warning(tmp_path):
    with ringq.Queue(str(tmp_path), slot_size=512) as q:
        q.enqueue("kept")
    from ringq.local.queue import GeometryWarning

    with pytest.warns(
        GeometryWarning, match="created with slot_size=512; slot_size=1024 is ignored"
    ):
        ringq.Queue(str(tmp_path), slot_size=1024).close()
    with ringq.Queue(str(tmp_path), slot_size=512) as q, ringq.Queue(str(tmp_path)) as default:
        assert q.stats().ready == default.stats().ready == 1


def test_an_int_too_large_for_a_float_waits_as_long_as_it_takes_not_overflows(tmp_path):
    # wait= and lock_timeout= take math.inf; an int past a float's range means the same.
    q = ringq.Queue(str(tmp_path), lock_timeout=10**400)
    q.enqueue(1)
    assert q.lease_one(wait=10**400).payload == 1
    q.enqueue(2)
    assert [j.payload for j in q.lease(5, wait=10**400)] == [2]


def test_after_the_first_lease_the_calls_a_program_repeats_import_nothing(tmp_path):
    # An exception a signal's handler raises inside an import can leave the interpreter's import
    # lock held for good: the calls a program makes over and over import no module once the queue
    # is open and its reader built (OpenTelemetry, if installed, is looked for by Queue()).
    import subprocess
    import sys

    from procs import child_env

    code = """
import sys
from ringq import Queue
q = Queue(sys.argv[1])
before = set(sys.modules)
q.enqueue({"a": 1})
q.enqueue("x", priority=2, delay=0.5, max_attempts=3, key="k", expires_in=60, timeout=5)
q.enqueue_many([{"b": 2}, b"raw"])
new = sorted(set(sys.modules) - before)
assert new == [], ("enqueue imported", new)
q.ack(q.lease_one())  # the reader is built (numpy and its classes imported)
before = set(sys.modules)
q.nack(q.lease_one(), error="again")
for job in q.lease(10, wait=0.05):
    q.ack(job)
assert q.lease_one(wait=0.05) is None
q.enqueue({"c": 3}, job_id="one")
q.ack(q.lease_one(wait=1))
new = sorted(set(sys.modules) - before)
assert new == [], ("lease, ack or nack imported", new)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, env=child_env())
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("wait", [None, 5.0])
def test_a_lane_another_consumer_emptied_leases_the_jobs_appended_after(qdir, wait):
    # This queue object's index holds a lane whose every job another consumer leased: its next
    # lease finds the lane empty (and drops it), and jobs appended to the lane after that --
    # before the lease, or while it waits -- are leased, in order, by the next ones.
    a = Queue(qdir, name="q")
    b = Queue(qdir, name="q")
    try:
        a.enqueue_many([{"i": i} for i in range(4)])
        a.ack(a.lease_one())
        assert [j.payload["i"] for j in b.lease(10)] == [1, 2, 3]
        assert a.lease_one() is None
        if wait is None:
            b.enqueue_many([{"i": 4}, {"i": 5}])
        else:
            later = threading.Timer(0.2, lambda: b.enqueue_many([{"i": 4}, {"i": 5}]))
            later.start()
        first = a.lease_one(wait=wait)
        second = a.lease_one(wait=wait)
        assert first is not None and second is not None
        assert (first.payload["i"], second.payload["i"]) == (4, 5)
        assert a.lease_one() is None
    finally:
        a.close()
        b.close()
