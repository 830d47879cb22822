"""Every bit of a committed record, flipped one at a time.

Invariant: a single flipped bit anywhere in a committed record (static header fields, CRC, id,
payload) is always detected; the damaged job is quarantined (state BAD, never delivered) and
reported by ``Queue.recovery.corrupt_records``, ``stats().corrupt`` and ``ringq verify``; every other
job is still delivered.  Both orders are enumerated: damage already on disk when the queue is
opened, and damage that appears after a live process has scanned (indexed) the record.
"""

from __future__ import annotations

import os
import struct

import pytest
from crashkit import NAME, SLOT, drain, geometry, open_queue, restore, seg_file, snapshot, verify

TARGET_SLOT = 1


def _image(tmp_path, payload, job_id):
    live = str(tmp_path / "live")
    with open_queue(live) as q:
        q.enqueue("before")
        q.enqueue(payload, job_id=job_id)
        q.enqueue("after")
    image = snapshot(live)
    _, data_off, _ = geometry()
    rec_off = data_off + TARGET_SLOT * SLOT
    rec_len = struct.unpack_from("<I", image[seg_file(1)], rec_off + 8)[0]
    return image, rec_off, rec_len


def _flipped(image, off, bit):
    seg = bytearray(image[seg_file(1)])
    seg[off] ^= 1 << bit
    out = dict(image)
    out[seg_file(1)] = bytes(seg)
    return out


def _assert_quarantined(q, delivered):
    assert delivered == ["before", "after"]
    assert [slot for _p, slot, _r in q.recovery.corrupt_records] == [TARGET_SLOT]
    assert q.stats().corrupt == 1
    [damage] = verify(q).damaged
    assert f"slot {TARGET_SLOT} " in damage


CASES = {
    "small-json": ({"k": 1}, None),
    "with-id": ([1, 2, 3], "job-42"),
    "two-slots": ("y" * 150, "spanning"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_bit_flip_on_disk_is_detected(tmp_path, case):
    payload, job_id = CASES[case]
    image, rec_off, rec_len = _image(tmp_path, payload, job_id)
    for byte in range(rec_len):
        for bit in range(8):
            path = restore(_flipped(image, rec_off + byte, bit), str(tmp_path / "img"))
            with open_queue(path) as q:
                delivered = drain(q)
                try:
                    _assert_quarantined(q, delivered)
                except AssertionError as exc:
                    raise AssertionError(
                        f"flip of byte {byte} bit {bit} of the record: {exc}"
                    ) from None
                q.enqueue("new")
                assert drain(q) == ["new"]


@pytest.mark.parametrize("case", ["small-json", "with-id"])
def test_every_bit_flip_after_indexing_is_detected(tmp_path, case):
    """The record was valid when this process scanned it; the bit flips before the lease."""
    payload, job_id = CASES[case]
    image, rec_off, rec_len = _image(tmp_path, payload, job_id)
    for byte in range(rec_len):
        for bit in range(8):
            path = restore(image, str(tmp_path / "img"))
            with open_queue(path) as q:
                assert q.stats().ready == 3  # scanned and indexed, all valid
                fd = os.open(os.path.join(path, seg_file(1)), os.O_RDWR)
                try:
                    old = os.pread(fd, 1, rec_off + byte)
                    os.pwrite(
                        fd, bytes([old[0] ^ (1 << bit)]), rec_off + byte
                    )  # same page cache as the mapping
                finally:
                    os.close(fd)
                delivered = drain(q)
                try:
                    _assert_quarantined(q, delivered)
                except AssertionError as exc:
                    raise AssertionError(
                        f"flip of byte {byte} bit {bit} of the record: {exc}"
                    ) from None


def test_undamaged_queue_verifies_clean(tmp_path):
    image, _, _ = _image(tmp_path, {"k": 1}, None)
    with open_queue(restore(image, str(tmp_path / "img"))) as q:
        rep = verify(q)
        assert rep.damaged == [] and rep.notes == [] and len(rep.segments) == 1
        assert q.recovery.clean


def test_quarantined_job_is_reported_by_id_lookup_not_delivered(tmp_path):
    image, rec_off, _ = _image(tmp_path, [1, 2, 3], "job-42")
    path = restore(_flipped(image, rec_off + 70, 0), str(tmp_path / "img"))  # a payload byte
    with open_queue(path) as q:
        drain(q)
        assert all(j.id != "job-42" for j in q.list_jobs())
        assert q.stats().done == 2 and q.stats().corrupt == 1
        assert NAME in q.recovery.corrupt_records[0][0]


def test_a_damaged_lease_count_beyond_16_bits_survives_relocation(tmp_path):
    # The shrunk example of the mutation fuzzer: slot 0's state word overwritten with 4962369, a
    # READY word claiming 77,537 leases.  Its nack dead-letters it, and relocating the dead job
    # must not overflow the record's 16-bit attempts-carried-over field.
    from ringq import JobState, Queue

    qdir = tmp_path / "q"
    with Queue(qdir, "q", slot_size=128, slot_count=8) as q:
        q.enqueue_many(list(range(12)))  # the first segment fills and is sealed
    state = qdir / "q.0000000000000001.state"
    with open(state, "r+b") as fh:
        fh.seek(4096)  # the state file's state table: slot 0's state word
        fh.write(struct.pack("<Q", 4962369))
    with Queue(qdir, "q", slot_size=128, slot_count=8) as q:
        jobs = q.lease(12)
        first = next(j for j in jobs if j.payload == 0)
        assert first.attempts == 77538
        assert q.nack(first, error="again").state is JobState.DEAD
        for j in jobs:
            if j is not first:
                q.ack(j)
        q.compact()
        dead = q.get(first.id)
        assert dead.state is JobState.DEAD and dead.attempts >= dead.max_attempts
        assert [j.id for j in q.dlq()] == [first.id]
