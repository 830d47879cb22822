"""The interface both queues satisfy, and what they share: defaults, limits, argument rules, counts.

:class:`QueueBackend` is the queue API as the Worker, ``ringq.aio``, the command line and the
dashboard use it: the directory-backed :class:`ringq.Queue` (ringq/local/queue.py) and the
Redis-backed :class:`ringq.redis.queue.RedisQueue` both satisfy it (checked by mypy, and by
tests/test_conformance.py running one suite on both).  What only one of them can do is named in
``features``: the interface's ``run_schedules`` and ``next_schedule_fire`` exist on both (and do
nothing where there are no schedules); the other methods of a feature (``schedule``, ``limit``,
``compact``, ...) are the local queue's alone.

Everything here is the queues' common ground, defined once: neither backend imports the other.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, overload, runtime_checkable

from ringq.backoff import BackoffPolicy
from ringq.job import Job, JobState

__all__ = [
    "QueueBackend",
    "Stop",
    "check_consume",
    "stream_leases",
    "handle_stream",
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
    "MAX_RESULT_TTL",
    "PRIORITY_LIMIT",
    "FEATURE_SCHEDULES",
    "FEATURE_LIMITS",
    "FEATURE_COMPACT",
    "QUEUE_NAME_RE",
    "RESULTS_SUFFIX",
    "reserved_for_results",
    "refuse_reserved",
    "REDIS_SCHEMES",
    "is_url",
    "redact_url",
    "check_queue_name",
    "check_fraction",
    "check_progress",
    "check_wait",
    "check_lock_timeout",
    "check_mode",
    "check_payloads",
    "check_job_ids",
    "check_job_refs",
    "due_delay",
    "check_priority",
    "check_delay",
    "check_retry_delay",
    "check_lease_args",
    "MIN_LEASE",
    "check_visibility_timeout",
    "check_extension",
    "check_limit",
    "check_port",
    "check_job_ref",
    "check_pid",
    "check_stopped_child",
    "check_result_ttl",
    "expiry_ms",
    "check_attempts",
    "as_float",
    "as_int",
    "timeout_ms",
    "MAX_TIMEOUT",
    "MAX_PARENTS",
    "check_depends_on",
    "check_allow_failure",
    "check_replace",
    "check_reschedule",
]

DEFAULT_VISIBILITY_TIMEOUT = 30.0  # seconds a lease lasts unless extended
DEFAULT_MAX_ATTEMPTS = 5  # leases before a job moves to the dead-letter queue
DEFAULT_RESULT_TTL = 3600.0  # seconds a result stored by ack(result=) is kept
MAX_ATTEMPTS_LIMIT = 0xFFFF  # the local record header's max_attempts field is 16-bit
PRIORITY_LIMIT = 2**31  # a priority is a signed 32-bit int: -PRIORITY_LIMIT <= p < PRIORITY_LIMIT
MAX_DELAY = 86400 * 365 * 33  # seconds: the longest delay (and expiry, and lease) of either queue
MAX_TIMEOUT = 0xFFFFFFFF / 1000  # seconds: a job's hard timeout is stored as u32 milliseconds
MAX_PARENTS = 100_000  # most jobs one job may depend on (``enqueue(..., depends_on=)``)

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


RESULTS_SUFFIX = "-results"  # the companion queue holding queue X's results is X-results


def reserved_for_results(name: str, auto_ids: bool) -> bool:
    """True if queue ``name``, opened with ``auto_ids``, is a results queue used as a job queue:
    enqueues into it are refused (its jobs would be taken for expired results and removed).
    The results store opens it with ``auto_ids=False``."""
    return auto_ids and name.endswith(RESULTS_SUFFIX)


def refuse_reserved(name: str) -> None:
    raise ValueError(
        f"queue {name!r} holds the results of queue {name[: -len(RESULTS_SUFFIX)]!r} (names ending in "
        f"{RESULTS_SUFFIX!r} are kept for results): choose another name for a job queue; reads work as usual"
    )


QUEUE_NAME_RE = re.compile(
    r"^[A-Za-z0-9_-]{1,64}$"
)  # file names of a queue parse without ambiguity


def check_queue_name(name: object) -> str:
    """``name`` if it is a valid queue name (``[A-Za-z0-9_-]{1,64}``); ValueError otherwise."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise ValueError(f"queue name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    return name


