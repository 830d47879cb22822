"""The life of a lease: claim, ack, nack, extend -- each one CAS on the job's state word.

A claim CASes ``READY(n, due)`` to ``LEASED(n+1, now + visibility timeout)`` (a failed CAS means
another process got there first), then tags the owner word with this process's owner index and
``n+1`` (ringq/engine/owner.py).  Ack, nack and extend CAS from ``LEASED(n)`` and are refused with
NotLeasedError, saying what happened, when the word is not a lease held with the caller's token.
The words written are computed by ringq/engine/transitions.py; durability of acks is ringq/engine/durability.py's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ringq import codec
from ringq.backend import check_job_ref
from ringq.backoff import BackoffPolicy
from ringq.engine import claim, forksafe, lifecycle, records, runs, snapshot, transitions
from ringq.engine.index import Direct, Index, View, due, now_ms
from ringq.engine.owner import RETIRED, OwnerRegistry
from ringq.engine.relocate import Relocator
from ringq.engine.runs import build as build_run
from ringq.engine.runs import envelope_key
from ringq.engine.segment import Segment
from ringq.engine.words import (
    FLAG_CANCEL,
    OWNER_LC_SHIFT,
    ST_DONE,
    ST_LEASED,
    ST_READY,
    TIME_SHIFT,
    lease_count,
    np_cancel_flag,
    np_lease_count,
    np_owner_index,
    np_owner_lease_count,
    np_owner_pid,
    owner_index,
    owner_pack,
    owner_pid,
    pack,
    rel_time,
    state,
    why,
)
from ringq.errors import CorruptionError, JobNotFoundError, NotLeasedError, SerializationError
from ringq.job import Job, JobState

from .limits import CAPS_KEPT, LimitGate

if TYPE_CHECKING:  # pragma: no cover
    from ringq.engine.deps import Deps
    from ringq.engine.ring import Ring

__all__ = ["Leases", "Retired", "token_number"]

LEASED = JobState.LEASED


class Retired(JobNotFoundError):
    """The job's segment was retired: every job in it had finished."""


def check_origin(ring: Ring, job: Job, queue: str, fenced: str | None = None) -> None:
    """Refuse a snapshot of another queue's job, whose record position means nothing in
    ``ring``'s queue: NotLeasedError for a use of its lease (``fenced``: "ack", "nack", ...),
    else JobNotFoundError.  A snapshot not read from a segment (built by hand) passes."""
    origin = job.record_position[2]
    if origin and origin != ring.identity:
        what = (
            f"cannot {fenced} job {job.id!r}"
            if fenced
            else f"job {job.id!r} is not in queue {queue!r}"
        )
        raise (NotLeasedError if fenced else JobNotFoundError)(
            f"{what}: the snapshot comes from another queue than {queue!r} in {ring.dir}"
        )


