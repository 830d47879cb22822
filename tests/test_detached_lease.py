"""Detached leases (``lease(detach=True)``): they outlive the process that took them.

A normal lease is tied to its holder's owner lock, so it comes back the moment the holder exits.
``ringq lease`` exits right after printing the job, so its leases must be detached: they end only by
ack/nack or the visibility timeout.
"""

from __future__ import annotations

import subprocess
import sys
import time

from procs import child_env

from ringq import JobState, Queue

LEASE_AND_EXIT = """
import sys
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=float(sys.argv[3]))
job = q.lease_one(detach=sys.argv[2] == "1")
print(job.id)
"""


def _lease_in_child(path, detach: bool, vt: float = 30.0) -> str:
    out = subprocess.run([sys.executable, "-c", LEASE_AND_EXIT, str(path), "1" if detach else "0", str(vt)],
                         env=child_env(), capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip()


def test_detached_lease_survives_its_holder_exiting(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue("x")
    job_id = _lease_in_child(tmp_path, detach=True)
    with Queue(tmp_path) as q:  # opening reaps dead holders' leases
        job = q.get(job_id)
        assert job.state is JobState.LEASED
        assert q.lease_one() is None
        q.ack(job_id)
        assert q.get(job_id).state is JobState.DONE


def test_owned_lease_comes_back_when_its_holder_exits(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue("x")
    job_id = _lease_in_child(tmp_path, detach=False)
    with Queue(tmp_path) as q:
        job = q.get(job_id)
        assert job.state is JobState.READY
        assert job.last_error and "died" in job.last_error


def test_detached_lease_still_expires(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue("x")
    job_id = _lease_in_child(tmp_path, detach=True, vt=0.3)
    time.sleep(0.4)
    with Queue(tmp_path) as q:
        job = q.lease_one()
        assert job is not None and job.id == job_id and job.attempts == 2
