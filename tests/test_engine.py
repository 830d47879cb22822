"""The engine: append/scan round trips, spanning records, rotation, retirement, reopen."""

import os

import numpy as np
import pytest

from ringq import BackoffPolicy, Queue, RecordTooLargeError
from ringq.codec import JSON
from ringq.engine.records import NewRecord, read_record, scan
from ringq.engine.ring import Ring
from ringq.engine.segment import Segment, segment_name
from ringq.engine.words import ST_DONE, ST_READY


def recs(n, size=10):
    return [NewRecord(f"{i:0{size}d}".encode(), JSON) for i in range(n)]


def all_records(ring):
    out = []
    for seg in ring.segs.ordered():
        infos, nxt = scan(seg, 0)
        assert (infos["status"] == 0).all()
        for row in infos:
            _, _, payload = read_record(seg, int(row["slot"]))
            out.append((int(row["seq"]), payload))
    return out


def test_append_scan_round_trip_across_rotation(qdir):
    ring = Ring(qdir, "e", slot_size=64, slot_count=16)
    placed = ring.append(recs(100))
    assert [p[2] for p in placed] == list(range(1, 101))
    assert len({p[0] for p in placed}) >= 6  # 100 records of 1 slot in 16-slot segments
    got = all_records(ring)
    assert [s for s, _ in got] == list(range(1, 101))
    assert [p for _, p in got] == [f"{i:010d}".encode() for i in range(100)]
    segs = ring.segs.ordered()
    assert all(s.sealed() for s in segs[:-1]) and not segs[-1].sealed()
    ring.close()


def test_record_spanning_slots(qdir):
    ring = Ring(qdir, "e", slot_size=128, slot_count=32)
    big = NewRecord(bytes(range(256)) * 3, JSON)  # 64 + 768 bytes = 7 slots of 128
    placed = ring.append([NewRecord(b"1", JSON), big, NewRecord(b"2", JSON)])
    assert [p[1] for p in placed] == [0, 1, 8]
    seg = ring.segs.ordered()[0]
    infos, nxt = scan(seg, 0)
    assert list(infos["span"]) == [1, 7, 1] and nxt == 9
    assert read_record(seg, 1)[2] == bytes(range(256)) * 3
    # continuation slots are marked CONT, never READY
    assert ((seg.states[2:8, 0] & 7) == 6).all()
    ring.close()


def test_batch_that_needs_rotation_rotates_mid_batch(qdir):
    ring = Ring(qdir, "e", slot_size=128, slot_count=8)
    placed = ring.append(recs(5))
    placed += ring.append([NewRecord(bytes(500), JSON)] * 3)  # 5 slots each: one per segment
    assert [p[0] for p in placed] == [1] * 5 + [2, 3, 4]
    ring.close()


def test_record_too_large_names_the_limit(qdir):
    ring = Ring(qdir, "e", slot_size=64, slot_count=4)
    with pytest.raises(RecordTooLargeError, match="256 bytes"):
        ring.append([NewRecord(bytes(193), JSON)])
    ring.append([NewRecord(bytes(192), JSON)])  # exactly the limit: 64 + 192 = 256
    ring.close()


def test_reopen_sees_exactly_the_published_records(qdir):
    ring = Ring(qdir, "e", slot_size=64, slot_count=16)
    ring.append(recs(40))
    before = all_records(ring)
    ring.close()
    ring = Ring(qdir, "e")
    assert all_records(ring) == before
    assert ring.report.clean
    ring.append(recs(1))
    assert [s for s, _ in all_records(ring)][-1] == 41
    ring.close()


