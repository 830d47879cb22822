"""Acking through a long sealed segment costs O(1) per ack: the search for stragglers (an O(segment)
pass over its state table) runs once per 1/64 of the segment's records finished, not on every ack,
and so does the read of the segment's shared counts that decides whether to search.

Counted, not timed: a profile hook counts the calls while the jobs of a two-segment queue are
leased and acked one by one."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ringq import Queue
from ringq.engine.relocate import HOT_RECHECK, Relocator
from ringq.engine.segment import Segment

SLOTS = 1024


def calls_while(fn: Callable[..., Any], run: Callable[[], None]) -> int:
    """How many times ``fn`` is called while ``run()`` runs."""
    code, calls = fn.__code__, []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code is code:
            calls.append(1)

    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return len(calls)


def two_segments(tmp_path) -> Queue:
    q = Queue(tmp_path, slot_count=SLOTS)
    q.enqueue_many([{"n": i} for i in range(SLOTS + SLOTS // 2)])  # the first segment is sealed
    return q


def test_acks_in_a_sealed_segment_do_not_each_scan_it(tmp_path):
    q = two_segments(tmp_path)
    done = []

    def drain() -> None:
        while (job := q.lease_one()) is not None:
            q.ack(job)
            done.append(1)

    passes = calls_while(Relocator.stragglers, drain)
    assert len(done) == SLOTS + SLOTS // 2
    # Without the bound every ack in the sealed segment's second half searched it: 512 passes.
    assert passes <= 2 * HOT_RECHECK, passes
    q.close()


def test_acks_in_a_sealed_segment_read_its_shared_counts_once_per_step(tmp_path):
    # Before the segment is half finished an ack cannot relocate from it; it must not read the
    # segment's record and finished counts to find that out on every ack either.
    q = two_segments(tmp_path)

    def first_half() -> None:
        for _ in range(SLOTS // 2):
            q.ack(q.lease_one())

    reads = calls_while(Segment.nrecords, first_half)
    # Without the bound: one read per ack, 512.
    assert reads <= 2 * HOT_RECHECK, reads
    q.close()
