"""Durability strategies: what an append waits for before it returns, and how state changes get to disk.

Theory of operation
-------------------
A record is written with ``pwrite`` into its segment's record file, then *published* by the
release-store of its state word into the state file's shared mapping (ringq/engine/ring.py).  From then on
every process sees it and a process crash cannot lose it: the page cache owns the bytes.  The record
bytes on disk are the commit point: recovery makes an intact record READY whatever its state word
says, so only the record file is synced for an append.  Only a kernel crash or a power loss can, until the pages are written back.
A strategy decides when that write-back is forced, and who waits for it:

==============  ===========================================================================
``none``        never forced by ringq (the kernel writes back when it likes). Not durable.
``msync``       each append msyncs (MS_SYNC) the slots it wrote (the record file's read-only
                mapping), then returns.
``fdatasync``   each append fdatasyncs the record files it wrote to, then returns.
``group``       group commit: an append returns as soon as *some* completed sync covers its
                record.  One producer (thread or process) at a time is the sync *leader*
                (``<name>.sync``'s flock); it syncs everything published between the shared
                *synced-up-to* watermark and the current tail, then raises the watermark by CAS
                and wakes the others (a futex generation word).  They usually find their records
                covered and return with no sync of their own.
``interval``    appends return at once; a background flusher thread syncs this process's
                appends every ``flush_interval`` seconds (the loss window).
==============  ===========================================================================

Positions.  The watermark is one u64 word of the control file, a *position*
``(segment seq << 24) | slot`` (slot counts are below 2**24), which orders every slot of the queue.
It only rises, and only after a sync that covered everything below the new value completed, so
"watermark >= my record's end position" is a proof that my record is on disk.  Correctness does
not depend on the leader lock: two leaders syncing at once are merely redundant.

State changes (lease, ack, nack, extend) are CASes on state words.  Under at-least-once a lost
ack only means a redelivery, so they are not synced one by one unless ``sync_acks=True`` (which
syncs acks and nacks; a lost lease or extend only hands the job out again sooner).  A
durable strategy flushes the state tables this process changed at most ``state_flush_interval``
seconds later (the same flusher thread), which bounds the window docs/durability.md describes.

The flusher is a daemon thread, and interpreter shutdown stops daemon threads wherever they
are: one stopped inside a sync would hold the segment set's map lock forever, and a queue that
is only closed at shutdown (never closed by its user) would wait for that lock at its close.  So
an ``atexit`` hook, which runs while threads still run, stops and joins every flusher of the
process first; the close at shutdown then flushes in the main thread alone.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from ringq.backend import as_float

from . import ackjournal, forksafe, native
from ._native import ffi, lib
from .control import CTL_WORDS, CTL_WORDS_WAKE, OFF_SYNC_COUNT, OFF_SYNC_GEN, OFF_SYNCED
from .segment import Segment
from .words import SLOT_BITS, SLOT_MASK, position

if TYPE_CHECKING:  # pragma: no cover
    from .ring import Ring

__all__ = [
    "STRATEGIES",
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_STATE_FLUSH_INTERVAL",
    "Strategy",
    "make",
    "position",
]

STRATEGIES = ("none", "msync", "fdatasync", "group", "interval")
DEFAULT_FLUSH_INTERVAL = 0.05  # seconds: the loss window of durability="interval"
DEFAULT_STATE_FLUSH_INTERVAL = 1.0  # seconds: the loss window of unsynced state changes
LEADER_WAIT = 0.005  # seconds: a follower re-checks at least this often, in case its leader died


class Strategy:
    """Base strategy (``msync``).  One per Ring; all counters are this process's.

    Attributes:
        syncs: syncs this process issued for appends.
        covered: appends that returned on a sync another producer issued (group commit).
        state_syncs: syncs this process issued for state changes (acks, leases, ...).
    """

    name = "msync"
    durable = True  # an append that returned survives power loss
    # The appender starts writing an append's records back as soon as they are written
    # (ringq_append_writeback), for a strategy that syncs them itself before returning.
    early_writeback = False
    # Nothing to wait for between publishing an append and returning: the one-call append wakes
    # consumers itself.
    wake_at_publish = False
    # Nothing at all left once a record is published and consumers woken (no sync, no flusher
    # to tell): an append that woke them itself skips after_append.
    done_at_publish = False

    def __init__(
        self,
        ring: Ring,
        *,
        flush_interval: float,
        sync_acks: bool,
        state_flush_interval: float | None,
    ) -> None:
        self.ring = ring
        self.flush_interval = flush_interval
        self.sync_acks = sync_acks
        self.state_flush_interval = state_flush_interval
        self.syncs = 0
        self.covered = 0
        self.state_syncs = 0
        self._reset()
        forksafe.register(self)
        _LIVE.add(self)

    def drop_inherited_locks(self) -> None:
        """In a forked child (ringq/engine/forksafe.py): drop the parent's descriptors and thread locks now."""
        self._reset()

    def _reset(self) -> None:
        # Called at construction and in a forked child: the child gets fresh locks (never the
        # parent's, which a parent thread may have held at fork) and no flusher thread.
        self._pid = forksafe.pid()
        self._mutex = threading.Lock()
        self._pending: dict[int, list[int]] = {}  # interval: seg seq -> [lo, hi) not yet synced
        # Seg seqs whose state words this process changed since the last state flush (read by
        # the ack path, to skip note_ack for a segment already noted).
        self.dirty_state: set[int] = set()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._acks = _AckBatch()  # per thread: acks noted under sync_acks, not yet synced

    def _forked(self) -> bool:
        if self._pid != forksafe.pid():
            self._reset()
            return True
        return False

    # -- the sync primitive ---------------------------------------------------------------------

    def sync_fd(self, seg: Segment) -> int:
        """The descriptor ``ringq_append_sync`` fdatasyncs for ``seg``, or -1: msync(MS_SYNC) of
        the slots' range of the read-only record mapping instead."""
        return -1

    def sync_slots(self, seg: Segment, lo: int, hi: int) -> None:
        """Force the record bytes of slots ``[lo, hi)`` of ``seg`` to disk (:meth:`sync_fd`).
        The state file is not synced: recovery rebuilds what a lost state word leaves out (an
        intact record is READY again)."""
        native.check(
            lib.ringq_append_sync(
                seg.ptr, seg.size, seg.geom, self.sync_fd(seg), lo, hi, ffi.NULL, 0, 0, ffi.NULL
            ),
            f"sync {seg.path}",
        )

    def _sync_touched(self, touched: dict[int, list[int]]) -> None:
        segs = self.ring.segs
        with segs.maplock:
            for seq, (lo, hi) in touched.items():
                seg = segs.get(seq)
                if seg is not None and seg.mm is not None and hi > lo:
                    self.sync_slots(seg, lo, hi)
        self._count_sync()

    def _count_sync(self) -> None:
        self.syncs += 1
        if self.ring.opened:
            self.ring.ctl.add64(OFF_SYNC_COUNT)

    # -- hooks the ring calls -------------------------------------------------------------------

    def after_append(self, touched: dict[int, list[int]], end: int, wake: bool = True) -> None:
        """After the writer lock is released: make the append durable as the strategy promises
        (:meth:`make_durable`), then, if ``wake``, wake sleeping consumers (Control.wake).

        ``touched`` maps segment seq -> [first slot, end slot) written; ``end`` is the position
        just after the last record.  Raises OSError if a sync failed (nobody is woken then).
        """
        self.make_durable(touched, end)
        if wake:
            self.ring.ctl.wake(appended=True)

    def make_durable(self, touched: dict[int, list[int]], end: int) -> None:
        """The strategy's part of :meth:`after_append`: here, sync every range of ``touched``."""
        self._sync_touched(touched)

    def note_state(self, seg: Segment, slot: int, final: bool = False) -> None:
        """A lease or an extend of this process changed a state word of ``seg``: flush it within
        ``state_flush_interval``.  Losing one to a power loss only returns the job to READY sooner,
        which at-least-once allows, so it is never synced on its own."""
        if self.state_flush_interval is None:
            return
        if seg.seq not in self.dirty_state:  # a forked child starts empty (drop_inherited_locks)
            self._forked()
            with self._mutex:
                self.dirty_state.add(seg.seq)
            self._ensure_flusher()

    def note_ack(self, seg: Segment, slot: int, word: int) -> None:
        """An ack or nack of this thread wrote state word ``word`` into ``slot``.  Under
        ``sync_acks`` it is journaled (ringq/engine/ackjournal.py) by :meth:`sync_acks_now`, which the
        caller runs before it returns, after its locks are released: a batch shares one sync."""
        if self.sync_acks:
            pend = self._acks.pending
            item = pend.get(seg.seq)
            if item is None:
                pend[seg.seq] = [seg, [(slot, word)]]
            else:
                item[1].append((slot, word))
        if self.state_flush_interval is not None and seg.seq not in self.dirty_state:
            self.note_state(seg, slot)  # (note_state's own test, spelt out on the ack path)

    def sync_acks_now(self) -> None:
        """Make the acks and nacks this thread noted since its last call durable (``sync_acks``):
        one journal write and one fdatasync per segment."""
        pend = self._acks.pending
        if not pend:
            return
        self._acks.pending = {}
        ring = self.ring
        for seg, entries in pend.values():
            if seg.mm is not None:
                ackjournal.append(seg, entries, ring.lock, ring.mode)
        self.state_syncs += 1

    def counters(self) -> dict[str, int]:
        """This process's counters (see Queue.sync_counters)."""
        return {
            "append_syncs": self.syncs,
            "covered": self.covered,
            "state_syncs": self.state_syncs,
            "pending": len(self._pending) + len(self.dirty_state),
            "flusher": int(self._flusher is not None and self._flusher.is_alive()),
        }

    def synced_position(self) -> int:
        """Group commit's synced-up-to watermark (a position, ringq/engine/words.py); 0 if never raised."""
        return self.ring.ctl.load64(OFF_SYNCED)

    # -- the flusher ----------------------------------------------------------------------------

    def _period(self) -> float:
        return self.state_flush_interval or 1.0

    def _ensure_flusher(self) -> None:
        if self._flusher is not None and self._flusher.is_alive():
            return
        with self._mutex:
            if _exiting or (self._flusher is not None and self._flusher.is_alive()):
                return
            # The thread holds only a weak reference, so an unclosed queue can still be collected.
            t = threading.Thread(
                target=_flusher_main,
                args=(weakref.ref(self), self._stop, self._period()),
                name=f"ringq-flusher-{self.ring.name}",
                daemon=True,
            )
            self._flusher = t
            t.start()

    def flush(self) -> None:
        """Sync everything this process left unsynced: interval appends and changed state tables."""
        if self._forked():
            return  # the parent's pending work is the parent's to flush
        with self._mutex:
            pending, self._pending = self._pending, {}
            dirty, self.dirty_state = self.dirty_state, set()
        if pending:
            self._sync_touched(pending)
        if dirty:
            segs = self.ring.segs
            with segs.maplock:
                for seq in dirty:
                    seg = segs.get(seq)
                    if seg is not None and seg.mm is not None:
                        seg.sync_state()
            self.state_syncs += 1

    def close(self) -> None:
        """Stop the flusher and flush what is pending (called by Ring.close, before unmapping)."""
        self.stop_flusher()
        self.flush()

    def stop_flusher(self, timeout: float = 5.0) -> None:
        """Stop this process's flusher thread and wait up to ``timeout`` seconds for it to end
        (it ends after the sync it may be in)."""
        self._stop.set()
        t = self._flusher
        if t is not None and t is not threading.current_thread() and self._pid == forksafe.pid():
            t.join(timeout=timeout)


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every Strategy of this process (for the exit hook)
_exiting = False  # set by the exit hook: no flusher starts after it


