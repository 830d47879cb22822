"""Queue semantics every backend must share: one suite, run on a local directory and on Redis.

``queue_factory(**options)`` opens the test's queue (the same queue on every call, as reopening a
directory would) through ``ringq.connect``.  Tests about files, segments or the local engine stay
in test_queue.py and the other local-only modules.
"""

import math
import time

import numpy as np
import pytest

import ringq
from ringq import (
    BackoffPolicy,
    JobNotFoundError,
    JobState,
    NotLeasedError,
    QueueClosedError,
    SerializationError,
)

NOBACKOFF = BackoffPolicy(base=0, jitter=0)


@pytest.fixture
def q(queue_factory):
    return queue_factory(backoff=NOBACKOFF)


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


def test_jobs_that_arrive_between_single_leases_take_their_place_in_the_order(q):
    # One job at a time from one run of equal jobs, while jobs that rank elsewhere arrive: a
    # higher priority (first), the retry of a nacked job (available from its nack, so after the
    # jobs available before it), a lower priority (last); each lease returns the best job then.
    q.enqueue_many([f"mid-{i}" for i in range(5)])
    first = q.lease_one()
    assert first.payload == "mid-0"
    q.enqueue("high", priority=5)
    assert q.lease_one().payload == "high"
    q.nack(first, delay=0)
    got = [q.lease_one() for _ in range(3)]
    assert [j.payload for j in got] == ["mid-1", "mid-2", "mid-3"]
    q.enqueue("higher", priority=7)
    q.enqueue("low", priority=-1)
    assert [j.payload for j in drain(q, 1)] == ["higher", "mid-4", "mid-0", "low"]
    for job in got:
        q.ack(job)


def test_extreme_priorities_order(q):
    q.enqueue_many(["min"], priority=-(2**31))
    q.enqueue_many(["max"], priority=2**31 - 1)
    q.enqueue("zero")
    assert [j.payload for j in drain(q, 1)] == ["max", "zero", "min"]


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
    assert job.available_at <= time.time() + 0.05


def test_retries_then_dead_letter(queue_factory):
    q = queue_factory(max_attempts=3, backoff=NOBACKOFF)
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


def test_requeue_one_dead_job_and_refusals(queue_factory):
    q = queue_factory(max_attempts=1)
    a, b = q.enqueue_many(["a", "b"])
    for j in q.lease(2):
        q.nack(j, error="no")
    assert q.requeue_dead(a.id) == 1
    with pytest.raises(NotLeasedError, match="dead-letter"):
        q.requeue_dead(a.id)
    with pytest.raises(JobNotFoundError):
        q.requeue_dead("missing")
    assert [j.id for j in q.dlq()] == [b.id] and q.lease_one().id == a.id


def test_backoff_delay_is_stored_absolute(queue_factory):
    q = queue_factory(backoff=BackoffPolicy(base=30, jitter=0))
    q.enqueue("j")
    job = q.nack(q.lease_one(), error="e")
    assert job.state is JobState.READY and 29 < job.available_at - time.time() <= 30.5
    q.close()
    q2 = queue_factory()  # reopening never re-draws it
    assert q2.get(job.id).available_at == job.available_at
    assert q2.lease_one() is None and q2.stats().delayed == 1


def test_backoff_with_jitter_stays_within_its_bounds(queue_factory):
    q = queue_factory(backoff=BackoffPolicy(base=20, jitter=0.5))
    q.enqueue_many(list(range(20)))
    delays = [q.nack(j).available_at - time.time() for j in q.lease(20)]
    assert all(9 <= d <= 20.5 for d in delays) and len({round(d, 2) for d in delays}) > 1


def test_fencing_token_rejects_stale_holder(queue_factory):
    q = queue_factory(visibility_timeout=0.2)
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


def test_ack_many_acks_what_it_can_then_raises(q):
    q.enqueue_many(["a", "b", "c"])
    a, b, c = q.lease(3)
    q.ack(b)
    q.ack_many([a, b, c])
    assert q.stats().done == 3
    d = q.enqueue("d")
    with pytest.raises(NotLeasedError):
        q.ack_many([d, q.enqueue("e").id])
    q.ack_many([])


def test_extend_pushes_the_deadline(queue_factory):
    q = queue_factory(visibility_timeout=0.3)
    q.enqueue("x")
    job = q.lease_one()
    ext = q.extend(job, 5)
    assert ext.lease_deadline > job.lease_deadline + 4
    time.sleep(0.4)
    assert q.lease_one() is None
    q.ack(job)


def test_expired_lease_counts_as_an_attempt_and_can_dead_letter(queue_factory):
    q = queue_factory(visibility_timeout=0.1, max_attempts=1)
    q.enqueue("x")
    q.lease_one()
    time.sleep(0.35)
    assert q.lease_one() is None
    [dead] = q.dlq()
    assert dead.attempts == 1 and "expired" in dead.last_error


def test_an_expired_lease_can_exhaust_attempts(queue_factory):
    """nobroker's test of that name, as written there: no lease call after the last expiry."""
    q = queue_factory(visibility_timeout=0.05, max_attempts=2, backoff=NOBACKOFF)
    q.enqueue("nobody ever acks this")
    for _ in range(2):
        assert q.lease_one() is not None
        time.sleep(0.08)
    st = q.stats()
    assert (st.dead, st.leased, st.ready, st.total) == (1, 0, 0, 1), st
    job = q.enqueue("another")
    assert q.lease_one().id == job.id  # the lease call reclaims the expired one first
    time.sleep(0.08)
    st = q.stats()  # an expired lease with attempts left counts as ready
    assert (st.dead, st.leased, st.ready, st.dead_lettered_total) == (1, 0, 1, 1), st


