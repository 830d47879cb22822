"""Workflows of a local queue: jobs that depend on others, replacements of a waiting job
(debounce), rescheduling, and who depends on whom (docs/workflows.md).

Each is one append under the writer lock, after catching up: the engine side -- the DEFERRED
word, the tree of fired edges, releasing, cancelling, the sweep -- is ringq/engine/deps.py's.

* ``depends_on``: every parent is found first (JobNotFoundError, nothing written); the job is
  appended DEFERRED, read in, the dependents counter bumped, then its parents are looked at where
  they were found (under the lock none was relocated, and the mappings held keep a parent whose
  segment retired meanwhile readable): those that finished fire now; the others fire when they
  finish.
* ``debounce``/``replace``: the job with that id (the newest record of it) is *replaced* by a
  new record that supersedes it.  A waiting one (ready, delayed, deferred) or a dead one is
  superseded at once; a leased one first finishes its run: the replacement waits for it (a new
  run after it) and supersedes a retry of it.  A finished one is left as it is.
* ``reschedule``: a waiting job is copied with its new priority or run time, superseding it.  A
  ready job due within ``deps.HOLD`` seconds is first held (its available-at moved ahead by CAS,
  as relocation holds a job), so nobody leases it while its copy is written; a deferred one is
  held by a DEFERRED word with the hold's time, which no release takes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ringq import codec
from ringq.engine import meta, records, snapshot, transitions
from ringq.engine.deps import HOLD, span_for
from ringq.engine.index import due
from ringq.engine.records import NewRecord
from ringq.engine.relocate import superseding_copy
from ringq.engine.words import (
    FLAG_CANCEL,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    WHY_PURGED,
    is_deferred,
    lease_count,
    now_ms,
    pack,
    position,
    state,
    why,
)
from ringq.errors import JobNotFoundError, JobNotWaitingError
from ringq.ids import check_caller_id
from ringq.job import Job

from .leases import check_origin
from .producer import encode_ids

if TYPE_CHECKING:  # pragma: no cover
    from ringq.engine.segment import Segment
    from ringq.engine.views import View

    from .context import QueueContext

__all__ = ["Workflows"]


class Workflows:
    """Dependencies, replacements and rescheduling of one local queue (the API is
    :class:`ringq.Queue`'s enqueue, reschedule and dependents)."""

    def __init__(self, ctx: QueueContext) -> None:
        self.ctx = ctx

    def enqueue(
        self,
        payload: Any,
        *,
        priority: int,
        delay_ms: int,
        attempts: int,
        job_id: str | None,
        key: str | None,
        m: meta.Meta | None,
        parents: list[str] | None,
        allow_failure: bool,
        replacing: bool,
    ) -> Job:
        """One job with parents, or replacing the job ``job_id`` (``replacing``); see the
        module's docstring.  ``delay_ms``: the job's delay (a replacement's: its debounce).
        Raises JobNotFoundError for a parent not found (nothing written), and what an enqueue
        raises."""
        ctx = self.ctx
        ring = ctx.ring
        if job_id is not None:
            check_caller_id(job_id)
        kind, data = codec.encode(payload)
        if key is not None:
            kind, data = codec.wrap_key(key, kind, data)
        id_bytes = b"" if job_id is None else encode_ids([job_id])[0]
        with ctx.live_lock, ring.locked():
            ctx.refresh(relocate=False)
            index, deps = ctx.index, ctx.deps
            pred: tuple[int, int] | None = None
            if job_id is not None:
                pred = index.find(job_id)
                if pred is not None and not replacing:  # an idempotent enqueue: the job retained
                    return ctx.job_at(*pred)
            if pred is not None and job_id is not None and parents:
                loop = deps.descendants(job_id).intersection(parents)
                if loop:
                    raise ValueError(
                        f"job {job_id!r} cannot depend on {sorted(loop)[0]!r}, which depends "
                        "on it: the replacement would wait for itself"
                    )
            located: dict[str, tuple[Segment, int]] = {}
            for pid in parents or ():
                loc = index.find(pid)
                if loc is None:
                    raise JobNotFoundError(
                        f"no job {pid!r} in queue {ctx.name!r} to depend on (never enqueued, "
                        "or finished and retired)"
                    )
                located[pid] = (index.views[loc[0]].seg, loc[1])
            supersedes = after = 0
            if pred is not None:
                supersedes = position(*pred)
                waiting = deps.deferred.get(pred)
                pw = index.views[pred[0]].seg.load_state(pred[1])
                if waiting is not None and is_deferred(pw):
                    after = waiting.after or waiting.supersedes  # the run it waited for
            rec = self._record(
                kind, data, id_bytes, priority, delay_ms, attempts, m, parents, allow_failure
            )
            rec.supersedes = supersedes
            rec.deferred = bool(parents) or bool(supersedes)
            if after:
                rec = self._with_after(rec, after)
            placed = ring.append([rec])
            ring.ctl.count("enqueued")
            segseq, slot = placed[0][0], placed[0][1]
            view = index.adopt(segseq, slot)
            if rec.deferred:
                ring.ctl.bump_deps()  # after the record is visible (ringq/engine/deps.py)
                dep = deps.known.get((segseq, slot))
                if dep is not None:
                    deps.settle(deps.check(dep, located))
            if view is None:
                ctx.refresh(relocate=False)
                view = index.views[segseq]
            return snapshot.job_at(ring, view.seg, slot)

    def _record(
        self,
        kind: int,
        data: bytes,
        id_bytes: bytes,
        priority: int,
        delay_ms: int,
        attempts: int,
        m: meta.Meta | None,
        parents: list[str] | None,
        allow_failure: bool,
    ) -> NewRecord:
        """The record of a new job: its metadata block names its parents, and its parents'
        section is padded so that the record spans a slot per word of its tree of fired edges."""
        rkind = records.KIND_JOB
        if parents is not None:
            base = m or meta.NONE
            m = replace(base, parents=tuple(parents), allow_failure=allow_failure)
            need = span_for(len(parents), self.ctx.ring.ctl.slot_size)
            codec_b, payload, rkind = meta.wrap(kind, data, m)
            length = records.REC_HEADER.size + len(id_bytes) + len(payload)
            if length < need:
                m = replace(m, section=meta.section_bytes(parents) + need - length)
            kind, data, rkind = meta.wrap(kind, data, m)
        elif m is not None:
            kind, data, rkind = meta.wrap(kind, data, m)
        return NewRecord(data, kind, id_bytes, priority, delay_ms, attempts, kind=rkind)

    @staticmethod
    def _with_after(rec: NewRecord, after: int) -> NewRecord:
        """``rec`` waiting also for the run at position ``after`` (TAG_AFTER in its block)."""
        codec_id, data, m = rec.codec, rec.payload, meta.NONE
        if rec.kind != records.KIND_JOB:
            codec_id, payload, m = meta.split(rec.kind, rec.codec, bytearray(rec.payload))
            data = bytes(payload)
        kind, payload_b, rkind = meta.wrap(codec_id, data, replace(m, after=after))
        rec.codec, rec.payload, rec.kind = kind, payload_b, rkind
        return rec

    # -- reschedule ----------------------------------------------------------------------------------

    def reschedule(self, job: Job | str, priority: int | None, delay: float | None) -> Job:
        """As :meth:`ringq.Queue.reschedule`."""
        ctx = self.ctx
        ring = ctx.ring
        with ctx.live_lock, ring.locked():
            ctx.refresh(relocate=False)
            if isinstance(job, Job):
                check_origin(ring, job, ctx.name)
            # By id: a snapshot's record may have been replaced (an earlier reschedule's copy).
            view, slot, job_id = ctx.leases.locate(
                job.id if isinstance(job, Job) else job, ctx.name
            )
            seg = view.seg
            w = seg.load_state(slot)
            while True:
                st = state(w)
                if st == ST_LEASED:
                    raise JobNotWaitingError(f"cannot reschedule job {job_id!r}: it is leased")
                if st != ST_READY:
                    what = transitions.ended_unrun(w) or transitions.STATE_NAMES.get(st, "gone")
                    raise JobNotWaitingError(
                        f"cannot reschedule job {job_id!r}: it is {what}, not waiting"
                    )
                held = self._hold(view, slot, w)
                if held is not None:
                    break
                w = seg.load_state(slot)
            rec, err = self._copy(view, slot, w, priority, delay)
            placed = ring.append([rec])
            segseq, nslot = placed[0][0], placed[0][1]
            index_view = ctx.index.adopt(segseq, nslot)
            if index_view is None:
                ctx.refresh(relocate=False)
                index_view = ctx.index.views[segseq]
            if err:
                ring.write_error(index_view.seg, nslot, 0, err)
            ok, cur = seg.cas_state(slot, held, transitions.gone(held))
            if ok:
                ring.segs.note_finished(seg)
            elif not (state(cur) == ST_GONE and why(cur) != WHY_PURGED):
                # Cancelled or purged while held (GONE without the purge reason: reading the
                # copy in completed its supersede): the copy goes, the job stays as it is.
                w2 = index_view.seg.load_state(nslot)
                if state(w2) == ST_READY:
                    index_view.seg.cas_state(nslot, w2, transitions.gone(w2, purged=True))
                    ring.segs.note_finished(index_view.seg)
                raise JobNotWaitingError(
                    f"cannot reschedule job {job_id!r}: it was cancelled or purged meanwhile"
                )
            if rec.deferred:
                ring.ctl.bump_deps()
                dep = ctx.deps.deferred.get((segseq, nslot))
                if dep is not None:
                    ctx.deps.settle(ctx.deps.check(dep))
            return snapshot.job_at(ring, index_view.seg, nslot)

    def _hold(self, view: View, slot: int, w: int) -> int | None:
        """Hold the waiting job at ``slot`` (word ``w``) while its copy is written: the word it
        then has, or None if it changed meanwhile (look again)."""
        seg = view.seg
        until = now_ms() + int(HOLD * 1000)
        if is_deferred(w):
            held = pack(ST_READY, 0, 0, until - seg.epoch_ms) | FLAG_CANCEL
        elif due(view, slot, w) > until:
            return w  # not due before the copy is written: nobody can lease it
        else:
            held = transitions.held(w, until - seg.epoch_ms)
        return held if seg.cas_state(slot, w, held)[0] else None

    def _copy(
        self, view: View, slot: int, w: int, priority: int | None, delay: float | None
    ) -> tuple[NewRecord, str | None]:
        """The record that replaces the waiting job at ``slot`` (word ``w``, before its hold) --
        relocation's superseding copy: same id, payload, attempts and enqueue time (its FIFO
        place); its new priority or run time -- and the job's last error, which the copy keeps."""
        seg = view.seg
        deferred = is_deferred(w)
        info, rec = superseding_copy(self.ctx.ring, seg, slot, lease_count(w))
        rec.at_ms = (
            now_ms() + int(round(delay * 1000))
            if delay is not None
            else (int(info.available_ms) if deferred else due(view, slot, w))
        )
        if priority is not None:
            rec.priority = priority
        rec.deferred = deferred
        waiting = self.ctx.deps.deferred.get((seg.seq, slot)) if deferred else None
        if waiting is not None and (waiting.after or waiting.supersedes):
            rec = self._with_after(rec, waiting.after or waiting.supersedes)
        err = snapshot.last_error(
            self.ctx.ring, seg, slot, why(w), lease_count(w), ST_READY, info.attempts_before
        )
        return rec, err

    # -- reads -----------------------------------------------------------------------------------------

    def dependents(self, job: Job | str) -> list[str]:
        """As :meth:`ringq.Queue.dependents`."""
        ctx = self.ctx
        with ctx.live_lock:
            ctx.refresh()
            if isinstance(job, str):
                jid = job
            else:
                jid = ctx.leases.locate(job, ctx.name)[2]
            return ctx.deps.dependents(jid)
