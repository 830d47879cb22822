"""Lease owners: something only a live process can hold.

Every process that leases from a queue holds an exclusive open-file-description lock
(``F_OFD_SETLK``) on one byte of ``<name>.owners``; the byte's offset is its *owner index*
(1..65535), recorded in the owner word next to each lease it takes.  The kernel drops the lock when
the process dies (all its descriptors close), whatever killed it, in whatever container.  So a lease
whose owner byte is unlocked belongs to a dead process and is reclaimed at once; the visibility
timeout only bounds holders that are alive but stuck.  A PID is never the identity: PIDs are reused
and two containers sharing a volume can both have PID 1 (the PID in the owner word is for humans).

Index reuse: a new process may take the index of a dead one.  It then treats every lease recorded
under its index that it did not take itself as a dead predecessor's, and reclaims it.  A reclaimer
of another index holds that index's lock while it reclaims, so no new holder can appear mid-way.

Leases belong to the process, not to a ``Queue`` object: closing a registry whose process still
holds leases under its index keeps the index locked (its descriptor is kept open in
:data:`RETIRED`, ringq/engine/kept.py), and the next registry of the same owners file in the same
process adopts that index and its leases.  So a lease taken through a queue object that was
closed (or collected) is acked through a new one as if nothing happened, and still ends at once
when the process dies.
"""

from __future__ import annotations

import os

from ringq import errors

from . import forksafe, native
from ._native import lib
from .kept import Kept
from .mapped import open_nofollow

__all__ = ["OwnerRegistry", "MAX_OWNERS", "RETIRED"]

MAX_OWNERS = 65535


# Owner indexes that closed registries of this process kept because leases were still held
# under them: (index, held) by descriptor.
RETIRED: Kept[tuple[int, dict[tuple[int, int], int]]] = Kept()