@atexit.register
def _stop_flushers_at_exit() -> None:
    # atexit hooks run before the interpreter freezes daemon threads (Py_FinalizeEx), so the
    # flushers can still be joined here and none is left holding a lock.
    global _exiting
    _exiting = True
    # A sync under heavy I/O can take seconds: wait for it (a bounded wait, not forever).
    for strategy in list(_LIVE):
        try:
            strategy.stop_flusher(timeout=60.0)  # joins only this process's own thread
            if strategy.ring.opened:
                strategy.flush()  # a forked child's copy flushes nothing (the parent's work)
        except Exception:  # noqa: BLE001 -- an exit hook must not raise; a closed mapping has nothing pending
            pass


class _AckBatch(threading.local):
    def __init__(self) -> None:
        self.pending: dict[int, list[Any]] = {}  # seg seq -> [segment, [(slot, word), ...]]


def _flusher_main(
    ref: weakref.ReferenceType[Strategy], stop: threading.Event, period: float
) -> None:
    while not stop.wait(period):
        strategy = ref()
        if strategy is None or not strategy.ring.opened:
            return
        try:
            strategy.flush()
        except Exception:  # noqa: BLE001 - a closed mapping mid-flush: the closer flushes itself
            pass
        del strategy


class NoSync(Strategy):
    """``none``: published to the shared mapping only.  Survives process crashes, not power loss."""

    name = "none"
    durable = False
    wake_at_publish = True
    done_at_publish = True

    def make_durable(self, touched: dict[int, list[int]], end: int) -> None:
        pass


