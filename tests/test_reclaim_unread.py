"""What a reaper reclaims is what is really leased, counted right: a dead holder's lease of a
record the reaper's own index has not read yet (appended and leased by other processes since its
last catch-up) counts the job's attempts from the record, not from the empty slot of its index (the
job goes back to READY on its first attempt, never to the dead-letter queue); and a word that
stopped being a lease between the scan and the reclaim is left alone."""

from __future__ import annotations

import signal
import subprocess

from procs import spawn

from ringq import JobState, Queue
from ringq.engine.index import Index
from ringq.engine.owner import OwnerRegistry
from ringq.engine.reaper import Reaper
from ringq.engine.ring import Ring
from ringq.engine.words import WHY_EXPIRED, now_ms

ENQUEUE_LEASE_AND_HANG = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=600)
q.enqueue("late", job_id="late")
job = q.lease_one()
print(job.id, flush=True)
time.sleep(600)
"""


def test_a_dead_holders_lease_of_an_unread_record_goes_back_to_ready(tmp_path):
    with Queue(tmp_path, visibility_timeout=600) as q:
        q.enqueue("first")  # the segment exists and the reaper's index below has read it
        q.ack(q.lease_one())
        ring = Ring(tmp_path)
        index = Index(ring)
        index.catch_up()
        owners = OwnerRegistry(str(tmp_path / "default.owners"))
        reaper = Reaper(ring, index, owners)
        holder = spawn(ENQUEUE_LEASE_AND_HANG, str(tmp_path), stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "late"
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
        assert reaper.reap(force=True) == 1  # no catch-up in between: the record is unread here
        job = q.get("late")
        assert job.state is JobState.READY and job.attempts == 1, (job.state, job.attempts)
        index.reset()
        owners.close()
        ring.close()


def test_a_reclaim_of_a_word_that_is_no_longer_a_lease_changes_nothing(tmp_path):
    # The reaper scans the live state table, then copies the words it found LEASED: a word can
    # move in between (a nack that dead-lettered the job, another reaper).  Reclaiming the copy
    # must then do nothing -- not try DEAD -> DEAD, which the state machine refuses.
    with Queue(tmp_path, max_attempts=1) as q:
        q.enqueue("once")
        job = q.lease_one()
        dead = q.nack(job, error="no more")
        assert dead.state is JobState.DEAD
        ring = Ring(tmp_path)
        index = Index(ring)
        index.catch_up()
        owners = OwnerRegistry(str(tmp_path / "default.owners"))
        reaper = Reaper(ring, index, owners)
        segseq, slot, _origin = job.record_position
        view = index.views[segseq]
        word = view.seg.load_state(slot)
        assert reaper.reclaim(view, slot, word, WHY_EXPIRED, now_ms()) == 0
        assert q.get(job.id).state is JobState.DEAD
        index.reset()
        owners.close()
        ring.close()
