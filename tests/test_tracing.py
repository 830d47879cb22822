"""OpenTelemetry traces across a real process boundary (ringq/tracing.py, docs/operations.md):
one process enqueues inside a span, a Worker in another runs the job in a span that continues it,
a retry starts its own trace linked to the first attempt; the SDK's in-memory exporter records
them.  On both backends.  And nothing changes when opentelemetry is not installed."""

from __future__ import annotations

import json
import os

import pytest
from procs import run_py

pytest.importorskip("opentelemetry.sdk")

SETUP = r"""
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
import ringq
from ringq import BackoffPolicy
where, name = sys.argv[1], sys.argv[2]
q = ringq.connect(where, name, backoff=BackoffPolicy(base=0, jitter=0))
"""

PRODUCER = (
    SETUP
    + r"""
with trace.get_tracer("app").start_as_current_span("request") as span:
    job = q.enqueue({"to": "ada"})
    sc = span.get_span_context()
print(json.dumps({"id": job.id, "trace": f"{sc.trace_id:032x}", "span": f"{sc.span_id:016x}",
                  "stored": q.get(job.id).trace_context}))
"""
)

CONSUMER = (
    SETUP
    + r"""
from ringq import Worker

def handler(job):
    if job.attempts == 1:
        raise RuntimeError("first attempt fails")

Worker(q, handler, idle_timeout=0.5, handle_signals=False).run()
out = []
for s in exporter.get_finished_spans():
    out.append({
        "name": s.name, "kind": s.kind.name, "trace": f"{s.context.trace_id:032x}",
        "span": f"{s.context.span_id:016x}",
        "parent": None if s.parent is None else f"{s.parent.span_id:016x}",
        "links": [f"{l.context.trace_id:032x}-{l.context.span_id:016x}" for l in s.links],
        "attrs": dict(s.attributes), "status": s.status.status_code.name,
    })
print(json.dumps(out))
"""
)


@pytest.fixture(params=["local", "redis"])
def where(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "q")
    from redisserver import require_redis

    require_redis()
    return request.getfixturevalue("redis_url")


def test_a_job_is_traced_from_the_enqueue_to_its_handler_across_processes(where):
    name = f"tr{os.getpid()}{abs(hash(where)) % 10_000}"
    made = run_py(PRODUCER, where, name)
    assert made.returncode == 0, made.stderr
    sent = json.loads(made.stdout)
    assert sent["stored"]["traceparent"].startswith(f"00-{sent['trace']}-{sent['span']}-")
    ran = run_py(CONSUMER, where, name)
    assert ran.returncode == 0, ran.stderr
    spans = [s for s in json.loads(ran.stdout.strip().splitlines()[-1]) if s["kind"] == "CONSUMER"]
    assert len(spans) == 2, spans
    first, retry = spans
    for s, attempt in ((first, 1), (retry, 2)):
        assert s["name"] == f"process {name}"
        assert s["attrs"] == {
            "messaging.system": "ringq",
            "messaging.destination.name": name,
            "messaging.message.id": sent["id"],
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.ringq.message.delivery_attempt": attempt,
        }
    # The first attempt continues the enqueue's trace, as a child of the request's span.
    assert (first["trace"], first["parent"]) == (sent["trace"], sent["span"])
    assert first["status"] == "ERROR" and retry["status"] == "UNSET"
    # The retry is not nested in it: a trace of its own, linked to the first attempt.
    assert retry["parent"] is None and retry["trace"] != sent["trace"]
    assert retry["links"] == [f"{first['trace']}-{first['span']}"]


def test_aio_handler_span_continues_the_submit(tmp_path):
    code = (
        SETUP.replace("q = ringq.connect(where, name, backoff=BackoffPolicy(base=0, jitter=0))", "")
        + r"""
import asyncio
from ringq.aio import Queue
queue = Queue(where)

@queue.handler("double")
async def double(job):
    return job.payload * 2

async def main():
    async with queue:
        with trace.get_tracer("app").start_as_current_span("request") as span:
            jid = queue.submit("double", 21)
        while queue.get(jid).status.value == "running":
            await asyncio.sleep(0.01)
    return span.get_span_context()

sc = asyncio.run(main())
mine = [s for s in exporter.get_finished_spans() if s.kind.name == "CONSUMER"]
assert len(mine) == 1, mine
assert mine[0].parent.span_id == sc.span_id and mine[0].context.trace_id == sc.trace_id
assert mine[0].name == "process " + queue.queue_name("double")
print("ok")
"""
    )
    out = run_py(code, str(tmp_path / "aio"), "unused")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_nothing_changes_without_opentelemetry(tmp_path):
    code = r"""
import sys
sys.modules["opentelemetry"] = None  # as if it were not installed: every import of it fails
import ringq
from ringq import Worker
q = ringq.Queue(sys.argv[1])
job = q.enqueue({"x": 1})
assert job.trace_context is None and q.get(job.id).trace_context is None
ran = []
Worker(q, lambda j: ran.append(j.id), idle_timeout=0.3, handle_signals=False).run()
assert ran == [job.id] and q.get(job.id).state.value == "done"
assert "opentelemetry" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""
    qdir = str(tmp_path / "q")
    out = run_py(code, qdir)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    seg = sorted(f for f in os.listdir(qdir) if f.endswith(".seg"))[0]
    with open(os.path.join(qdir, seg), "rb") as fh:
        fh.seek(4096 + 50)
        assert fh.read(2) == bytes([1, 1])  # codec JSON, kind 1: a plain record, as before


def test_without_a_tracer_provider_a_handler_still_carries_the_enqueue_context(tmp_path):
    # The API alone (no SDK provider set): a job enqueued under a propagated context hands that
    # context to its handler, so what the handler enqueues continues the trace; a job without
    # one runs with no span current, a retry of it too.
    code = r"""
import sys
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
import ringq
from ringq import BackoffPolicy, Worker, tracing
assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
q = ringq.Queue(sys.argv[1], backoff=BackoffPolicy(base=0, jitter=0))
remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
with trace.use_span(NonRecordingSpan(remote)):
    traced = q.enqueue({"traced": True})
plain = q.enqueue({"traced": False})
seen = {}

def handler(job):
    seen.setdefault(job.id, []).append(tracing.carrier())
    if job.id == plain.id and job.attempts == 1:
        raise RuntimeError("retried")

Worker(q, handler, idle_timeout=0.3, handle_signals=False).run()
assert traced.trace_context["traceparent"].startswith("00-" + "0" * 28 + "1234-"), traced.trace_context
assert seen[traced.id] == [{"traceparent": traced.trace_context["traceparent"]}], seen
assert seen[plain.id] == [None, None], seen
print("ok")
"""
    out = run_py(code, str(tmp_path / "q"))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_tracer_provider_set_while_a_worker_runs_is_used_within_a_second(tmp_path):
    code = r"""
import sys, threading, time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import ringq
from ringq import Worker
q = ringq.Queue(sys.argv[1])
q.enqueue({"n": 1})
done = []
w = Worker(q, lambda j: done.append(j.payload["n"]), handle_signals=False, idle_timeout=5)
t = threading.Thread(target=w.run)
t.start()
while not done:
    time.sleep(0.01)
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
time.sleep(1.1)
q.enqueue({"n": 2})
while len(done) < 2:
    time.sleep(0.01)
w.stop()
t.join()
assert [s.name for s in exporter.get_finished_spans()] == [f"process {q.name}"]
print("ok")
"""
    out = run_py(code, str(tmp_path / "q"))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
