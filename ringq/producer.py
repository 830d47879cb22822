"""Enqueue: turning payloads into records and appending them, plainly or idempotently.

Every payload is encoded and every record built before anything is written, so a bad payload or an
oversized record writes nothing.  With job ids the append is decided under the writer lock after
reading everything published, so a retained id is returned instead of written again (across
processes and restarts).  A QueueFullError is answered once by retiring every finished segment (the
tail included: a volume with room for one segment) and trying again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import codec, lifecycle, snapshot
from .errors import QueueFullError, SerializationError
from .ids import check_caller_id
from .index import Index, now_ms
from .job import Job, JobState
from .records import NewRecord
from .words import ST_DEAD, ST_READY, TIME_MAX

if TYPE_CHECKING:  # pragma: no cover
    from .ring import Placement, Ring

__all__ = ["Producer", "check_attempts", "MAX_ATTEMPTS_LIMIT", "MAX_DELAY"]

MAX_ATTEMPTS_LIMIT = 0xFFFF  # the record header's max_attempts field is 16-bit
MAX_DELAY = TIME_MAX / 1000 - 86400 * 366  # seconds: a time must fit the state word for a year more


def check_attempts(n: int) -> None:
    if not isinstance(n, int) or not 1 <= n <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"max_attempts must be an int in [1, {MAX_ATTEMPTS_LIMIT}], got {n!r}")


class Producer:
    """Appends jobs for one queue in this process.  ``lock`` is the queue's thread lock;
    ``refresh(relocate)`` catches the index up with other processes."""

    def __init__(
        self,
        ring: Ring,
        index: Index,
        lock: threading.RLock,
        refresh: Callable[[bool], None],
        auto_ids: bool = True,
    ) -> None:
        self.auto_ids = auto_ids  # False: every job has a caller id, of any form (Queue(auto_ids=))
        self.ring = ring
        self.index = index
        self.lock = lock
        self.refresh = refresh

    def enqueue(
        self,
        payloads: list[Any],
        priority: int,
        delay: float,
        attempts: int,
        job_ids: Sequence[str] | None,
        key: str | None = None,
        expires_at_ms: int | None = None,
    ) -> list[Job]:
        ring = self.ring
        recs = new_records(payloads, priority, delay, attempts, job_ids, key, self.auto_ids)
        if expires_at_ms is not None:  # lifecycle: the expiry goes in front of the codec's bytes
            for r in recs:
                r.payload, r.kind = (
                    lifecycle.wrap_expiry(r.payload, expires_at_ms),
                    lifecycle.KIND_EXPIRES,
                )
        ring.check_sizes(recs)  # the whole batch, before a byte of it is allocated or written
        bufs = [ring.build(r) for r in recs]
        if not recs:
            return []
        if job_ids is None:
            with self.lock:
                placed, ticket = self.retry_full(lambda: ring.append_nowait(recs, bufs))
            # Sync outside our lock, so that other threads append meanwhile (and share the sync).
            ring.ctl.count("enqueued", len(recs))
            ring.finish(ticket)
            return [
                fresh_job(r, p, payloads[i], key, expires_at_ms)
                for i, (r, p) in enumerate(zip(recs, placed))
            ]
        with self.lock, ring.locked():
            self.refresh(True)
            found: dict[int, tuple[int, int]] = {}
            first: dict[str, int] = {}
            todo: list[int] = []
            for i, jid in enumerate(job_ids):
                loc = self.index.find(jid)
                if loc is not None:
                    found[i] = loc
                elif jid not in first:
                    first[jid] = i
                    todo.append(i)
            placed = (
                self.retry_full(
                    lambda: ring.append([recs[i] for i in todo], [bufs[i] for i in todo])
                )
                if todo
                else []
            )
            ring.ctl.count("enqueued", len(placed))
            made: dict[int, Job] = {}
            for i, p in zip(todo, placed):
                made[i] = fresh_job(recs[i], p, payloads[i], key, expires_at_ms)
                self.index.ids[job_ids[i]] = (p[0], p[1])
            out = []
            for i, jid in enumerate(job_ids):
                if i in found:
                    seq, slot = found[i]
                    out.append(snapshot.job_at(ring, self.index.views[seq].seg, slot))
                else:
                    out.append(made[first[jid]])
            return out

    def import_jobs(self, jobs: Sequence[Job]) -> int:
        ring = self.ring
        recs = [imported_record(job) for job in jobs]
        bufs = [ring.build(r) for r in recs]
        with self.lock, ring.locked():
            self.refresh(True)
            todo, seen = [], set()
            for i, job in enumerate(jobs):
                if job.id not in seen and self.index.find(job.id) is None:
                    todo.append(i)
                seen.add(job.id)
            placed = ring.append([recs[i] for i in todo], [bufs[i] for i in todo]) if todo else []
            for i, p in zip(todo, placed):
                nseg = ring.segs.segment(p[0])
                if jobs[i].last_error and nseg is not None:
                    ring.write_error(nseg, p[1], 0, str(jobs[i].last_error))
            self.refresh(True)
            return len(todo)

    def retry_full(self, append: Callable[[], Any]) -> Any:
        """Run ``append``; after a QueueFullError make room once and try again."""
        try:
            return append()
        except QueueFullError:
            with self.ring.locked():
                self.refresh(False)
                n = self.ring.segs.retire_finished(thorough=True) + self.ring.retire_finished_tail()
            if not n:
                raise
            self.refresh(False)  # unmaps them: an unlinked file's space returns at its last unmap
            return append()


def new_records(
    payloads: list[Any],
    priority: int,
    delay: float,
    attempts: int,
    job_ids: Sequence[str] | None,
    key: str | None = None,
    auto_ids: bool = True,
) -> list[NewRecord]:
    """Validate the arguments of an enqueue and encode every payload (nothing is written yet);
    a ``key`` (ringq/limits.py) is wrapped around each payload (codec.wrap_key).

    Raises ValueError for out-of-range arguments, SerializationError for a payload or id that
    cannot be encoded.
    """
    if job_ids is None and not auto_ids:
        raise ValueError("this queue takes jobs with caller ids only (auto_ids=False): give job_id")
    if job_ids is not None:
        if len(job_ids) != len(payloads):
            raise ValueError(f"job_ids has {len(job_ids)} ids for {len(payloads)} payloads")
        for jid in job_ids:
            check_caller_id(jid, allow_auto_form=not auto_ids)  # ringq/ids.py
    if not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
        raise ValueError(f"priority must be a 32-bit signed int, got {priority!r}")
    if not 0 <= delay <= MAX_DELAY:
        raise ValueError(f"delay must be between 0 and about 33 years (in seconds), got {delay!r}")
    check_attempts(attempts)
    delay_ms = int(round(delay * 1000))
    recs = []
    for i, payload in enumerate(payloads):
        kind, data = codec.encode(payload)
        if key is not None:
            kind, data = codec.wrap_key(key, kind, data)
        id_bytes = b""
        if job_ids is not None:
            if not valid_text(job_ids[i]):
                raise SerializationError(f"job id {job_ids[i]!r} is not valid Unicode text")
            id_bytes = job_ids[i].encode("utf-8", "strict")
        recs.append(NewRecord(data, kind, id_bytes, priority, delay_ms, attempts))
    return recs


def imported_record(job: Job) -> NewRecord:
    """The record of a job brought from elsewhere, keeping its state (see Queue.import_jobs)."""
    if not isinstance(job.id, str) or not job.id or not valid_text(job.id):
        raise ValueError(f"job ids must be non-empty Unicode strings, got {job.id!r}")
    check_caller_id(job.id)  # another queue's automatic id: import_jobs(source=) renames it
    check_attempts(job.max_attempts)
    kind, data = codec.encode(job.payload)
    if job.key is not None:
        kind, data = codec.wrap_key(job.key, kind, data)
    dead = job.state is JobState.DEAD
    return NewRecord(
        data,
        kind,
        job.id.encode(),
        int(job.priority),
        0,
        job.max_attempts,
        min(max(int(job.attempts), 0), MAX_ATTEMPTS_LIMIT),
        state=ST_DEAD if dead else ST_READY,
        at_ms=now_ms() if dead else int(job.available_at * 1000),
    )


def fresh_job(
    rec: NewRecord,
    placed: Placement,
    payload: Any,
    key: str | None = None,
    expires_at_ms: int | None = None,
) -> Job:
    """The snapshot of a job just appended (no read back)."""
    segseq, slot, seq, enq_us, avail_ms = placed
    return Job(
        id=rec.id_bytes.decode() if rec.id_bytes else f"{seq:016x}",
        payload=payload,
        priority=rec.priority,
        state=JobState.READY,
        attempts=0,
        max_attempts=rec.max_attempts,
        available_at=avail_ms / 1000,
        enqueued_at=enq_us / 1e6,
        seq=seq,
        key=key,
        expires_at=None if expires_at_ms is None else expires_at_ms / 1000,
        _loc=(segseq, slot),
    )


def valid_text(s: str) -> bool:
    try:
        s.encode("utf-8", "strict")
        return True
    except UnicodeEncodeError:
        return False
