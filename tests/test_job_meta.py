"""Per-job metadata in the record (kind 3, ringq/engine/meta.py; docs/format.md "Metadata block"):
round trips on both backends, plain records unchanged, and readers' refusals of what they cannot
read (an unknown required entry, a newer block version), while unknown optional entries are skipped."""

from __future__ import annotations

import os
import struct

import pytest

from ringq import CorruptionError, Queue
from ringq.codec import IN_META, JSON, KEYED, encode
from ringq.engine import meta
from ringq.engine.records import NewRecord
from ringq.engine.ring import Ring
from ringq.engine.verify import examine
from ringq.job import JobState

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def header_bytes(qdir: str, name: str = "default", slot: int = 0) -> tuple[int, int]:
    """(codec byte, kind byte) of the record at ``slot`` of the queue's first segment, read from the file."""
    seg = sorted(f for f in os.listdir(qdir) if f.startswith(name + ".") and f.endswith(".seg"))[0]
    with open(os.path.join(qdir, seg), "rb") as fh:
        fh.seek(4096 + slot * 256 + 50)
        codec_id, kind = fh.read(2)
    return codec_id, kind


def test_plain_and_expiring_records_keep_their_kinds(qdir):
    with Queue(qdir) as q:
        q.enqueue({"plain": 1})
        q.enqueue({"exp": 1}, expires_in=60)
        q.enqueue({"both": 1}, expires_in=60, timeout=3)
    assert header_bytes(qdir, slot=0) == (JSON, 1)
    assert header_bytes(qdir, slot=1) == (JSON, 2)
    assert header_bytes(qdir, slot=2) == (IN_META, 3)
    rep = examine(qdir, "default")
    assert not rep.damaged


def test_timeout_expiry_and_key_round_trip_through_every_read(qdir):
    with Queue(qdir) as q:
        job = q.enqueue(b"\x00raw", key="tenant-1", timeout=2.5, expires_in=600)
        assert (job.timeout, job.key) == (2.5, "tenant-1") and job.expires_at is not None
        many = q.enqueue_many([{"a": 1}, [2]], timeout=0.001, job_ids=["m-1", "m-2"])
        assert [j.timeout for j in many] == [0.001, 0.001]
        got = q.get(job.id)
        assert (got.payload, got.timeout, got.key, got.expires_at) == (
            b"\x00raw",
            2.5,
            "tenant-1",
            job.expires_at,
        )
        leased = q.lease(3)
        assert {j.id: j.timeout for j in leased} == {job.id: 2.5, "m-1": 0.001, "m-2": 0.001}
        assert [j.payload for j in leased] == [b"\x00raw", {"a": 1}, [2]]
        # The key is read from the bytes behind the block (limits, per-key pause).
        q.pause("tenant-1")
        assert {j.key for j in q.list_jobs()} == {"tenant-1", None}
        # A retry keeps it: the record is immutable.
        q.nack(leased[0], error="boom", delay=0)
        q.resume("tenant-1")
        again = q.lease_one(wait=1)
        assert again.id == job.id and again.timeout == 2.5 and again.attempts == 2
        assert q.get(job.id).to_dict()["timeout"] == 2.5
    assert not examine(qdir, "default").damaged


def test_a_dead_job_requeued_keeps_its_block(qdir):
    with Queue(qdir, max_attempts=1) as q:
        job = q.enqueue({"x": 1}, timeout=7)
        q.nack(q.lease_one(), error="no")
        assert q.get(job.id).state is JobState.DEAD
        assert q.requeue_dead(job.id) == 1
        assert q.get(job.id).timeout == 7
        assert q.lease_one().timeout == 7


def test_import_carries_timeout_and_trace_context(qdir, tmp_path):
    with Queue(qdir) as q:
        job = q.enqueue({"x": 1}, timeout=4)
        snap = q.get(job.id)
    snap.trace_context = {"traceparent": TP, "tracestate": "vendor=1"}
    with Queue(str(tmp_path / "other")) as dst:
        assert dst.import_jobs([snap], source="src") == 1
        (copied,) = dst.list_jobs()
        assert copied.timeout == 4 and copied.trace_context == snap.trace_context


def test_timeout_is_validated(qdir):
    with Queue(qdir) as q:
        for bad in (0, -1, float("nan"), float("inf"), True, "3", 5e6):
            with pytest.raises(ValueError):
                q.enqueue(1, timeout=bad)
        assert len(q) == 0