class MSync(Strategy):
    """``msync``: msync(MS_SYNC) of the slots written, through the record file's read-only
    mapping, before the append returns."""

    early_writeback = True

    def after_append(self, touched: dict[int, list[int]], end: int, wake: bool = True) -> None:
        # An append to one segment (nearly every one): its sync, the sync count and the wake-up
        # in one C call, so that little is left to run once the disk answers.
        ring = self.ring
        if len(touched) == 1 and ring.opened:
            ((seq, (lo, hi)),) = touched.items()
            segs = ring.segs
            with segs.maplock:
                seg = segs.get(seq)
                if seg is not None and seg.mm is not None:
                    ctl = ring.ctl
                    rc = lib.ringq_append_sync(
                        seg.ptr,
                        seg.size,
                        seg.geom,
                        self.sync_fd(seg),
                        lo,
                        hi,
                        ctl.ptr,
                        ctl.size,
                        OFF_SYNC_COUNT,
                        CTL_WORDS_WAKE if wake else CTL_WORDS,
                    )
                    if rc:
                        native.check(rc, f"sync {seg.path}")
                    self.syncs += 1
                    return
        super().after_append(touched, end, wake)


class FDataSync(MSync):
    """``fdatasync``: fdatasync(2) of each segment file written to before the append returns."""

    name = "fdatasync"

    def sync_fd(self, seg: Segment) -> int:
        return seg.rfd


