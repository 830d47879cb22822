"""Cancelling jobs (docs/lifecycle.md); expiry before start is ringq/engine/lifecycle.py's.
A DEFERRED job (waiting for its parents) is cancelled as a pending one is; the jobs that depend
on a cancelled job are cancelled in turn, unless enqueued with ``allow_failure`` (docs/workflows.md).

Both are one CAS on the job's state word, to DONE with the cancel flag (ringq/engine/words.py): reason
END_CANCELLED or END_EXPIRED.  A leased job cannot be taken from its holder, so cancelling it only
sets the cancel flag on its LEASED word; the holder sees it on its next extend, and whatever ends
that lease ends the job cancelled (ringq/engine/transitions.py, ``acked`` and ``failed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringq.engine import snapshot, transitions
from ringq.engine.index import now_ms
from ringq.engine.words import ST_LEASED, ST_READY, cancel_flag, state
from ringq.errors import JobFinishedError
from ringq.job import Job

if TYPE_CHECKING:  # pragma: no cover
    from .leases import Leases

__all__ = ["cancel"]


def cancel(leases: Leases, job: Job | str, queue: str) -> Job:
    """CANCELLED for a pending, delayed or deferred job; cancel requested for a leased one.  Idempotent for a
    job already cancelled or cancel-requested; the snapshot after the change.

    Raises JobFinishedError (done, expired or dead-lettered), JobNotFoundError."""
    view, slot, job_id = leases.locate(job, queue)
    ring, seg = leases.ring, view.seg
    w = seg.load_state(slot)
    settled = False
    while True:
        st = state(w)
        if st == ST_LEASED and not settled:
            # A lease that ran out, or whose holder died, is what reclaiming makes of it (a
            # retry, or dead-lettered) before it is cancelled, as every read shows it.
            leases.settle(True)
            settled = True
            w = seg.load_state(slot)
            continue
        if st == ST_READY:
            new = transitions.cancelled_pending(w, now_ms() - seg.epoch_ms)
        elif st == ST_LEASED and not cancel_flag(w):
            new = transitions.cancel_requested(w)
        elif st == ST_LEASED or transitions.ended_unrun(w) == "cancelled":
            return snapshot.job_at(ring, seg, slot, w)
        else:
            what = transitions.ended_unrun(w) or transitions.STATE_NAMES.get(st, "not a job")
            raise JobFinishedError(f"cannot cancel job {job_id!r}: it is already {what}")
        ok, w2 = seg.cas_state(slot, w, new)
        if ok:
            if st == ST_READY:
                leases.deps.changed(view, slot, new)  # its dependents fail in turn
                ring.segs.note_finished(seg)
                if view.sealed:
                    leases.relocator.offer(view)
            return snapshot.job_at(ring, seg, slot, new)
        w = w2
