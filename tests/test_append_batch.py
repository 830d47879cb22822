"""The write path of an enqueue: a batch goes to the record file in one ``ringq_append`` per segment.

Invariants: the bytes a batch leaves in the slots are exactly the documented record layout
(records.build + records.fill_header, CRC32C seeded with the segment seq and head slot, zeroed
padding), for the batch path and for the per-record path alike; a batch that spans rotations
reads back whole and in order; a write that fails publishes nothing of its batch and loses nothing
published before, even after a reopen that adopts intact records beyond a tail; producers in
several processes get every job stored exactly once.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
from array import array

import pytest
from procs import spawn

from ringq import LockTimeoutError, Queue
from ringq.codec import BYTES, JSON
from ringq.engine.control import OFF_LOCK_WAITERS, OFF_LOCK_WAKE
from ringq.engine.mapped import crc32c
from ringq.engine.records import (
    KIND_JOB,
    NewRecord,
    build,
    check_one,
    fill_header,
    read_record,
    scan,
)
from ringq.engine.ring import Ring
from ringq.engine.segment import REC_DATA_OFF
from ringq.engine.words import ST_CONT, ST_EMPTY, ST_READY, pack, state
from ringq.job import Job, JobState

SLOT = 128


def packed(payloads, ids=None):
    """The arguments of Ring.append_packed for JSON-encoded ``payloads`` (and explicit ``ids``)."""
    datas = [json.dumps(p).encode() for p in payloads]
    id_bytes = [i.encode() for i in ids] if ids is not None else None
    data = b"".join(datas) if ids is None else b"".join(i + d for i, d in zip(id_bytes, datas))
    largest = 64 + max(len(d) + (len(id_bytes[k]) if ids else 0) for k, d in enumerate(datas))
    return (
        (
            len(datas),
            bytes([JSON] * len(datas)),
            None if ids is None else array("H", map(len, id_bytes)),
            array("I", map(len, datas)),
            data,
            largest,
        ),
        datas,
        id_bytes,
    )


def reference(seg, slot, rec, seq, enq_us, avail_ms):
    """The bytes of ``rec`` at ``slot`` as docs/format.md lays them out (CRC included)."""
    buf = build(rec)
    span = -(-len(buf) // seg.slot_size)
    fill_header(buf, rec, span, seq, enq_us, avail_ms)
    seed = struct.pack("<QI4x", seg.seq, slot)
    struct.pack_into("<I", buf, 4, crc32c(bytes(buf[8:]), crc32c(seed)))
    return bytes(buf), span


def slot_bytes(seg, slot, span):
    off = seg.data_off + slot * seg.slot_size
    return bytes(seg.mm[off : off + span * seg.slot_size])


def check_record(seg, slot, rec, seq, enq_us, avail_ms, word_state=ST_READY):
    want, span = reference(seg, slot, rec, seq, enq_us, avail_ms)
    got = slot_bytes(seg, slot, span)
    assert got[: len(want)] == want, f"segment {seg.seq} slot {slot}"
    assert got[len(want) :] == bytes(span * seg.slot_size - len(want)), "padding is zeroed"
    assert check_one(seg, slot) is not None  # the C validation agrees (magic, length, CRC)
    word = seg.load_state(slot)
    assert word == pack(word_state, 0, 0, avail_ms - seg.epoch_ms)
    assert all(state(seg.load_state(slot + i)) == ST_CONT for i in range(1, span))
    return span


def test_batch_bytes_are_the_documented_layout_across_rotations(tmp_path):
    ring = Ring(tmp_path, "q", slot_size=SLOT, slot_count=16, durability="none")
    # Lengths from empty to several slots, so records span slots and the batch spans segments.
    payloads = [{"i": i, "pad": "x" * (i * 37 % 400)} for i in range(40)]
    args, datas, _ids = packed(payloads)
    parts, heads, seq0, enq_us, avail_ms, ticket = ring.append_packed(*args, 7, 1500, 9, KIND_JOB)
    ring.finish(ticket)
    assert len(parts) >= 3 and sum(p[2] for p in parts) == 40
    assert [p[1] for p in parts] == [
        0,
        *[sum(q[2] for q in parts[:k]) for k in range(1, len(parts))],
    ]
    assert avail_ms - enq_us // 1000 == 1500
    for segseq, first, cnt in parts:
        seg = ring.segs.segment(segseq)
        assert seg.nrecords() == cnt and seg.last_seq() == seq0 + first + cnt - 1
        for i in range(first, first + cnt):
            rec = NewRecord(datas[i], JSON, b"", 7, 1500, 9)
            span = check_record(seg, heads[i], rec, seq0 + i, enq_us, avail_ms)
        assert seg.tail() == heads[first + cnt - 1] + span
    segs = ring.segs.ordered()
    assert all(s.sealed() for s in segs[:-1]) and not segs[-1].sealed()
    assert ring.ctl.totals()["enqueued"] == 40
    ring.close()


def test_explicit_ids_and_the_per_record_path_write_the_same_layout(tmp_path):
    ring = Ring(tmp_path, "q", slot_size=SLOT, slot_count=64, durability="none")
    args, datas, ids = packed(["a", {"b": 2}, "c" * 300], ids=["id-1", "é" * 40, "id-3"])
    parts, heads, seq0, enq_us, avail_ms, ticket = ring.append_packed(*args, -3, 0, 2, KIND_JOB)
    ring.finish(ticket)
    seg = ring.segs.segment(parts[0][0])
    for i in range(3):
        check_record(
            seg, heads[i], NewRecord(datas[i], JSON, ids[i], -3, 0, 2), seq0 + i, enq_us, avail_ms
        )
    # The per-record path (records with their own times, attempts and state: import, requeue,
    # relocation) goes through the same C call.
    old = [
        NewRecord(
            b"\x00\x01",
            BYTES,
            b"x",
            5,
            0,
            4,
            2,
            supersedes=(1 << 24) | 3,
            at_ms=123_456,
            enqueued_us=99,
        ),
        NewRecord(b"[1]", JSON, b"", 0, 0, 1, 0, state=4, at_ms=avail_ms),  # published DEAD
    ]
    placed = ring.append(old)
    for rec, (segseq, slot, seq, enq, avail) in zip(old, placed):
        check_record(ring.segs.segment(segseq), slot, rec, seq, enq, avail, word_state=rec.state)
    assert ring.ctl.totals()["enqueued"] == 3  # copies are not counted as enqueued
    ring.close()


def test_enqueue_many_returns_a_list_of_the_jobs_as_stored(tmp_path):
    with Queue(tmp_path, slot_size=SLOT, slot_count=8, durability="none") as q:
        jobs = q.enqueue_many(
            [{"n": i} for i in range(20)],
            priority=4,
            delay=30,
            max_attempts=3,
            key="k",
            expires_in=600,
        )
        assert type(jobs) is list and all(type(j) is Job for j in jobs)
        one = q.enqueue(b"raw", priority=-1)
        for j in [*jobs, one]:
            got = q.get(j.id)
            assert got == j, (got, j)
            assert got.state is JobState.READY and got.version == 0
        assert [j.seq for j in jobs] == list(range(jobs[0].seq, jobs[0].seq + 20))
        assert jobs[0].key == "k" and jobs[0].expires_at is not None and one.key is None


def _tail_state(ring):
    seg = ring.segs.segment(ring.ctl.tail_seq())
    return (
        seg,
        seg.tail(),
        seg.nrecords(),
        ring.ctl.totals()["enqueued"],
        sorted(os.listdir(ring.dir)),
    )


def test_a_failed_write_publishes_nothing_and_loses_nothing(tmp_path):
    ring = Ring(tmp_path, "q", slot_size=SLOT, slot_count=16, durability="none")
    ring.finish(ring.append_packed(*packed(["a", "b", "c"])[0], 0, 0, 5, KIND_JOB)[-1])
    seg, tail, nrec, total, files = _tail_state(ring)
    # The record file behind the segment's descriptor becomes read-only: every pwrite fails (EBADF).
    keep = os.dup(seg.rfd)
    ro = os.open(seg.path, os.O_RDONLY)
    os.dup2(ro, seg.rfd)
    os.close(ro)
    try:
        for batch in (["d"], [{"big": "y" * 500}] * 30):  # one job; a batch that needs rotations
            with pytest.raises(OSError):
                ring.append_packed(*packed(batch)[0], 0, 0, 5, KIND_JOB)
            assert _tail_state(ring) == (seg, tail, nrec, total, files)  # no segment left behind
            assert all(state(w) == ST_EMPTY for w in seg.states[tail:, 0])
            assert len(scan(seg, 0)[0]) == 3
    finally:
        os.dup2(keep, seg.rfd)
        os.close(keep)
    ring.finish(ring.append_packed(*packed(["e", "f"])[0], 0, 0, 5, KIND_JOB)[-1])
    ring.close()
    with Queue(tmp_path, "q") as q:
        got = []
        while jobs := q.lease(10):
            got += [j.payload for j in jobs]
            q.ack_many(jobs)
        assert got == ["a", "b", "c", "e", "f"]


PARTIAL_CHILD = r"""
import os, resource, signal, sys
from ringq import Queue, QueueFullError
from ringq.engine.segment import REC_DATA_OFF
path, limit = sys.argv[1], int(sys.argv[2])
q = Queue(path, "q", slot_size=128, slot_count=64, durability="none")
q.enqueue_many(["a", "b", "c", "d"])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
sys.dont_write_bytecode = True  # a module first imported under the limit: no truncated cache
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
try:
    q.enqueue_many([{"n": i, "pad": "z" * 40} for i in range(20)])
