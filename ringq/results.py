"""Results of acked jobs, kept in a companion queue ``<name>-results`` in the same directory.

A result is a record of that queue whose job id is the job's id and whose payload is the result
(JSON, bytes or a numpy array: any payload ringq stores).  It is enqueued *delayed by its time to
live*, so its available-at is its expiry: a stored result is READY and not yet due, and once due
it is expired.  Expired results are removed (leased and acked) by the next ``ack(result=)`` or
``result()`` of any process, at most once a second per process.  ``result(wait=)`` sleeps on the
results queue's futex word, which every enqueue moves (the same wake-up ``lease(wait=)`` uses).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .backend import RESULTS_SUFFIX, check_result_ttl
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


class Results:
    """The results of one queue, for this process.  ``open_queue(name)`` opens a companion queue
    with the owning queue's settings; ``job_state(id)`` reads the owning queue's job state."""

    def __init__(self, name: str, open_queue: Callable[[str], Any]) -> None:
        self.owner = name  # the companion's name is checked at first use, not at open
        self._open_queue = open_queue
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

    def store(self, job_id: str, result: Any, ttl: float) -> None:
        """Keep ``result`` for ``ttl`` seconds.  The first result stored for an id is kept (a rerun
        of a job whose first holder stored a result and lost its lease adds nothing).  Raises
        SerializationError (nothing stored), ValueError for a bad ttl."""
        ttl = check_result_ttl(ttl)
        self.queue.enqueue(result, job_id=job_id, delay=ttl, max_attempts=1)
        self.prune()

    def lookup(self, job_id: str) -> tuple[bool, Any]:
        """``(True, result)`` if a live result is stored, else ``(False, None)``."""
        try:
            rec = self.queue.get(job_id)
        except JobNotFoundError:
            return False, None
        if rec.state is not JobState.READY or rec.available_at <= time.time():
            return False, None  # expired (due), or being removed
        return True, rec.payload

    def wait(
        self, job_id: str, wait: float | None, finished_without: Callable[[], str | None]
    ) -> Any:
        """The result of ``job_id``; blocks up to ``wait`` seconds for it (None or 0: not at all).

        ``finished_without()`` says why no result can come (the job is dead, cancelled, ...) or
        None; it is asked before sleeping and after the wait.  Raises ResultNotFoundError."""
        self.prune()
        q = self.queue
        deadline = None if not wait else time.monotonic() + wait
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
                    + (f" within {wait:g} s" if wait else "")
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
