"""The interface both queues satisfy, and what they share: defaults, limits, argument rules, counts.

:class:`QueueBackend` is the queue API as the Worker, ``ringq.aio``, the command line and the
dashboard use it: the directory-backed :class:`ringq.Queue` (ringq/local/queue.py) and the
Redis-backed :class:`ringq.redis.queue.RedisQueue` both satisfy it (checked by mypy, and by
tests/test_conformance.py running one suite on both).  What only one of them can do is named in
``features``; a method of such a feature exists on both and says so where it has no meaning.

Everything here is the queues' common ground, defined once: neither backend imports the other.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable

from ringq.backoff import BackoffPolicy
from ringq.job import Job, JobState

__all__ = [
    "QueueBackend",
    "QueueStats",
    "CompactionResult",
    "SearchPage",
    "ascii_contains",
    "SEARCH_STATES",
    "NO_RESULT",
    "DEFAULT_VISIBILITY_TIMEOUT",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RESULT_TTL",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_DELAY",
    "FEATURE_SCHEDULES",
    "FEATURE_LIMITS",
    "FEATURE_COMPACT",
    "QUEUE_NAME_RE",
    "REDIS_SCHEMES",
    "is_url",
    "redact_url",
    "check_queue_name",
    "check_fraction",
    "due_delay",
    "expiry_ms",
    "check_attempts",
    "timeout_ms",
    "MAX_TIMEOUT",
]

DEFAULT_VISIBILITY_TIMEOUT = 30.0  # seconds a lease lasts unless extended
DEFAULT_MAX_ATTEMPTS = 5  # leases before a job moves to the dead-letter queue
DEFAULT_RESULT_TTL = 3600.0  # seconds a result stored by ack(result=) is kept
MAX_ATTEMPTS_LIMIT = 0xFFFF  # the local record header's max_attempts field is 16-bit
MAX_DELAY = 86400 * 365 * 33  # seconds: the longest delay (and expiry, and lease) of either queue
MAX_TIMEOUT = 0xFFFFFFFF / 1000  # seconds: a job's hard timeout is stored as u32 milliseconds

# Optional features (``QueueBackend.features``):
FEATURE_SCHEDULES = "schedules"  # schedule(), schedules(), unschedule(); run_schedules() fires them
FEATURE_LIMITS = "limits"  # limit(), limits(): concurrency caps and rate limits per key
FEATURE_COMPACT = "compact"  # compact(), discard_dead(): giving back disk space


class _NoResult:
    """The ``result`` of an ack that stores none (None is a result: JSON null)."""

    def __repr__(self) -> str:
        return "NO_RESULT"


NO_RESULT: Any = _NoResult()


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def is_url(target: str | os.PathLike[str]) -> TypeGuard[str]:
    """True if ``target`` names a Redis server rather than a directory."""
    return isinstance(target, str) and target.startswith(REDIS_SCHEMES)


def redact_url(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


QUEUE_NAME_RE = re.compile(
    r"^[A-Za-z0-9_-]{1,64}$"
)  # file names of a queue parse without ambiguity


def check_queue_name(name: object) -> str:
    """``name`` if it is a valid queue name (``[A-Za-z0-9_-]{1,64}``); ValueError otherwise."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise ValueError(f"queue name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    return name


def check_fraction(fraction: float) -> float:
    """A progress report's fraction as a float in [0, 1]; ValueError otherwise."""
    f = float(fraction)
    if not math.isfinite(f) or not 0.0 <= f <= 1.0:
        raise ValueError(f"progress must be a fraction in [0, 1], got {fraction!r}")
    return f


def due_delay(delay: Any) -> Any:
    """An enqueue's ``delay`` as stored: a negative number of seconds means "due now" (nobroker's
    rule, so ``run_at - time.time()`` works once ``run_at`` passed); anything else unchanged, for
    the caller's range check (NaN and values past the limit stay errors)."""
    if isinstance(delay, (int, float)) and not isinstance(delay, bool) and -math.inf < delay < 0:
        return 0.0
    return delay


