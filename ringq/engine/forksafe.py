"""Locks die with the process that took them, whatever it forks or execs.

``flock`` and OFD (``F_OFD_SETLK``) locks belong to an *open file description*, and ``fork()``
gives the child a descriptor for the same description.  A child that keeps its copy -- a
multiprocessing helper started with the default ``fork`` method, a handler's own ``os.fork`` --
keeps its parent's locks alive after the parent dies: a SIGKILLed holder's leases would stay held
until their visibility timeout, and a killed writer's lock until the child exits.

So every descriptor that carries (or may come to carry) a ringq lock is opened and closed here
(:func:`opened`, :func:`close`), which records it from its open to its close, and a forked child
closes every recorded descriptor at once, whichever object held it -- one the garbage collector is
finalising too (closing the child's copy never releases the parent's lock; the lock goes when the
parent's own descriptor closes, at its death).  Objects that keep such a descriptor, or thread
locks, register here too, and in the child their :meth:`drop_inherited_locks` forgets them.
Every such descriptor is also opened ``O_CLOEXEC``, so ``exec`` (``subprocess``, the ``spawn``
and ``forkserver`` start methods) drops it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Protocol

__all__ = ["register", "pid", "moving", "opened", "close", "flocked"]


class _Holder(Protocol):
    def drop_inherited_locks(self) -> None: ...


_HOLDERS: weakref.WeakSet = weakref.WeakSet()


_pid = os.getpid()


def pid() -> int:
    """This process's id, kept here (renewed in a forked child before its holders are called)
    so that the lease and ack paths compare it without a system call each time."""
    return _pid


# Held while a lock-carrying descriptor is opened and recorded, or forgotten and closed
# (:func:`opened`, :func:`close`), and across every fork: a child never holds a descriptor that is
# not recorded (it would keep its lock) nor a record of a number that was closed (it would close
# what the number is now).  Objects that hand a descriptor to one another hold it too, so that a
# fork sees each one's bookkeeping whole.  Such steps are a few system calls long; a fork waits.
_moving = threading.RLock()


def moving() -> threading.RLock:
    """The lock to hold around a step that hands a lock-carrying descriptor from one object to
    another, with its bookkeeping: ``with forksafe.moving():``."""
    return _moving


def register(holder: _Holder) -> None:
    """Have ``holder.drop_inherited_locks()`` called in every child forked from now on."""
    _HOLDERS.add(holder)


# Every open descriptor that carries (or may carry) a ringq lock: a forked child closes them all.
_lock_fds: set[int] = set()


def opened(open_fd: Callable[[], int]) -> int:
    """The new descriptor ``open_fd()`` returns, recorded (with no fork in between) until
    :func:`close`: for one that carries, or may come to carry, a ringq lock.  Raises what
    ``open_fd`` raises."""
    with _moving:
        fd = open_fd()
        _lock_fds.add(fd)
    return fd


def close(fd: int) -> None:
    """Close a descriptor :func:`opened` recorded (forgotten first, with no fork in between:
    a child never closes a number that is no longer this one)."""
    with _moving:
        _lock_fds.discard(fd)
        os.close(fd)


@contextlib.contextmanager
def flocked(path: str, flags: int, mode: int = 0o600, shared: bool = False) -> Iterator[int]:
    """Open ``path`` (``os.open`` ``flags``, ``O_CLOEXEC`` added; ``mode`` if it is created) and
    hold ``flock`` on it, exclusive or ``shared``, for the block; yields the descriptor.  A child
    forked meanwhile never keeps a copy, so the lock ends when this block or this process does.
    Raises OSError from ``open``."""
    fd = opened(lambda: os.open(path, flags | os.O_CLOEXEC, mode))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield fd
    finally:
        close(fd)  # the flock ends with the last descriptor of its open file description


def _before_fork() -> None:
    _moving.acquire()


def _after_fork_in_parent() -> None:
    _moving.release()


def _after_fork_in_child() -> None:
    global _pid, _moving
    _moving = threading.RLock()  # the parent's threads that might wait for it are not here
    _pid = os.getpid()
    for fd in list(_lock_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _lock_fds.clear()
    for holder in list(_HOLDERS):
        try:
            holder.drop_inherited_locks()
        except Exception:  # noqa: BLE001 -- a child must never die in a fork hook
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
