"""Queue semantics: ordering, delays, retries, DLQ, fencing, payloads, errors, lifecycle."""

import math
import os
import time

import numpy as np
import pytest

from ringq import (
    BackoffPolicy,
    JobNotFoundError,
    JobState,
    NotLeasedError,
    Queue,
    QueueClosedError,
    RecordTooLargeError,
    SerializationError,
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


def test_priority_first_then_fifo(q):
    q.enqueue("low-1", priority=-1)
    q.enqueue_many(["mid-1", "mid-2"])
    q.enqueue("high", priority=10)
    q.enqueue("mid-3")
    q.enqueue("low-2", priority=-1)
    assert [j.payload for j in drain(q)] == ["high", "mid-1", "mid-2", "mid-3", "low-1", "low-2"]


def test_fifo_ties_across_segments(qdir):
    with Queue(qdir, slot_size=128, slot_count=4) as q:
        q.enqueue_many(list(range(50)))
        assert [j.payload for j in drain(q, 7)] == list(range(50))


def test_delayed_jobs_never_block_due_ones(q):
    q.enqueue("later", delay=0.4)
    q.enqueue("now")
    assert q.lease_one().payload == "now"
    assert q.lease_one() is None
    st = q.stats()
    assert (st.ready, st.delayed, st.leased) == (0, 1, 1)
    t = time.time()
    job = q.lease_one(wait=5)
    assert job.payload == "later" and time.time() - t >= 0.2
    assert job.available_at <= time.time()


def test_retries_then_dead_letter(qdir):
    with Queue(qdir, max_attempts=3, backoff=NOBACKOFF) as q:
        q.enqueue({"x": 1})
        for attempt in (1, 2, 3):
            job = q.lease_one()
            assert job.attempts == attempt
            after = q.nack(job, error=f"failure {attempt}")
        assert after.state is JobState.DEAD
        assert q.lease_one() is None
        dead = q.dlq()
        assert [d.last_error for d in dead] == ["failure 3"] and dead[0].attempts == 3
        assert q.requeue_dead() == 1
        again = q.lease_one()
        assert again.attempts == 1 and again.id == dead[0].id and again.payload == {"x": 1}
        q.ack(again)
        assert q.dlq() == [] and q.get(again.id).state is JobState.DONE


def test_backoff_delay_is_stored_absolute(qdir):
    with Queue(qdir, backoff=BackoffPolicy(base=30, jitter=0)) as q:
        q.enqueue("j")
        job = q.nack(q.lease_one(), error="e")
        assert job.state is JobState.READY and 29 < job.available_at - time.time() <= 30.5
    with Queue(qdir) as q2:  # reopening never re-draws it
        assert q2.get(job.id).available_at == job.available_at
        assert q2.lease_one() is None and q2.stats().delayed == 1


def test_nack_with_explicit_delay_and_backoff_jitter_bounds():
    b = BackoffPolicy(base=1, factor=2, max_delay=10, jitter=0.5)
    for attempts, raw in [(1, 1), (2, 2), (3, 4), (10, 10)]:
        for _ in range(50):
            assert raw * 0.5 <= b.delay_for(attempts) <= raw
    with pytest.raises(ValueError):
        BackoffPolicy(jitter=2)


def test_fencing_token_rejects_stale_holder(qdir):
    with Queue(qdir, visibility_timeout=0.2) as q:
        q.enqueue("x")
        first = q.lease_one()
        time.sleep(0.3)
        second = q.lease_one()
        assert int(second.lease_token) == int(first.lease_token) + 1 and second.attempts == 2
        assert second.last_error.startswith("lease expired")
        with pytest.raises(NotLeasedError, match="stale"):
            q.ack(first)
        with pytest.raises(NotLeasedError):
            q.nack(first)
        with pytest.raises(NotLeasedError):
            q.extend(first, 10)
        q.ack(second)
        q.ack(second)  # acking twice is harmless
        with pytest.raises(NotLeasedError):
            q.nack(second)


def test_ack_of_a_ready_job_is_refused(q):
    job = q.enqueue("x")
    with pytest.raises(NotLeasedError, match="not leased"):
        q.ack(job.id)


def test_extend_pushes_the_deadline(qdir):
    with Queue(qdir, visibility_timeout=0.3) as q:
        q.enqueue("x")
        job = q.lease_one()
        ext = q.extend(job, 5)
        assert ext.lease_deadline > job.lease_deadline + 4
        time.sleep(0.4)
        assert q.lease_one() is None
        q.ack(job)


def test_expired_lease_counts_as_an_attempt_and_can_dead_letter(qdir):
    with Queue(qdir, visibility_timeout=0.1, max_attempts=1) as q:
        q.enqueue("x")
        q.lease_one()
        time.sleep(0.35)
        assert q.lease_one() is None
        [dead] = q.dlq()
        assert dead.attempts == 1 and "expired" in dead.last_error


JSON_VALUES = [None, True, False, 0, -1, 2**63, 1.5, -0.0, 1e300, "", "héllo ✓ 🎉", [], {}, [1, [2, [3]]],
               {"a": {"b": None, "c": [1.25, "x"]}}, "\u0000nul"]


@pytest.mark.parametrize("value", JSON_VALUES, ids=range(len(JSON_VALUES)))
def test_payload_round_trip_of_every_json_type(q, value):
    q.enqueue(value)
    got = q.lease_one().payload
    assert got == value and type(got) is type(value)


def test_bytes_and_arrays_round_trip_exactly(q):
    q.enqueue(b"\x00\xffraw")
    arrays = [np.arange(12, dtype=">i4").reshape(3, 4), np.array([1.5, np.nan], dtype="<f8"), np.zeros((0, 3), "u1"),
              np.array(7, dtype=np.complex64), np.array([b"ab", b"c"], dtype="S2")]
    for a in arrays:
        q.enqueue(a)
    assert q.lease_one().payload == b"\x00\xffraw"
    for a in arrays:
        got = q.lease_one().payload
        assert got.dtype == a.dtype and got.shape == a.shape
        assert np.array_equal(got, a, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("bad", [object(), {1, 2}, float("nan"), math.inf, {"k": b"bytes inside json"},
                                 "\ud800 lone surrogate", np.array([object()])])
def test_unserialisable_payload_writes_nothing_and_queue_stays_usable(q, bad):
    q.enqueue("before")
    with pytest.raises(SerializationError):
        q.enqueue_many(["fine", bad])
    assert q.stats().total == 1
    q.enqueue("after")
    assert [j.payload for j in drain(q)] == ["before", "after"]


def test_record_too_large_names_the_limit_in_bytes(qdir):
    with Queue(qdir, slot_size=128, slot_count=8) as q:
        with pytest.raises(RecordTooLargeError, match="1024 bytes"):
            q.enqueue(b"x" * 1000)
        q.enqueue(b"x" * (1024 - 64))
        assert len(q.lease_one().payload) == 960


def test_idempotent_job_ids(q):
    a = q.enqueue("first", job_id="order-42")
    b = q.enqueue("second", job_id="order-42")
    assert a.id == b.id == "order-42" and b.payload == "first"
    jobs = q.enqueue_many(["x", "y", "z"], job_ids=["k1", "order-42", "k1"])
    assert [j.payload for j in jobs] == ["x", "first", "x"]
    assert q.stats().total == 2
    assert q.get("k1").payload == "x"


def test_idempotent_ids_hold_across_reopen(qdir):
    with Queue(qdir) as q:
        q.enqueue("v1", job_id="same")
    with Queue(qdir) as q:
        assert q.enqueue("v2", job_id="same").payload == "v1"
        assert len(q) == 1


def test_get_list_and_unknown_ids(q):
    jobs = q.enqueue_many(["a", "b", "c"])
    assert q.get(jobs[1].id).payload == "b"
    with pytest.raises(JobNotFoundError, match="nope"):
        q.get("nope")
    with pytest.raises(JobNotFoundError):
        q.get("00000000000000ff")
    leased = q.lease_one()
    assert [j.payload for j in q.list_jobs(JobState.LEASED)] == [leased.payload]
    assert [j.payload for j in q.list_jobs("ready", limit=1)] == ["b"]
    assert [j.seq for j in q.list_jobs()] == sorted(j.seq for j in jobs)
    assert q.get(leased.id).to_dict()["state"] == "leased"


def test_purge_removes_everything(q):
    q.enqueue_many(list(range(10)))
    q.enqueue("later", delay=100)
    q.lease(3)
    assert q.purge() == 11
    assert q.stats().total == 0 and q.lease_one() is None
    q.enqueue("fresh")
    assert q.lease_one().payload == "fresh"


def test_close_is_idempotent_and_use_after_close_raises(qdir):
    q = Queue(qdir)
    q.enqueue(1)
    q.close()
    q.close()
    for call in (lambda: q.enqueue(1), lambda: q.lease(), q.stats, lambda: q.ack("x")):
        with pytest.raises(QueueClosedError):
            call()


def test_bad_arguments_are_value_errors(q):
    for call in (lambda: q.enqueue(1, delay=-1), lambda: q.enqueue(1, max_attempts=0), lambda: q.lease(0),
                 lambda: q.enqueue(1, priority=2**40), lambda: q.enqueue_many([1], job_ids=["a", "b"])):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(ValueError):
        Queue(q.path, "bad/name")


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