class Group(Strategy):
    """``group``: group commit over the shared synced-up-to watermark (see the module docstring)."""

    name = "group"

    linger = 50e-6  # seconds a contended leader waits before reading the tail
    _leader_fd: int  # this process's descriptor of the group lock file (-1: none yet)

    def _reset(self) -> None:
        super()._reset()
        # In a forked child the parent's descriptor is forgotten (forksafe closed it: the parent's
        # flock would outlive the parent, as the lock belongs to the open file description).
        self._leader_fd = -1
        self._busy = False  # the last append saw other producers (waited, or was covered)
        # Held by the thread of this process that leads (or tries to).  Not _mutex: a thread that
        # holds that one briefly for the flusher's lists must not look like a leader to others,
        # who would then wait for a sync nobody is doing.
        self._leading = threading.Lock()

    def _lead(self) -> int:
        if self._leader_fd < 0:
            path = os.path.join(self.ring.dir, f"{self.ring.name}.sync")
            self._leader_fd = forksafe.opened(
                lambda: os.open(
                    path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, self.ring.mode
                )
            )
        return self._leader_fd

    def make_durable(self, touched: dict[int, list[int]], end: int) -> None:
        ctl = self.ring.ctl
        self._forked()  # a child must not use the parent's leader fd (flock belongs to the description)
        waited = False
        while True:
            if ctl.load64(OFF_SYNCED) >= end:
                self.covered += 1
                self._busy = True
                return
            gen = ctl.load32(OFF_SYNC_GEN)
            if self._try_lead(end, self._busy or waited):
                self._busy = waited
                return
            waited = True
            # Another producer is leading.  Sleep until it finishes (it bumps the generation), then
            # look again: its sync has likely covered us.  Bounded, in case the leader was killed
            # (the kernel then released its flock and somebody must take over).
            ctl.futex_wait(OFF_SYNC_GEN, gen, LEADER_WAIT)

    def _try_lead(self, end: int, contended: bool) -> bool:
        """Become the leader if nobody is: sync up to the tail, raise the watermark.  False if busy.

        ``contended``: other producers were seen recently (this one waited for a leader, now or
        in its last append, or was covered by one).  Those the previous sync released are
        appending again right now; a leader that reads the tail at once leaves them to a sync of
        their own, and syncs alternate between covering many records and covering one.
        Lingering for about one append lets the next sync cover them too.
        """
        if not self._leading.acquire(blocking=False):  # another thread of ours leads
            return False
        try:
            fd = self._lead()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            ctl = self.ring.ctl
            try:
                if contended and self.linger:
                    time.sleep(self.linger)
                w = ctl.load64(OFF_SYNCED)
                if w >= end:
                    self.covered += 1
                    return True
                q = max(self._tail_position(), end)
                self._sync_between(w, q)
                self._count_sync()
                while w < q:
                    ok, w = ctl.cas64(OFF_SYNCED, w, q)
                    if ok:
                        break
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            # After the unlock, so that a woken producer that is not covered can lead at once.
            ctl.add32(OFF_SYNC_GEN)
            ctl.futex_wake(OFF_SYNC_GEN)
            return True
        finally:
            self._leading.release()

    def _segment(self, seq: int) -> tuple[Segment | None, bool]:
        """``(segment, opened here)``: mapped by this process, or opened just for this sync."""
        seg = self.ring.segs.get(seq)
        if seg is not None:
            return seg, False
        try:
            return Segment(self.ring.segs.path(seq)), True
        except Exception:  # noqa: BLE001 - retired or quarantined meanwhile: nothing to sync there
            return None, False

    def _tail_position(self) -> int:
        seq = self.ring.ctl.tail_seq()
        seg, opened = self._segment(seq)
        if seg is None:
            return 0
        try:
            return position(seq, seg.bounded_tail())
        finally:
            if opened:
                seg.close()

    def _sync_between(self, lo_pos: int, hi_pos: int) -> None:
        segs = self.ring.segs
        lo_seq, lo_slot = lo_pos >> SLOT_BITS, lo_pos & SLOT_MASK
        hi_seq, hi_slot = hi_pos >> SLOT_BITS, hi_pos & SLOT_MASK
        first = min(segs.seqs(), default=hi_seq)
        with segs.maplock:
            for seq in range(max(lo_seq, first), hi_seq + 1):
                seg, opened = self._segment(seq)
                if seg is None or seg.mm is None:
                    continue
                try:
                    lo = lo_slot if seq == lo_seq else 0
                    if seq == hi_seq:
                        hi = hi_slot
                    else:  # a sealed segment: its final tail, stored before the seal
                        seg.sealed()
                        hi = seg.bounded_tail()
                    if hi > lo:
                        self.sync_slots(seg, lo, hi)
                finally:
                    if opened:
                        seg.close()

    def close(self) -> None:
        super().close()
        fd, self._leader_fd = self._leader_fd, -1
        if fd >= 0 and self._pid == forksafe.pid():
            forksafe.close(fd)


