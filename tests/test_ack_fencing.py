"""ack after the lease was lost: a repeated ack is harmless, a stale holder's ack is refused."""

from __future__ import annotations

import time

import pytest

from ringq import JobNotFoundError, JobState, NotLeasedError, Queue


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


def test_stale_ack_after_the_job_moved_out_of_a_retired_segment_is_refused(tmp_path):
    """A lease belongs to the record it was taken on.  Here it expires (one attempt: the job goes
    to the dead-letter queue), the rest of its segment finishes, the dead job is relocated to the
    tail and the old segment retires.  The stale holder's ack must be refused -- it was taken for a
    harmless repeat of an ack because the segment had retired -- and the job stays dead."""
    with Queue(tmp_path, slot_count=8, slot_size=128, max_attempts=1, visibility_timeout=0.05) as q:
        q.enqueue("a")
        held = q.lease_one()
        for i in range(9):
            q.enqueue(i)  # seals the first segment
        time.sleep(0.1)
        for job in q.lease(20):
            q.ack(job)
        assert [j.id for j in q.dlq()] == [held.id]
        with pytest.raises(NotLeasedError, match="moved"):
            q.ack(held)
        with pytest.raises(NotLeasedError, match="moved"):
            q.nack(held)
        assert q.get(held.id).state is JobState.DEAD


def _retire_first_segment(q: Queue) -> None:
    """Seal the (16-slot) first segment and finish everything, so that it retires."""
    q.enqueue({"next": 1})
    for job in q.lease(32):
        q.ack(job)
    q.compact()


def test_stale_ack_after_another_holder_finished_and_the_segment_retired_is_refused(tmp_path):
    with Queue(tmp_path, visibility_timeout=0.05, slot_size=128, slot_count=16) as q:
        q.enqueue_many([{"i": i} for i in range(16)])
        stale = q.lease_one()
        time.sleep(0.1)  # its lease expires; another holder takes the job and finishes it
        batch = q.lease(16)
        with pytest.raises(NotLeasedError):
            q.ack(stale)
        for job in batch:
            q.ack(job)
        _retire_first_segment(q)
        with pytest.raises(NotLeasedError, match="segment retired"):
            q.ack(stale)
        with pytest.raises(NotLeasedError, match="segment retired"):
            q.ack(stale, result={"r": 1})
        with pytest.raises(NotLeasedError, match="segment retired"):
            q.nack(stale)
        with pytest.raises(NotLeasedError, match="segment retired"):
            q.extend(stale, 10)
        for job in batch:  # the holders whose acks went in: a repeat stays harmless
            q.ack(job)
            q.ack(job, result="again")  # stores nothing


def test_ack_of_a_purged_job_is_refused_before_and_after_its_segment_retired(tmp_path):
    for retire in (False, True):
        with Queue(tmp_path / str(retire), slot_size=128, slot_count=16) as q:
            q.enqueue_many([{"i": i} for i in range(16)])
            held = q.lease_one()
            q.purge()
            if retire:
                _retire_first_segment(q)
            with pytest.raises(NotLeasedError, match="purged|segment retired"):
                q.ack(held)


def test_a_snapshot_of_another_queues_job_is_refused_not_matched_by_position(tmp_path):
    """Two queues of one directory (and two directories) number their segments and slots alike:
    a snapshot leased from one must never ack, nack or extend the job at the same position of
    the other."""
    with Queue(tmp_path, "b") as b, Queue(tmp_path, "c") as c, Queue(tmp_path / "other", "b") as b2:
        b.enqueue("job-of-b")
        c.enqueue("x", job_id="invoice-17")
        b2.enqueue("job-of-the-other-b")
        jb, jc, jb2 = b.lease_one(), c.lease_one(), b2.lease_one()
        for stranger in (jc, jb2):
            for call in (lambda j: b.ack(j), lambda j: b.nack(j), lambda j: b.extend(j, 5)):
                with pytest.raises(NotLeasedError, match="another queue"):
                    call(stranger)
            with pytest.raises(JobNotFoundError, match="another queue"):
                b.cancel(stranger)
        assert b.get(jb.id).state is JobState.LEASED
        b.ack(jb)
        c.ack(jc)
        b2.ack(jb2)
        assert b.get(jb.id).state is c.get(jc.id).state is JobState.DONE
