"""RedisQueue: the ringq API on a Redis server, for pipelines that outgrow one host.

Theory of operation
-------------------
Every transition of a job is one server-side Lua script (ringq/redis/lua.py) run with EVALSHA, so
it is atomic; all keys of a queue share the hash tag ``{ringq:<name>}``, so a queue lives in one
hash slot and works on Redis Cluster.  Times are the server's clock.

A consumer with nothing to lease blocks in ``BLPOP`` on the queue's wake list: enqueues, nacks and
requeues push a token to it.  Delayed jobs coming due and leases expiring push nothing, so the
lease script also returns how long until the next of those, and the consumer blocks no longer than
that (and at most ``MAX_NAP`` seconds).

Workflows (docs/workflows.md) are the same scripts' work: a job enqueued with ``depends_on`` is
DEFERRED with a count of its unfinished parents, and the script that finishes a parent (ack,
nack, expiry, cancel) lowers the count of each of its dependents, so the one that finishes the
last parent releases the dependent, once, in the same atomic step; a failed parent cancels the
dependents that do not allow failure.  At equal priority due jobs of different ``key`` values
take turns (round-robin), FIFO within a key.  ringq/redis/lua.py's docstring has the keys.

A dead holder cannot be noticed across hosts the way the local queue notices it (a kernel lock
dropped at exit): its leases come back when their visibility timeout passes, and a
:class:`~ringq.Worker` keeps its running jobs' leases alive by extending them (heartbeats).

Durability is Redis' own: with ``appendonly yes`` and ``appendfsync always`` an acknowledged
write is on disk before the reply (the local queue's default promise); ``min_replicas=N`` also
waits (Redis ``WAIT``) for N replicas to acknowledge each write.  See docs/scale-out.md.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, overload

from ringq import codec, tracing
from ringq.backend import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RESULT_TTL,
    DEFAULT_VISIBILITY_TIMEOUT,
    NO_RESULT,
    SEARCH_STATES,
    QueueStats,
    SearchPage,
    Stop,
    check_allow_failure,
    check_attempts,
    check_consume,
    check_count,
    check_delay,
    check_depends_on,
    check_extension,
    check_job_ids,
    check_job_ref,
    check_job_refs,
    check_lease_args,
    check_lock_timeout,
    check_mode,
    check_payloads,
    check_priority,
    check_queue_name,
    check_replace,
    check_reschedule,
    check_retry_delay,
    check_stopped_child,
    check_visibility_timeout,
    expiry_ms,
    handle_stream,
    refuse_reserved,
    reserved_for_results,
    stream_leases,
    timeout_ms,
)
from ringq.backoff import BackoffPolicy
from ringq.errors import JobNotFoundError, LimitError, MissingExtraError, SerializationError
from ringq.ids import check_caller_id
from ringq.job import Job, JobState
from ringq.results import Results, lease_of
from ringq.tracing import clean

from .admin import RedisAdmin
from .lifecycle import RedisLifecycle
from .scripts import HAVE_REDIS, WAKE, Scripts, client_for, guard, redact_url, refuse
from .scripts import job_from_reply as _job
from .workflows import RedisWorkflows

__all__ = ["RedisQueue", "client_for", "guard", "redact_url"]

_NO_KEYS = "unique windows (unique_for) are not available on the Redis backend"

MAX_NAP = 1.0  # seconds: longest single BLPOP, bounding how late a wake-up pushed elsewhere is seen


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
        (``durability``, ``fsync``, ...), which do not apply and are ignored; a bad
        ``lock_timeout`` or ``mode`` is refused as the local queue refuses it (ValueError), so
        that one call opens a queue, or fails, alike on both.

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
        if not HAVE_REDIS:
            raise MissingExtraError(
                "the Redis backend needs redis-py, which is not installed: pip install 'ringq[redis]'"
            )
        unknown = set(local_options) - self._LOCAL_ONLY
        if unknown:
            raise TypeError(f"RedisQueue got unexpected keyword arguments {sorted(unknown)}")
        if "lock_timeout" in local_options:
            check_lock_timeout(local_options["lock_timeout"])
        if "mode" in local_options:
            check_mode(local_options["mode"])
        check_queue_name(name)
        visibility_timeout = check_visibility_timeout(visibility_timeout)
        max_attempts = check_attempts(max_attempts)
        if not retain_done >= 0:
            raise ValueError(f"retain_done must be >= 0 seconds, got {retain_done!r}")
        min_replicas = check_count(min_replicas, "min_replicas")
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
        self._rng = random.Random()
        self._due_at: float | None = None  # time.monotonic() of the next due time seen by a lease
        self._scripts = Scripts(
            url,
            name,
            min_replicas=min_replicas,
            replica_timeout=self.replica_timeout,
            socket_timeout=socket_timeout,
        )
        self.cluster = self._scripts.cluster
        self._results = Results(
            name,
            lambda n: RedisQueue(
                url,
                n,
                auto_ids=False,
                socket_timeout=socket_timeout,
                min_replicas=min_replicas,
                replica_timeout=replica_timeout,
            ),
            self.get,
        )
        self._socket_timeout = float(socket_timeout)
        self._admin = RedisAdmin(self._scripts, name, self.cluster, self.retain_done)
        self._lifecycle = RedisLifecycle(self._scripts, self._results, name, self.get)
        self._workflows = RedisWorkflows(self._scripts, name)
        tracing.warm()  # now, not in the first enqueue (ringq/local/queue.py says why)

    # -- opening and closing ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._scripts.closed

    @property
    def features(self) -> frozenset[str]:
        """None of ringq/backend.py's optional features: no schedules, limits or compaction."""
        return frozenset()

    @property
    def location(self) -> str:
        """The server's URL, without its password."""
        return redact_url(self.url)

    def preload(self) -> None:
        """Nothing to import ahead: the Redis client and this queue's scripts are loaded with the
        queue (a Worker's parent calls it before forking its child processes)."""

    def reopen_options(self) -> dict[str, Any]:
        """Keyword arguments that open this queue again with the same settings."""
        return {
            "visibility_timeout": self.visibility_timeout,
            "max_attempts": self.max_attempts,
            "backoff": self.backoff,
            "retain_done": self.retain_done,
            "min_replicas": self.min_replicas,
            "replica_timeout": self.replica_timeout,
            "socket_timeout": self._socket_timeout,
            "auto_ids": self.auto_ids,
        }

    def run_schedules(self) -> list[Job]:
        """Nothing: periodic jobs are not available on the Redis backend (``[]``)."""
        return []

    def next_schedule_fire(self) -> float | None:
        """None: periodic jobs are not available on the Redis backend."""
        return None

    def close(self) -> None:
        """Close the connections (idempotent).  Leases held are not released: they expire."""
        if not self._scripts.closed:
            self._scripts.close()
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
        key: str | None = None,
        unique_for: float | None = None,
        expires_in: float | None = None,
        expires_at: float | None = None,
        timeout: float | None = None,
        depends_on: Sequence[Job | str] | None = None,
        allow_failure: bool = False,
        debounce: float | None = None,
        replace: bool = False,
    ) -> Job:
        """Add one job; as :meth:`ringq.Queue.enqueue` (``depends_on``, ``allow_failure``,
        ``debounce`` and ``replace`` included: docs/workflows.md).  ``key`` orders leases
        fairly across keys; its limits are not available here.  Raises ConnectionLostError
        (outcome unknown: re-send with a ``job_id`` to make a retry safe),
        ReplicationTimeoutError, JobNotFoundError (a parent is not retained: nothing written),
        ValueError (also a replacement that would depend on one of its own dependents: nothing
        written), LimitError for ``unique_for`` (limits are not available on Redis).

        A ``debounce`` or ``replace`` of a job that is leased leaves its run alone: the new
        run waits in the job until that run ends (acked, dead-lettered, cancelled, or nacked:
        it takes the retry's place), and this returns it as DEFERRED; ``get`` shows the running
        job until then."""
        if unique_for is not None:
            raise LimitError(_NO_KEYS)
        parents = check_depends_on(depends_on, job_id)
        check_allow_failure(allow_failure, parents)
        wait = check_replace(debounce, replace, job_id, delay, unique_for)
        return self._enqueue(
            [payload],
            priority,
            delay if wait is None else wait,
            max_attempts,
            None if job_id is None else [job_id],
            key,
            expires_in,
            expires_at,
            timeout,
            parents,
            allow_failure,
            wait is not None,
        )[0]

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
    ) -> list[Job]:
        """Add many jobs in one atomic script: all are stored or none.  As :meth:`ringq.Queue.enqueue_many`
        (``expires_in`` is turned into a time on this host's clock; the lease script compares it
        with the server's).  ``key`` applies to every job of the batch."""
        return self._enqueue(
            payloads,
            priority,
            delay,
            max_attempts,
            job_ids,
            key,
            expires_in,
            expires_at,
            timeout,
            None,
            False,
            False,
        )

    def _enqueue(
        self,
        payloads: Sequence[Any],
        priority: int,
        delay: float,
        max_attempts: int | None,
        job_ids: Sequence[str] | None,
        key: str | None,
        expires_in: float | None,
        expires_at: float | None,
        timeout: float | None,
        parents: list[str] | None,
        allow_failure: bool,
        replacing: bool,
    ) -> list[Job]:
        """The enqueue script's arguments from the public calls' (checked here), and its reply."""
        self._scripts.live()
        if reserved_for_results(self.name, self.auto_ids):
            refuse_reserved(self.name)
        if key is not None:
            codec.wrap_key(key, 0, b"")  # the local queue's rule for a key (ValueError)
        expiry = expiry_ms(expires_in, expires_at)
        ex = 0 if expiry is None else max(1, expiry)  # 0 in the script's arguments: no expiry
        to = timeout_ms(timeout) or 0
        payloads = check_payloads(payloads)
        given = check_job_ids(job_ids)
        ids = [""] * len(payloads) if given is None else given
        if len(ids) != len(payloads):
            raise ValueError(f"job_ids has {len(ids)} ids for {len(payloads)} payloads")
        if job_ids is None and not self.auto_ids:
            raise ValueError(
                "this queue takes jobs with caller ids only (auto_ids=False): give job_id"
            )
        if job_ids is not None:
            for jid in ids:
                check_caller_id(jid, allow_auto_form=not self.auto_ids)  # ringq/ids.py
        priority = check_priority(priority)
        delay = check_delay(delay)
        attempts = self.max_attempts if max_attempts is None else max_attempts
        attempts = check_attempts(attempts)
        args: list[Any] = [priority, int(round(delay * 1000)), attempts, len(payloads)]
        for i, (jid, payload) in enumerate(zip(ids, payloads)):
            kind, data, payloads[i] = codec.encode_stored(payload)  # as a consumer will see it
            try:
                args += [jid.encode("utf-8", "strict"), bytes([kind]) + data]
            except UnicodeEncodeError:
                raise SerializationError(f"job id {jid!r} is not valid Unicode text") from None
        if not payloads:
            return []
        tp, ts = clean(tracing.carrier())
        args += [ex, to, tp or "", ts or "", key or "", "r" if replacing else ""]
        args += [int(allow_failure), len(parents or ())]
        for pid in parents or ():
            try:
                args.append(pid.encode("utf-8", "strict"))
            except UnicodeEncodeError:
                raise SerializationError(f"job id {pid!r} is not valid Unicode text") from None
        rows = self._scripts.run("enqueue", args, write=True)
        if rows and rows[0][0] == b"cycle":
            raise ValueError(
                f"job {ids[0]!r} cannot depend on {rows[0][1].decode()!r}: that job waits for "
                f"{ids[0]!r} (depends on it, directly or through others)"
            )
        if rows and rows[0][0] == b"nf":
            raise JobNotFoundError(
                f"no job {rows[0][1].decode()!r} in queue {self.name!r} to depend on (never "
                "enqueued, purged, or finished and past retain_done)"
            )
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
        self._scripts.live()
        count, wait, vt = check_lease_args(
            count,
            wait,
            self.visibility_timeout if visibility_timeout is None else visibility_timeout,
            detach,
        )
        deadline = None if not wait else time.monotonic() + wait
        got: list[Job] = []
        while True:
            out = self._scripts.run("lease", [count - len(got), int(vt * 1000)])
            for i in range(1, len(out), 2):
                try:
                    got.append(_job(out[i], out[i + 1]))
                except SerializationError:
                    continue  # the lease expires and the job dead-letters after max_attempts
            # out[0]: ms until the next delayed job or lease deadline (-1: none), as a deadline
            self._due_at = None if out[0] < 0 else time.monotonic() + out[0] / 1000
            if got or deadline is None:  # blocks only while nothing at all is leasable
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
            s = self._scripts
            s.call(lambda: s.client.blpop([s.keys[WAKE]], timeout=nap), changes=False)

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
        """Stream leases as :meth:`ringq.Queue.consume` does (same arguments and answers), one
        ``lease`` per job: no job is held leased before it is handed out."""
        stopped = check_consume(count, wait, stop)
        vt = self.visibility_timeout if visibility_timeout is None else visibility_timeout

        def lease(n: int) -> list[Job]:
            return self.lease(n, visibility_timeout=vt, wait=wait)

        jobs = stream_leases(lease, count, stopped, vt)
        if handler is None:
            return jobs
        return handle_stream(self, jobs, handler)

    def wake_token(self) -> int:
        """For callers that wait in another thread (see :meth:`ringq.Queue.wake_token`): always 0
        here; wake-ups are tokens in the queue's wake list, so none is lost in between."""
        self._scripts.live()
        return 0

    def wait_for_wake(self, token: int, timeout: float) -> None:
        """Block until a wake-up token arrives, the next delayed job or lease deadline seen by this
        object's last lease comes, or ``timeout`` seconds (at most ``MAX_NAP``) pass.

        As :meth:`ringq.Queue.wait_for_wake`, a due time that has already passed does not cut the
        sleep short: the caller was woken for it and may have chosen not to lease (no free
        capacity), and must not spin.  Spurious returns are allowed."""
        self._scripts.live()
        self._sleep(min(timeout, MAX_NAP), past_due_wakes=False)

    def wake(self) -> None:
        """Wake one sleeper of this queue (any host) by pushing a token to the wake list."""
        self._scripts.live()
        s = self._scripts
        s.call(lambda: s.client.rpush(s.keys[WAKE], 1))

    # -- ack / nack / extend ---------------------------------------------------------------------------

    def ack(
        self, job: Job | str, *, result: Any = NO_RESULT, result_ttl: float = DEFAULT_RESULT_TTL
    ) -> None:
        """Mark a leased job done; as :meth:`ringq.Queue.ack` (acking again is harmless).  A
        ``result`` is kept in the companion queue ``<name>-results`` on the same server."""
        if result is not NO_RESULT:
            check_job_ref(job)
            jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
            cur = self.get(jid)
            repeated = cur.state is JobState.DONE and (tok < 0 or int(cur.lease_token or 0) == tok)
            if not repeated:
                if cur.state is not JobState.LEASED or (
                    tok >= 0 and int(cur.lease_token or 0) != tok
                ):
                    self.ack_many([job])  # refused: raises NotLeasedError saying why

                def ack() -> bool:
                    self.ack_many([job])
                    return True  # the script answers a repeat as it does an ack

                self._results.ack(jid, lease_of(cur), tok < 0, result, result_ttl, ack)
                return
        self.ack_many([job])

    def ack_many(self, jobs: Iterable[Job | str]) -> None:
        """Ack several jobs in one script.  Every job that can be acked is; then the first refusal
        (NotLeasedError, JobNotFoundError) is raised.  An item that is neither a Job nor a job
        id raises TypeError before any job is acked, and so does a str or bytes given for
        ``jobs``.  A retry after ConnectionLostError is safe."""
        jobs = check_job_refs(jobs)
        items = [(j.id, int(j.lease_token or 0)) if isinstance(j, Job) else (j, -1) for j in jobs]
        if not items:
            return
        args: list[Any] = [int(self.retain_done * 1000), len(items)]
        for jid, tok in items:
            args += [jid, tok]
        for (jid, _), status in zip(items, self._scripts.run("ack", args, write=True)):
            refuse(self.name, status, jid, "ack")

    def nack(self, job: Job | str, *, error: str | None = None, delay: float | None = None) -> Job:
        """Report a leased job as failed; as :meth:`ringq.Queue.nack` (the backoff delay is drawn here)."""
        self._scripts.live()
        delay = check_retry_delay(delay)
        check_job_ref(job)
        jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
        if delay is None:
            attempts = job.attempts if isinstance(job, Job) else self.get(jid).attempts
            delay = self.backoff.delay_for(attempts, self._rng)
        text = "" if error is None else str(error).encode("utf-8", "replace").decode()
        out = self._scripts.run(
            "nack", [jid, tok, text, int(error is not None), int(delay * 1000)], write=True
        )
        refuse(self.name, out[0], jid, "nack")
        return _job(out[1], out[2])

    def extend(self, job: Job | str, seconds: float) -> Job:
        """Push a lease's deadline to ``max(deadline, now) + seconds``.  Raises NotLeasedError if lost."""
        self._scripts.live()
        seconds = check_extension(seconds)
        check_job_ref(job)
        jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
        out = self._scripts.run("extend", [jid, tok, int(seconds * 1000)])
        refuse(self.name, out[0], jid, "extend")
        return _job(out[1], out[2])

    def kill_and_give_back(self, pid: int) -> int:
        """As :meth:`ringq.Queue.kill_and_give_back`: kill the stopped child ``pid``; always 0
        given back: a lease names no process here, and :meth:`consume` leases one job per call
        and hands it out at once, so no consumer holds a batch (a job a thread leased and had not
        started when its process was killed comes back after its visibility timeout).  Raises
        ValueError for a pid that is not a process id or not a stopped child of this process;
        QueueClosedError."""
        self._scripts.live()
        check_stopped_child(pid)
        os.kill(pid, signal.SIGKILL)
        return 0

    def reschedule(
        self, job: Job | str, *, priority: int | None = None, delay: float | None = None
    ) -> Job:
        """As :meth:`ringq.Queue.reschedule`: change a waiting job (ready, delayed or deferred):
        its priority, its run time (now + ``delay`` seconds, on the server's clock), or both.  A
        ready job that is due and keeps its priority keeps its place.  Raises JobNotWaitingError
        (leased or finished), JobNotFoundError, ValueError."""
        prio, wait = check_reschedule(priority, delay)
        return self._workflows.reschedule(job, prio, wait)

    def dependents(self, job: Job | str) -> list[str]:
        """Ids of the retained jobs enqueued with ``depends_on`` naming ``job`` (the job or its
        id), in enqueue order; ``[]`` for a job that has none or is not retained."""
        return self._workflows.dependents(job)

    # -- reads and whole-queue operations, lifecycle ---------------------------------------------------

    def get(self, job_id: str) -> Job:
        """The job with this id (a snapshot; an expired lease as what reclaiming it makes it).
        Raises JobNotFoundError if it is not retained."""
        return self._admin.get(job_id)

    def list_jobs(
        self, state: JobState | str | None = None, *, limit: int | None = None, decode: bool = True
    ) -> list[Job]:
        """Retained jobs in enqueue order, optionally only those in ``state``, at most ``limit``.
        A lease that expired is listed as what reclaiming it makes it, as :meth:`stats` counts it."""
        return self._admin.list_jobs(state, limit=limit, decode=decode)

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
    ) -> SearchPage:
        """As :meth:`ringq.Queue.search`.  Reads every retained job of the state asked for (no
        index on the server): meant for a person's search, not a hot loop."""
        if state is not None and state not in SEARCH_STATES:
            raise ValueError(f"state must be one of {list(SEARCH_STATES)}, got {state!r}")
        return self._admin.search(state, key, priority, job_id, error, after, limit)

    def dlq(self, *, limit: int | None = None) -> list[Job]:
        """Dead-lettered jobs, oldest first."""
        return self._admin.dlq(limit=limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """Move dead-lettered jobs (one, or all) back to READY with attempts reset; returns how many.
        Raises JobNotFoundError, or NotLeasedError if ``job_id`` is not dead."""
        return self._admin.requeue_dead(job_id)

    def purge(self) -> int:
        """Remove every retained job (ready, delayed, leased, done, dead); returns how many."""
        return self._admin.purge()

    def stats(self) -> QueueStats:
        """Counts by state and the cumulative counters (one script, so one consistent instant).
        Cancelled and expired jobs are kept ``retain_done`` seconds, like done ones.  A lease that
        expired counts as what reclaiming it makes it (ready, or dead when its attempts are used
        up), whether or not a lease call has reclaimed it yet; the script reads each such lease,
        so its cost grows with the expired leases no consumer has looked at.

        ``enqueued_total``, ``acked_total`` and ``dead_lettered_total`` count, since the queue's
        first use, new jobs stored by enqueue, acks, and moves to the dead-letter queue (by nack
        or lease expiry, the latter counted when a lease call reclaims it); purge keeps them."""
        return self._admin.stats()

    def import_jobs(self, jobs: Sequence[Job], *, source: str | None = None) -> int:
        """Store copies of ``jobs`` (READY, delayed or DEAD) keeping id, payload, priority, attempts,
        max attempts, available-at, enqueue time and last error; a job whose id is retained is
        skipped, so importing twice adds nothing.  Returns how many were added (for migrate).
        ``source``: as :meth:`ringq.Queue.import_jobs` (an automatic-form id becomes
        ``<source>-<id>``; without ``source`` it is refused with ValueError, nothing written)."""
        return self._admin.import_jobs(jobs, source=source)

    def server_identity(self) -> str:
        """Which server and database hold this queue, however the URL spells them:
        ``"<run_id>/<db>"`` (Redis' ``INFO server`` run_id is unique per server process; on a
        cluster, that of the node serving the queue's hash slot).  Raises ConnectionLostError."""
        return self._admin.server_identity()

    def cancel(self, job: Job | str) -> Job:
        """As :meth:`ringq.Queue.cancel`: CANCELLED if ready or delayed, cancel-requested if
        leased.  Raises JobFinishedError, JobNotFoundError."""
        return self._lifecycle.cancel(job)

    def pause(self, key: str | None = None) -> None:
        """Stop leases of the whole queue on every host until :meth:`resume`.  Per-key pause is
        not available on Redis (ValueError)."""
        return self._lifecycle.pause(key)

    def resume(self, key: str | None = None) -> None:
        """Undo :meth:`pause`; sleeping leases are woken."""
        return self._lifecycle.resume(key)

    def paused(self) -> dict[str, Any]:
        """``{"queue": bool, "keys": []}``."""
        return self._lifecycle.paused()

    def progress(self, job: Job | str, fraction: float, message: str | None = None) -> None:
        """As :meth:`ringq.Queue.progress`: fenced like an ack; shown by get and list_jobs."""
        return self._lifecycle.progress(job, fraction, message)

    def trace_first_attempt(self, job: Job | str, traceparent: str) -> None:
        """As :meth:`ringq.Queue.trace_first_attempt` (kept in the job's hash, field ``fa``)."""
        return self._lifecycle.trace_first_attempt(job, traceparent)

    def first_attempt_trace(self, job: Job | str) -> str | None:
        """As :meth:`ringq.Queue.first_attempt_trace`."""
        return self._lifecycle.first_attempt_trace(job)

    def result(self, job_id: str | Job, *, wait: float | None = None) -> Any:
        """As :meth:`ringq.Queue.result`.  A waiting call sleeps in BLPOP on the results queue's
        wake list (at most a second at a time)."""
        return self._lifecycle.result(job_id, wait=wait)

    def __len__(self) -> int:
        """Number of retained jobs (``stats().total``)."""
        return self.stats().total

    def __repr__(self) -> str:
        return f"RedisQueue({redact_url(self.url)!r}, name={self.name!r})"