class Leases:
    """Claims and settles leases for one queue in this process.  ``refresh`` catches the index up
    with other processes (the queue's refresh)."""

    def __init__(
        self,
        ring: Ring,
        index: Index,
        owners: OwnerRegistry,
        relocator: Relocator,
        refresh: Callable[[], None],
        settle: Callable[[bool], None],
        gate: LimitGate,
        deps: Deps,
    ) -> None:
        self.ring = ring
        self.gate = gate  # concurrency caps and rate limits (ringq/local/limits.py)
        self.deps = deps  # the jobs that wait for others (ringq/engine/deps.py)
        self.index = index
        self.owners = owners
        self.relocator = relocator
        self.refresh = refresh
        # The queue's settle(force): catch up and reclaim run-out and dead holders' leases (with
        # force False, only when the reaper's schedule says a scan is due), before an ack decides.
        self.settle = settle
        self._direct: dict[tuple[int, int, int], Direct] = {}
        # What an ack reports (acks run under the queue lock): the pointer, and its three words.
        self._ack_out, self._ack_words, self._ack_out_addr = claim.ack_out()
        # (visibility timeout, detach, pid, Direct) of the last call of direct().
        self._last_direct: tuple[float, bool, int, Direct] | None = None
        # (segment seq, slot): the new records of that segment before the slot were all taken
        # by other consumers when a wait of this queue last looked (claim.wait_reached).
        self._taken_to = (0, 0)

    def locate(self, job: Job | str, queue: str, fenced: str = "") -> tuple[View, int, str]:
        """``(view, slot, id)`` of a job given as a snapshot or an id.  Raises JobNotFoundError
        (Retired if the snapshot's segment retired).

        ``fenced``, the operation of a caller that checks the snapshot's lease ("ack", "nack",
        "extend"): a lease belongs to
        the record it was taken on, so a leased snapshot whose record is no longer mapped is
        never matched to a newer copy of the job by id -- whose fencing tokens start again at 1.
        If such a copy exists the lease is stale (NotLeasedError).  If not, the job finished and
        its segment retired: a repeated ack through the snapshot whose own ack went in raises
        Retired (harmless); any other use of the lease, NotLeasedError -- the job was finished
        without it (by another holder, a purge or a cancel)."""
        index = self.index
        check_job_ref(job)
        if isinstance(job, Job):
            check_origin(self.ring, job, queue, fenced)
            segseq, slot, _origin = job.record_position
            view = index.views.get(segseq)
            if view is None:
                self.refresh()
                view = index.views.get(segseq)
            if view is not None:
                index.read_through(view, slot)  # a job leased by ringq_wait_claim: read in late
            if view is not None and (job.seq == 0 or int(view.seq[slot]) == job.seq):
                return view, slot, job.id
            if fenced and segseq and job.lease_token is not None:
                if index.find(job.id) is not None:
                    raise NotLeasedError(transitions.moved(job.id, fenced))
                if job.ack_accepted:
                    if fenced == "ack":
                        raise Retired(job.id)  # this snapshot's own ack went in: a repeat, harmless
                    raise NotLeasedError(f"cannot {fenced} job {job.id!r}: it was already acked")
                raise NotLeasedError(transitions.finished_without(job.id, fenced))
            if (
                view is None
                and segseq
                and segseq < self.ring.ctl.tail_seq()
                and not os.path.exists(self.ring.segs.path(segseq))
            ):
                raise Retired(job.id)
            job_id = job.id
        else:
            job_id = job
        loc = index.find(job_id)
        if loc is None:
            self.refresh()
            loc = index.find(job_id)
        if loc is None:
            raise JobNotFoundError(
                f"no job {job_id!r} in queue {queue!r} (never enqueued, or retired)"
            )
        loc = self.deps.current(loc)  # a rerun waiting for its run: the id names the run
        return index.views[loc[0]], loc[1], job_id

    def word_for(
        self, job: Job | str, queue: str, op: str
    ) -> tuple[View, int, int, str, int | None]:
        """``(view, slot, state word, id, fencing token or None)`` of a job whose lease the caller
        checks for ``op`` (see :meth:`locate`).  A lease whose visibility timeout passed is
        reclaimed first, though no reaper took it yet, so that the caller acts on what reclaiming
        makes of it (READY or DEAD) and refuses its holder, as the ack's C check does."""
        view, slot, job_id = self.locate(job, queue, fenced=op)
        token = token_number(job.lease_token) if isinstance(job, Job) else None
        seg = view.seg
        w = seg.load_state(slot)
        if state(w) == ST_LEASED and rel_time(w) < now_ms() - seg.epoch_ms:
            self.settle(True)
            view, slot, job_id = self.locate(job, queue, fenced=op)
            w = view.seg.load_state(slot)
            if state(w) != ST_LEASED:  # reclaimed: READY, DEAD, or cancelled (DONE) if asked to
                self._require(view.seg, slot, w, job_id, token, op)  # frees its cap slots too
        return view, slot, w, job_id, token

    def claim(self, view: View, slot: int, w: int, now: int, vt: float, detach: bool) -> Job | None:
        """Lease the READY job with word ``w`` for ``vt`` seconds; None if another process won."""
        seg = view.seg
        if w & FLAG_CANCEL:
            return None  # DEFERRED: waits for its parents (ringq/engine/deps.py)
        # -- lifecycle: a job never leased before its expires-at never runs (ringq/engine/lifecycle.py);
        # one leased in time has started, so its retries are not expiries.
        # (A relocated copy carries its attempts in the record, not in its fresh lease count.)
        exp = None if lease_count(w) or view.attb[slot] else lifecycle.expires_ms(seg, slot)
        if exp is not None and now > exp:
            if lifecycle.expire(self.ring, seg, slot, w, now):
                self.deps.changed(view, slot, seg.load_state(slot))
            return None
        new = transitions.leased(w, now + int(vt * 1000) - seg.epoch_ms)
        if new is None:
            return None
        lc = lease_count(new)
        key = (seg.seq, slot)
        # A detached lease has no owner process (owner index 0): reapers leave it to the
        # visibility timeout alone.
        owner = 0 if detach else self.owners.acquire()
        ticket = self.gate.admit(
            seg, slot, lambda: self.index.waiting_entry(view, slot, due(view, slot, w))
        )
        if ticket is False:
            return None  # a limit holds it back: it stays READY
        held = self.owners.held
        if owner:
            held[key] = lc  # before the CAS: our own reaper must never see this lease unowned
        # The owner word, tagged with the lease count.  A detached lease is tagged with owner index
        # 0: known to have no owner process, so only its visibility timeout ends it -- unlike a
        # lease whose claimer died between the two CAS (left untagged until CLAIM_GRACE passes:
        # see the reaper), which is why the tag follows the state CAS before anything else.
        tag = owner_pack(owner, lc, forksafe.pid())
        gated = False  # the limits gate settled: nothing of it for the clean-up below to undo
        try:
            if not seg.cas_state(slot, w, new)[0]:
                gated = True
                self.gate.undo(ticket)
                held.pop(key, None)
                return None
            seg.cas_owner(slot, seg.load_owner(slot), tag)
            self.gate.bind(ticket, seg, slot, lc)
            gated = True
            self.ring.ctl.lower_deadline_floor(seg.epoch_ms + rel_time(new))
            self.ring.note_state(seg, slot, final=False)
            if seg.load_state(slot) != new:
                # Stalled past CLAIM_GRACE between the two CAS: reclaimed as orphaned.
                held.pop(key, None)
                self.gate.release(key)
                return None
            try:
                return snapshot.job_at(self.ring, seg, slot, new, just_leased=True)
            except (CorruptionError, SerializationError) as exc:
                held.pop(key, None)
                self.gate.release(key)
                self.ring.mark_bad(seg, slot, str(exc))
                return None
        except BaseException:
            # A signal's handler raised before the job reached the caller: nobody will see this
            # lease, so it goes back READY, no attempt counted (only from the word written here),
            # and what a limit admitted for it goes back too.
            if not gated:
                self.gate.undo(ticket)
            touched: dict[int, Segment] = {}
            if self._unused(seg, slot, new, int(view.avail[slot]), now_ms(), touched):
                self.ring.note_returned(seg)
            else:
                held.pop(key, None)  # the CAS itself never happened (or the lease moved on)
            raise

    def direct(self, vt: float, detach: bool) -> Direct:
        """What Index.take needs to lease plain jobs in one C call per run (ringq_take_run), for
        ``vt`` seconds; ``detach`` as in :meth:`claim`.  Only for a take that no limit and no
        paused key can concern (the caller checks).  Cached per (vt, detach) in this process."""
        last = self._last_direct
        pid = forksafe.pid()
        if last is not None and last[0] == vt and last[1] is detach and last[2] == pid:
            return last[3]  # the same lease as the last call's (a forked child's pid differs)
        owner = 0 if detach else self.owners.acquire()
        key = (int(vt * 1000), owner, pid)
        d = self._direct.get(key)
        if d is not None:
            self._last_direct = (vt, detach, pid, d)
            return d
        held_here = self.owners.held if owner else None
        ring = self.ring
        mark_bad = ring.mark_bad
        hdr = records.REC_HEADER.size
        keyed = codec.KEYED
        dur = ring.dur

        def made_run(view: View, run: bytes) -> list[Job]:
            # Jobs leased in C, built from what the call reported (no read of the index or the
            # header), in one call (ringq/engine/runs.py).
            seg = view.seg
            out = build_run(
                run,
                seg.mm,
                seg.data_off + hdr,
                seg.slot_size,
                seg.epoch_ms,
                seg.seq,
                seg.origin,
                keyed,
                envelope_key,
                held_here,
                mark_bad,
                seg,
            )
            # The flush is per segment: note_state's own test, spelt out (one call less a run).
            if dur.state_flush_interval is not None and seg.seq not in dur.dirty_state:
                dur.note_state(seg, 0)
            return out

        def adopt(view: View, slot: int, job: Job) -> Job:
            # A job the wait leased and built in C: held as made_run holds one.
            seg = view.seg
            if held_here is not None:
                held_here[(seg.seq, slot)] = 1
            if dur.state_flush_interval is not None and seg.seq not in dur.dirty_state:
                dur.note_state(seg, 0)
            return job

        if len(self._direct) > 64:
            self._direct.clear()
        d = self._direct[key] = Direct(
            key[0],
            owner_pack(owner, 0, key[2]),
            made_run,
            adopt,
            ring.ctl,
            lambda v, s, w, now: self.claim(v, s, w, now, vt, detach),
        )
        self._last_direct = (vt, detach, pid, d)
        return d

    def wait_claim(self, seen: int, timeout: float, spin: float, direct: Direct) -> Waited | None:
        """Sleep as Control.sleep does (``seen``: the wake word read before looking for work) and,
        if what woke us is one new plain job at the end of the tail segment, lease it in the same
        C call (``ringq_wait_claim``): a :class:`Waited` for :meth:`waited` (or :meth:`unclaim`),
        or None when the caller should look for work itself (woken by something else, or timed
        out).  Only for a caller whose index holds nothing leasable and to whom no limit or paused
        key applies; called without the queue lock, by any number of threads at once.

        The C call leases the first record this process has not read in, or, when other
        consumers leased those first, a later one; every slot from the first this process has
        not read in counts as claiming (``owners.claiming``) from before the call until
        :meth:`waited` or :meth:`unclaim` settles it, so this process's reaper never takes such a
        lease, tagged with our owner index but not yet among ``owners.held``, for a dead
        predecessor's."""
        ctl = self.ring.ctl
        view = self.index.views.get(ctl.tail_seq())
        if view is None or view.sealed or view.seg.mm is None:
            ctl.sleep(seen, timeout, spin)
            return None
        seg = view.seg
        candidate = view.scanned
        taken = self._taken_to  # records a wait of ours saw taken: no need to look at them again
        if taken[0] == seg.seq and taken[1] > candidate:
            candidate = taken[1]
        # One entry per wait, added and removed by single dict operations: threads register
        # and settle at once without the queue lock, and a count kept by read-modify-write
        # could lose one of them.
        token = object()
        claiming = self.owners.claiming
        claiming[token] = (seg.seq, candidate)
        got = None
        try:
            got = claim.wait_claim(
                ctl,
                seg,
                seen,
                self.index.seen_change,
                candidate,
                timeout,
                spin,
                direct.vt_ms,
                direct.owner_base,
            )
            if got is not None:
                # As Waited._make builds one, with no Python frame.  The records the wait passed
                # over need no note: the append of this job moved the tail, so the next look
                # reads them in.
                return tuple.__new__(Waited, (view, *got, token))
            reached = claim.wait_reached()
            if reached > candidate:
                self._taken_to = (seg.seq, reached)
        except BaseException:
            # A signal's handler that raised as the C call returned: the lease it took was never
            # handed out, so it goes back as unclaim gives one back (no attempt counted).  The
            # caller still counts this thread among the mappings' users: the segment is mapped.
            if got is None:
                got = claim.pending_claim()
            if got is not None:
                self.unclaim(tuple.__new__(Waited, (view, *got, token)), direct)
            else:
                # The wake-up this wait took may have been an append's, which wakes one sleeper
                # per job when all of them wait here: the others look instead of this one.
                ctl.wake()
            claiming.pop(token, None)
            raise
        claiming.pop(token, None)
        return None

    def unclaim(self, got: Waited, direct: Direct) -> None:
        """Give back a lease :meth:`wait_claim` took and never handed to the caller (policy now
        forbids it, its queue object closed, or an exception came first): the job's word goes
        back to what it was (READY, never leased; the token was never handed out), and readers
        are told to look again.  The owner word the C call tagged with lease count 1 is cleared first: the
        job's next lease is count 1 again, and between its two CAS that tag would name this
        process as its holder."""
        seg = got.view.seg
        try:
            if seg.mm is not None:
                tag = direct.owner_base | 1 << OWNER_LC_SHIFT
                if not seg.cas_owner(got.slot, tag, 0)[0]:
                    return  # not our lease (given back already, and maybe leased again since)
                # Only from the very word the C call wrote: every thread of this process tags
                # its leases alike, so a later lease of the job by another of them (after this
                # one went back) must not match.
                if seg.cas_state(got.slot, got.word, got.prev)[0]:
                    self.owners.held.pop((seg.seq, got.slot), None)  # if waited() had made it
                    self.ring.note_returned(seg)
                else:
                    # The word moved meanwhile (a cancel request, or waited() extended it):
                    # still ours, so tagged again, and reclaimed as this holder's (or held until
                    # it runs out), not left unowned.
                    seg.cas_owner(got.slot, 0, tag)
        finally:
            self.owners.claiming.pop(got.claim, None)

    def waited(self, got: Waited, direct: Direct) -> Job | None:
        """Under the queue lock: the job :meth:`wait_claim` leased, built from the fields the C
        call reported (the index reads the record in at its next catch-up, as a later ack or
        extend of the job does first), or None if the lease ran out and was reclaimed before
        this thread got the lock, or the job was finished meanwhile (a purge) and its segment
        retired and unmapped."""
        view, slot, word, _prev, run, job, token = got
        seg = view.seg
        try:
            if seg.mm is None:
                return None  # retired: every job in it finished, this one too
            # The visibility timeout counts from when the caller gets the lease, not from the C
            # claim: a lease that waited for the lock is extended by one CAS (nobody else holds it).
            # The C call lowered the deadline floor to the first deadline, which stays a lower
            # bound after an extension.  A lease that needs none has its deadline ahead, so no
            # other process can have reclaimed it (this one is alive and its owner word is ours).
            # now_ms() and rel_time() spelt out: this runs for every job a wait hands out.
            due = time.time_ns() // 1_000_000 + direct.vt_ms - seg.epoch_ms
            if word >> TIME_SHIFT < due - direct.vt_ms // 10:
                new = transitions.extended(word, due)
                if not seg.cas_state(slot, word, new)[0]:
                    return None  # it ran out while this thread waited for the lock: reclaimed
                word = new
            if job is not None:  # built by the C call, with the deadline it wrote
                if word != got[2]:
                    job.lease_deadline = (seg.epoch_ms + (word >> TIME_SHIFT)) / 1000
                return direct.adopt(view, slot, job)
            assert run is not None  # one of the two is reported
            if word != got[2]:  # the record reports the word the C call wrote
                run = records.CLAIMED.pack(word, *records.CLAIMED.unpack(run)[1:])
            jobs: list[Job] = direct.made_run(view, run)
            return jobs[0] if jobs else None
        finally:
            self.owners.claiming.pop(token, None)

    def still_held(self) -> dict[tuple[int, int], int]:
        """As this queue object closes: drop from ``owners.held`` the leases that ended meanwhile
        (acked through another queue object or process, reclaimed, retired with their segment),
        and return every lease still held through it -- (segment seq, slot) -> lease count, with
        the detached ones that hold cap slots -- which outlive the close (ringq/engine/kept.py)."""
        held = self.owners.held
        mine = self.owners.mine()
        for key, lc in list(held.items()):
            if not self._live(key, lc) or owner_index(self._owner_word(key)) != mine:
                del held[key]
        out = dict(held)
        for loc, (_ticket, _seg, lc) in list(self.gate.held.items()):
            out.setdefault(loc, lc)
        return out

    def settle_kept(self, kept: dict[tuple[int, int], int]) -> None:
        """After the close kept them: give up the owner index and cap slots kept for each lease
        of ``kept`` (:meth:`still_held`) that has ended since."""
        for key, lc in kept.items():
            if not self._live(key, lc):
                self.owners.ended_kept(key)
                self.gate.release_kept(key)

    def _live(self, key: tuple[int, int], lc: int) -> bool:
        view = self.index.views.get(key[0])
        seg = view.seg if view is not None else None
        if seg is None or seg.mm is None:
            return False  # retired: every job in it finished
        w = seg.load_state(key[1])
        return state(w) == ST_LEASED and lease_count(w) == lc

    def _owner_word(self, key: tuple[int, int]) -> int:
        return self.index.views[key[0]].seg.load_owner(key[1])

    def give_back(self, jobs: list[Job]) -> int:
        """Return leases this process took and never handed out (a stream's batch) to READY
        unused: a lease of count ``n`` becomes READY with count ``n - 1`` (its token was never
        seen by anyone), due at once -- a first lease at its own available-at, so it keeps its
        place.  A lease no longer held with that token (reclaimed meanwhile), or asked to
        cancel, is left alone.  Returns how many went back."""
        back = 0
        touched: dict[int, Segment] = {}
        now = now_ms()
        for job in jobs:
            segseq, slot, _origin = job.record_position
            seg = self.ring.segs.get(segseq)  # not the index's view: it may have been reset
            token = token_number(job.lease_token)
            if seg is None or seg.mm is None or not token or token < 1:
                continue
            w = seg.load_state(slot)
            if state(w) != ST_LEASED or lease_count(w) != token or w & FLAG_CANCEL:
                continue
            back += self._unused(seg, slot, w, round(job.available_at * 1000), now, touched)
        for seg in touched.values():
            self.ring.note_returned(seg)  # readers (this one too) find them again
        return back

    def give_back_taken(self, jobs: list[Job], run: tuple[Segment, bytes] | None) -> int:
        """The leases a take cut short by an exception took and will not hand out (Index's
        ``give_back``): ``jobs`` as :meth:`give_back` returns them, and ``run``, a segment and
        the ringq_claimed records of jobs leased in C whose jobs were never made, each given back
        only from the very word its call wrote (every thread of the process tags its leases
        alike: a later lease of the job by another thread must not match).  Returns how many
        went back."""
        back = self.give_back(jobs) if jobs else 0
        if run is None:
            return back
        seg, claimed = run
        if seg.mm is None:
            return back  # retired: every job in it finished
        touched: dict[int, Segment] = {}
        now = now_ms()
        for word, _seq, _enq, avail_ms, slot, *_rest in records.CLAIMED.iter_unpack(claimed):
            back += self._unused(seg, slot, word, avail_ms, now, touched)
        for s in touched.values():
            self.ring.note_returned(s)
        return back

    def give_back_leases_of(self, pid: int) -> int:
        """Return to READY unused, as :meth:`give_back` does, every lease that process ``pid``
        holds: each LEASED word whose owner word is tagged with its lease count, ``pid`` and an
        owner index that ``pid`` holds locked (OwnerRegistry.held_by: the pid alone is a tag that
        a process of another PID namespace sharing the queue may carry too, and giving back its
        lease would let the next lease reuse its fencing token).  A detached lease (owner index
        0) and a lease asked to cancel are left alone.  Returns how many went back.

        The caller makes sure ``pid`` names one live process for the whole call, that it leases
        nothing meanwhile and never uses these leases again (its own stopped child, killed next:
        a lease given back is leased next with the same fencing token).  The index is scanned as
        it is (the caller catches up first); a lease of a record it has not read yet is read in
        before it goes back, for its available-at."""
        import numpy as np

        held = sorted(self.owners.held_by(pid))  # its owner indexes: locks only it can hold
        if not held:
            return 0
        want = owner_pid(owner_pack(0, 0, pid))
        back = 0
        touched: dict[int, Segment] = {}
        now = now_ms()
        for view, leased, w, own in self.index.leases():
            theirs = (
                np.isin(np_owner_index(own), held)
                & (np_owner_pid(own) == want)
                & (np_owner_lease_count(own) == np_lease_count(w))
                & ~np_cancel_flag(w)
            )
            for slot, word in zip(leased[theirs].tolist(), w[theirs].tolist()):
                self.index.read_through(view, slot)
                back += self._unused(view.seg, slot, word, int(view.avail[slot]), now, touched)
        for seg in touched.values():
            self.ring.note_returned(seg)
        return back

    def _unused(
        self, seg: Segment, slot: int, w: int, avail_ms: int, now: int, touched: dict[int, Segment]
    ) -> int:
        """CAS the lease ``w`` at ``slot`` back to READY with its lease count lowered: due at
        once, a first lease at its record's available-at ``avail_ms`` (ms since the Unix epoch).
        1 if it went back (``seg`` is then in ``touched``, for the caller's note_returned)."""
        token = lease_count(w)
        at = avail_ms if token == 1 else now
        ready = pack(ST_READY, why(w), token - 1, max(0, at - seg.epoch_ms))
        if not seg.cas_state(slot, w, ready)[0]:
            return 0
        self.owners.held.pop((seg.seq, slot), None)
        if RETIRED.by_file:  # a closed queue object of this process kept it (engine/kept.py)
            self.owners.ended_kept((seg.seq, slot))
        self._release_slot(seg, slot)
        self.ring.note_state(seg, slot, final=False)
        touched[seg.seq] = seg
        return 1

    def ack(self, job: Job | str, queue: str) -> Segment | None:
        """CAS one job to DONE; returns its segment, or None for a repeated ack.  The durability
        strategy is told (it syncs under ``sync_acks`` when the caller calls ``sync_acks_now``).
        A snapshot whose ack went in is marked so, for a repeat after its segment retired.  A
        lease that ran out is reclaimed first (and the ack then refused), as is any other once the
        reaper's schedule says so, unless the ack goes in on the first try."""
        # The common case without the general path's lookups, in one call (runs.first_ack): a
        # snapshot of a lease whose segment this index maps, acked by a C call that checks the
        # record is the job's and the lease has not run out.  Anything else, and any answer but
        # ACKED, takes the general path.
        hit = runs.first_ack(
            job, self.index.views, self.ring.identity, self.ring.ctl.ref_addr, self._ack_out_addr
        )
        if hit.__class__ is tuple:
            view, slot = hit
            if slot >= view.scanned:  # leased by ringq_wait_claim: read in late
                self.index.read_through(view, slot, True)
            done, finished, deps = self._ack_words
            return self._acked(view, view.seg, slot, done, finished, deps)
        self.settle(
            hit == claim.EXPIRED
        )  # the general path acts on what reclaiming makes of the lease
        out = self._ack(job, queue)
        if isinstance(job, Job):
            job.ack_accepted = True
        return out

    def _ack(self, job: Job | str, queue: str) -> Segment | None:
        """The general ack.  A lease that was reclaimed is refused, whatever reclaiming made of it
        (a cancel-requested one ends cancelled: transitions.acked_by)."""
        try:
            view, slot, job_id = self.locate(job, queue, fenced="ack")
        except Retired:
            return None  # its segment retired, so it was finished: a repeated ack
        token = token_number(job.lease_token) if isinstance(job, Job) else None
        seg = view.seg
        if token is None or token > 0:
            # The common case in one C call: LEASED with this token -> DONE (ringq/engine/transitions.py
            # allows it; a cancel-requested lease comes back as 3 for the policy below).
            words = self._ack_words
            answer = claim.ack(seg, slot, token or 0, 0, self.ring.ctl, self._ack_out)
            if answer == claim.ACKED:  # counted as acked and finished by the call
                return self._acked(view, seg, slot, words[0], words[1], words[2])
            if answer == claim.REPEATED:
                self._release_slot(seg, slot, words[0])
                return None
            if answer == claim.REFUSED:
                self._require(seg, slot, words[0], job_id, token, "ack")  # raises, saying why
        w = seg.load_state(slot)
        while True:
            if transitions.acked_by(w, token):
                self._release_slot(seg, slot, w)
                return None  # a repeated ack; a stale holder's ack of a job done by another is refused below
            self._require(seg, slot, w, job_id, token, "ack")
            done = transitions.acked(w, now_ms() - seg.epoch_ms)
            ok, w = seg.cas_state(slot, w, done)
            if ok:
                break
        self.ring.ctl.count("acked")
        finished = seg.add_finished()
        return self._acked(view, seg, slot, done, finished, self.ring.ctl.deps_count())

    def _acked(
        self, view: View, seg: Segment, slot: int, done: int, finished: int, deps: int
    ) -> Segment:
        """After the ack's CAS, counted: durability, the holder's bookkeeping, the jobs that
        wait for this one (``deps``: the dependents counter read after the CAS), retirement."""
        if self.gate.held or CAPS_KEPT.by_file:
            self._release_slot(seg, slot)  # the lease ended: its cap slots are free
        dur = self.ring.dur
        if dur.sync_acks or (
            dur.state_flush_interval is not None and seg.seq not in dur.dirty_state
        ):
            dur.note_ack(seg, slot, done)  # (its own test, spelt out: nothing to note otherwise)
        self.owners.held.pop((seg.seq, slot), None)
        if RETIRED.by_file:  # a closed queue object of this process kept it (engine/kept.py)
            self.owners.ended_kept((seg.seq, slot))
        if deps:  # the queue has had dependents: fire this job's edges
            self.deps.changed(view, slot, done)
        # The index has read ``heads.n`` records of the segment, so fewer finished cannot be all
        # of them (nor a relocation's share): the shared words are read only past that.
        if finished >= view.heads.n:
            self.ring.segs.finished_up_to(seg, finished)
        if view.sealed and finished >= self.relocator.hot_from.get(seg.seq, 0):
            self.relocator.offer(view, hot=True, finished=finished)
        return seg

    def nack(
        self,
        job: Job | str,
        queue: str,
        error: str | None,
        delay: float | None,
        backoff: BackoffPolicy,
        rng: Any,
    ) -> Job:
        """Return a leased job to READY after a backoff delay, or dead-letter it; the new snapshot."""
        view, slot, w, job_id, token = self.word_for(job, queue, "nack")
        seg = view.seg
        self._require(seg, slot, w, job_id, token, "nack")
        lc = lease_count(w)
        attempts = int(view.attb[slot]) + lc
        if error is not None:
            self.ring.write_error(seg, slot, lc, str(error))
        dead = attempts >= int(view.maxatt[slot])
        wait = 0.0 if dead else backoff.delay_for(attempts, rng) if delay is None else delay
        new = transitions.failed(w, 0, dead, now_ms() + int(wait * 1000) - seg.epoch_ms)
        while True:
            ok, w2 = seg.cas_state(slot, w, new)
            if ok:
                break
            self._require(seg, slot, w2, job_id, token, "nack")
            w = w2
        self._release_slot(seg, slot)  # the lease ended: its cap slots are free
        self.ring.dur.note_ack(seg, slot, new)
        self.owners.held.pop((seg.seq, slot), None)
        if RETIRED.by_file:  # a closed queue object of this process kept it (engine/kept.py)
            self.owners.ended_kept((seg.seq, slot))
        self.deps.changed(view, slot, new)
        if state(new) == ST_DONE:  # a cancel-requested lease ends cancelled, never retried
            self.ring.segs.note_finished(seg)
        elif dead:
            self.ring.ctl.count("dead")
        else:
            self.ring.note_returned(seg)
        out = snapshot.job_at(self.ring, seg, slot, new)
        if view.sealed:
            self.relocator.offer(view, hot=True)
        return out

    def _release_slot(self, seg: Segment, slot: int, word: int | None = None) -> None:
        """Free this process's cap slots for the job at ``slot`` (LimitGate.release: at once, or
        with ``word`` only if the lease they were taken for is no longer live)."""
        if self.gate.release((seg.seq, slot), word):
            self.ring.ctl.wake()  # a cap slot is free: leases waiting for it may go

    def _require(
        self, seg: Segment, slot: int, w: int, job_id: str, token: int | None, op: str
    ) -> None:
        """transitions.require_lease for ``op``; a refusal first frees the cap slots this process
        holds for a lease of the job that has ended (never those of its current lease)."""
        try:
            transitions.require_lease(w, job_id, token, op)
        except NotLeasedError:
            self._release_slot(seg, slot, w)
            raise

    def extend(self, job: Job | str, queue: str, seconds: float) -> Job:
        """Push a lease's deadline to ``max(deadline, now) + seconds``; the new snapshot."""
        view, slot, w, job_id, token = self.word_for(job, queue, "extend")
        seg = view.seg
        while True:
            transitions.require_lease(w, job_id, token, "extend")
            deadline = max(seg.epoch_ms + rel_time(w), now_ms()) + int(seconds * 1000)
            new = transitions.extended(w, deadline - seg.epoch_ms)
            ok, w = seg.cas_state(slot, w, new)
            if ok:
                self.ring.note_state(seg, slot, final=False)
                return snapshot.job_at(self.ring, seg, slot, new)


class Waited(NamedTuple):
    """A lease :meth:`Leases.wait_claim` took in C, not yet handed out: its job's view and slot,
    the LEASED word it wrote, the READY word it replaced, its ringq_claimed record (bytes:
    records.CLAIMED_FIELDS) or its Job built by the same call (claim.WaitClaimed), and the wait's
    entry in ``owners.claiming``, removed once the lease is settled."""

    view: View
    slot: int
    word: int
    prev: int
    record: bytes | None
    job: Job | None
    claim: object


def token_number(token: object) -> int | None:
    """A fencing token as the lease count it stands for; -1 for text that no lease ever issued."""
    if token is None:
        return None
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    text = str(token)
    # ASCII digits only: str.isdigit() also takes "²" or "١", which no lease issues.
    return int(text) if text.isascii() and text.isdigit() and len(text) < 12 else -1
