"""A process that starts a new segment itself still reads every segment other processes made
since it last looked: none is skipped, so no job goes unseen and no job id is stored twice."""

from __future__ import annotations

from procs import run_py

from ringq import Queue

OTHER = """
import sys
from ringq import Queue
with Queue(sys.argv[1], slot_count=64) as q:
    if len(sys.argv) > 2:
        q.enqueue_many([{"a": i} for i in range(200)], job_ids=[f"id-{i}" for i in range(200)])
    else:
        q.enqueue_many([{"a": i} for i in range(200)])
"""


def test_a_process_that_rotates_still_sees_the_segments_between(tmp_path):
    with Queue(tmp_path, slot_count=64) as b:
        b.enqueue({"b": -1})
        assert run_py(OTHER, str(tmp_path)).returncode == 0  # segments 1..4 by another process
        b.enqueue_many([{"b": i} for i in range(70)])  # b starts a segment of its own
        got = []
        while (job := b.lease_one()) is not None:
            got.append(job.payload)
            b.ack(job)
        assert sorted(p["a"] for p in got if "a" in p) == list(range(200))
        assert len(got) == 271
        assert b.stats().ready == 0


def test_ids_published_in_skipped_segments_are_not_stored_twice(tmp_path):
    with Queue(tmp_path, slot_count=64) as b:
        b.enqueue({"b": -1})
        assert run_py(OTHER, str(tmp_path), "ids").returncode == 0
        b.enqueue_many([{"b": i} for i in range(70)])
        again = b.enqueue_many([{"a": i} for i in range(200)], job_ids=[f"id-{i}" for i in range(200)])
        assert all(j.payload == {"a": i} for i, j in enumerate(again))
        assert b.stats().enqueued_total == 271  # the second enqueue of the ids wrote nothing