def check_fraction(fraction: object) -> float:
    """A progress report's fraction as a float in [0, 1]: a real number (an int, a float, a
    numpy float; not a bool, not a str), not NaN.  ValueError otherwise."""
    f = as_float(fraction)
    if not 0.0 <= f <= 1.0:  # False for NaN
        raise ValueError(f"progress must be a number from 0 to 1, got {fraction!r}")
    return f


def check_progress(fraction: object, message: object) -> tuple[float, str | None]:
    """``(fraction, message)`` of a progress report: :func:`check_fraction`'s fraction, and a
    message that is a str or None (TypeError otherwise)."""
    f = check_fraction(fraction)
    if message is not None and not isinstance(message, str):
        raise TypeError(
            f"a progress message is a str or None, got {type(message).__name__} {message!r}"
        )
    return f, message


def due_delay(delay: Any) -> Any:
    """An enqueue's ``delay`` as stored: a negative number of seconds means "due now" (nobroker's
    rule, so ``run_at - time.time()`` works once ``run_at`` passed); anything else unchanged, for
    the caller's range check (NaN and values past the limit stay errors)."""
    if -math.inf < as_float(delay) < 0:
        return 0.0
    return delay


def expiry_ms(expires_in: float | None, expires_at: float | None) -> int | None:
    """The absolute expiry (ms since the Unix epoch) of ``expires_in``/``expires_at``, or None.

    Raises ValueError for both given, a negative or non-finite value, or an ``expires_in`` past
    MAX_DELAY."""
    if expires_in is not None and expires_at is not None:
        raise ValueError("give expires_in or expires_at, not both")
    if expires_in is not None:
        if not 0 <= as_float(expires_in) <= MAX_DELAY:
            raise ValueError(
                f"expires_in must be a finite number of seconds from 0 to about 33 years, got {expires_in!r}"
            )
        return int(time.time() * 1000 + float(expires_in) * 1000)  # float: never numpy float32
    if expires_at is not None:
        if not 0 <= as_float(expires_at) < 2**62 / 1000:
            raise ValueError(f"expires_at must be seconds since the Unix epoch, got {expires_at!r}")
        return int(float(expires_at) * 1000)
    return None


def as_int(x: object) -> int | None:
    """``x`` as an int if it is an integer -- an int, a numpy integer, any ``numbers.Integral``
    -- but not a bool; None otherwise."""
    if x.__class__ is int:
        return x
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        return None
    try:
        return int(x)
    except TypeError:  # numpy.timedelta64 calls itself Integral, and is no count
        return None


def as_float(x: object) -> float:
    """``x`` as a float if it is a real number (an int, a float, a numpy number, a Fraction; not
    a bool; an int too large for a float is an infinity), else NaN, which every range check
    refuses.  Ranges are compared as floats:
    a numpy float16 or float32 compared with a limit would first cast the limit to its own width
    (with an overflow warning, and the wrong answer)."""
    if not isinstance(x, numbers.Real) or isinstance(x, bool):
        return math.nan
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf  # type: ignore[operator]
    except TypeError:  # numpy.timedelta64 calls itself Real, and is no number of seconds
        return math.nan


def check_priority(priority: object) -> int:
    """``priority`` as an int if it is a signed 32-bit integer (an int or a numpy integer, not a
    bool); ValueError otherwise."""
    if priority.__class__ is not int:
        n = as_int(priority)
        if n is None:
            raise ValueError(f"priority must be a 32-bit signed int, got {priority!r}")
        priority = n
    if not -PRIORITY_LIMIT <= priority < PRIORITY_LIMIT:
        raise ValueError(f"priority must be a 32-bit signed int, got {priority!r}")
    return priority


def check_delay(delay: object) -> float:
    """An enqueue's delay in seconds, as stored (a negative one means now: :func:`due_delay`);
    ValueError unless it is a number from 0 to MAX_DELAY."""
    d = as_float(due_delay(delay))
    if not 0 <= d <= MAX_DELAY:
        raise ValueError(f"delay must be between 0 and about 33 years (in seconds), got {delay!r}")
    return d


def check_retry_delay(delay: object) -> float | None:
    """A nack's ``delay`` (None: the backoff policy's); ValueError unless 0 to MAX_DELAY seconds."""
    if delay is None:
        return None
    d = as_float(delay)
    if not 0 <= d <= MAX_DELAY:
        raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
    return d


