"""Dependencies between jobs: a DEFERRED job waits for its parents, then becomes READY once.

What is stored (docs/format.md, "Dependencies"):

* the dependent's record (kind 3) names its parents *by id* in the parents' section of its
  metadata block (ringq/engine/meta.py, TAG_DEPS), with ``allow_failure``; ids, never positions,
  because a parent may be relocated (ringq/engine/relocate.py) while its dependent waits;
* its state word is DEFERRED (ringq/engine/words.py ``deferred_word``): READY with the cancel
  flag and the farthest time, so no lease path takes it;
* which parents have *finished* (their edge *fired*): one bit per parent in a tree of 64-bit
  words, the owner words of the record's continuation slots (unused otherwise: only a head
  slot is ever leased).  The enqueuer pads the record so that it spans enough slots.  Bits only
  ever go from 0 to 1, each by CAS, so firing an edge is idempotent: whoever fires it, however
  often, after whatever crash, the tree ends the same.  A leaf word full sets its bit in the word
  above; the root word full means every parent finished.

A dependent is *released* by the CAS ``DEFERRED -> READY`` of its state word, which only one
process can win: released exactly once.  It is *cancelled* (``DEFERRED -> CANCELLED``, the error
naming the parent) when a parent ends DEAD, CANCELLED or EXPIRED and it was not enqueued with
``allow_failure``; its own dependents then see a failed parent, so failure propagates.

Who fires an edge: the process that finished the parent, right after its state change (found
through this process's map of parents to dependents, filled as the index reads dependents'
records in: O(dependents of that parent) per completion, never a scan of a dependent's parents);
the enqueuer, after it published the dependent (a parent that finished before the dependent was
visible); and any process's sweep, of SWEEP_BATCH deferred dependents in turn every
SWEEP_INTERVAL in its reaper pass, and of all of them when its reader opens (a process killed between a parent's change and the firing, or an enqueuer killed before
its check).  Ordering: the enqueuer publishes the record, then bumps the control page's
dependents counter, then checks the parents; a finisher changes the parent's word, then reads
the counter and catches up if it moved.  Either the finisher's catch-up sees the dependent, or
the enqueuer's check sees the finished parent.

A segment retires only once its jobs are DONE or GONE, and its parents' outcomes must not go
with it: a process retires a segment only when its map is up to date (the counter has not moved
since it caught up), after firing the edges of the parents it holds (:meth:`Deps.before_retire`);
a process without a reader (a producer) never retires a segment of a queue that has dependents.
A parent that is no longer retained anywhere (found by no catch-up) counts as done: it finished
(only finished jobs retire) and its edge did not fire, which needs a finisher killed between its
change and the firing *and* an enqueuer killed before its check.

*Reruns* (``enqueue(..., job_id=k, debounce=)`` or ``replace=True``): the replacement of job
``k`` is a new record with the same id whose header's ``supersedes`` names the record it
replaces (and, replacing a rerun still waiting, TAG_AFTER the run that one waited for).  It is
DEFERRED until those *predecessors* are out of the way: a waiting predecessor (READY, DEFERRED) or
a dead one is superseded (CAS to GONE) by whoever checks; a leased one is waited for, so the
replacement runs after it.  A predecessor is named by position: it is looked at only while it is
leased (never relocated) or about to be superseded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ringq.errors import CorruptionError

from . import meta, records, transitions
from .words import (
    FLAG_CANCEL,
    ST_BAD,
    ST_DEAD,
    ST_DONE,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    WHY_NONE,
    WHY_PURGED,
    deferred_word,
    is_deferred,
    now_ms,
    pack,
    position,
    split_position,
    state,
    why,
)

if TYPE_CHECKING:  # pragma: no cover
    from .index import Index
    from .ring import Ring
    from .segment import Segment
    from .views import View

__all__ = [
    "Deps",
    "Dependent",
    "tree_words",
    "tree_set",
    "tree_fired",
    "lost_word",
    "span_for",
    "SWEEP_INTERVAL",
    "SWEEP_BATCH",
    "PENDING",
    "SUCCEEDED",
    "FAILED",
    "MOVED",
    "outcome",
]

SWEEP_INTERVAL = 1.0  # seconds between a process's sweeps of the dependents it knows
SWEEP_BATCH = 512  # deferred dependents one sweep looks at, in turn (all of them when forced)
HOLD = 5.0  # seconds a replaced or rescheduled job is held while its copy is written

# What a job's state word says about it as a parent (or predecessor).
PENDING, SUCCEEDED, FAILED, MOVED = 0, 1, 2, 3

_FULL = (1 << 64) - 1


# -- the tree of fired bits --------------------------------------------------------------------------


def _levels(n: int) -> list[tuple[int, int]]:
    """``[(first word, items)]`` of the tree of ``n`` parents, leaves first: the leaves hold one
    bit per parent, each level above one bit per word of the level below, the top one word.
    Words are numbered from the top: word 0 is always the root."""
    counts = [n]
    while counts[-1] > 64:
        counts.append(-(-counts[-1] // 64))
    out: list[tuple[int, int]] = []
    first = 0
    for items in reversed(counts):
        out.append((first, items))
        first += -(-items // 64)
    return out[::-1]


def tree_words(n: int) -> int:
    """Words of the tree of ``n`` parents (0 for none)."""
    if n <= 0:
        return 0
    return sum(-(-items // 64) for _first, items in _levels(n))


def span_for(n: int, slot_size: int) -> int:
    """The least record length (bytes) whose slots hold the tree of ``n`` parents: the head slot
    and one continuation slot per word."""
    words = tree_words(n)
    return words * slot_size + 1 if words else 0


def _word_slot(slot: int, word: int) -> int:
    return slot + 1 + word


def _or_owner(seg: Segment, slot: int, bits: int) -> int:
    """OR ``bits`` into the owner word of ``slot`` by CAS; returns the word after."""
    cur = seg.load_owner(slot)
    while cur & bits != bits:
        ok, seen = seg.cas_owner(slot, cur, cur | bits)
        if ok:
            return cur | bits
        cur = seen
    return cur


def tree_set(seg: Segment, slot: int, n: int, i: int) -> bool:
    """Fire edge ``i`` of the dependent at head ``slot`` with ``n`` parents; True if every edge
    has fired (the root is full).  Idempotent."""
    idx = i
    for first, items in _levels(n):
        w = idx // 64
        in_word = min(64, items - 64 * w)
        full = _FULL if in_word == 64 else (1 << in_word) - 1
        now = _or_owner(seg, _word_slot(slot, first + w), 1 << (idx % 64))
        if now & full != full:
            return False
        idx = w
    return True


def tree_full(seg: Segment, slot: int, n: int) -> bool:
    """True if every edge of the dependent at ``slot`` fired (its root word is full)."""
    first, items = _levels(n)[-1]
    full = _FULL if items == 64 else (1 << items) - 1
    return seg.load_owner(_word_slot(slot, first)) & full == full


def tree_repair(seg: Segment, slot: int, n: int) -> bool:
    """Set the bit of every full word in the word above it (a firer killed between two levels
    left it unset); True if the root is full."""
    levels = _levels(n)
    for (first, items), (up_first, _up_items) in zip(levels, levels[1:]):
        for w in range(-(-items // 64)):
            in_word = min(64, items - 64 * w)
            full = _FULL if in_word == 64 else (1 << in_word) - 1
            if seg.load_owner(_word_slot(slot, first + w)) & full == full:
                _or_owner(seg, _word_slot(slot, up_first + w // 64), 1 << (w % 64))
    return tree_full(seg, slot, n)


def tree_fired(seg: Segment, slot: int, n: int) -> list[bool]:
    """Per parent, whether its edge fired (the leaf bits)."""
    first, _items = _levels(n)[0]
    out: list[bool] = []
    for w in range(-(-n // 64)):
        word = seg.load_owner(_word_slot(slot, first + w))
        out.extend(bool(word >> b & 1) for b in range(min(64, n - 64 * w)))
    return out


def clear_tree(seg: Segment, slot: int, n: int) -> None:
    """Zero the tree (recovery of a dependent whose state word was lost: its bits are re-derived
    from its parents)."""
    for w in range(tree_words(n)):
        s = _word_slot(slot, w)
        seg.cas_owner(s, seg.load_owner(s), 0)


def lost_word(seg: Segment, slot: int, available_ms: int) -> int:
    """The state word to publish again for the intact record at ``slot`` whose state word was
    lost (EMPTY: a power loss kept the record, not its state page): DEFERRED for a dependent or
    a rerun (its tree zeroed: every edge fires again from its parents' states), else READY at
    its initial available-at."""
    try:
        info, _id, payload = records.read_record(seg, slot)
        m = meta.split(info.kind, info.codec, payload)[2] if info.kind == meta.KIND_META else None
    except CorruptionError:
        m = None
    if m is not None and (m.parents is not None or m.after or info.supersedes):
        if m.parents is not None:
            clear_tree(seg, slot, len(m.parents))
        return deferred_word()
    return pack(ST_READY, WHY_NONE, 0, max(available_ms - seg.epoch_ms, 0))


def outcome(w: int) -> int:
    """What state word ``w`` says about a parent: PENDING (ready, deferred, leased), SUCCEEDED
    (done), FAILED (dead, cancelled, expired, purged, damaged) or MOVED (superseded by a newer
    copy of the job: look it up again by id)."""
    st = state(w)
    if st in (ST_READY, ST_LEASED):
        return PENDING
    if st == ST_DONE:
        return FAILED if w & FLAG_CANCEL else SUCCEEDED
    if st == ST_GONE:
        return FAILED if why(w) == WHY_PURGED else MOVED
    if st in (ST_DEAD, ST_BAD):
        return FAILED
    return MOVED  # EMPTY or CONT: not a job any more at that place


def ended(w: int) -> str:
    """How a failed parent ended, for the dependent's error."""
    unrun = transitions.ended_unrun(w)
    if unrun:
        return unrun
    st = state(w)
    if st == ST_DEAD:
        return "dead-lettered"
    if st == ST_GONE:
        return "purged"
    return "quarantined as damaged"


@dataclass(slots=True)
class Dependent:
    """A dependent (or a rerun) this process read in: where its record is, its parents and
    predecessors (positions; 0: none)."""

    segseq: int
    slot: int
    id: str
    seq: int
    parents: tuple[str, ...]
    allow_failure: bool
    supersedes: int
    after: int
    available_ms: int


class Deps:
    """The dependents of one queue as this process knows them, and the firing of their edges.

    ``ring`` and ``index`` are the queue's; the index calls :meth:`ingest` for every record of
    it reads in that may name other jobs (``CatchUp.on_dependent``).  ``catch_up()`` is the index's catch-up without
    relocation."""

    def __init__(self, ring: Ring, index: Index, catch_up: Callable[[], object]) -> None:
        self.ring = ring
        self.index = index
        self.catch_up = catch_up
        self.seen = -1  # the dependents counter as of this process's last catch-up for it
        self.known: dict[tuple[int, int], Dependent] = {}  # every dependent read in, by place
        self.by_parent: dict[str, list[tuple[Dependent, int]]] = {}  # parent id -> (dep, edge)
        self.waiting_on: dict[int, list[Dependent]] = {}  # predecessor position -> reruns
        self.deferred: dict[tuple[int, int], Dependent] = {}  # those read in DEFERRED
        self.last_sweep = 0.0
        self.sweep_at = 0  # where the next sweep starts among the deferred dependents
        ring.segs.before_retire = self.before_retire

    # -- reading dependents in ---------------------------------------------------------------------

    def ingest(self, view: View, slot: int) -> None:
        """The index read in the record at ``slot`` (of kind 3, or superseding another): note it
        if it names parents, or waits for the run it replaces."""
        seg = view.seg
        w = seg.load_state(slot)
        kind = records.BODY.unpack_from(
            seg.mm, seg.data_off + slot * seg.slot_size + records.OFF_BODY
        )[2]
        if not is_deferred(w) and (
            kind != meta.KIND_META or not meta.names_others(seg.mm, records.body_span(seg, slot))
        ):
            return  # a relocated copy, or a timeout or a trace context only: nothing to note
        try:
            info, id_bytes, payload = records.read_record(seg, slot)
            m = meta.split(info.kind, info.codec, payload)[2]
        except CorruptionError:
            return  # refused (marked BAD) when its snapshot is read
        if m.parents is None and not (is_deferred(w) and (m.after or info.supersedes)):
            return
        dep = Dependent(
            seg.seq,
            slot,
            records.job_id(info, id_bytes),
            int(info.seq),
            m.parents or (),
            m.allow_failure,
            int(info.supersedes) if is_deferred(w) else 0,
            m.after,
            int(info.available_ms),
        )
        key = (seg.seq, slot)
        self.known[key] = dep
        for i, pid in enumerate(dep.parents):
            self.by_parent.setdefault(pid, []).append((dep, i))
        if is_deferred(w):
            self.deferred[key] = dep
            for pred in (dep.supersedes, dep.after):
                if pred:
                    self.waiting_on.setdefault(pred, []).append(dep)
            if not self.ring.ctl.deps_count():  # a control page rebuilt without the counter
                self.ring.ctl.bump_deps()

    def prune(self) -> None:
        """Forget dependents whose segment this process no longer maps (retired)."""
        views = self.index.views
        if all(k[0] in views for k in self.known):
            return
        self.known = {k: d for k, d in self.known.items() if k[0] in views}
        self.deferred = {k: d for k, d in self.deferred.items() if k[0] in views}
        self.by_parent = {}
        self.waiting_on = {}
        for dep in self.known.values():
            for i, pid in enumerate(dep.parents):
                self.by_parent.setdefault(pid, []).append((dep, i))
        for dep in self.deferred.values():
            for pred in (dep.supersedes, dep.after):
                if pred:
                    self.waiting_on.setdefault(pred, []).append(dep)

    def sync(self) -> None:
        """Catch up if a dependent was published since this process last did for them."""
        c = self.ring.ctl.deps_count()
        if c != self.seen:
            self.catch_up()
            self.seen = c

    # -- a job changed ------------------------------------------------------------------------------

    def changed(self, view: View, slot: int, word: int) -> None:
        """The job at ``slot`` of ``view`` just left LEASED, or finished (state word ``word``):
        fire the edges of its dependents, and release the reruns waiting for it."""
        if not self.ring.ctl.deps_count():
            return  # the queue never had a dependent: the common case, one load
        self.sync()
        todo = [(view.seg.seq, slot, word)]
        while todo:
            segseq, s, w = todo.pop()
            for dep in self.waiting_on.get(position(segseq, s), ()):
                todo += self.check(dep)
            result = outcome(w)
            if result in (SUCCEEDED, FAILED):
                v = self.index.views.get(segseq)
                if v is None:
                    continue
                jid = self.job_id(v, s)
                for dep, i in self.by_parent.get(jid, ()):
                    todo += self.fire(dep, i, jid, result, w)

    def settle(self, todo: list[tuple[int, int, int]]) -> int:
        """Tell the dependents of each job in ``todo`` (segment seq, slot, new word: what a check
        or a firing changed) that it changed; returns how many there were."""
        for segseq, s, w in todo:
            view = self.index.views.get(segseq)
            if view is not None:
                self.changed(view, s, w)
        return len(todo)

    def job_id(self, view: View, slot: int) -> str:
        n = int(view.idlen[slot])
        if not n:
            return f"{int(view.seq[slot]):016x}"
        return records.read_id(view.seg, slot, n).decode("utf-8", "replace")

    def fire(
        self, dep: Dependent, i: int, pid: str, result: int, w: int
    ) -> list[tuple[int, int, int]]:
        """Fire edge ``i`` of ``dep`` (parent ``pid`` ended with word ``w``, ``result``).  Returns
        the jobs this changed (a dependent cancelled), whose own dependents are next."""
        seg = self._segment(dep)
        if seg is None or not is_deferred(seg.load_state(dep.slot)):
            return []
        if result == FAILED and not dep.allow_failure:
            return self.cancel(dep, seg, f"parent job {pid!r} ended {ended(w)}")
        if tree_set(seg, dep.slot, len(dep.parents), i):
            return self.release(dep, seg)
        return []

    def check(
        self, dep: Dependent, located: dict[str, tuple[Segment, int]] | None = None
    ) -> list[tuple[int, int, int]]:
        """Look at every parent whose edge has not fired and every predecessor of ``dep``; fire,
        cancel or release as they say.  ``located``: where the enqueuer found each parent (read
        there, under the writer lock: no relocation moved them, and their mappings are still
        held even if their segment retired since).  Returns the jobs this changed."""
        seg = self._segment(dep)
        if seg is None:
            return []
        w = seg.load_state(dep.slot)
        if not is_deferred(w):
            self.deferred.pop((dep.segseq, dep.slot), None)
            return []
        n = len(dep.parents)
        if n:
            fired = tree_fired(seg, dep.slot, n)
            for i, pid in enumerate(dep.parents):
                if fired[i]:
                    continue
                at = None if located is None else located.get(pid)
                result = MOVED
                if at is not None:
                    pw = at[0].load_state(at[1])
                    result = outcome(pw)
                if result == MOVED:
                    result, pw = self.parent(pid)
                if result == FAILED and not dep.allow_failure:
                    return self.cancel(dep, seg, f"parent job {pid!r} ended {ended(pw)}")
                if result != PENDING:
                    tree_set(seg, dep.slot, n, i)
            if not tree_repair(seg, dep.slot, n):
                return []
        return self.release(dep, seg)

    def parent(self, pid: str) -> tuple[int, int]:
        """``(outcome, word)`` of parent ``pid`` as found now: by id, again after a catch-up if
        it is not found or has moved.  Not found after a catch-up: finished and no longer
        retained (counted SUCCEEDED; see the module's docstring)."""
        for attempt in range(2):
            loc = self.index.find(pid)
            if loc is not None:
                w = self.index.views[loc[0]].seg.load_state(loc[1])
                result = outcome(w)
                if result != MOVED:
                    return result, w
            else:
                raw = self.index.ids.get(pid)
                view = None if raw is None else self.index.views.get(raw[0])
                if view is not None:
                    w = view.seg.load_state(raw[1])  # type: ignore[index]
                    if outcome(w) == FAILED:
                        return FAILED, w
            if attempt == 0:
                self.catch_up()
        return SUCCEEDED, pack(ST_DONE, 0, 0, 0)

    def predecessors_clear(self, dep: Dependent) -> bool:
        """True once every predecessor of the rerun ``dep`` is out of its way: finished, or
        superseded here (a waiting or dead one: the rerun takes its place); False while one is
        leased."""
        for pred in (dep.supersedes, dep.after):
            if not pred:
                continue
            segseq, slot = split_position(pred)
            seg = self.ring.segs.segment(segseq)
            if seg is None or seg.mm is None:
                continue  # retired: it finished
            w = seg.load_state(slot)
            while True:
                st = state(w)
                if st == ST_LEASED:
                    return False
                if st not in (ST_READY, ST_DEAD):
                    break  # done, cancelled, expired, gone, damaged
                ok, w = seg.cas_state(slot, w, transitions.gone(w))
                if ok:
                    self.ring.segs.note_finished(seg)
                    break
        return True

    def release(self, dep: Dependent, seg: Segment) -> list[tuple[int, int, int]]:
        """CAS ``dep`` from DEFERRED to READY (due at its available-at, or now if that passed),
        once its predecessors are out of the way.  The one release of a dependent."""
        if not self.predecessors_clear(dep):
            return []
        at = max(dep.available_ms, now_ms())
        ready = pack(ST_READY, WHY_NONE, 0, at - seg.epoch_ms)
        if seg.cas_state(dep.slot, deferred_word(), ready)[0]:
            self.deferred.pop((dep.segseq, dep.slot), None)
            self.ring.note_returned(seg)  # readers look for it behind their lanes' cursors
        return []

    def cancel(self, dep: Dependent, seg: Segment, why_text: str) -> list[tuple[int, int, int]]:
        """CAS ``dep`` from DEFERRED to CANCELLED with the error ``why_text``; returns it, for its
        own dependents."""
        w = seg.load_state(dep.slot)
        while is_deferred(w):
            new = transitions.cancelled_pending(w, now_ms() - seg.epoch_ms)
            ok, w = seg.cas_state(dep.slot, w, new)
            if ok:
                self.ring.write_error(seg, dep.slot, 0, why_text)
                self.deferred.pop((dep.segseq, dep.slot), None)
                self.ring.segs.note_finished(seg)
                return [(dep.segseq, dep.slot, new)]
        return []

    def _segment(self, dep: Dependent) -> Segment | None:
        view = self.index.views.get(dep.segseq)
        if view is None or view.seg.mm is None:
            return None
        return view.seg

    # -- the sweep -----------------------------------------------------------------------------------

    def sweep(self, force: bool = False) -> int:
        """Check the deferred dependents this process knows: edges a killed process did not
        fire, releases it did not make.  Also restores deferred words a killed rescheduler left
        held.  Every SWEEP_INTERVAL the next SWEEP_BATCH of them in turn (a sweep's cost is
        bounded however many wait), all of them when ``force`` (a reader's first look).
        Returns how many jobs changed."""
        if not self.ring.ctl.deps_count():
            return 0
        t = time.monotonic()
        if not force and t - self.last_sweep < SWEEP_INTERVAL:
            return 0
        self.last_sweep = t
        self.sync()
        self.prune()
        todo = list(self.deferred.values())
        if not force and len(todo) > SWEEP_BATCH:
            start = self.sweep_at % len(todo)
            todo = (todo[start:] + todo[:start])[:SWEEP_BATCH]
            self.sweep_at = start + SWEEP_BATCH
        changed = 0
        for dep in todo:
            seg = self._segment(dep)
            if seg is None:
                continue
            w = seg.load_state(dep.slot)
            if is_deferred(w) and w != deferred_word():
                if transitions.deadline_of(w, seg.epoch_ms) > now_ms():
                    continue  # held by a live reschedule
                seg.cas_state(dep.slot, w, deferred_word())
            changed += self.settle(self.check(dep))
        return changed

    def before_retire(self, seg: Segment) -> bool:
        """Before ``seg`` retires (every job in it finished): fire the edges of the parents it
        holds, so their outcomes outlive it.  False (retire later) if a dependent may have been
        published since this process last caught up for them."""
        c = self.ring.ctl.deps_count()
        if not c:
            return True
        if c != self.seen:
            return False
        view = self.index.views.get(seg.seq)
        if view is None:
            return True
        for pid, edges in list(self.by_parent.items()):
            live = [(d, i) for d, i in edges if (d.segseq, d.slot) in self.deferred]
            if not live:
                continue
            loc = self.index.find(pid)
            if loc is None or loc[0] != seg.seq:
                continue
            w = seg.load_state(loc[1])
            result = outcome(w)
            if result in (SUCCEEDED, FAILED):
                for dep, i in live:
                    # A dependent cancelled here fails its own dependents at their next check
                    # (a sweep): no catch-up runs inside a retirement (it may be an append's).
                    self.fire(dep, i, pid, result, w)
        for pred, deps in list(self.waiting_on.items()):
            if split_position(pred)[0] == seg.seq:
                for dep in deps:
                    self.check(dep)
        return True

    # -- reading ---------------------------------------------------------------------------------------

    def dependents(self, job_id: str) -> list[str]:
        """Ids of the retained jobs this process read in that name ``job_id`` as a parent, in
        enqueue order."""
        out = []
        for dep, _i in self.by_parent.get(job_id, ()):
            view = self.index.views.get(dep.segseq)
            if view is None:
                continue
            st = state(view.seg.load_state(dep.slot))
            if st in (ST_READY, ST_LEASED, ST_DONE, ST_DEAD):
                out.append((dep.seq, dep.id))
        return [jid for _seq, jid in sorted(set(out))]

    def descendants(self, job_id: str) -> set[str]:
        """Ids of the jobs this process read in that depend on ``job_id``, directly or through
        others (what a replacement of ``job_id`` may not depend on: it would wait for itself)."""
        out: set[str] = set()
        todo = [job_id]
        while todo:
            for dep, _i in self.by_parent.get(todo.pop(), ()):
                if dep.id not in out:
                    out.add(dep.id)
                    todo.append(dep.id)
        return out

    def current(self, loc: tuple[int, int]) -> tuple[int, int]:
        """The job an id names, given its newest record ``loc``: a rerun still waiting for the
        run it replaces (the record it supersedes, or the leased run that one waited for) names
        that run while it is leased, or waiting to be superseded."""
        dep = self.deferred.get(loc)
        if dep is None:
            return loc
        for pred in (dep.supersedes, dep.after):
            if not pred:
                continue
            segseq, slot = split_position(pred)
            view = self.index.views.get(segseq)
            if view is None or view.seg.mm is None:
                continue
            if state(view.seg.load_state(slot)) in (ST_LEASED, ST_READY, ST_DEAD):
                return segseq, slot
        return loc
