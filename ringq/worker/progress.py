"""What a running Worker shows: a live progress line on a terminal, and a metrics endpoint.

The progress line (done, failed, dead, in flight, rate) is drawn by ``rich`` (extra
``[progress]``) on stderr, refreshed twice a second, and only when stderr is a terminal unless
asked otherwise: output piped to a file or a log collector stays free of control sequences.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["attach", "progress_text"]

log = logging.getLogger("ringq.worker")
REFRESH = 0.5  # seconds between redraws of the progress line
RATE_WINDOW = 10.0  # seconds the shown rate is averaged over


def progress_text(stats: dict[str, int], rate: float | None, elapsed: float) -> str:
    """The progress line: ``done 120  failed 3 (dead 1)  in flight 4  12.5 jobs/s  0:00:09``."""
    done = stats["succeeded"]
    inflight = max(0, stats["leased"] - stats["succeeded"] - stats["failed"] - stats["lost_leases"])
    rate_text = "-" if rate is None else f"{rate:,.1f}"
    m, s = divmod(int(elapsed), 60)
    h, m = divmod(m, 60)
    return (
        f"done {done:,}  failed {stats['failed']:,} (dead {stats['dead']:,})  in flight {inflight:,}  "
        f"{rate_text} jobs/s  {h}:{m:02d}:{s:02d}"
    )


def attach(worker: Any) -> Callable[[], None]:
    """Start what ``worker`` asked for (metrics endpoint, progress line) for one ``run()``;
    returns the function that stops them."""
    stops: list[Callable[[], None]] = []
    if worker.metrics_port is not None:
        stops.append(_serve_metrics(worker))
    show = worker.progress if worker.progress is not None else sys.stderr.isatty()
    if show:
        stops.append(_show_progress(worker))

    def detach() -> None:
        for stop in reversed(stops):
            stop()
        stops.clear()

    return detach


def _serve_metrics(worker: Any) -> Callable[[], None]:
    from prometheus_client import CollectorRegistry

    from ringq.web.metrics import QueueCollector, WorkerMetrics, serve

    reg = CollectorRegistry()
    reg.register(QueueCollector(worker.queue))
    metrics = WorkerMetrics(reg, worker.queue.name, worker.live_stats)
    worker.observers.append(metrics.observe)
    server, port = serve(reg, worker.metrics_port)
    worker.metrics_address = ("127.0.0.1", port)

    def stop() -> None:
        worker.observers.remove(metrics.observe)
        server.shutdown()
        server.server_close()
        worker.metrics_address = None

    return stop


def _show_progress(worker: Any) -> Callable[[], None]:
    try:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text
    except ImportError:
        log.warning("live progress needs rich: pip install 'ringq[progress]'")
        return lambda: None
    console = Console(file=sys.stderr)
    started = time.monotonic()
    samples: deque[tuple[float, int]] = deque()
    done = threading.Event()

    def line() -> Text:
        st = worker.live_stats()
        now = time.monotonic()
        finished = st["succeeded"] + st["failed"]
        samples.append((now, finished))
        while samples and now - samples[0][0] > RATE_WINDOW:
            samples.popleft()
        rate = None
        if len(samples) > 1 and now > samples[0][0]:
            rate = (finished - samples[0][1]) / (now - samples[0][0])
        return Text(progress_text(st, rate, now - started))

    live = Live(line(), console=console, auto_refresh=False, transient=False)
    live.start()

    def loop() -> None:
        while not done.wait(REFRESH):
            live.update(line(), refresh=True)

    t = threading.Thread(target=loop, name="ringq-progress", daemon=True)
    t.start()

    def stop() -> None:
        done.set()
        t.join()
        live.update(line(), refresh=True)
        live.stop()

    return stop
