"""Queue.wake_token / wait_for_wake / wake: waiting for work without leasing (used by ringq.aio)."""

import threading
import time

from ringq import Queue


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
