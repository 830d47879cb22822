"""The Redis backend's connection: the client, running its Lua scripts, and turning replies into
jobs and errors.

:class:`Scripts` owns one queue's redis-py client and key names, loads each script of
ringq/redis/lua.py once and runs it with ``EVALSHA`` (loading it again if the server lost its
script cache), waits for replicas with ``WAIT`` when asked, and maps redis-py's exceptions to
ringq's (:func:`guard`).  :func:`job_from_reply` and :func:`refuse` read the scripts' replies.
ringq/redis/queue.py builds the public API on them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ringq import codec
from ringq.backend import redact_url
from ringq.errors import (
    BackendError,
    ConnectionLostError,
    JobNotFoundError,
    NotLeasedError,
    QueueClosedError,
    ReplicationTimeoutError,
)
from ringq.job import Job, JobState

from .lua import PRELUDE, SCRIPTS

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_REDIS = False  # the three names above are undefined: RedisQueue() raises MissingExtraError
else:
    HAVE_REDIS = True

__all__ = ["HAVE_REDIS", "Scripts", "client_for", "guard", "job_from_reply", "redact_url", "refuse"]

_T = TypeVar("_T")

_STATES = {
    "ready": JobState.READY,
    "leased": JobState.LEASED,
    "done": JobState.DONE,
    "dead": JobState.DEAD,
    "cancelled": JobState.CANCELLED,
    "expired": JobState.EXPIRED,
    "deferred": JobState.DEFERRED,
}
_READS = frozenset(
    {"get", "list", "stats", "dependents"}
)  # scripts that change no job: safe to simply retry
# The keys of one queue, in the order the scripts receive them (KEYS[1] ... KEYS[20]).
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
    "deferred",
    "edges",
    "fair",
    "next",
    "pending",
    "links",
)
WAKE, PAUSE = _SUFFIXES.index("wake"), _SUFFIXES.index("pause")


class Scripts:
    """One queue's connection to Redis and the runner of its scripts.

    Args:
        url: as :class:`ringq.RedisQueue`.
        name: the queue's name; its keys are ``{ringq:<name>}:<suffix>``.
        min_replicas, replica_timeout: a write waits (Redis ``WAIT``) until this many replicas
            acknowledged it, for at most ``replica_timeout`` seconds.
        socket_timeout: seconds a reply may take before ConnectionLostError.

    Raises:
        ConnectionLostError: the server cannot be reached.  ValueError: ``min_replicas`` on a
        Redis Cluster (``WAIT`` counts one node's replicas only).
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        min_replicas: int,
        replica_timeout: float,
        socket_timeout: float,
    ) -> None:
        self.url = url
        self.name = name
        self.min_replicas = min_replicas
        self.replica_timeout = replica_timeout
        self.keys = [f"{{ringq:{name}}}:{s}" for s in _SUFFIXES]
        self.closed = False
        # No automatic retries: a command re-sent after a dropped connection could run twice
        # (an enqueue without an id would be stored twice).  Callers see ConnectionLostError.
        opts = dict(
            retry=Retry(NoBackoff(), 0), socket_timeout=socket_timeout, socket_connect_timeout=10.0
        )
        self.client = guard(url, lambda: client_for(url, **opts), changes=False)
        self.cluster = not isinstance(self.client, redis.Redis)
        if self.cluster and min_replicas:
            self.client.close()
            raise ValueError("min_replicas is not supported on Redis Cluster (WAIT is per node)")
        self._sha: dict[str, str | None] = {k: None for k in SCRIPTS}

    def live(self) -> None:
        """Raise QueueClosedError once :meth:`close` was called."""
        if self.closed:
            raise QueueClosedError(f"queue {self.name!r} at {redact_url(self.url)} is closed")

    def call(self, fn: Callable[[], _T], *, changes: bool = True) -> _T:
        """``fn()`` (a command on :attr:`client`) with redis-py's errors mapped as :func:`guard`;
        whatever a command fails with once :meth:`close` ran (in another thread: its connections
        are gone), QueueClosedError."""
        try:
            return guard(self.url, fn, changes=changes)
        except Exception:
            if self.closed:
                self.live()
            raise

    def run(self, script: str, args: Sequence[Any], write: bool = False) -> Any:
        """Run ``script`` (a name of ringq/redis/lua.py's SCRIPTS) on the queue's keys with ``args``
        and return its reply.  ``write``: wait for ``min_replicas`` after it.  Raises
        QueueClosedError, ConnectionLostError, BackendError, ReplicationTimeoutError."""
        self.live()
        return self.call(
            lambda: self._eval(script, list(args), write), changes=script not in _READS
        )

    def _eval(self, script: str, args: list[Any], write: bool) -> Any:
        keys = self.keys
        for _ in range(2):
            sha = self._sha[script]
            if sha is None:
                sha = self._sha[script] = self.client.script_load(PRELUDE + SCRIPTS[script])
            try:
                if not (write and self.min_replicas):
                    return self.client.evalsha(sha, len(keys), *keys, *args)
                pipe = self.client.pipeline(
                    transaction=False
                )  # one connection: WAIT counts its writes
                pipe.evalsha(sha, len(keys), *keys, *args)
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

    def close(self) -> None:
        """Close the client's connections (idempotent)."""
        if not self.closed:
            self.closed = True
            self.client.close()


def job_from_reply(
    meta: bytes, payload: bytes | None, known: Any = None, decode: bool = True
) -> Job:
    """The Job a script described: ``meta`` is its JSON record, ``payload`` the kind byte and the
    encoded payload.  ``known``: a 1-tuple holding the payload already in hand (not decoded again);
    ``decode=False`` leaves the payload None.  Raises SerializationError for a payload that does
    not decode."""
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
        timeout=m["to"] / 1000 if m.get("to") else None,
        trace_context=None
        if not m.get("tp")
        else {"traceparent": m["tp"], **({"tracestate": m["ts"]} if m.get("ts") else {})},
        key=m.get("k"),
        depends_on=[str(p) for p in m["dp"]] if isinstance(m.get("dp"), list) else None,
    )


def refuse(name: str, status: bytes | str, job_id: str, op: str) -> None:
    """Raise the error a script's status stands for (``"ok"``: return): JobNotFoundError for
    ``"nf"``, NotLeasedError saying why for ``"stale:<token>"`` and ``"state:<st>:<why>:<token>"``."""
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


def client_for(url: str, **options: Any) -> Any:
    """A redis-py client for ``url``: ``redis.RedisCluster`` if the server runs in cluster mode,
    else ``redis.Redis``; ``options`` go to ``from_url``.  Raises redis-py's errors (see :func:`guard`)."""
    r = redis.Redis.from_url(url, **options)
    if not url.startswith("unix:") and r.info("cluster").get("cluster_enabled"):
        r.close()
        return redis.RedisCluster.from_url(url, **options)
    return r


def guard(url: str, fn: Callable[[], _T], *, changes: bool = True) -> _T:
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
