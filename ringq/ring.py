"""The storage engine: a ring of segments for one queue name.  Knows records, not retries.

Theory of operation
-------------------
Files of queue ``<name>`` in its directory (byte layouts in ``docs/format.md``)::

    <name>.lock            flock target for writers; never holds data
    <name>.ctl             one page of shared words: next seq, tail segment, futex word, counters
    <name>.owners          one byte per lease owner, each held by an OFD lock (ringq/owner.py)
    <name>.<seq>.seg       segments: header page, state table, fixed-size slots
    <name>.<seq>.err       per-segment side file of nack error texts, deleted with the segment

*Append* (producers): take the flock -> read the tail segment and its tail from the shared
mappings (never from a cache kept across the lock) -> repair a tail left behind by a crash ->
reserve seqs -> write each record and publish it (release-store of its state word) -> rotate to a
new segment when one is full -> store the new tail -> release the flock -> apply the durability
strategy (ringq/durability.py: msync, fdatasync, group commit, ...) -> wake sleeping consumers.

*Read* (consumers): never take the lock.  Each process scans the records published since it last
looked (``scan``) and claims jobs by CAS on state words (ringq/queue.py).

*Rotation* seals the full segment (after storing its final tail) and links a new, complete,
fsynced one.  *Retirement*: a sealed segment whose every record is DONE or GONE is flagged retired
and unlinked by whoever notices first; a mapping other processes still hold stays valid until they
drop it.  No live record is ever rewritten.

*Recovery* on open (under the lock): unfinished temp files are removed; a segment that fails
validation is renamed ``*.quarantined`` and reported; a half-retired segment is unlinked (a
retired flag over unfinished jobs is damage: cleared and reported).  Records published beyond a
stale tail (crash between publish and tail store, or a power loss that kept the record pages but
not the header page) are re-adopted in *every* segment, then every segment but the newest is
sealed -- a rotation creates the next segment before it stores the full one's tail, so the full
one may hold such records too.  If the newest segment is sealed or older than the control file's
tail, a fresh tail segment is started; the next seq is raised past every retained record.
Damaged records are marked BAD, reported and never delivered (tests/test_crash_*.py enumerate
every crash point; docs/guarantees.md lists them).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from . import durability as _durability
from . import errors, forksafe
from ._native import ffi, lib
from .errors import (
    CorruptionError,
    FormatVersionError,
    LockTimeoutError,
    RecordTooLargeError,
    UnsupportedFilesystemError,
)
from .job import (
    LC_MASK,
    ST_BAD,
    ST_CONT,
    ST_DEAD,
    ST_DONE,
    ST_EMPTY,
    ST_GONE,
    ST_LEASED,
    ST_READY,
    pack,
)
from .segment import (
    OFF_ACKED_TOTAL,
    OFF_CHANGE,
    OFF_CTL_CHANGE,
    OFF_DEAD_TOTAL,
    OFF_ENQUEUED_TOTAL,
    OFF_FINISHED,
    OFF_LAST_SEQ,
    OFF_LOCK_WAITERS,
    OFF_LOCK_WAKE,
    OFF_MIN_DEADLINE,
    OFF_NEXT_SEQ,
    OFF_NRECORDS,
    OFF_RETIRED,
    OFF_RING_GEN,
    OFF_SEALED,
    OFF_SYNC_COUNT,
    OFF_TAIL,
    OFF_TAIL_SEG,
    OFF_WAITERS,
    OFF_WAKE,
    Control,
    Mapped,
    Segment,
    _open_nofollow,
    crc32c,
    fsync_dir,
    seg_layout,
    segment_name,
)

__all__ = ["Ring", "NewRecord", "RecoveryReport", "REC_HEADER", "REC_INFO_DTYPE", "DURABILITY"]

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SEG_RE = re.compile(r"^(?P<name>[A-Za-z0-9_-]{1,64})\.(?P<seq>[0-9a-f]{16})\.seg$")
REC_HEADER = struct.Struct("<IIIIQqqiHHHBBIQ")
assert REC_HEADER.size == 64
REC_MAGIC = 0x31435251
KIND_JOB = 1
DEFAULT_SLOT_SIZE = 256
DEFAULT_SLOT_COUNT = 16384
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "afs", "ceph", "glusterfs", "lustre"}
DURABILITY = _durability.STRATEGIES
MAX_SEQ_GAP = 1 << 20  # segment seqs further apart than this are damage, not history
MAX_ERR_FILE = 64 << 20  # bytes of a nack side file read at most

# numpy view of ringq_rec_info (csrc/ringq.h); offsets asserted against cffi at import.
REC_INFO_DTYPE = np.dtype(
    {
        "names": ["slot", "span", "status", "priority", "seq", "enqueued_us", "available_ms", "supersedes",
                  "state", "record_len", "payload_len", "max_attempts", "attempts_before", "id_len", "codec", "kind"],
        "formats": ["<u4", "<u4", "<i4", "<i4", "<u8", "<i8", "<i8", "<u8", "<u8", "<u4", "<u4", "<u2", "<u2",
                    "<u2", "u1", "u1"],
        "offsets": [ffi.offsetof("ringq_rec_info", f) for f in
                    ("slot", "span", "status", "priority", "seq", "enqueued_us", "available_ms", "supersedes",
                     "state", "record_len", "payload_len", "max_attempts", "attempts_before", "id_len", "codec",
                     "kind")],
        "itemsize": ffi.sizeof("ringq_rec_info"),
    }
)


@dataclass(slots=True)
class NewRecord:
    """A job record to append.  ``delay_ms`` is added to the append time to get available-at."""

    payload: bytes
    codec: int
    id_bytes: bytes = b""
    priority: int = 0
    delay_ms: int = 0
    max_attempts: int = 5
    attempts_before: int = 0
    supersedes: int = 0
    state: int = ST_READY  # the state the record is published in (READY, or DEAD for a relocated dead job)
    at_ms: int | None = None  # absolute available-at (or finish time), ms since the epoch; None: now + delay_ms
    enqueued_us: int | None = None  # enqueue time, µs since the epoch (a copy keeps its original's); None: now


@dataclass
class RecoveryReport:
    """What opening (and later scanning) found and did.  Damage is listed here, never hidden.

    Attributes:
        quarantined: files renamed to ``*.quarantined`` because they are not valid segments,
            as ``(path, reason)``.
        corrupt_records: records that failed validation and are marked BAD, as
            ``(segment path, slot, reason)``.
        readopted: records published beyond a stale tail and taken back, as ``(segment path, count)``.
        removed_temp: leftover temporary files of an interrupted segment creation that were removed.
        repairs: impossible values (a tail word, a retired flag, a control-file field) that
            recovery replaced by what the records say, as ``(path, what was done)``.
        quarantined_earlier: ``*.quarantined`` files of this queue left by an earlier open, still
            waiting for an operator (they do not make the report unclean: they were reported then).
    """

    quarantined: list[tuple[str, str]] = field(default_factory=list)
    corrupt_records: list[tuple[str, int, str]] = field(default_factory=list)
    readopted: list[tuple[str, int]] = field(default_factory=list)
    removed_temp: list[str] = field(default_factory=list)
    repairs: list[tuple[str, str]] = field(default_factory=list)
    quarantined_earlier: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True if nothing was damaged (re-adopting records and removing temp files are normal)."""
        return not (self.quarantined or self.corrupt_records or self.repairs)

    @property
    def repaired(self) -> bool:
        """True if opening found damage and acted on it (nobroker's flag): ``not clean``."""
        return not self.clean

    def describe(self) -> str:
        """One line for people and logs: ``clean: ...`` or ``repaired: ...`` with what was done."""
        parts = []
        if self.quarantined:
            parts.append(f"{len(self.quarantined)} file(s) quarantined ({self.quarantined[0][1]})")
        if self.corrupt_records:
            parts.append(f"{len(self.corrupt_records)} damaged record(s) marked BAD")
        if self.repairs:
            parts.append(f"{len(self.repairs)} repair(s) ({self.repairs[0][1]})")
        notes = []
        if self.readopted:
            notes.append(f"{sum(n for _p, n in self.readopted)} record(s) re-adopted")
        if self.removed_temp:
            notes.append(f"{len(self.removed_temp)} temporary file(s) removed")
        if self.quarantined_earlier:
            notes.append(f"{len(self.quarantined_earlier)} file(s) quarantined earlier await an operator")
        if parts:
            return "repaired: " + "; ".join(parts + notes)
        return "clean: no damage found" + (f" ({'; '.join(notes)})" if notes else "")


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
    mounts = [line.split() for line in mounts_text.splitlines()]
    real = os.path.realpath(path)
    best, kind = "", ""
    for parts in mounts:
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, kind = mnt, parts[2]
    return kind