class OwnerRegistry:
    """The owners file of one queue, and this process's index in it (taken on first use)."""

    def __init__(self, path: str, mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        self.fd = -1
        self.index = 0
        self.pid = 0
        # Leases this process holds, (segment seq, slot) -> lease count: a lease under our index
        # that is not here was left by a dead process that had the index before us.
        self.held: dict[tuple[int, int], int] = {}
        # Where threads of this process may be leasing in C outside the queue lock (the waiting
        # lease), one entry per wait -> (segment seq, first slot): such a lease, of that slot or
        # a later one of the segment, is tagged with our index before it is held (is_claiming).
        self.claiming: dict[object, tuple[int, int]] = {}
        forksafe.register(self)

    def drop_inherited_locks(self) -> None:
        """In a forked child: close the copy of the parent's descriptor at once.  The OFD lock
        belongs to the open file description; a child keeping its copy would keep the parent's
        owner index locked (and its leases held) after the parent died; forksafe closed it."""
        self.fd = -1
        self.index = 0
        self.pid = 0
        self.held = {}
        self.claiming = {}

    def is_claiming(self, seq: int, slot: int) -> bool:
        """Whether a thread of this process may be leasing ``slot`` of segment ``seq`` in C right
        now: a wait registered in ``claiming`` from that slot or an earlier one of the segment."""
        return any(q == seq and s <= slot for q, s in tuple(self.claiming.values()))

    def mine(self) -> int:
        """This process's owner index, or 0 if it has none (yet, or since a fork)."""
        return self.index if self.pid == forksafe.pid() else 0

    def _ensure_fd(self) -> int:
        if self.fd < 0:
            self.fd = forksafe.opened(
                lambda: open_nofollow(self.path, os.O_RDWR | os.O_CREAT, self.mode)
            )
        return self.fd

    def acquire(self) -> int:
        """This process's owner index, taking a free one on first call (or after a fork)."""
        if self.index and self.pid == forksafe.pid():
            return self.index
        if self.pid and self.pid != forksafe.pid():
            self.forget()  # a forked child shares the parent's lock: never use it
        if self.adopt():
            return self.index
        fd = self._ensure_fd()
        for idx in range(1, MAX_OWNERS + 1):
            if native.check(
                lib.ringq_owner_trylock(fd, idx), f"lock owner slot {idx} of {self.path}"
            ):
                self.index, self.pid = idx, forksafe.pid()
                return idx
        raise errors.RingqError(
            f"{self.path}: all {MAX_OWNERS} owner slots are held by live processes"
        )

    def adopt(self) -> bool:
        """Take over an index a closed registry of this process kept for its leases (on this
        owners file), with those leases; True if one was.  The reader calls it when it opens,
        so a new queue object acks, extends and reaps the leases of a closed one as its own."""
        if not RETIRED.by_file or (self.index and self.pid == forksafe.pid()):
            return False
        fd = self._ensure_fd()
        with forksafe.moving():  # the kept descriptor is always recorded somewhere at a fork
            adopted = RETIRED.take(fd)
            if adopted is None:
                return False
            kept_fd, (idx, held) = adopted
            self.fd, self.index, self.pid = kept_fd, idx, forksafe.pid()
            forksafe.close(fd)  # holds no lock: try_hold releases before the queue lock is let go
        for key, lc in held.items():
            self.held.setdefault(key, lc)
        return True

    def ended_kept(self, key: tuple[int, int]) -> None:
        """The lease ``key`` (segment seq, slot) ended through this registry's queue object:
        forget it in the indexes that closed registries of this process kept (:data:`RETIRED`);
        one that holds no lease any more is given up.  The caller checked ``RETIRED.by_file``."""
        RETIRED.ended(self.path, key, _drop_lease, _no_lease)

    def forget_kept(self) -> None:
        """Give up every index closed registries of this process kept (a purge ended every
        lease)."""
        RETIRED.settle(self.path, lambda fd, state: state[1].clear(), _no_lease)

    def is_alive(self, idx: int) -> bool:
        """True if some open file description other than ours holds owner index ``idx``."""
        if idx == self.index and self.pid == forksafe.pid():
            return True
        return bool(
            native.check(
                lib.ringq_owner_probe(self._ensure_fd(), idx), f"probe owner {idx} of {self.path}"
            )
        )

    def held_by(self, pid: int) -> set[int]:
        """The owner indexes that process ``pid`` (of this PID namespace) holds locked in this
        owners file, as the kernel lists them in ``/proc/<pid>/fdinfo`` (each descriptor's OFD
        locks: ``lock: N: OFDLCK ADVISORY WRITE -1 MAJ:MIN:INODE START END``).  Empty when that
        cannot be read.  The pid in an owner word is only a tag, which another namespace's
        process may share; the lock is the process's own."""
        try:
            mine = os.stat(self.path)
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return set()
        held: set[int] = set()
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")  # the file the descriptor is open on
                if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                    lines = info.read().splitlines()
            except OSError:
                continue  # closed meanwhile, or not ours to read
            for line in lines:
                fields = line.split()
                if len(fields) >= 8 and fields[0] == "lock:" and fields[2] == "OFDLCK":
                    start, end = fields[-2], fields[-1]
                    if start == end and start.isdigit() and 0 < int(start) <= MAX_OWNERS:
                        held.add(int(start))
        return held

    def try_hold(self, idx: int) -> bool:
        """Take ``idx`` if its holder is gone (True); release it later with :meth:`release`."""
        return bool(
            native.check(
                lib.ringq_owner_trylock(self._ensure_fd(), idx), f"lock owner {idx} of {self.path}"
            )
        )

    def release(self, idx: int) -> None:
        native.check(
            lib.ringq_owner_unlock(self._ensure_fd(), idx), f"unlock owner {idx} of {self.path}"
        )

    def forget(self) -> None:
        """Drop the index without unlocking (after fork: the lock belongs to the parent)."""
        if self.fd >= 0 and self.pid and self.pid != forksafe.pid():
            fd, self.fd = self.fd, -1
            forksafe.close(fd)  # closing our copy does not release the parent's lock
        self.index = 0
        self.pid = 0

    def close(self) -> None:
        """Give the index up, unless leases are still held under it (``held``: the caller drops
        those that ended): then it stays locked in :data:`RETIRED` for the next registry of this
        process to adopt, and the kernel drops it when the process exits."""
        with forksafe.moving():  # the descriptor is recorded in one place at any fork
            if self.fd >= 0:
                if self.index and self.pid == forksafe.pid():
                    if self.held:
                        RETIRED.keep(self.fd, (self.index, self.held))
                        self.fd, self.index, self.pid, self.held = -1, 0, 0, {}
                        return
                    lib.ringq_owner_unlock(self.fd, self.index)
                fd, self.fd = self.fd, -1
                forksafe.close(fd)
            self.fd = -1
            self.index = 0
            self.pid = 0


def _drop_lease(
    fd: int, state: tuple[int, dict[tuple[int, int], int]], key: tuple[int, int]
) -> bool:
    return state[1].pop(key, None) is not None


def _no_lease(state: tuple[int, dict[tuple[int, int], int]]) -> bool:
    return not state[1]