def test_retirement_deletes_only_fully_finished_segments(qdir):
    q = Queue(qdir, "r", slot_size=128, slot_count=8)
    q.enqueue_many(list(range(30)))  # segments 1..4, tail = 4
    names = lambda: sorted(f for f in os.listdir(qdir) if f.endswith(".seg"))  # noqa: E731
    assert len(names()) == 4
    jobs = q.lease(9)  # all of segment 1 and one job of segment 2
    for j in jobs[:7]:
        q.ack(j)
    assert len(names()) == 4  # segment 1 still has a leased job
    q.ack(jobs[7])
    assert names() == ["r.0000000000000002.seg", "r.0000000000000003.seg", "r.0000000000000004.seg"]
    q.ack(jobs[8])
    assert len(names()) == 3  # segment 2 has 7 more jobs
    rest = q.lease(100)
    for j in rest:
        q.ack(j)
    assert names() == ["r.0000000000000004.seg"]  # the tail segment is never retired
    assert q.stats().done == 6
    q.close()


def test_delayed_and_dead_jobs_do_not_pin_their_segment(qdir):
    q = Queue(qdir, "r", slot_size=128, slot_count=4, max_attempts=1)
    q.enqueue("later", delay=3600)
    q.enqueue_many(["a", "b", "c", "d", "e"])
    j = q.lease_one()
    assert j.payload == "a"
    q.nack(j, error="x")  # max_attempts=1: dead
    for job in q.lease(10):
        q.ack(job)
    segs = sorted(f for f in os.listdir(qdir) if f.endswith(".seg"))
    # segment 1 kept only the delayed and the dead job: they moved to the tail and it retired
    assert "r.0000000000000001.seg" not in segs
    assert q.stats().delayed == 1 and q.stats().dead == 1
    assert [j.payload for j in q.dlq()] == ["a"] and q.dlq()[0].last_error == "x"
    q.close()


def test_two_names_share_a_directory_independently(qdir):
    a, b = Queue(qdir, "a"), Queue(qdir, "b")
    a.enqueue("for a")
    b.enqueue_many(["for b"] * 3)
    assert a.stats().total == 1 and b.stats().total == 3
    assert a.lease_one().payload == "for a"
    assert a.lease_one() is None
    a.close(), b.close()


def test_state_table_is_vectorisable(qdir):
    q = Queue(qdir, "v", slot_count=1024)
    q.enqueue_many(list(range(500)))
    seg = Segment(os.path.join(qdir, segment_name("v", q.introspect()["tail_segment"])), readonly=True)
    st = seg.states[:500, 0] & np.uint64(7)
    assert (st == ST_READY).all()
    for j in q.lease(10):
        q.ack(j)
    assert int(((seg.states[:, 0] & np.uint64(7)) == ST_DONE).sum()) == 10
    assert seg.tail() == 500
    seg.close()
    q.close()


def test_straggler_relocation_keeps_attempts_error_and_time(qdir):
    q = Queue(qdir, "s", slot_size=128, slot_count=8, backoff=BackoffPolicy(base=3600, jitter=0))
    q.enqueue("retry-me")
    q.enqueue_many(list(range(7)))  # segment 1 is full
    job = q.lease_one()
    back = q.nack(job, error="boom")  # READY again in an hour: a straggler
    for j in q.lease(7):
        q.ack(j)
    q.enqueue("next")  # seals segment 1: its only live job is the straggler
    q.lease_one()  # (any reader notices the sealing)
    segs = sorted(f for f in os.listdir(qdir) if f.endswith(".seg"))
    assert "s.0000000000000001.seg" not in segs  # retired once the straggler moved
    moved = q.get(job.id)
    assert moved.payload == "retry-me" and moved.attempts == 1 and moved.last_error == "boom"
    assert moved.available_at == back.available_at and moved.state.value == "ready"
    assert moved.seq != job.seq and moved.id == job.id
    q.close()


