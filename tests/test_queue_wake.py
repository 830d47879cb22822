"""Queue.wake_token / wait_for_wake / wake: waiting for work without leasing (used by ringq.aio)."""

import threading
import time

import pytest

from ringq import Queue
from ringq.engine import reaper


def test_token_moves_on_enqueue_and_on_return_to_ready(qdir):
    with Queue(qdir) as q:
        t0 = q.wake_token()
        q.enqueue(1)
        t1 = q.wake_token()
        assert t1 != t0
        job = q.lease_one()
        q.nack(job, delay=0)
        assert q.wake_token() != t1


def test_wait_returns_when_another_thread_enqueues(qdir):
    with Queue(qdir) as q:
        token = q.wake_token()
        threading.Timer(0.1, lambda: q.enqueue("x")).start()
        t = time.monotonic()
        q.wait_for_wake(token, 5.0)
        assert 0.05 <= time.monotonic() - t < 2.0
        assert q.lease_one().payload == "x"


def test_wait_never_sleeps_through_an_enqueue_made_after_the_token_was_read(qdir):
    with Queue(qdir) as q:
        token = q.wake_token()
        q.enqueue("x")  # between reading the token and sleeping
        t = time.monotonic()
        q.wait_for_wake(token, 5.0)
        assert time.monotonic() - t < 0.5


def test_wait_times_out_and_wake_interrupts(qdir):
    with Queue(qdir) as q:
        t = time.monotonic()
        q.wait_for_wake(q.wake_token(), 0.2)
        assert 0.15 <= time.monotonic() - t < 1.5
        token = q.wake_token()
        threading.Timer(0.1, q.wake).start()
        t = time.monotonic()
        q.wait_for_wake(token, 5.0)
        assert time.monotonic() - t < 2.0


def test_wait_ends_when_a_delayed_job_seen_by_a_lease_comes_due(qdir):
    with Queue(qdir) as q:
        q.enqueue("later", delay=0.3)
        assert q.lease() == []  # the lease saw it and scheduled it
        token = q.wake_token()
        t = time.monotonic()
        q.wait_for_wake(token, 5.0)
        assert 0.2 <= time.monotonic() - t < 2.0
        assert q.lease_one().payload == "later"


def test_a_due_job_the_caller_did_not_lease_does_not_make_the_wait_spin(qdir):
    with Queue(qdir) as q:
        q.enqueue("later", delay=0.05)
        assert q.lease() == []  # seen and scheduled
        time.sleep(0.1)  # now due, but the caller (at capacity, say) does not lease it
        t = time.monotonic()
        q.wait_for_wake(q.wake_token(), 0.2)
        assert time.monotonic() - t >= 0.15


def _long_naps(monkeypatch):
    """A lease asleep in ``wait=`` looks again only when woken or at its own timeout (the reaper's
    rounds pinned long): a job whose wake-up reached no sleeper would wait seconds for one."""
    monkeypatch.setattr(reaper, "REAP_INTERVAL", 60.0)
    monkeypatch.setattr(reaper.Reaper, "interval", 60.0)


def _tail_read_in(q: Queue, producer: Queue) -> None:
    """A job enqueued and done, so that ``q`` has read in the segment appends go to: its leases
    then sleep in the call that leases a new job itself (a queue with no segment yet, or whose
    reader has not read the tail's, sleeps on the wake word alone)."""
    producer.enqueue({"i": -1})
    q.ack(q.lease_one())


