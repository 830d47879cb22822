"""Enqueue: turning payloads into records and appending them, plainly or idempotently.

Every payload is encoded and every record's size checked before anything is written, so a bad
payload or an oversized record writes nothing.  The batch then goes to the engine packed -- a codec
byte and a length per job, the ids and payloads joined in one buffer (Ring.append_packed) -- and the
returned jobs are built from what the append reports, without reading anything back.  With job ids the append is decided under the writer lock after
reading everything published, so a retained id is returned instead of written again (across
processes and restarts).  A QueueFullError is answered once by retiring every finished segment (the
tail included: a volume with room for one segment) and trying again.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ringq import codec
from ringq.backend import (
    MAX_ATTEMPTS_LIMIT,
    MAX_DELAY,
    PRIORITY_LIMIT,
    check_attempts,
    check_delay,
    check_priority,
    due_delay,
    refuse_reserved,
    reserved_for_results,
    timeout_ms,
)
from ringq.engine import meta, records, runs, snapshot
from ringq.engine.appends import REC_HEADER_SIZE
from ringq.engine.records import KIND_JOB, NewRecord
from ringq.engine.words import ST_DEAD, ST_READY, TIME_MAX, now_ms
from ringq.errors import QueueFullError, SerializationError
from ringq.ids import check_caller_id
from ringq.job import Job, JobState

if TYPE_CHECKING:  # pragma: no cover
    from ringq.engine.index import Index
    from ringq.engine.ring import Ring

    from .context import Outside

__all__ = ["Producer"]

# A delay, expiry or retry time must fit the state word for a year more.
assert MAX_DELAY + 86400 * 366 <= TIME_MAX / 1000


class Producer:
    """Appends jobs for one queue in this process.  ``lock`` is the queue's thread lock (taken only while the queue is open),
    ``outside`` counts a use of the mappings outside it (ringq/local/context.py);
    ``refresh(relocate)`` catches the index up with other processes; ``index()`` is the reader's
    index, asked for only by an enqueue with ids (a plain enqueue never builds it)."""

    def __init__(
        self,
        ring: Ring,
        index: Callable[[], Index],
        lock: AbstractContextManager[None],
        outside: Outside,
        refresh: Callable[[bool], None],
        auto_ids: bool = True,
    ) -> None:
        self.auto_ids = auto_ids  # False: every job has a caller id, of any form (Queue(auto_ids=))
        self.reserved = reserved_for_results(ring.name, auto_ids)
        self.ring = ring
        self.index = index
        self.lock = lock
        self.outside = outside  # counts in the sync after an append, which runs outside the lock
        self.refresh = refresh
        self.max_bytes = ring.max_record_bytes()  # the geometry is fixed when the queue is created
        self.expressable = auto_ids and not self.reserved  # automatic ids, not a results queue

    def express(self, payload: dict[str, Any], attempts: int) -> Job | None:
        """:meth:`enqueue_one` of a dict payload with the default arguments (``attempts`` the
        queue's) in one C call (Appender.express), or None when it must go the general way
        (nothing written).  Raises QueueClosedError."""
        if not self.expressable:
            return None
        counted = False
        try:
            with self.lock:
                got = self.ring.express(payload, attempts)
                if got is None:
                    return None
                job, ticket = got
                if ticket is None:
                    return job
                self.outside.enter_held()  # the sync below runs outside the lock: a close waits
                counted = True  # no call since the count: see _left_outside
            self.ring.finish(ticket)
            with self.outside.ctx.lock:
                self.outside.leave_held()
                counted = False  # no call since the count-out
        except BaseException:
            self._left_outside(counted)
            raise
        return job

    def _left_outside(self, counted: bool) -> None:
        """As an exception leaves an append whose strategy's sync runs outside our lock (so that
        other threads append meanwhile and share it): count it out of the mappings' users if it
        is still counted in.  The caller notes its count in (``outside.enter_held``) and out
        (``outside.leave_held``, under the lock) in a ``counted`` flag with no call between the
        count and the note, so an exception (a signal's handler) anywhere leaves it counted
        exactly when the flag says so: counted out once, never twice."""
        if counted:
            self.outside.leave()

    def enqueue_one(
        self,
        payload: Any,
        priority: int,
        delay: float,
        attempts: int,
        key: str | None = None,
        m: meta.Meta | None = None,
    ) -> Job:
        """One job without a caller id: :meth:`enqueue` without the lists.  ``delay`` as the
        caller gave it (a negative one means now: backend.due_delay)."""
        if self.reserved:
            refuse_reserved(self.ring.name)
        if (
            (delay.__class__ is float or delay.__class__ is int)
            and delay == 0
            and priority.__class__ is int
            and attempts.__class__ is int
            and -PRIORITY_LIMIT <= priority < PRIORITY_LIMIT
            and 1 <= attempts <= MAX_ATTEMPTS_LIMIT
            and self.auto_ids
        ):
            delay_ms = 0  # the common arguments, passing check_args; exact types only
        else:
            delay_ms = check_args(priority, due_delay(delay), attempts, None, self.auto_ids)
            priority, attempts = int(priority), int(attempts)  # numpy integers, checked
        kind, data, payload = codec.encode_stored(payload)  # the Job shows what a consumer gets
        if key is not None:
            kind, data = codec.wrap_key(key, kind, data)
        rkind = KIND_JOB
        if m is not None:  # the expiry prefix or the metadata block (ringq/engine/meta.py)
            kind, data, rkind = meta.wrap(kind, data, m)
        ring = self.ring
        length = REC_HEADER_SIZE + len(data)
        if length > self.max_bytes:
            records.check_sizes([NewRecord(data, kind)], self.max_bytes, ring.name)
        counted = False
        try:
            with self.lock:
                segseq, slot, seq, enq_us, avail_ms, ticket = self.retry_full(
                    ring.append_one, kind, data, priority, delay_ms, attempts, rkind
                )
                settled = ring.settled(ticket)
                if not settled:  # the sync below runs outside the lock: a close waits for it
                    self.outside.enter_held()
                    counted = True  # no call since the count: see _left_outside
            # Built before the sync: what runs after the disk answers runs on cold caches.
            (job,) = runs.fresh(
                [(segseq, 0, 1)],
                [slot],
                seq,
                enq_us,
                avail_ms,
                [payload],
                None,
                priority,
                attempts,
                key,
                shown(m),
                ring.identity,
            )
            if not settled:
                ring.finish(ticket)
                with self.outside.ctx.lock:
                    self.outside.leave_held()
                    counted = False  # no call since the count-out
        except BaseException:
            self._left_outside(counted)
            raise
        return job

    def enqueue(
        self,
        payloads: list[Any],
        priority: int,
        delay: float,
        attempts: int,
        job_ids: Sequence[str] | None,
        key: str | None = None,
        m: meta.Meta | None = None,
    ) -> list[Job]:
        """Append ``payloads`` as new jobs; returns their snapshots, in order.

        Every payload is encoded and every record's size checked before anything is written
        (SerializationError, RecordTooLargeError, ValueError: nothing written).  With ``job_ids``
        the batch is decided under the writer lock: an id already retained returns its job and
        writes nothing (so does an id repeated in the batch after its first use).
        """
        n = len(payloads)
        if self.reserved:
            refuse_reserved(self.ring.name)
        delay_ms = check_args(priority, delay, attempts, job_ids, self.auto_ids, n)
        priority, attempts = int(priority), int(attempts)  # numpy integers, checked
        if not n:
            return []
        kinds, datas, payloads = encode_all(payloads, key)
        rkind = KIND_JOB
        if m is not None:  # the expiry prefix or the metadata block (ringq/engine/meta.py)
            wrapped = [meta.wrap(k, d, m) for k, d in zip(kinds, datas)]
            kinds = tuple(w[0] for w in wrapped)
            datas = [w[1] for w in wrapped]
            rkind = wrapped[0][2]
        ids = None if job_ids is None else encode_ids(job_ids)
        lens = list(map(len, datas))
        longest = max(lens)
        id_longest = 0 if ids is None else max(map(len, ids))
        if (
            REC_HEADER_SIZE + longest + id_longest > self.max_bytes
            or id_longest > records.MAX_ID_FIELD
        ):
            # Some record is too large: find the first, for the message records.check_sizes gives.
            records.check_sizes(
                [
                    NewRecord(d, k, b"" if ids is None else ids[i])
                    for i, (k, d) in enumerate(zip(kinds, datas))
                ],
                self.max_bytes,
                self.ring.name,
            )
        ring = self.ring
        if job_ids is None:
            counted = False
            try:
                with self.lock:
                    placed, heads, seq0, enq_us, avail_ms, ticket = self.retry_full(
                        ring.append_packed,
                        n,
                        bytes(kinds),
                        None,
                        array("I", lens),
                        b"".join(datas),
                        REC_HEADER_SIZE + longest,
                        priority,
                        delay_ms,
                        attempts,
                        rkind,
                    )
                    self.outside.enter_held()  # the sync below runs outside the lock
                    counted = True  # no call since the count: see _left_outside
                ring.finish(ticket)
                with self.outside.ctx.lock:
                    self.outside.leave_held()
                    counted = False  # no call since the count-out
            except BaseException:
                self._left_outside(counted)
                raise
            # The snapshots of the jobs just appended, built in one call (no read back).
            return runs.fresh(
                placed,
                heads,
                seq0,
                enq_us,
                avail_ms,
                payloads,
                None,
                priority,
                attempts,
                key,
                shown(m),
                ring.identity,
            )
        assert ids is not None  # encoded from job_ids, which are given here
        with self.lock, ring.locked():
            self.refresh(True)
            found: dict[int, tuple[int, int]] = {}
            first: dict[str, int] = {}
            todo: list[int] = []
            for i, jid in enumerate(job_ids):
                loc = self.index().find(jid)
                if loc is not None:
                    found[i] = loc
                elif jid not in first:
                    first[jid] = i
                    todo.append(i)
            made: dict[int, Job] = {}
            if todo:
                t_ids = [ids[i] for i in todo]
                t_datas = [datas[i] for i in todo]
                placed, heads, seq0, enq_us, avail_ms, ticket = self.retry_full(
                    ring.append_packed,
                    len(todo),
                    bytes(kinds[i] for i in todo),
                    array("H", map(len, t_ids)),
                    array("I", map(len, t_datas)),
                    b"".join([b for pair in zip(t_ids, t_datas) for b in pair]),
                    REC_HEADER_SIZE + max(lens[i] + len(ids[i]) for i in todo),
                    priority,
                    delay_ms,
                    attempts,
                    rkind,
                )
                # Counted as a user of the mappings (as the syncs outside the lock are) with its
                # note, as in enqueue_one: see _left_outside.
                counted = False
                try:
                    self.outside.enter_held()
                    counted = True
                    ring.finish(ticket)
                    self.outside.leave_held()
                    counted = False
                except BaseException:
                    self._left_outside(counted)
                    raise
                jobs = runs.fresh(
                    placed,
                    heads,
                    seq0,
                    enq_us,
                    avail_ms,
                    [payloads[i] for i in todo],
                    [job_ids[i] for i in todo],
                    priority,
                    attempts,
                    key,
                    shown(m),
                    ring.identity,
                )
                for i, job in zip(todo, jobs):
                    made[i] = job
                    self.index().ids[job_ids[i]] = job.record_position[:2]
            out = []
            for i, jid in enumerate(job_ids):
                if i in found:
                    seq, slot = found[i]
                    out.append(snapshot.job_at(ring, self.index().views[seq].seg, slot))
                else:
                    out.append(made[first[jid]])
            return out

    def import_jobs(self, jobs: Sequence[Job]) -> int:
        ring = self.ring
        recs = [imported_record(job) for job in jobs]
        ring.check_sizes(recs)
        with self.lock, ring.locked():
            self.refresh(True)
            todo, seen = [], set()
            for i, job in enumerate(jobs):
                if job.id not in seen and self.index().find(job.id) is None:
                    todo.append(i)
                seen.add(job.id)
            placed = ring.append([recs[i] for i in todo]) if todo else []
            ring.ctl.count("enqueued", len(placed))  # imported jobs were added to this queue
            for i, p in zip(todo, placed):
                nseg = ring.segs.segment(p[0])
                if jobs[i].last_error and nseg is not None:
                    ring.write_error(nseg, p[1], 0, str(jobs[i].last_error))
            self.refresh(True)
            return len(todo)

    def retry_full(self, append: Callable[..., Any], *args: Any) -> Any:
        """Run ``append(*args)``; after a QueueFullError make room once and try again."""
        try:
            return append(*args)
        except QueueFullError:
            with self.ring.locked():
                self.refresh(False)
                n = self.ring.segs.retire_finished(thorough=True) + self.ring.retire_finished_tail()
            if not n:
                raise
            self.refresh(False)  # unmaps them: an unlinked file's space returns at its last unmap
            return append(*args)


def check_args(
    priority: int,
    delay: float,
    attempts: int,
    job_ids: Sequence[str] | None,
    auto_ids: bool = True,
    n: int = 1,
) -> int:
    """Validate the arguments of an enqueue of ``n`` jobs; returns the delay in ms.  Raises
    ValueError."""
    if job_ids is None:
        if not auto_ids:
            raise ValueError(
                "this queue takes jobs with caller ids only (auto_ids=False): give job_id"
            )
    else:
        if len(job_ids) != n:
            raise ValueError(f"job_ids has {len(job_ids)} ids for {n} payloads")
        for jid in job_ids:
            check_caller_id(jid, allow_auto_form=not auto_ids)  # ringq/ids.py
    check_priority(priority)
    check_attempts(attempts)
    return int(round(check_delay(delay) * 1000))


def encode_all(
    payloads: Sequence[Any], key: str | None
) -> tuple[tuple[int, ...], list[bytes], list[Any]]:
    """``(codec ids, bytes, stored values)`` of every payload (codec.encode_stored_many: the
    values as a consumer will decode them), each wrapped with ``key`` if given
    (codec.wrap_key).  Raises SerializationError."""
    pairs, values = codec.encode_stored_many(payloads)
    if key is not None:
        pairs = [codec.wrap_key(key, k, d) for k, d in pairs]
    kinds, datas = zip(*pairs)
    return kinds, list(datas), values


def encode_ids(job_ids: Sequence[str]) -> list[bytes]:
    """The UTF-8 bytes of every job id.  Raises SerializationError for a string that is not valid
    Unicode text (a lone surrogate)."""
    out = []
    for jid in job_ids:
        if not valid_text(jid):
            raise SerializationError(f"job id {jid!r} is not valid Unicode text")
        out.append(jid.encode("utf-8", "strict"))
    return out


def shown(
    m: meta.Meta | None,
) -> tuple[float | None, None, None, float | None, dict[str, str] | None]:
    """The Job fields ``expires_at``, ``progress``, ``progress_message``, ``timeout`` and
    ``trace_context`` of a job just enqueued with ``m``."""
    if m is None:
        return None, None, None, None, None
    return (
        None if m.expires_ms is None else m.expires_ms / 1000,
        None,
        None,
        None if m.timeout_ms is None else m.timeout_ms / 1000,
        m.trace_context(),
    )


def imported_record(job: Job) -> NewRecord:
    """The record of a job brought from elsewhere, keeping its state (see Queue.import_jobs)."""
    if not isinstance(job.id, str) or not job.id or not valid_text(job.id):
        raise ValueError(f"job ids must be non-empty Unicode strings, got {job.id!r}")
    check_caller_id(job.id)  # another queue's automatic id: import_jobs(source=) renames it
    check_attempts(job.max_attempts)
    kind, data = codec.encode(job.payload)
    if job.key is not None:
        kind, data = codec.wrap_key(job.key, kind, data)
    rkind = KIND_JOB
    m = meta.of(None, timeout_ms(job.timeout), job.trace_context)
    if m is not None:  # its timeout and trace context travel with it
        kind, data, rkind = meta.wrap(kind, data, m)
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
        kind=rkind,
    )


def valid_text(s: str) -> bool:
    try:
        s.encode("utf-8", "strict")
        return True
    except UnicodeEncodeError:
        return False