def check_lease_args(
    count: object, wait: object, visibility_timeout: object, detach: object = False
) -> tuple[int, float | None, float]:
    """``(count, wait, visibility_timeout)`` of a lease call, checked before anything is leased.

    Raises ValueError: count not an int >= 1 (a bool is refused), wait not as
    :func:`check_wait` takes it, visibility timeout not as :func:`check_visibility_timeout`
    takes it, detach not a bool."""
    n = as_int(count)
    if n is None or n < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    if detach is not True and detach is not False:
        raise ValueError(f"detach must be True or False, got {detach!r}")
    wait = check_wait(wait)
    vt = check_visibility_timeout(visibility_timeout)
    return n, wait, vt


def check_wait(wait: object) -> float | None:
    """A blocking call's ``wait`` (``lease``, ``consume``, ``result``): None, or a number of
    seconds as a float (an int or a float, not a bool; inf waits as long as it takes, 0 or a
    negative number not at all).  ValueError for anything else (NaN, a bool, a str)."""
    if wait is None:
        return None
    v = as_float(wait)  # an int too large for a float: as long as it takes
    if v != v:
        raise ValueError(f"wait must be a number of seconds or None, got {wait!r}")
    return v


MIN_LEASE = 0.001  # seconds: lease deadlines are kept in milliseconds


def check_visibility_timeout(vt: object) -> float:
    """A visibility timeout in seconds: ValueError unless from MIN_LEASE (1 ms, the resolution
    of a lease deadline: a shorter one would have run out when it was taken) to MAX_DELAY."""
    v = as_float(vt)
    if not MIN_LEASE <= v <= MAX_DELAY:
        raise ValueError(
            f"visibility_timeout must be a number of seconds from {MIN_LEASE:g} to {MAX_DELAY:.0f} "
            f"(about 33 years), got {vt!r}"
        )
    return v


def check_extension(seconds: object) -> float:
    """An extend's seconds: ValueError unless from MIN_LEASE to MAX_DELAY."""
    v = as_float(seconds)
    if not MIN_LEASE <= v <= MAX_DELAY:
        raise ValueError(
            f"seconds must be a number from {MIN_LEASE:g} to {MAX_DELAY:.0f} (about 33 years), "
            f"got {seconds!r}"
        )
    return v


def check_count(n: object, what: str, low: int = 0, high: int | None = None) -> int:
    """An int >= ``low`` and at most ``high`` if given (a numpy integer too; not a bool), as an
    int; ValueError naming ``what`` otherwise."""
    k = as_int(n)
    if k is None or k < low or (high is not None and k > high):
        most = "" if high is None else f" and <= {high}"
        raise ValueError(f"{what} must be an int >= {low}{most}, got {n!r}")
    return k


def check_seconds(x: object, what: str, *, zero: bool = False) -> float:
    """``x`` seconds as a float: a number (an int, a float, a numpy number; not a bool) above 0
    -- at least 0 with ``zero`` -- and at most MAX_DELAY (about 33 years; a thread sleeps that
    long at most).  ValueError naming ``what`` otherwise (NaN, inf, a str, None)."""
    v = as_float(x)
    if not ((0 <= v) if zero else (0 < v)) or not v <= MAX_DELAY:
        raise ValueError(
            f"{what} must be a number of seconds {'>= 0' if zero else '> 0'} and at most "
            f"{MAX_DELAY:.0f}, got {x!r}"
        )
    return v


def check_limit(limit: object) -> int | None:
    """A listing's ``limit``: None or an int >= 0 (not a bool); ValueError otherwise."""
    if limit is None:
        return None
    n = as_int(limit)
    if n is None or n < 0:
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
    return n