class Interval(Strategy):
    """``interval``: appends return at once; the flusher syncs them every ``flush_interval`` s."""

    name = "interval"
    durable = False  # an append that returned may be lost in the last flush_interval seconds
    wake_at_publish = True

    def _period(self) -> float:
        if self.state_flush_interval:
            return min(self.flush_interval, self.state_flush_interval)
        return self.flush_interval

    def make_durable(self, touched: dict[int, list[int]], end: int) -> None:
        self._forked()
        with self._mutex:
            pend = self._pending
            for seq, (lo, hi) in touched.items():
                cur = pend.get(seq)
                if cur is None:
                    pend[seq] = [lo, hi]
                else:
                    cur[0] = min(cur[0], lo)
                    cur[1] = max(cur[1], hi)
        self._ensure_flusher()


_BY_NAME = {
    "none": NoSync,
    "msync": MSync,
    "fdatasync": FDataSync,
    "group": Group,
    "interval": Interval,
}


MAX_INTERVAL = 1e6  # seconds: the longest flush interval (about 12 days; None turns one off)


def _interval(x: object) -> float | None:
    """A flush interval as a float (backend.as_float), or None unless it is above 0 and at most
    MAX_INTERVAL: the flusher thread sleeps that long."""
    v = as_float(x)
    return v if 0 < v <= MAX_INTERVAL else None


def make(
    ring: Ring,
    name: str,
    *,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    sync_acks: bool = False,
    state_flush_interval: float | None | object = ...,
) -> Strategy:
    """The strategy object for ``name`` (one of :data:`STRATEGIES`).

    ``state_flush_interval`` defaults to DEFAULT_STATE_FLUSH_INTERVAL for every strategy but
    ``none`` (which never syncs state changes unless ``sync_acks``); None turns the flush off.
    Raises ValueError for an unknown name or a non-positive interval.
    """
    if name not in _BY_NAME:
        raise ValueError(f"durability must be one of {STRATEGIES}, got {name!r}")
    flush = _interval(flush_interval)
    if flush is None:
        raise ValueError(
            f"flush_interval must be a number of seconds above 0 and at most {MAX_INTERVAL:.0f}, "
            f"got {flush_interval!r}"
        )
    if state_flush_interval is ...:
        state_flush_interval = None if name == "none" else DEFAULT_STATE_FLUSH_INTERVAL
    if state_flush_interval is not None:
        state = _interval(state_flush_interval)
        if state is None:
            raise ValueError(
                f"state_flush_interval must be a number of seconds above 0 and at most "
                f"{MAX_INTERVAL:.0f}, or None, got {state_flush_interval!r}"
            )
        state_flush_interval = state
    return _BY_NAME[name](
        ring,
        flush_interval=flush,
        sync_acks=bool(sync_acks),
        state_flush_interval=state_flush_interval,
    )
