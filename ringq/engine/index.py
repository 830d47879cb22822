"""The reader's index: this process's private, incremental view of what it can lease.

Built from validated scans of newly published records (never by iterating jobs in Python):

* per segment and priority, a *lane*: the head slots of that priority in enqueue order, with a
  cursor.  ``ringq_next_ready`` (C) skips slots that are not READY, so taking the next job costs one
  C call however many other processes are leasing from the same lane.
* a heap with one entry per non-empty lane, keyed ``(-priority, available_at, seq)`` of the lane's
  current candidate, plus individual entries for delayed jobs that came due.
* a scheduled heap of READY jobs whose available-at is in the future, so a delayed job never
  blocks a due one.
* when a job anywhere returns to READY (nack, expired lease, dead holder), the returner bumps its
  segment's change counter; readers seeing it move give those jobs individual entries.

* fair scheduling across keys: once it has read a job with a key, the index orders candidates
  of equal priority by *turn* before available-at and FIFO: each key (jobs without a key count
  as one) takes its turn, one lease, then the next key's (round-robin), and a key that was idle
  starts at the current round, never with credit saved up.  FIFO within a key.  Without a key
  ever read the heap keys stay as they were (``rank`` is minus the priority).

A DEFERRED job (READY with the cancel flag: ringq/engine/deps.py) is never a candidate: lanes
pass over it, and its release bumps the change counters, which gives it its own entry.

The index decides *which* job to try next; claiming it (the CAS) is the caller's.  What it knows
per segment is ringq/engine/views.py; how it learns of other processes' work, ringq/engine/catchup.py.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ._native import ffi, lib
from .catchup import CatchUp
from .claim import RUN_ASK, RUN_END, RUN_FULL, claim_run, pending_run
from .views import Direct, Lane, View, due, lane_kid, lane_prio, now_ms, order
from .words import (
    FLAG_CANCEL,
    ST_DEAD,
    ST_DONE,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    lease_count,
    np_state,
    rel_time,
    state,
)

if TYPE_CHECKING:  # pragma: no cover
    from .ring import Ring
    from .segment import Segment

__all__ = ["Index", "View", "Direct", "now_ms", "order", "due"]


AUTO_ID = re.compile(r"^[0-9a-f]{16}$")
KID_TRACK = 1 << 16  # key ids whose key an index remembers (Index.one_key)
RETAINED = (ST_READY, ST_LEASED, ST_DONE, ST_DEAD)
# Fair order: rank = -priority * TURN_SPAN + turn, so priority still comes first.
TURN_SPAN = 1 << 40


def lease_run(
    view: View, lane: Lane, direct: Direct, bound: tuple[int, int, int] | None, cap: int
) -> tuple[int, bytes, int, int, Any]:
    """Lease up to ``cap`` of ``lane``'s plain jobs from its cursor on, while they rank before
    ``bound`` (a key equal to it is the same job, and is leased), in one C call (claim.claim_run,
    whose answer this is), for ``direct``'s lease."""
    arr = lane.slots
    return claim_run(
        view.seg,
        direct.ctl,
        arr.cptr,
        arr.n,
        lane.cursor,
        view.plain_ptr,
        view.run_fields,
        bound,
        direct.vt_ms,
        direct.owner_base,
        cap,
    )


