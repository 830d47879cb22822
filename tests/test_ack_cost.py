"""Acking through a long sealed segment costs O(1) per ack: the search for stragglers (an O(segment)
pass over its state table) runs once per 1/64 of the segment's records finished, not on every ack.

Counted, not timed: a profile hook counts the passes while every job of a two-segment queue is
leased and acked one by one."""

from __future__ import annotations

import sys

from ringq import Queue
from ringq.engine.relocate import HOT_RECHECK, Relocator


def test_acks_in_a_sealed_segment_do_not_each_scan_it(tmp_path):
    slots = 1024
    q = Queue(tmp_path, slot_count=slots)
    q.enqueue_many([{"n": i} for i in range(slots + slots // 2)])  # the first segment is sealed
    passes = []
    code = Relocator.stragglers.__code__

    def hook(frame, event, arg):
        if event == "call" and frame.f_code is code:
            passes.append(1)

    sys.setprofile(hook)
    try:
        done = 0
        while (job := q.lease_one()) is not None:
            q.ack(job)
            done += 1
    finally:
        sys.setprofile(None)
    assert done == slots + slots // 2
    # Without the bound every ack in the sealed segment's second half searched it: 512 passes.
    assert len(passes) <= 2 * HOT_RECHECK, len(passes)
    q.close()


def test_acks_in_a_sealed_segment_read_its_shared_counts_once_per_step(tmp_path):
    # Before the segment is half finished an ack cannot relocate from it; it must not read the
    # segment's record and finished counts to find that out on every ack either.
    from ringq.engine.segment import Segment

    slots = 1024
    q = Queue(tmp_path, slot_count=slots)
    q.enqueue_many([{"n": i} for i in range(slots + slots // 2)])
    reads = []
    code = Segment.nrecords.__code__

    def hook(frame, event, arg):
        if event == "call" and frame.f_code is code:
            reads.append(1)

    sys.setprofile(hook)
    try:
        for _ in range(slots // 2):  # the first half of the sealed segment
            q.ack(q.lease_one())
    finally:
        sys.setprofile(None)
    # Without the bound: one read per ack, 512.
    assert len(reads) <= 2 * HOT_RECHECK, len(reads)
    q.close()
