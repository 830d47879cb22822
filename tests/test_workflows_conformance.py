"""Workflows every backend must share (docs/workflows.md): dependencies, allow_failure, cancels
that propagate, fan-in, debounce and replace, rescheduling and fair scheduling across keys.  One
suite, run on a local directory and on Redis through tests/conftest.py's ``queue_factory``.

``RINGQ_FAIR_N=100000 pytest tests/test_workflows_conformance.py -k fair`` runs the fairness
bound with the issue's 100,000 queued jobs of one key (CI uses fewer).
"""

import os

import pytest
from procs import spawn

from ringq import BackoffPolicy, JobNotFoundError, JobNotWaitingError, JobState

NOBACKOFF = BackoffPolicy(base=0, jitter=0)
FAIR_N = int(os.environ.get("RINGQ_FAIR_N") or 3000)


@pytest.fixture
def q(queue_factory):
    return queue_factory(backoff=NOBACKOFF)


def lease_all(q):
    """Lease and ack every due job; their payloads in lease order."""
    out = []
    while jobs := q.lease(100):
        q.ack_many(jobs)
        out += [j.payload for j in jobs]
    return out


def test_a_dependent_waits_for_every_parent_then_runs_once(q):
    a, b = q.enqueue("a"), q.enqueue("b")
    c = q.enqueue("c", depends_on=[a, b.id])
    assert c.state is JobState.DEFERRED and c.depends_on == [a.id, b.id]
    assert q.get(c.id).depends_on == [a.id, b.id] and q.get(a.id).depends_on is None
    st = q.stats()
    assert (st.deferred, st.ready, st.total) == (1, 2, 3)
    assert [j.id for j in q.list_jobs("deferred")] == [c.id]
    assert q.dependents(a) == [c.id] and q.dependents(b.id) == [c.id] and q.dependents(c) == []
    first = q.lease(10)
    assert [j.payload for j in first] == ["a", "b"]
    q.ack(first[0], result={"from": "a"})
    assert q.get(c.id).state is JobState.DEFERRED and q.lease_one() is None
    q.ack(first[1])
    assert q.get(c.id).state is JobState.READY and q.stats().deferred == 0
    job = q.lease_one()
    assert job.id == c.id and q.result(job.depends_on[0]) == {"from": "a"}
    q.ack(job)
    assert q.lease_one() is None and q.get(c.id).attempts == 1


def test_a_done_parent_counts_as_done(q):
    q.enqueue("p", job_id="p")
    q.ack(q.lease_one())
    c = q.enqueue("c", depends_on=["p"])
    assert c.state is JobState.READY and q.lease_one().id == c.id


def test_an_unknown_parent_raises_and_writes_nothing(q):
    a = q.enqueue("a")
    before = q.stats()
    with pytest.raises(JobNotFoundError, match="'missing'"):
        q.enqueue("c", job_id="c", depends_on=[a, "missing"])
    after = q.stats()
    assert (after.total, after.enqueued_total) == (before.total, before.enqueued_total)
    with pytest.raises(JobNotFoundError):
        q.get("c")
    assert q.dependents(a) == []


def test_a_failed_parent_cancels_dependents_transitively_unless_they_allow_failure(queue_factory):
    q = queue_factory(max_attempts=1, backoff=NOBACKOFF)
    a = q.enqueue("a", job_id="a")
    b = q.enqueue("b", job_id="b", depends_on=[a])
    c = q.enqueue("c", job_id="c", depends_on=[b])
    d = q.enqueue("d", job_id="d", depends_on=[a], allow_failure=True)
    q.nack(q.lease_one(), error="boom")
    assert q.get(a.id).state is JobState.DEAD
    gb, gc, gd = q.get(b.id), q.get(c.id), q.get(d.id)
    assert gb.state is JobState.CANCELLED and "'a'" in gb.last_error
    assert "dead" in gb.last_error
    assert gc.state is JobState.CANCELLED and "'b'" in gc.last_error
    assert gd.state is JobState.READY
    assert lease_all(q) == ["d"]
    # a dependent enqueued after its parent failed is cancelled at once
    late = q.enqueue("late", depends_on=[a])
    assert late.state is JobState.CANCELLED and "'a'" in late.last_error


def test_cancelling_a_parent_cancels_its_dependents(q):
    p = q.enqueue("p", job_id="p")
    child = q.enqueue("child", job_id="child", depends_on=[p])
    grandchild = q.enqueue("gc", job_id="gc", depends_on=[child])
    q.cancel(p)
    for j in (child, grandchild):
        got = q.get(j.id)
        assert got.state is JobState.CANCELLED and "cancelled" in got.last_error
    assert q.stats().deferred == 0 and q.lease_one() is None


def test_allow_failure_runs_once_every_parent_finished(queue_factory):
    q = queue_factory(max_attempts=1, backoff=NOBACKOFF)
    a, b = q.enqueue("a"), q.enqueue("b")
    cb = q.enqueue("cb", depends_on=[a, b], allow_failure=True)
    ja, jb = q.lease(2)
    q.nack(ja, error="no")
    assert q.get(cb.id).state is JobState.DEFERRED
    q.ack(jb)
    assert q.get(cb.id).state is JobState.READY and lease_all(q) == ["cb"]


