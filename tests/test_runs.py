"""Jobs built in one call (ringq/engine/runs.py, csrc/ext/jobs.c): those a lease took in C, and
the snapshots an ``enqueue_many`` returns.

Invariant: a job built there is the job the general path describes -- every field equal to
``Queue.get``'s snapshot of the same job, its payload the one enqueued -- whatever its id, key,
priority, attempts, expiry, timeout or payload; a record that does not fit its mapping is refused
with ValueError, never read past.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringq import Queue
from ringq.engine.records import CLAIMED
from ringq.engine.runs import build, envelope_key
from ringq.errors import SerializationError

PAYLOADS = [
    {"n": 1, "text": "é"},
    b"\x00\xffbytes",
    np.arange(6, dtype=np.int32).reshape(2, 3),
    [1, 2.5, None],
    "x" * 300,
]


def _same(job, snap) -> None:
    for f in dataclasses.fields(job):
        if f.name in ("payload", "_raw", "cancelled"):
            continue
        assert getattr(job, f.name) == getattr(snap, f.name), f.name
    if isinstance(snap.payload, np.ndarray):
        assert np.array_equal(job.payload, snap.payload)
    else:
        assert job.payload == snap.payload


def test_jobs_built_in_one_call_equal_the_general_paths_snapshots(tmp_path):
    q = Queue(tmp_path / "q", durability="none")
    sent = {}
    for i in range(60):
        kw = {"priority": i % 3 - 1, "max_attempts": 1 + i % 7}
        if i % 4 == 0:
            kw["job_id"] = f"job-{i}-ü"
        if i % 5 == 0:
            kw["key"] = f"tenant-{i % 3}"
        job = q.enqueue(PAYLOADS[i % len(PAYLOADS)], **kw)
        sent[job.id] = PAYLOADS[i % len(PAYLOADS)]
    got = q.lease(100, visibility_timeout=123.5)
    assert len(got) == 60
    for job in got:
        snap = q.get(job.id)
        _same(job, snap)
        assert job.attempts == 1 and job.lease_token == "1" and job.version == 1
        assert job.key == (None if snap.key is None else snap.key)
        if isinstance(sent[job.id], np.ndarray):
            assert np.array_equal(job.payload, sent[job.id])
        else:
            assert job.payload == sent[job.id]
        q.ack(job)
    q.close()


def test_a_job_leased_while_its_consumer_slept_is_built_alike(tmp_path):
    q = Queue(tmp_path / "q", durability="none")
    out: list = []
    sleepers = [
        threading.Thread(target=lambda: out.append(q.lease_one(wait=10))) for _ in range(3)
    ]
    for t in sleepers:
        t.start()
    for i in range(3):
        q.enqueue({"i": i}, key="k" if i else None, job_id=f"slept-{i}")
    for t in sleepers:
        t.join(15)
    assert sorted(j.id for j in out) == ["slept-0", "slept-1", "slept-2"]
    for job in out:
        _same(job, q.get(job.id))
        q.ack(job)
    q.close()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"job_ids": [f"id-{i}-ß" for i in range(40)]},
        {"key": "tenant", "priority": -3, "max_attempts": 9},
        {"expires_in": 3600, "timeout": 2.5, "delay": 30},
    ],
    ids=["auto-ids", "ids", "keyed", "meta"],
)
def test_the_snapshots_enqueue_many_returns_equal_the_general_paths(tmp_path, kw):
    q = Queue(tmp_path / "q", durability="none", slot_count=32)  # 40 jobs: two segments
    payloads = [PAYLOADS[i % len(PAYLOADS)] for i in range(40)]
    jobs = q.enqueue_many(payloads, **kw)
    assert len({j.record_position[0] for j in jobs}) == 2
    for job, sent in zip(jobs, payloads):
        _same(job, q.get(job.id))
        if isinstance(sent, np.ndarray):
            assert np.array_equal(job.payload, sent)
        else:
            assert job.payload == sent
    q.close()


def test_a_run_that_does_not_fit_its_mapping_is_refused():
    mm = bytes(4096)
    one = CLAIMED.pack(1 << 24, 1, 0, 0, 3, 10, 0, 5, 0, 1, 0, 0, 0)
    args = (mm, 64, 256, 0, 1, 0, 5, envelope_key, None, None, None)
    assert len(build(one, *args)) == 1
    with pytest.raises(ValueError, match="whole number"):
        build(one[:-1], *args)
    past = CLAIMED.pack(1 << 24, 1, 0, 0, 15, 200, 0, 5, 0, 1, 0, 0, 0)  # 64+15*256+200 > 4096
    with pytest.raises(ValueError, match="runs past"):
        build(past, *args)
    huge = CLAIMED.pack(1 << 24, 1, 0, 0, 2**32 - 1, 10, 0, 5, 0, 1, 0, 0, 0)
    with pytest.raises(ValueError, match="runs past"):
        build(huge, *args)


def test_a_key_that_does_not_read_leaves_the_job_out_and_marks_it():
    bad_key = b"\x02\x00k\x00\x01" + b"1"  # a NUL in the key: no enqueue writes it
    good_key = b"\x01\x00k\x01" + b"1"
    mm = bytearray(4096)
    mm[64 : 64 + len(bad_key)] = bad_key
    mm[64 + 256 : 64 + 256 + len(good_key)] = good_key
    run = CLAIMED.pack(1 << 24, 1, 0, 0, 0, len(bad_key), 0, 5, 0, 5, 0, 0, 0)
    run += CLAIMED.pack(1 << 24, 2, 0, 0, 1, len(good_key), 0, 5, 0, 5, 0, 0, 0)
    marked = []
    held: dict = {}
    jobs = build(run, mm, 64, 256, 0, 7, 0, 5, envelope_key, held, lambda *a: marked.append(a), "seg")
    assert [j.key for j in jobs] == ["k"] and held == {(7, 1): 1}
    assert marked == [("seg", 0, "stored job key holds a NUL")]

    def other(raw):
        raise KeyError("not a SerializationError")

    with pytest.raises(KeyError):
        build(run, mm, 64, 256, 0, 7, 0, 5, other, None, lambda *a: None, "seg")
    with pytest.raises(SerializationError):
        envelope_key(bad_key)


def test_fresh_refuses_placements_of_jobs_it_was_not_given():
    from ringq.engine.runs import fresh

    shown = (None, None, None, None, None)
    [job] = fresh([(1, 0, 1)], [7], 5, 0, 0, ["p"], None, 0, 3, None, shown, 0)
    assert (job.id, job.seq, job.record_position, job.payload) == ("0000000000000005", 5, (1, 7, 0), "p")
    for placed, heads, ids in [
        ([(1, 0, 2)], [7], None),  # two jobs, one head
        ([(1, 1, 1)], [7, 8], None),  # job 1 of one payload
        ([(1, 0, 1)], [7], []),  # an id list shorter than the jobs
        ([(1, -1, 1)], [7], None),
    ]:
        with pytest.raises(ValueError, match="not given"):
            fresh(placed, heads, 5, 0, 0, ["p"], ids, 0, 3, None, shown, 0)


def test_an_acks_first_try_in_one_call_and_what_it_leaves_to_the_general_path(tmp_path):
    import dataclasses

    from ringq import JobNotFoundError, NotLeasedError

    q = Queue(tmp_path / "q", durability="none")
    other = Queue(tmp_path / "other", durability="none")
    q.enqueue_many(list(range(6)))
    other.enqueue("theirs")
    a, b, c, d, e = q.lease(5)
    q.ack(a)  # the first try
    assert a.ack_accepted and q.get(a.id).state.value == "done"
    q.ack(a)  # again: harmless (the helper answers REPEATED; the general path agrees)
    q.ack(dataclasses.replace(b, lease_token="01"))  # not a token the first try takes: the general path acks it
    assert q.get(b.id).state.value == "done"
    with pytest.raises(NotLeasedError):
        q.ack(dataclasses.replace(c, lease_token="2"))  # a later lease's token: refused
    with pytest.raises(NotLeasedError, match="another queue"):
        q.ack(other.lease_one())  # another queue's snapshot
    q.ack(d.id)  # a bare id: the general path
    moved = dataclasses.replace(e, record_position=(e.record_position[0], 5, 0))  # slot 5: job 6's
    with pytest.raises((NotLeasedError, JobNotFoundError)):
        q.ack(moved)
    for origin in (2**63, 2**70, -(2**70)):  # a forged origin past a C long: another queue's
        with pytest.raises(NotLeasedError, match="another queue"):
            q.ack(dataclasses.replace(e, record_position=(*e.record_position[:2], origin)))
    for token in ("²", "①", "١"):  # digits to str.isdigit(), never issued as a token
        with pytest.raises(NotLeasedError, match="never issued"):
            q.ack(dataclasses.replace(e, lease_token=token))
    q.ack(e)
    q.ack(c)
    assert q.stats().done == 5 and q.stats().ready == 1
    q.close()
    other.close()


# Texts where orjson, json's scanner and json.loads could part ways: whitespace around the value,
# NaN and infinities (json only), integers beyond 64 bits, lone surrogates (json's surrogatepass
# only), a byte-order mark, text that is not UTF-8, two values, nothing at all.
RAW_TEXTS = [
    b'{"t": 1, "x": [1.5, "\\u00e9", null, true]}',
    b" 1",
    b"1 ",
    b"\n[1]\n",
    b"NaN",
    b"[Infinity, -Infinity]",
    b"12345678901234567890123",
    b"-1234567890123456789",
    b"123456789012345678",
    b'"\\ud800"',
    b'"\xed\xa0\x80"',
    b'\xef\xbb\xbf{"a": 1}',
    b"\xff\xfe1\x00",
    b"1 2",
    b"",
    b"{",
    b'"\x01"',
    b"1\x00",
    b"1.0e400",
    b'{"a": 1, "a": 2}',
]


def _undecoded(codec_id: int, data: bytes):
    from ringq.job import UNDECODED, Job

    return Job(id="j", payload=UNDECODED, _raw=(codec_id, data))


def _decoded_or_error(call):
    try:
        return "value", call()
    except SerializationError as exc:
        return "error", str(exc)


@pytest.mark.parametrize("data", RAW_TEXTS)
def test_the_compiled_payload_getter_decodes_a_json_text_as_the_codec_does(data):
    from ringq.codec import JSON, decode

    job = _undecoded(JSON, data)
    kind, got = _decoded_or_error(lambda: job.payload)
    want_kind, want = _decoded_or_error(lambda: decode(JSON, data))
    assert (kind, repr(got)) == (want_kind, repr(want))
    if kind == "value":
        assert job._raw is None and job.payload is got  # decoded once, kept
    else:
        assert job._raw == (JSON, data)  # left undecoded: raised again on the next access
        assert _decoded_or_error(lambda: job.payload) == (kind, got)


def test_the_compiled_payload_getter_leaves_other_codecs_and_set_payloads_to_the_job():
    from ringq.codec import BYTES, KEYED, encode, wrap_key

    job = _undecoded(BYTES, b"\x00raw")
    assert job.payload == b"\x00raw"
    kid, kdata = wrap_key("tenant", *encode({"k": 1}))
    assert _undecoded(kid, kdata).payload == {"k": 1} and kid == KEYED
    job.payload = [1]
    assert job.payload == [1] and dataclasses.replace(job, priority=2).payload == [1]
    with pytest.raises(AttributeError):
        del job.payload
        job.payload  # noqa: B018 - the slot is empty after a delete




JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(JSON_VALUES)
@settings(max_examples=300, deadline=None)
def test_the_compiled_payload_getter_gives_any_json_payload_back_as_the_codec_does(value):
    from ringq.codec import JSON, decode, encode

    codec_id, data = encode(value)
    assert codec_id == JSON
    assert repr(_undecoded(JSON, data).payload) == repr(decode(JSON, data))


def test_the_compiled_payload_getter_without_orjson_decodes_as_the_codec_does():
    # Without orjson installed, the descriptor parses every JSON text with json's scanner: the
    # payload tests above again, in a process where orjson cannot be imported.
    import os
    import subprocess
    import sys

    from procs import child_env

    code = (
        "import sys; sys.modules['orjson'] = None\n"
        "import pytest, ringq.codec\n"
        "assert ringq.codec.json_decoders()[0] is None\n"
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', 'payload_getter and not orjson', sys.argv[1]]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, os.path.abspath(__file__)],
        capture_output=True, text=True, timeout=300, env=child_env(),
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-2000:]
