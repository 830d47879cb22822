"""The express enqueue: ``enqueue(dict)`` with no other argument is encoded, appended and returned
in one C call (csrc/ext/jobs.c express, Appender.express), then synced as the strategy says.  It must
give the job the general path gives, write nothing when it hands a payload to the general path,
and stay one job per record across threads, processes and rotations."""

from __future__ import annotations

import contextlib
import enum
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procs import spawn

import ringq.engine.runs as runs
from ringq import JobState, Queue
from ringq.codec import JSON, MAX_DEPTH, encode
from ringq.engine.records import read_record, scan
from ringq.engine.ring import Ring
from ringq.errors import QueueClosedError, RecordTooLargeError, SerializationError

# Fields that differ between two enqueues of the same payload.
_OWN = ("id", "seq", "enqueued_at", "available_at", "record_position")


@contextlib.contextmanager
def counted() -> Iterator[list[Any]]:
    """The answers runs.express gave while the block ran (the real function runs)."""
    real, answers = runs.express, []

    def spy(*a: Any) -> Any:
        got = real(*a)
        answers.append(got)
        return got

    runs.express = spy
    try:
        yield answers
    finally:
        runs.express = real


def _fields(job: Any) -> dict[str, Any]:
    return {k: v for k, v in job.to_dict().items() if k not in _OWN}


def _nested(depth: int) -> Any:
    v: Any = 0
    for _ in range(depth):
        v = [v]
    return v


PLAIN = [
    {},
    {"t": 1, "pad": "x" * 40},
    {"a": [1, 2.5, None, True, False, "é", "\u2028", {"b": []}], "c": -(2**70)},
    {"deep": [[[[[[[[[[1]]]]]]]]]]},
    {"text": "line\nbreak \"quoted\" \\ back"},
    {"big": ["é" * 100 for _ in range(100)], "n": 1e16},  # far longer than 512 characters
    {"n": _nested(MAX_DEPTH - 1)},  # as deep as the codec stores: the dict and its lists
]


@pytest.mark.parametrize("payload", PLAIN)
def test_a_plain_dict_takes_the_express_path_and_gives_the_general_paths_job(tmp_path, payload):
    with Queue(tmp_path, durability="none") as q:
        q.enqueue({"first": "append"})  # the first append of a process goes the general way
        with counted() as answers:
            fast = q.enqueue(payload)
        assert len(answers) == 1 and answers[0] is fast  # taken, not handed on
        general = q.enqueue(payload, max_attempts=q.max_attempts)  # an argument: the general way
        assert _fields(fast) == _fields(general)
        assert fast.payload is payload  # the stored value is the caller's, as the general path's
        assert fast.state is JobState.READY and fast.seq == general.seq - 1
        back = q.get(fast.id)
        assert back is not None and back.to_dict() == fast.to_dict()
        leased = q.lease(3)
        assert [j.payload for j in leased] == [{"first": "append"}, payload, payload]
        assert [j.id for j in leased][1] == fast.id


def _circular() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


class Colour(enum.IntEnum):
    RED = 1


class Text(str):
    pass


@pytest.mark.parametrize(
    "payload, stored",
    [
        ({1: "a"}, {"1": "a"}),  # a key that is not a str
        ({"t": (1, 2)}, {"t": [1, 2]}),  # a tuple
        ({"c": Colour.RED}, {"c": 1}),  # an int subclass
        ({"s": Text("x")}, {"s": "x"}),  # a str subclass
        ({"b": b"\x00\xff"}, {"b": b"\x00\xff"}),  # bytes: the mixed codec
    ],
)
def test_what_express_does_not_take_goes_the_general_way_unchanged(tmp_path, payload, stored):
    with Queue(tmp_path, durability="none") as q:
        q.enqueue({"first": "append"})
        with counted() as answers:
            job = q.enqueue(payload)
        assert answers == [0]  # handed on, nothing written
        want = payload if stored is None else stored
        assert q.get(job.id).payload == want
        assert q.stats().ready == 2


@pytest.mark.parametrize(
    "payload, error",
    [
        ({"x": math.nan}, SerializationError),
        ({"x": math.inf}, SerializationError),
        ({"x": "\ud800"}, SerializationError),  # a lone surrogate
        ({"x": "y" * 70_000}, RecordTooLargeError),
        (_circular(), SerializationError),
        ({"n": _nested(MAX_DEPTH)}, SerializationError),  # one level deeper than the codec stores
        ({"x": 10**5000}, SerializationError),  # more digits than int's str() allows
        ({"\udfff": 1}, SerializationError),  # a lone surrogate in a key
    ],
)
def test_a_payload_express_cannot_store_raises_as_before_and_writes_nothing(tmp_path, payload, error):
    with Queue(tmp_path, durability="none", slot_size=1024, slot_count=16) as q:
        q.enqueue({"first": "append"})
        with counted() as answers, pytest.raises(error):
            q.enqueue(payload)
        assert answers == [0]
        st = q.stats()
        assert (st.total, st.enqueued_total) == (1, 1)
        assert q.enqueue({"after": 1}).seq == 2  # no seq was taken


# Every kind of value express writes itself, and the ones it hands on: control characters and
# lone surrogates, ints beyond 64 bits, NaN, the infinities and -0.0, nesting.
_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)
_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(),
    _TEXT,
)
_VALUE = st.recursive(
    _SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=16
)


def _stored_bytes(path: Any) -> dict[int, bytes]:
    """seq -> payload bytes of every record of the queue at ``path`` (closed), read from its
    segments."""
    ring = Ring(str(path), "default")
    try:
        out = {}
        for seg in ring.segs.ordered():
            infos, _next = scan(seg, 0)
            for row in infos:
                out[int(row["seq"])] = bytes(read_record(seg, int(row["slot"]))[2])
        return out
    finally:
        ring.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(st.dictionaries(_TEXT, _VALUE, max_size=6), min_size=1, max_size=8))
