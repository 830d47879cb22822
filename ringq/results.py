"""Results of acked jobs, kept in a companion queue ``<name>-results`` in the same directory.

A result is stored under its lease: a record of that queue whose id is ``~S.L~<job id>`` (S: the
job record's seq, which a relocated copy or a rerun does not share; L: the fencing token of the
lease that acks with it) and whose payload is the result (JSON, bytes or a numpy array: any
payload ringq stores).  It is written after the lease is checked and before the ack, so a crash
after the ack does not lose it; once the ack went in, a small record ``=<job id>`` holding
``[S, L]`` names the lease whose result is the job's.  ``result()`` reads S and L from the job
itself while it is retained (a DONE job's ``seq`` and ``lease_token``), else from that record: so
the result found is always that of the accepted ack, never one a holder stored before its lease
ran out and its ack was refused.  (The two prefixes keep the two kinds of record apart whatever
the job ids are.)

Every record is enqueued *delayed by its time to live*, so its available-at is its expiry: a stored
result is READY and not yet due, and once due it is expired.  Expired records are removed (leased
and acked) by the next ``ack(result=)`` or ``result()`` of any process, at most once a second per
process.  ``result(wait=)`` sleeps on the results queue's futex word, which every enqueue moves
(the same wake-up ``lease(wait=)`` uses).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .backend import RESULTS_SUFFIX, check_result_ttl, check_wait
from .errors import JobNotFoundError, NotLeasedError
from .job import Job, JobState

__all__ = [
    "Results",
    "ResultNotFoundError",
    "results_queue_name",
    "finished_without",
]

PRUNE_EVERY = 1.0  # seconds between removals of expired results by one process
PRUNE_BATCH = 256


class ResultNotFoundError(JobNotFoundError):
    """No result is stored for the job: not acked with a result (yet), or its result expired."""


def results_queue_name(name: str) -> str:
    """The companion queue's name.  Raises ValueError if it would exceed the 64-character limit."""
    out = f"{name}{RESULTS_SUFFIX}"
    if len(out) > 64:
        raise ValueError(f"queue names of at most 56 characters can keep results, not {name!r}")
    return out


def finished_without(find: Callable[[str], Job], results: Results, job_id: str) -> str | None:
    """Why no result can come for ``job_id`` (dead, cancelled, expired, acked without one), or
    None while one still may (not enqueued yet, ready, leased, retired); ``find`` is the queue's
    ``get``."""
    try:
        job = find(job_id)
    except JobNotFoundError:
        return None
    if job.state in (JobState.READY, JobState.LEASED):
        return None
    if job.state is JobState.DONE:
        found, _ = results.lookup(job_id)
        return None if found else "it was acked without a result, or its result expired"
    return f"it is {job.state.value}"


Lease = tuple[int, int]  # (the job record's seq, the lease's fencing token)


def lease_of(job: Job) -> Lease:
    """The lease a snapshot names: its record's seq and its (last) fencing token."""
    return job.seq, int(job.lease_token or 0)


def lease_record_id(job_id: str, lease: Lease) -> str:
    """The results queue's id for the result stored under ``lease`` of ``job_id``."""
    return f"~{lease[0]}.{lease[1]}~{job_id}"


def accepted_record_id(job_id: str) -> str:
    """The results queue's id for the record naming the lease whose ack of ``job_id`` went in."""
    return f"={job_id}"


