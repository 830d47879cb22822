"""Read-only views of a queue for people and monitors: what the metrics endpoint, the dashboard and
``ringq ... --json`` show.

Every function here only reads: counts come from :meth:`ringq.Queue.stats` (the control file's
cumulative counters and one copy of each state table), per-record facts (priority, holder) from
:func:`ringq.engine.verify.examine`, which validates every retained record.  A view therefore costs time
in proportion to the retained jobs; it is meant for a monitor's scrape interval, not a hot loop.
The JSON shapes of :func:`stats`, :func:`jobs`, :func:`dead` and :func:`verify` are exactly what
``ringq stats|list|dlq|verify --json`` print.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from ringq.backend import QueueBackend, is_url
from ringq.codec import jsonable
from ringq.engine.verify import QueueFiles, examine
from ringq.job import JobState
from ringq.local.queue import Queue
from ringq.results import ResultNotFoundError

__all__ = [
    "stats",
    "jobs",
    "dead",
    "dead_groups",
    "verify",
    "verify_summary",
    "overview",
    "leases",
    "job",
    "storage",
    "PAYLOAD_PREVIEW",
]

PAYLOAD_PREVIEW = 2000  # characters of a payload a job view shows
STATES = ("ready", "delayed", "leased", "done", "dead")


def stats(q: Queue) -> dict[str, int]:
    """``ringq stats --json``."""
    return q.stats().to_dict()


def jobs(q: Queue, state: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """``ringq list --json [--state S] [--limit N]``."""
    return [j.to_dict() for j in q.list_jobs(state, limit=limit)]


def dead(q: Queue, limit: int | None = None) -> list[dict[str, Any]]:
    """``ringq dlq --json``."""
    return [j.to_dict() for j in q.dlq(limit=limit)]


def verify_summary(rep: QueueFiles) -> dict[str, Any]:
    """``ringq verify --json`` of an :func:`ringq.engine.verify.examine` report."""
    notes = rep.notes + [f"{s.path}: {n}" for s in rep.segments for n in s.notes]
    return {
        "ok": not rep.damaged,
        "dir": rep.dir,
        "queue": rep.name,
        "segments": len(rep.segments),
        "records": sum(s.record_count for s in rep.segments),
        "damage": rep.damaged,
        "notes": notes,
    }


def verify(directory: str, name: str) -> dict[str, Any]:
    """``ringq verify --json``: every published record and header checked, nothing changed."""
    return verify_summary(examine(directory, name, limit=0))


def _records(rep: QueueFiles) -> list[Any]:
    return [r for seg in rep.segments for r in seg.records if r.crc_ok]


def overview(q: QueueBackend, rep: QueueFiles | None = None) -> dict[str, Any]:
    """Counts by state, by state and priority, the age of the oldest due job, limits, totals.

    Shape: ``{"time", "queue", "dir", "stats": {...stats}, "by_priority": [{"state", "priority",
    "jobs"}], "oldest_ready_age": seconds or None, "sync_count", "limits": [...],
    "visibility_timeout", "paused": {"queue": bool, "keys": [...]}}`` (``paused`` is
    :meth:`ringq.Queue.paused`, as ``ringq pause --json`` prints it).
    """
    now = time.time()
    st = q.stats().to_dict()
    counts: Counter[tuple[str, int]] = Counter()
    oldest = None
    if is_url(q.location):  # a Redis queue: no files to read; the counts by state stand alone
        sync_count = None
    else:
        rep = rep if rep is not None else examine(q.location, q.name, limit=None)
        for r in _records(rep):
            if r.state in STATES:
                counts[(r.state, int(r.priority or 0))] += 1
            if r.state == "ready" and r.time_ms is not None:
                oldest = r.time_ms if oldest is None else min(oldest, r.time_ms)
        sync_count = rep.control.get("sync_count")
    limits = q.limits() if isinstance(q, Queue) else []
    return {
        "time": now,
        "queue": q.name,
        "dir": q.location,
        "stats": st,
        "by_priority": [
            {"state": s, "priority": p, "jobs": n} for (s, p), n in sorted(counts.items())
        ],
        "oldest_ready_age": None if oldest is None else max(0.0, now - oldest / 1000),
        "sync_count": sync_count,
        "limits": [i.to_dict() for i in limits],
        "visibility_timeout": q.visibility_timeout,
        "paused": q.paused(),
    }


def leases(q: Queue, rep: QueueFiles | None = None) -> list[dict[str, Any]]:
    """In-flight leases: each leased job's ``to_dict()`` plus ``holder_pid`` (None for a detached
    lease), ``expires_in`` (seconds to its deadline) and ``visibility_timeout`` (the queue's)."""
    now = time.time()
    rep = rep if rep is not None else examine(str(q.dir), q.name, limit=None)
    holders = {r.id: r for r in _records(rep) if r.state == "leased"}
    out = []
    for j in q.list_jobs(JobState.LEASED):
        d = j.to_dict()
        r = holders.get(j.id)
        d["holder_pid"] = r.owner_pid if r is not None and r.owner else None
        d["detached"] = bool(r is not None and r.owner == 0)
        d["expires_in"] = None if j.lease_deadline is None else j.lease_deadline - now
        d["visibility_timeout"] = q.visibility_timeout
        out.append(d)
    return out


def dead_groups(q: Queue) -> list[dict[str, Any]]:
    """Dead letters grouped by ``last_error``, largest group first: ``[{"error", "count", "ids"}]``."""
    groups: dict[str, list[str]] = {}
    for j in q.dlq():
        groups.setdefault(j.last_error or "(no error text)", []).append(j.id)
    return [
        {"error": e, "count": len(ids), "ids": ids}
        for e, ids in sorted(groups.items(), key=lambda kv: -len(kv[1]))
    ]


def _preview(value: Any) -> str:
    """JSON text of ``jsonable(value)``, at most :data:`PAYLOAD_PREVIEW` characters."""
    text = json.dumps(jsonable(value), ensure_ascii=False, indent=1)
    return text if len(text) <= PAYLOAD_PREVIEW else text[: PAYLOAD_PREVIEW - 3] + "..."


def job(q: Queue, job_id: str) -> dict[str, Any]:
    """One job: ``ringq get --json`` (``to_dict()`` and ``dependents``, the ids of the retained
    jobs that depend on it) plus ``payload_preview`` and ``result_preview``: JSON text or a
    description of bytes and arrays, at most :data:`PAYLOAD_PREVIEW` characters;
    ``result_preview`` is None when no result is stored for the job
    (:meth:`ringq.Queue.result`).  Raises JobNotFoundError."""
    d = q.get(job_id).to_dict()
    d["dependents"] = q.dependents(job_id)
    d["payload_preview"] = _preview(d["payload"])
    try:
        d["result_preview"] = _preview(q.result(job_id))
    except ResultNotFoundError:
        d["result_preview"] = None
    return d


def storage(q: Queue, rep: QueueFiles | None = None) -> dict[str, Any]:
    """Files and segments: ``{"files": [{"name", "bytes"}], "bytes", "segments": [{"path", "bytes",
    "records", "counts"}], "damage", "notes"}``."""
    rep = rep if rep is not None else examine(str(q.dir), q.name, limit=0)
    return {
        "files": [{"name": n, "bytes": b} for n, b in rep.files],
        "bytes": sum(b for _n, b in rep.files),
        "segments": [
            {"path": s.path, "bytes": s.file_size, "records": s.record_count, "counts": s.counts}
            for s in rep.segments
        ],
        "damage": rep.damaged,
        "notes": rep.notes,
    }
