"""The job state machine: which state-word changes are allowed, and the words each operation writes.

Every CAS on a state word goes through :meth:`ringq.engine.segment.Segment.cas_state`, which consults
:data:`TRANSITIONS` and refuses (``StateTransitionError``) a change the table does not list: the
table is the state machine, not a description of it.  The functions below compute the new word of
each operation from the old one; the queue and the reaper only choose which to apply.

A lease is ``READY(n, due <= now) -> LEASED(n+1, deadline)``; an ack is ``LEASED(n) -> DONE(n)``
and succeeds only for the holder of token n.  Claim, deadline and token change in one CAS, so a job
is never leased without a deadline, and a stale holder can never complete another's lease.
"""

from __future__ import annotations

from ringq.errors import NotLeasedError, RingqError

from .words import (
    END_CANCELLED,
    END_EXPIRED,
    END_RECLAIMED,
    FLAG_CANCEL,
    LC_MASK,
    ST_BAD,
    ST_CONT,
    ST_DEAD,
    ST_DONE,
    ST_EMPTY,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    WHY_DIED,
    WHY_EXPIRED,
    WHY_NONE,
    WHY_PURGED,
    lease_count,
    pack,
    rel_time,
    state,
    why,
    with_state,
    with_time,
)

__all__ = ["TRANSITIONS", "StateTransitionError", "check", "require_lease", "STATE_NAMES"]

# (from, to) -> the operations that make it.  Anything not listed is refused.
TRANSITIONS: dict[tuple[int, int], str] = {
    (ST_EMPTY, ST_READY): "publish; recovery re-publishes a record whose state word was lost",
    (ST_EMPTY, ST_DEAD): "publish a relocated dead-lettered job",
    (ST_READY, ST_LEASED): "lease",
    (ST_READY, ST_READY): "relocation holds a due job back while it copies it",
    (ST_LEASED, ST_LEASED): "extend; cancel requested (sets the cancel flag)",
    (ST_LEASED, ST_DONE): "ack; cancelled: ack, nack or reclaim of a cancel-requested lease",
    (ST_LEASED, ST_READY): "nack with attempts left; lease expired; holder died",
    (ST_LEASED, ST_DEAD): "nack, expiry or holder death with attempts used up",
    (ST_READY, ST_GONE): "purge; superseded by a relocated copy; a withdrawn copy",
    (ST_LEASED, ST_GONE): "purge",
    (ST_DONE, ST_GONE): "purge",
    (ST_DEAD, ST_GONE): "purge; requeue or relocation (superseded); a withdrawn copy",
    (ST_BAD, ST_GONE): "purge",
    (ST_EMPTY, ST_DONE): "recovery replays a journaled ack whose state words were lost",
    (ST_READY, ST_DONE): "cancel of a pending or delayed job; expiry before start (both carry the "
    "cancel flag); recovery replays a journaled ack whose lease was lost",
    (
        ST_READY,
        ST_DEAD,
    ): "recovery replays a journaled nack that dead-lettered a job whose lease was lost",
    (ST_EMPTY, ST_BAD): "a record below the tail fails validation",
    (ST_READY, ST_BAD): "a record fails validation when read",
    (ST_LEASED, ST_BAD): "a record fails validation when read",
    (ST_DONE, ST_BAD): "a record fails validation when read",
    (ST_DEAD, ST_BAD): "a record fails validation when read",
}

STATE_NAMES = {
    ST_READY: "ready",
    ST_LEASED: "leased",
    ST_DONE: "done",
    ST_DEAD: "dead-lettered",
    ST_GONE: "purged",
    ST_BAD: "quarantined as damaged",
    ST_EMPTY: "not a job",
    ST_CONT: "not a job",
}


class StateTransitionError(RingqError):
    """A state-word change outside :data:`TRANSITIONS` was attempted: a bug in ringq, never data."""


def check(old: int, new: int) -> None:
    """Raise StateTransitionError unless the change from word ``old`` to word ``new`` is allowed."""
    if (old & 7, new & 7) not in TRANSITIONS:
        raise StateTransitionError(
            f"state {old & 7} -> {new & 7} is not a transition of the job state machine"
        )


# -- the words each operation writes ----------------------------------------------------------------


def leased(w: int, deadline_rel: int) -> int | None:
    """The word of a lease of READY word ``w`` until ``deadline_rel`` (ms since the epoch); None if
    the lease count would overflow (the job cannot be leased again)."""
    lc = lease_count(w) + 1
    if lc > LC_MASK:
        return None
    return pack(ST_LEASED, why(w), lc, deadline_rel)


def acked(w: int, now_rel: int) -> int:
    """DONE; the ack of a cancel-requested lease is recorded as cancelled."""
    if w & FLAG_CANCEL:
        return cancelled(w, now_rel)
    return pack(ST_DONE, why(w), lease_count(w), now_rel)


def failed(w: int, reason: int, dead: bool, at_rel: int) -> int:
    """A lease ended without an ack: READY again at ``at_rel``, or DEAD (finished at ``at_rel``).
    ``reason`` WHY_NONE: its holder nacked it; else why it was reclaimed.  A cancel-requested
    lease never runs again: it ends cancelled (END_RECLAIMED when reclaimed)."""
    if w & FLAG_CANCEL and state(w) == ST_LEASED:
        return cancelled(w, at_rel, END_CANCELLED if reason == WHY_NONE else END_RECLAIMED)
    return pack(ST_DEAD if dead else ST_READY, reason, lease_count(w), at_rel)