def expiry_ms(expires_in: float | None, expires_at: float | None) -> int | None:
    """The absolute expiry (ms since the Unix epoch) of ``expires_in``/``expires_at``, or None.

    Raises ValueError for both given, a negative or non-finite value, or an ``expires_in`` past
    MAX_DELAY."""
    if expires_in is not None and expires_at is not None:
        raise ValueError("give expires_in or expires_at, not both")
    if expires_in is not None:
        if not 0 <= expires_in <= MAX_DELAY:
            raise ValueError(
                f"expires_in must be a finite number of seconds from 0 to about 33 years, got {expires_in!r}"
            )
        return int(time.time() * 1000 + expires_in * 1000)
    if expires_at is not None:
        if not 0 <= expires_at < 2**62 / 1000:
            raise ValueError(f"expires_at must be seconds since the Unix epoch, got {expires_at!r}")
        return int(expires_at * 1000)
    return None


def timeout_ms(timeout: float | None) -> int | None:
    """A hard timeout (``enqueue(..., timeout=)``, ``Worker(timeout=)``) in milliseconds (at least
    1), or None for none.  Raises ValueError unless it is a number of seconds in
    ``(0, MAX_TIMEOUT]`` (about 49 days)."""
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        raise ValueError(
            f"timeout must be a number of seconds > 0 and at most {MAX_TIMEOUT:.0f}, got {timeout!r}"
        )
    return min(0xFFFFFFFF, max(1, int(round(timeout * 1000))))


