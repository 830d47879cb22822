"""The storage engine of one queue name: open (lock, recovery), append, rotation.  Knows records, not retries.

Files of queue ``<name>`` in its directory (byte layouts in ``docs/format.md``)::

    <name>.lock            flock target for writers; never holds data (ringq/engine/lock.py)
    <name>.ctl             one page of shared words (ringq/engine/control.py)
    <name>.owners          one byte per lease owner, each held by an OFD lock (ringq/engine/owner.py)
    <name>.<seq>.seg       record files: header page, fixed-size slots of records (ringq/engine/segment.py)
    <name>.<seq>.state     state files: header words and the state table of segment <seq>
    <name>.<seq>.err       per-segment side file of nack error texts (ringq/engine/errtext.py)

*Append* (producers): take the writer lock -> read the tail segment and its tail from the shared
mappings (never from a cache kept across the lock) -> repair a tail left behind by a crash ->
plan, and create every new segment the batch needs -> reserve seqs -> write the batch with one
``ringq_append`` per segment (headers, CRCs, one ``pwrite``) -> publish it in order (release-store
of each state word, then the segment's tail), linking each new segment after the one before it is
published -> release the lock -> apply the durability strategy (ringq/engine/durability.py) -> wake
sleeping consumers.  A batch that spans segments is written whole before any of it is published.

*Rotation* seals the full segment (after storing its final tail) and links a new, complete,
fsynced one.  Readers never take the lock (ringq/engine/index.py); recovery is ringq/engine/recovery.py,
retirement ringq/engine/segments.py.
"""

from __future__ import annotations

import errno
import os
import threading

from ringq.backend import check_lock_timeout, check_mode, check_queue_name
from ringq.errors import QueuePathError, ReadOnlyQueueError, UnsupportedFilesystemError

from . import durability as _durability
from . import errtext, forksafe, records, recovery
from .appends import Appender, Placement, discard_fresh
from .control import Control
from .lock import WriterLock
from .records import NewRecord
from .recovery import RecoveryReport
from .segment import Segment
from .segments import SegmentSet
from .transitions import bad
from .words import ST_BAD, ST_CONT, ST_GONE, state

__all__ = [
    "Ring",
    "NewRecord",
    "RecoveryReport",
    "DURABILITY",
    "DEFAULT_SLOT_SIZE",
    "DEFAULT_SLOT_COUNT",
    "fs_type",
    "Placement",
]

DEFAULT_SLOT_SIZE = 256
DEFAULT_SLOT_COUNT = 16384
NETWORK_FS = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "fuse.sshfs",
    "afs",
    "ceph",
    "glusterfs",
    "lustre",
}
DURABILITY = _durability.STRATEGIES


def fs_type(path: str, mounts_text: str | None = None) -> str:
    """File-system type of ``path`` from /proc/self/mounts (longest matching mount point), or ''.

    ``mounts_text`` replaces the contents of /proc/self/mounts (for tests).
    """
    if mounts_text is None:
        try:
            with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
                mounts_text = fh.read()
        except OSError:
            return ""
    real = os.path.realpath(path)
    best, kind = "", ""
    for parts in (line.split() for line in mounts_text.splitlines()):
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, kind = mnt, parts[2]
    return kind


def _read_only(exc: OSError, directory: str, name: str) -> ReadOnlyQueueError | None:
    """``exc`` as a ReadOnlyQueueError if it means the directory cannot be written by this
    process (a read-only file system; or a directory that denies this user writing but lets it
    read, where verify and inspect still work), else None."""
    if exc.errno == errno.EROFS:
        why = "on a read-only file system"
    elif (
        exc.errno in (errno.EACCES, errno.EPERM)
        and os.path.isdir(directory)
        and not os.access(directory, os.W_OK)
        and os.access(directory, os.R_OK | os.X_OK)
    ):
        why = "not writable by this user"
    else:
        return None
    return ReadOnlyQueueError(
        exc.errno,
        f"queue {name!r} in {directory} is read-only ({why}: {exc.strerror}): a Queue writes its "
        "lock and state files, so it cannot open it; `ringq verify` and `ringq inspect` read it "
        "without writing",
    )


