"""The public job snapshot (:class:`Job`) and its states (:class:`JobState`), the same on every
backend.  How the local queue stores a job's state is ringq/engine/words.py (the state word) and
ringq/engine/transitions.py (the state machine every change consults).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .codec import decode, jsonable
from .errors import SerializationError

__all__ = ["Job", "JobState"]


class JobState(str, enum.Enum):
    """Where a job is in its life.  A delayed job is READY with ``available_at`` in the future; a
    DEFERRED job waits for the jobs it depends on (docs/workflows.md) and becomes READY once.

    ``str``-valued so that it serialises to JSON as its name (as ``nobroker.JobState`` does).
    """

    READY = "ready"
    LEASED = "leased"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"  # terminal: cancelled before it ran, or its holder was asked to stop
    EXPIRED = "expired"  # terminal: its expires-at passed before it was leased; it never ran
    DEFERRED = "deferred"  # waits for its parents (``enqueue(..., depends_on=)``), never leased


@dataclass(slots=True, repr=False)
class Job:
    """A snapshot of one job.  Mutating it changes nothing in the queue.

    Attributes:
        id: the job id: the caller's ``job_id``, or 16 hex digits of ``seq`` when none was given.
        payload: the decoded payload (JSON value, ``bytes`` or ``numpy.ndarray``).  A job handed
            out by a lease is decoded on first access of ``payload`` (and by equality,
            :meth:`to_dict`, ``repr`` and ``dataclasses.replace``, which read it); bytes that do
            not decode raise SerializationError there, except in ``repr``, which shows
            ``payload=<undecodable: reason>``.
        priority: higher leases first; ties break by ``available_at``, then FIFO by ``seq``.
        state: :class:`JobState` when the snapshot was taken.
        attempts: number of times the job has been leased.
        max_attempts: leases allowed before the job goes to the dead-letter queue.
        available_at: seconds since the Unix epoch before which it may not be leased.
        enqueued_at: seconds since the Unix epoch at which it was accepted.
        lease_deadline: when the current lease expires (seconds since the epoch), or None.
        lease_token: the fencing token of the current/last lease of the job's record, None if that
            record was never leased (a dead-lettered job copied to the tail shows None).  A ``str``
            (as in nobroker): the lease count of the job's record in decimal, so a later lease of
            that record has a larger token.  A new record of the job -- ``requeue_dead``, or a
            relocation of a job left far behind (docs/migration.md) -- counts from 1 again; its
            older leases are fenced by their record (an ack or nack with the ``Job`` is refused).
        last_error: text given to the last nack, or why the last lease was lost.
        seq: queue-wide enqueue order, unique per queue.
        version: changes whenever the job changes state (lease, ack, nack, expiry, dead-letter),
            not on ``extend``; two snapshots of one job with equal versions saw the same state.
            Derived from the lease count: ``2 * leases``, minus one while leased.
        key: the limit key given to ``enqueue(..., key=...)`` (concurrency caps, rate limits and
            unique windows apply per key: ringq/local/limits.py), or None.
        cancel_requested: True while LEASED if :meth:`Queue.cancel` asked its holder to stop
            (``extend`` and the worker's heartbeat return snapshots that show it).
        expires_at: seconds since the Unix epoch after which it is never leased (EXPIRED), or None.
        progress: the fraction in [0, 1] its holder last reported with ``Queue.progress``, or None.
        progress_message: the text reported with it, or None.
        timeout: the job's own hard timeout of one attempt, seconds (``enqueue(..., timeout=)``),
            or None: a Worker kills (processes) or gives up (threads) an attempt that runs longer
            (docs/operations.md).  It wins over the Worker's ``timeout``.
        trace_context: the W3C trace context (``{"traceparent": ..., "tracestate": ...}``) that
            was current when the job was enqueued (with ``ringq[otel]`` installed), or None; a
            Worker's span for the job continues it (docs/operations.md, "Traces").
        depends_on: the ids of the jobs this one was enqueued to wait for
            (``enqueue(..., depends_on=)``), in the order given, or None (docs/workflows.md).
            It stays after the job was released; ``q.result(id)`` reads a parent's result.
        cancelled: set by :class:`ringq.Worker` on the job handed to a handler: a
            ``threading.Event`` that is set when a cancel is requested, or when its timeout
            passes in a thread (None elsewhere).
        record_position: on a directory queue, ``(segment seq, slot, queue identity)`` of the
            record the snapshot was read from, which ack, nack and extend of this snapshot
            address (a lease belongs to its record: docs/design.md); ``(0, 0, 0)`` for a job
            not read from a segment (Redis, a job built by hand).  Read-only by convention.
        ack_accepted: True once an ack of this very snapshot was accepted, which lets the queue
            tell a repeat of that ack from a stale holder's (a nack or extend of it raises
            NotLeasedError saying it was acked).  Set by the queue; read-only by convention.
    """

    id: str
    payload: Any
    priority: int = 0
    state: JobState = JobState.READY
    attempts: int = 0
    max_attempts: int = 5
    available_at: float = 0.0
    enqueued_at: float = 0.0
    lease_deadline: float | None = None
    lease_token: str | None = None
    last_error: str | None = None
    seq: int = 0
    version: int = 0
    key: str | None = None
    cancel_requested: bool = False
    expires_at: float | None = None
    progress: float | None = None
    progress_message: str | None = None
    timeout: float | None = None
    trace_context: dict[str, str] | None = None
    cancelled: threading.Event | None = field(default=None, repr=False, compare=False)
    record_position: tuple[int, int, int] = field(default=(0, 0, 0), repr=False, compare=False)
    ack_accepted: bool = field(default=False, repr=False, compare=False)
    # ``(codec id, bytes)`` of a payload not decoded yet (the slot holds UNDECODED), else None.
    _raw: Any = field(default=None, repr=False, compare=False)
    depends_on: list[str] | None = None

    def __repr__(self) -> str:
        # The dataclass's form, except that a payload that cannot be decoded is described, not
        # raised: a job is logged, and a log line must not fail.
        parts = []
        for f in fields(self):
            if f.repr:
                try:
                    value = repr(getattr(self, f.name))
                except SerializationError as exc:
                    value = f"<undecodable: {exc}>"
                parts.append(f"{f.name}={value}")
        return f"Job({', '.join(parts)})"

    def snapshot(self) -> Job:
        """A detached copy (a Job is already a snapshot; this is nobroker's spelling)."""
        return replace(self)

    def is_eligible(self, now: float) -> bool:
        """True if the job was READY and due at ``now`` (seconds since the epoch) in this snapshot."""
        return self.state is JobState.READY and self.available_at <= now

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        """Rebuild a snapshot from :meth:`to_dict`'s form (or nobroker's).

        The result is detached from any queue: ``ack``/``nack`` of it find the job by id and check
        its ``lease_token``.  Raises KeyError without ``"id"``, ValueError for an unknown state.
        """
        token = data.get("lease_token")
        return cls(
            id=str(data["id"]),
            payload=data.get("payload"),
            priority=int(data.get("priority", 0)),
            state=JobState(data.get("state", "ready")),
            attempts=int(data.get("attempts", 0)),
            max_attempts=int(data.get("max_attempts", 5)),
            available_at=float(data.get("available_at", 0.0)),
            enqueued_at=float(data.get("enqueued_at", 0.0)),
            lease_deadline=None
            if data.get("lease_deadline") is None
            else float(data["lease_deadline"]),
            lease_token=None if token is None else str(token),
            last_error=data.get("last_error"),
            seq=int(data.get("seq", 0)),
            version=int(data.get("version", 0)),
            key=None if data.get("key") is None else str(data["key"]),
            cancel_requested=bool(data.get("cancel_requested", False)),
            expires_at=None if data.get("expires_at") is None else float(data["expires_at"]),
            progress=None if data.get("progress") is None else float(data["progress"]),
            progress_message=data.get("progress_message"),
            timeout=None if data.get("timeout") is None else float(data["timeout"]),
            trace_context=None
            if not isinstance(data.get("trace_context"), dict)
            else {str(k): str(v) for k, v in data["trace_context"].items()},
            depends_on=None
            if not isinstance(data.get("depends_on"), list)
            else [str(p) for p in data["depends_on"]],
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (bytes and arrays are described, not embedded)."""
        out = {
            "id": self.id,
            "payload": jsonable(self.payload),
            "priority": self.priority,
            "state": self.state.value,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "available_at": self.available_at,
            "enqueued_at": self.enqueued_at,
            "lease_deadline": self.lease_deadline,
            "lease_token": self.lease_token,
            "last_error": self.last_error,
            "seq": self.seq,
            "cancel_requested": self.cancel_requested,
            "expires_at": self.expires_at,
            "progress": self.progress,
            "progress_message": self.progress_message,
        }
        # Only jobs that carry them show these: nobroker's form stays unchanged.
        if self.key is not None:
            out["key"] = self.key
        if self.timeout is not None:
            out["timeout"] = self.timeout
        if self.trace_context is not None:
            out["trace_context"] = dict(self.trace_context)
        if self.depends_on is not None:
            out["depends_on"] = list(self.depends_on)
        return out


# ``payload`` is decoded on first access: a property over the slot that dataclass(slots=True)
# made for the field, so that Job stays a dataclass (fields, replace, equality, pickling) and a
# handler that never looks at the payload never pays for decoding it.  A job built with
# ``payload=UNDECODED`` decodes ``_raw`` when its payload is first read; setting the payload
# stores it in the slot directly (the slot's own setter: Job() pays no Python call for it).
_PAYLOAD_SLOT = Job.__dict__["payload"]


class _Undecoded:
    """The payload slot's value while ``_raw`` holds the bytes the payload is decoded from."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<undecoded payload>"


UNDECODED: Any = _Undecoded()


def _get_payload(job: Job) -> Any:
    value = _PAYLOAD_SLOT.__get__(job, Job)
    if value is UNDECODED:
        raw = job._raw
        if raw is None:  # another thread decoded it since the slot was read
            return _PAYLOAD_SLOT.__get__(job, Job)
        value = decode(raw[0], raw[1])  # SerializationError leaves it undecoded: raised again
        _PAYLOAD_SLOT.__set__(job, value)
        job._raw = None
    return value


# (setattr: the class attribute is replaced after the dataclass machinery ran, on purpose)
setattr(Job, "payload", property(_get_payload, _PAYLOAD_SLOT.__set__, doc="the decoded payload"))  # noqa: B010


def use_payload_descriptor(make: Callable[[Callable[[Job], Any]], Any]) -> None:
    """Give ``Job.payload`` the descriptor ``make(getter)`` returns: a compiled one that reads and
    writes the payload slot itself and decodes the common payloads on first access, calling
    ``getter`` (this module's, which decodes any payload) for the rest.  It must give what the
    property gives, values and errors alike (ringq/engine/runs.py installs one; tests/test_runs.py
    compares them)."""
    setattr(Job, "payload", make(_get_payload))  # noqa: B010


def slots() -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """Job's field names in declaration order, and the slot descriptor that stores each (for
    ``payload``, the slot under its property): what ringq/engine/runs.py fills a Job through."""
    names = tuple(f.name for f in fields(Job))
    return names, tuple(_PAYLOAD_SLOT if n == "payload" else Job.__dict__[n] for n in names)
