"""ack after the lease was lost: a repeated ack is harmless, a stale holder's ack is refused."""

from __future__ import annotations

import time

import pytest

from ringq import JobState, NotLeasedError, Queue


def test_repeated_ack_by_the_holder_is_harmless(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue("x")
        job = q.lease_one()
        q.ack(job)
        q.ack(job)
        q.ack(job.id)
        assert q.get(job.id).state is JobState.DONE


def test_stale_holder_ack_after_another_holder_finished_is_refused(tmp_path):
    with Queue(tmp_path) as q, Queue(tmp_path) as other:
        q.enqueue("x")
        first = q.lease_one(visibility_timeout=0.1)
        time.sleep(0.2)
        second = other.lease_one(wait=5)  # the expired lease is reclaimed, taken again and finished
        assert second.id == first.id and int(second.lease_token) == int(first.lease_token) + 1
        other.ack(second)
        with pytest.raises(NotLeasedError, match="done"):
            q.ack(first)
