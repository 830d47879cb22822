"""The Prometheus endpoint over real HTTP, parsed by prometheus_client's own parser."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request

import pytest
from procs import spawn

from ringq import Queue, Worker

parser = pytest.importorskip("prometheus_client.parser")


def scrape(url: str) -> dict[str, list]:
    """``{family name: [samples]}`` as prometheus_client's parser reads the page."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {f.name: f.samples for f in parser.text_string_to_metric_families(text)}


def value(fams: dict, name: str, **labels: str) -> float:
    for family in fams.values():
        for s in family:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError((name, labels))


def test_ringq_metrics_command(qdir):
    q = Queue(qdir)
    q.enqueue_many([{"n": i} for i in range(5)], priority=2)
    later = q.enqueue("later", delay=600)
    q.enqueue("after later", depends_on=[later])
    q.enqueue("keyed", key="tenant-1")
    q.limit("tenant-1", concurrency=4)
    q.ack(q.lease_one())
    bad = q.enqueue("bad", priority=9, max_attempts=1)
    leased = q.lease_one()
    assert leased.id == bad.id
    q.nack(leased, error="boom")
    proc = spawn(
        "from ringq.cli import main; raise SystemExit(main())",
        "--dir",
        qdir,
        "metrics",
        "--port",
        "0",
        "--json",
        stdout=-1,
        text=True,
    )
    try:
        url = json.loads(proc.stdout.readline())["url"]
        assert url.startswith("http://127.0.0.1:")
        fams = scrape(url)
        assert value(fams, "ringq_jobs", queue="default", state="ready") == 5
        assert value(fams, "ringq_jobs", queue="default", state="delayed") == 1
        assert value(fams, "ringq_jobs", queue="default", state="deferred") == 1
        assert value(fams, "ringq_jobs", queue="default", state="dead") == 1
        assert value(fams, "ringq_jobs_by_priority", state="ready", priority="2") == 4
        assert value(fams, "ringq_jobs_by_priority", state="dead", priority="9") == 1
        assert value(fams, "ringq_enqueued_total", queue="default") == 9
        assert value(fams, "ringq_acked_total", queue="default") == 1
        assert value(fams, "ringq_dead_lettered_total", queue="default") == 1
        assert value(fams, "ringq_syncs_total", queue="default") >= 1
        assert value(fams, "ringq_limit_concurrency", limit="tenant-1") == 4
        assert value(fams, "ringq_limit_running", limit="tenant-1") == 0
        age = value(fams, "ringq_oldest_ready_age_seconds", queue="default")
        assert 0 <= age < 60
        q.enqueue_many(list(range(3)))  # another process's work shows at the next scrape
        assert value(scrape(url), "ringq_enqueued_total", queue="default") == 12
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_worker_metrics_port(qdir):
    q = Queue(qdir)
    q.enqueue_many([{"ok": True}] * 4)
    q.enqueue({"ok": False}, max_attempts=1)  # dead at once: no retry races the scrape
    release = threading.Event()

    def handler(job):
        if not job.payload["ok"]:
            raise ValueError("nope")
        if job.payload.get("hold"):
            release.wait(30)

    w = Worker(q, handler, concurrency=1, idle_timeout=30, metrics_port=0, progress=False)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while (w.metrics_address is None or q.stats().ready) and time.monotonic() < deadline:
        time.sleep(0.02)
    q.enqueue({"ok": True, "hold": True})
    while q.stats().leased == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    host, port = w.metrics_address
    fams = scrape(f"http://{host}:{port}/metrics")
    release.set()
    w.stop()
    t.join(30)
    assert value(fams, "ringq_worker_leases_total", queue="default") == 6
    assert value(fams, "ringq_worker_jobs_total", outcome="succeeded") == 4
    assert value(fams, "ringq_worker_jobs_total", outcome="failed") == 1
    assert value(fams, "ringq_worker_jobs_total", outcome="dead") == 1
    assert value(fams, "ringq_worker_handler_seconds_count", outcome="succeeded") == 4
    assert value(fams, "ringq_worker_handler_seconds_count", outcome="failed") == 1
    assert value(fams, "ringq_jobs", state="leased") == 1
    assert w.metrics_address is None  # the endpoint ends with run()


def test_worker_metrics_on_a_redis_queue(redis_url):
    """A Worker serving a Redis queue serves its metrics too: counts by state from the server
    (there are no files to read for the by-priority table)."""
    import ringq

    q = ringq.connect(redis_url, "wm")
    q.enqueue_many([{"n": i} for i in range(3)])
    got = {}

    def handler(job) -> None:
        if not got:
            got.update(scrape(f"http://127.0.0.1:{w.metrics_address[1]}/metrics"))

    w = Worker(q, handler, metrics_port=0, max_jobs=3, idle_timeout=10, handle_signals=False)
    w.run()
    q.close()
    assert value(got, "ringq_jobs", queue="wm", state="leased") >= 1
    assert value(got, "ringq_enqueued_total", queue="wm") == 3