def test_blocking_lease_is_woken_by_an_expiry(queue_factory):
    q = queue_factory(visibility_timeout=0.3)
    q.enqueue("x")
    q.lease_one()
    again = q.lease_one(wait=10)
    assert again is not None and again.attempts == 2


JSON_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    2**63,
    1.5,
    -0.0,
    1e300,
    "",
    "héllo ✓ 🎉",
    [],
    {},
    [1, [2, [3]]],
    {"a": {"b": None, "c": [1.25, "x"]}},
    "\u0000nul",
]


@pytest.mark.parametrize("value", JSON_VALUES, ids=range(len(JSON_VALUES)))
def test_payload_round_trip_of_every_json_type(q, value):
    q.enqueue(value)
    got = q.lease_one().payload
    assert got == value and type(got) is type(value)


def test_bytes_and_arrays_round_trip_exactly(q):
    q.enqueue(b"\x00\xffraw")
    arrays = [
        np.arange(12, dtype=">i4").reshape(3, 4),
        np.array([1.5, np.nan], dtype="<f8"),
        np.zeros((0, 3), "u1"),
        np.array(7, dtype=np.complex64),
        np.array([b"ab", b"c"], dtype="S2"),
    ]
    for a in arrays:
        q.enqueue(a)
    assert q.lease_one().payload == b"\x00\xffraw"
    for a in arrays:
        got = q.lease_one().payload
        assert got.dtype == a.dtype and got.shape == a.shape
        assert np.array_equal(got, a, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize(
    "bad",
    [
        object(),
        {1, 2},
        float("nan"),
        math.inf,
        {"k": [1, {"set inside"}]},
        {"k": np.array([object()]), "b": b"bytes"},
        "\ud800 lone surrogate",
        np.array([object()]),
    ],
)
def test_unserialisable_payload_writes_nothing_and_queue_stays_usable(q, bad):
    q.enqueue("before")
    with pytest.raises(SerializationError):
        q.enqueue_many(["fine", bad])
    assert q.stats().total == 1
    q.enqueue("after")
    assert [j.payload for j in drain(q)] == ["before", "after"]


_MERGED_KEYS = [
    {1: "a", "1": "b"},
    {True: 1, "true": 2},
    {None: 1, "null": 2},
    {1.5: 1, "1.5": 2},
    {"outer": [{"x": 0}, {2: "a", "2": "b"}]},
    ({0: "a", "0": "b"},),
    {"arr": np.arange(2), "d": {1: "a", "1": "b"}},
]


@pytest.mark.parametrize("payload", _MERGED_KEYS, ids=repr)
def test_a_payload_whose_keys_json_would_merge_is_refused_and_nothing_is_stored(q, payload):
    # {1: "a", "1": "b"} would be stored as {"1": "b"}: one value lost without a word.
    for call in (
        lambda: q.enqueue(payload),
        lambda: q.enqueue(payload, job_id="keyed"),
        lambda: q.enqueue(payload, job_id="replaced", replace=True),
        lambda: q.enqueue_many(["fine", payload]),
        lambda: q.import_jobs([ringq.Job(id="imported", payload=payload)]),
    ):
        with pytest.raises(SerializationError, match="which JSON writes as the same key"):
            call()
    st = q.stats()
    assert st.total == 0 and st.enqueued_total == 0
    q.enqueue("x")
    job = q.lease_one()
    with pytest.raises(SerializationError, match="which JSON writes as the same key"):
        q.ack(job, result=payload)
    assert q.get(job.id).state is JobState.LEASED
    q.ack(job, result={1: "a", 2: "b"})  # keys that stay apart are taken, as strs
    assert q.result(job.id) == {"1": "a", "2": "b"}


def test_mixed_payloads_round_trip(q):
    arr = np.arange(6, dtype=">i4").reshape(2, 3)
    q.enqueue({"image": arr, "meta": {"raw": b"\x00\xff", "n": np.uint8(7), "s": "text"}})
    (job,) = drain(q)
    p = job.payload
    assert (
        p["image"].dtype.str == ">i4"
        and p["image"].shape == (2, 3)
        and p["image"].tolist() == arr.tolist()
    )
    assert (
        p["meta"] == {"raw": b"\x00\xff", "n": 7, "s": "text"} and type(p["meta"]["n"]) is np.uint8
    )


def test_the_producer_sees_the_payload_the_consumer_gets(q):
    """`enqueue({1: "a"})` returned a Job showing `{1: "a"}` while consumers got `{"1": "a"}`."""
    one = q.enqueue({1: "a", "t": (1, 2), "n": {True: None}})
    many = q.enqueue_many([{2: "b"}, ("x", ("y",)), {"plain": 1}, bytearray(b"raw"),
                           {"arr": np.arange(3), "pair": (4, 5)}, "{[text]}"])
    want = [{"1": "a", "t": [1, 2], "n": {"true": None}}, {"2": "b"}, ["x", ["y"]], {"plain": 1},
            b"raw", {"arr": [0, 1, 2], "pair": [4, 5]}, "{[text]}"]
    got = [one.payload, *(j.payload for j in many)]
    leased = {j.id: j.payload for j in q.lease(10)}
    for job, produced, expected in zip([one, *many], got, want):
        consumed = leased[job.id]
        for side in (produced, consumed):
            if isinstance(expected, dict) and "arr" in expected:
                assert side["pair"] == expected["pair"] and side["arr"].tolist() == expected["arr"]
            else:
                assert side == expected and type(side) is type(expected), (side, expected)
    plain = [{"n": i, "kind": "resize"} for i in range(3)]
    assert all(j.payload is p for j, p in zip(q.enqueue_many(plain), plain))  # nothing to convert
    p = {"n": 1, "nested": [{"ok": True}]}
    assert q.enqueue(p).payload is p


def test_idempotent_job_ids(q):
    a = q.enqueue("first", job_id="order-42")
    b = q.enqueue("second", job_id="order-42")
    assert a.id == b.id == "order-42" and b.payload == "first"
    jobs = q.enqueue_many(["x", "y", "z"], job_ids=["k1", "order-42", "k1"])
    assert [j.payload for j in jobs] == ["x", "first", "x"]
    assert q.stats().total == 2
    assert q.get("k1").payload == "x"


def test_idempotent_ids_hold_across_reopen(queue_factory):
    queue_factory().enqueue("v1", job_id="same")
    q = queue_factory()
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


def test_close_is_idempotent_and_use_after_close_raises(queue_factory):
    q = queue_factory()
    q.enqueue(1)
    q.close()
    q.close()
    for call in (lambda: q.enqueue(1), lambda: q.lease(), q.stats, lambda: q.ack("x")):
        with pytest.raises(QueueClosedError):
            call()


def test_a_lease_outlives_the_queue_object_it_was_taken_through(queue_factory):
    # Leases belong to the process: closing (or dropping) the object a job was leased through
    # neither frees the job for others nor charges an attempt, and a new object acks it.
    import gc

    first = queue_factory()
    first.enqueue_many(["closed", "collected"])
    job = first.lease_one(visibility_timeout=60)
    first.close()
    second = queue_factory()
    other = second.lease_one(visibility_timeout=60)
    assert other is not None and other.payload == "collected" and other.attempts == 1
    del second
    gc.collect()
    third = queue_factory()
    assert third.lease_one() is None  # both leases still stand
    third.ack(job)
    third.extend(other, 30)
    third.ack(other)
    stats = third.stats()
    assert (stats.done, stats.leased, stats.ready) == (2, 0, 0)
    assert job.attempts == 1 and third.get(job.id).attempts == 1


def test_bad_arguments_are_value_errors(q, queue_factory):
    for call in (
        lambda: q.enqueue(1, delay=float("nan")),
        lambda: q.enqueue(1, max_attempts=0),
        lambda: q.lease(0),
        lambda: q.enqueue(1, priority=2**40),
        lambda: q.enqueue_many([1], job_ids=["a", "b"]),
        lambda: q.enqueue(1, job_id=""),
        lambda: q.extend("x", 0),
        lambda: q.lease(visibility_timeout=0),
        lambda: q.enqueue(1, priority=np.int64(2**40)),
        lambda: q.enqueue(1, priority=np.bool_(True)),
    ):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(ValueError):
        queue_factory(name="bad/name")


def test_a_lease_shorter_than_a_millisecond_or_longer_than_33_years_is_refused_alike(q):
    # A lease deadline is kept in milliseconds: 0.1 ms ran out when it was taken.
    q.enqueue("x")
    for vt in (0.0001, 1e10, math.inf):
        with pytest.raises(ValueError, match="from 0.001 to .*about 33 years"):
            q.lease(visibility_timeout=vt)
        with pytest.raises(ValueError, match="from 0.001 to"):
            q.lease_one(visibility_timeout=vt)
    job = q.lease_one(visibility_timeout=0.001)
    with pytest.raises(ValueError, match="from 0.001 to"):
        q.extend(job, 0.0001)
    with pytest.raises(ValueError, match="detach must be True or False"):
        q.lease(detach="yes")


def test_numpy_numbers_are_taken_where_numbers_are(q):
    job = q.enqueue("x", priority=np.int64(3), delay=np.float32(0))
    assert job.priority == 3 and type(job.priority) is int
    [job2] = q.enqueue_many(["y"], priority=np.int32(-2), delay=np.int64(0))
    assert job2.priority == -2 and type(job2.priority) is int
    got = q.lease_one(visibility_timeout=np.int64(30), wait=np.float64(0))
    assert got.id == job.id and got.priority == 3
    q.extend(got, np.int16(60))
    q.ack(got)
    q.enqueue("z", max_attempts=np.int64(2))
    [a, b] = q.lease(np.int64(2))
    assert {a.payload, b.payload} == {"y", "z"}
    assert type(b.max_attempts) is int and type(a.max_attempts) is int
    assert len(q.list_jobs(limit=np.int32(1))) == 1
    page = q.search(limit=np.int64(1))
    assert len(page.jobs) == 1 and page.next is not None
    q.ack(a)
    q.ack(b)
    worker = ringq.Worker(q, lambda job: None, max_restarts=np.int64(2))
    assert worker.max_restarts == 2 and type(worker.max_restarts) is int


def test_narrow_numpy_floats_are_range_checked_as_floats(q):
    # A float16 compared with the 33-year limit cast the limit to float16 (overflow warning).
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q.enqueue("x", delay=np.float16(-1), expires_in=np.float16(60), timeout=np.float16(10))
        job = q.lease_one(visibility_timeout=np.float16(30))
        q.extend(job, np.float16(20))
        q.nack(job, delay=np.float16(0))
        job = q.lease_one(visibility_timeout=np.float32(30))
        q.ack(job, result=1, result_ttl=np.float16(100))
        for bad in (np.float16(np.inf), np.float16(np.nan), 10**400):
            with pytest.raises(ValueError, match="visibility_timeout"):
                q.lease_one(visibility_timeout=bad)
        with pytest.raises(ValueError, match="delay"):
            q.enqueue("y", delay=-(10**400))


def test_a_numpy_timedelta_is_no_number_here(q):
    # numpy.timedelta64 registers as a numbers.Integral, and converts to neither int nor float.
    import numpy as np

    td = np.timedelta64(5, "s")
    for call in (
        lambda: q.enqueue("x", priority=td),
        lambda: q.enqueue("x", delay=td),
        lambda: q.lease_one(visibility_timeout=td),
        lambda: q.lease_one(wait=td),
        lambda: q.lease(td),
    ):
        with pytest.raises(ValueError):
            call()


def test_numpy_timeouts_and_negative_numpy_delays_are_taken(q):
    job = q.enqueue("t", timeout=np.float32(5), delay=np.int64(-5))  # a negative delay: due now
    assert job.timeout == 5 and q.lease_one().id == job.id


def test_numpy_numbers_are_taken_for_queue_options(queue_factory):
    q = queue_factory(max_attempts=np.int64(2))
    job = q.enqueue("x")
    assert job.max_attempts == 2 and type(job.max_attempts) is int


@pytest.mark.parametrize(
    "option",
    [
        dict(lock_timeout=math.nan),
        dict(lock_timeout=-1),
        dict(lock_timeout=True),
        dict(lock_timeout=None),
        dict(mode=0o7777),
        dict(mode=0o4600),
        dict(mode=True),
        dict(mode="0o600"),
    ],
    ids=repr,
)
def test_a_bad_lock_timeout_or_mode_is_refused_alike(queue_factory, option):
    # The Redis queue ignores these storage options, yet refuses what the local one refuses.
    with pytest.raises(ValueError, match="lock_timeout must be|mode must be"):
        queue_factory(**option)


def test_stats_counts_every_state(queue_factory):
    q = queue_factory(max_attempts=1)
    q.enqueue_many(["a", "b", "c", "d"])
    q.enqueue("later", delay=60)
    a, b, c = q.lease(3)
    q.ack(a)
    q.nack(b)
    st = q.stats()
    assert (st.ready, st.delayed, st.leased, st.done, st.dead, st.total) == (1, 1, 1, 1, 1, 5)
    assert len(q) == 5


def test_the_worker_runs_on_every_backend(queue_factory):
    q = queue_factory(visibility_timeout=5)
    q.enqueue_many(list(range(20)))
    seen = []
    stats = ringq.Worker(
        q,
        lambda job: seen.append(job.payload),
        concurrency=3,
        idle_timeout=0.3,
        handle_signals=False,
    ).run()
    assert sorted(seen) == list(range(20)) and stats.succeeded == 20 and q.stats().done == 20


def test_cumulative_counters_count_enqueues_acks_and_dead_letters(queue_factory):
    q = queue_factory(max_attempts=1, visibility_timeout=0.1)
    q.enqueue_many(["a", "b", "c", "d"])
    q.enqueue("keyed", job_id="k")
    q.enqueue("again", job_id="k")  # an existing id stores nothing: not counted
    a, b, c, d, k = q.lease(5)
    q.ack(a)
    q.ack_many([b])
    q.nack(c, error="boom")  # its only attempt: dead-lettered
    # d and k are left to expire; a lease call reclaims them, dead-lettering both (1 attempt)
    deadline = time.monotonic() + 30
    while q.stats().dead_lettered_total < 3:
        assert time.monotonic() < deadline, q.stats()
        assert q.lease(1, wait=0.05) == []
    st = q.stats()
    assert (st.enqueued_total, st.acked_total, st.dead_lettered_total) == (5, 2, 3), st
    q.requeue_dead()
    q.purge()  # the counters are since creation: purge and requeue leave them
    st = q.stats()
    assert (st.enqueued_total, st.acked_total, st.dead_lettered_total) == (5, 2, 3), st


def test_a_negative_delay_means_now(q):
    run_at = time.time() - 5  # a due time that has passed: delay = run_at - time.time() < 0
    late = q.enqueue("late", delay=run_at - time.time())
    [also] = q.enqueue_many(["also"], delay=-0.001)
    assert late.available_at <= time.time() and also.available_at <= time.time()
    assert {j.id for j in q.lease(2)} == {late.id, also.id}
    for bad in (float("nan"), float("-inf")):
        with pytest.raises(ValueError):
            q.enqueue("x", delay=bad)


def test_a_waiting_lease_returns_as_soon_as_jobs_are_due(q):
    q.enqueue_many(list(range(30)))
    t = time.monotonic()
    got = q.lease(100, wait=1.0)
    assert len(got) == 30 and time.monotonic() - t < 0.5
    t = time.monotonic()
    assert q.lease(100, wait=0.2) == [] and time.monotonic() - t >= 0.15


@pytest.mark.parametrize(
    "call",
    [
        lambda q: q.lease(1, wait=math.nan),
        lambda q: q.lease(True),
        lambda q: q.lease_one(visibility_timeout=math.nan),
        lambda q: q.list_jobs(limit=-1),
        lambda q: q.list_jobs(limit=True),
        lambda q: q.dlq(limit="2"),
        lambda q: q.enqueue("x", priority=True),
        lambda q: q.enqueue("x", delay="5"),
        lambda q: q.enqueue("x", expires_in="5"),
    ],
)
def test_bad_arguments_are_refused_alike(q, call):
    with pytest.raises(ValueError):
        call(q)


_REFUSED = [
    dict(priority=True),
    dict(priority=2**31),
    dict(priority=-(2**31) - 1),
    dict(priority=1.0),
    dict(priority=np.int64(2**31)),
    dict(priority=np.bool_(True)),
    dict(delay=True),
    dict(delay=math.nan),
    dict(delay=math.inf),
    dict(delay=np.array(0.0)),
    dict(max_attempts=True),
    dict(max_attempts=0),
    dict(max_attempts=1.0),
]


@pytest.mark.parametrize("args", _REFUSED, ids=repr)
def test_enqueue_refuses_what_enqueue_many_refuses_and_stores_nothing(q, args):
    for call in (lambda: q.enqueue("x", **args), lambda: q.enqueue_many(["x"], **args)):
        with pytest.raises(ValueError):
            call()
    assert q.stats().total == 0


@pytest.mark.parametrize(
    "args, priority, due_now",
    [
        (dict(priority=2**31 - 1), 2**31 - 1, True),
        (dict(priority=-(2**31)), -(2**31), True),
        (dict(delay=0), 0, True),
        (dict(delay=-0.0), 0, True),
        (dict(delay=-5), 0, True),
        (dict(delay=np.float64(0.0)), 0, True),
        (dict(delay=30), 0, False),
        (dict(max_attempts=1), 0, True),
    ],
    ids=repr,
)
def test_enqueue_takes_what_enqueue_many_takes(q, args, priority, due_now):
    one = q.enqueue("x", **args)
    [many] = q.enqueue_many(["x"], **args)
    for job in (one, many):
        assert job.priority == priority
        assert (job.available_at <= time.time()) is due_now
        assert q.get(job.id).priority == priority
    assert len(q.lease(10)) == (2 if due_now else 0)


_NOT_A_LIST = [
    "abc",
    b"abc",
    bytearray(b"abc"),
    memoryview(b"abc"),
    {"a": 1, "b": 2, "c": 3},
    {"a", "b", "c"},
    frozenset({1}),
    3,
    None,
]


@pytest.mark.parametrize("payloads", _NOT_A_LIST, ids=repr)
def test_enqueue_many_refuses_what_is_not_a_list_of_payloads_and_stores_nothing(q, payloads):
    with pytest.raises(TypeError, match="enqueue_many takes a list .* of payloads"):
        q.enqueue_many(payloads)
    st = q.stats()
    assert st.total == 0 and st.enqueued_total == 0


@pytest.mark.parametrize("job_ids", [i for i in _NOT_A_LIST if i is not None], ids=repr)
def test_enqueue_many_refuses_job_ids_that_are_not_a_list_and_stores_nothing(q, job_ids):
    with pytest.raises(TypeError, match="job_ids must be a list"):
        q.enqueue_many(["x", "y", "z"], job_ids=job_ids)
    st = q.stats()
    assert st.total == 0 and st.enqueued_total == 0


def test_enqueue_many_takes_any_ordered_iterable(q):
    jobs = q.enqueue_many((p for p in ["a", "b"]), job_ids=iter(["i1", "i2"]))
    jobs += q.enqueue_many(("c",), job_ids=("i3",))
    jobs += q.enqueue_many(range(2))
    assert [j.payload for j in jobs] == ["a", "b", "c", 0, 1]
    assert [j.id for j in jobs[:3]] == ["i1", "i2", "i3"] and q.stats().total == 5


def test_ack_many_refuses_a_str_for_its_list_and_acks_nothing(q):
    q.enqueue_many(["x", "y", "z"], job_ids=["a", "b", "c"])
    leased = q.lease(3)
    for jobs in ("abc", b"abc", 3):  # "abc" would ack the jobs "a", "b" and "c"
        with pytest.raises(TypeError, match="expected a list of jobs or job ids"):
            q.ack_many(jobs)
    assert [q.get(i).state for i in ("a", "b", "c")] == [JobState.LEASED] * 3
    q.ack_many({"a", "b"})  # a set of ids is fine: acks have no order
    q.ack_many([leased[2]])
    assert q.stats().done == 3


@pytest.mark.parametrize("call", [lambda q: q.ack(123), lambda q: q.get(123), lambda q: q.cancel(123),
                                  lambda q: q.nack(None), lambda q: q.extend(1.5, 5)])
def test_a_job_is_a_job_or_its_id(q, call):
    with pytest.raises(TypeError, match="a Job or a job id"):
        call(q)


_HOLDER_CALLS = {
    "ack": lambda q, j: q.ack(j),
    "ack with a result": lambda q, j: q.ack(j, result="late"),
    "ack_many": lambda q, j: q.ack_many([j]),
    "nack": lambda q, j: q.nack(j, delay=0),
    "extend": lambda q, j: q.extend(j, 30),
    "progress": lambda q, j: q.progress(j, 0.5, "half"),
}


@pytest.mark.parametrize("call", list(_HOLDER_CALLS.values()), ids=list(_HOLDER_CALLS))
def test_a_holder_whose_lease_ran_out_is_refused_though_nothing_reclaimed_it_yet(q, call):
    q.enqueue("x")
    job = q.lease_one(visibility_timeout=0.05)
    time.sleep(0.12)  # past the lease's deadline; no lease call runs in between
    with pytest.raises(NotLeasedError):
        call(q, job)
    now = q.get(job.id)
    assert now.state is JobState.READY and now.progress is None
    with pytest.raises(ringq.ResultNotFoundError):
        q.result(job.id)
    again = q.lease_one()
    assert again.id == job.id and again.lease_token != job.lease_token
    q.ack(again, result="current")
    assert q.result(job.id) == "current"


@pytest.mark.parametrize("with_result", [False, True], ids=["ack", "ack with a result"])
@pytest.mark.parametrize(
    "first", [None, "read", "lease"], ids=["acked at once", "read first", "reclaimed first"]
)
def test_a_holder_whose_cancel_requested_lease_ran_out_is_refused(q, first, with_result):
    q.enqueue("x")
    job = q.lease_one(visibility_timeout=0.05)
    q.cancel(job)  # asked while leased: it ends when the lease does
    time.sleep(0.12)
    if first == "read":
        assert q.get(job.id).state is JobState.CANCELLED  # a read shows what reclaiming makes it
    elif first == "lease":  # another call reclaims it: cancelled, as after an accepted ack
        assert q.lease_one() is None and q.get(job.id).state is JobState.CANCELLED
    with pytest.raises(NotLeasedError):
        q.ack(job, result="late") if with_result else q.ack(job)
    assert q.get(job.id).state is JobState.CANCELLED
    with pytest.raises(ringq.ResultNotFoundError):
        q.result(job.id)


@pytest.mark.parametrize("with_result", [False, True], ids=["ack", "ack with a result"])
@pytest.mark.parametrize("ended", ["ran out", "nacked"])
def test_a_holder_whose_lease_ended_before_the_job_was_cancelled_is_refused(q, ended, with_result):
    # The lease ends unacked (it runs out and a lease reclaims it, or its holder nacks it), the
    # job waits READY to run again, and is cancelled: the old holder's ack is no repeat of an
    # accepted ack, and is refused.
    q.enqueue("x")
    job = q.lease_one(visibility_timeout=0.05)
    if ended == "ran out":
        time.sleep(0.12)
        q.enqueue("y", priority=10)
        assert q.lease_one().payload == "y"  # this lease reclaims the first
    else:
        q.nack(job, delay=60)
    assert q.get(job.id).state is JobState.READY
    q.cancel(job.id)
    with pytest.raises(NotLeasedError, match="cancelled"):
        q.ack(job, result="late") if with_result else q.ack(job)
    assert not job.ack_accepted
    q.ack(job.id)  # an ack by bare id names no lease: harmless, as for any finished job
    assert q.get(job.id).state is JobState.CANCELLED
    with pytest.raises(ringq.ResultNotFoundError):
        q.result(job.id)


@pytest.mark.parametrize("attempts", [5, 1], ids=["a retry left", "the last attempt"])
def test_cancelling_a_job_whose_lease_ran_out_returns_what_every_read_shows(q, attempts):
    # The lease ran out and nothing has reclaimed it yet: the cancel acts on what reclaiming
    # makes of it (a retry is cancelled; a last attempt is dead-lettered, too late to cancel).
    q.enqueue("x", max_attempts=attempts)
    job = q.lease_one(visibility_timeout=0.05)
    time.sleep(0.12)
    if attempts > 1:
        assert q.cancel(job.id).state is JobState.CANCELLED
        assert q.get(job.id).state is JobState.CANCELLED
    else:
        with pytest.raises(ringq.JobFinishedError, match="dead"):
            q.cancel(job.id)
        assert q.get(job.id).state is JobState.DEAD
    with pytest.raises(NotLeasedError):
        q.ack(job)
    assert q.lease_one() is None


def test_a_job_cancelled_before_any_lease_is_still_cancelled_once(q):
    job = q.enqueue("x")
    assert q.cancel(job.id).state is JobState.CANCELLED
    assert q.cancel(job.id).state is JobState.CANCELLED  # idempotent
    assert q.lease_one() is None and q.stats().cancelled == 1


@pytest.mark.parametrize("at", [0, 0.0004, 1.0])
def test_an_expiry_at_the_epoch_expires_the_job_as_any_past_one(q, at):
    job = q.enqueue("x", expires_at=at)
    assert job.expires_at is not None and job.expires_at <= 1.0
    assert q.lease_one() is None and q.get(job.id).state is JobState.EXPIRED


def test_ack_many_with_an_item_that_is_no_job_acks_none_of_the_batch(q):
    q.enqueue_many([1, 2])
    first, second = q.lease(2)
    with pytest.raises(TypeError, match="a Job or a job id"):
        q.ack_many([first, None, second])
    assert [q.get(j.id).state for j in (first, second)] == [JobState.LEASED] * 2
    q.ack_many([first, second])
    assert q.stats().done == 2


def test_a_negative_wait_waits_for_nothing_in_lease_and_consume_alike(q):
    t = time.monotonic()
    assert q.lease(5, wait=-1) == [] and q.lease_one(wait=-0.5) is None
    assert list(q.consume(wait=-1)) == [] and q.consume(lambda job: None, wait=-1) == 0
    assert time.monotonic() - t < 0.5
    q.enqueue("x")
    assert [j.payload for j in q.consume(wait=-1)] == ["x"]
    for call in (lambda: q.lease(1, wait=math.nan), lambda: list(q.consume(wait=math.nan)),
                 lambda: list(q.consume(wait=True))):
        with pytest.raises(ValueError):
            call()


@pytest.mark.parametrize("wait", [math.nan, True, False, "1", b"1", [1], np.array(1.0)], ids=repr)
def test_result_refuses_a_bad_wait_as_lease_does(q, wait):
    q.enqueue("x")
    job = q.lease_one()
    q.ack(job, result="kept")
    before = q.stats()
    for call in (
        lambda: q.lease(1, wait=wait),
        lambda: q.result(job.id, wait=wait),
        lambda: q.result(job, wait=wait),
    ):
        with pytest.raises(ValueError, match="wait must be a number of seconds or None"):
            call()
    assert q.stats() == before and q.result(job.id) == "kept"


def test_result_takes_a_wait_as_lease_does(q):
    q.enqueue("x")
    job = q.lease_one()
    t = time.monotonic()
    for wait in (None, 0, -1, -0.5):
        with pytest.raises(ringq.ResultNotFoundError, match="not acked with a result yet") as e:
            q.result(job.id, wait=wait)
        assert "within" not in str(e.value)
    assert time.monotonic() - t < 0.5
    with pytest.raises(ringq.ResultNotFoundError, match="within 0.05 s"):
        q.result(job.id, wait=0.05)
    q.ack(job, result="r")
    assert q.result(job.id, wait=math.inf) == "r" and q.result(job, wait=1) == "r"


@pytest.mark.parametrize(
    "args, error",
    [
        ((math.nan,), ValueError),
        (("0.5",), ValueError),
        ((True,), ValueError),
        ((False,), ValueError),
        ((None,), ValueError),
        ((-0.1,), ValueError),
        ((1.5,), ValueError),
        ((math.inf,), ValueError),
        ((0.5, 123), TypeError),
        ((0.5, b"bytes"), TypeError),
    ],
    ids=repr,
)
def test_a_bad_progress_report_writes_nothing(q, args, error):
    q.enqueue("x")
    job = q.lease_one()
    q.progress(job, 0.25, "a quarter")
    with pytest.raises(error, match="progress must be a number from 0 to 1|message is a str"):
        q.progress(job, *args)
    with pytest.raises(error):
        q.progress(job.id, *args)
    got = q.get(job.id)
    assert (got.progress, got.progress_message) == (0.25, "a quarter")


def test_progress_takes_a_real_number_from_0_to_1(q):
    import fractions

    q.enqueue("x")
    job = q.lease_one()
    for f in (0, 1, 0.5, np.float64(0.125), np.float32(0.75), fractions.Fraction(1, 4)):
        q.progress(job, f, "m")
        got = q.get(job.id)
        assert got.progress == float(f) and type(got.progress) is float


@pytest.mark.parametrize(
    "ttl", ["5", math.inf, math.nan, 0, -1, True, 86400 * 366 * 30, None], ids=repr
)
def test_a_bad_result_ttl_stores_nothing_and_acks_nothing(q, ttl):
    q.enqueue("x")
    job = q.lease_one()
    with pytest.raises(ValueError, match="result_ttl must be a number of seconds above 0"):
        q.ack(job, result=1, result_ttl=ttl)
    assert q.get(job.id).state is JobState.LEASED
    q.ack(job)
    with pytest.raises(ringq.ResultNotFoundError, match="acked without a result"):
        q.result(job.id)


def test_closing_while_threads_wait_in_lease_raises_closed(queue_factory):
    import threading

    q = queue_factory()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            q.lease_one(wait=10)
        except BaseException as exc:  # the history of this thread is its exception
            errors.append(exc)

    ts = [threading.Thread(target=wait) for _ in range(3)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    q.close()
    for t in ts:
        t.join(15)
    assert len(errors) == 3 and all(isinstance(e, QueueClosedError) for e in errors), errors


def test_the_result_of_a_rerun_is_its_own(queue_factory):
    # A finished job run again (replace=True with its id): each run's result is that run's.
    q = queue_factory("reruns")
    q.enqueue("first", job_id="r")
    q.ack(q.lease_one(), result="one")
    assert q.result("r") == "one"
    q.enqueue("second", job_id="r", replace=True)
    again = q.lease_one()
    assert again.payload == "second"
    q.ack(again, result="two")
    assert q.result("r") == "two"


def test_a_results_queue_takes_no_jobs_but_can_be_read(queue_factory):
    """``<name>-results`` holds the results of queue ``<name>``: a job enqueued there would be
    taken for an expired result and removed, never run.  Enqueues are refused; reads work."""
    main = queue_factory("emails")
    other = queue_factory("emails-results")
    with pytest.raises(ValueError, match="holds the results"):
        other.enqueue({"user": "job"})
    with pytest.raises(ValueError, match="holds the results"):
        other.enqueue_many([1, 2])
    main.enqueue(1)
    job = main.lease_one()
    main.ack(job, result={"sent": True})
    assert main.result(job.id) == {"sent": True}
    assert other.stats().total == 2  # the result, under its lease, and the record naming that lease


# -- consume: a stream of leases ------------------------------------------------------------------


def test_consume_streams_leases_until_count_or_empty(q):
    q.enqueue_many(list(range(10)))
    got = [j.payload for j in q.consume(count=4)]
    assert got == [0, 1, 2, 3]
    rest = list(q.consume())  # wait=None: ends as soon as nothing is due
    assert [j.payload for j in rest] == list(range(4, 10))
    assert all(j.state is JobState.LEASED and j.lease_token == "1" for j in rest)
    q.ack_many(rest)
    assert q.stats().done == 6 and q.stats().leased == 4


def test_consume_callback_acks_on_return_and_nacks_on_raise(q):
    q.enqueue_many([1, 2, 3], max_attempts=1)

    def handler(job):
        if job.payload == 2:
            raise ValueError("two is bad")

    assert q.consume(handler) == 2
    st = q.stats()
    assert (st.done, st.dead, st.ready, st.leased) == (2, 1, 0, 0)
    assert q.dlq()[0].last_error == "ValueError: two is bad"


def test_consume_stops_on_its_condition_and_gives_back_what_it_did_not_hand_out(q):
    import threading

    q.enqueue_many(list(range(40)))
    stop = threading.Event()
    seen = []
    for job in q.consume(stop=stop):
        seen.append(job)
        if len(seen) == 3:
            stop.set()
    assert [j.payload for j in seen] == [0, 1, 2]
    st = q.stats()
    assert (st.leased, st.ready) == (3, 37)  # nothing else is held
    again = q.lease(37)
    assert sorted(j.payload for j in again) == list(range(3, 40))
    assert all(j.attempts == 1 for j in again)  # a lease given back unused was not an attempt
    assert list(q.consume(count=1, stop=lambda: True)) == []


def test_consume_closed_early_gives_back_its_batch_in_order(q):
    q.enqueue_many(list(range(200)))
    it = q.consume()
    first = [next(it) for _ in range(5)]
    it.close()
    assert [j.payload for j in first] == [0, 1, 2, 3, 4]
    assert q.stats().leased == 5
    assert [j.payload for j in q.lease(3)] == [5, 6, 7]  # kept their places


def test_a_fast_consumer_holds_at_most_a_batch_of_leases(q):
    from ringq.backend import CONSUME_BATCH_MAX

    q.enqueue_many(list(range(3 * CONSUME_BATCH_MAX)))
    held = []
    for n, job in enumerate(q.consume()):
        if n % 16 == 0:
            held.append(q.stats().leased)
        q.ack(job)
    assert len(held) == 3 * CONSUME_BATCH_MAX // 16
    assert 1 <= max(held) <= CONSUME_BATCH_MAX, held


def test_consume_waits_for_a_job_a_producer_adds(q):
    import threading

    threading.Timer(0.05, lambda: q.enqueue("late")).start()
    t = time.monotonic()
    got = [j.payload for j in q.consume(count=1, wait=5)]
    assert got == ["late"] and time.monotonic() - t < 4
    t = time.monotonic()
    assert list(q.consume(wait=0.05)) == []  # a wait that finds nothing ends the stream
    assert time.monotonic() - t < 2


@pytest.mark.parametrize(
    "kw", [{"count": 0}, {"count": 1.5}, {"count": True}, {"wait": math.nan}, {"wait": "1"}, {"stop": 3}]
)
def test_consume_refuses_bad_arguments(q, kw):
    with pytest.raises(ValueError):
        q.consume(**kw)


def test_a_leased_payload_is_decoded_on_first_access(q):
    q.enqueue({"a": [1, 2]})
    job = q.lease_one()
    assert job.payload == {"a": [1, 2]}
    assert job == job.snapshot() and job.to_dict()["payload"] == {"a": [1, 2]}
    assert ringq.Job.from_dict(job.to_dict()).payload == job.payload


def test_reads_show_an_expired_lease_as_reclaimed_before_any_lease_call(queue_factory):
    """get, list_jobs, dlq and search agree with stats on a lease that ran out and that no
    lease call has reclaimed: dead when its attempts are used up, ready when some are left,
    cancelled when a cancel was asked for.  Nothing is written by the reads."""
    q = queue_factory(visibility_timeout=0.1, max_attempts=2)
    q.enqueue("spent", max_attempts=1, job_id="spent")
    q.enqueue("again", job_id="again")
    q.enqueue("stop", job_id="stop")
    assert len(q.lease(3)) == 3
    q.cancel("stop")
    time.sleep(0.3)
    want = {"spent": JobState.DEAD, "again": JobState.READY, "stop": JobState.CANCELLED}
    assert {j.id: j.state for j in q.list_jobs()} == want
    assert {i: q.get(i).state for i in want} == want
    assert [j.id for j in q.dlq()] == ["spent"]
    assert [j.id for j in q.list_jobs("dead")] == ["spent"]
    assert [j.id for j in q.list_jobs("ready")] == ["again"]
    assert q.list_jobs("leased") == []
    assert [j.id for j in q.search(state="dead").jobs] == ["spent"]
    st = q.stats()
    assert (st.dead, st.ready, st.leased, st.cancelled) == (1, 1, 0, 1), st
    assert q.get("spent").attempts == 1


def test_a_nack_error_that_is_not_text_is_kept_as_its_str(q):
    q.enqueue_many([1, 2])
    assert q.nack(q.lease_one(), error=ValueError("boom"), delay=60).last_error == "boom"
    assert q.nack(q.lease_one(), error=123, delay=60).last_error == "123"


def test_an_expiry_given_as_a_numpy_float32_is_computed_in_full_precision(q):
    # time.time() * 1000 + float32 stayed float32: 75 to 94 s early for an hour, and an expiry
    # of 30 s was already past.
    job = q.enqueue("x", expires_in=np.float32(30))
    assert 29 < job.expires_at - time.time() <= 30
    assert q.lease_one() is not None