except QueueFullError as exc:
    print("refused", exc.errno, flush=True)
os._exit(0)  # as if killed: no close, nothing tidied
"""


def test_a_write_cut_short_leaves_no_records_for_recovery_to_adopt(tmp_path):
    """A pwrite that writes part of a run and then fails (here: the file size limit, EFBIG) must
    not leave the records it did write intact beyond the tail: recovery at the next open adopts
    every intact record there (the record file is the commit point after a power loss), so they
    would come back as half of a batch whose enqueue failed."""
    limit = REC_DATA_OFF + 10 * SLOT + 50  # the batch starts at slot 4: six records fit before it
    child = spawn(PARTIAL_CHILD, str(tmp_path), str(limit), stdout=-1, text=True)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and out.split() == ["refused", "27"], out
    with open(tmp_path / "q.0000000000000001.seg", "rb") as fh:
        fh.seek(REC_DATA_OFF + 4 * SLOT)
        assert fh.read(limit - REC_DATA_OFF - 4 * SLOT) == bytes(limit - REC_DATA_OFF - 4 * SLOT)
    with Queue(tmp_path, "q") as q:
        got = []
        while jobs := q.lease(10):
            got += [j.payload for j in jobs]
            q.ack_many(jobs)
        assert got == ["a", "b", "c", "d"]
        assert q.recovery.readopted == []


PRODUCER = r"""
import sys
from ringq import Queue
path, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = Queue(path, "q", slot_size=128, slot_count=32, durability="none")
i = 0
while i < n:
    if i % 3:
        q.enqueue({"who": who, "i": i, "pad": "p" * (i % 200)})
        i += 1
    else:
        k = min(1 + i % 23, n - i)
        q.enqueue_many([{"who": who, "i": i + j, "pad": "q" * ((i + j) % 300)} for j in range(k)])
        i += k