def check_port(port: object, what: str = "port") -> int:
    """A TCP port to listen on: an int 0 (any free one) to 65535, not a bool; ValueError naming
    ``what`` otherwise."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{what} must be a TCP port 0..65535, got {port!r}")
    return port


def check_job_ref(job: object) -> None:
    """TypeError unless ``job`` is a :class:`Job` or a job id (a str)."""
    if not isinstance(job, (Job, str)):
        raise TypeError(f"expected a Job or a job id (str), got {type(job).__name__} {job!r}")


PID_MAX = 1 << 22  # Linux's largest process id (PID_MAX_LIMIT on 64-bit)


def check_pid(pid: object) -> int:
    """The pid of another process than this one: an int in [1, PID_MAX], not a bool; ValueError
    otherwise."""
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 <= pid <= PID_MAX:
        raise ValueError(f"pid must be a process id (an int in [1, {PID_MAX}]), got {pid!r}")
    if pid == os.getpid():
        raise ValueError(f"pid must be another process's, got this process's own ({pid})")
    return pid


def check_stopped_child(pid: object) -> int:
    """The pid (as :func:`check_pid`) of a stopped child of this process, the only process whose
    leases may be given back (kill_and_give_back); ValueError otherwise."""
    pid = check_pid(pid)
    if not _stopped_child(pid):
        raise ValueError(
            f"process {pid} is not a stopped child of this process: the leases of any other "
            "process may still be used, and are not given back"
        )
    return pid


def _stopped_child(pid: int) -> bool:
    """True if process ``pid`` is a child of this process and stopped (SIGSTOP, or stopped by a
    tracer), by ``/proc/<pid>/stat``; False when that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return False
    rest = text[text.rfind(")") + 1 :].split()  # the command name may hold spaces and parens
    return len(rest) >= 2 and rest[0] in ("T", "t") and rest[1] == str(os.getpid())


MAX_RESULT_TTL = 86400 * 366 * 30  # seconds a result may be kept: under 30 years


def check_result_ttl(ttl: object) -> float:
    """A result's time to live in seconds: a number (not a bool) above 0 and below
    MAX_RESULT_TTL (30 years; a result is kept as a record delayed by its time to live, so
    there is no "forever").  ValueError otherwise, inf and NaN included."""
    v = as_float(ttl)
    if not 0 < v < MAX_RESULT_TTL:
        raise ValueError(
            f"result_ttl must be a number of seconds above 0 and below 30 years "
            f"({MAX_RESULT_TTL}), got {ttl!r}"
        )
    return v


def check_lock_timeout(timeout: object) -> float:
    """A queue's ``lock_timeout``: seconds to wait for the writer lock, a number (an int or a
    float, not a bool) >= 0 -- 0 tries once and does not wait, ``math.inf`` waits as long as it
    takes.  ValueError for anything else (NaN, a negative number, None, a str)."""
    v = as_float(timeout)  # an int too large for a float: as long as it takes
    if not v >= 0:
        raise ValueError(
            "lock_timeout must be a number of seconds >= 0 (0: do not wait; math.inf: wait "
            f"as long as it takes), got {timeout!r}"
        )
    return v


def check_mode(mode: object) -> int:
    """A queue's ``mode``: the permission bits of the files it creates, an int (not a bool) from
    0 to 0o777.  ValueError for anything else, a setuid, setgid or sticky bit (0o7000) included."""
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        shown = oct(mode) if isinstance(mode, int) and not isinstance(mode, bool) else repr(mode)
        raise ValueError(
            "mode must be permission bits from 0o000 to 0o777 (an int, no setuid, setgid or "
            f"sticky bit), got {shown}"
        )
    return int(mode)


def timeout_ms(timeout: float | None) -> int | None:
    """A hard timeout (``enqueue(..., timeout=)``, ``Worker(timeout=)``) in milliseconds (at least
    1), or None for none.  Raises ValueError unless it is a number of seconds in
    ``(0, MAX_TIMEOUT]`` (about 49 days)."""
    if timeout is None:
        return None
    v = as_float(timeout)
    if not 0 < v <= MAX_TIMEOUT:
        raise ValueError(
            f"timeout must be a number of seconds > 0 and at most {MAX_TIMEOUT:.0f}, got {timeout!r}"
        )
    return min(0xFFFFFFFF, max(1, int(round(v * 1000))))