# -- readers refuse what they must not ignore ---------------------------------------------------


def crafted(entries: bytes, version: int = 1, inner: int = JSON) -> bytes:
    data = encode({"ok": True})[1]
    return struct.pack("<BBH", version, inner, 4 + len(entries)) + entries + data


def append_raw(qdir: str, payload: bytes, codec_id: int = IN_META) -> None:
    ring = Ring(qdir, "default")
    try:
        ring.append([NewRecord(payload, codec_id, kind=meta.KIND_META)])
    finally:
        ring.close()


def test_unknown_optional_entry_is_skipped(qdir):
    append_raw(
        qdir, crafted(struct.pack("<BH", 0x7E, 3) + b"abc" + struct.pack("<BHI", 0x02, 4, 1500))
    )
    with Queue(qdir) as q:
        job = q.lease_one()
        assert job.payload == {"ok": True} and job.timeout == 1.5
    assert not examine(qdir, "default").damaged


@pytest.mark.parametrize(
    "payload, why",
    [
        (crafted(struct.pack("<BH", 0xC0, 1) + b"z"), "required entry 0xc0 is unknown"),
        (crafted(b"", version=2), "version 2 is unknown"),
        (crafted(struct.pack("<BH", 0x02, 2) + b"\x01\x00"), "invalid value"),
        (crafted(struct.pack("<BHI", 0x02, 4, 5) * 2), "appears twice"),
        (crafted(struct.pack("<BH", 0x03, 9)), "runs past the block"),
        (crafted(b"", inner=IN_META), "names payload codec 6"),
    ],
)
def test_unreadable_block_is_refused_never_delivered(qdir, payload, why):
    append_raw(qdir, payload)
    with Queue(qdir) as q:
        assert q.lease_one() is None  # refused: marked BAD and reported
        assert q.stats().corrupt == 1
        assert any(why in reason for _p, _s, reason in q.recovery.corrupt_records)
    rep = examine(qdir, "default")
    assert any(why in d for d in rep.damaged), rep.damaged


def test_split_and_body_agree_with_wrap():
    for m in (
        meta.Meta(timeout_ms=9),
        meta.Meta(expires_ms=123, timeout_ms=1, traceparent=TP, tracestate="a=b"),
        meta.Meta(traceparent=TP),
    ):
        codec_id, payload, kind = meta.wrap(KEYED, b"\x01\x00k\x01[1]", m)
        assert (codec_id, kind) == (IN_META, 3)
        inner, start, n = meta.body(kind, codec_id, payload, 0, len(payload))
        assert (inner, payload[start : start + n]) == (KEYED, b"\x01\x00k\x01[1]")
        assert meta.peek(kind, payload, 0, len(payload)) == m
        assert meta.split(kind, codec_id, bytearray(payload)) == (
            KEYED,
            bytearray(b"\x01\x00k\x01[1]"),
            m,
        )
    with pytest.raises(CorruptionError):
        meta.split(9, JSON, bytearray(b"[]"))  # an unknown record kind


def test_malformed_trace_context_is_dropped_not_stored():
    assert meta.of(None, None, {"traceparent": "not-a-traceparent"}) is None
    assert meta.of(None, None, {"traceparent": "ff" + TP[2:]}) is None
    m = meta.of(None, None, {"traceparent": TP, "tracestate": "\n"})
    assert m == meta.Meta(traceparent=TP)


def test_redis_stores_the_same_fields(redis_url):
    from ringq.redis.queue import RedisQueue

    with RedisQueue(redis_url, "meta") as q:
        q.purge()
        job = q.enqueue({"x": 1}, timeout=2.5)
        assert job.timeout == 2.5
        assert q.get(job.id).timeout == 2.5
        leased = q.lease_one()
        assert leased.timeout == 2.5 and leased.trace_context is None
        snap = q.get(job.id)
        snap.trace_context = {"traceparent": TP}
        with RedisQueue(redis_url, "meta2") as dst:
            dst.purge()
            snap.state = JobState.READY
            assert dst.import_jobs([snap], source="src") == 1
            (got,) = dst.list_jobs()
            assert got.timeout == 2.5 and got.trace_context == {"traceparent": TP}
