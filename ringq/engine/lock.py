"""The writer lock of a queue: this process's threads first, then ``flock`` on ``<name>.lock``;
and the queue lock's context manager (:class:`LiveLock`).

Only appenders (and the few operations that must see every published record: idempotent enqueue,
requeue, relocation, recovery) take it; readers never do.  ``flock`` has no timeout, so a waiter
sleeps on a futex word of the control page that a releaser bumps when it sees waiters, and gives up
with LockTimeoutError after ``timeout`` seconds.  Reentrant within a thread.  Fork-safe: a child
closes its copy of the descriptor at once (ringq/engine/forksafe.py) and opens its own on first use.

An uncontended append takes and releases the flock inside one C call (``ringq_append_fast``,
holding only the thread lock here: ``with lock.thread_part as fd:``, or
:meth:`WriterLock.enter_thread`) and follows the same waiter protocol on release.

The entry and exit of both locks are C (csrc/ext/guard.c): a signal handler's exception never
leaves either held.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

from ringq.errors import LockTimeoutError

from . import forksafe
from ._guard import LiveLock, WriterGate
from .control import OFF_LOCK_WAITERS, OFF_LOCK_WAKE, Control
from .mapped import open_nofollow

__all__ = ["LiveLock", "WriterLock"]


class WriterLock(WriterGate):
    """Context manager for the writer lock.  ``ctl`` (set once the control file is open) carries
    the futex words waiters sleep on; before that a waiter polls.

    Entry and exit are C (:class:`WriterGate`: ``__enter__``, ``__exit__``, :meth:`enter_thread`,
    :meth:`exit_thread`, and ``thread_part``, the last two as a context manager): an exception a
    signal's handler raises never falls between taking the thread lock or the flock and the code
    that releases them, nor leaves this thread counted among the writers waiting for the flock.
    What may run Python code in between is here -- :meth:`_after_fork`, :meth:`_flock`,
    :meth:`_wake` -- and whatever it raises is raised holding nothing.

    Raises (on entry): LockTimeoutError; OSError (with the path) if the lock file cannot be opened.
    """

    def __init__(self, path: str, mode: int, timeout: float) -> None:
        self.path = path
        self.mode = mode
        self.timeout = timeout
        self.ctl: Control | None = None
        self._tlock = threading.RLock()  # serialises this process's threads around the flock
        self._depth = 0  # nesting in the thread holding _tlock
        self._closed = False
        self._fd = -1
        forksafe.register(self)
        try:
            self._fd = forksafe.opened(lambda: open_nofollow(path, os.O_RDWR | os.O_CREAT, mode))
        except OSError as exc:
            raise type(exc)(exc.errno, f"cannot open {path}: {exc.strerror}") from None

    def drop_inherited_locks(self) -> None:
        """In a forked child: close the copy of the lock's descriptor at once -- flock belongs to
        the open file description, so a child keeping it would keep a parent's lock held after the
        parent died (forksafe closed it) -- and replace the thread lock, which a parent thread may
        have held at fork."""
        self._fd = -1
        self._tlock = threading.RLock()
        self._depth = 0
        self._forget_waiting()  # a parent thread's count among the waiters: the parent's to undo

    def _after_fork(self) -> None:
        """In a forked child, whose copy of the parent's descriptor drop_inherited_locks closed:
        open our own (a descriptor test on entry, not a pid test: getpid is a system call on
        every enqueue).  Called by the C entry holding the thread lock."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            forksafe.close(fd)
        self._fd = forksafe.opened(
            lambda: open_nofollow(self.path, os.O_RDWR | os.O_CREAT, self.mode)
        )
        self._depth = 0

    def _flock(self) -> None:
        """Wait for the flock that the C entry found taken, and take it; LockTimeoutError after
        ``timeout`` seconds.  Called holding the thread lock at depth 0: if this raises, the entry
        unlocks the flock (taken, perhaps, just before) and releases the thread lock."""
        # Count ourselves among the waiters *before* retrying, so a release between the retry
        # and the sleep is never missed.  The C base counts us out as this returns or raises,
        # once, whatever is raised where: a waiter never stays counted (every release would then
        # make a futex wake for nobody, for good).  Sleep in short slices: a holder killed by a
        # signal releases the flock but wakes nobody.
        deadline = time.monotonic() + self.timeout
        ctl = self.ctl  # None only while the queue is being created (under this very lock)
        if ctl is not None:
            self._register(ctl)
        pause = 0.0001
        while True:
            seen = ctl.load32(OFF_LOCK_WAKE) if ctl is not None else 0
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LockTimeoutError(
                        f"writer lock {self.path} not acquired within {self.timeout} s; "
                        "another process holds it (suspended or stuck?)"
                    ) from None
            if ctl is None:
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.005)
            else:
                ctl.futex_wait(OFF_LOCK_WAKE, seen, min(left, 0.005))

    def _wake(self) -> None:
        """Wake a writer waiting for the flock, if any: called by the outermost exit after the
        unlock (so a woken writer's retry succeeds), still holding the thread lock, which the exit
        releases whatever this raises."""
        ctl = self.ctl
        if ctl is not None and ctl.mm is not None and ctl.load32(OFF_LOCK_WAITERS):
            ctl.add32(OFF_LOCK_WAKE)
            ctl.futex_wake(OFF_LOCK_WAKE, 1)

    def close(self) -> None:
        self._closed = True
        fd, self._fd = self._fd, -1
        if fd >= 0:
            forksafe.close(fd)
