"""A call that changes state acts on the state read-only calls report: an expired lease, or one
whose holder process exited, is reclaimed first (as lease does), with no lease call in between."""

from __future__ import annotations

import time

import pytest
from procs import run_py

from ringq import JobState, NotLeasedError, Queue


def wait_until(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.02)


def expired_into_dlq(qdir, jid="J"):
    q = Queue(qdir, max_attempts=1)
    q.enqueue("x", job_id=jid)
    q.lease_one(visibility_timeout=0.3)
    wait_until(lambda: [j.id for j in q.dlq()] == [jid])
    return q


def holder_exited_into_dlq(qdir, jid="J"):
    q = Queue(qdir, max_attempts=1)
    q.enqueue("x", job_id=jid)
    out = run_py(
        """
        import sys
        from ringq import Queue
        print(Queue(sys.argv[1], max_attempts=1).lease_one(visibility_timeout=3600).id)
    """,
        qdir,
    )
    assert out.returncode == 0 and out.stdout.strip() == jid, out.stderr
    wait_until(lambda: [j.id for j in q.dlq()] == [jid])
    return q


@pytest.mark.parametrize("make", [expired_into_dlq, holder_exited_into_dlq])
def test_requeue_dead_takes_a_job_dlq_lists(tmp_path, make):
    q = make(str(tmp_path / "q"))
    assert q.requeue_dead() == 1
    assert q.get("J").state is JobState.READY


@pytest.mark.parametrize("make", [expired_into_dlq, holder_exited_into_dlq])
def test_requeue_dead_by_id_takes_a_job_dlq_lists(tmp_path, make):
    q = make(str(tmp_path / "q"))
    assert q.requeue_dead("J") == 1
    assert q.get("J").state is JobState.READY


@pytest.mark.parametrize("make", [expired_into_dlq, holder_exited_into_dlq])
def test_discard_dead_takes_a_job_dlq_lists(tmp_path, make):
    q = make(str(tmp_path / "q"))
    q.discard_dead("J")
    assert q.dlq() == [] and q.stats().total == 0


def test_an_ack_by_id_of_a_job_shown_dead_is_refused(tmp_path):
    q = expired_into_dlq(str(tmp_path / "q"))
    with pytest.raises(NotLeasedError):
        q.ack("J")
    assert q.get("J").state is JobState.DEAD


def test_purge_counts_what_stats_shows(tmp_path):
    q = expired_into_dlq(str(tmp_path / "q"))
    assert q.stats().dead == 1
    assert q.purge() == 1
    assert q.stats().total == 0
