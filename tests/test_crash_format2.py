"""Format 2's own crash points: a segment is a record file and a state file, synced apart.

The record file is the commit point of an enqueue; the state file is flushed in the background.
Each test builds the image a crash or a power loss leaves when the two files disagree, reopens
it and checks what comes out: every intact record is delivered (a lost state word means READY
again, at-least-once), nothing is invented, and the repair is reported.
"""

from __future__ import annotations

import os
import struct

from crashkit import (
    NAME,
    SLOT,
    SLOTS,
    drain,
    open_queue,
    reopen_and_drain,
    restore,
    seg_file,
    snapshot,
    state_file,
)

from ringq.engine.segment import OFF_TAIL


def _queue_with_acks(tmp_path, **kw):
    """Images of a queue holding jobs 0..5 with 0 and 1 acked: ``(before any enqueue, after)``."""
    live = str(tmp_path / "live")
    with open_queue(live, **kw) as q:
        empty = snapshot(live)
        q.enqueue_many([0, 1, 2])
        for i in range(3, 6):
            q.enqueue(i)
        a, b = q.lease(2)
        q.ack_many([a, b])
        after = snapshot(live)
    return empty, after


def test_record_durable_state_file_never_flushed(tmp_path):
    """Every enqueue's record reached the disk, the state file is as it was created (all EMPTY,
    tail 0): every job comes back READY -- the two acks were lost, so 0 and 1 are redelivered."""
    empty, after = _queue_with_acks(tmp_path)
    image = dict(after)
    image[state_file(1)] = empty[state_file(1)]
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    assert out.delivered == [0, 1, 2, 3, 4, 5]
    assert out.corrupt == [] and out.quarantined == []
    assert out.after == ["probe"]


def test_record_durable_state_file_lost_but_acks_journaled(tmp_path):
    """The same with ``sync_acks=True``: the ack journal replays the acks; only 2..5 come back."""
    empty, after = _queue_with_acks(tmp_path, sync_acks=True)
    image = dict(after)
    image[state_file(1)] = empty[state_file(1)]
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    assert out.delivered == [2, 3, 4, 5]


def test_state_file_missing_next_to_its_record_file(tmp_path):
    """A record file whose state file is gone gets a fresh one: jobs READY, the repair reported."""
    _empty, after = _queue_with_acks(tmp_path)
    image = dict(after)
    del image[state_file(1)]
    path = restore(image, str(tmp_path / "img"))
    with open_queue(path) as q:
        assert sorted(drain(q)) == [0, 1, 2, 3, 4, 5]
        assert any("state file missing" in why for _p, why in q.recovery.repairs), (
            q.recovery.repairs
        )
    assert state_file(1) in os.listdir(path)


def test_state_file_without_its_record_file_is_removed(tmp_path):
    """A state file alone (a creation cut short before the record file was renamed into place, or a
    retirement after it unlinked the record file) holds no job: removed at open, nothing invented."""
    _empty, after = _queue_with_acks(tmp_path)
    image = dict(after)
    image[state_file(7)] = image[state_file(1)]
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    assert out.delivered == [2, 3, 4, 5]
    assert state_file(7) not in out.files


def test_state_file_of_another_geometry_or_segment(tmp_path):
    """The two files of one segment disagree (seq, slot size, slot count or epoch): the record file
    wins, the state file is quarantined as evidence and a fresh one made; every job comes back."""
    _empty, after = _queue_with_acks(tmp_path)
    other = str(tmp_path / "other")
    with open_queue(other, slot_size=SLOT * 2, slot_count=SLOTS) as q:
        q.enqueue("elsewhere")
    foreign = snapshot(other)
    for bad in (foreign[state_file(1)],):
        image = dict(after)
        image[state_file(1)] = bad
        path = restore(image, str(tmp_path / "img"))
        with open_queue(path) as q:
            assert sorted(drain(q)) == [0, 1, 2, 3, 4, 5]
            assert any("disagrees" in why for _p, why in q.recovery.repairs), q.recovery.repairs
            assert any(p.endswith(".state.quarantined") for p, _w in q.recovery.quarantined)


def test_state_flushed_record_not(tmp_path):
    """The state file (tail and READY words) reached the disk, the last records' bytes did not (their
    enqueues never returned under a durable strategy): those slots are reported as damage, never
    delivered; the records that did reach the disk are."""
    live = str(tmp_path / "live")
    with open_queue(live) as q:
        q.enqueue_many([0, 1])
        before = snapshot(live)
        q.enqueue_many([2, 3])
        after = snapshot(live)
    image = dict(after)
    image[seg_file(1)] = before[seg_file(1)]
    assert struct.unpack_from("<I", image[state_file(1)], OFF_TAIL)[0] == 4
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    assert out.delivered == [0, 1]
    assert sorted(slot for _p, slot, _r in out.corrupt) == [2, 3]


def test_record_file_is_mapped_read_only_and_state_file_read_write(tmp_path):
    """Every process maps the record file PROT_READ (so a sync of it writes back only what pwrite
    dirtied) and the state file read-write (/proc/self/maps)."""
    path = str(tmp_path / "q")
    with open_queue(path) as q:
        q.enqueue("x")
        assert q.lease(1)
        with open("/proc/self/maps") as fh:
            maps = [line.split() for line in fh if path in line]
    perms = {os.path.basename(m[5]): m[1] for m in maps if len(m) >= 6}
    assert perms[f"{NAME}.{1:016x}.seg"] == "r--s"
    assert perms[f"{NAME}.{1:016x}.state"] == "rw-s"
