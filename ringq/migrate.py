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

from typing import Any

from .errors import RingqError
from .ids import migrated_id, source_tag
from .job import JobState

__all__ = ["migrate"]

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
        RingqError: a copied job is missing from ``dst`` afterwards, or ``src`` has leased jobs
        when ``purge_source`` is asked.
    """
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