def check_depends_on(depends_on: object, job_id: str | None = None) -> list[str] | None:
    """The parent ids of ``enqueue(..., depends_on=)`` (a list, tuple or other ordered iterable of
    :class:`Job` or job ids, or one of them alone): duplicates dropped (the first kept), in the
    order given; None for None.  Raises TypeError for something else (a set or a mapping too),
    ValueError for an empty list, more than MAX_PARENTS parents, an empty id, or a job that
    would depend on its own id."""
    if depends_on is None:
        return None
    if isinstance(depends_on, (str, Job)):
        depends_on = [depends_on]  # one parent
    if not isinstance(depends_on, Iterable) or isinstance(depends_on, (Mapping, AbstractSet)):
        # a set has no order to keep, and a mapping's keys are not obviously what was meant
        raise TypeError(
            f"depends_on must be a list of jobs or job ids, got {type(depends_on).__name__}"
        )
    out: list[str] = []
    seen: set[str] = set()
    for parent in depends_on:
        check_job_ref(parent)
        pid = parent.id if isinstance(parent, Job) else parent
        if not pid:
            raise ValueError("depends_on holds an empty job id")
        if pid == job_id:
            raise ValueError(f"job {job_id!r} cannot depend on its own id")
        if pid not in seen:
            seen.add(pid)
            out.append(pid)
    if not out:
        raise ValueError("depends_on is empty: give None for a job without parents")
    if len(out) > MAX_PARENTS:
        raise ValueError(f"a job depends on at most {MAX_PARENTS} jobs, got {len(out)}")
    return out


_ONE_VALUE = (str, bytes, bytearray, memoryview)  # iterable, yet one payload (or id), not a list


