"""Job ids: the automatic form, the rule for caller ids, and the ids of migrated jobs.

A job enqueued without an id gets an *automatic id*: its sequence number in the queue as 16
lowercase hex digits (``f"{seq:016x}"``; the paths that build a job per lease or per enqueue
spell it ``seq.to_bytes(8, "big").hex()``, the same string at half the cost), on both backends.
Sequence numbers are per queue, so the same automatic id names different jobs in different
queues, and a caller's id of the same form would name a second job with one id.  Hence two rules:

* a caller-given id (``enqueue(job_id=)``, ``enqueue_many(job_ids=)``, ``import_jobs``) must not
  be 16 hex digits (either case): :func:`check_caller_id` refuses it with ValueError;
* a job copied from another queue whose id has the automatic form gets a new id derived from its
  source, :func:`migrated_id`: ``<source queue name>-<8 hex digits of a hash of the source
  location>-<old id>``.  It is deterministic, so a rerun of a migration finds the copies it made
  and adds nothing, and two sources never produce the same id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ringq.backend import is_url

if TYPE_CHECKING:  # pragma: no cover
    from .job import Job

__all__ = [
    "AUTO_ID",
    "RESERVED",
    "is_auto_id",
    "check_caller_id",
    "source_tag",
    "migrated_id",
    "renamed",
]

AUTO_ID = re.compile(r"[0-9a-fA-F]{16}")  # fullmatch: the automatic form (and its upper case)
RESERVED = "16 hex digits are reserved for automatic ids"


def is_auto_id(job_id: object) -> bool:
    """True if ``job_id`` is a string of exactly 16 hex digits (the automatic form)."""
    return isinstance(job_id, str) and AUTO_ID.fullmatch(job_id) is not None


def check_caller_id(job_id: object, allow_auto_form: bool = False) -> None:
    """Raise ValueError unless ``job_id`` is a non-empty string a caller may give.  A queue that
    makes no automatic ids (``auto_ids=False``) passes ``allow_auto_form``: there the form names
    a job of another queue and cannot collide."""
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"job ids must be non-empty strings, got {job_id!r}")
    if is_auto_id(job_id) and not allow_auto_form:
        raise ValueError(
            f"job id {job_id!r} refused: {RESERVED} (pick another form, e.g. a prefix)"
        )


def source_tag(queue: Any) -> str:
    """``<queue name>-<8 hex digits>`` naming the queue ``queue`` (either backend) by its location:
    the real path of its directory, or its Redis URL without the password."""
    where = queue.location  # a directory, or a Redis URL without its password
    location = "redis:" + where if is_url(where) else "dir:" + os.path.realpath(where)
    digest = hashlib.sha256(f"{location}\0{queue.name}".encode()).hexdigest()[:8]
    return f"{queue.name}-{digest}"


def migrated_id(tag: str, job_id: str) -> str:
    """The id a job keeps when copied from the source ``tag`` (:func:`source_tag`): its own id,
    unless that has the automatic form, which is only unique within its source queue."""
    return f"{tag}-{job_id}" if is_auto_id(job_id) else job_id


def renamed(jobs: Iterable[Job], source: str | None) -> list[Job]:
    """``jobs`` with each automatic-form id replaced by :func:`migrated_id` (copies; the
    originals are untouched); unchanged when ``source`` is None."""
    if source is None:
        return list(jobs)
    return [
        dataclasses.replace(j, id=migrated_id(source, j.id)) if is_auto_id(j.id) else j
        for j in jobs
    ]
