"""Job snapshots: a :class:`ringq.job.Job` built from a record and a state word."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringq import codec
from ringq.errors import CorruptionError, JobNotFoundError
from ringq.job import Job, JobState

from . import lifecycle, records
from .segment import Segment
from .words import (
    END_EXPIRED,
    FLAG_CANCEL,
    ST_DEAD,
    ST_DONE,
    ST_LEASED,
    ST_READY,
    WHY_DIED,
    WHY_EXPIRED,
    lease_count,
    rel_time,
    state,
    why,
)

if TYPE_CHECKING:  # pragma: no cover
    from .ring import Ring

__all__ = ["job_at", "last_error"]


#: last_error of a job whose last lease was lost, by the reason in its state word
LOST_TEXT = {
    WHY_EXPIRED: "lease expired: visibility timeout passed before ack",
    WHY_DIED: "lease holder died: its process exited without ack",
}

STATE_OF = {
    ST_READY: JobState.READY,
    ST_LEASED: JobState.LEASED,
    ST_DONE: JobState.DONE,
    ST_DEAD: JobState.DEAD,
}


def state_of(word: int) -> JobState | None:
    """The JobState of a state word (None: not a retained job).  A DONE word with the cancel flag
    is CANCELLED or EXPIRED, a READY one DEFERRED (ringq/engine/words.py)."""
    st = STATE_OF.get(word & 7)
    if word & FLAG_CANCEL:
        if st is JobState.DONE:
            return JobState.EXPIRED if why(word) == END_EXPIRED else JobState.CANCELLED
        if st is JobState.READY:
            return JobState.DEFERRED
    return st


def job_at(
    ring: Ring,
    seg: Segment,
    slot: int,
    word: int | None = None,
    decode: bool = True,
    just_leased: bool = False,
    errors: dict[int, dict[int, list[tuple[int, str]]]] | None = None,
) -> Job:
    """The job at ``slot`` of ``seg`` as of state word ``word`` (read now if None).
    ``just_leased``: ``word`` is a lease taken a moment ago, which has no progress to show yet.
    ``errors``: segment seq -> its error side file as read (ring.read_errors), filled and reused
    by a caller that builds many snapshots at once.

    Raises CorruptionError (the record is then marked BAD), SerializationError, JobNotFoundError
    (the slot holds no retained job).
    """
    try:
        info, id_bytes, payload = records.read_record(seg, slot)
    except CorruptionError:
        ring.mark_bad(seg, slot, "failed validation on read")
        raise
    if word is None:
        word = seg.load_state(slot)
    st, reason, lc = state(word), why(word), lease_count(word)
    js = state_of(word)
    if js is None:
        raise JobNotFoundError(f"job at {seg.path} slot {slot} is no longer retained")
    unrun = st == ST_DONE and bool(word & FLAG_CANCEL)
    if unrun:
        reason = (
            0  # the reason field says how it ended unrun (in ``state``), not why a lease was lost
        )
    deferred = js is JobState.DEFERRED
    when = (seg.epoch_ms + rel_time(word)) / 1000
    codec_id, payload, meta = lifecycle.unwrap(info, payload)
    job = Job(
        id=records.job_id(info, id_bytes),
        key=codec.split_key(codec_id, payload)[0],
        payload=codec.decode(codec_id, payload) if decode else None,
        priority=info.priority,
        state=js,
        attempts=info.attempts_before + lc,
        max_attempts=info.max_attempts,
        available_at=when if st == ST_READY and not deferred else info.available_ms / 1000,
        enqueued_at=info.enqueued_us / 1e6,
        lease_deadline=when if st == ST_LEASED else None,
        lease_token=str(lc) if lc else None,
        last_error=last_error(
            ring, seg, slot, reason, lc, st, info.attempts_before, errors, unrun and not lc
        ),
        seq=info.seq,
        version=2 * lc - (st == ST_LEASED),
        cancel_requested=st == ST_LEASED and bool(word & FLAG_CANCEL),
        expires_at=None if meta.expires_ms is None else meta.expires_ms / 1000,
        timeout=None if meta.timeout_ms is None else meta.timeout_ms / 1000,
        trace_context=meta.trace_context(),
        record_position=(seg.seq, slot, seg.origin),
        depends_on=None if meta.parents is None else list(meta.parents),
    )
    if not just_leased:
        lifecycle.show_progress(ring, seg, slot, lc, job)
    return job


def last_error(
    ring: Ring,
    seg: Segment,
    slot: int,
    reason: int,
    lc: int,
    st: int,
    carried: int = 0,
    errors: dict[int, dict[int, list[tuple[int, str]]]] | None = None,
    unrun: bool = False,
) -> str | None:
    """The job's last error: why its last lease was lost, or the text of its latest nack
    (``errors``: as :func:`job_at`'s).  ``unrun``: a job cancelled before it was ever leased
    (a dependent whose parent failed has its reason in the side file)."""
    lost = LOST_TEXT.get(reason)
    if lost is not None:
        return lost
    if not carried and not unrun and (lc == 0 or (st == ST_LEASED and lc == 1)):
        return None  # in its first lease no nack can have happened: spare the side-file read
    if errors is None:
        entries = ring.read_errors(seg.seq).get(slot)
    else:
        if seg.seq not in errors:
            errors[seg.seq] = ring.read_errors(seg.seq)
        entries = errors[seg.seq].get(slot)
    if not entries:
        return None
    best = [e for e in entries if e[0] <= lc]
    return max(best)[1] if best else None