def cancelled(w: int, now_rel: int, end: int = END_CANCELLED) -> int:
    """CANCELLED: DONE with the cancel flag and reason ``end`` (END_CANCELLED, or END_RECLAIMED
    for a cancel-requested lease that a reclaim ended), finished at ``now_rel``."""
    return pack(ST_DONE, end, lease_count(w), now_rel) | FLAG_CANCEL


def cancelled_pending(w: int, now_rel: int) -> int:
    """CANCELLED for a READY or DEFERRED job.  One that was leased before ends with END_RECLAIMED:
    the lease whose count it carries ended without an ack, so that holder's late ack is refused,
    not taken for a repeat of an accepted one."""
    return cancelled(w, now_rel, END_RECLAIMED if lease_count(w) else END_CANCELLED)


def acked_by(w: int, token: int | None) -> bool:
    """Whether ``w`` is the DONE word an accepted ack with fencing ``token`` (None: any) left, so
    that the same ack again is a harmless repeat.  A job cancelled after its last lease ended
    unacked (reclaimed, or nacked, then cancelled; or cancel-requested and reclaimed) carries
    END_RECLAIMED: that holder's ack is refused, not taken for a repeat (an ack by bare id,
    which names no lease, is a repeat of any finished one)."""
    return (
        state(w) == ST_DONE
        and (token is None or lease_count(w) == token)
        and not (token is not None and w & FLAG_CANCEL and why(w) == END_RECLAIMED)
    )


def expired(w: int, now_rel: int) -> int:
    """EXPIRED (never leased in time): DONE with the cancel flag and reason END_EXPIRED."""
    return pack(ST_DONE, END_EXPIRED, lease_count(w), now_rel) | FLAG_CANCEL


def cancel_requested(w: int) -> int:
    """A LEASED word with the cancel flag: same token and deadline, the holder is asked to stop."""
    return w | FLAG_CANCEL


def ended_unrun(w: int) -> str | None:
    """ "cancelled" or "expired" for a DONE word that carries the cancel flag, else None."""
    if state(w) != ST_DONE or not w & FLAG_CANCEL:
        return None
    return "expired" if why(w) == END_EXPIRED else "cancelled"


def extended(w: int, deadline_rel: int) -> int:
    return with_time(w, deadline_rel)


def held(w: int, until_rel: int) -> int:
    """A READY job held back (relocation) until ``until_rel``: only its time moves."""
    return with_time(w, until_rel)


def gone(w: int, purged: bool = False) -> int:
    """Superseded (reason cleared) or purged."""
    return with_state(w, ST_GONE, WHY_PURGED if purged else WHY_NONE)


def bad(w: int) -> int:
    return with_state(w, ST_BAD)


# -- refusals --------------------------------------------------------------------------------------


def moved(job_id: str, op: str) -> str:
    """Why a lease on a record that a newer copy superseded is refused."""
    return (
        f"cannot {op} job {job_id!r}: the job was requeued (or its record moved) since this lease: a newer "
        "copy of it is in the queue, and this lease belongs to the old one"
    )


def finished_without(job_id: str, op: str) -> str:
    """Why a lease on a record whose segment retired (every job in it finished) is refused."""
    return (
        f"cannot {op} job {job_id!r}: its segment retired since this lease, so the job finished "
        "without it (acked by another holder, purged or cancelled)"
    )


def require_lease(w: int, job_id: str, token: int | None, op: str) -> None:
    """Raise NotLeasedError saying what happened unless ``w`` is a lease held with ``token``."""
    st, reason, lc = state(w), why(w), lease_count(w)
    name = STATE_NAMES.get(st, "not a job")
    if token is not None and token != lc:
        if token < 0 or token > lc:
            latest = "it was never leased" if lc == 0 else f"its latest token is {lc}"
            given = "the fencing token given" if token < 0 else f"fencing token {token}"
            raise NotLeasedError(
                f"cannot {op} job {job_id!r}: {given} was never issued for it ({latest}; it is {name})"
            )
        raise NotLeasedError(
            f"cannot {op} job {job_id!r}: fencing token {token} is stale: the job was leased again since "
            f"(latest token {lc}) and is now {name}"
        )
    if st == ST_LEASED:
        return
    if st == ST_READY:
        if lc == 0:
            cause = "it was never leased"
        elif reason == WHY_EXPIRED:
            cause = "its lease expired (visibility timeout passed) and it waits to be leased again"
        elif reason == WHY_DIED:
            cause = "its lease holder's process died and it waits to be leased again"
        else:
            cause = "it was nacked and waits for its retry"
    elif st == ST_DONE and w & FLAG_CANCEL and reason == END_RECLAIMED:
        cause = (
            "it was cancelled after its lease ended unacked (ran out, its holder died, or nacked)"
        )
    elif st == ST_DONE:
        unrun = ended_unrun(w)
        cause = f"it was {unrun}" if unrun else "it was already acked"
    elif st == ST_DEAD:
        cause = "it used up its attempts and is in the dead-letter queue"
    elif st == ST_GONE and reason == WHY_PURGED:
        cause = "it was purged"
    elif st == ST_GONE:
        # A record is superseded without purging when a newer copy replaces it: requeue_dead, or a
        # relocation of a dead or delayed straggler.  The copy starts a new life of the job, with
        # fencing tokens from 1 again; this lease belongs to the old one.
        raise NotLeasedError(moved(job_id, op))
    else:
        cause = "its record failed validation"
    raise NotLeasedError(f"cannot {op} job {job_id!r}: it is {name}, not leased ({cause})")


def deadline_of(w: int, epoch_ms: int) -> int:
    """The word's time as ms since the Unix epoch."""
    return epoch_ms + rel_time(w)
