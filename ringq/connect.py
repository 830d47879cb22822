"""``ringq.connect``: one entry point for both backends, chosen by the target's form."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ringq.backend import REDIS_SCHEMES, is_url, redact_url

if TYPE_CHECKING:  # pragma: no cover - the backends load on first use
    from ringq.local.queue import Queue
    from ringq.redis.queue import RedisQueue

__all__ = ["connect", "is_url", "redact_url", "REDIS_SCHEMES"]


def connect(
    target: str | os.PathLike[str], name: str = "default", **options: Any
) -> Queue | RedisQueue:
    """Open queue ``name``: a local :class:`ringq.Queue` for a directory path, a
    :class:`ringq.redis.queue.RedisQueue` for a ``redis://``, ``rediss://`` or ``unix://`` URL.

    Both satisfy :class:`ringq.backend.QueueBackend`: the same methods, arguments, results and
    errors for everything that interface names.  What only the local queue has (limits, periodic
    jobs, compaction, the recovery report) is on :class:`ringq.Queue` alone: check
    ``FEATURE_... in q.features`` and narrow with ``isinstance(q, ringq.Queue)``.  ``options`` are
    passed on (storage options of the local queue, such as ``durability``, are ignored by the
    Redis one; ``min_replicas``, ``retain_done`` and ``socket_timeout`` exist only there).

    Raises:
        ValueError: an unknown URL scheme (``something://``), bad name or setting.
        MissingExtraError: a Redis URL without redis-py installed (the message says
            ``pip install 'ringq[redis]'``); a RingqError and an ImportError.
    """
    if is_url(target):
        from ringq.redis.queue import RedisQueue

        return RedisQueue(target, name, **options)
    if isinstance(target, str) and "://" in target:
        raise ValueError(
            f"unsupported queue URL {target!r}: use a directory or redis://, rediss://, unix://"
        )
    from ringq.local.queue import Queue

    return Queue(target, name, **options)
