"""The job snapshots of :mod:`ringq.aio` and their records in the engine queues.

A job of kind K is a record ``{"kind": K, "payload": ...}`` in the engine queue of K; a finished
job is a *result record* (the keys of ``RESULT_KEYS``) in the results queue, enqueued with the job's
id as its job id.  A result record repeats the payload only if it is small (``RESULT_PAYLOAD_MAX``),
so a job whose payload fits the record limit can always store a result of the same size; a larger
payload of a finished job is read from its job record while the engine retains that (None after).  This module finds jobs in those engine queues, turns their records into
:class:`Job` snapshots and builds result records; it works on open engine queues of either backend
and knows nothing about where they live.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, overload

from ringq import codec
from ringq.errors import JobNotFoundError
from ringq.job import Job as EngineJob
from ringq.job import JobState

__all__ = ["Job", "Status"]

log = logging.getLogger("ringq.aio")

PRUNED = object()  # what locate returns for a job that finished and was pruned
# The ids of gates (ringq/aio/gates.py): an aio job id never starts with it (submit refuses it).
GATE_PREFIX = "~after:"
NO_PAYLOAD = object()  # payload of a result record that does not repeat it (read the job record)
# Encoded payloads up to this many bytes are repeated in the result record, so get() returns them
# for as long as the result is retained.  A larger one is not: the result record then holds only the
# result and a few hundred bytes of fields, so any result as large as the payload fits too.
RESULT_PAYLOAD_MAX = 64 * 1024
UNFINISHED = (JobState.READY, JobState.LEASED, JobState.DEFERRED)
RESULT_KEYS = {
    "id",
    "kind",
    "status",
    "result",
    "error",
    "created_at",
    "finished_at",
    "attempts",
}


class Status(str, enum.Enum):
    """Where a job is.  ``RUNNING`` covers every unfinished job: queued, delayed, waiting for
    the jobs it depends on, running, or interrupted and awaiting a rerun."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one job; changing it changes nothing.

    Attributes:
        id: the job id (``submit``'s ``id=``, or 32 hex digits).
        kind: the handler kind it was submitted for.
        payload: the JSON value given to ``submit``.  For a finished job whose encoded payload
            is over ``RESULT_PAYLOAD_MAX`` (64 KiB) it is read from the job record, which the engine
            keeps for a while after the job finishes (on a directory until its segment is retired,
            on Redis a minute); after that it is None, though the result is kept.
        status: :class:`Status` when the snapshot was taken.
        result: the handler's return value (JSON) once DONE, else None.
        error: ``"ExceptionType: message"`` once FAILED, else None.
        created_at: when it was submitted (timezone-aware UTC).
        finished_at: when it finished (timezone-aware UTC), else None.
        attempts: times a handler was started for it (leases, counting ones lost to crashes).
        progress: the fraction in [0, 1] its running handler last reported with
            :meth:`ringq.aio.Queue.progress`, else None.
        depends_on: the ids of the jobs it was submitted to wait for (``submit(...,
            depends_on=)``), in the order given, or None.
    """

    id: str
    kind: str
    payload: Any
    status: Status
    result: Any = None
    error: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    attempts: int = 0
    progress: float | None = None
    depends_on: list[str] | None = None


Job.__module__ = Status.__module__ = "ringq.aio"  # their public home, as in reprs and pickles


CANCELLED_ERROR = "Cancelled: cancelled by Queue.cancel"


@overload
def utc(seconds: float) -> datetime: ...


@overload
def utc(seconds: None) -> None: ...


def utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def decode(ej: EngineJob, qname: str, prefix: str) -> tuple[str, Any]:
    """(kind, payload) of job record ``ej`` from the engine queue ``qname`` (``prefix + kind``).

    A record put there by other means (``ringq enqueue --queue <name>-j-<kind>``) that is not
    ``{"kind", "payload"}`` is the payload whole, of the kind its queue's name says."""
    rec = ej.payload
    if isinstance(rec, dict) and rec.keys() == {"kind", "payload"}:
        return rec["kind"], rec["payload"]
    return (qname[len(prefix) :] if qname.startswith(prefix) else qname), rec


def parents(ej: EngineJob) -> list[str] | None:
    """The aio parents of job record ``ej``: the jobs its gates stand for."""
    if ej.depends_on is None:
        return None
    return [g[len(GATE_PREFIX) :] if g.startswith(GATE_PREFIX) else g for g in ej.depends_on]


def unfinished(ej: EngineJob, kind: str, payload: Any) -> Job:
    """The RUNNING snapshot of a READY, DEFERRED or LEASED job record."""
    return Job(
        id=ej.id,
        kind=kind,
        payload=payload,
        status=Status.RUNNING,
        created_at=utc(ej.enqueued_at),
        attempts=ej.attempts,
        progress=ej.progress,
        depends_on=parents(ej),
    )


def cancelled(ej: EngineJob, kind: str, payload: Any) -> Job:
    """The FAILED snapshot of a job record cancelled (or expired) before it finished; one that a
    failed parent cancelled (the engine's error names the parent's gate) says which parent."""
    error = CANCELLED_ERROR
    why = ej.last_error or ""
    if why.startswith(f"parent job '{GATE_PREFIX}"):
        parent = why[len(f"parent job '{GATE_PREFIX}") :].rsplit("' ended", 1)[0]
        error = f"Cancelled: parent job {parent!r} failed"
    return Job(
        id=ej.id,
        kind=kind,
        payload=payload,
        status=Status.FAILED,
        error=error,
        created_at=utc(ej.enqueued_at),
        attempts=ej.attempts,
        depends_on=parents(ej),
    )


def gave_up(ej: EngineJob, kind: str, payload: Any) -> Job:
    """The FAILED snapshot of a job record the engine dead-lettered.  Only a record created outside
    aio (with its own ``max_attempts``) can be: its runs were lost (killed, closed) that many times."""
    return Job(
        id=ej.id,
        kind=kind,
        payload=payload,
        status=Status.FAILED,
        error=(
            f"GaveUp: started {ej.attempts} times without finishing (the record allowed "
            f"max_attempts={ej.max_attempts}); last: {ej.last_error}"
        ),
        created_at=utc(ej.enqueued_at),
        attempts=ej.attempts,
    )


def from_result(rec: Any, job_id: str, where: str) -> Job | None:
    """The finished job stored in result record ``rec``; None (logged) if it is not one."""
    if not isinstance(rec, dict) or not RESULT_KEYS <= rec.keys():
        log.error("result record %r in %s is not an aio result; ignored", job_id, where)
        return None
    return Job(
        id=rec["id"],
        kind=rec["kind"],
        payload=rec.get("payload", NO_PAYLOAD),
        status=Status(rec["status"]),
        result=rec["result"],
        error=rec["error"],
        created_at=utc(rec["created_at"]),
        finished_at=utc(rec["finished_at"]),
        attempts=rec["attempts"],
        depends_on=rec.get("depends_on"),
    )


def result_record(
    ej: EngineJob, job: Job, status: Status, result: Any, error: str | None
) -> dict[str, Any]:
    """The result record of ``job`` (leased as ``ej``) finishing now with ``status``; with the
    payload only if its encoding is at most ``RESULT_PAYLOAD_MAX`` bytes."""
    rec = {
        "id": job.id,
        "kind": job.kind,
        "status": status.value,
        "result": result,
        "error": error,
        "created_at": ej.enqueued_at,
        "finished_at": time.time(),
        "attempts": ej.attempts,
    }
    if job.depends_on is not None:
        rec["depends_on"] = job.depends_on
    if len(codec.encode(job.payload)[1]) <= RESULT_PAYLOAD_MAX:
        rec["payload"] = job.payload
    return rec


def find_result(results: Any, job_id: str) -> Job | object | None:
    """The finished job ``job_id`` from engine queue ``results``; PRUNED if retention removed it
    (its record is DONE); None if it has no result."""
    try:
        rj = results.get(job_id)
    except JobNotFoundError:
        return None
    if rj.state not in UNFINISHED:
        return PRUNED
    return from_result(rj.payload, job_id, results.name) or PRUNED


def locate(
    results: Any, kind_queues: Callable[[], list[Any]], job_id: str, prefix: str
) -> Job | object | None:
    """Job ``job_id`` as a snapshot, PRUNED if it finished and was pruned, None if unknown.
    ``kind_queues()`` lists the open job queues, named ``prefix + kind``; it is called only if
    the job has no result."""
    found = find_result(results, job_id)
    if isinstance(found, Job):
        return with_payload(found, kind_queues() if found.payload is NO_PAYLOAD else [], prefix)
    if found is not None:
        return found
    for q in kind_queues():
        try:
            ej = q.get(job_id)
        except JobNotFoundError:
            continue
        if ej.state in UNFINISHED:
            return unfinished(ej, *decode(ej, q.name, prefix))
        if ej.state in (JobState.CANCELLED, JobState.EXPIRED):
            return cancelled(ej, *decode(ej, q.name, prefix))
        if ej.state is JobState.DEAD:
            return gave_up(ej, *decode(ej, q.name, prefix))
        # DONE: its result was written first; read again (it may have been written just now).
        found = find_result(results, job_id) or PRUNED
        return with_payload(found, [q], prefix) if isinstance(found, Job) else found
    return None


def with_payload(job: Job, kind_queues: list[Any], prefix: str) -> Job:
    """``job`` (from a result record) with its payload: the record's own, else that of its job
    record in one of ``kind_queues`` if retained, else None."""
    if job.payload is not NO_PAYLOAD:
        return job
    for q in kind_queues:
        try:
            ej = q.get(job.id)
        except JobNotFoundError:
            continue
        kind, payload = decode(ej, q.name, prefix)
        if kind == job.kind:
            return dataclasses.replace(job, payload=payload)
    return dataclasses.replace(job, payload=None)


def unfinished_jobs(results: Any, kind_queues: list[Any], prefix: str) -> list[Job]:
    """Every unfinished job in ``kind_queues`` (READY, DEFERRED or LEASED, with no result; not
    the gates of ringq/aio/gates.py), oldest first."""
    out = []
    for q in kind_queues:
        for state in UNFINISHED:
            for ej in q.list_jobs(state):
                if ej.id.startswith(GATE_PREFIX):
                    continue
                if not isinstance(find_result(results, ej.id), Job):
                    out.append(unfinished(ej, *decode(ej, q.name, prefix)))
    out.sort(key=lambda j: (j.created_at, j.id))
    return out
