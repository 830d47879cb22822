"""Unique windows: ``enqueue(..., key=k, unique_for=s)`` adds a job only if no window of ``k`` is open.

A window is an entry ``(hash of k, expiry, job id)`` in the unique table of the limits file
(ringq/engine/limits_file.py; docs/limits.md has the layout), written under the file's ``flock``.  While
an entry is live, an enqueue of ``k`` returns the job that opened the window instead of adding one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from ringq import errors
from ringq.backend import as_float
from ringq.errors import LimitError

from .limits_file import (
    MAX_UNIQUE,
    MAX_UNIQUE_ID,
    OFF_UNIQUE,
    PAGE,
    U_EXPIRES,
    U_ID,
    UENTRY,
    UNI,
    LimitsFile,
)

__all__ = ["MAX_UNIQUE_FOR", "enqueue_unique"]

MAX_UNIQUE_FOR = 86400 * 366 * 30  # seconds: the longest unique window (about 30 years)


def enqueue_unique(
    file: LimitsFile,
    key: str,
    unique_for: float,
    enqueue: Callable[[], Any],
    find: Callable[[str], Any],
) -> Any:
    """Run ``enqueue()`` unless a unique window for ``key`` is open in ``file``; then return
    ``find(id)`` of the job that opened it.  Callers serialise calls in a process (LimitGate's
    mutex); the file's ``flock`` serialises processes.  Raises DuplicateJobError if that job is
    no longer retained, LimitError if ``unique_for`` is not a positive number of seconds or the
    table is full."""
    seconds = as_float(unique_for)
    if not 0 < seconds < MAX_UNIQUE_FOR:
        raise LimitError(
            f"unique_for must be seconds > 0 and below {MAX_UNIQUE_FOR} (about 30 years), "
            f"got {unique_for!r}"
        )
    h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little") | 1
    m = file.mapped(create_missing=True)
    assert m is not None
    with file.flock():
        now = int(time.time() * 1000)
        free = None
        for i in range(MAX_UNIQUE):
            base = OFF_UNIQUE + i * UENTRY
            uh, expires, idlen = UNI.unpack_from(m.mm, base)
            if expires <= now:
                free = i if free is None else free
            elif uh == h:
                job_id = bytes(m.mm[base + U_ID : base + U_ID + min(idlen, MAX_UNIQUE_ID)]).decode(
                    "utf-8", "replace"
                )
                try:
                    return find(job_id)
                except errors.JobNotFoundError:
                    raise errors.DuplicateJobError(
                        f"key {key!r} has a unique window open until {expires / 1000:.3f} (seconds since "
                        f"the epoch), opened by job {job_id!r}, which is no longer retained",
                        job_id,
                    ) from None
        if free is None:
            raise LimitError(
                f"{file.path}: all {MAX_UNIQUE} unique windows are open; wait for one to close"
            )
        job = enqueue()
        raw = job.id.encode("utf-8")
        if len(raw) > MAX_UNIQUE_ID:
            raise LimitError(
                f"job id of {len(raw)} bytes is too long for a unique window (at most {MAX_UNIQUE_ID})"
            )
        base = OFF_UNIQUE + free * UENTRY
        m.store64(base + U_EXPIRES, 0)
        m.mm[base : base + U_ID + MAX_UNIQUE_ID] = UNI.pack(h, 0, len(raw)).ljust(
            U_ID, b"\0"
        ) + raw.ljust(MAX_UNIQUE_ID, b"\0")
        m.store64(base + U_EXPIRES, now + int(seconds * 1000))  # last: the entry counts from here
        m.msync(
            OFF_UNIQUE + (free * UENTRY // PAGE) * PAGE,
            PAGE * 2 if (free * UENTRY) % PAGE + UENTRY > PAGE else PAGE,
        )
        return job
