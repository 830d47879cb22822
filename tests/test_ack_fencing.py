"""ack after the lease was lost: a repeated ack is harmless, a stale holder's ack is refused."""

from __future__ import annotations

import os
import shutil
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


def test_a_snapshot_of_a_queue_deleted_and_created_again_at_its_path_is_refused(tmp_path):
    """A queue removed and created again at the same path numbers its first job as the old one
    did, and its control file may get the old one's inode (ext4 hands a freed inode out again):
    the old snapshot must not ack, nack or extend the new queue's job."""
    path = tmp_path / "q"
    reused = 0
    for _ in range(5):
        with Queue(path, "a") as q:
            q.enqueue({"old": True})
            old = q.lease_one()
            inode = os.stat(path / "a.ctl").st_ino
        shutil.rmtree(path)
        with Queue(path, "a") as q:
            q.enqueue({"new": True})
            new = q.lease_one()
            reused += os.stat(path / "a.ctl").st_ino == inode
            assert new.record_position[:2] == old.record_position[:2] and new.id == old.id
            for call in (lambda j: q.ack(j), lambda j: q.nack(j), lambda j: q.extend(j, 5)):
                with pytest.raises(NotLeasedError, match="another queue"):
                    call(old)
            assert q.get(new.id).state is JobState.LEASED
            q.ack(new)
        shutil.rmtree(path)
    print(f"the control file's inode came back {reused} times of 5")


def test_a_snapshot_acks_through_another_open_of_its_queue(tmp_path):
    """The queue's identity is the same at every open (its random part is stored at creation):
    a job leased through one ``Queue`` object is acked through another of the same queue, also
    one opened after the first was closed (a detached lease outlives its holder's queue)."""
    with Queue(tmp_path, "a") as q1, Queue(tmp_path, "a") as q2:
        q1.enqueue_many(["x", "y"])
        job = q1.lease_one()
        q2.ack(job)
        assert q1.get(job.id).state is JobState.DONE
        kept = q1.lease_one(detach=True)
    with Queue(tmp_path, "a") as q3:
        q3.ack(kept)
        assert q3.get(kept.id).state is JobState.DONE


@pytest.mark.parametrize("token", [["1"], 1.0, 2, "2", "", "x1", None])
def test_a_token_that_is_not_the_leases_is_refused_whatever_its_type(tmp_path, token):
    # Only the token the lease issued ("1"), or its number, acks it; any other value -- of any
    # type, hashable or not -- is refused with NotLeasedError, and the lease stays held.
    import dataclasses

    with Queue(tmp_path) as q:
        q.enqueue("x")
        job = q.lease_one()
        forged = dataclasses.replace(job, lease_token=token)
        if token is None:  # a snapshot without a token is an operator's ack, as by bare id
            q.ack(forged)
            assert q.get(job.id).state is JobState.DONE
            return
        with pytest.raises(NotLeasedError):
            q.ack(forged)
        assert q.get(job.id).state is JobState.LEASED
        q.ack(dataclasses.replace(job, lease_token=1))  # its number, as an int
        assert q.get(job.id).state is JobState.DONE


@pytest.mark.parametrize("threads", [1, 4])
def test_an_ack_after_the_lease_ran_out_is_refused_though_nothing_reclaimed_it_yet(tmp_path, threads):
    # No call of this queue ran between the expiry and the acks, so nothing had reclaimed the
    # leases; the acks must still not finish jobs whose visibility timeout passed (they are READY
    # again, for another holder), from one thread or several at once.
    import threading

    with Queue(tmp_path, visibility_timeout=0.2) as q:
        q.enqueue_many(list(range(8)))
        jobs = q.lease(8)
        time.sleep(0.35)
        refused = []

        def ack_all(mine):
            for job in mine:
                with pytest.raises(NotLeasedError):
                    q.ack(job)
                refused.append(job.id)

        workers = [threading.Thread(target=ack_all, args=(jobs[i::threads],)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        assert sorted(refused) == sorted(j.id for j in jobs)
        assert {q.get(j.id).state for j in jobs} == {JobState.READY}
        again = q.lease(8)
        assert {j.lease_token for j in again} == {"2"}
        for job in again:
            q.ack(job)
        assert q.stats().done == 8


def test_a_snapshot_whose_seq_is_not_its_records_does_not_ack_the_job_there(tmp_path):
    # The first try acks only the record the snapshot names: a snapshot altered to carry another
    # job's seq at this position is refused, and the job leased there stays leased.
    import dataclasses

    with Queue(tmp_path) as q:
        q.enqueue_many(["a", "b"])
        a, b = q.lease(2)
        forged = dataclasses.replace(a, seq=b.seq)
        with pytest.raises((NotLeasedError, JobNotFoundError)):
            q.ack(forged)
        assert q.get(a.id).state is JobState.LEASED
        q.ack(a)
        q.ack(b)
        assert q.stats().done == 2


def test_a_job_copied_to_the_tail_counts_its_tokens_from_1_and_fences_older_leases_by_record(
    tmp_path,
):
    # docs/migration.md ("lease_token"): a ready job overtaken by higher priorities in a sealed
    # segment is copied to the tail (a new record); the copy's first lease has token 1 again, as
    # the lapsed lease on the old record had, and that old holder's ack is refused by its record.
    with Queue(tmp_path, slot_size=128, slot_count=16, max_attempts=100) as q:
        x = q.enqueue("x")
        old = q.lease_one(visibility_timeout=0.2)
        for i in range(15):  # the rest of the segment, ranked before x
            q.enqueue(i, priority=3)
        time.sleep(0.4)  # the old lease runs out
        q.enqueue("tail", priority=-5)  # a second segment: the first is sealed
        for _ in range(15):
            q.ack(q.lease_one())  # the last ack leaves x alone in its sealed segment: copied
        assert q.get(x.id).seq != x.seq
        new = q.lease_one()
        assert (new.id, new.seq != x.seq, new.lease_token, new.attempts) == (x.id, True, "1", 2)
        assert old.lease_token == "1"
        with pytest.raises(NotLeasedError, match="record moved"):
            q.ack(old)
        q.ack(new)
        assert q.get(x.id).state is JobState.DONE
