"""Cross-process limits: concurrency caps, rate limits and unique windows, in shared memory.

Theory of operation
-------------------
A job may carry a *key* (``enqueue(..., key="tenant-7")``; stored in the record, see
``ringq/codec.py``).  A *limit* is named after a key, or after the queue itself (its *kind*: a
limit named like the queue applies to every job of it).  Limits live in ``<name>.limits``, a
fixed-layout file every process maps (docs/limits.md has the layout):

* **Concurrency cap** ``c``: the cap of limit *i* is ``c`` one-byte ranges of the limits file,
  starting at ``LOCK_BASE + i * MAX_CONCURRENCY`` (far past its end: a lock needs no bytes).  A
  lease of a keyed job first takes an exclusive OFD lock (``F_OFD_SETLK``, as the owner locks of
  ringq/engine/owner.py) on one free byte of its key's range; no free byte means the key is at its cap
  and the job stays READY.  The byte is unlocked at ack or nack; the kernel drops it when the
  holder dies, however it dies, so a SIGKILLed holder's slot is free at once.
* **Rate limit** ``n`` per ``per`` seconds: a token bucket kept in one 64-bit word, changed only
  by compare-and-swap, so it is exact across processes.  The word holds the bucket in its
  virtual-scheduling form (the generic cell rate algorithm of ITU-T I.371): the time, in ns since
  the Unix epoch, at which the bucket would be full again.  A token is due when that time is at
  most ``(burst - 1) * per / n`` ahead of now; taking one moves it ``per / n`` further.  A lease
  that finds no token leaves the job READY and sleeps until the next token is due.
* **Unique window**: ``enqueue(..., key=k, unique_for=s)`` records ``(hash of k, expiry, job id)``
  in a table of the same file, under an ``flock`` of it; an enqueue of ``k`` while an entry is
  live returns the job that opened the window instead of adding one.

Settings are written under the ``flock`` and published with a sequence lock (a generation word that
is odd while a writer changes entries); readers copy the table when the generation moves.  A writer
killed mid-change leaves the generation odd: the next reader that can take the ``flock`` re-checks
every entry's CRC, drops torn ones and makes the generation even again.

The parts: ringq/engine/limits_file.py owns the file (layout, validation, repair, the sequence lock, the
bucket words and cap-slot locks); ringq/engine/unique.py the unique windows; this module the gate a lease
passes (:class:`LimitGate`: admit, bind, undo, release, reoffer, nap) and the Queue's limits API.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ringq import errors
from ringq.engine import forksafe, lifecycle, unique
from ringq.engine.kept import Kept
from ringq.engine.limits_file import (
    MAX_CONCURRENCY,
    MAX_LIMITS,
    MAX_UNIQUE,
    Limit,
    LimitsFile,
    free_slot_on,
)
from ringq.engine.segment import Segment
from ringq.engine.unique import MAX_UNIQUE_FOR
from ringq.engine.words import ST_LEASED, lease_count, state
from ringq.job import Job

if TYPE_CHECKING:  # pragma: no cover
    from ringq.engine.mapped import Mapped

    from .context import QueueContext


__all__ = [
    "LimitGate",
    "LimitInfo",
    "Limits",
    "MAX_LIMITS",
    "MAX_CONCURRENCY",
    "MAX_UNIQUE",
    "MAX_UNIQUE_FOR",
]

CAP_RECHECK = 0.25  # seconds a lease blocked only by caps sleeps before trying again
REOFFER = 8  # blocked jobs per limit offered again per lease attempt


@dataclass(frozen=True)
class LimitInfo:
    """One limit as configured, plus its live use.

    Attributes:
        name: the key (or the queue's name: the limit of the whole queue) it applies to.
        concurrency: most leases of jobs with this key held at once, or None.
        rate: ``(count, per seconds)``, or None.
        burst: tokens the bucket holds when full: how many jobs may start at once after an idle
            spell (default: the tokens of 50 ms, at least 2); None without a rate.
        running: leases holding a cap slot now (0 without a cap).
        next_token_in: seconds until the next token is due (0 if one is available; None without a rate).
    """

    name: str
    concurrency: int | None
    rate: tuple[int, float] | None
    burst: int | None
    running: int
    next_token_in: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "rate": None if self.rate is None else list(self.rate),
            "burst": self.burst,
            "running": self.running,
            "next_token_in": self.next_token_in,
        }


@dataclass(slots=True)
class _Ticket:
    """What one admitted lease holds: cap slots ``(limit index, byte)`` and tokens ``(limit index, interval)``."""

    slots: list[tuple[int, int]] = field(default_factory=list)
    tokens: list[tuple[int, int]] = field(default_factory=list)


# Cap slots that closed gates of this process kept for leases still held: job loc -> (ticket,
# lease count), by descriptor of the limits file.
CAPS_KEPT: Kept[dict[tuple[int, int], tuple[_Ticket, int]]] = Kept()


class LimitGate:
    """One queue's limits as one process sees them; the Queue calls it around each lease.

    Not for direct use: :meth:`ringq.Queue.limit`, :meth:`ringq.Queue.limits` and ``enqueue``'s
    ``key`` and ``unique_for`` arguments are the public interface.  Callers serialise calls (the
    Queue holds its lock).
    """

    def __init__(self, directory: str | os.PathLike[str], name: str, mode: int = 0o600) -> None:
        self.path = os.path.join(directory, f"{name}.limits")
        self.kind = name
        self.file = LimitsFile(self.path, mode)  # its mapping is read by the quiet look
        self._keys: dict[tuple[int, int], str | None] = {}
        # Cap slots this process holds: job loc -> ticket, segment, lease count.  Read (never
        # changed) by the ack path, to which an empty dict says there is no slot to free.
        self.held: dict[tuple[int, int], tuple[_Ticket, Segment, int]] = {}
        self._mine: dict[tuple[int, int], tuple[int, int]] = {}  # (limit index, byte) -> job loc
        self._blocked: dict[str, list[tuple[int, ...]]] = {}
        self._blocked_set: set[tuple[int, int]] = set()
        self._due: dict[str, int] = {}  # limit name -> ns when its next token is due
        self._due_under: object = None  # the limits (LimitsFile.config) _due was noted under
        # This queue's segment of a seq (set when its reader opens: adopt), for kept slots.
        self._segment: Callable[[int], Segment | None] | None = None
        self._mutex = threading.RLock()
        forksafe.register(self)

    def drop_inherited_locks(self) -> None:
        """In a forked child: close the copy of the parent's lock descriptor (its cap slots are
        the parent's) and forget what the parent held."""
        self.file.drop_inherited_lock()
        self.held.clear()
        self._mine.clear()
        self._mutex = threading.RLock()  # a parent thread may have held it at the fork

    def close(self) -> None:
        """Close.  The cap slots of leases still held stay taken: they belong to the process,
        which may ack those leases through another queue object (ringq/engine/kept.py)."""
        with self._mutex:
            live: dict[tuple[int, int], tuple[_Ticket, int]] = {}
            for loc, (ticket, seg, lc) in list(self.held.items()):
                if _still_leased(seg, loc[1], lc):
                    live[loc] = (ticket, lc)
                else:
                    self.release(loc)
            if live:
                with forksafe.moving():  # the descriptor is recorded in one place at any fork
                    fd = self.file.give_lock_fd()
                    if fd >= 0:
                        CAPS_KEPT.keep(fd, live)
                self.held.clear()
                self._mine.clear()
            self.file.close()

    def adopt(self, segment: Callable[[int], Segment | None]) -> None:
        """Take over the cap slots a closed gate of this process kept for its leases on this
        limits file (``segment``: this queue's segment of a seq, None if it is gone); the queue
        calls it when its reader opens, before any lease.  Slots of a job whose segment is gone
        (it finished) are freed."""
        self._segment = segment  # also for the sweep of kept slots (_sweep)
        if not CAPS_KEPT.by_file or not os.path.exists(self.path):
            return
        with self._mutex:
            own = self.file.lock_fd()
            with forksafe.moving():  # the kept descriptor is always recorded somewhere at a fork
                got = CAPS_KEPT.take(own)
                if got is None:
                    return
                fd, live = got
                self.file.take_lock_fd(fd)
            for loc, (ticket, lc) in live.items():
                seg = segment(loc[0])
                if seg is None:
                    for index, j in ticket.slots:
                        self.file.free_slot(index, j)
                    continue
                self.held[loc] = (ticket, seg, lc)
                for s in ticket.slots:
                    self._mine[s] = loc

    # -- configuration ---------------------------------------------------------------------------

    def set_limit(
        self,
        name: str,
        concurrency: int | None,
        rate: tuple[float, float] | None,
        burst: int | None,
    ) -> None:
        """Create, change or (with neither ``concurrency`` nor ``rate``) remove the limit ``name``
        (:meth:`ringq.engine.limits_file.LimitsFile.set_limit`)."""
        with self._mutex:
            self.file.set_limit(name, concurrency, rate, burst)

    def describe(self) -> list[LimitInfo]:
        """Every limit with its live use, ordered by name."""
        with self._mutex:
            cfg = self.file.config()
            m = self.file.map
            out = []
            for name in sorted(cfg):
                lim = cfg[name]
                running = self._running(lim) if lim.concurrency else 0
                nxt = None
                if lim.rate_n and m is not None:
                    tau = (lim.burst - 1) * lim.interval_ns
                    tat, now = self.file.bucket(lim)
                    nxt = max(0.0, (tat - tau - now) / 1e9)
                out.append(
                    LimitInfo(
                        name,
                        lim.concurrency or None,
                        (lim.rate_n, lim.per) if lim.rate_n else None,
                        lim.burst if lim.rate_n else None,
                        running,
                        nxt,
                    )
                )
            return out

    def _running(self, lim: Limit) -> int:
        n = 0
        for j in range(lim.concurrency):
            if (lim.index, j) in self._mine:
                n += 1
            else:
                n += self.file.slot_taken(lim.index, j)
        return n

    # -- the lease path ------------------------------------------------------------------------------

    def active(self) -> bool:
        """True if any limit is configured (cheap: one atomic load once the file is mapped)."""
        return bool(self.file.config())

    def holding(self) -> bool:
        """True while a job a limit held back waits here to be offered again (:meth:`reoffer`)."""
        return bool(self._blocked)

    def watched(self) -> tuple[Mapped, int, int] | None:
        """The word that moves whenever a limit is set or removed (LimitsFile.watched), or None
        while there is no limits file; :meth:`next_look` says when one is looked for."""
        return self.file.watched()

    def next_look(self) -> float:
        """The monotonic time of the next look for a limits file (``inf`` once it is mapped)."""
        return self.file.next_look()

    def key_of(self, seg: Segment, slot: int) -> str | None:
        """The key of the published record at ``slot`` (read from its bytes; None if unkeyed)."""
        loc = (seg.seq, slot)
        if loc in self._keys:
            return self._keys[loc]
        key = lifecycle.key_of(seg, slot)
        if len(self._keys) > 1 << 16:
            self._keys.clear()
        self._keys[loc] = key
        return key

    def admit(
        self, seg: Segment, slot: int, entry: Callable[[], tuple[int, ...]]
    ) -> _Ticket | Literal[False] | None:
        """Decide whether the READY job at ``slot`` may be leased now.

        Returns None when no limit applies, a ticket (pass it to :meth:`bind` or :meth:`undo`)
        when admitted, and False when a limit refuses: the job is then remembered (``entry()`` is
        its entry, Index.waiting_entry: a limit's held-back jobs are offered again by
        :meth:`reoffer` best first, by priority, then available-at, then enqueue order).
        """
        cfg = self.file.config()
        if not cfg:
            return None
        key = self.key_of(seg, slot)
        names = [n for n in dict.fromkeys((key, self.kind)) if n is not None and n in cfg]
        if not names:
            return None
        with self._mutex:
            ticket = _Ticket()
            for name in names:
                lim = cfg[name]
                if lim.concurrency:
                    j = self._take_slot(lim)
                    if j is None:
                        self.undo(ticket)
                        return self._block(name, seg, slot, entry)
                    ticket.slots.append((lim.index, j))
                if lim.rate_n:
                    due = self.file.take_token(lim)
                    if due:
                        self._due[name] = due
                        self.undo(ticket)
                        return self._block(name, seg, slot, entry)
                    ticket.tokens.append((lim.index, lim.interval_ns))
            return ticket

    def _block(
        self, name: str, seg: Segment, slot: int, entry: Callable[[], tuple[int, ...]]
    ) -> Literal[False]:
        loc = (seg.seq, slot)
        if loc not in self._blocked_set:
            self._blocked_set.add(loc)
            heapq.heappush(self._blocked.setdefault(name, []), entry())
        return False

    def _take_slot(self, lim: Limit) -> int | None:
        for attempt in range(2):
            for j in range(lim.concurrency):
                if (lim.index, j) not in self._mine and self.file.try_slot(lim.index, j):
                    return j
            if attempt == 0 and not self._sweep(lim.index):
                break
        return None

    def _sweep(self, index: int) -> bool:
        """Release this process's slots of limit ``index`` whose leases ended without ack or nack
        here (expired and handed out again, acked by id elsewhere).  True if any was released."""
        freed = self._sweep_kept()
        for (idx, _j), loc in list(self._mine.items()):
            if idx != index or loc not in self.held:
                continue
            seg = self.held[loc][1]
            try:
                w = seg.load64(seg.state_off_of(loc[1]))
            except errors.RingqError:
                w = 0  # the segment retired: the job finished
            freed |= self.release(loc, w)  # only if the lease the slots were taken for ended
        return freed

    def undo(self, ticket: _Ticket | None) -> None:
        """Give back what an admitted lease took (its CAS lost, or the record failed to read)."""
        if not ticket:
            return
        with self._mutex:
            for index, j in ticket.slots:
                self._unlock(index, j)
            for index, interval in ticket.tokens:
                self.file.refund(index, interval)
            ticket.slots.clear()
            ticket.tokens.clear()

    def _unlock(self, index: int, j: int) -> None:
        self._mine.pop((index, j), None)
        self.file.free_slot(index, j)

    def bind(self, ticket: _Ticket | None, seg: Segment, slot: int, lc: int) -> None:
        """Record that ``ticket``'s lease (token ``lc``) succeeded: its slots go with the job."""
        if not ticket or not ticket.slots:
            return
        with self._mutex:
            loc = (seg.seq, slot)
            if loc in self.held:
                self.release(loc)
            self.held[loc] = (ticket, seg, lc)
            for s in ticket.slots:
                self._mine[s] = loc

    def release(self, loc: tuple[int, int], word: int | None = None) -> bool:
        """Free the cap slots held for the job at ``loc`` once the lease they were taken for
        ended: at once (``word`` None: the caller just ended it, by an ack or a nack), or if the
        job's state word ``word`` shows that lease is not live any more (finished, or leased again
        with another token).  True if any were freed.  A refused ack or nack of a stale token
        passes ``word``, so that it never frees the slots of the job's current lease."""
        if not self.held:  # nothing held in this object (no caps): no lock needed to say so
            return word is None and self.release_kept(loc)
        with self._mutex:
            held = self.held.get(loc)
            if held is None:
                return word is None and self.release_kept(loc)
            if word is not None and state(word) == ST_LEASED and lease_count(word) == held[2]:
                return False  # the lease the slots were taken for is still held
            del self.held[loc]
            for index, j in held[0].slots:
                self._unlock(index, j)
            return True

    def _sweep_kept(self) -> bool:
        """Free the cap slots closed gates of this process kept for leases that have ended since
        without an ack or nack here (expired and reclaimed, purged, cancelled): as :meth:`_sweep`
        does for this gate's own.  True if any was freed."""
        segment = self._segment
        if not CAPS_KEPT.by_file or segment is None:
            return False
        freed = False

        def settle(fd: int, live: dict[tuple[int, int], tuple[_Ticket, int]]) -> None:
            nonlocal freed
            for loc, (ticket, lc) in list(live.items()):
                if not _still_leased(segment(loc[0]), loc[1], lc):
                    del live[loc]
                    _free_on(fd, ticket)
                    freed = True

        CAPS_KEPT.settle(self.path, settle, _nothing_kept)
        return freed

    def release_all_kept(self) -> None:
        """Free every cap slot closed gates of this process kept (a purge ended every lease)."""

        def settle(fd: int, live: dict[tuple[int, int], tuple[_Ticket, int]]) -> None:
            for ticket, _lc in live.values():
                _free_on(fd, ticket)
            live.clear()

        CAPS_KEPT.settle(self.path, settle, _nothing_kept)

    def release_kept(self, loc: tuple[int, int]) -> bool:
        """Free the cap slots that a closed gate of this process kept for the lease of the job at
        ``loc``, which has ended (CAPS_KEPT).  True if any were."""
        return CAPS_KEPT.ended(self.path, loc, _free_kept, _nothing_kept)

    def reoffer(self) -> list[tuple[int, ...]]:
        """Heap entries of blocked jobs worth another try now: the best few per limit, and every
        job of a limit that is gone.  Once the limits changed (set, raised or removed, by any
        process) no token time noted under the old ones holds a job back."""
        if not self._blocked:
            return []
        out: list[tuple[int, ...]] = []
        now = time.time_ns()
        cfg = self.file.config()
        with self._mutex:
            if cfg is not self._due_under:
                self._due_under = cfg
                self._due.clear()
            for name in list(self._blocked):
                if self._due.get(name, 0) > now:
                    continue
                heap = self._blocked[name]
                for _ in range(min(REOFFER, len(heap)) if name in cfg else len(heap)):
                    e = heapq.heappop(heap)
                    self._blocked_set.discard((e[4], e[6]))
                    out.append(e)
                if not heap:
                    del self._blocked[name]
                    self._due.pop(name, None)
        return out

    def blocked(self, segseq: int, slot: int) -> bool:
        """True if the job at ``(segseq, slot)`` waits for a limit in this process."""
        return (segseq, slot) in self._blocked_set

    def nap(self) -> float | None:
        """Seconds a lease waiting for work should sleep at most because of blocked jobs: until the
        next token of a rate that blocks one, or :data:`CAP_RECHECK` for caps (a slot freed by an
        ack wakes sleepers at once; one freed by a holder's death is seen at the next recheck)."""
        if not self._blocked:
            return None
        now = time.time_ns()
        best = None
        for name in self._blocked:
            due = self._due.get(name)
            t = CAP_RECHECK if due is None else max(0.0, (due - now) / 1e9) + 0.0005
            best = t if best is None else min(best, t)
        return best

    # -- unique windows ----------------------------------------------------------------------------

    def enqueue_unique(
        self, key: str, unique_for: float, enqueue: Callable[[], Job], find: Callable[[str], Job]
    ) -> Job:
        """Run ``enqueue()`` unless a unique window for ``key`` is open; then return ``find(id)``
        of the job that opened it (ringq/engine/unique.py).  Raises DuplicateJobError if that job is no
        longer retained, LimitError if ``unique_for`` is not a positive number of seconds or the
        table is full."""
        with self._mutex:
            job: Job = unique.enqueue_unique(
                self.file, key, unique_for, enqueue, find
            )  # either one's
            return job


class Limits:
    """Concurrency caps and rate limits of one local queue (the API is :class:`ringq.Queue`'s)."""

    def __init__(self, ctx: QueueContext) -> None:
        self.ctx = ctx

    def limit(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
        burst: int | None = None,
    ) -> None:
        """As :meth:`ringq.Queue.limit`."""
        with self.ctx.live_lock:
            self.ctx.gate.set_limit(name, concurrency, rate, burst)
            self.ctx.ring.ctl.wake()  # a raised or removed limit may free held-back jobs

    def limits(self) -> list[LimitInfo]:
        """As :meth:`ringq.Queue.limits`."""
        with self.ctx.live_lock:
            return self.ctx.gate.describe()


def _free_kept(
    fd: int, live: dict[tuple[int, int], tuple[_Ticket, int]], loc: tuple[int, int]
) -> bool:
    got = live.pop(loc, None)
    if got is None:
        return False
    _free_on(fd, got[0])
    return True


def _free_on(fd: int, ticket: _Ticket) -> None:
    """Unlock ``ticket``'s cap slots, held through the kept descriptor ``fd``."""
    for index, j in ticket.slots:
        free_slot_on(fd, index, j)


def _still_leased(seg: Segment | None, slot: int, lc: int) -> bool:
    """True if ``slot`` of ``seg`` still holds the lease of count ``lc`` (None, or a retired
    segment: the job finished)."""
    try:
        w = 0 if seg is None else seg.load64(seg.state_off_of(slot))
    except errors.RingqError:
        return False
    return state(w) == ST_LEASED and lease_count(w) == lc


def _nothing_kept(live: dict[tuple[int, int], tuple[_Ticket, int]]) -> bool:
    return not live