q.close()
"""


def test_producer_processes_each_job_stored_exactly_once(tmp_path):
    Queue(tmp_path, "q", slot_size=128, slot_count=32, durability="none").close()
    n, who = 400, ["p0", "p1", "p2", "p3"]
    procs = [spawn(PRODUCER, str(tmp_path), w, str(n)) for w in who]
    for p in procs:
        assert p.wait(timeout=120) == 0
    with Queue(tmp_path, "q") as q:
        got = []
        while jobs := q.lease(100):
            got += [(j.payload["who"], j.payload["i"], j.seq) for j in jobs]
            q.ack_many(jobs)
        assert q.stats().corrupt == 0
    assert sorted((w, i) for w, i, _ in got) == sorted((w, i) for w in who for i in range(n))
    for w in who:  # each producer's jobs got seqs in the order it enqueued them
        seqs = [s for x, i, s in sorted(got, key=lambda t: (t[0], t[1])) if x == w]
        assert seqs == sorted(seqs)
    assert len({s for _, _, s in got}) == len(got)


def test_the_one_call_append_follows_the_writer_locks_waiter_protocol(tmp_path):
    """An uncontended append takes and releases the flock inside one C call: on release it wakes
    a registered waiter as ringq/engine/lock.py's own release does, and leaves the lock free."""
    ring = Ring(tmp_path, "q", slot_size=SLOT, slot_count=64, durability="none")
    ring.finish(ring.append_one(JSON, b'"warm"', 0, 0, 5, KIND_JOB)[-1])  # the general way, once
    ctl = ring.ctl
    wake = ctl.load32(OFF_LOCK_WAKE)
    ring.finish(ring.append_one(JSON, b'"a"', 0, 0, 5, KIND_JOB)[-1])
    assert ctl.load32(OFF_LOCK_WAKE) == wake  # nobody waits: no wake-up
    ctl.add32(OFF_LOCK_WAITERS, 1)  # a writer registered as waiting
    try:
        ring.finish(ring.append_one(JSON, b'"b"', 0, 0, 5, KIND_JOB)[-1])
        assert ctl.load32(OFF_LOCK_WAKE) == wake + 1
    finally:
        ctl.add32(OFF_LOCK_WAITERS, -1)
    # The lock is free: another open file description takes it at once.
    fd = os.open(os.path.join(tmp_path, "q.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    ring.close()


def test_an_append_while_holding_the_writer_lock_or_while_it_is_held_elsewhere(tmp_path):
    ring = Ring(tmp_path, "q", slot_size=SLOT, slot_count=64, durability="none", lock_timeout=0.2)
    ring.finish(ring.append_one(JSON, b"1", 0, 0, 5, KIND_JOB)[-1])
    with ring.locked():  # this thread holds it: the append nests (no second flock)
        ring.finish(ring.append_one(JSON, b"2", 0, 0, 5, KIND_JOB)[-1])
    other = spawn(HOLDER, str(tmp_path), stdout=-1, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(LockTimeoutError):  # the one-call path backs off to the lock's wait
            ring.append_one(JSON, b"3", 0, 0, 5, KIND_JOB)
    finally:
        other.kill()
        other.wait()
    ring.finish(ring.append_one(JSON, b"4", 0, 0, 5, KIND_JOB)[-1])
    seg = ring.segs.segment(ring.ctl.tail_seq())
    infos = scan(seg, 0)[0]
    assert [int(i["seq"]) for i in infos] == [1, 2, 3]  # the refused append reserved no seq
    assert [bytes(read_record(seg, int(i["slot"]))[2]) for i in infos] == [b"1", b"2", b"4"]
    ring.close()


HOLDER = r"""
import fcntl, os, sys, time
fd = os.open(os.path.join(sys.argv[1], "q.lock"), os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""
