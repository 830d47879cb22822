"""Lock descriptors that outlive the object that opened them, kept for the process's next one.

A lease belongs to the process that took it, not to the ``Queue`` object it was taken through.
The locks that stand for it -- the owner index (ringq/engine/owner.py), the cap slots of a limit
(ringq/local/limits.py) -- are OFD locks on an open file description, so closing their
descriptor would end them while the process still holds the lease.  An object closed with such
leases hands its descriptor here instead, with what it knew of them; the next object of the
process that opens the same file takes both over (:meth:`Kept.take`), and the kernel drops the
locks when the process exits.  In a forked child every kept descriptor is closed at once (the
locks are the parent's: ringq/engine/forksafe.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from . import forksafe

__all__ = ["Kept"]

T = TypeVar("T")


class Kept(Generic[T]):
    """Descriptors kept for one kind of file: (st_dev, st_ino) -> [(descriptor, state)]."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.by_file: dict[tuple[int, int], list[tuple[int, T]]] = {}
        forksafe.register(self)

    def keep(self, fd: int, state: T) -> None:
        """Keep ``fd`` open, with ``state``, for the next object of this process on its file.
        The caller holds ``forksafe.moving()`` until it has forgotten ``fd`` itself."""
        st = os.fstat(fd)
        with forksafe.moving(), self.mutex:
            self.by_file.setdefault((st.st_dev, st.st_ino), []).append((fd, state))

    def take(self, fd: int) -> tuple[int, T] | None:
        """A kept (descriptor, state) of the file ``fd`` is open on, now the caller's; None if
        there is none.  The caller holds ``forksafe.moving()`` until it has recorded the
        descriptor.  Costs no system call while nothing is kept."""
        if not self.by_file:
            return None
        st = os.fstat(fd)
        with forksafe.moving(), self.mutex:
            kept = self.by_file.get((st.st_dev, st.st_ino))
            if not kept:
                return None
            got = kept.pop()
            if not kept:
                del self.by_file[(st.st_dev, st.st_ino)]
            return got

    def ended(
        self,
        path: str,
        key: Any,
        drop: Callable[[int, T, Any], bool],
        empty: Callable[[T], bool],
    ) -> bool:
        """The lease ``key`` ended, through some object of this process: ``drop(fd, state, key)``
        forgets it in each state kept for the file at ``path`` (True if that state held it), and
        a state that is ``empty`` afterwards has its descriptor closed (the locks it carries go
        with it).  True if some state held the lease.  No system call while nothing is kept."""
        found = False

        def one(fd: int, state: T) -> None:
            nonlocal found
            found = drop(fd, state, key) or found

        self.settle(path, one, empty)  # a state is kept non-empty: only a drop can empty it
        return found

    def settle(
        self, path: str, settle: Callable[[int, T], None], empty: Callable[[T], bool]
    ) -> None:
        """Let ``settle(fd, state)`` drop what has ended from each state kept for the file at
        ``path``; a state that is ``empty`` afterwards has its descriptor closed."""
        if not self.by_file:
            return
        try:
            st = os.stat(path)
        except OSError:
            return
        # No fork between forgetting a descriptor and closing it.
        with forksafe.moving(), self.mutex:
            kept = self.by_file.get((st.st_dev, st.st_ino))
            if not kept:
                return
            for entry in list(kept):
                settle(entry[0], entry[1])
                if empty(entry[1]):
                    kept.remove(entry)
                    forksafe.close(entry[0])
            if not kept:
                del self.by_file[(st.st_dev, st.st_ino)]

    def drop_inherited_locks(self) -> None:
        """In a forked child: forget the copies (forksafe closed them; the locks are the
        parent's)."""
        self.by_file = {}
        self.mutex = threading.Lock()
