"""Where a :mod:`ringq.aio` queue keeps its engine queues: a directory or a Redis server.

:class:`ringq.aio.Queue` needs four things from its storage, and this module is the only place
that knows how each backend provides them:

* open an engine queue by name (through :func:`ringq.connect`, so both backends offer the same
  ``enqueue``/``lease``/``ack``/``nack``/``extend``/``get``/``list_jobs`` and the same wake-up
  methods ``wake_token``/``wait_for_wake``/``wake`` that a waiter thread sleeps in);
* list the engine queues that exist, including kinds other processes created;
* a sweep lock: mutual exclusion among all processes for retention sweeps;
* close what it opened.

On a directory the queues are its ``<queue>.ctl`` files and the sweep lock is a ``flock`` on
``<name>-r.sweep``.  On Redis the queue names are kept in a set ``{ringq-aio:<name>}:queues``
(added to whenever a process opens a queue, and filled from a key scan when a store starts, so
kinds created with the command line are found too), and the sweep lock is redis-py's
:class:`redis.lock.Lock` on ``{ringq-aio:<name>}:sweep``: ``SET NX PX`` with a random token,
renewed per batch and released by a Lua compare-and-delete, so a holder whose lock expired can
neither release nor renew another's.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any, Protocol

from ringq.connect import connect, is_url
from ringq.engine import forksafe
from ringq.errors import MissingExtraError

__all__ = ["Store", "SweepLock", "store_for"]

# Seconds a Redis sweep lock lives without renewal: a sweep renews it every batch (milliseconds),
# so this only bounds how long a sweeper that died holding it blocks the next sweep.
SWEEP_LOCK_TTL = 60.0
# Seconds a finished or pruned record stays in Redis (RedisQueue's retain_done).  aio never reads
# them: a job's result is in the results queue until pruned, and a pruned job is gone by contract.
# A minute keeps memory bounded by the retention limits while covering a submit's check-then-append.
REDIS_RETAIN_DONE = 60.0


class SweepLock(Protocol):
    def acquire(self) -> bool:
        """Take the lock if free (never waits); True if this caller now holds it."""

    def renew(self) -> bool:
        """Keep holding it; False if it was lost (then stop sweeping)."""

    def release(self) -> None:
        """Let it go (harmless if it was lost)."""


class Store(Protocol):
    where: str  # the target for messages (a URL's password removed)
    checks_record_size: bool  # its engine queues refuse a record larger than max_record_bytes

    def start(self) -> None:
        """Connect (Redis; ConnectionLostError if unreachable).  Before any other call."""

    def open(self, qname: str, **options: Any) -> Any:
        """Engine queue ``qname`` through :func:`ringq.connect` (``options`` as there), recorded
        so that :meth:`queue_names` in any process lists it."""

    def queue_names(self, prefixes: tuple[str, ...]) -> list[str]:
        """Names of the engine queues that exist and start with one of ``prefixes``."""

    def sweep_lock(self) -> SweepLock:
        """The lock retention sweeps hold: one holder among all processes."""

    def close(self) -> None:
        """Release what :meth:`start` and :meth:`sweep_lock` took (idempotent)."""


def store_for(target: str | os.PathLike[str], name: str) -> Store:
    """The store for aio queue ``name`` at ``target``: a directory path, or a ``redis://``,
    ``rediss://`` or ``unix://`` URL.  Does no I/O beyond checking a directory target is not a
    foreign queue file.

    Raises:
        ValueError: another ``scheme://``.  ImportError: a Redis URL without redis-py.
        ringq.ForeignQueueError: ``target`` is an errand SQLite file.
    """
    if is_url(target):
        return RedisStore(target, name)
    if isinstance(target, str) and "://" in target:
        raise ValueError(
            f"unsupported queue URL {target!r}: use a directory or redis://, rediss://, unix://"
        )
    return DirStore(os.fspath(target), name)


class DirStore:
    """Engine queues in directory ``path``; the sweep lock is a flock on ``<name>-r.sweep``."""

    # The engine queues refuse a record larger than one segment themselves.
    checks_record_size = True

    def __init__(self, path: str, name: str) -> None:
        from ringq.local.foreign import check_not_foreign

        check_not_foreign(
            path
        )  # an errand SQLite file, a nobroker directory: say so now, not at open
        self.path = self.where = path
        self._sweep_file = os.path.join(path, f"{name}-r.sweep")
        self._fd = -1
        forksafe.register(self)

    def drop_inherited_locks(self) -> None:
        """In a forked child (ringq/engine/forksafe.py): close the copy of the sweep lock's descriptor,
        which would otherwise keep a dead parent's flock held (forksafe closed it)."""
        self._fd = -1

    def start(self) -> None:
        pass  # the directory is made by the first engine queue opened in it

    def open(self, qname: str, **options: Any) -> Any:
        return connect(self.path, qname, **options)

    def queue_names(self, prefixes: tuple[str, ...]) -> list[str]:
        return [
            f[:-4] for f in os.listdir(self.path) if f.endswith(".ctl") and f.startswith(prefixes)
        ]

    def sweep_lock(self) -> SweepLock:
        if self._fd < 0:
            self._fd = forksafe.opened(
                lambda: os.open(self._sweep_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            )
        return _Flock(self._fd)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            forksafe.close(fd)


class _Flock:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def acquire(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def renew(self) -> bool:
        return True  # a flock lasts until released or its holder dies

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)


class RedisStore:
    """Engine queues on the Redis server at ``url``; see the module docstring for the keys."""

    # Redis takes records far larger than a directory's segment: aio applies the directory's limit
    # itself (Queue._check_record_size), so a job behaves the same on both backends.
    checks_record_size = False

    def __init__(self, url: str, name: str) -> None:
        from ringq.redis import queue as redis_queue
        from ringq.redis.scripts import HAVE_REDIS

        if not HAVE_REDIS:
            raise MissingExtraError(
                "ringq.aio on Redis needs redis-py, which is not installed: pip install 'ringq[redis]'"
            )
        self.url = url
        self.where = redis_queue.redact_url(url)
        self._name = name
        self._registry = f"{{ringq-aio:{name}}}:queues"
        self._lock_key = f"{{ringq-aio:{name}}}:sweep"
        self._registered: set[str] = set()
        self._r: Any = None

    def call(self, fn: Any) -> Any:
        """``fn()``, a command on this store's Redis client, with ringq's error mapping."""
        from ringq.redis.queue import guard

        return guard(self.url, fn)

    def start(self) -> None:
        from ringq.redis.queue import client_for

        self._r = self.call(
            lambda: client_for(self.url, socket_timeout=30.0, socket_connect_timeout=10.0)
        )
        # Queues made without aio (the command line) are in no registry: find them by their keys.
        pattern = f"{{ringq:{self._name}-*}}:meta"
        found = self.call(
            lambda: {
                k.decode()[len("{ringq:") : -len("}:meta")] for k in self._r.scan_iter(pattern)
            }
        )
        if found:
            self.call(lambda: self._r.sadd(self._registry, *found))

    def open(self, qname: str, **options: Any) -> Any:
        q = connect(self.url, qname, retain_done=REDIS_RETAIN_DONE, **options)
        if qname not in self._registered:
            try:
                self.call(lambda: self._r.sadd(self._registry, qname))
            except BaseException:
                q.close()
                raise
            self._registered.add(qname)
        return q

    def queue_names(self, prefixes: tuple[str, ...]) -> list[str]:
        names = self.call(lambda: self._r.smembers(self._registry))
        return [n.decode() for n in names if n.decode().startswith(prefixes)]

    def sweep_lock(self) -> SweepLock:
        return _RedisLock(
            self,
            self._r.lock(
                self._lock_key, timeout=SWEEP_LOCK_TTL, blocking=False, thread_local=False
            ),
        )

    def close(self) -> None:
        if self._r is not None:
            self._r.close()
        self._r = None
        self._registered.clear()


class _RedisLock:
    def __init__(self, store: RedisStore, lock: Any) -> None:
        self._store = store
        self._lock = lock

    def acquire(self) -> bool:
        return bool(self._store.call(lambda: self._lock.acquire(blocking=False)))

    def renew(self) -> bool:
        from redis.exceptions import LockError

        try:  # PX back to the full TTL, if the token still matches
            self._store.call(self._lock.reacquire)
        except LockError:
            return False
        return True

    def release(self) -> None:
        from redis.exceptions import LockError

        try:
            self._store.call(self._lock.release)  # compare-and-delete: never frees another's lock
        except LockError:
            pass  # it expired meanwhile: nothing of ours to release