def check_attempts(n: int) -> None:
    """Raise ValueError unless ``n`` is an int in ``[1, MAX_ATTEMPTS_LIMIT]`` (a bool is refused)."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"max_attempts must be an int in [1, {MAX_ATTEMPTS_LIMIT}], got {n!r}")


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of retained jobs by state, and cumulative counters since the queue was created.

    ``ready`` .. ``corrupt``, ``cancelled`` and ``expired`` count the jobs retained now (the local
    queue reads each segment's from one copy of its state table); ``done`` counts neither cancelled
    nor expired jobs, ``total`` includes them.  ``delayed`` jobs are READY with a future
    ``available_at``; ``total`` is the sum of the job states.  ``corrupt`` counts records
    quarantined as damaged (not included in ``total``; always 0 on Redis).  Finished jobs stay
    counted until they are dropped (the local queue's segment retires, Redis's ``retain_done``
    passes), so ``done`` and ``total`` fall then.  A lease that expired or whose holder died
    counts as ``ready`` (``dead`` if its attempts are used up), as reclaiming it will make it.

    ``enqueued_total``, ``acked_total`` and ``dead_lettered_total`` never fall: jobs enqueued
    (requeues and relocation copies not counted), acks, and moves to the dead-letter queue, since
    the queue was created, by all processes.  The local queue keeps them in its control file and
    bumps them right after the state change they count: a process killed between the two leaves
    a counter one short (never over); a power loss may lose the increments since the control page
    was last synced (at each segment rotation); a control file rebuilt from the segments restarts
    them at 0.
    """

    ready: int = 0
    delayed: int = 0
    leased: int = 0
    done: int = 0
    dead: int = 0
    total: int = 0
    corrupt: int = 0
    enqueued_total: int = 0
    acked_total: int = 0
    dead_lettered_total: int = 0
    cancelled: int = 0
    expired: int = 0

    def to_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What ``compact()`` gave back (nobroker's type, same fields).

    ``bytes_before``/``bytes_after``: bytes of the queue's segment files; ``jobs_kept``: unfinished
    jobs (ready, delayed, leased, dead); ``jobs_dropped``: finished jobs whose records went with
    their segments.
    """

    bytes_before: int
    bytes_after: int
    jobs_kept: int
    jobs_dropped: int

    @property
    def bytes_reclaimed(self) -> int:
        return self.bytes_before - self.bytes_after

    def describe(self) -> str:
        """One line for people: ``compacted B -> A bytes (P% reclaimed), kept K jobs, dropped D completed``."""
        pct = 100.0 * self.bytes_reclaimed / self.bytes_before if self.bytes_before else 0.0
        return (
            f"compacted {self.bytes_before} -> {self.bytes_after} bytes ({pct:.1f}% reclaimed), "
            f"kept {self.jobs_kept} jobs, dropped {self.jobs_dropped} completed"
        )


# The states a search (and ``list_jobs``) takes: a JobState's value, or "delayed" (READY, not due).
SEARCH_STATES = ("ready", "delayed", "leased", "done", "dead", "cancelled", "expired")

_ASCII_LOWER = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz")


def ascii_contains(text: str, needle: str) -> bool:
    """True if ``needle`` is a substring of ``text``, ASCII letters compared without regard to
    case and every other character exactly: the rule of a search by error text (the local engine
    applies it in C, csrc/search.c)."""
    return needle.encode("utf-8").translate(_ASCII_LOWER) in text.encode("utf-8").translate(
        _ASCII_LOWER
    )


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of a job search (``search()``): ``jobs`` in enqueue order, ``total`` matches in
    the whole queue, ``next`` the cursor to pass as ``after`` for the following page (None: this
    was the last)."""

    jobs: list[Job]
    total: int
    next: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": [j.to_dict() for j in self.jobs], "total": self.total, "next": self.next}


@runtime_checkable
class QueueBackend(Protocol):
    """The queue API common to both backends (nobroker's names).  Each method's full contract is
    on :class:`ringq.Queue`; the Redis queue's differences are in docs/scale-out.md."""

    name: str
    visibility_timeout: float
    max_attempts: int
    backoff: BackoffPolicy

    @property
    def features(self) -> frozenset[str]:
        """The optional features this queue has (``FEATURE_*``)."""
        ...

    @property
    def location(self) -> str:
        """Where the queue lives, for people and messages: its directory, or the Redis URL
        without its password."""
        ...

    @property
    def closed(self) -> bool: ...

    def reopen_options(self) -> dict[str, Any]:
        """Keyword arguments that open this queue again (``ringq.connect(location, name, **...)``),
        as a Worker's child processes do."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> QueueBackend: ...

    def __exit__(self, *exc: object) -> None: ...

    def __len__(self) -> int: ...

    def enqueue(
        self,
        payload: Any,
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_attempts: int | None = None,
        job_id: str | None = None,
        key: str | None = None,
        unique_for: float | None = None,
        expires_in: float | None = None,
        expires_at: float | None = None,
        timeout: float | None = None,
    ) -> Job: ...

    def enqueue_many(
        self,
        payloads: Sequence[Any],
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_attempts: int | None = None,
        job_ids: Sequence[str] | None = None,
        key: str | None = None,
        expires_in: float | None = None,
        expires_at: float | None = None,
        timeout: float | None = None,
    ) -> list[Job]: ...

    def lease(
        self,
        count: int = 1,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        detach: bool = False,
    ) -> list[Job]: ...

    def lease_one(
        self,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        detach: bool = False,
    ) -> Job | None: ...

    def ack(
        self, job: Job | str, *, result: Any = NO_RESULT, result_ttl: float = DEFAULT_RESULT_TTL
    ) -> None: ...

    def ack_many(self, jobs: Iterable[Job | str]) -> None: ...

    def nack(
        self, job: Job | str, *, error: str | None = None, delay: float | None = None
    ) -> Job: ...

    def extend(self, job: Job | str, seconds: float) -> Job: ...

    def get(self, job_id: str) -> Job: ...

    def list_jobs(
        self, state: JobState | str | None = None, *, limit: int | None = None
    ) -> list[Job]: ...

    def search(
        self,
        *,
        state: str | None = None,
        key: str | None = None,
        priority: int | None = None,
        job_id: str | None = None,
        error: str | None = None,
        after: str | None = None,
        limit: int | None = 50,
    ) -> SearchPage: ...

    def dlq(self, *, limit: int | None = None) -> list[Job]: ...

    def requeue_dead(self, job_id: str | None = None) -> int: ...

    def purge(self) -> int: ...

    def stats(self) -> QueueStats: ...

    def import_jobs(self, jobs: Sequence[Job], *, source: str | None = None) -> int: ...

    def cancel(self, job: Job | str) -> Job: ...

    def pause(self, key: str | None = None) -> None: ...

    def resume(self, key: str | None = None) -> None: ...

    def paused(self) -> dict[str, Any]: ...

    def progress(self, job: Job | str, fraction: float, message: str | None = None) -> None: ...

    def result(self, job_id: str | Job, *, wait: float | None = None) -> Any: ...

    def trace_first_attempt(self, job: Job | str, traceparent: str) -> None: ...

    def first_attempt_trace(self, job: Job | str) -> str | None: ...

    def wake_token(self) -> int: ...

    def wait_for_wake(self, token: int, timeout: float) -> None: ...

    def wake(self) -> None: ...

    def run_schedules(self) -> list[Job]:
        """Enqueue the jobs of due periodic jobs; ``[]`` on a queue without FEATURE_SCHEDULES."""
        ...

    def next_schedule_fire(self) -> float | None:
        """Seconds until the next periodic job is due; None without any (or the feature)."""
        ...