def test_express_writes_the_bytes_the_codec_writes(tmp_path_factory, payloads):
    path = tmp_path_factory.mktemp("express-bytes")
    taken = {}
    with Queue(path, durability="none") as q:
        q.enqueue({"first": "append"})
        for payload in payloads:
            with counted() as answers:
                try:
                    job = q.enqueue(payload)
                except SerializationError:
                    assert answers == [0]  # refused by the general way, handed on by express
                    continue
            if answers == [job]:
                taken[job.seq] = payload
            else:
                assert answers == [0]
    stored = _stored_bytes(path)
    for seq, payload in taken.items():
        assert encode(payload) == (JSON, stored[seq])


def test_express_fills_segments_and_rotates_through_the_general_way(tmp_path):
    with Queue(tmp_path, durability="none", slot_size=256, slot_count=8) as q:
        with counted() as answers:
            jobs = [q.enqueue({"i": i, "pad": "p" * (i % 300)}) for i in range(200)]
        assert sum(1 for a in answers if a.__class__ is not int) > 100  # most went express
        assert [j.seq for j in jobs] == list(range(1, 201))
        got = []
        while len(got) < 200:
            batch = q.lease(50)
            assert batch
            got += batch
            q.ack_many(batch)
        assert [j.payload["i"] for j in got] == list(range(200))
        assert [j.id for j in got] == [j.id for j in jobs]


@pytest.mark.parametrize("durability", ["msync", "fdatasync", "group", "interval"])
def test_every_strategy_takes_the_express_path_and_syncs_as_before(tmp_path, durability):
    with Queue(tmp_path, durability=durability) as q:
        q.enqueue({"first": "append"})
        before = q.sync_counters()["queue_append_syncs"]
        with counted() as answers:
            jobs = [q.enqueue({"a": i}) for i in range(3)]
        assert answers == jobs  # all three taken
        syncs = q.sync_counters()["queue_append_syncs"] - before
        if durability in ("msync", "fdatasync"):
            assert syncs == 3  # one sync per enqueue, before it returned
        elif durability == "group":
            assert 1 <= syncs <= 3
        assert [j.payload for j in q.lease(4)] == [{"first": "append"}, {"a": 0}, {"a": 1}, {"a": 2}]


def test_a_queue_without_automatic_ids_never_takes_the_express_path(tmp_path):
    with counted() as answers, Queue(tmp_path, durability="none", auto_ids=False) as q:
        with pytest.raises(ValueError):
            q.enqueue({"a": 1})  # a queue without automatic ids wants an id
    assert answers == []


def test_an_express_enqueue_on_a_closed_queue_raises_closed(tmp_path):
    q = Queue(tmp_path, durability="none")
    q.enqueue({"a": 1})
    q.close()
    with pytest.raises(QueueClosedError):
        q.enqueue({"a": 2})


def test_threads_enqueueing_at_once_get_one_record_each(tmp_path):
    n, per = 4, 400
    with Queue(tmp_path, durability="none", slot_size=256, slot_count=64) as q:
        q.enqueue({"first": "append"})
        out: list[list[Any]] = [[] for _ in range(n)]
        start = threading.Barrier(n)

        def produce(k: int) -> None:
            start.wait()
            for i in range(per):
                out[k].append(q.enqueue({"k": k, "i": i}))

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        jobs = [j for js in out for j in js]
        assert len({j.seq for j in jobs}) == n * per and len({j.id for j in jobs}) == n * per
        got = {}
        while True:
            batch = q.lease(500)
            if not batch:
                break
            for j in batch:
                got[j.id] = j.payload
            q.ack_many(batch)
        assert len(got) == n * per + 1
        for j in jobs:
            assert got[j.id] == j.payload
        for k in range(n):  # each thread's jobs in its order
            assert [j.payload["i"] for j in out[k]] == list(range(per))
            assert [j.seq for j in out[k]] == sorted(j.seq for j in out[k])


PRODUCER = """
import sys
from ringq import Queue
q = Queue(sys.argv[1], durability="none")
for i in range(int(sys.argv[3])):
    q.enqueue({"p": int(sys.argv[2]), "i": i})
"""


def test_processes_and_threads_enqueueing_at_once_lose_and_repeat_nothing(tmp_path):
    procs, per = 3, 500
    with Queue(tmp_path, durability="none", slot_size=256, slot_count=64) as q:
        children = [spawn(PRODUCER, str(tmp_path), str(p), str(per)) for p in range(procs)]
        mine = [q.enqueue({"p": -1, "i": i}) for i in range(per)]
        for c in children:
            assert c.wait(60) == 0
        seen: dict[tuple[int, int], int] = {}
        while True:
            batch = q.lease(500)
            if not batch:
                break
            for j in batch:
                key = (j.payload["p"], j.payload["i"])
                seen[key] = seen.get(key, 0) + 1
            q.ack_many(batch)
        assert len(seen) == (procs + 1) * per and set(seen.values()) == {1}
        assert len({j.seq for j in mine}) == per


def test_an_enqueue_inside_a_span_carries_its_trace_context(tmp_path):
    trace = pytest.importorskip("opentelemetry.trace")
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    ctx = SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(1))
    with Queue(tmp_path, durability="none") as q:
        q.enqueue({"first": "append"})
        with counted() as answers, trace.use_span(NonRecordingSpan(ctx)):
            job = q.enqueue({"a": 1})
        assert answers == []  # a span is current: the general way, which stores its context
        assert job.trace_context is not None
        assert job.trace_context["traceparent"].startswith("00-" + f"{0x1234:032x}")
        assert q.get(job.id).trace_context == job.trace_context