class Ring:
    """The segments of one queue name in one directory, as this process sees them.

    Args:
        path: queue directory (created 0700 if absent).
        name: queue name, ``[A-Za-z0-9_-]{1,64}``.
        slot_size, slot_count: geometry of new segments, used only when the queue is created
            (bytes per slot, multiple of 64; slots per segment).  An existing queue keeps its own.
        durability, flush_interval, sync_acks, state_flush_interval: the durability strategy
            (ringq/engine/durability.py; docs/durability.md says what each survives).
        lock_timeout: seconds to wait for the writer lock before LockTimeoutError (>= 0; 0 does
            not wait, ``math.inf`` waits as long as it takes).
        mode: permission bits of files created, 0 to 0o777 (directories get the matching x bits).
        allow_network_fs: open a queue on NFS/SMB anyway (flock and shared mappings do not work
            across hosts there).

    Attributes (read by the queue layer): ``ctl`` (the control file), ``segs`` (the SegmentSet),
    ``dur`` (the durability strategy), ``report`` (RecoveryReport), ``lock`` (the WriterLock).

    Raises:
        ValueError: bad name, geometry, lock_timeout or mode (the last two before anything is
        created).  QueuePathError: a file where the directory (or one above it) should be.
        ReadOnlyQueueError: the directory cannot be written (a read-only file system, no write
        permission).  OSError (with the path) for another failure to create or write it.
        UnsupportedFilesystemError, CorruptionError, FormatVersionError.
    """

    MAX_RECORD_FIELD = records.MAX_RECORD_FIELD
    ctl: Control  # the control file, from when __init__ opened it (``opened``)
    identity: int  # the queue's identity (its control file's device and inode), from then too
    lock: WriterLock

    def __init__(
        self,
        path: str | os.PathLike[str],
        name: str = "default",
        *,
        slot_size: int = DEFAULT_SLOT_SIZE,
        slot_count: int = DEFAULT_SLOT_COUNT,
        durability: str = "msync",
        flush_interval: float = _durability.DEFAULT_FLUSH_INTERVAL,
        sync_acks: bool = False,
        state_flush_interval: float | None | object = ...,
        lock_timeout: float = 10.0,
        mode: int = 0o600,
        allow_network_fs: bool = False,
    ) -> None:
        check_queue_name(name)
        lock_timeout = check_lock_timeout(lock_timeout)
        mode = check_mode(mode)
        self.dur = _durability.make(
            self,
            durability,
            flush_interval=flush_interval,
            sync_acks=sync_acks,
            state_flush_interval=state_flush_interval,
        )
        self.dir = os.fspath(path)
        self.name = name
        self.durability = durability
        self.mode = mode
        self.report = RecoveryReport()
        self.opened = False  # the control file is open (and mapped) until close
        self.segs = SegmentSet(self.dir, name)
        # Appending is the Appender's; its methods are the ring's.
        self.appender = appender = Appender(self)
        self.append = appender.append
        self.append_nowait = appender.append_nowait
        self.append_packed = appender.append_packed
        self.append_one = appender.append_one
        self.express = appender.express
        self.finish = appender.finish
        self.settled = appender.settled
        self.max_record_bytes = appender.max_record_bytes
        self.check_sizes = appender.check_sizes
        dmode = mode | ((mode & 0o444) >> 2)
        try:
            os.makedirs(self.dir, mode=dmode, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise QueuePathError(
                exc.errno,
                f"cannot create queue directory {self.dir}: {exc.strerror} (a file is in the way)",
            ) from None
        except OSError as exc:
            raise _read_only(exc, self.dir, name) or type(exc)(
                exc.errno, f"cannot create queue directory {self.dir}: {exc.strerror}"
            ) from None
        kind = fs_type(self.dir)
        if kind in NETWORK_FS and not allow_network_fs:
            raise UnsupportedFilesystemError(
                f"{self.dir} is on a {kind} file system: flock and shared mappings do not work across hosts. "
                "Use a local file system, or pass allow_network_fs=True if only one host will ever open it."
            )
        try:
            self.lock = WriterLock(os.path.join(self.dir, f"{name}.lock"), mode, lock_timeout)
        except OSError as exc:
            raise _read_only(exc, self.dir, name) or exc from None
        forksafe.register(self)
        try:
            with self.lock:
                ctl_path = os.path.join(self.dir, f"{name}.ctl")
                creating = not os.path.lexists(ctl_path) and not self.segs.listed_seqs()
                try:
                    self._open(slot_size, slot_count, mode)
                except BaseException:
                    if creating and not self.segs.listed_seqs():
                        # A queue this call was creating, and whose first segment could not be
                        # made (no room for its geometry): leave no control file behind, which
                        # would make every later open try that geometry again.
                        try:
                            os.unlink(ctl_path)
                        except OSError:
                            pass
                    raise
        except BaseException:
            self.close()
            raise

    def _open(self, slot_size: int, slot_count: int, mode: int) -> None:
        """Open (or create) the control file and recover the segments; under the writer lock."""
        self.ctl = recovery.open_control(self.segs, slot_size, slot_count, mode, self.report)
        self.opened = True
        st = os.fstat(self.ctl.fd)
        # What this queue is, as its control file (device, inode and the random number
        # written at its creation): a job snapshot records it, so that a snapshot of
        # another queue's job -- also of a queue deleted and created again at this path --
        # is never taken for one of this queue's records.
        mix = self.ctl.instance() * 0x9E3779B97F4A7C15
        self.identity = self.segs.origin = (
            (st.st_dev << 40) ^ st.st_ino ^ mix
        ) & 0x7FFFFFFFFFFFFFFF or 1
        self.lock.ctl = self.segs.ctl = self.ctl
        for item in recovery.recover_segments(self.segs, mode, self.report):
            # Copies first, then the rename: a crash in between salvages again at the next
            # open (a job twice, as at-least-once allows), never loses one.
            if item.records:
                self.append(item.records)
            what = f"{len(item.records)} intact jobs salvaged to the tail (ids, attempts, priority, times kept)"
            if item.lost:
                what += f"; {item.lost} records failed their CRC and are lost"
            recovery.quarantine(item.path, f"{item.reason}; {what}", self.report)
            self.report.repairs.append((item.path, what))

    def drop_inherited_locks(self) -> None:
        """In a forked child (ringq/engine/forksafe.py): replace the map lock, which a parent thread (the
        flusher) may have held at the fork; the child has no such thread."""
        self.segs.maplock = threading.Lock()

    def locked(self) -> WriterLock:
        """Context manager holding the writer lock: this process's threads, then the flock."""
        return self.lock

    # -- reading --------------------------------------------------------------------------------

    def refresh(self) -> list[int]:
        """Map segments created since we last looked and drop retired ones; returns the seqs dropped."""
        self.segs.refresh()
        self.report.quarantined.extend(self.segs.quarantined)
        self.segs.quarantined.clear()
        return self.segs.drop_retired()

    def mark_bad(self, seg: Segment, slot: int, reason: str) -> None:
        """Quarantine a damaged record: state BAD (never delivered), and report it, unless an
        earlier open had marked it BAD already (and reported it then: stats().corrupt counts it,
        verify lists it)."""
        while True:
            w = seg.load_state(slot)
            if state(w) == ST_BAD:
                return
            # EMPTY too: below the tail a slot is published whatever its state word says (a power
            # loss can keep the header page and lose the state page), so it is counted.
            if state(w) in (ST_GONE, ST_CONT) or seg.cas_state(slot, w, bad(w))[0]:
                break
        self.report.note_bad(seg.path, slot, reason)

    def write_error(self, seg: Segment, slot: int, lc: int, text: str) -> None:
        """Keep a nack error text for (slot, lease count) in the segment's side file (best effort)."""
        why = errtext.write_error(self.segs.err_path(seg.seq), slot, lc, text, self.mode)
        if why:
            self.report.repairs.append((self.segs.err_path(seg.seq), why))

    def read_errors(self, seq: int) -> dict[int, list[tuple[int, str]]]:
        return errtext.read_errors(self.segs.err_path(seq))

    # -- segments for the appender (ringq/engine/appends.py) -----------------------------------------

    def allocate(self, seg: Segment, tail: int, spans: list[int]) -> list[Segment]:
        """Create (complete and durable) every segment a batch of ``spans`` needs after ``seg``."""
        room, need = seg.slot_count - tail, 0
        for span in spans:
            if span > room:
                need += 1
                room = self.ctl.slot_count
            room -= span
        fresh: list[Segment] = []
        try:
            for i in range(need):
                fresh.append(
                    Segment(
                        Segment.create(
                            self.dir,
                            self.name,
                            seg.seq + 1 + i,
                            self.ctl.slot_size,
                            self.ctl.slot_count,
                            self.mode,
                        )
                    )
                )
        except BaseException:
            discard_fresh(fresh)
            raise
        return fresh

    def tail_segment(self) -> Segment:
        seq = self.ctl.tail_seq()
        seg = self.segs.segment(seq)
        if seg is None or seg.retired():
            # The tail segment vanished (deleted by hand?) or was retired to make room (see
            # retire_finished_tail): start a fresh one after it.
            return self._rotate(None, seq)
        return seg

    def retire_finished_tail(self) -> bool:
        """Under the lock: retire the tail segment itself if every record in it is finished.

        For a volume with room for one segment: its full tail would otherwise never retire (a
        segment retires once a newer one took over appends, and the newer one cannot be created),
        and the queue would refuse work for ever although all its jobs are done.  The next append
        starts a fresh tail segment.  True if the tail was retired.
        """
        seq = self.ctl.tail_seq()
        seg = self.segs.get(seq)
        if seg is None or seg.mm is None or seg.nrecords() == 0 or not self.segs.finished_all(seg):
            return False
        if not self.segs.may_retire(seg):
            return False
        seg.seal()  # nobody appends meanwhile: we hold the writer lock
        if not seg.begin_retirement():
            return False
        if self.durability != "none":
            self.ctl.sync_page()  # the next seq outlives the records that held the last ones
        self.segs.unlink(seq)
        self.ctl.bump_ring_gen()
        return True

    def _rotate(self, seg: Segment | None, after: int | None = None) -> Segment:
        """Under the lock: seal ``seg`` and link a new tail segment.  Raises QueueFullError."""
        seq = (seg.seq if seg is not None else after or 0) + 1
        path = Segment.create(
            self.dir, self.name, seq, self.ctl.slot_size, self.ctl.slot_count, self.mode
        )
        return self.link(seg, Segment(path))

    def link(self, seg: Segment | None, new: Segment) -> Segment:
        """Under the lock: seal ``seg`` and make the complete, fsynced ``new`` the tail segment."""
        self.segs.add(new)
        if seg is not None:
            seg.seal()
            if self.durability != "none":
                seg.sync_header()
        self.ctl.set_tail_seq(new.seq)
        self.ctl.bump_ring_gen()
        if self.durability != "none":
            self.ctl.sync_page()
        if seg is not None:
            # Its last job may have finished before it was sealed: then no ack will retire it, and
            # it would wait for a reaper (disk use would grow with the append rate).
            self.segs.try_retire(seg)
        return new

    def note_state(self, seg: Segment, slot: int, final: bool = False) -> None:
        """A lease or extend of this process changed the state word of ``slot``: the durability
        strategy flushes it within ``state_flush_interval`` (acks and nacks: ``dur.note_ack``)."""
        self.dur.note_state(seg, slot, final)

    def note_returned(self, seg: Segment) -> None:
        """A job of ``seg`` went back to READY: tell every reader to look again, and wake them."""
        seg.bump_change()
        self.ctl.note_returned()

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        dur = getattr(self, "dur", None)
        if dur is not None and self.opened:
            dur.close()
        self.segs.close()
        if self.opened:
            self.ctl.close()
            self.opened = False
        lock = getattr(self, "lock", None)  # absent if the directory could not be opened
        if lock is not None:
            lock.close()