def test_every_state_word_cas_consults_the_transition_table(qdir):
    from ringq.engine.segment import Segment
    from ringq.engine.transitions import TRANSITIONS, StateTransitionError
    from ringq.engine.words import ST_DONE, ST_GONE, ST_READY, pack

    with Queue(qdir, "t") as q:
        job = q.enqueue("x")
        q.ack(q.lease_one())
        seg = Segment(os.path.join(qdir, segment_name("t", job.record_position[0])))
        done = seg.load_state(job.record_position[1])
        assert done & 7 == ST_DONE
        assert (ST_DONE, ST_READY) not in TRANSITIONS
        with pytest.raises(StateTransitionError):
            seg.cas_state(job.record_position[1], done, pack(ST_READY, 0, 1, 0))  # an acked job never comes back
        assert seg.load_state(job.record_position[1]) == done  # refused before the CAS
        assert (ST_DONE, ST_GONE) in TRANSITIONS
        assert q.purge() == 1  # purging a finished job is a transition of the table
        seg.close()


def test_keys_read_in_bulk_are_the_keys_read_one_by_one(qdir):
    # A reader reads the keys of many KEYED records at once (lifecycle.keys_of_plain); it must
    # give every record the key -- or None, for a malformed envelope -- that key_of gives it.
    import random

    from ringq import codec
    from ringq.engine.lifecycle import key_of, keys_of_plain

    rng = random.Random(7)
    good = ["k", "a" * 128, "é" * 64, "tenant-1371838", "tenant-2000402", "a\x01", "a\x01\x02"]
    good += [f"key-{rng.randrange(50)}" for _ in range(60)]
    envelopes = [codec.wrap_key(k, codec.JSON, b"1")[1] for k in good]
    envelopes += [
        b"",  # shorter than any envelope
        b"\x01\x00",  # no room for the inner codec byte
        b"\x00\x00\x01",  # a key of length 0
        b"\x81\x00" + b"x" * 129 + b"\x01",  # 129 bytes: longer than a key may be
        b"\x05\x00abc\x01",  # longer than the payload
        b"\x02\x00\xff\xfe\x01",  # not UTF-8
        b"\x01\x00k" + bytes((codec.KEYED,)) + b"\x01\x00j\x01",  # a key in a key
        b"\x02\x00k\x00\x01",  # a key with a NUL in it (no enqueue writes one)
        b"\x01\x00k",  # nothing after the key
    ]
    rng.shuffle(envelopes)
    ring = Ring(qdir, "e", slot_size=128, slot_count=256)
    ring.append(
        [
            NewRecord(e, codec.KEYED, id_bytes=b"id%d" % i if i % 3 == 0 else b"")
            for i, e in enumerate(envelopes)
        ]
    )
    for seg in ring.segs.ordered():
        infos, _ = scan(seg, 0)
        keys, which = keys_of_plain(seg, infos["slot"], infos["id_len"], infos["payload_len"])
        bulk = [keys[i] for i in which]
        assert bulk == [key_of(seg, int(s)) for s in infos["slot"]]
        assert bulk.count(None) == 9 and "a" * 128 in bulk and "k\x00" not in bulk
    ring.close()


def test_a_reader_that_reads_keyed_jobs_in_bulk_leases_them_in_the_order_of_one_that_read_each(
    tmp_path,
):
    # Two ways into a reader's lanes (a batch of records at once, or a few as they come):
    # the same jobs must lease in the same fair order either way.
    import random

    rng = random.Random(3)
    jobs = [
        (i, f"key-{rng.randrange(7)}" if i % 5 else None, rng.choice([-3, 0, 0, 2]))
        for i in range(150)
    ]
    # Some with an expiry prefix or a metadata block before their key, as records of other kinds.
    extra = [{}, {}, {"expires_in": 3600}, {"timeout": 30}]
    orders = []
    for name in ("bulk", "few"):
        q = Queue(tmp_path / name)
        if name == "few":
            assert q.lease_one() is None  # its reader is open: it reads each job as it comes
        for i, key, prio in jobs:
            q.enqueue(i, key=key, priority=prio, **extra[i % len(extra)])
            if name == "few":
                assert q.stats().ready == i + 1  # read in before the next enqueue
        reader = Queue(tmp_path / name) if name == "bulk" else q  # reads all 150 at once
        orders.append([j.payload for j in reader.lease(200)])
        reader.close()
        q.close()
    assert len(orders[0]) == 150 and orders[0] == orders[1]