class Results:
    """The results of one queue, for this process.  ``open_queue(name)`` opens a companion queue
    with the owning queue's settings; ``find(id)`` is the owning queue's ``get`` (a retained
    job's last lease names its result)."""

    def __init__(
        self, name: str, open_queue: Callable[[str], Any], find: Callable[[str], Job]
    ) -> None:
        self.owner = name  # the companion's name is checked at first use, not at open
        self._open_queue = open_queue
        self._find = find
        self._q: Any = None
        self._pruned = 0.0

    @property
    def queue(self) -> Any:
        if self._q is None:
            self._q = self._open_queue(results_queue_name(self.owner))
        return self._q

    def close(self) -> None:
        if self._q is not None:
            self._q.close()
            self._q = None

    def store(self, job_id: str, lease: Lease, result: Any, ttl: float) -> None:
        """Keep ``result`` for ``ttl`` seconds as that of ``lease`` of ``job_id``.  Raises
        SerializationError (nothing stored), ValueError for a bad ttl."""
        ttl = check_result_ttl(ttl)
        self.queue.enqueue(result, job_id=lease_record_id(job_id, lease), delay=ttl, max_attempts=1)
        self.prune()

    def ack(
        self,
        job_id: str,
        lease: Lease,
        by_id: bool,
        result: Any,
        ttl: float,
        ack: Callable[[], bool],
    ) -> None:
        """The steps of ``ack(job, result=)`` once ``lease`` of ``job_id`` was checked: ``result`` stored under it, ``ack()`` (the backend's ack: True if
        it went in, False for a repeat; it raises the refusal), then the record naming the lease
        whose ack went in.  ``by_id``: the ack named no token, so the lease it acked may be a
        later one than ``lease``; the result is stored under that one too."""
        self.store(job_id, lease, result, ttl)
        went_in = ack()
        if by_id:
            try:
                acked = lease_of(self._find(job_id))
            except JobNotFoundError:  # retired at once: finished, by this ack or another
                acked = lease
            if acked != lease:
                if not went_in:
                    return  # another call acked that later lease: its result is its own
                lease = acked
                self.store(job_id, lease, result, ttl)
        # It names the job's result once the job is no longer retained (until then the job's
        # own last lease does); a later run's accepted ack replaces it.
        self.queue.enqueue(
            list(lease),
            job_id=accepted_record_id(job_id),
            delay=check_result_ttl(ttl),
            max_attempts=1,
            replace=True,
        )

    def _live(self, record_id: str) -> tuple[bool, Any]:
        try:
            rec = self.queue.get(record_id)
        except JobNotFoundError:
            return False, None
        if rec.state is not JobState.READY or rec.available_at <= time.time():
            return False, None  # expired (due), or being removed
        return True, rec.payload

    def lookup(self, job_id: str) -> tuple[bool, Any]:
        """``(True, result)`` if a live result of the lease whose ack went in is stored, else
        ``(False, None)``."""
        try:
            job: Job | None = self._find(job_id)
        except JobNotFoundError:
            job = None
        if job is not None and job.state is JobState.DONE and job.lease_token:
            return self._live(lease_record_id(job_id, lease_of(job)))
        found, named = self._live(accepted_record_id(job_id))
        if found and isinstance(named, list) and len(named) == 2:
            return self._live(lease_record_id(job_id, (int(named[0]), int(named[1]))))
        return False, None

    def wait(
        self, job_id: str, wait: float | None, finished_without: Callable[[], str | None]
    ) -> Any:
        """The result of ``job_id``; blocks up to ``wait`` seconds for it (None, 0 or a negative
        number: not at all; as a lease's wait, backend.check_wait).

        ``finished_without()`` says why no result can come (the job is dead, cancelled, ...) or
        None; it is asked before sleeping and after the wait.  Raises ResultNotFoundError, and
        ValueError for a bad ``wait`` before anything is read or removed."""
        wait = check_wait(wait)
        self.prune()
        q = self.queue
        deadline = None if not wait or wait < 0 else time.monotonic() + wait
        while True:
            token = q.wake_token()
            found, value = self.lookup(job_id)
            if found:
                return value
            why = finished_without()
            if why is not None:
                raise ResultNotFoundError(f"no result for job {job_id!r}: {why}")
            left = 0.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise ResultNotFoundError(
                    f"no result for job {job_id!r}"
                    + (f" within {wait:g} s" if deadline is not None else "")
                    + " (not acked with a result yet, or its result expired)"
                )
            q.wait_for_wake(token, left)

    def prune(self) -> int:
        """Remove expired results (at most once per PRUNE_EVERY seconds); returns how many."""
        now = time.monotonic()
        if now - self._pruned < PRUNE_EVERY:
            return 0
        self._pruned = now
        q = self.queue
        n = 0
        while True:
            due = q.lease(PRUNE_BATCH, visibility_timeout=60)
            if not due:
                return n
            try:
                q.ack_many(due)
            except (NotLeasedError, JobNotFoundError):
                pass
            n += len(due)