def test_a_fan_in_of_many_parents_is_released_once_after_the_last(queue_factory):
    q = queue_factory(backoff=NOBACKOFF)
    n = 10_000 if queue_factory.backend == "redis" else 2_000
    parents = q.enqueue_many(list(range(n)))
    cb = q.enqueue("callback", depends_on=parents, allow_failure=True)
    assert len(q.get(cb.id).depends_on) == n
    leased = []
    while jobs := q.lease(500):
        leased += jobs
    assert "callback" not in [j.payload for j in leased] and len(leased) == n
    for i in range(0, n - 1, 500):
        q.ack_many(leased[i : min(i + 500, n - 1)])
    assert q.get(cb.id).state is JobState.DEFERRED and q.lease_one() is None
    q.ack(leased[-1])
    assert q.get(cb.id).state is JobState.READY and q.stats().ready == 1
    job = q.lease_one()
    assert job.id == cb.id and job.attempts == 1
    q.ack(job)
    assert q.lease_one() is None and q.stats().done == n + 1


def test_debounce_replaces_a_waiting_job_and_runs_once_with_the_last_payload(q):
    first = q.enqueue("v1", job_id="k", debounce=60)
    assert first.state is JobState.READY and first.available_at > first.enqueued_at + 59
    last = q.enqueue("v2", job_id="k", debounce=0)
    assert last.id == "k" and last.payload == "v2"
    st = q.stats()
    assert (st.ready, st.delayed, st.total) == (1, 0, 1)
    assert lease_all(q) == ["v2"]
    with pytest.raises(ValueError, match="job_id"):
        q.enqueue("x", debounce=1)


def test_replacing_a_leased_job_runs_after_it(q):
    q.enqueue("v1", job_id="k")
    running = q.lease_one()
    nxt = q.enqueue("v2", job_id="k", replace=True)
    assert nxt.state is JobState.DEFERRED and nxt.payload == "v2"
    assert q.get("k").state is JobState.LEASED and q.lease_one() is None
    q.enqueue("v3", job_id="k", replace=True)  # the last payload wins
    q.ack(running)
    again = q.lease_one()
    assert again.payload == "v3" and again.attempts == 1
    # a nack of the running one: the next run takes the retry's place
    q.enqueue("v4", job_id="k", replace=True)
    q.nack(again, error="e")
    assert [j.payload for j in q.lease(10)] == ["v4"]


def test_replacing_a_finished_job_is_a_new_run(q):
    q.enqueue("v1", job_id="k")
    q.ack(q.lease_one())
    assert q.enqueue("again", job_id="k").payload == "v1"  # without replace: idempotent
    q.enqueue("v2", job_id="k", replace=True)
    assert lease_all(q) == ["v2"]


def test_reschedule_changes_a_waiting_job_and_refuses_others(q):
    later = q.enqueue("later", delay=60)
    low = q.enqueue("low")
    q.enqueue("mid")
    moved = q.reschedule(later, delay=0)
    assert moved.state is JobState.READY and moved.available_at <= later.available_at - 50
    q.reschedule(low.id, priority=5)
    assert lease_all(q)[0] == "low"
    with pytest.raises(JobNotWaitingError, match="done"):
        q.reschedule(low.id, priority=1)
    q.enqueue("held")
    job = q.lease_one()
    with pytest.raises(JobNotWaitingError, match="leased"):
        q.reschedule(job, delay=1)
    with pytest.raises(JobNotFoundError):
        q.reschedule("missing", delay=1)
    with pytest.raises(ValueError):
        q.reschedule(job)


def test_a_snapshot_from_before_a_reschedule_names_the_job(queue_factory):
    q = queue_factory()
    low = q.enqueue("low")
    q.reschedule(low.id, priority=5)
    q.ack(q.lease_one())
    with pytest.raises(JobNotWaitingError, match="it is done"):
        q.reschedule(low, priority=1)


def test_a_rescheduled_dependent_still_waits_for_its_parents(q):
    p = q.enqueue("p")
    c = q.enqueue("c", depends_on=[p])
    q.enqueue("other")
    got = q.reschedule(c, priority=9)
    assert got.state is JobState.DEFERRED and got.priority == 9
    assert [j.payload for j in q.lease(10)] == ["p", "other"]
    q.ack_many(q.list_jobs("leased"))
    assert q.lease_one().payload == "c"


def test_keys_take_turns_and_stay_fifo_within_a_key(q):
    for k in "abc":
        q.enqueue_many([f"{k}{i}" for i in range(3)], key=k)
    q.enqueue("none")  # jobs without a key are one more key
    assert q.get(q.search(key="b").jobs[0].id).key == "b" and q.search(key="b").total == 3
    order = lease_all(q)
    assert order == ["a0", "b0", "c0", "none", "a1", "b1", "c1", "a2", "b2", "c2"]


