"""Dependencies between :mod:`ringq.aio` jobs: ``submit(..., depends_on=[...])``.

The jobs of each kind live in their own engine queue (ringq/aio/queue.py), and an aio job that
*failed* is DONE in its engine queue (its result record says FAILED), so the engine's
dependencies cannot name an aio parent directly.  Each parent P gets instead a *gate* in the
dependent's engine queue: a job with id ``GATE_PREFIX + P`` and record ``{"gate": P}`` (one per
parent and queue, shared by every dependent of P there, enqueued idempotently at the highest
priority), and the dependent is enqueued there with ``depends_on`` its gates (and
``allow_failure``), so the engine releases or cancels it exactly once.

A gate is leased like any job of its kind and settled at once, never run by a handler:

* P finished DONE (or was pruned, or is unknown): the gate is acked, DONE;
* P FAILED (an error, given up, cancelled, or itself cancelled by a failed parent): the gate
  is cancelled, so the engine cancels the dependent unless ``allow_failure``;
* P still running: the gate is nacked to look again after :func:`poll_delay`.

A process whose job finishes (or that cancels one) *nudges* the gates of that job in the kind
queues where it made or settled gates: they are rescheduled to now, so a dependent in the same
process starts without waiting for a poll.  A dependent whose parent finished in another
process starts within the poll delay (at most ``POLL_MAX`` seconds).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ringq.backend import check_depends_on
from ringq.errors import JobNotFoundError, JobNotWaitingError, NotLeasedError, RingqError
from ringq.job import Job as EngineJob

from .job import GATE_PREFIX, Job, Status

__all__ = ["GATE_PREFIX", "parent_ids", "gate_record", "parent_of", "settle", "nudge"]

GATE_PRIORITY = 2**31 - 1  # settled in an instant: leased before the kind's other jobs
POLL_FIRST = 0.05  # seconds before a gate whose parent runs looks again, doubling per look
POLL_MAX = 5.0  # seconds: the longest wait between two looks


def parent_ids(depends_on: Any, job_id: str) -> list[str] | None:
    """The parent ids of ``submit(..., depends_on=)``: aio :class:`Job` snapshots or ids, as
    :func:`ringq.backend.check_depends_on` checks them (TypeError, ValueError)."""
    if depends_on is None:
        return None
    if isinstance(depends_on, (str, Job)):
        depends_on = [depends_on]
    if not isinstance(depends_on, Iterable):
        raise TypeError(f"depends_on must be a list of jobs or job ids, got {depends_on!r}")
    return check_depends_on([p.id if isinstance(p, Job) else p for p in depends_on], job_id)


def gate_record(parent: str) -> dict[str, str]:
    return {"gate": parent}


def parent_of(ej: EngineJob) -> str | None:
    """The parent whose gate ``ej`` is, or None for an ordinary job record."""
    rec = ej.payload
    if ej.id.startswith(GATE_PREFIX) and isinstance(rec, dict) and rec.keys() == {"gate"}:
        return str(rec["gate"])
    return None


def poll_delay(attempts: int) -> float:
    """Seconds before the ``attempts``-th look at a running parent is followed by the next."""
    return min(POLL_MAX, POLL_FIRST * 2.0 ** min(attempts - 1, 16))


def settle(q: Any, ej: EngineJob, parent: Job | object | None) -> None:
    """Settle the gate ``ej`` leased from engine queue ``q``: ``parent`` is the parent as
    ``locate`` found it (a snapshot, PRUNED, or None)."""
    try:
        if isinstance(parent, Job) and parent.status is Status.RUNNING:
            q.nack(ej, error="parent still running", delay=poll_delay(ej.attempts))
            return
        if isinstance(parent, Job) and parent.status is Status.FAILED:
            q.cancel(ej)  # cancel-requested: the ack ends it CANCELLED
        q.ack(ej)
    except (NotLeasedError, JobNotFoundError):
        pass  # its lease ran out meanwhile: whoever leases it again settles it


def nudge(queues: Iterable[Any], parent: str) -> None:
    """Have the gates of ``parent`` in ``queues`` look at it now (see the module docstring)."""
    for q in queues:
        try:
            q.reschedule(GATE_PREFIX + parent, delay=0)
        except (JobNotFoundError, JobNotWaitingError):
            continue  # no gate there, or it is being settled or was settled
        except RingqError:
            continue  # a lost connection: the gate's next look finds the parent finished
