"""What the parts of one local queue share: its engine objects, its lock, and the catch-up and
reclaim steps that come before a read or a change.

A :class:`ringq.Queue` owns one :class:`QueueContext` and hands it to each of its parts (the
admin reads and whole-queue operations, the lifecycle calls, the limits), which name what they
use from it.  Every attribute is meant for those parts; none is another object's private state.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from ringq.engine.lifecycle import PauseFile
from ringq.engine.lock import LiveLock
from ringq.engine.owner import OwnerRegistry
from ringq.engine.ring import Ring
from ringq.errors import QueueClosedError
from ringq.job import Job

from .limits import LimitGate
from .producer import Producer
from .quiet import QuietLook

if TYPE_CHECKING:  # pragma: no cover
    from ringq.engine.deps import Deps
    from ringq.engine.index import Index
    from ringq.engine.reaper import Reaper
    from ringq.engine.relocate import Relocator

    from .leases import Leases

__all__ = ["QueueContext"]


class Outside:
    """Around a use of the mappings outside the queue lock (a sleep on the futex, a sync after
    an append): counted, so that a close wakes such users and waits for them to leave before it
    unmaps.  Raises QueueClosedError on entry if the queue is closed."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: QueueContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        """Count a user in (QueueClosedError if the queue is closed)."""
        ctx = self.ctx
        with ctx.live_lock:
            ctx.users += 1

    def __exit__(self, *exc: object) -> None:
        self.leave()

    def enter_held(self) -> None:
        """Count a user in from under the queue lock, which the caller holds while the queue is
        live (it has just appended): a close that comes before the caller's use of the mappings
        outside the lock waits for it (its :meth:`leave`), rather than refusing a use whose
        records are already written.  Makes no call after the count: an exception (a signal's
        handler) raised in it comes before the count, so a caller that notes the count right
        after the return never leaves a user counted that it does not know of."""
        self.ctx.users += 1

    def leave(self) -> None:
        with self.ctx.lock:
            self.leave_held()

    def leave_held(self) -> None:
        """:meth:`leave` for a caller that holds the queue lock.  A close waiting for this user
        goes on only once the caller releases the lock, so the mappings stay until then."""
        ctx = self.ctx
        if ctx.users == 1 and ctx.closed:  # only a close waits for it (closed is set first)
            ctx.idle.notify_all()  # it wakes once the caller releases the lock
        # Last, and with no call after it: an exception (a signal's handler) raised in this
        # method leaves the user counted, and the caller's clean-up counts it out once.
        ctx.users -= 1


def reader_types() -> tuple[type[Deps], type[Index], type[Reaper], type[Relocator], type[Leases]]:
    """The classes a reader is built of, imported on first use (they bring numpy): a queue used
    only to enqueue never loads them.  numpy.ma too, which numpy imports on the first
    ``np.unique`` (the reaper's scan, a catch-up of keyed jobs): here, before the queue lock is
    taken, rather than inside a later call that holds it."""
    import numpy.ma  # noqa: F401

    from ringq.engine.deps import Deps
    from ringq.engine.index import Index
    from ringq.engine.reaper import Reaper
    from ringq.engine.relocate import Relocator

    from .leases import Leases

    return Deps, Index, Reaper, Relocator, Leases


class QueueContext:
    """The engine objects of queue ``name`` in directory ``path`` for this process, and the
    queue's lock (a ``threading.RLock`` every part takes around its use of them).

    Attributes:
        ring, index, reaper, relocator, owners, gate, leases, producer, pause, deps: the
            engine's segments, the reader's index, lease reclaiming, straggler relocation, lease
            owners, the limits gate, claim/ack, enqueue, the pause file and the dependents this
            process knows (ringq/engine/deps.py).
        closed: True once the queue is closed (:meth:`live` then raises).

    The reader's side -- ``index``, ``reaper``, ``relocator``, ``leases``, ``deps`` -- is built on first
    use, with the catch-up and the reaper pass that every reader starts with (:meth:`open_reader`):
    a queue used only to enqueue never reads the segments in, nor loads numpy.
    """

    def __init__(self, ring: Ring, name: str, path: str, mode: int, auto_ids: bool) -> None:
        self.ring = ring
        self.name = name
        self.path = path
        self.lock = threading.RLock()
        # The lock, while the queue is open: ``with ctx.live_lock:`` raises QueueClosedError
        # (and holds nothing) once close ran, so a call that waited for the lock behind a close
        # never touches the unmapped files.  Its entry and exit run no bytecode, so a signal
        # handler's exception never leaves the lock held (csrc/ext/guard.c).
        self.live_lock = LiveLock(self)
        self.outside = Outside(self)  # a use of the mappings outside the lock (see Outside)
        self.users = 0  # threads inside ``outside``
        self.idle = threading.Condition(self.lock)  # notified when the last of them left
        self.closed = False
        self.owners = OwnerRegistry(os.path.join(path, f"{name}.owners"), mode)
        self.gate = LimitGate(path, name, mode)  # concurrency caps, rate limits, unique windows
        self.producer = Producer(
            ring, lambda: self.index, self.live_lock, self.outside, self.refresh, auto_ids
        )
        self.pause = PauseFile(ring)
        # Until open_reader runs, the class that builds the reader on first use of a part.
        self.__class__ = _ReaderUnbuilt

    # -- the reader's side, built on first use ----------------------------------------------------

    # Set by open_reader as plain attributes.
    index: Index
    reaper: Reaper
    relocator: Relocator
    leases: Leases
    deps: Deps
    quiet: QuietLook  # when a lease may skip its first look (ringq/local/quiet.py)

    def open_reader(self) -> tuple[Index, Reaper, Relocator, Leases, Deps]:
        """Build the reader's index, reaper, relocator, leases and dependents (once; later calls
        return them), then catch up with every segment, reclaim dead holders' and expired leases
        and check the dependents it knows at once, as every reader's first look does (a process
        killed after a parent finished leaves its dependents to this).  Raises QueueClosedError
        on a closed queue."""
        # Imported before the lock is taken: an import cut short by a signal's handler can leave
        # the import system's own lock behind, and it must not be taken under the queue lock.
        Deps, Index, Reaper, Relocator, Leases = reader_types()  # noqa: N806 (classes)
        with self.live_lock:
            parts = self.__dict__.get("_reader")
            if parts is not None:
                return parts
            ring = self.ring
            index = Index(ring)
            deps = Deps(ring, index, lambda: index.catch_up())
            index.catchup.on_dependent = deps.ingest
            reaper = Reaper(ring, index, self.owners, deps.changed)
            relocator = Relocator(ring, index, lambda: self.refresh(relocate=False))
            leases = Leases(
                ring, index, self.owners, relocator, self.refresh, self.settle, self.gate, deps
            )
            self.owners.adopt()  # before the first reaper pass: a closed object's leases are ours
            parts = self._reader = (index, reaper, relocator, leases, deps)
            d = self.__dict__
            d["index"], d["reaper"], d["relocator"], d["leases"], d["deps"] = parts
            d["quiet"] = QuietLook(ring.ctl, self.pause, self.gate, index.catchup.quick_until)
            index.on_reset = d["quiet"].forget  # a lease must not trust a look the index forgot
            index.give_back = leases.give_back_taken  # what a take cut short took goes back
            # A class with __getattr__ makes every attribute read take the interpreter's slow
            # path; the parts are attributes now, so this context no longer needs it.
            self.__class__ = QueueContext
            self.refresh()
            # The cap slots a closed queue object of this process kept for its leases, now the
            # segments are read in (ringq/engine/kept.py).
            views = index.views
            self.gate.adopt(lambda seq: view.seg if (view := views.get(seq)) else None)
            self.reap(force=True)
            deps.sweep(force=True)
            return parts

    def new_lock(self) -> None:
        """Replace the lock (in a forked child: a parent thread may have held the old one, and
        none of the child's threads is inside ``outside``)."""
        self.lock = threading.RLock()
        self.idle = threading.Condition(self.lock)
        self.users = 0

    def live(self) -> None:
        """Raise QueueClosedError if the queue is closed."""
        if self.closed:
            raise QueueClosedError(f"queue {self.name!r} in {self.path} is closed")

    def refresh(self, relocate: bool = True, quick: bool = False) -> None:
        """Catch up with other processes; segments seen sealed for the first time are offered for
        straggler relocation (unless ``relocate`` is False), and any copies read in.  ``quick``:
        skip it if nothing was appended, returned or rotated since the last one (Index.catch_up)."""
        sealed = self.index.catch_up(quick)
        if relocate and sealed and sum(self.relocator.offer(view) for view in sealed) > 0:
            self.refresh(relocate=False)  # map and read the copies (they may have rotated the tail)

    def reap(self, force: bool = False) -> int:
        """Reclaim expired and dead holders' leases (on the reaper's schedule unless ``force``);
        a pass that ran also offers sealed segments for relocation.  Returns the leases reclaimed."""
        before = self.reaper.last
        n = self.reaper.reap(force)
        if self.reaper.last != before:
            if self.index.catchup.supersede_later:  # originals the pass may have made READY or DEAD
                self.index.catchup.retry_supersedes()
            moved = 0
            for view in list(self.index.views.values()):
                if view.sealed:
                    moved += self.relocator.offer(view)
            if moved:  # read the copies in: what follows (a purge, a count) must see them
                self.refresh(relocate=False)
            self.deps.sweep()  # on its own schedule (deps.SWEEP_INTERVAL)
        return n

    def settle(self, force: bool = True) -> None:
        """Catch up and reclaim expired and dead holders' leases, before a call that changes
        state: read-only calls already show such a lease as what reclaiming makes it (READY or
        DEAD), so a change must act on that state, not on the word still stored.  ``force``
        scans now; otherwise the reaper's own schedule decides (cheap: the hot ack path, which
        catches up only when a scan is due -- the job it settles is found, or caught up with, by
        ringq/local/leases.py's locate)."""
        if force or self.reaper.due():
            self.refresh()
            if self.reap(force):
                self.refresh()

    def job_at(self, segseq: int, slot: int, word: int | None = None) -> Job:
        """The snapshot of the job at ``slot`` of segment ``segseq`` (with ``word`` as its state)."""
        from ringq.engine import snapshot

        return snapshot.job_at(self.ring, self.index.views[segseq].seg, slot, word)

    def close(self) -> None:
        """Close: wake the threads using the mappings outside the lock, wait for them to leave,
        then release the engine objects.  The caller holds the lock."""
        self.closed = True
        if self.users:
            self.ring.ctl.wake()  # sleepers on the futex see the queue closed
            self.idle.wait_for(lambda: not self.users, timeout=10)
        reader = "_reader" in self.__dict__
        kept: dict[tuple[int, int], int] = {}
        if reader:
            self.quiet.close()  # before the mappings it watches are closed
            # The leases still held outlive the close: their owner index and cap slots are kept
            # for the process (engine/kept.py) by gate.close and owners.close.
            kept = self.leases.still_held()
        self.gate.close()
        self.owners.close()
        if kept:
            # Another object of the process may have acked one of them between the look above
            # and the keeping, finding nothing kept yet: look again now they are kept.
            self.leases.settle_kept(kept)
        if reader:
            self.index.reset()
        self.ring.close()
        self.pause.close()


class _ReaderUnbuilt(QueueContext):
    """A :class:`QueueContext` whose reader is not built yet: the first read of one of its parts
    builds it (:meth:`QueueContext.open_reader`, which makes the object a plain QueueContext)."""

    def __getattr__(self, name: str) -> object:
        # Called only for an attribute not set yet: the reader's parts before their first use.
        if name in ("index", "reaper", "relocator", "leases", "deps", "quiet"):
            self.open_reader()
            return self.__dict__[name]
        raise AttributeError(f"{QueueContext.__name__!r} object has no attribute {name!r}")
