"""``ringq import-nobroker``: a nobroker queue's unfinished jobs brought into a ringq queue.

The log is read by ringq/local/foreign.py (read-only; the nobroker package is not needed); the
jobs go in through :meth:`ringq.Queue.import_jobs`, idempotent by id, so an import cut short is
simply run again.  A marker file then tells every later open that the directory's nobroker
queue was imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ringq.job import JobState

from .foreign import (
    imported_marker,
    nobroker_queues,
    read_locked,
)
from .queue import Queue

__all__ = ["NobrokerImport", "import_nobroker"]


@dataclass
class NobrokerImport:
    """What :func:`import_nobroker` did, per nobroker queue name.

    ``queues[name]`` counts: ``imported`` (written now), ``existing`` (ids already in the ringq
    queue: an earlier run brought them), ``ready``/``delayed``/``dead`` (of the jobs brought,
    written now or before), ``leased`` (held by a nobroker worker at the time of reading: the lost
    lease counts as an attempt, so one that used the last attempt is brought dead, also counted in
    ``dead``, and any other is brought ready, due when its lease would have expired), ``done``
    (finished: not brought).
    ``stopped`` lists logs whose reading stopped early, as ``(log path, why)``.
    """

    queues: dict[str, dict[str, int]] = field(default_factory=dict)
    stopped: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"queues": self.queues, "stopped": self.stopped}


def import_nobroker(
    source: str | os.PathLike[str],
    into: str | os.PathLike[str] | None = None,
    *,
    names: list[str] | None = None,
    **queue_options: Any,
) -> NobrokerImport:
    """Copy the unfinished jobs of the nobroker queues in directory ``source`` into ringq queues.

    Each nobroker queue goes into the ringq queue of the same name in directory ``into``
    (default: ``source`` itself, so that ``Queue(source)`` opens the imported jobs).  Pending,
    delayed and dead jobs keep their id, payload, priority, attempts, max_attempts and due time; a
    job leased at the time has its lease counted as a failed attempt (what nobroker's expiry
    would do if its holder never acks): with ``attempts >= max_attempts`` it is brought dead
    (``last_error`` says its lease was lost in the import), otherwise ready, due when its lease
    would have expired.  Finished jobs are not brought.  The nobroker files are only
    read (under nobroker's own lock, so a live nobroker process is not caught mid-write).  Rerunning
    adds nothing twice (ids are idempotency keys), so an import that was killed can be rerun.

    Args:
        source: the nobroker queue directory.
        into: the ringq queue directory (default: ``source``).
        names: only these nobroker queues (default: all of them).
        queue_options: passed to :class:`ringq.Queue` (``durability``, ``slot_size``, ...).
    Returns:
        A :class:`NobrokerImport`.
    Raises:
        FileNotFoundError: ``source`` holds no nobroker queue (of those ``names``).
        CorruptionError: a log is not a nobroker version-1 log.  RingqError subclasses from ringq.
    """
    source = os.fspath(source)
    into = source if into is None else os.fspath(into)
    found = nobroker_queues(source)
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise FileNotFoundError(
                f"no nobroker queue {missing[0]!r} in {source} (found: {sorted(found) or 'none'})"
            )
        found = {n: found[n] for n in names}
    if not found:
        raise FileNotFoundError(
            f"no nobroker queue in {source} (no <name>.NNNNNN.log starting with NOBROKER)"
        )
    result = NobrokerImport()
    for name, log in sorted(found.items()):
        jobs, stopped = read_locked(source, name, log)
        if stopped:
            result.stopped.append((log, stopped))
        now = time.time()
        counts = dict(imported=0, existing=0, ready=0, delayed=0, dead=0, leased=0, done=0)
        todo = []
        for job in jobs:
            if job.state is JobState.DONE:
                counts["done"] += 1
                continue
            if job.state is JobState.LEASED:
                # The lease is lost in the import (its holder can no longer ack into ringq), so it
                # counts as a failed attempt, as an expiry would in nobroker or in ringq: with no
                # attempt left the job is dead, otherwise due when its lease would have expired.
                counts["leased"] += 1
                if job.attempts >= job.max_attempts:
                    job.state, job.lease_deadline = JobState.DEAD, None
                    job.last_error = (
                        f"its lease (attempt {job.attempts} of {job.max_attempts}) was lost in "
                        "the import from nobroker; no attempt left"
                    )
                    counts["dead"] += 1
                else:
                    job.state, job.available_at = JobState.READY, job.lease_deadline or now
                    job.lease_deadline = None
            elif job.state is JobState.DEAD:
                counts["dead"] += 1
            elif job.available_at > now:
                counts["delayed"] += 1
            else:
                counts["ready"] += 1
            todo.append(job)
        with Queue(into, name, allow_foreign=True, **queue_options) as q:
            # nobroker's ids are uuid4 hex; a caller's id of 16 hex digits is renamed per source
            tag = f"{name}-{hashlib.sha256(os.path.realpath(source).encode()).hexdigest()[:8]}"
            counts["imported"] = q.import_jobs(todo, source=tag) if todo else 0
        counts["existing"] = len(todo) - counts["imported"]
        result.queues[name] = counts
        _write_marker(into, name, source, counts)
    return result


def _write_marker(into: str, name: str, source: str, counts: dict[str, int]) -> None:
    """Record, after its jobs are stored, that nobroker queue ``name`` was imported into ``into``
    (atomically: a killed import leaves no marker, and the directory stays refused)."""
    marker = imported_marker(into, name)
    tmp = f"{marker}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"source": os.path.realpath(source), "at": time.time(), "counts": counts}, fh)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, marker)
    dfd = os.open(into, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
