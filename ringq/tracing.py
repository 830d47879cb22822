"""OpenTelemetry traces (extra ``otel``: ``pip install 'ringq[otel]'``, opentelemetry-api).

``opentelemetry`` is imported the first time a job is enqueued or handled, and only if it is
installed; without it every function here returns at once and nothing else changes.

* :func:`carrier`: the W3C trace context current at an enqueue (``traceparent``, ``tracestate``),
  stored with the job (a field of its record or Redis hash, never the payload).
* :func:`processing`: the span a Worker or ``ringq.aio`` runs a handler in, named and attributed
  per OpenTelemetry's messaging semantic conventions (``process <queue>``, kind CONSUMER,
  ``messaging.system`` = ``ringq``, ``messaging.destination.name``, ``messaging.message.id``,
  ``messaging.operation.type`` = ``process``, ``messaging.ringq.message.delivery_attempt``).  The
  first attempt continues the enqueue's trace (its parent is the stored context); a retry starts a
  trace of its own with a link to the first attempt's span (recorded by the backend when that
  attempt failed in a handler) or, when none was recorded, to the enqueue's context.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

__all__ = [
    "carrier",
    "processing",
    "traceparent_of",
    "failed",
    "clean",
    "valid_traceparent",
    "valid_tracestate",
    "TRACEPARENT",
    "MAX_TRACESTATE",
    "SYSTEM",
    "ATTR_ATTEMPT",
]

SYSTEM = "ringq"  # messaging.system
ATTR_ATTEMPT = "messaging.ringq.message.delivery_attempt"  # the job's attempt number (1 = first)
# A W3C traceparent of version 00 (and the shape later versions keep): version-trace-span-flags.
TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_TRACESTATE = 512  # characters: the W3C limit
_TRACESTATE = re.compile(r"[\x20-\x7e]{1,512}")

_api: Any = None  # the opentelemetry modules once looked for; False: not installed


def _load() -> Any:
    global _api
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        _api = False
    else:
        _api = (trace, context, TraceContextTextMapPropagator())
    return _api


def warm() -> None:
    """Import the OpenTelemetry API now, if installed (a parent about to fork workers does it
    once for all of them, instead of each child on its first job)."""
    if _api is None:
        _load()


def valid_traceparent(text: object) -> bool:
    """True for a W3C traceparent (version 00's shape; version ff is invalid by the spec)."""
    return isinstance(text, str) and bool(TRACEPARENT.fullmatch(text)) and text[:2] != "ff"


def valid_tracestate(text: object) -> bool:
    """True for a W3C tracestate ringq keeps: 1..MAX_TRACESTATE printable ASCII characters."""
    return isinstance(text, str) and bool(_TRACESTATE.fullmatch(text))


def clean(headers: Any) -> tuple[str | None, str | None]:
    """``(traceparent, tracestate)`` of W3C headers, each None unless well formed.  A trace
    context never fails an enqueue: a malformed one is dropped."""
    if not isinstance(headers, dict):
        return None, None
    tp = headers.get("traceparent")
    if not valid_traceparent(tp):
        return None, None
    ts = headers.get("tracestate")
    return tp, ts if valid_tracestate(ts) else None


def carrier() -> dict[str, str] | None:
    """The W3C trace context of the current span as headers, or None (opentelemetry not
    installed, or no valid span current)."""
    api = _api if _api is not None else _load()
    if not api:
        return None
    current = api[1].get_current()
    if not current:  # an empty context holds no span (the common case, checked first: cheap)
        return None
    if not api[0].get_current_span(current).get_span_context().is_valid:
        return None
    out: dict[str, str] = {}
    api[2].inject(out)
    tp, ts = clean(out)
    if tp is None:
        return None
    return {"traceparent": tp} if ts is None else {"traceparent": tp, "tracestate": ts}


def _span_context(api: Any, headers: dict[str, str] | None) -> Any:
    """The remote SpanContext of W3C headers, or None."""
    if not headers:
        return None
    ctx = api[2].extract(headers)
    sc = api[0].get_current_span(ctx).get_span_context()
    return sc if sc.is_valid else None


def processing(
    queue: str,
    job: Any,
    first_attempt: Callable[[], str | None] | None = None,
) -> AbstractContextManager[Any]:
    """Run the body in the span of handling ``job`` (a :class:`ringq.Job`) from ``queue``; yields
    the span, or None without opentelemetry, or for a first attempt whose job carries no trace
    context while no tracer provider is set (no span would record or carry anything).
    ``first_attempt()`` gives the traceparent recorded for the job's first attempt (asked only
    for a retry with a recording span).  An exception of the body is recorded on the span
    (status ERROR) and raised on."""
    api = _api if _api is not None else _load()
    if not api:
        return _NO_SPAN
    headers = getattr(job, "trace_context", None)
    attempt = int(getattr(job, "attempts", 1) or 1)
    if attempt <= 1 and not headers and not _provider_set(api[0]):
        # No tracer provider is set, and the job carries no context to propagate: the span would
        # be the current one (the API's no-op tracer returns its parent), so the body runs as is.
        return _NO_SPAN
    return _span(api, queue, job, attempt, headers, first_attempt)


_NO_SPAN: AbstractContextManager[None] = nullcontext()  # reusable: yields None, records nothing
PROVIDER_RECHECK = 1.0  # seconds a "no tracer provider set" answer is reused
_no_provider_until = 0.0  # monotonic time until which no provider was found set


def _provider_set(trace: Any) -> bool:
    """Whether a tracer provider is set (an SDK's); a "no" is looked up again at most once per
    PROVIDER_RECHECK seconds (the lookup reads the environment), so a provider set while a
    Worker runs is used from its next job on within that long."""
    global _no_provider_until
    now = time.monotonic()
    if now < _no_provider_until:
        return False
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _no_provider_until = now + PROVIDER_RECHECK
        return False
    return True


@contextmanager
def _span(
    api: Any,
    queue: str,
    job: Any,
    attempt: int,
    headers: dict[str, str] | None,
    first_attempt: Callable[[], str | None] | None,
) -> Iterator[Any]:
    trace, context = api[0], api[1]
    creation = _span_context(api, headers)
    links = []
    if attempt <= 1:
        parent = trace.set_span_in_context(trace.NonRecordingSpan(creation)) if creation else None
    else:
        parent = context.Context()  # a retry is not nested in the enqueue's trace: a root
        first = None
        if first_attempt is not None:
            try:
                first = _span_context(api, {"traceparent": first_attempt() or ""})
            except Exception:  # a record that cannot be read: link to the enqueue instead
                first = None
        target = first or creation
        if target is not None:
            links.append(
                trace.Link(target, {"ringq.link": "first_attempt" if first else "enqueue"})
            )
    tracer = trace.get_tracer("ringq")
    span = tracer.start_span(
        f"process {queue}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue,
            "messaging.message.id": str(job.id),
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            ATTR_ATTEMPT: attempt,
        },
    )
    with trace.use_span(
        span, end_on_exit=True, record_exception=True, set_status_on_exception=True
    ):
        yield span


def failed(span: Any, error: str) -> None:
    """Mark ``span`` (from :func:`processing`) as failed with ``error`` when the failure is not an
    exception that leaves the span (a ``ringq.aio`` handler's error is returned as data)."""
    if span is not None:
        trace = _api[0]
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))


def traceparent_of(span: Any) -> str | None:
    """The traceparent of ``span`` (from :func:`processing`, ended or not) if it was sampled, else
    None: what a backend keeps as the first attempt's span for a retry's link."""
    if span is None:
        return None
    sc = span.get_span_context()
    if not sc.is_valid or not sc.trace_flags.sampled:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"
