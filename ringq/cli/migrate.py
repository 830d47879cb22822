"""``ringq migrate``: copy a queue's pending, delayed and dead jobs between backends.

Jobs are read from the source with ``list_jobs`` and written to the destination with its
``import_jobs``, which keeps each job's id, payload, priority, attempts, max attempts, due time and
last error, and skips ids the destination already retains.  So a migration killed halfway is
finished by running it again, and a second run adds nothing.  Leased jobs are not copied (their
holder may still ack them); done jobs are history and stay behind.

An automatic id (16 hex digits, the job's sequence number) is unique only within its own queue,
so such a job is copied as ``<source queue name>-<8 hex digits naming the source location>-<id>``
(ringq/ids.py): deterministic, so a rerun still adds nothing, and two sources merged into one
queue never collide.  Ids a caller gave are kept.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ringq.connect import is_url
from ringq.errors import RingqError
from ringq.ids import migrated_id, source_tag
from ringq.job import JobState

__all__ = ["migrate", "location", "refuse_same_queue"]

_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}

BATCH = 500  # jobs per import call: one Lua script or one writer-lock hold each


def migrate(src: Any, dst: Any, *, purge_source: bool = False) -> dict[str, int]:
    """Copy the READY (including delayed) and DEAD jobs of queue ``src`` into queue ``dst``.

    Args:
        src, dst: open queues (``ringq.connect``), of either backend.
        purge_source: after every copied job is confirmed in ``dst``, purge ``src`` (refused while
            ``src`` has leased jobs: stop its workers first).

    Returns:
        ``{"copied": added now, "present": already in dst, "leased_skipped": ..., "purged": ...}``.
    Raises:
        ValueError: ``src`` and ``dst`` are the same queue (copying onto itself and then purging
            would empty it).
        RingqError: a copied job is missing from ``dst`` afterwards, or ``src`` has leased jobs
        when ``purge_source`` is asked.
    """
    if _identity(src) == _identity(dst):
        raise ValueError(
            f"source and destination are the same queue {src.name!r} at {_shown(src)}; "
            "migrate copies between two different queues"
        )
    jobs = src.list_jobs(JobState.READY) + src.list_jobs(JobState.DEAD)
    tag = source_tag(src)
    added = 0
    for i in range(0, len(jobs), BATCH):
        added += dst.import_jobs(jobs[i : i + BATCH], source=tag)
    for job in jobs:
        dst.get(migrated_id(tag, job.id))  # JobNotFoundError if the copy is not there
    leased = src.stats().leased
    purged = 0
    if purge_source:
        if leased:
            raise RingqError(
                f"not purging the source: {leased} job(s) are leased there; stop its workers and rerun"
            )
        purged = src.purge()
    return {
        "copied": added,
        "present": len(jobs) - added,
        "leased_skipped": leased,
        "purged": purged,
    }


def location(target: str | os.PathLike[str]) -> tuple[Any, ...]:
    """A canonical key for where a queue target lives, equal for two spellings of one place.

    A directory becomes its ``os.path.realpath`` (symlinks, ``..`` and trailing slashes resolved);
    a Redis URL becomes ``(scheme family, host, port, db)`` with the default port 6379 and db 0
    filled in, the host lower-cased and every loopback name mapped to one; a ``unix://`` URL
    becomes the socket's real path and db.  Credentials and other options do not take part.
    """
    if not is_url(target):
        return ("dir", os.path.realpath(os.fspath(target)))
    parts = urlsplit(str(target))
    query = parse_qs(parts.query)
    query_db = query.get("db", [None])[0]
    if parts.scheme == "unix":
        return ("unix", os.path.realpath(unquote(parts.path)), int(query_db or 0))
    path_db = parts.path.strip("/")
    db = query_db if query_db is not None else (path_db or 0)
    host = (parts.hostname or "localhost").lower()
    host = "loopback" if host in _LOOPBACK else host
    return ("tcp", host, parts.port or 6379, int(db))


def refuse_same_queue(src: str | os.PathLike[str], dst: str | os.PathLike[str], name: str) -> None:
    """Raise ValueError if targets ``src`` and ``dst`` (paths or URLs) name the same queue ``name``."""
    if location(src) == location(dst):
        raise ValueError(
            f"{src} and {dst} are the same place, so queue {name!r} would be copied onto itself "
            "(and --purge-source would empty it); give two different queues"
        )


def _identity(q: Any) -> tuple[Any, ...]:
    """Where an open queue lives: its real directory, or its Redis server's identity and db."""
    server = getattr(q, "server_identity", None)
    if server is not None:
        return ("redis", server(), q.name)
    return ("dir", os.path.realpath(q.dir), q.name)


def _shown(q: Any) -> str:
    return str(getattr(q, "dir", None) or q)
