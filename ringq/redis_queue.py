"""RedisQueue: the ringq API on a Redis server, for pipelines that outgrow one host.

Theory of operation
-------------------
Every transition of a job is one server-side Lua script (ringq/_redis_lua.py) run with EVALSHA, so
it is atomic; all keys of a queue share the hash tag ``{ringq:<name>}``, so a queue lives in one
hash slot and works on Redis Cluster.  Times are the server's clock.

A consumer with nothing to lease blocks in ``BLPOP`` on the queue's wake list: enqueues, nacks and
requeues push a token to it.  Delayed jobs coming due and leases expiring push nothing, so the
lease script also returns how long until the next of those, and the consumer blocks no longer than
that (and at most ``MAX_NAP`` seconds).

A dead holder cannot be noticed across hosts the way the local queue notices it (a kernel lock
dropped at exit): its leases come back when their visibility timeout passes, and a
:class:`~ringq.Worker` keeps its running jobs' leases alive by extending them (heartbeats).

Durability is Redis' own: with ``appendonly yes`` and ``appendfsync always`` an acknowledged
write is on disk before the reply (the local queue's default promise); ``min_replicas=N`` also
waits (Redis ``WAIT``) for N replicas to acknowledge each write.  See docs/scale-out.md.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from typing import Any

from . import codec
from ._redis_lua import PRELUDE, SCRIPTS
from .backoff import BackoffPolicy
from .errors import (
    BackendError,
    ConnectionLostError,
    JobFinishedError,
    JobNotFoundError,
    MissingExtraError,
    NotLeasedError,
    QueueClosedError,
    ReplicationTimeoutError,
    SerializationError,
)
from .ids import check_caller_id, renamed
from .job import Job, JobState
from .lifecycle import check_fraction
from .queue import (
    _NO_RESULT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_VISIBILITY_TIMEOUT,
    MAX_ATTEMPTS_LIMIT,
    QueueStats,
    due_delay,
    expiry_ms,
)
from .results import DEFAULT_RESULT_TTL, Results, finished_without

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError:  # pragma: no cover - depends on the environment
    redis = None

__all__ = ["RedisQueue"]

MAX_NAP = 1.0  # seconds: longest single BLPOP, bounding how late a wake-up pushed elsewhere is seen
MAX_DELAY = 86400 * 365 * 33  # seconds: as the local queue's limit
_STATES = {
    "ready": JobState.READY,
    "leased": JobState.LEASED,
    "done": JobState.DONE,
    "dead": JobState.DEAD,
    "cancelled": JobState.CANCELLED,
    "expired": JobState.EXPIRED,
}
_READS = frozenset({"get", "list", "stats"})  # scripts that change no job: safe to simply retry
_SUFFIXES = (
    "ready",
    "delayed",
    "leased",
    "dead",
    "done",
    "all",
    "meta",
    "payload",
    "wake",
    "seq",
    "pause",
    "cancelled",
    "expired",
    "counts",
)


def _name_ok(name: str) -> bool:
    from .ring import NAME_RE

    return isinstance(name, str) and bool(NAME_RE.match(name))


class RedisQueue:
    """A job queue on a Redis server: the same methods, arguments, results and errors as
    :class:`ringq.Queue`.  Safe to use from many threads, processes and hosts.

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) or
            ``unix:///path/to/socket``.  A server with cluster mode enabled is used through
            redis-py's cluster client.
        name: queue name ``[A-Za-z0-9_-]{1,64}``; keys are ``{ringq:<name>}:*``.
        visibility_timeout, max_attempts, backoff: as :class:`ringq.Queue`.
        retain_done: seconds a finished job (and its id, for idempotency) stays retrievable
            (default 3600; the local queue keeps them until their segment retires).
        min_replicas: after each write (enqueue, ack, nack, requeue, purge, import) wait until
            this many replicas acknowledged it (Redis ``WAIT``); 0 (default) does not wait.
        replica_timeout: seconds to wait for them (default 5): ReplicationTimeoutError after.
        socket_timeout: seconds a reply may take before ConnectionLostError (default 30).
        Other keyword arguments are refused, except the local queue's storage options
        (``durability``, ``fsync``, ...), which do not apply and are ignored.

    Raises:
        MissingExtraError: redis-py is not installed (``pip install 'ringq[redis]'``); a subclass
            of ImportError.
        ValueError: bad name or setting.  ConnectionLostError: the server cannot be reached.
    """

    _LOCAL_ONLY = frozenset(
        {
            "fsync",
            "durability",
            "flush_interval",
            "sync_acks",
            "state_flush_interval",
            "lock_timeout",
            "slot_size",
            "slot_count",
            "mode",
            "allow_network_fs",
        }
    )

    def __init__(
        self,
        url: str,
        name: str = "default",
        *,
        visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: BackoffPolicy | None = None,
        retain_done: float = 3600.0,
        min_replicas: int = 0,
        replica_timeout: float = 5.0,
        socket_timeout: float = 30.0,
        auto_ids: bool = True,
        **local_options: Any,
    ) -> None:
        if redis is None:
            raise MissingExtraError(
                "the Redis backend needs redis-py, which is not installed: pip install 'ringq[redis]'"
            )
        unknown = set(local_options) - self._LOCAL_ONLY
        if unknown:
            raise TypeError(f"RedisQueue got unexpected keyword arguments {sorted(unknown)}")
        if not _name_ok(name):
            raise ValueError(f"queue name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
        if not 0 < visibility_timeout < MAX_DELAY:
            raise ValueError(f"visibility_timeout must be > 0 seconds, got {visibility_timeout!r}")
        _check_attempts(max_attempts)
        if not retain_done >= 0:
            raise ValueError(f"retain_done must be >= 0 seconds, got {retain_done!r}")
        if not isinstance(min_replicas, int) or min_replicas < 0:
            raise ValueError(f"min_replicas must be an int >= 0, got {min_replicas!r}")
        if not replica_timeout > 0:
            raise ValueError(f"replica_timeout must be > 0 seconds, got {replica_timeout!r}")
        self.url = url
        self.auto_ids = bool(auto_ids)  # as Queue(auto_ids=): False for a results queue
        self.path = url  # where the queue lives, as the local queue's attribute says
        self.name = name
        self.durability = "redis"
        self.visibility_timeout = float(visibility_timeout)
        self.max_attempts = max_attempts
        self.backoff = backoff or BackoffPolicy()
        self.retain_done = float(retain_done)
        self.min_replicas = min_replicas
        self.replica_timeout = float(replica_timeout)
        self._keys = [f"{{ringq:{name}}}:{s}" for s in _SUFFIXES]
        self._rng = random.Random()
        self._closed = False
        self._due_at: float | None = None  # time.monotonic() of the next due time seen by a lease
        # No automatic retries: a command re-sent after a dropped connection could run twice
        # (an enqueue without an id would be stored twice).  Callers see ConnectionLostError.
        opts = dict(
            retry=Retry(NoBackoff(), 0), socket_timeout=socket_timeout, socket_connect_timeout=10.0
        )
        self._r = guard(url, lambda: client_for(url, **opts), changes=False)
        self.cluster = not isinstance(self._r, redis.Redis)
        if self.cluster and min_replicas:
            raise ValueError("min_replicas is not supported on Redis Cluster (WAIT is per node)")
        self._sha = {k: None for k in SCRIPTS}
        self._results = Results(
            name,
            lambda n: RedisQueue(url, n, auto_ids=False, socket_timeout=socket_timeout, min_replicas=min_replicas,
                                 replica_timeout=replica_timeout),
        )

    # -- plumbing ----------------------------------------------------------------------------------

    def _guard(self, fn: Any, *, changes: bool = True) -> Any:
        return guard(self.url, fn, changes=changes)

    def _run(self, script: str, args: Sequence[Any], write: bool = False) -> Any:
        self._live()
        return self._guard(
            lambda: self._eval(script, list(args), write), changes=script not in _READS
        )

    def _eval(self, script: str, args: list, write: bool) -> Any:
        for _ in range(2):
            sha = self._sha[script]
            if sha is None:
                sha = self._sha[script] = self._r.script_load(PRELUDE + SCRIPTS[script])
            try:
                if not (write and self.min_replicas):
                    return self._r.evalsha(sha, len(self._keys), *self._keys, *args)
                pipe = self._r.pipeline(transaction=False)  # one connection: WAIT counts its writes
                pipe.evalsha(sha, len(self._keys), *self._keys, *args)
                pipe.execute_command("WAIT", self.min_replicas, int(self.replica_timeout * 1000))
                result, acked = pipe.execute()
                if acked < self.min_replicas:
                    raise ReplicationTimeoutError(
                        f"the write reached the primary but only {acked} of {self.min_replicas} replicas "
                        f"acknowledged it within {self.replica_timeout} s"
                    )
                return result
            except redis.exceptions.NoScriptError:
                self._sha[script] = None  # the server restarted or flushed its script cache
        raise BackendError("Redis kept losing the queue's scripts")

    def _live(self) -> None:
        if self._closed:
            raise QueueClosedError(f"queue {self.name!r} at {redact_url(self.url)} is closed")

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the connections (idempotent).  Leases held are not released: they expire."""
        if not self._closed:
            self._closed = True
            self._r.close()
            self._results.close()

    def __enter__(self) -> RedisQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- enqueue ------------------------------------------------------------------------------------

    def enqueue(
        self,
        payload: Any,
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_attempts: int | None = None,
        job_id: str | None = None,
        expires_in: float | None = None,
        expires_at: float | None = None,
    ) -> Job:
        """Add one job; as :meth:`ringq.Queue.enqueue`.  Raises ConnectionLostError (outcome
        unknown: re-send with a ``job_id`` to make a retry safe), ReplicationTimeoutError."""
        return self.enqueue_many(
            [payload],
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            job_ids=None if job_id is None else [job_id],
            expires_in=expires_in,
            expires_at=expires_at,
        )[0]

    def enqueue_many(
        self,
        payloads: Sequence[Any],
        *,
        priority: int = 0,
        delay: float = 0.0,
        max_attempts: int | None = None,
        job_ids: Sequence[str] | None = None,
        expires_in: float | None = None,
        expires_at: float | None = None,
    ) -> list[Job]:
        """Add many jobs in one atomic script: all are stored or none.  As :meth:`ringq.Queue.enqueue_many`
        (``expires_in`` is turned into a time on this host's clock; the lease script compares it
        with the server's)."""
        self._live()
        ex = expiry_ms(expires_in, expires_at) or 0
        payloads = list(payloads)
        ids = [""] * len(payloads) if job_ids is None else list(job_ids)
        if len(ids) != len(payloads):
            raise ValueError(f"job_ids has {len(ids)} ids for {len(payloads)} payloads")
        if job_ids is None and not self.auto_ids:
            raise ValueError("this queue takes jobs with caller ids only (auto_ids=False): give job_id")
        if job_ids is not None:
            for jid in ids:
                check_caller_id(jid, allow_auto_form=not self.auto_ids)  # ringq/ids.py
        if not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
            raise ValueError(f"priority must be a 32-bit signed int, got {priority!r}")
        delay = due_delay(delay)
        if not 0 <= delay <= MAX_DELAY:
            raise ValueError(
                f"delay must be between 0 and about 33 years (in seconds), got {delay!r}"
            )
        attempts = self.max_attempts if max_attempts is None else max_attempts
        _check_attempts(attempts)
        args: list[Any] = [priority, int(round(delay * 1000)), attempts, len(payloads)]
        for jid, payload in zip(ids, payloads):
            kind, data = codec.encode(payload)
            try:
                args += [jid.encode("utf-8", "strict"), bytes([kind]) + data]
            except UnicodeEncodeError:
                raise SerializationError(f"job id {jid!r} is not valid Unicode text") from None
        if not payloads:
            return []
        args.append(ex)
        rows = self._run("enqueue", args, write=True)
        return [
            _job(meta, pay, (payloads[i],) if tag == b"new" else None)
            for i, (tag, meta, pay) in enumerate(rows)
        ]

    # -- lease --------------------------------------------------------------------------------------

    def lease(
        self,
        count: int = 1,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        detach: bool = False,
    ) -> list[Job]:
        """Lease up to ``count`` due jobs; as :meth:`ringq.Queue.lease`.

        A waiting call blocks in BLPOP on the queue's wake list (woken by enqueues, nacks and
        requeues) and no longer than until the next delayed job or lease deadline.  ``detach`` is
        accepted and changes nothing: every Redis lease ends only by ack/nack or its visibility
        timeout.  If the connection drops during the call, the jobs it leased come back after
        their visibility timeout.
        """
        self._live()
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        vt = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        if not 0 < vt < MAX_DELAY:
            raise ValueError(f"visibility_timeout must be > 0 seconds, got {vt!r}")
        deadline = None if not wait else time.monotonic() + wait
        got: list[Job] = []
        while True:
            out = self._run("lease", [count - len(got), int(vt * 1000)])
            for i in range(1, len(out), 2):
                try:
                    got.append(_job(out[i], out[i + 1]))
                except SerializationError:
                    continue  # the lease expires and the job dead-letters after max_attempts
            # out[0]: ms until the next delayed job or lease deadline (-1: none), as a deadline
            self._due_at = None if out[0] < 0 else time.monotonic() + out[0] / 1000
            if len(got) >= count or deadline is None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            self._sleep(min(left, MAX_NAP))

    def _sleep(self, nap: float, *, past_due_wakes: bool = True) -> None:
        """BLPOP on the wake list for up to ``nap`` seconds, and no later than the next due time
        seen by the last lease.  With ``past_due_wakes=False`` a due time already passed does not
        shorten the nap: the caller was woken for it once already."""
        due = self._due_at
        if due is not None:
            left = due - time.monotonic()
            if left > 0 or past_due_wakes:
                nap = min(nap, max(left, 0.0) + 0.002)
        if nap > 0.001:
            self._guard(lambda: self._r.blpop([self._keys[8]], timeout=nap), changes=False)

    def lease_one(
        self,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        detach: bool = False,
    ) -> Job | None:
        """Lease one job, or return None if none is due (after waiting up to ``wait`` seconds)."""
        jobs = self.lease(1, visibility_timeout=visibility_timeout, wait=wait, detach=detach)
        return jobs[0] if jobs else None

    def wake_token(self) -> int:
        """For callers that wait in another thread (see :meth:`ringq.Queue.wake_token`): always 0
        here; wake-ups are tokens in the queue's wake list, so none is lost in between."""
        self._live()
        return 0

    def wait_for_wake(self, token: int, timeout: float) -> None:
        """Block until a wake-up token arrives, the next delayed job or lease deadline seen by this
        object's last lease comes, or ``timeout`` seconds (at most ``MAX_NAP``) pass.

        As :meth:`ringq.Queue.wait_for_wake`, a due time that has already passed does not cut the
        sleep short: the caller was woken for it and may have chosen not to lease (no free
        capacity), and must not spin.  Spurious returns are allowed."""
        self._live()
        self._sleep(min(timeout, MAX_NAP), past_due_wakes=False)

    def wake(self) -> None:
        """Wake one sleeper of this queue (any host) by pushing a token to the wake list."""
        self._live()
        self._guard(lambda: self._r.rpush(self._keys[8], 1))

    # -- ack / nack / extend ---------------------------------------------------------------------------

    def ack(
        self, job: Job | str, *, result: Any = _NO_RESULT, result_ttl: float = DEFAULT_RESULT_TTL
    ) -> None:
        """Mark a leased job done; as :meth:`ringq.Queue.ack` (acking again is harmless).  A
        ``result`` is kept in the companion queue ``<name>-results`` on the same server."""
        if result is not _NO_RESULT:
            jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
            cur = self.get(jid)
            repeated = cur.state is JobState.DONE and (tok < 0 or int(cur.lease_token or 0) == tok)
            if not repeated:
                if cur.state is not JobState.LEASED or (tok >= 0 and int(cur.lease_token or 0) != tok):
                    self.ack_many([job])  # refused: raises NotLeasedError saying why
                self._results.store(jid, result, result_ttl)
        self.ack_many([job])

    def result(self, job_id: str | Job, *, wait: float | None = None) -> Any:
        """As :meth:`ringq.Queue.result`.  A waiting call sleeps in BLPOP on the results queue's
        wake list (at most a second at a time)."""
        self._live()
        jid = job_id.id if isinstance(job_id, Job) else job_id
        return self._results.wait(jid, wait, lambda: finished_without(self, self._results, jid))

    def ack_many(self, jobs: Sequence[Job | str]) -> None:
        """Ack several jobs in one script.  Every job that can be acked is; then the first refusal
        (NotLeasedError, JobNotFoundError) is raised.  A retry after ConnectionLostError is safe."""
        items = [(j.id, int(j.lease_token or 0)) if isinstance(j, Job) else (j, -1) for j in jobs]
        if not items:
            return
        args: list[Any] = [int(self.retain_done * 1000), len(items)]
        for jid, tok in items:
            args += [jid, tok]
        for (jid, _), status in zip(items, self._run("ack", args, write=True)):
            _refuse(self.name, status, jid, "ack")

    def nack(self, job: Job | str, *, error: str | None = None, delay: float | None = None) -> Job:
        """Report a leased job as failed; as :meth:`ringq.Queue.nack` (the backoff delay is drawn here)."""
        self._live()
        if delay is not None and not 0 <= delay <= MAX_DELAY:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
        if delay is None:
            attempts = job.attempts if isinstance(job, Job) else self.get(jid).attempts
            delay = self.backoff.delay_for(attempts, self._rng)
        text = "" if error is None else str(error).encode("utf-8", "replace").decode()
        out = self._run(
            "nack", [jid, tok, text, int(error is not None), int(delay * 1000)], write=True
        )
        _refuse(self.name, out[0], jid, "nack")
        return _job(out[1], out[2])

    def extend(self, job: Job | str, seconds: float) -> Job:
        """Push a lease's deadline to ``max(deadline, now) + seconds``.  Raises NotLeasedError if lost."""
        self._live()
        if not 0 < seconds < MAX_DELAY:
            raise ValueError(f"seconds must be > 0 (and finite), got {seconds!r}")
        jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
        out = self._run("extend", [jid, tok, int(seconds * 1000)])
        _refuse(self.name, out[0], jid, "extend")
        return _job(out[1], out[2])

    # -- reads and admin -------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """The job with this id (a snapshot).  Raises JobNotFoundError if it is not retained."""
        out = self._run("get", [job_id])
        if not out:
            _refuse(self.name, "nf", job_id, "get")
        return _job(out[0], out[1])

    def list_jobs(
        self, state: JobState | str | None = None, *, limit: int | None = None, decode: bool = True
    ) -> list[Job]:
        """Retained jobs in enqueue order, optionally only those in ``state``, at most ``limit``."""
        want = "" if state is None else JobState(state).value
        out = self._run("list", [want, -1 if limit is None else limit])
        jobs = []
        for i in range(0, len(out), 2):
            try:
                jobs.append(_job(out[i], out[i + 1], decode=decode))
            except SerializationError:
                continue
        return jobs

    def dlq(self, *, limit: int | None = None) -> list[Job]:
        """Dead-lettered jobs, oldest first."""
        return self.list_jobs(JobState.DEAD, limit=limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """Move dead-lettered jobs (one, or all) back to READY with attempts reset; returns how many.
        Raises JobNotFoundError, or NotLeasedError if ``job_id`` is not dead."""
        out = self._run("requeue", ["" if job_id is None else job_id], write=True)
        if out == b"nf":
            _refuse(self.name, "nf", str(job_id), "requeue")
        if out == b"notdead":
            raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")
        return int(out)

    def purge(self) -> int:
        """Remove every retained job (ready, delayed, leased, done, dead); returns how many."""
        return int(self._run("purge", [], write=True))

    def stats(self) -> QueueStats:
        """Counts by state and the cumulative counters (one script, so one consistent instant).
        Cancelled and expired jobs are kept ``retain_done`` seconds, like done ones.

        ``enqueued_total``, ``acked_total`` and ``dead_lettered_total`` count, since the queue's
        first use, new jobs stored by enqueue, acks, and moves to the dead-letter queue (by nack
        or lease expiry, the latter counted when a lease call reclaims it); purge keeps them."""
        ready, delayed, leased, done, dead, cancelled, expired, enq, acked, dl = self._run(
            "stats", [int(self.retain_done * 1000)]
        )
        total = ready + delayed + leased + done + dead + cancelled + expired
        return QueueStats(
            ready, delayed, leased, done, dead, total, 0, enq, acked, dl, cancelled=cancelled, expired=expired
        )

    # -- lifecycle: cancel, pause, progress (docs/lifecycle.md) ---------------------------------------

    def cancel(self, job: Job | str) -> Job:
        """As :meth:`ringq.Queue.cancel`: CANCELLED if ready or delayed, cancel-requested if
        leased.  Raises JobFinishedError, JobNotFoundError."""
        self._live()
        jid = job.id if isinstance(job, Job) else job
        out = self._run("cancel", [jid], write=True)
        status = out[0].decode() if isinstance(out[0], bytes) else out[0]
        if status.startswith("fin:"):
            raise JobFinishedError(f"cannot cancel job {jid!r}: it is already {status[4:]}")
        _refuse(self.name, status, jid, "cancel")
        return _job(out[1], out[2])

    def pause(self, key: str | None = None) -> None:
        """Stop leases of the whole queue on every host until :meth:`resume`.  Per-key pause is
        not available on Redis (ValueError)."""
        self._live()
        if key is not None:
            raise ValueError(
                "pausing one key is not available on the Redis backend; pause the queue"
            )
        self._run("pause", ["1"], write=True)

    def resume(self, key: str | None = None) -> None:
        """Undo :meth:`pause`; sleeping leases are woken."""
        self._live()
        if key is not None:
            raise ValueError(
                "pausing one key is not available on the Redis backend; pause the queue"
            )
        self._run("pause", ["0"], write=True)

    def paused(self) -> dict[str, Any]:
        """``{"queue": bool, "keys": []}``."""
        self._live()
        return {"queue": self._guard(lambda: self._r.get(self._keys[10])) == b"1", "keys": []}

    def progress(self, job: Job | str, fraction: float, message: str | None = None) -> None:
        """As :meth:`ringq.Queue.progress`: fenced like an ack; shown by get and list_jobs."""
        self._live()
        f = check_fraction(fraction)
        jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
        text = "" if message is None else str(message).encode("utf-8", "replace").decode()
        status = self._run("progress", [jid, tok, repr(f), text, int(message is not None)])
        _refuse(self.name, status, jid, "report progress of")

    def __len__(self) -> int:
        """Number of retained jobs (``stats().total``)."""
        return self.stats().total

    def import_jobs(self, jobs: Sequence[Job], *, source: str | None = None) -> int:
        """Store copies of ``jobs`` (READY, delayed or DEAD) keeping id, payload, priority, attempts,
        max attempts, available-at, enqueue time and last error; a job whose id is retained is
        skipped, so importing twice adds nothing.  Returns how many were added (for migrate).
        ``source``: as :meth:`ringq.Queue.import_jobs` (an automatic-form id becomes
        ``<source>-<id>``; without ``source`` it is refused with ValueError, nothing written)."""
        jobs = renamed(jobs, source)
        for j in jobs:
            check_caller_id(j.id)
        args: list[Any] = [len(jobs)]
        for j in jobs:
            kind, data = codec.encode(j.payload)
            args += [
                j.id,
                bytes([kind]) + data,
                j.priority,
                j.attempts,
                j.max_attempts,
                int(j.available_at * 1000),
                int(j.enqueued_at * 1000),
                "dead" if j.state is JobState.DEAD else "ready",
                j.last_error or "",
            ]
        return int(self._run("import", args, write=True)) if jobs else 0

    def server_identity(self) -> str:
        """Which server and database hold this queue, however the URL spells them:
        ``"<run_id>/<db>"`` (Redis' ``INFO server`` run_id is unique per server process; on a
        cluster, that of the node serving the queue's hash slot).  Raises ConnectionLostError."""

        def ask() -> str:
            if self.cluster:
                node = self._r.get_node_from_key(self._keys[0])
                info = self._r.info("server", target_nodes=node)
                if "run_id" not in info:  # keyed by node name when the client asked several
                    info = next(iter(info.values()))
                return f"{info['run_id']}/0"
            db = self._r.connection_pool.connection_kwargs.get("db", 0)
            return f"{self._r.info('server')['run_id']}/{db}"

        return self._guard(ask, changes=False)

    def __repr__(self) -> str:
        return f"RedisQueue({redact_url(self.url)!r}, name={self.name!r})"


def _job(meta: bytes, payload: bytes | None, known: Any = None, decode: bool = True) -> Job:
    m = json.loads(meta)
    if known is not None:
        value = known[0]
    elif payload is None or not decode:
        value = None
    else:
        value = codec.decode(payload[0], payload[1:])
    st = _STATES[m["st"]]
    return Job(
        id=m["id"],
        payload=value,
        priority=int(m["p"]),
        state=st,
        attempts=int(m["a"]),
        max_attempts=int(m["m"]),
        available_at=m["av"] / 1000,
        enqueued_at=m["enq"] / 1000,
        lease_deadline=m["dl"] / 1000 if st is JobState.LEASED else None,
        lease_token=str(int(m["t"])) if int(m["t"]) else None,
        last_error="lease expired: visibility timeout passed before ack"
        if m.get("why")
        else m.get("e"),
        seq=int(m["s"]),
        cancel_requested=bool(m.get("cx")) and st is JobState.LEASED,
        expires_at=m["ex"] / 1000 if m.get("ex") else None,
        progress=float(m["pg"]) if st is JobState.LEASED and m.get("pg") is not None else None,
        progress_message=m.get("pm") if st is JobState.LEASED else None,
    )


def _refuse(name: str, status: bytes | str, job_id: str, op: str) -> None:
    s = status.decode() if isinstance(status, bytes) else status
    if s == "ok":
        return
    if s == "nf":
        raise JobNotFoundError(
            f"no job {job_id!r} in queue {name!r} (never enqueued, purged or expired)"
        )
    parts = s.split(":")
    if parts[0] == "stale":
        raise NotLeasedError(
            f"cannot {op} job {job_id!r}: fencing token is stale; the job was leased again "
            f"(token {parts[1]})"
        )
    st, why, tok = parts[1], parts[2], parts[3]
    if st == "ready" and tok == "0":
        cause = "it was never leased"
    elif st in ("cancelled", "expired"):
        cause = f"it was {st}"
    elif why == "expired":
        cause = "its last lease expired (visibility timeout)"
    else:
        cause = "it was already acked, nacked or purged"
    raise NotLeasedError(f"cannot {op} job {job_id!r}: it is {st}, not leased ({cause})")


def _check_attempts(n: int) -> None:
    if not isinstance(n, int) or not 1 <= n <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"max_attempts must be an int in [1, {MAX_ATTEMPTS_LIMIT}], got {n!r}")


def client_for(url: str, **options: Any) -> Any:
    """A redis-py client for ``url``: ``redis.RedisCluster`` if the server runs in cluster mode,
    else ``redis.Redis``; ``options`` go to ``from_url``.  Raises redis-py's errors (see :func:`guard`)."""
    r = redis.Redis.from_url(url, **options)
    if not url.startswith("unix:") and r.info("cluster").get("cluster_enabled"):
        r.close()
        return redis.RedisCluster.from_url(url, **options)
    return r


def guard(url: str, fn: Any, *, changes: bool = True) -> Any:
    """Call ``fn()`` and turn redis-py's errors into ringq's: ConnectionLostError for a dropped or
    refused connection or a timeout, BackendError for a command the server refused.  ``changes``:
    ``fn`` would change the queue, so a lost reply leaves its effect unknown and the message says
    so; a read (``changes=False``) changed nothing either way."""
    try:
        return fn()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        unknown = "; the operation may or may not have taken effect" if changes else ""
        raise ConnectionLostError(
            f"Redis at {redact_url(url)}: connection failed ({exc}){unknown}"
        ) from exc
    except redis.ResponseError as exc:
        raise BackendError(f"Redis at {redact_url(url)} refused the operation: {exc}") from exc


def redact_url(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url