class Ring:
    """The segments of one queue name in one directory, as this process sees them.

    Args:
        path: queue directory (created 0700 if absent).
        name: queue name, ``[A-Za-z0-9_-]{1,64}``.
        slot_size, slot_count: geometry of new segments, used only when the queue is created
            (bytes per slot, multiple of 64; slots per segment).  An existing queue keeps its own.
        durability: ``"msync"`` (default: an append returns after msync(MS_SYNC) of what it wrote),
            ``"fdatasync"``, ``"group"`` (group commit), ``"interval"`` (a flusher thread syncs every
            ``flush_interval`` s) or ``"none"`` (published to the shared mapping only: survives a
            process crash, not a power loss).  docs/durability.md says what each survives.
        flush_interval: seconds between the flusher's syncs for ``"interval"`` (its loss window).
        sync_acks: msync each ack and nack before it returns (leases and extends are not).
        state_flush_interval: seconds within which unsynced state changes are flushed (default
            1.0 for durable strategies, off for ``"none"``; None turns it off).
        lock_timeout: seconds to wait for the writer lock before LockTimeoutError.
        mode: permission bits of files created (directories get the matching x bits).
        allow_network_fs: open a queue on NFS/SMB anyway (flock and shared mappings do not work
            across hosts there).

    Raises:
        ValueError: bad name or geometry.  OSError (with the path) if the directory cannot be
        created or written.  UnsupportedFilesystemError, CorruptionError, FormatVersionError.
    """

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
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError(f"queue name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
        self.dur = _durability.make(self, durability, flush_interval=flush_interval, sync_acks=sync_acks,
                                    state_flush_interval=state_flush_interval)
        self.maplock = threading.Lock()  # held while syncing or unmapping segments of self.segments
        self.dir = os.fspath(path)
        self.name = name
        self.durability = durability
        self.lock_timeout = lock_timeout
        self.mode = mode
        self.report = RecoveryReport()
        self.segments: dict[int, Segment] = {}
        self._tlock = threading.RLock()  # serialises this process's threads around the flock
        self._depth = 0  # nesting of locked() in the thread holding _tlock
        self._pid = os.getpid()
        self._lock_fd = -1
        dmode = mode | ((mode & 0o444) >> 2)
        try:
            os.makedirs(self.dir, mode=dmode, exist_ok=True)
        except OSError as exc:
            raise type(exc)(exc.errno, f"cannot create queue directory {self.dir}: {exc.strerror}") from None
        kind = fs_type(self.dir)
        if kind in NETWORK_FS and not allow_network_fs:
            raise UnsupportedFilesystemError(
                f"{self.dir} is on a {kind} file system: flock and shared mappings do not work across hosts. "
                "Use a local file system, or pass allow_network_fs=True if only one host will ever open it."
            )
        self.lock_path = self._p(f"{name}.lock")
        try:
            self._lock_fd = _open_nofollow(self.lock_path, os.O_RDWR | os.O_CREAT, mode)
        except OSError as exc:
            raise type(exc)(exc.errno, f"cannot open {self.lock_path}: {exc.strerror}") from None
        forksafe.register(self)
        self.ctl: Control | None = None
        self._seen_gen = -1
        self._max_seen = 0
        try:
            with self.locked():
                self._recover(slot_size, slot_count)
        except BaseException:
            self.close()
            raise

    # -- paths and locking -------------------------------------------------------------------

    def _p(self, fname: str) -> str:
        return os.path.join(self.dir, fname)

    def seg_path(self, seq: int) -> str:
        return self._p(segment_name(self.name, seq))

    def err_path(self, seq: int) -> str:
        return self._p(f"{self.name}.{seq:016x}.err")

    class _Locked:
        __slots__ = ("ring",)

        def __init__(self, ring: Ring) -> None:
            self.ring = ring

        def __enter__(self) -> None:
            ring = self.ring
            ring._tlock.acquire()
            if ring._pid != os.getpid():
                ring._after_fork()
            if ring._depth == 0:
                try:
                    ring._flock()
                except BaseException:
                    ring._tlock.release()
                    raise
            ring._depth += 1

        def __exit__(self, *exc: object) -> None:
            ring = self.ring
            ring._depth -= 1
            try:
                if ring._depth == 0:
                    fcntl.flock(ring._lock_fd, fcntl.LOCK_UN)
                    ctl = ring.ctl
                    if ctl is not None and ctl.load32(OFF_LOCK_WAITERS):
                        ctl.add32(OFF_LOCK_WAKE)  # after the unlock: a woken writer's retry succeeds
                        lib.ringq_futex_wake(ctl.ptr, ctl.size, OFF_LOCK_WAKE, 1)
            finally:
                ring._tlock.release()

    def locked(self) -> Ring._Locked:
        """Context manager holding the writer lock: this process's threads, then the flock."""
        return Ring._Locked(self)

    def drop_inherited_locks(self) -> None:
        """In a forked child (ringq/forksafe.py): close the copy of the writer lock's descriptor
        at once -- flock belongs to the open file description, so a child keeping it would keep a
        parent's lock held after the parent died -- and replace the thread locks, which a parent
        thread (an appender, the flusher) may have held at the fork; the child has no such thread."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        self.maplock = threading.Lock()
        self._tlock = threading.RLock()
        self._depth = 0

    def _after_fork(self) -> None:
        # A child opens its own description of the lock file (the parent's was closed at fork).
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
        self._lock_fd = _open_nofollow(self.lock_path, os.O_RDWR | os.O_CREAT, self.mode)
        self._depth = 0
        self._pid = os.getpid()

    def _flock(self) -> None:
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        # flock has no timeout, so wait on the control file's lock futex word instead of polling:
        # a releaser that sees waiters bumps it after its unlock.  Register as a waiter *before*
        # retrying, so a release between the retry and the sleep is never missed.  Sleep in short
        # slices: a holder killed by a signal releases the flock but wakes nobody.
        deadline = time.monotonic() + self.lock_timeout
        ctl = self.ctl  # None only while the queue is being created (under this very lock)
        pause = 0.0001
        while True:
            seen = ctl.load32(OFF_LOCK_WAKE) if ctl is not None else 0
            if ctl is not None:
                ctl.add32(OFF_LOCK_WAITERS, 1)
            try:
                try:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise LockTimeoutError(
                            f"writer lock {self.lock_path} not acquired within {self.lock_timeout} s; "
                            "another process holds it (suspended or stuck?)"
                        ) from None
                if ctl is None or lib.ringq_futex_wait(ctl.ptr, ctl.size, OFF_LOCK_WAKE, seen,
                                                       int(min(left, 0.005) * 1e9)) == lib.RINGQ_ENOFUTEX:
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, 0.005)
            finally:
                if ctl is not None:
                    ctl.add32(OFF_LOCK_WAITERS, -1)

    # -- recovery ------------------------------------------------------------------------------

    def _recover(self, slot_size: int, slot_count: int) -> None:
        ctl_path = self._p(f"{self.name}.ctl")
        if os.path.lexists(ctl_path) and os.path.islink(ctl_path):
            raise CorruptionError(f"{ctl_path}: is a symbolic link")
        if not os.path.exists(ctl_path) or os.path.getsize(ctl_path) == 0:
            # A missing or empty control file next to existing segments (its creation is atomic, so
            # this is damage or a deletion): rebuild it with the geometry of the segments already
            # there, never the caller's.  Recovery below restores the tail segment and the next seq
            # from the segments themselves.
            found = self._existing_geometry(0, 0)
            if found != (0, 0):
                slot_size, slot_count = found
                what = "empty" if os.path.exists(ctl_path) else "missing"
                self.report.repairs.append((ctl_path, f"{what} control file; rebuilt from the segments"))
            Control.create(ctl_path, slot_size, slot_count, self.mode)
        try:
            self.ctl = Control(ctl_path)
        except CorruptionError as exc:
            raise CorruptionError(
                f"{exc}. If the queue's segments are intact, remove {ctl_path}: the next open rebuilds "
                "it from them (geometry, tail, next seq)"
            ) from None
        seqs = []
        salvage: list[tuple[str, str, list[NewRecord], int]] = []
        for entry in os.scandir(self.dir):
            fname = entry.name
            if fname.startswith(self.name + ".") and fname.endswith(".quarantined"):
                self.report.quarantined_earlier.append(entry.path)
                continue
            if fname.startswith(self.name + ".") and fname.endswith(".seg.tmp"):
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    continue
                self.report.removed_temp.append(entry.path)
                continue
            m = SEG_RE.match(fname)
            if not m or m.group("name") != self.name:
                continue
            seqs.append(int(m.group("seq"), 16))
        seqs.sort()
        for seq in seqs:
            path = self.seg_path(seq)
            try:
                seg = self._open_segment(seq)
            except FileNotFoundError:
                continue  # retired (unlinked) by another process since the listing: retirement takes no lock
            except FormatVersionError:
                raise
            except CorruptionError as exc:
                # A damaged header need not mean damaged records: each carries its own CRC.  Copy
                # the intact ones to the tail (below) before the file is set aside.
                recs, lost = self._salvage(path, seq)
                if recs or lost:
                    salvage.append((path, str(exc), recs, lost))
                else:
                    self._quarantine(path, str(exc))
                continue
            if seg.load32(OFF_RETIRED):
                if self.finished_all(seg):
                    seg.close()
                    self._unlink_segment(seq)  # a retirement interrupted between flag and unlink
                    continue
                # Retirement is only ever begun on a finished segment: a retired flag over jobs
                # that are not finished is damage.  Keep the jobs; clear the flag.
                seg.store32(OFF_RETIRED, 0)
                self.report.repairs.append((path, "retired flag set on a segment with unfinished jobs; cleared"))
            self.segments[seq] = seg
        live = sorted(self.segments)
        # Every tail first, then the seals.  A rotation creates the next segment before it stores
        # (and syncs) the full one's tail, so a crash or a power loss can leave published records
        # beyond the stored tail of a segment that is no longer the newest: sealing it unrepaired
        # would hide them for ever, although their enqueues may have returned.
        for seq in live:
            self._repair_tail(self.segments[seq])
        for seq in live[:-1]:
            if not self.segments[seq].load32(OFF_SEALED):
                self.segments[seq].store32(OFF_SEALED, 1)
        ctl_tail = self.ctl.load64(OFF_TAIL_SEG)
        if ctl_tail > max(seqs, default=0) + MAX_SEQ_GAP:
            self.report.repairs.append((self.ctl.path, f"tail segment {ctl_tail} is impossible; ignored"))
            ctl_tail = 0
        tail_seq = live[-1] if live else 0
        if not live or tail_seq < ctl_tail or self.segments[tail_seq].load32(OFF_SEALED):
            # No usable tail: none at all, the control file's tail segment vanished (deleted or
            # quarantined), or the newest one is sealed.  Appending to a sealed segment would hide
            # the records from readers that finished with it, and reusing the seq of a vanished
            # one would collide with the mapping other processes still hold of it.
            if live:
                self.segments[tail_seq].store32(OFF_SEALED, 1)
            tail_seq = max(ctl_tail, max(seqs, default=0)) + 1
            self.segments[tail_seq] = Segment(
                Segment.create(self.dir, self.name, tail_seq, self.ctl.slot_size, self.ctl.slot_count, self.mode)
            )
        # Never hand out a seq (a job's default id) that a retained record already has: the
        # control page may be older than the segments after a power loss, or recreated.
        top = max(seg.load64(OFF_LAST_SEQ) for seg in self.segments.values()) + 1
        dirty = False
        if self.ctl.load64(OFF_NEXT_SEQ) < top:
            self.ctl.store64(OFF_NEXT_SEQ, top)
            dirty = True
        if self.ctl.load64(OFF_TAIL_SEG) != tail_seq:
            self.ctl.store64(OFF_TAIL_SEG, tail_seq)
            dirty = True
        if dirty:
            self.ctl.msync(0, 4096)
        self._max_seen = tail_seq
        self._seen_gen = self.ctl.load64(OFF_RING_GEN)
        for path, reason, recs, lost in salvage:
            # Copies first, then the rename: a crash in between salvages again at the next open
            # (a job twice, as at-least-once allows), never loses one.
            if recs:
                self.append(recs)
            what = f"{len(recs)} intact jobs salvaged to the tail (ids, attempts, priority, times kept)"
            if lost:
                what += f"; {lost} records failed their CRC and are lost"
            self._quarantine(path, f"{reason}; {what}")
            self.report.repairs.append((path, what))

    def _salvage(self, path: str, seq: int) -> tuple[list[NewRecord], int]:
        """Intact unfinished jobs of segment file ``path`` whose header is unusable, as records to
        re-append, and how many records there failed their CRC.  Reads only, with the queue's
        geometry and the seq of the file name (each record's CRC is seeded by both).  A job keeps
        its id, priority, max attempts and attempts so far (a lease counts as one); it is due at
        its enqueue-time available-at (a retry's backoff time was relative to the lost header's
        epoch); a dead job stays dead; finished ones are left out.  ``([], 0)`` if nothing is
        readable."""
        state_off, data_off, size = seg_layout(self.ctl.slot_size, self.ctl.slot_count)
        try:
            fd = _open_nofollow(path, os.O_RDONLY)
        except (OSError, CorruptionError):
            return [], 0
        try:
            if os.fstat(fd).st_size < size:
                os.close(fd)
                return [], 0
            m = Mapped(path, fd, size, readonly=True)
        except OSError:
            os.close(fd)
            return [], 0
        try:
            geom = ffi.new("ringq_geom *", {"seg_seq": seq, "state_off": state_off, "data_off": data_off,
                                            "slot_size": self.ctl.slot_size, "slot_count": self.ctl.slot_count})
            states = np.frombuffer(m.mm, dtype="<u8", count=2 * self.ctl.slot_count, offset=state_off)[0::2]
            used = np.flatnonzero(states & 7)
            end = int(used[-1]) + 1 if len(used) else 0
            if not end:
                return [], 0
            out = ffi.new("ringq_rec_info[]", end)
            nxt = ffi.new("uint32_t *")
            n = lib.ringq_seg_scan(m.ptr, m.size, geom, 0, end, out, end, nxt)
            if n < 0:
                return [], 0
            infos = np.frombuffer(ffi.buffer(out, n * REC_INFO_DTYPE.itemsize), dtype=REC_INFO_DTYPE).copy()
            del states
            recs, lost = [], 0
            for info in infos:
                st = int(info["state"]) & 7
                if info["status"] != 0:
                    lost += st in (ST_READY, ST_LEASED, ST_DEAD, ST_BAD)
                    continue
                if st not in (ST_READY, ST_LEASED, ST_DEAD):
                    continue
                base = data_off + int(info["slot"]) * self.ctl.slot_size + REC_HEADER.size
                id_len, plen = int(info["id_len"]), int(info["payload_len"])
                jid = bytes(m.mm[base : base + id_len]) if id_len else f"{int(info['seq']):016x}".encode()
                payload = bytes(m.mm[base + id_len : base + id_len + plen])
                lc = (int(info["state"]) >> 6) & LC_MASK
                recs.append(NewRecord(payload, int(info["codec"]), jid, int(info["priority"]), 0,
                                      int(info["max_attempts"]), min(int(info["attempts_before"]) + lc, 0xFFFF),
                                      state=ST_DEAD if st == ST_DEAD else ST_READY,
                                      at_ms=int(info["available_ms"])))
            return recs, lost
        finally:
            m.close()

    def _existing_geometry(self, slot_size: int, slot_count: int) -> tuple[int, int]:
        """``(slot_size, slot_count)`` of the newest valid segment of this queue, else the arguments."""
        for seq in sorted(self._listed_seqs(), reverse=True):
            try:
                seg = Segment(self.seg_path(seq))
            except (OSError, CorruptionError):
                continue
            try:
                return seg.slot_size, seg.slot_count
            finally:
                seg.close()
        return slot_size, slot_count

    def _quarantine(self, path: str, reason: str) -> None:
        target = path + ".quarantined"
        try:
            os.rename(path, target)
        except OSError as exc:
            reason += f" (could not rename: {exc.strerror})"
            target = path
        self.report.quarantined.append((target, reason))

    def _repair_tail(self, seg: Segment) -> int:
        """Under the lock: adopt records published beyond the stored tail (crash or power loss).

        Returns the (repaired) tail.
        """
        tail = seg.load32(OFF_TAIL)
        if tail > seg.slot_count:
            # A damaged tail word.  Rebuild it from the state table: everything up to the last
            # slot that was ever written; the walk below then adopts anything after that.
            used = np.flatnonzero(seg.states[:, 0] & 7)
            rebuilt = int(used[-1]) + 1 if len(used) else 0
            self.report.repairs.append((seg.path, f"tail {tail} beyond {seg.slot_count} slots; rebuilt as {rebuilt}"))
            seg.store32(OFF_TAIL, rebuilt)
            tail = rebuilt
        if tail == seg.slot_count or seg.load64(seg.state_off_of(tail)) & 7 == ST_EMPTY:
            return tail  # the common case: nothing beyond the tail, one load
        start = tail
        info = ffi.new("ringq_rec_info *")
        last_seq = seg.load64(OFF_LAST_SEQ)
        adopted = 0
        while tail < seg.slot_count:
            st = seg.load64(seg.state_off_of(tail)) & 7
            if st in (ST_EMPTY, ST_CONT):
                break
            if lib.ringq_rec_check(seg.ptr, seg.size, seg.geom, tail, info) != 0:
                break  # a damaged unconfirmed record: the next append overwrites it
            tail += info.span
            last_seq = max(last_seq, info.seq)
            adopted += 1
        if tail != start:
            seg.add64(OFF_NRECORDS, adopted)
            seg.store64(OFF_LAST_SEQ, last_seq)
            seg.store32(OFF_TAIL, tail)
            self.report.readopted.append((seg.path, adopted))
        return tail

    # -- segments as this process sees them --------------------------------------------------------

    def tail_seq(self) -> int:
        return self.ctl.load64(OFF_TAIL_SEG)

    def refresh_segments(self) -> bool:
        """Map segments created since we last looked.  True if any was added.

        Never closes a mapping: the queue layer decides when, with :meth:`drop_retired`.
        """
        changed = False
        tail = self.ctl.load64(OFF_TAIL_SEG)
        if tail - self._max_seen > 64:
            # A long gap (or a damaged control word): list the directory instead of trying each seq.
            todo = sorted(s for s in self._listed_seqs() if self._max_seen < s <= tail)
        else:
            todo = range(self._max_seen + 1, tail + 1)
        self._max_seen = max(self._max_seen, tail)
        for seq in todo:
            if seq in self.segments:
                continue
            try:
                self.segments[seq] = self._open_segment(seq)
                changed = True
            except FileNotFoundError:
                pass  # already retired, or quarantined at someone's open
            except CorruptionError as exc:
                self.report.quarantined.append((self.seg_path(seq), str(exc)))
        return changed

    def _listed_seqs(self) -> list[int]:
        out = []
        for fname in os.listdir(self.dir):
            m = SEG_RE.match(fname)
            if m and m.group("name") == self.name:
                out.append(int(m.group("seq"), 16))
        return out

    def drop_retired(self) -> list[int]:
        """Close and forget mappings of segments that have been retired; returns their seqs."""
        gen = self.ctl.load64(OFF_RING_GEN)
        if gen == self._seen_gen:
            return []
        self._seen_gen = gen
        gone = [s for s, seg in self.segments.items() if seg.load32(OFF_RETIRED)]
        with self.maplock:
            for seq in gone:
                self.segments.pop(seq).close()
        return gone

    def _open_segment(self, seq: int) -> Segment:
        """Open and validate segment ``seq`` as a member of this queue.

        Raises CorruptionError for a symlink, a header whose seq disagrees with the name, or a
        geometry other than the queue's (a segment copied in from another queue); FileNotFoundError
        if it is gone (retired meanwhile).
        """
        path = self.seg_path(seq)
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise CorruptionError(f"{path}: is a symbolic link, not a segment")
        seg = Segment(path)
        if seg.seq != seq:
            seg.close()
            raise CorruptionError(f"{path}: header says segment {seg.seq}, name says {seq}")
        if self.ctl is not None and (seg.slot_size, seg.slot_count) != (self.ctl.slot_size, self.ctl.slot_count):
            geometry = (seg.slot_size, seg.slot_count)
            seg.close()
            raise CorruptionError(
                f"{path}: geometry {geometry} (slot size, slot count) differs from queue {self.name!r}'s "
                f"{(self.ctl.slot_size, self.ctl.slot_count)}: a segment of another queue"
            )
        return seg

    def segment(self, seq: int) -> Segment | None:
        """The mapped segment ``seq``, opening it if it exists but is not mapped yet."""
        seg = self.segments.get(seq)
        if seg is None:
            try:
                seg = self._open_segment(seq)
            except (FileNotFoundError, CorruptionError):
                return None
            if seg.load32(OFF_RETIRED):
                seg.close()
                return None
            self.segments[seq] = seg
        return seg

    @staticmethod
    def scan(seg: Segment, start: int, limit: int | None = None) -> tuple[np.ndarray, int]:
        """Validate records with heads in ``[start, tail)``; returns ``(infos, next slot)``.

        ``infos`` is a structured array of REC_INFO_DTYPE.  Records that fail validation come back
        with ``status != 0`` (the caller reports and quarantines them).  No lock is taken.
        """
        tail = min(seg.load32(OFF_TAIL), seg.slot_count)
        if limit is not None:
            tail = min(tail, start + limit)
        if start >= tail:
            return np.empty(0, REC_INFO_DTYPE), start
        cap = tail - start
        out = ffi.new("ringq_rec_info[]", cap)
        nxt = ffi.new("uint32_t *")
        n = errors.check(lib.ringq_seg_scan(seg.ptr, seg.size, seg.geom, start, tail, out, cap, nxt), seg.path)
        arr = np.frombuffer(ffi.buffer(out, n * REC_INFO_DTYPE.itemsize), dtype=REC_INFO_DTYPE).copy()
        return arr, nxt[0]

    def read_record(self, seg: Segment, slot: int) -> tuple[object, bytes, bytearray]:
        """Validate and copy one record: ``(info cdata, id bytes, payload bytearray)``.

        Raises CorruptionError if the record fails its CRC (it is then marked BAD).
        """
        info = ffi.new("ringq_rec_info *")
        rc = lib.ringq_rec_check(seg.ptr, seg.size, seg.geom, slot, info)
        if rc != 0:
            self.mark_bad(seg, slot, "failed validation on read")
            errors.check(rc, f"{seg.path} slot {slot}")
        base = seg.data_off + slot * seg.slot_size + REC_HEADER.size
        id_bytes = seg.mm[base : base + info.id_len]
        # One copy out of the mapping, into a buffer the payload may then use in place (an array
        # payload wraps it without copying again).
        start = base + info.id_len
        payload = bytearray(info.payload_len)
        with memoryview(seg.mm) as mv:
            payload[:] = mv[start : start + info.payload_len]
        return info, id_bytes, payload

    def mark_bad(self, seg: Segment, slot: int, reason: str) -> None:
        """Quarantine a damaged record: state BAD (never delivered), and report it."""
        off = seg.state_off_of(slot)
        while True:
            w = seg.load64(off)
            # EMPTY too: below the tail a slot is published whatever its state word says (a
            # power loss can keep the header page and lose the state page), so it is counted.
            if w & 7 in (ST_BAD, ST_GONE, ST_CONT):
                break
            if seg.cas64(off, w, (w & ~7) | ST_BAD)[0]:
                break
        if not any(p == seg.path and s == slot for p, s, _r in self.report.corrupt_records):
            self.report.corrupt_records.append((seg.path, slot, reason))

    # -- append ------------------------------------------------------------------------------------

    MAX_RECORD_FIELD = 0xFFFFFFFF  # the record header's length fields are 32-bit (docs/format.md)
    MAX_ID_FIELD = 0xFFFF  # and its id length field 16-bit

    def max_record_bytes(self) -> int:
        """The largest record (64-byte header + id + payload) this queue stores, in bytes: what a
        segment holds, capped at the 32-bit length field of the record header (4 GiB - 1)."""
        return min(self.ctl.slot_size * self.ctl.slot_count, self.MAX_RECORD_FIELD)

    def check_sizes(self, recs: Iterable[NewRecord]) -> None:
        """Raise RecordTooLargeError if any record of the batch exceeds a limit (nothing allocated)."""
        limit = self.max_record_bytes()
        for rec in recs:
            length = REC_HEADER.size + len(rec.id_bytes) + len(rec.payload)
            if length > limit:
                raise RecordTooLargeError(
                    f"record of {length} bytes (payload {len(rec.payload)} + id {len(rec.id_bytes)} + 64 header) "
                    f"exceeds the largest record queue {self.name!r} stores: {limit} bytes"
                    + (" (the 32-bit length field)" if limit == self.MAX_RECORD_FIELD else " (one segment)")
                )
            if len(rec.id_bytes) > self.MAX_ID_FIELD:
                raise RecordTooLargeError(f"job id of {len(rec.id_bytes)} bytes exceeds the 65535-byte limit")

    def build(self, rec: NewRecord) -> bytearray:
        """Record bytes with seq/time left for :meth:`append` to fill.  Raises RecordTooLargeError
        (before allocating anything)."""
        self.check_sizes((rec,))
        length = REC_HEADER.size + len(rec.id_bytes) + len(rec.payload)
        buf = bytearray(length)
        buf[REC_HEADER.size : REC_HEADER.size + len(rec.id_bytes)] = rec.id_bytes
        buf[REC_HEADER.size + len(rec.id_bytes) :] = rec.payload
        return buf

    def append(self, recs: list[NewRecord], bufs: list[bytearray] | None = None) -> list[tuple[int, int, int, int, int]]:
        """Append records durably (per the durability strategy); one lock hold, one sync.

        Returns one ``(segment seq, head slot, job seq, enqueued_us, available_ms)`` per record.
        Raises RecordTooLargeError before anything is written; QueueFullError if a new segment
        cannot be allocated (records appended before that point stay committed); LockTimeoutError.
        """
        out, ticket = self.append_nowait(recs, bufs)
        self.finish(ticket)
        return out

    def finish(self, ticket: tuple[dict[int, list[int]], int]) -> None:
        """Second half of :meth:`append_nowait`: apply the durability strategy, then wake consumers.

        Needs no lock of the caller's: a caller may release its own locks first, so that other
        threads append (and share the sync, under group commit) while this one waits for the disk.
        """
        self.dur.after_append(*ticket)
        self.wake()

    def append_nowait(self, recs: list[NewRecord], bufs: list[bytearray] | None = None,
                      ) -> tuple[list[tuple[int, int, int, int, int]], tuple[dict[int, list[int]], int]]:
        """Publish records under the writer lock; returns ``(placements, ticket)`` for :meth:`finish`.

        Until ``finish(ticket)`` returns the records are visible but not yet durable.
        """
        if bufs is None:
            self.check_sizes(recs)  # the whole batch, before a byte of it is allocated or written
            bufs = [self.build(r) for r in recs]
        slot_size = self.ctl.slot_size
        out: list[tuple[int, int, int, int, int]] = []
        touched: dict[int, list[int]] = {}
        with self.locked():
            seg = self._tail_segment()
            tail = self._repair_tail(seg)
            # Plan first and allocate every segment the batch needs before writing a byte, so that
            # a full disk fails the whole batch cleanly (QueueFullError) instead of half of it.
            spans = [-(-len(buf) // slot_size) for buf in bufs]
            fresh: list[Segment] = []
            room, need = seg.slot_count - tail, 0
            for span in spans:
                if span > room:
                    need += 1
                    room = self.ctl.slot_count
                room -= span
            try:
                for i in range(need):
                    fresh.append(Segment(Segment.create(
                        self.dir, self.name, seg.seq + 1 + i, self.ctl.slot_size, self.ctl.slot_count, self.mode)))
            except BaseException:
                for f in fresh:
                    f.close()
                    os.unlink(f.path)
                raise
            next_seq = max(self.ctl.load64(OFF_NEXT_SEQ), seg.load64(OFF_LAST_SEQ) + 1)
            self.ctl.store64(OFF_NEXT_SEQ, next_seq + len(recs))  # reserve first: a crash leaves a gap, never a reuse
            now_us = time.time_ns() // 1000
            now_ms = now_us // 1000
            count = 0
            for rec, buf, span in zip(recs, bufs, spans):
                if span > seg.slot_count - tail:
                    self._publish_tail(seg, tail, count, next_seq - 1)
                    count = 0
                    seg = self._link(seg, fresh.pop(0))
                    tail = 0
                avail_ms = now_ms + rec.delay_ms if rec.at_ms is None else rec.at_ms
                enq_us = now_us if rec.enqueued_us is None else rec.enqueued_us
                REC_HEADER.pack_into(
                    buf, 0, REC_MAGIC, 0, len(buf), span, next_seq, enq_us, avail_ms, rec.priority,
                    rec.max_attempts, rec.attempts_before, len(rec.id_bytes), rec.codec, KIND_JOB,
                    len(rec.payload), rec.supersedes,
                )
                word = pack(rec.state, 0, 0, avail_ms - seg.epoch_ms)
                errors.check(
                    lib.ringq_rec_write(seg.ptr, seg.size, seg.geom, tail, ffi.from_buffer(buf), len(buf), word),
                    f"write record to {seg.path}",
                )
                rng = touched.setdefault(seg.seq, [tail, tail + span])
                rng[1] = tail + span
                out.append((seg.seq, tail, next_seq, enq_us, avail_ms))
                tail += span
                next_seq += 1
                count += 1
            self._publish_tail(seg, tail, count, next_seq - 1)
        return out, (touched, _durability.position(seg.seq, tail))

    def _publish_tail(self, seg: Segment, tail: int, count: int, last_seq: int) -> None:
        if count:
            seg.add64(OFF_NRECORDS, count)
            seg.store64(OFF_LAST_SEQ, last_seq)
            seg.store32(OFF_TAIL, tail)

    def _tail_segment(self) -> Segment:
        seq = self.ctl.load64(OFF_TAIL_SEG)
        seg = self.segment(seq)
        if seg is None or seg.load32(OFF_RETIRED):
            # The tail segment vanished (deleted by hand?) or was retired to make room (see
            # retire_finished_tail): start a fresh one after it.
            return self._rotate(None, seq)
        return seg

    def retire_finished_tail(self) -> bool:
        """Under the lock: retire the tail segment itself if every record in it is finished.

        For a volume with room for one segment: its full tail would otherwise never retire
        (a segment retires once a newer one took over appends, and the newer one cannot be
        created), and the queue would refuse work for ever although all its jobs are done.
        The next append starts a fresh tail segment.  The space returns when every process that
        mapped the segment has dropped it (each does at its next call on the queue).  True if
        the tail was retired.
        """
        seq = self.ctl.load64(OFF_TAIL_SEG)
        seg = self.segments.get(seq)
        if seg is None or seg.mm is None or seg.load64(OFF_NRECORDS) == 0 or not self.finished_all(seg):
            return False
        seg.store32(OFF_SEALED, 1)  # nobody appends meanwhile: we hold the writer lock
        if not seg.cas32(OFF_RETIRED, 0, 1):
            return False
        if self.durability != "none":
            self.ctl.msync(0, 4096)  # the next seq outlives the records that held the last ones
        self._unlink_segment(seq)
        self.ctl.add64(OFF_RING_GEN)
        return True

    def _rotate(self, seg: Segment | None, after: int | None = None) -> Segment:
        """Under the lock: seal ``seg`` and link a new tail segment.  Raises QueueFullError."""
        seq = (seg.seq if seg is not None else after) + 1
        path = Segment.create(self.dir, self.name, seq, self.ctl.slot_size, self.ctl.slot_count, self.mode)
        return self._link(seg, Segment(path))

    def _link(self, seg: Segment | None, new: Segment) -> Segment:
        """Under the lock: seal ``seg`` and make the complete, fsynced ``new`` the tail segment."""
        seq = new.seq
        self.segments[seq] = new
        self._max_seen = max(self._max_seen, seq)
        if seg is not None:
            seg.store32(OFF_SEALED, 1)
            if self.durability != "none":
                seg.msync(0, 4096)
        self.ctl.store64(OFF_TAIL_SEG, seq)
        self.ctl.add64(OFF_RING_GEN)
        if self.durability != "none":
            self.ctl.msync(0, 4096)
        if seg is not None:
            # Its last job may have finished before it was sealed: then no ack will retire it,
            # and it would wait for a reaper (disk use would grow with the append rate).
            self.try_retire(seg)
        return new

    def note_state(self, seg: Segment, slot: int, final: bool) -> None:
        """This process changed the state word of ``slot``: let the durability strategy sync it now
        (``sync_acks`` and ``final``: an ack or nack) or within ``state_flush_interval``."""
        self.dur.note_state(seg, slot, final)

    def sync_count(self) -> int:
        """Append syncs issued on this queue by all processes since it was created (shared counter)."""
        return self.ctl.load64(OFF_SYNC_COUNT)

    # -- wake-ups ------------------------------------------------------------------------------------

    def wake(self) -> None:
        """Bump the futex word and wake sleeping consumers (a syscall only if someone sleeps)."""
        self.ctl.add32(OFF_WAKE)
        if self.ctl.load32(OFF_WAITERS):
            lib.ringq_futex_wake(self.ctl.ptr, self.ctl.size, OFF_WAKE, 0x7FFFFFFF)

    def wake_word(self) -> int:
        return self.ctl.load32(OFF_WAKE)

    def sleep(self, seen: int, timeout: float) -> None:
        """Sleep until the wake word moves from ``seen`` or ``timeout`` seconds pass."""
        if timeout <= 0:
            return
        self.ctl.add32(OFF_WAITERS, 1)
        try:
            rc = lib.ringq_futex_wait(self.ctl.ptr, self.ctl.size, OFF_WAKE, seen, int(timeout * 1e9))
            if rc == lib.RINGQ_ENOFUTEX:
                time.sleep(min(timeout, 0.005))
        finally:
            self.ctl.add32(OFF_WAITERS, -1)

    def note_returned(self, seg: Segment) -> None:
        """A job of ``seg`` went back to READY: tell every reader to look again, and wake them."""
        seg.add64(OFF_CHANGE)
        self.ctl.add64(OFF_CTL_CHANGE)
        self.wake()

    def change_counter(self) -> int:
        return self.ctl.load64(OFF_CTL_CHANGE)

    # -- cumulative counters ---------------------------------------------------------------------------

    COUNTERS = {"enqueued": OFF_ENQUEUED_TOTAL, "acked": OFF_ACKED_TOTAL, "dead": OFF_DEAD_TOTAL}

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to a cumulative counter of the control file (``"enqueued"``, ``"acked"``, ``"dead"``)."""
        if n:
            self.ctl.add64(self.COUNTERS[what], n)

    def totals(self) -> dict[str, int]:
        """The cumulative counters: ``{"enqueued": n, "acked": n, "dead": n}`` since creation."""
        return {k: self.ctl.load64(off) for k, off in self.COUNTERS.items()}

    # -- the lease-deadline floor ----------------------------------------------------------------------
    # One control word says when the earliest lease of the queue may expire, so that a reader scans
    # the state tables for expired leases when that moment comes instead of on a fixed period: an
    # expired lease is leasable again within milliseconds of its deadline, and nobody scans per
    # lease.  It packs (deadline ms since the Unix epoch << FLOOR_GEN_BITS) | generation.  Every
    # claimer lowers the deadline to its own if that is earlier and bumps the generation (one CAS);
    # a scanner may raise it to the earliest deadline it saw only if the generation did not move
    # since it read the word *before* its scan -- otherwise a lease it did not see could be hidden.

    FLOOR_GEN_BITS = 20
    FLOOR_NEVER = (1 << 44) - 1  # ms: no lease known

    def deadline_floor(self) -> tuple[int, int]:
        """``(word, ms)``: the raw floor word (pass it to :meth:`raise_deadline_floor`) and its deadline."""
        w = self.ctl.load64(OFF_MIN_DEADLINE)
        return w, w >> self.FLOOR_GEN_BITS

    def lower_deadline_floor(self, ms: int) -> None:
        """A lease expiring at ``ms`` (ms since the epoch) was just taken."""
        ms = min(max(ms, 0), self.FLOOR_NEVER)
        mask = (1 << self.FLOOR_GEN_BITS) - 1
        cur = self.ctl.load64(OFF_MIN_DEADLINE)
        while True:
            new = (min(cur >> self.FLOOR_GEN_BITS, ms) << self.FLOOR_GEN_BITS) | ((cur + 1) & mask)
            ok, cur = self.ctl.cas64(OFF_MIN_DEADLINE, cur, new)
            if ok:
                return

    def raise_deadline_floor(self, seen: int, ms: int) -> bool:
        """After a full scan begun when the floor word was ``seen``: set the floor to ``ms`` (the
        earliest deadline the scan saw), unless a lease was taken since.  True if it was set."""
        ms = min(max(ms, 0), self.FLOOR_NEVER)
        mask = (1 << self.FLOOR_GEN_BITS) - 1
        return self.ctl.cas64(OFF_MIN_DEADLINE, seen, (ms << self.FLOOR_GEN_BITS) | ((seen + 1) & mask))[0]

    # -- retirement ------------------------------------------------------------------------------------

    def note_finished(self, seg: Segment, n: int = 1) -> None:
        """``n`` records of ``seg`` reached DONE/GONE; retire the segment if that was the last."""
        done = seg.add64(OFF_FINISHED, n) + n
        if done >= seg.load64(OFF_NRECORDS) and seg.load32(OFF_SEALED):
            self.try_retire(seg)

    def finished_all(self, seg: Segment) -> bool:
        """True if every published record of ``seg`` is DONE or GONE (vectorised over the state table)."""
        tail = min(seg.load32(OFF_TAIL), seg.slot_count)
        st = seg.states[:tail, 0] & 7
        heads = st[(st != ST_EMPTY) & (st != ST_CONT)]
        return bool(np.all((heads == ST_DONE) | (heads == ST_GONE)))

    def try_retire(self, seg: Segment) -> bool:
        """Retire ``seg`` if it is sealed and finished; returns True if this call retired it."""
        if not seg.load32(OFF_SEALED) or seg.seq >= self.ctl.load64(OFF_TAIL_SEG):
            return False
        if not self.finished_all(seg):
            return False
        if not seg.cas32(OFF_RETIRED, 0, 1):
            return False
        self._unlink_segment(seg.seq)
        self.ctl.add64(OFF_RING_GEN)
        return True

    def retire_finished(self, thorough: bool = False) -> int:
        """Retire every sealed, finished segment; returns how many were retired.

        Cheap by default: only segments whose ``finished`` counter has reached their record count
        are checked.  ``thorough`` checks every sealed segment's state table (the counter can lag
        after a crash between a job's CAS and its counter update).
        """
        n = 0
        for seg in list(self.segments.values()):
            if seg.load32(OFF_RETIRED) or not seg.load32(OFF_SEALED):
                continue
            if not thorough and seg.load64(OFF_FINISHED) < seg.load64(OFF_NRECORDS):
                continue
            if self.try_retire(seg):
                n += 1
        return n

    def _unlink_segment(self, seq: int) -> None:
        for p in (self.seg_path(seq), self.err_path(seq)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        try:
            fsync_dir(self.dir)
        except OSError:
            pass

    # -- error side files ------------------------------------------------------------------------------

    _ERR = struct.Struct("<IIII")  # length of text, crc32c of the rest, slot, lease count

    def write_error(self, seg: Segment, slot: int, lc: int, text: str) -> None:
        """Append a nack error text for (slot, lease count) to the segment's side file."""
        data = text.encode("utf-8", "replace")[:4096]
        body = struct.pack("<II", slot, lc) + data
        frame = struct.pack("<II", len(data), crc32c(body)) + body
        # Best effort: the error text is a note for humans.  A full disk, a file size limit or a
        # hostile file in its place must not make the nack fail (the job would stay leased).
        try:
            fd = _open_nofollow(self.err_path(seg.seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND, self.mode)
            try:
                os.write(fd, frame)
            finally:
                os.close(fd)
        except (OSError, CorruptionError) as exc:
            self.report.repairs.append((self.err_path(seg.seq), f"error text not kept: {exc}"))

    def read_errors(self, seq: int) -> dict[int, list[tuple[int, str]]]:
        """slot -> [(lease count, text)] from a segment's side file; damaged frames are skipped."""
        try:
            fd = _open_nofollow(self.err_path(seq), os.O_RDONLY)
        except (OSError, CorruptionError):
            return {}
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_ERR_FILE)
        out: dict[int, list[tuple[int, str]]] = {}
        pos = 0
        while pos + 16 <= len(data):
            n, crc, slot, lc = self._ERR.unpack_from(data, pos)
            end = pos + 16 + n
            if end > len(data):
                break
            if crc32c(data[pos + 8 : end]) == crc:
                out.setdefault(slot, []).append((lc, data[pos + 16 : end].decode("utf-8", "replace")))
            pos = end
        return out

    # -- closing ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        dur = getattr(self, "dur", None)
        if dur is not None and self.ctl is not None:
            dur.close()
        with self.maplock:
            for seg in self.segments.values():
                seg.close()
            self.segments.clear()
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def all_segments(self) -> Iterable[Segment]:
        return [self.segments[s] for s in sorted(self.segments)]