def test_a_big_backlog_of_one_key_delays_another_key_by_one_lease_per_key(q):
    q.enqueue_many(list(range(FAIR_N)), key="big")
    q.ack(q.lease_one())  # the big key's turn has come round once
    q.enqueue("small", key="small")
    q.enqueue("unkeyed")
    got = [q.lease_one().payload for _ in range(3)]  # three keys have work
    assert "small" in got and "unkeyed" in got
    rest = lease_all(q)
    assert [p for p in got + rest if isinstance(p, int)] == list(range(1, FAIR_N))


DEBOUNCER = """
import sys
import ringq
q = ringq.connect(sys.argv[1], sys.argv[2])
for i in range(30):
    q.enqueue([int(sys.argv[3]), i], job_id="k", debounce=0.3)
q.close()
"""


def test_debounce_from_four_processes_runs_once_with_the_last_payload(q):
    procs = [spawn(DEBOUNCER, q.location, q.name, str(p)) for p in range(4)]
    assert [p.wait(60) for p in procs] == [0] * 4
    last = q.get("k").payload
    assert last[1] == 29 and q.stats().total == 1
    job = q.lease_one(wait=5)
    assert job.payload == last
    q.ack(job)
    assert q.lease_one() is None and q.stats().done == 1


def test_a_replacement_cannot_wait_for_its_own_dependents(queue_factory):
    q = queue_factory()
    q.enqueue("a", job_id="a")
    q.enqueue("b", job_id="b", depends_on=["a"])
    q.enqueue("c", job_id="c", depends_on=["b"])
    with pytest.raises(ValueError, match="'c'"):
        q.enqueue("a2", job_id="a", replace=True, depends_on=["c"])
    assert q.get("a").payload == "a" and q.stats().total == 3
    assert lease_all(q) == ["a", "b", "c"]


def test_a_rescheduled_job_keeps_its_place_unless_its_run_time_moves(q):
    """A new priority alone keeps the job's available-at and enqueue time, so its FIFO place; a
    new delay makes it due later, and the lease order is priority, then available-at."""
    a, b, c = (q.enqueue(p) for p in "abc")
    assert q.reschedule(a, priority=0).available_at == a.available_at
    q.reschedule(b.id, delay=0)
    assert lease_all(q) == ["a", "c", "b"]


def test_a_released_dependent_keeps_its_delay(q):
    p = q.enqueue("p")
    c = q.enqueue("c", depends_on=[p], delay=60)
    q.ack(q.lease_one())
    got = q.get(c.id)
    assert got.state is JobState.READY and got.available_at > c.enqueued_at + 59
    assert q.stats().delayed == 1 and q.lease_one() is None


def test_a_nack_whose_retry_a_queued_run_replaces_returns_that_run(q):
    q.enqueue("r1", job_id="R", max_attempts=3)
    job = q.lease_one()
    q.enqueue("r2", job_id="R", debounce=0)  # a new run, after the leased one
    back = q.nack(job, error="e1")
    assert (back.state, back.payload, back.attempts) == (JobState.READY, "r2", 0)
    assert q.get("R").payload == "r2" and lease_all(q) == ["r2"]


@pytest.mark.parametrize("bad", [{"a": 1}, {"a"}, frozenset({"a"}), 7])
def test_depends_on_takes_an_ordered_list_of_jobs_or_ids_and_nothing_else(q, bad):
    q.enqueue("a", job_id="a")
    with pytest.raises(TypeError, match="depends_on must be a list"):
        q.enqueue("x", depends_on=bad)
    assert q.stats().total == 1
    assert q.enqueue("y", depends_on="a").depends_on == ["a"]  # one parent alone
    assert q.enqueue("z", depends_on=(p for p in ["a"])).depends_on == ["a"]


def test_a_reschedule_refuses_a_negative_delay_and_lists_no_dependents_of_an_unknown_id(q):
    q.enqueue("a", job_id="a")
    with pytest.raises(ValueError, match="delay must be >= 0"):
        q.reschedule("a", delay=-1)
    assert q.get("a").available_at <= q.get("a").enqueued_at + 0.001
    assert q.dependents("no-such-id") == []


@pytest.mark.parametrize("how", ["ack", "dead"])
def test_dependents_follow_the_leased_run_not_a_run_queued_behind_it(queue_factory, how):
    q = queue_factory()
    q.enqueue("k1", job_id="k", max_attempts=1)
    q.enqueue("d", job_id="d", depends_on=["k"])
    run = q.lease_one()
    q.enqueue("k2", job_id="k", debounce=0)
    # counted and listed as a second, deferred job on a directory queue; kept with the job on Redis
    queued = 1 if queue_factory.backend == "local" else 0
    assert q.stats().deferred == 1 + queued  # d, and the queued run
    assert [j.payload for j in q.list_jobs("deferred")] == ["d", "k2"][: 1 + queued]
    assert q.get("k").payload == "k1"
    if how == "ack":
        q.ack(run)
        assert q.get("d").state is JobState.READY
        assert sorted(lease_all(q)) == ["d", "k2"]
    else:
        q.nack(run, error="run 1 failed")
        assert q.get("d").state is JobState.CANCELLED and "'k'" in q.get("d").last_error
        assert lease_all(q) == ["k2"]
    assert q.get("k").payload == "k2"