def _short(value: object) -> str:
    """``type value`` for a message, the value's repr cut to 60 characters."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _ordered(items: Any) -> list[Any] | None:
    """``items`` as a new list if it is a list, a tuple or another ordered iterable (a generator
    too); None for a str, bytes, bytearray or memoryview (one value), a mapping, a set (no order)
    or anything not iterable."""
    cls = items.__class__
    if cls is list or cls is tuple:
        return list(items)
    if isinstance(items, (*_ONE_VALUE, Mapping, AbstractSet)) or not isinstance(items, Iterable):
        return None
    return list(items)


def check_payloads(payloads: object) -> list[Any]:
    """The payloads of ``enqueue_many`` as a new list: a list, a tuple or another ordered
    iterable of payloads.  TypeError, before anything is stored, for a str, bytes, bytearray or
    memoryview and for a dict (each one payload, not a list of them), for a set (it has no
    order) and for anything not iterable."""
    out = _ordered(payloads)
    if out is None:
        raise TypeError(
            "enqueue_many takes a list (or tuple, or other ordered iterable) of payloads, got "
            f"{_short(payloads)}: give [payload] for one job, or call enqueue"
        )
    return out


def check_job_ids(job_ids: object) -> list[Any] | None:
    """The ``job_ids`` of ``enqueue_many`` as a new list, or None for None: a list, a tuple or
    another ordered iterable.  TypeError for a str or bytes (one id, not a list of them), a
    mapping, a set or anything not iterable; each id is checked by ringq/ids.py."""
    if job_ids is None:
        return None
    out = _ordered(job_ids)
    if out is None:
        raise TypeError(
            "job_ids must be a list (or tuple, or other ordered iterable) of ids, one per "
            f"payload, got {_short(job_ids)}"
        )
    return out


def check_job_refs(jobs: object) -> list[Job | str]:
    """The jobs of ``ack_many`` as a new list: an iterable of :class:`Job` or job ids (a set
    too).  TypeError for a str or bytes (one id, not a list of them), anything not iterable, or
    an item that is neither a Job nor a str (:func:`check_job_ref`), before any job is acked."""
    if isinstance(jobs, _ONE_VALUE) or not isinstance(jobs, Iterable):
        raise TypeError(f"expected a list of jobs or job ids, got {_short(jobs)}")
    out = list(jobs)
    for job in out:
        check_job_ref(job)
    return out


def check_allow_failure(allow_failure: object, parents: list[str] | None) -> None:
    """ValueError unless ``allow_failure`` is a bool, and True only with parents."""
    if not isinstance(allow_failure, bool):
        raise ValueError(f"allow_failure must be True or False, got {allow_failure!r}")
    if allow_failure and parents is None:
        raise ValueError("allow_failure needs depends_on: it says when a dependent runs")


def check_replace(
    debounce: object, replace: object, job_id: str | None, delay: object, unique_for: object
) -> float | None:
    """The delay (seconds) of an enqueue that replaces a waiting job with the same id
    (``debounce=`` or ``replace=True``), or None for an ordinary enqueue.  ``debounce`` is the
    delay; ``replace`` takes the enqueue's own ``delay``.  Raises ValueError: either without a
    ``job_id``, both given, ``debounce`` with a ``delay``, a debounce out of range, or either
    with ``unique_for``."""
    if debounce is None and not replace:
        return None
    if not isinstance(replace, bool):
        raise ValueError(f"replace must be True or False, got {replace!r}")
    if job_id is None:
        raise ValueError("debounce and replace need a job_id: the id of the job they replace")
    if unique_for is not None:
        raise ValueError("debounce and replace cannot be combined with unique_for")
    if debounce is not None:
        if replace:
            raise ValueError("give debounce= or replace=True, not both (debounce replaces too)")
        if delay:
            raise ValueError("debounce is the delay of the replacement: give no delay with it")
        d = as_float(debounce)
        if not 0 <= d <= MAX_DELAY:
            raise ValueError(f"debounce must be a number of seconds >= 0, got {debounce!r}")
        return d
    return check_delay(delay)


def check_reschedule(priority: object, delay: object) -> tuple[int | None, float | None]:
    """``(priority, delay)`` of ``reschedule``; ValueError for a bad value (a negative delay too:
    the new run time is now + ``delay``) or neither given."""
    if priority is None and delay is None:
        raise ValueError("reschedule needs a new priority, a new delay, or both")
    if isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay < 0:
        raise ValueError(f"a reschedule's delay must be >= 0 seconds, got {delay!r}")
    return (
        None if priority is None else check_priority(priority),
        None if delay is None else check_delay(delay),
    )


def check_attempts(n: object) -> int:
    """``n`` as an int if it is an integer in ``[1, MAX_ATTEMPTS_LIMIT]`` (:func:`as_int`: a
    bool is refused); ValueError otherwise."""
    got = as_int(n)
    if got is None or not 1 <= got <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"max_attempts must be an int in [1, {MAX_ATTEMPTS_LIMIT}], got {n!r}")
    return got


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

    ``deferred`` jobs wait for the jobs they depend on (docs/workflows.md); they are counted in
    ``total``, never in ``ready``.

    ``enqueued_total``, ``acked_total`` and ``dead_lettered_total`` never fall: jobs enqueued
    (requeues and relocation copies not counted), acks, and moves to the dead-letter queue, since
    the queue was created, by all processes.  The local queue keeps them in its control file and
    bumps them right after the state changes they count (a batch's by its size, after the
    batch): a process killed between the two leaves a counter short by what it was changing --
    one ack, or a whole batch of enqueues or acks -- never over; a power loss may lose the increments since the control page
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
    deferred: int = 0

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
SEARCH_STATES = ("ready", "delayed", "leased", "done", "dead", "cancelled", "expired", "deferred")

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


class _Settable(Protocol):
    def is_set(self) -> bool: ...


#: A stop condition of ``consume``: an object with ``is_set()`` (a threading.Event), or a
#: callable returning True when the stream should end.
Stop = _Settable | Callable[[], bool]

CONSUME_BATCH_MAX = 256  # most jobs a streaming consumer holds leased before it hands them out
CONSUME_BATCH_SPAN = 0.002  # seconds of handling a batch is sized for (fair to other consumers)


def check_consume(
    count: int | None, wait: float | None, stop: Stop | None
) -> Callable[[], bool] | None:
    """Validate ``consume``'s arguments; returns the stop condition as a function (None: no
    stop condition, nothing to call per job).  Raises
    ValueError (a count that is not an int >= 1, a wait that is not a number of seconds --
    NaN, a bool, a string -- as for a lease, where a negative wait waits for nothing, a stop that
    is neither an event nor a callable)."""
    if count is not None and ((n := as_int(count)) is None or n < 1):
        raise ValueError(f"count must be an int >= 1 or None, got {count!r}")
    check_wait(wait)
    if stop is None:
        return None
    is_set = getattr(stop, "is_set", None)
    if callable(is_set):
        return is_set  # type: ignore[no-any-return]
    if callable(stop):
        return stop
    raise ValueError(f"stop must be an event (with is_set()) or a callable, got {stop!r}")


def stream_leases(
    lease: Callable[[int], list[Job]],
    count: int | None,
    stopped: Callable[[], bool] | None,
    visibility_timeout: float,
    give_back: Callable[[list[Job]], None] | None = None,
) -> Generator[Job, None, None]:
    """The jobs of ``lease(n)`` calls (each leases up to ``n``, waiting as the consumer asked, and
    returns ``[]`` to end the stream), one at a time, until ``count`` were handed out or
    ``stopped()`` (None: never).  Without ``give_back`` one job is leased per call.  With it, jobs
    are leased in batches sized to what the consumer takes per job (at most CONSUME_BATCH_MAX, about
    CONSUME_BATCH_SPAN seconds of handling), and leases not handed out -- the stream stopped, or a
    quarter of the visibility timeout passed since the batch was leased -- go to
    ``give_back(jobs)``, which returns them to the queue unused."""
    left = count
    size = 1
    started, handed = 0.0, 0
    late = 0.0  # when the batch's leases not handed out yet go back (monotonic seconds)
    pending: deque[Job] = deque()
    take, clock = pending.popleft, time.monotonic
    try:
        while True:
            if not pending:
                if left == 0 or (stopped is not None and stopped()):
                    return
                want = size if left is None else min(size, left)
                jobs = lease(want)
                if not jobs:
                    return
                pending.extend(jobs)
                started = clock()
                late = started + visibility_timeout / 4
                handed = 0
            elif stopped is not None and stopped():
                return
            if handed and give_back is not None and clock() > late:
                back = list(pending)  # a quarter of the visibility timeout passed: hand them back
                pending.clear()
                give_back(back)
                size = 1
                continue
            job = take()
            handed += 1
            if left is not None:
                left -= 1
            yield job
            if give_back is not None and not pending:
                per = (clock() - started) / handed
                fit = CONSUME_BATCH_MAX if per <= 0 else int(CONSUME_BATCH_SPAN / per)
                size = max(1, min(CONSUME_BATCH_MAX, 2 * size, fit))
    finally:
        if pending and give_back is not None:
            give_back(list(pending))


def handle_stream(
    q: QueueBackend, jobs: Generator[Job, None, None], handler: Callable[[Job], Any]
) -> int:
    """``consume(handler)``: run ``handler(job)`` for each job of ``jobs``; ack it when the
    handler returns, nack it (the exception's text as the error) when it raises.  An exception
    that is not an Exception (KeyboardInterrupt, SystemExit) is raised after the nack.  Returns
    how many jobs the handler returned from."""
    done = 0
    try:
        for job in jobs:
            try:
                handler(job)
            except BaseException as exc:
                q.nack(job, error=f"{type(exc).__name__}: {exc}")
                if not isinstance(exc, Exception):
                    raise
                continue
            q.ack(job)
            done += 1
    finally:
        jobs.close()  # leases the stream holds but never handed out go back
    return done


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

    def preload(self) -> None:
        """Import what leasing from this queue needs, building nothing: a Worker's parent calls it
        before forking its child processes, which then share those modules."""
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
        depends_on: Sequence[Job | str] | None = None,
        allow_failure: bool = False,
        debounce: float | None = None,
        replace: bool = False,
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

    @overload
    def consume(
        self,
        handler: None = None,
        *,
        count: int | None = None,
        wait: float | None = None,
        stop: Stop | None = None,
        visibility_timeout: float | None = None,
    ) -> Generator[Job, None, None]: ...

    @overload
    def consume(
        self,
        handler: Callable[[Job], Any],
        *,
        count: int | None = None,
        wait: float | None = None,
        stop: Stop | None = None,
        visibility_timeout: float | None = None,
    ) -> int: ...

    def consume(
        self,
        handler: Callable[[Job], Any] | None = None,
        *,
        count: int | None = None,
        wait: float | None = None,
        stop: Stop | None = None,
        visibility_timeout: float | None = None,
    ) -> Generator[Job, None, None] | int:
        """Stream leases (:meth:`ringq.Queue.consume` has the contract)."""
        ...

    def nack(
        self, job: Job | str, *, error: str | None = None, delay: float | None = None
    ) -> Job: ...

    def extend(self, job: Job | str, seconds: float) -> Job: ...

    def kill_and_give_back(self, pid: int) -> int:
        """Kill the stopped child ``pid`` and return every job it held leased to READY uncharged
        (:meth:`ringq.Queue.kill_and_give_back` has the contract); returns how many.  0 on a
        queue whose consumers hold no leases beyond the jobs they run (Redis)."""
        ...

    def reschedule(
        self, job: Job | str, *, priority: int | None = None, delay: float | None = None
    ) -> Job:
        """Change the priority, or the run time (now + ``delay``), of a waiting job
        (:meth:`ringq.Queue.reschedule` has the contract)."""
        ...

    def dependents(self, job: Job | str) -> list[str]:
        """Ids of the retained jobs enqueued with ``depends_on`` naming ``job``, oldest first."""
        ...

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