@pytest.mark.parametrize("durability", ["none", "msync"])
def test_every_job_appended_reaches_one_of_the_leases_asleep_for_it(qdir, monkeypatch, durability):
    # All the sleepers wait in the lease's own call, so an append wakes one of them per job: one
    # at a time, then a batch of three, each job leased as it comes, none left for a timeout.
    _long_naps(monkeypatch)
    with Queue(qdir, durability=durability) as q, Queue(qdir, durability=durability) as producer:
        _tail_read_in(q, producer)
        got: list[tuple[int, float]] = []

        def consume() -> None:
            job = q.lease_one(wait=30)
            if job is not None:
                got.append((job.payload["i"], time.monotonic()))
                q.ack(job)

        threads = [threading.Thread(target=consume) for _ in range(5)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # all five asleep
        sent = {}
        for i in range(2):
            sent[i] = time.monotonic()
            producer.enqueue({"i": i})
            time.sleep(0.1)
        sent.update(dict.fromkeys((2, 3, 4), time.monotonic()))
        producer.enqueue_many([{"i": 2}, {"i": 3}, {"i": 4}])
        for t in threads:
            t.join(40)
        assert sorted(i for i, _ in got) == [0, 1, 2, 3, 4]
        late = [(i, round(at - sent[i], 2)) for i, at in got if at - sent[i] > 10]
        assert late == []  # leased at once (a missed wake-up: after the 30 s wait)


def test_an_append_wakes_a_wait_for_wake_asleep_behind_sleeping_leases(qdir, monkeypatch):
    # A thread that waits for the wake word alone (as ringq.aio does) may not lease what it was
    # woken for, so while one sleeps, every append wakes every sleeper -- also when it went to
    # sleep after the leases did and one wake-up per job would have gone to one of them.
    _long_naps(monkeypatch)
    with Queue(qdir, durability="none") as q, Queue(qdir, durability="none") as producer:
        _tail_read_in(q, producer)
        leased: list[object] = []
        leases = [
            threading.Thread(target=lambda: leased.append(q.lease_one(wait=30))) for _ in range(2)
        ]
        for t in leases:
            t.start()
        time.sleep(0.3)
        token = q.wake_token()
        woke: list[float] = []
        waiter = threading.Thread(
            target=lambda: (q.wait_for_wake(token, 30), woke.append(time.monotonic()))
        )
        waiter.start()
        time.sleep(0.3)
        at = time.monotonic()
        producer.enqueue({"i": 0})
        waiter.join(40)
        assert woke and woke[0] - at < 10  # woken by the append, not by its 30 s timeout
        producer.enqueue({"i": 1})  # for the other lease
        for t in leases:
            t.join(40)
        assert sorted(j.payload["i"] for j in leased if j is not None) == [0, 1]


def test_a_delayed_job_is_leased_when_due_after_the_sleeper_woken_for_it_stopped_waiting(
    qdir, monkeypatch
):
    # The sleeper woken by the append of a delayed job is the one asleep longest, A; its wait
    # ends before the job is due.  The others, asleep for long, must have learnt of the job too,
    # and one of them leases it when it is due, not at its own timeout.
    _long_naps(monkeypatch)
    with Queue(qdir, durability="none") as q, Queue(qdir, durability="none") as producer:
        _tail_read_in(q, producer)
        got: dict[str, tuple[object, float]] = {}

        def consume(name: str, wait: float) -> None:
            job = q.lease_one(wait=wait)
            got[name] = (None if job is None else job.payload, time.monotonic())

        threads = []
        for name, wait in (("A", 1.0), ("B", 30.0), ("C", 30.0)):
            threads.append(threading.Thread(target=consume, args=(name, wait)))
            threads[-1].start()
            time.sleep(0.2)  # A asleep first: the first a wake-up of one sleeper reaches
        at = time.monotonic()
        producer.enqueue("later", delay=1.0)
        threads[0].join(10)
        assert got["A"][0] is None  # A's wait ended before the job was due
        deadline = time.monotonic() + 10
        while not any(v[0] == "later" for v in got.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        leased = [v for v in got.values() if v[0] == "later"]
        assert leased and 0.9 < leased[0][1] - at < 5  # when due (a slept-through one: at 30 s)
        assert got["A"][1] - at < 0.9  # A had stopped waiting before the job was due
        q.wake()
        producer.enqueue("other")  # for the sleeper still waiting
        for t in threads:
            t.join(40)