class Index:
    """The views of every mapped segment, the ready and scheduled heaps, and known job ids."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.views: dict[int, View] = {}
        self.heap: list[tuple] = []
        self.sched: list[tuple] = []
        self.parked: set[tuple[int, int]] = (
            set()
        )  # jobs with an individual entry (scheduled or due)
        self.ids: dict[str, tuple[int, int]] = {}
        self.seen_change = -1
        # Fair scheduling across keys (the module's docstring): on once a keyed job was read.
        self.fair = False
        self.turns: dict[int, int] = {}  # lane key -> the next turn of that key
        self.rounds: dict[int, int] = {}  # priority -> the latest turn served
        # The key each key id of a lane stands for, and the ids two keys share (views.key_id is
        # a hash): a lane whose id is known to stand for one key holds jobs of that key only.
        self.kid_keys: dict[int, str] = {}
        self.shared_kids: set[int] = set()
        # Told when reset() forgot everything (the queue's quiet look: its answers go too).
        self.on_reset: Callable[[], None] | None = None
        # Given the leases a take cut short by an exception took and will not return: the jobs
        # made of them, and a run leased in C whose jobs were not made (claim.pending_run).
        self.give_back: Callable[[list[Any], tuple[Segment, bytes] | None], Any] | None = None
        # Learning of other processes' work is the CatchUp's; its two entry points are the index's.
        self.catchup = CatchUp(self)
        self.catch_up = self.catchup.catch_up
        self.read_through = self.catchup.read_through

    def reset(self) -> None:
        """Forget everything read in: the next catch-up reads every segment again from its first
        record, as a new queue object's first one does.  For a catch-up or take cut short by an
        exception, which may have read records in half or moved a scan position past them; and
        as the queue object closes."""
        self.views.clear()
        self.heap.clear()
        self.sched.clear()
        self.parked.clear()
        self.ids.clear()
        self.catchup.forget()
        if self.on_reset is not None:
            self.on_reset()

    def leases(self) -> Iterator[tuple[View, np.ndarray, np.ndarray, np.ndarray]]:
        """``(view, slots, words, owners)`` for each view with a LEASED word in its live state
        table: those slots, a copy of their state words and then of their owner words.  The
        table is read up to the segment's tail, past what this index has read in (a caller that
        needs a record's fields calls :meth:`read_through` first)."""
        for view in list(self.views.values()):
            tbl = view.seg.states[: view.seg.bounded_tail()]
            words = tbl[:, 0]
            leased = np.flatnonzero(np_state(words) == ST_LEASED)
            if len(leased):
                yield view, leased, words[leased], tbl[leased, 1]

    def adopt(self, segseq: int, slot: int) -> View | None:
        """Read in the record at head ``slot`` of segment ``segseq`` that this process just
        appended, without a catch-up (which could drop the mappings of retired segments the
        caller still looks at): the segment's view is made if the append created the segment."""
        view = self.views.get(segseq)
        if view is None:
            seg = self.ring.segs.get(segseq)
            if seg is None:
                return None
            view = self.views[segseq] = View(seg)
        self.read_through(view, slot)
        return view

    # -- ordering -------------------------------------------------------------------------------

    def rank(self, prio: int, lanekey: int) -> int:
        """The first field of a heap key: minus the priority, and in fair order the turn of the
        job's key after it (see the module's docstring)."""
        if not self.fair:
            return -prio
        turn = max(self.turns.get(lanekey, 0), self.rounds.get(prio, 0))
        return -prio * TURN_SPAN + turn

    def entry(self, view: View, slot: int, at: int) -> tuple:
        """The individual heap entry of the job at ``slot``, due at ``at``."""
        prio, lk = view.prio.item(slot), view.lanekey.item(slot)
        return (self.rank(prio, lk), at, order(view, slot), 1, view.seg.seq, lk, slot, 0)

    def waiting_entry(self, view: View, slot: int, at: int) -> tuple:
        """The entry a limit keeps for a job it holds back (ringq/local/limits.py): the job's
        individual heap entry without its key's turn, which moves on while the job waits.  The
        held-back jobs of one key so order by age (FIFO within a key), and :meth:`take` gives
        each re-offered one the turn its key has then."""
        lk = view.lanekey.item(slot)
        return (-view.prio.item(slot), at, order(view, slot), 1, view.seg.seq, lk, slot, 0)

    def note_key(self, kid: int, key: str) -> None:
        """Key ``key`` has id ``kid`` (views.key_id) in this index's lanes."""
        seen = self.kid_keys.get(kid)
        if seen is None:
            if len(self.kid_keys) < KID_TRACK:
                self.kid_keys[kid] = key
        elif seen != key:
            self.shared_kids.add(kid)

    def one_key(self, lanekey: int) -> bool:
        """True if every job of a lane with ``lanekey`` has the same key (or none): a limit that
        holds back one of them holds back all, so the lane can wait as one.  A key id not
        tracked (past KID_TRACK keys) may be shared: False."""
        kid = lane_kid(lanekey)
        return not kid or (kid in self.kid_keys and kid not in self.shared_kids)

    def keyed(self) -> None:
        """A job with a key was read in: order by turns from now on (the heap's keys are
        rewritten once, every key at turn 0)."""
        if self.fair:
            return
        self.fair = True
        self.heap = [(e[0] * TURN_SPAN, *e[1:]) for e in self.heap]
        heapq.heapify(self.heap)

    def served(self, lanekey: int, prio: int, n: int) -> None:
        """``n`` jobs of lane key ``lanekey`` were just leased: its key's turn moves on, and the
        round to that of the last of them, as ``n`` leases of one job each would have left it."""
        if not self.fair:
            return
        turn = max(self.turns.get(lanekey, 0), self.rounds.get(prio, 0))
        self.rounds[prio] = turn + n - 1
        self.turns[lanekey] = turn + n
        if len(self.turns) > 1 << 16:  # many keys came and went: forget the idle ones' turns
            rounds = self.rounds
            self.turns = {k: t for k, t in self.turns.items() if t > rounds.get(lane_prio(k), 0)}

    def turns_before_another_key(self, rank: int, key: int, look: int = 32) -> int | None:
        """In fair order: how many jobs a lane of lane key ``key`` at heap rank ``rank`` may take
        before another key's turn at its priority comes (at least 1), or None if no other key
        has a candidate at that priority.  A best-first walk of the heap from its top, passing
        over ``key``'s own entries and pruning lower priorities; after ``look`` of ``key``'s
        entries without an answer, 1 (one job at a time is always fair).  A stale entry ranks
        a key too early, never too late, so the answer is never too large."""
        heap = self.heap
        if not heap:
            return None
        band = rank // TURN_SPAN
        frontier = [(heap[0], 0)]
        while frontier:
            e, i = heapq.heappop(frontier)
            if e[0] // TURN_SPAN != band:
                continue  # a lower priority, and so is everything below it
            if e[5] != key:
                return max(1, e[0] - rank)
            look -= 1
            if look < 0:
                return 1
            for c in (2 * i + 1, 2 * i + 2):
                if c < len(heap):
                    heapq.heappush(frontier, (heap[c], c))
        return None

    def park(self, view: View, slot: int, now: int) -> None:
        """Give one READY job an individual entry: scheduled if not due yet, else in the ready heap."""
        seg = view.seg
        key = (seg.seq, slot)
        if key in self.parked:
            return
        w = seg.load_state(slot)
        if state(w) != ST_READY or w & FLAG_CANCEL:
            return  # not ready, or DEFERRED (its release gives it an entry then)
        at = due(view, slot, w)
        self.parked.add(key)
        view.entered[slot] = True
        if at > now:
            heapq.heappush(
                self.sched, (at, -view.prio.item(slot), order(view, slot), seg.seq, slot)
            )
        else:
            heapq.heappush(self.heap, self.entry(view, slot, at))

    def _schedule(self, view: View, slot: int, due_ms: int) -> None:
        key = (view.seg.seq, slot)
        if key in self.parked:
            return
        self.parked.add(key)
        view.entered[slot] = True
        heapq.heappush(
            self.sched, (due_ms, -view.prio.item(slot), order(view, slot), view.seg.seq, slot)
        )

    def _lane_key(self, view: View, lane: Lane, now: int | None = None) -> tuple | None:
        """Advance the lane's cursor to its next due READY job and return that job's heap key.

        READY jobs that are not yet due are moved to the scheduled heap on the way, so a delayed
        job never hides due ones behind it.
        """
        seg = view.seg
        if now is None:
            now = now_ms()
        out = ffi.new("uint64_t *")
        arr = lane.slots
        while True:
            idx = lib.ringq_next_ready(
                seg.ptr,
                seg.size,
                seg.geom,
                ffi.cast("uint32_t *", arr.ptr),
                arr.n,
                lane.cursor,
                out,
            )
            if idx < 0 or idx >= arr.n:
                lane.cursor = arr.n
                return None
            slot = arr.a.item(idx)
            w = out[0]
            if w & FLAG_CANCEL:  # DEFERRED: passed over (its release parks it)
                lane.cursor = idx + 1
                continue
            if lease_count(w) or view.parkme[slot] or seg.epoch_ms + rel_time(w) > now:
                # A retried or delayed job orders by its own available-at, not its lane position.
                self.park(view, slot, now)
                lane.cursor = idx + 1
                continue
            lane.cursor = idx
            return (
                self.rank(lane.prio, lane.key),
                due(view, slot, w),
                order(view, slot),
                0,
                seg.seq,
                lane.key,
                slot,
                w,
            )

    def queue_lane_next(self, view: View, lane: Lane) -> None:
        """Queue a lane whose candidate was just leased, keyed by the next slot in lane order
        without looking at its state word (no C call): ringq_take_run checks it when it comes
        first, and hands back any other candidate."""
        if lane.queued or lane.cursor >= lane.slots.n:
            return
        slot = lane.slots.a.item(lane.cursor)
        if not view.plain[slot]:
            self.queue_lane(view, lane)
            return
        lane.queued = True
        heapq.heappush(
            self.heap,
            (
                self.rank(lane.prio, lane.key),
                view.avail.item(slot),
                order(view, slot),
                0,
                view.seg.seq,
                lane.key,
                slot,
                0,
            ),
        )

    def queue_lane(self, view: View, lane: Lane, now: int | None = None) -> None:
        if lane.queued:
            return
        key = self._lane_key(view, lane, now)
        if key is not None:
            lane.queued = True
            heapq.heappush(self.heap, key)

    def next_due_ms(self) -> int | None:
        """When the earliest scheduled (delayed) job this process knows of comes due, or None."""
        return self.sched[0][0] if self.sched else None

    def take_top(self, direct: Direct) -> list[Any] | None:
        """One plain job of the best lane, leased in one C call with the lane left in place on the
        heap: :meth:`take` of one job in its common case (no fair order, no scheduled job come
        due, the heap's top a lane).  Returns what ``direct.made_run`` made of it, or None when
        nothing was leased here and :meth:`take` must decide.  The caller makes sure no limit
        and no paused key applies and that the limits gate holds nothing back."""
        try:
            heap = self.heap
            if not heap or self.fair:
                return None
            sched = self.sched
            if sched and sched[0][0] <= now_ms():
                return None
            entry = heap[0]
            view = self.views.get(entry[4])
            if entry[3] != 0 or view is None:
                return None
            lane = view.lanes[entry[5]]
            # The best candidate of any other lane: the smaller of the top's children.
            bound = None
            n = len(heap)
            if n > 1:
                top = heap[1] if n == 2 or heap[1] <= heap[2] else heap[2]
                if top[0] == entry[0]:
                    bound = (top[1], top[2] >> 32, top[2])
            got, run, nxt, why, pending = lease_run(view, lane, direct, bound, 1)
            if not got:
                if why == RUN_END:
                    # No READY job left in the lane: it leaves the heap as take() would drop it
                    # after the same call, which need not be made twice.
                    heapq.heappop(heap)
                    lane.queued = False
                    lane.cursor = nxt
                return None  # take() decides (from the same cursor unless the lane ended)
            lane.cursor = nxt
            # One job leased: the call stopped at the lane's next READY job (RUN_FULL) or found none
            # (RUN_END).  A full lane stays under the key it was taken with, which ranks it too early,
            # never too late: the bound checks its next job when it comes first again.  An ended
            # lane leaves the heap, as in take().
            if why == RUN_END:
                heapq.heappop(heap)
                lane.queued = False
            jobs = direct.made_run(view, run)
            pending[2] = 0  # the caller's from here: no call until the return
            return jobs
        except BaseException:
            self._cut_short([])
            raise

    def take(
        self,
        want: int,
        claim: Callable[[View, int, int, int], Any],
        held_back: Any,
        skip: Callable[[View, int], bool] | None = None,
        direct: Direct | None = None,
    ) -> list[Any]:
        """Try candidates best first until ``want`` claims succeed or none is left.

        ``claim(view, slot, word, now)`` attempts one job and returns a result or None (lost the
        race, or not leasable after all).  ``held_back`` is the limits gate (ringq/local/limits.py):
        jobs it held back are offered again (``reoffer()``), and a lane moves past a job it holds
        (``blocked(segseq, slot)``), which then waits in the gate, not in the lane.
        ``skip(view, slot)``, if given, passes over a job for this call (a paused key): it keeps
        an individual entry and is tried again next time.  ``direct``, if given (only when no limit
        and no pause can apply), leases a lane's run of plain candidates in one C call
        (``ringq_take_run``, :func:`lease_run`) and hands them to ``direct.made_run``; everything
        else goes to ``claim``.
        """
        now = now_ms()
        passed: list[tuple[View, int]] = []
        # Lanes whose candidate a limit held back: the limit holds back every job behind it
        # too (one key per lane), so they wait as one until the next take, not job by job.
        aside: list[tuple[View, Lane]] = []
        out: list[Any] = []
        try:
            self._take(want, claim, held_back, skip, direct, now, passed, aside, out)
            for view, lane in aside:
                self.queue_lane(view, lane, now)
            for view, slot in passed:
                self.park(view, slot, now)
            return out
        except BaseException:
            self._cut_short(out)
            raise

    def _cut_short(self, out: list[Any]) -> None:
        """As an exception (a signal handler's) leaves :meth:`take` or :meth:`take_top`: lanes
        may be off the heap with their ``queued`` flag still set, jobs neither passed nor parked,
        so everything read in is forgotten (:meth:`reset`); and the leases taken that will not
        reach the caller -- the jobs of ``out`` and a run leased in C whose jobs were not made --
        go back unleased (:attr:`give_back`)."""
        pend = pending_run()
        self.reset()
        if self.give_back is not None and (out or pend is not None):
            self.give_back(out, pend)

    def _take(
        self,
        want: int,
        claim: Callable[[View, int, int, int], Any],
        held_back: Any,
        skip: Callable[[View, int], bool] | None,
        direct: Direct | None,
        now: int,
        passed: list[tuple[View, int]],
        aside: list[tuple[View, Lane]],
        out: list[Any],
    ) -> None:
        sched, heap = self.sched, self.heap
        while sched and sched[0][0] <= now:
            at, nprio, seq, segseq, slot = heapq.heappop(sched)
            if self.fair:
                v = self.views.get(segseq)
                if v is None:
                    continue
                heapq.heappush(heap, self.entry(v, slot, at))
            else:
                heapq.heappush(heap, (nprio, at, seq, 1, segseq, 0, slot, 0))
        for held in held_back.reoffer():  # jobs a limit held back: worth another try
            if self.fair:  # ranked by their key's turn now (waiting_entry)
                v = self.views.get(held[4])
                if v is None:
                    continue
                held = self.entry(v, held[6], held[1])
            heapq.heappush(heap, held)
        while len(out) < want and heap:
            entry = heapq.heappop(heap)
            kind, segseq, prio, slot = entry[3], entry[4], entry[5], entry[6]
            view = self.views.get(segseq)
            if view is None:
                continue
            if kind == 0:
                lane = view.lanes[prio]
                lane.queued = False
                if direct is not None:
                    # The lane's run of plain jobs in one C call, as far as they rank before the
                    # best candidate of any other lane (the heap's top, of the same priority).
                    arr = lane.slots
                    top = heap[0] if heap else None
                    bound = None
                    cap = want - len(out)
                    if not self.fair:
                        if top is not None and top[0] == entry[0]:
                            bound = (top[1], top[2] >> 32, top[2])
                    else:
                        if self.rank(lane.prio, lane.key) > entry[0]:
                            self.queue_lane_next(view, lane)  # its key was served since: requeue
                            continue
                        if top is not None and top[0] // TURN_SPAN == entry[0] // TURN_SPAN:
                            if top[5] == lane.key:  # the same key: FIFO, as without keys
                                bound = (top[1], top[2] >> 32, top[2])
                            gap = self.turns_before_another_key(entry[0], lane.key)
                            if gap is not None:  # another key's turn comes after this many
                                cap = min(cap, gap)
                    got, run, nxt, why, pending = lease_run(view, lane, direct, bound, cap)
                    lane.cursor = nxt
                    if got:
                        jobs = direct.made_run(view, run)
                        out += jobs
                        pending[2] = (
                            0  # in ``out``: an exception from here gives them back from there
                        )
                        if self.fair:
                            self.served(lane.key, lane.prio, got)
                    if why == RUN_END:
                        continue
                    if why == RUN_FULL and not self.fair and lane.cursor < arr.n:
                        # The lane goes back under the key it was taken with, which ranks it too
                        # early, never too late: when it comes first again, the call above checks
                        # its next job against the best other candidate (``bound``) and hands the
                        # lane back (bounded) if that job ranks later.
                        lane.queued = True
                        heapq.heappush(heap, entry)
                        continue
                    if why != RUN_ASK:  # bounded or full: the lane waits its turn
                        self.queue_lane_next(view, lane)
                        continue
                    # Another candidate, or one that needs a decision: the general path below.
                key = self._lane_key(view, lane, now)
                if key is None:
                    continue
                slot, w = key[6], key[7]
                if key[:3] > entry[:3]:  # the lane's candidate changed: re-queue at its real place
                    lane.queued = True
                    heapq.heappush(heap, key)
                    continue
                if skip is not None and skip(view, slot):
                    lane.cursor += 1
                    passed.append((view, slot))
                    self.queue_lane(view, lane, now)
                    continue
                got = claim(view, slot, w, now)
                if got is not None:
                    out.append(got)  # first: an exception from here gives it back from ``out``
                    lane.cursor += 1
                    self.served(lane.key, lane.prio, 1)
                elif held_back.blocked(segseq, slot):
                    if self.one_key(lane.key):
                        # The limit holds back every job of the lane (one key): the lane waits
                        # whole, this job at its head, until the next take, so no newer job of
                        # the key goes before it (the gate may offer it too: a duplicate entry).
                        aside.append((view, lane))
                        continue
                    lane.cursor += 1  # the job waits in the gate; the lane goes on past it
                self.queue_lane(view, lane, now)
            else:
                self.parked.discard((segseq, slot))
                view.entered[slot] = False
                w = view.seg.load_state(slot)
                if state(w) != ST_READY or w & FLAG_CANCEL:
                    continue  # leased, finished, or DEFERRED (again: a rerun's hold)
                at = due(view, slot, w)
                if at > now:
                    self._schedule(view, slot, at)
                    continue
                prio_s, lk = view.prio.item(slot), view.lanekey.item(slot)
                if (self.rank(prio_s, lk), at, order(view, slot)) > entry[:3]:
                    self.park(view, slot, now)  # its available-at moved: re-queue at its real place
                    continue
                if skip is not None and skip(view, slot):
                    passed.append((view, slot))
                    continue
                got = claim(view, slot, w, now)
                if got is not None:
                    out.append(got)
                    self.served(lk, prio_s, 1)

    # -- finding jobs ---------------------------------------------------------------------------

    def find(self, job_id: str) -> tuple[int, int] | None:
        """Location ``(segment seq, slot)`` of the retained record of ``job_id``, or None.

        A purged (GONE) record is not retained: its id is free again.
        """
        loc = self.ids.get(job_id)
        if loc is not None:
            view = self.views.get(loc[0])
            if view is not None and self.retained(view, loc[1]):
                return loc
            if view is None or state(view.seg.load_state(loc[1])) == ST_GONE:
                del self.ids[job_id]
            return None
        if AUTO_ID.match(job_id):
            seq = int(job_id, 16)
            for view in self.views.values():
                hs = view.head_seqs
                if hs.n and hs.a[0] <= seq <= hs.a[hs.n - 1]:
                    i = int(np.searchsorted(hs.view(), seq))
                    if i < hs.n and hs.a[i] == seq:
                        slot = int(view.heads.a[i])
                        if view.idlen[slot] == 0 and self.retained(view, slot):
                            return (view.seg.seq, slot)
        return None

    @staticmethod
    def retained(view: View, slot: int) -> bool:
        return state(view.seg.load_state(slot)) in RETAINED

    def heads(
        self,
        states: Iterable[int],
        shown: Callable[[View, np.ndarray, np.ndarray], None] | None = None,
    ) -> list[tuple[int, View, int, int]]:
        """(rank, view, slot, word) of retained heads whose state is in ``states``, in enqueue order.

        ``shown(view, rows, slots)``, if given, may rewrite the private copy of the state-table rows
        first (reads show expired leases as what reclaiming them will make them)."""
        wanted = np.array(sorted(states), dtype=np.uint64)
        rows = []
        for view in self.views.values():
            heads = view.heads.view()
            if not len(heads):
                continue
            tbl = view.seg.states[heads]  # a copy (fancy indexing): never written back
            if shown is not None:
                shown(view, tbl, heads)
            words = tbl[:, 0]
            sel = np.isin(np_state(words), wanted)
            for slot, word in zip(heads[sel].tolist(), words[sel].tolist()):
                rows.append((order(view, slot), view, slot, word))
        rows.sort(key=lambda r: r[0])
        return rows
