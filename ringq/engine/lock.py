"""The writer lock of a queue: this process's threads first, then ``flock`` on ``<name>.lock``;
and the queue lock's context manager (:class:`LiveLock`, compiled from csrc/ext/guard.c).

Only appenders (and the few operations that must see every published record: idempotent enqueue,
requeue, relocation, recovery) take it; readers never do.  ``flock`` has no timeout, so a waiter
sleeps on a futex word of the control page that a releaser bumps when it sees waiters, and gives up
with LockTimeoutError after ``timeout`` seconds.  Reentrant within a thread.  Fork-safe: a child
closes its copy of the descriptor at once (ringq/engine/forksafe.py) and opens its own on first use.

An uncontended append takes and releases the flock inside one C call (``ringq_append_fast``,
holding only the thread lock here: :meth:`WriterLock.enter_thread`) and follows the same waiter
protocol on release.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

from ringq.errors import LockTimeoutError

from . import forksafe
from ._guard import LiveLock
from .control import OFF_LOCK_WAITERS, OFF_LOCK_WAKE, Control
from .mapped import open_nofollow

__all__ = ["LiveLock", "WriterLock"]

_EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB


class WriterLock:
    """Context manager for the writer lock.  ``ctl`` (set once the control file is open) carries
    the futex words waiters sleep on; before that a waiter polls.

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

    def __enter__(self) -> None:
        self._tlock.acquire()
        if self._fd < 0 and not self._closed:
            # In a forked child, drop_inherited_locks closed the parent's descriptor: open our own.
            # (A descriptor test, not a pid test: getpid is a system call on every enqueue.)
            self._after_fork()
        if self._depth == 0:
            try:
                fcntl.flock(self._fd, _EX_NB)
            except BlockingIOError:
                try:
                    self._flock()
                except BaseException:
                    self._tlock.release()
                    raise
            except BaseException:
                self._tlock.release()
                raise
        self._depth += 1

    def enter_thread(self) -> int:
        """Take only this process's part of the lock (its thread lock), for a caller that takes the
        flock itself inside one C call and releases it before that call returns (an uncontended
        append: ``ringq_append_fast``, which follows this module's waiter protocol on release).
        Returns the lock file's descriptor, or -1 if this thread holds the writer lock already
        (then the caller must not flock it).  Always pair with :meth:`exit_thread`."""
        self._tlock.acquire()
        if self._depth:
            return -1
        if self._fd < 0 and not self._closed:
            try:
                self._after_fork()
            except BaseException:
                self._tlock.release()
                raise
        return self._fd

    def exit_thread(self) -> None:
        """Release what :meth:`enter_thread` took."""
        self._tlock.release()

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        try:
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                ctl = self.ctl
                if ctl is not None and ctl.mm is not None and ctl.load32(OFF_LOCK_WAITERS):
                    ctl.add32(OFF_LOCK_WAKE)  # after the unlock: a woken writer's retry succeeds
                    ctl.futex_wake(OFF_LOCK_WAKE, 1)
        finally:
            self._tlock.release()

    def drop_inherited_locks(self) -> None:
        """In a forked child: close the copy of the lock's descriptor at once -- flock belongs to
        the open file description, so a child keeping it would keep a parent's lock held after the
        parent died (forksafe closed it) -- and replace the thread lock, which a parent thread may
        have held at fork."""
        self._fd = -1
        self._tlock = threading.RLock()
        self._depth = 0

    def _after_fork(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            forksafe.close(fd)
        self._fd = forksafe.opened(
            lambda: open_nofollow(self.path, os.O_RDWR | os.O_CREAT, self.mode)
        )
        self._depth = 0

    def _flock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        # Register as a waiter *before* retrying, so a release between the retry and the sleep is
        # never missed.  Sleep in short slices: a holder killed by a signal releases the flock but
        # wakes nobody.
        deadline = time.monotonic() + self.timeout
        ctl = self.ctl  # None only while the queue is being created (under this very lock)
        pause = 0.0001
        while True:
            seen = ctl.load32(OFF_LOCK_WAKE) if ctl is not None else 0
            if ctl is not None:
                ctl.add32(OFF_LOCK_WAITERS, 1)
            try:
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
            finally:
                if ctl is not None:
                    ctl.add32(OFF_LOCK_WAITERS, -1)

    def close(self) -> None:
        self._closed = True
        fd, self._fd = self._fd, -1
        if fd >= 0:
            forksafe.close(fd)
