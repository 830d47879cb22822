"""Prometheus metrics of a queue and of a worker, in the text exposition format (extra ``[metrics]``).

Served by ``ringq --dir DIR metrics --port N`` and by ``Worker(metrics_port=N)``, on 127.0.0.1.
Queue metrics are read at each scrape (ringq/web/view.py: the control file's cumulative counters and
one copy of each state table), so every process of the host reports the same numbers; worker
metrics count what that worker process did.  Rates are the Prometheus way: ``rate()`` of the
``_total`` counters.

=============================================  ======  =================================================
metric                                         type    meaning
=============================================  ======  =================================================
``ringq_jobs{queue,state}``                    gauge   retained jobs: ready, delayed, deferred, leased, done, dead
``ringq_jobs_by_priority{queue,state,priority}`` gauge  the same by priority
``ringq_corrupt_records{queue}``               gauge   records quarantined as damaged
``ringq_oldest_ready_age_seconds{queue}``      gauge   how long the longest-waiting due job has been due
``ringq_enqueued_total{queue}``                counter jobs enqueued since the queue was created
``ringq_acked_total{queue}``                   counter acks since creation
``ringq_dead_lettered_total{queue}``           counter moves to the dead-letter queue since creation
``ringq_syncs_total{queue}``                   counter append syncs (msync/fdatasync/group leader/flush)
``ringq_limit_running{queue,limit}``           gauge   leases holding a concurrency slot of the limit
``ringq_limit_concurrency{queue,limit}``       gauge   the limit's cap
``ringq_worker_leases_total{queue}``           counter jobs this worker leased
``ringq_worker_jobs_total{queue,outcome}``     counter handler outcomes: succeeded, failed, dead, lost_lease
``ringq_worker_handler_seconds{queue,outcome}`` histogram handler run time, seconds (succeeded, failed)
=============================================  ======  =================================================

Sync latency is not measured by the engine, so it is not exported; the sync count is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

try:
    from prometheus_client import CollectorRegistry, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("ringq metrics need prometheus_client: pip install 'ringq[metrics]'") from exc

from ringq.backend import QueueBackend, check_port

from . import view

__all__ = ["QueueCollector", "WorkerMetrics", "serve", "queue_registry"]


class QueueCollector:
    """A prometheus_client collector reading a queue of either backend at each scrape."""

    def __init__(self, queue: QueueBackend) -> None:
        self.queue = queue

    def describe(self) -> list[Metric]:
        return []  # the families depend on the queue's content: collected at scrape time only

    def collect(self) -> Iterator[Metric]:
        q = self.queue
        ov = view.overview(q)
        name = q.name
        st = ov["stats"]
        jobs = GaugeMetricFamily("ringq_jobs", "Retained jobs by state.", labels=["queue", "state"])
        for state in ("ready", "delayed", "deferred", "leased", "done", "dead"):
            jobs.add_metric([name, state], st[state])
        yield jobs
        by_prio = GaugeMetricFamily(
            "ringq_jobs_by_priority",
            "Retained jobs by state and priority.",
            labels=["queue", "state", "priority"],
        )
        for row in ov["by_priority"]:
            by_prio.add_metric([name, row["state"], str(row["priority"])], row["jobs"])
        yield by_prio
        yield _gauge(
            "ringq_corrupt_records", "Records quarantined as damaged.", name, st["corrupt"]
        )
        age = ov["oldest_ready_age"]
        yield _gauge(
            "ringq_oldest_ready_age_seconds",
            "Seconds the longest-waiting due job has been due (0: none).",
            name,
            0.0 if age is None else age,
        )
        for metric, field, text in (
            ("ringq_enqueued", "enqueued_total", "Jobs enqueued since the queue was created."),
            ("ringq_acked", "acked_total", "Acks since the queue was created."),
            (
                "ringq_dead_lettered",
                "dead_lettered_total",
                "Moves to the dead-letter queue since the queue was created.",
            ),
        ):
            c = CounterMetricFamily(metric, text, labels=["queue"])
            c.add_metric([name], st[field])
            yield c
        if ov["sync_count"] is not None:
            c = CounterMetricFamily(
                "ringq_syncs",
                "Append syncs issued on the queue by all processes.",
                labels=["queue"],
            )
            c.add_metric([name], ov["sync_count"])
            yield c
        running = GaugeMetricFamily(
            "ringq_limit_running",
            "Leases holding a concurrency slot of the limit.",
            labels=["queue", "limit"],
        )
        cap = GaugeMetricFamily(
            "ringq_limit_concurrency", "Concurrency cap of the limit.", labels=["queue", "limit"]
        )
        for lim in ov["limits"]:
            if lim["concurrency"]:
                running.add_metric([name, lim["name"]], lim["running"])
                cap.add_metric([name, lim["name"]], lim["concurrency"])
        yield running
        yield cap


def _gauge(metric: str, text: str, queue: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(metric, text, labels=["queue"])
    g.add_metric([queue], value)
    return g


class WorkerMetrics:
    """One worker's metrics: counters read from its live stats at each scrape, and a histogram of
    handler run times fed by :meth:`observe` (register it in ``Worker.observers``)."""

    def __init__(
        self, registry: CollectorRegistry, queue_name: str, live_stats: Callable[[], dict[str, int]]
    ) -> None:
        self.queue_name = queue_name
        self.live_stats = live_stats
        self.seconds = Histogram(
            "ringq_worker_handler_seconds",
            "Handler run time, seconds.",
            ["queue", "outcome"],
            registry=registry,
        )
        registry.register(self)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        st = self.live_stats()
        leases = CounterMetricFamily(
            "ringq_worker_leases", "Jobs this worker leased.", labels=["queue"]
        )
        leases.add_metric([self.queue_name], st["leased"])
        yield leases
        jobs = CounterMetricFamily(
            "ringq_worker_jobs", "Handler outcomes of this worker.", labels=["queue", "outcome"]
        )
        for outcome, field in (
            ("succeeded", "succeeded"),
            ("failed", "failed"),
            ("dead", "dead"),
            ("lost_lease", "lost_leases"),
        ):
            jobs.add_metric([self.queue_name, outcome], st[field])
        yield jobs

    def observe(self, outcome: str, seconds: float) -> None:
        """Record one handler run: ``outcome`` is ``"succeeded"`` or ``"failed"``."""
        self.seconds.labels(self.queue_name, outcome).observe(seconds)


def queue_registry(queue: Any) -> CollectorRegistry:
    """A registry holding the queue's collector."""
    reg = CollectorRegistry()
    reg.register(QueueCollector(queue))
    return reg


def serve(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> tuple[Any, int]:
    """Serve ``registry`` at ``http://addr:port/metrics`` from a daemon thread.

    Returns ``(server, port)``; ``port=0`` picks a free port.  ``server.shutdown()`` stops it.
    Raises OSError if the port is taken, ValueError if ``port`` is not an int from 0 to 65535.
    """
    check_port(port)
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server, server.server_address[1]
