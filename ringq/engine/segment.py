"""Segments: their two files, created, validated and mapped as one.  Byte layouts: ``docs/format.md``.

Format 2 keeps a segment in two files.  The **record file** ``<name>.<seq>.seg`` holds the slots:
record bytes written only by the writer under the lock, with ``pwrite`` (``ringq_append``),
and mapped ``PROT_READ`` by every process, so a sync of it writes back only the blocks a
``pwrite`` dirtied (benchmarks/pagecost.c, docs/benchmarks.md "Why format 2").  The **state file**
``<name>.<seq>.state`` holds the header's mutable words and the state table, mapped read-write and
changed by atomics and CAS.  The C helper maps the two as one range (state file, then the slots of
the record file), so every offset a ``ringq_geom`` names is what format 1 used.

Each file is created whole (``posix_fallocate``, then zero-filled page by page so that no later
sync converts unwritten extents), its header written and fsynced, and only then renamed to its final
name; the state file first, the record file second, then the directory is fsynced.  The record file
is the segment's identity: a state file without one is a creation or retirement cut short, and a
record file without its state file gets a fresh one at open (ringq/engine/recovery.py).  A file is
validated from ``pread`` bytes *before* it is mapped, and only the lengths its header declares --
checked against the file's real size -- are mapped, so a truncated or foreign file is refused
instead of raising SIGBUS later.
"""

from __future__ import annotations

import errno
import os
import struct
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ringq.errors import CorruptionError, FormatVersionError, QueueFullError

from . import native, transitions
from ._native import ffi, lib
from .mapped import Mapped, crc32c, fsync_dir, open_nofollow
from .words import STATE_MASK

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "Segment",
    "PAGE",
    "FORMAT_VERSION",
    "REC_DATA_OFF",
    "StateFileError",
    "segment_name",
    "state_name",
    "seg_layout",
    "rec_file_size",
    "check_geometry",
    "MIN_SEGMENT_BYTES",
    "read_static",
    "write_file",
]

PAGE = 4096
FORMAT_VERSION = 2
# Record files keep format 1's segment magic: a ringq that reads only format 1 then stops at the
# version (FormatVersionError) instead of taking the file for a foreign one and quarantining it.
SEG_MAGIC = 0x3147455351474E52  # b"RNGQSEG1"
STATE_MAGIC = int.from_bytes(b"RNGQSTA2", "little")
REC_DATA_OFF = PAGE  # file offset of slot 0 in the record file
MAX_SLOT_SIZE = 1 << 20
# Bytes per write of the zero fill.  The page cache keeps a file in folios as large as the writes
# that filled it, and a store through a writable mapping dirties its whole folio: with 1 MiB fill
# writes every msync of the state file wrote about 1 MiB (benchmarks/pagecost.c, docs/benchmarks.md).
FILL_WRITE = 4096
MAX_SLOT_COUNT = 1 << 24  # slot numbers must fit the 24 bits of a ``supersedes`` reference
# The smallest segment: a record's header and as much again for a payload and its id.
MIN_SEGMENT_BYTES = 2 * ffi.sizeof("ringq_rec_header")

# Static header of both files (CRC-covered): magic, version, header size, seq, slot size, slot
# count, epoch ms, state offset, data offset, file size; then the CRC32C of those 64 bytes.
SEG_STATIC = struct.Struct("<QIIQIIQQQQ")
assert SEG_STATIC.size == 64
OFF_HDR_CRC = 64
# Mutable words of the state file's header page.  Those the C helper updates itself (appends,
# acks) take their offsets from csrc/ringq.h.
OFF_TAIL = lib.RINGQ_SEG_OFF_TAIL  # u32: next free slot (writers, under the lock)
OFF_SEALED = 132  # u32: 1 once a newer segment took over appends
OFF_CHANGE = 136  # u64: bumped when a job of this segment returns to READY
OFF_RETIRED = (
    lib.RINGQ_SEG_OFF_RETIRED
)  # u32: 1 once retirement began (the file is about to be unlinked)
OFF_FINISHED = lib.RINGQ_SEG_OFF_FINISHED  # u64: records that reached DONE or GONE
OFF_NRECORDS = lib.RINGQ_SEG_OFF_NRECORDS  # u64: records published (heads below the tail)
OFF_LAST_SEQ = lib.RINGQ_SEG_OFF_LAST_SEQ  # u64: seq of the last record published here
OFF_JTAIL = 176  # u64: bytes of the ack journal reserved by writers (ringq/engine/ackjournal.py)
OFF_JSIZE = 184  # u64: bytes of the ack journal zero-filled so far


_STATE_BITS = bytes(b & STATE_MASK for b in range(256))


class StateFileError(CorruptionError):
    """A segment's state file is missing, damaged, or disagrees with its record file.  Recovery
    answers it by giving the segment a fresh state file (every intact record READY again)."""


def segment_name(name: str, seq: int) -> str:
    """File name of segment ``seq``'s record file: ``<name>.<seq as 16 hex digits>.seg``."""
    return f"{name}.{seq:016x}.seg"


def state_name(name: str, seq: int) -> str:
    """File name of segment ``seq``'s state file: ``<name>.<seq as 16 hex digits>.state``."""
    return f"{name}.{seq:016x}.state"


def state_path_of(path: str) -> str:
    """The state file next to record file ``path`` (``.seg`` -> ``.state``)."""
    return path[: -len(".seg")] + ".state" if path.endswith(".seg") else path + ".state"


def seg_layout(slot_size: int, slot_count: int) -> tuple[int, int, int]:
    """``(state_off, data_off, mapped size)`` in bytes for a segment of this geometry.

    Offsets in the one range the two files are mapped as: the state table at ``state_off`` (also
    its offset in the state file, whose size is ``data_off``), slot 0 at ``data_off`` (at
    :data:`REC_DATA_OFF` in the record file)."""
    state_off = PAGE
    data_off = state_off + -(-slot_count * 16 // PAGE) * PAGE
    return state_off, data_off, data_off + slot_count * slot_size


def rec_file_size(slot_size: int, slot_count: int) -> int:
    """Bytes of a record file: its header page and the slots, rounded up to a page."""
    return REC_DATA_OFF + -(-slot_count * slot_size // PAGE) * PAGE


def check_geometry(slot_size: int, slot_count: int) -> None:
    """Raise ValueError unless slot_size is a multiple of 64 in [64, 1 MiB], slot_count in
    [1, 2**24), and a segment (``slot_size * slot_count`` bytes) holds a record with a payload
    (at least MIN_SEGMENT_BYTES: a record is a 64-byte header, its id and its payload)."""
    if not (64 <= slot_size <= MAX_SLOT_SIZE) or slot_size % 64:
        raise ValueError(
            f"slot_size must be a multiple of 64 between 64 and {MAX_SLOT_SIZE} bytes, got {slot_size}"
        )
    if not (1 <= slot_count < MAX_SLOT_COUNT):
        raise ValueError(f"slot_count must be between 1 and {MAX_SLOT_COUNT - 1}, got {slot_count}")
    if slot_size * slot_count < MIN_SEGMENT_BYTES:
        raise ValueError(
            f"a segment of slot_size * slot_count = {slot_size * slot_count} bytes holds no job "
            f"(a record is a {MIN_SEGMENT_BYTES // 2}-byte header and its payload): at least "
            f"{MIN_SEGMENT_BYTES} bytes"
        )


def static_header(magic: int, seq: int, slot_size: int, slot_count: int, epoch_ms: int) -> bytes:
    state_off, data_off, _ = seg_layout(slot_size, slot_count)
    if magic == SEG_MAGIC:
        offs = (0, REC_DATA_OFF, rec_file_size(slot_size, slot_count))
    else:
        offs = (state_off, 0, data_off)
    static = SEG_STATIC.pack(
        magic, FORMAT_VERSION, PAGE, seq, slot_size, slot_count, epoch_ms, *offs
    )
    return static + struct.pack("<I", crc32c(static))


def write_file(
    final: str, size: int, head: bytes, mode: int, body: Sequence[tuple[int, bytes]] = ()
) -> None:
    """Create ``final`` whole and durable: ``<final>.tmp`` allocated and zero-filled to ``size``
    bytes, ``head`` written at 0 and each ``(offset, bytes)`` of ``body``, fsynced, renamed into
    place (the caller fsyncs the directory).  QueueFullError when the space cannot be allocated;
    no temporary file is left behind."""
    tmp = final + ".tmp"
    try:
        os.unlink(tmp)  # a leftover of a crash during an earlier creation
    except FileNotFoundError:
        pass
    # A file larger than the free space is refused before any of it is allocated: fallocate
    # would take all the free space (other writers of the file system failing meanwhile) and
    # only then report ENOSPC.  fallocate stays the real check (the space may go meanwhile).
    vfs = os.statvfs(os.path.dirname(final) or ".")
    if size > vfs.f_bavail * vfs.f_frsize:
        raise QueueFullError(
            errno.ENOSPC,
            f"cannot allocate a new segment file of {size} bytes at {final}: "
            f"{os.strerror(errno.ENOSPC)} ({vfs.f_bavail * vfs.f_frsize} bytes free)",
        )
    fd = open_nofollow(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
            zeros = bytes(FILL_WRITE)
            done = 0
            while done < size:
                done += os.pwrite(fd, zeros[: min(FILL_WRITE, size - done)], done)
            for off, data in body:
                os.pwrite(fd, data, off)
        except OSError as exc:
            if exc.errno in native.FULL:
                raise QueueFullError(
                    exc.errno,
                    f"cannot allocate a new segment file of {size} bytes at {final}: {os.strerror(exc.errno)}",
                ) from None
            raise
        os.pwrite(fd, head, 0)
        os.fsync(fd)
        os.rename(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def read_static(path: str, head: bytes, real_size: int, magic_want: int) -> tuple:
    """Validate a static header read with ``pread``: the ten fields, or CorruptionError
    (FormatVersionError for another version; StateFileError for a state file)."""
    bad = StateFileError if magic_want == STATE_MAGIC else CorruptionError
    what = "state file" if magic_want == STATE_MAGIC else "segment"
    if len(head) < 68:
        raise bad(f"{path}: {real_size} bytes is too short to be a ringq {what}")
    fields = SEG_STATIC.unpack_from(head)
    magic, version, hsize, seq, slot_size, slot_count, _epoch, state_off, data_off, size = fields
    if magic != magic_want:
        raise bad(f"{path}: not a ringq {what} (bad magic {head[:8]!r})")
    if version != FORMAT_VERSION:
        if magic == SEG_MAGIC and version == 1:
            dirpath = os.path.dirname(path) or "."
            older = FormatVersionError(
                f"{path}: segment format version 1; this ringq reads version {FORMAT_VERSION}. "
                f"Stop every process using the queue, then run `ringq upgrade {dirpath}` to upgrade it in place"
            )
            older.upgradable = True
            raise older
        raise FormatVersionError(
            f"{path}: {what} format version {version}; this ringq reads version {FORMAT_VERSION}"
        )
    (crc,) = struct.unpack_from("<I", head, OFF_HDR_CRC)
    if crc != crc32c(head[:64]):
        raise bad(f"{path}: {what} header CRC mismatch")
    try:
        check_geometry(slot_size, slot_count)
    except ValueError as exc:
        raise bad(f"{path}: impossible geometry: {exc}") from None
    want_state_off, want_data_off, _ = seg_layout(slot_size, slot_count)
    if magic == SEG_MAGIC:
        want = (0, REC_DATA_OFF, rec_file_size(slot_size, slot_count))
    else:
        want = (want_state_off, 0, want_data_off)
    if hsize != PAGE or (state_off, data_off, size) != want:
        raise bad(f"{path}: header offsets disagree with its geometry")
    if real_size < size:
        raise bad(
            f"{path}: file is {real_size} bytes but its header declares {size}; truncated by someone else"
        )
    return fields


class Segment(Mapped):
    """One segment: its record file and its state file, mapped as one range.

    Attributes are the validated static header fields; ``fd`` is the state file's descriptor,
    ``rfd`` the record file's, ``path`` the record file's path, ``state_path`` the state file's.
    Record bytes are read through ``mm`` at ``data_off + slot * slot_size`` like every other word.
    """

    __slots__ = (
        "origin",
        "seq",
        "slot_size",
        "slot_count",
        "epoch_ms",
        "state_off",
        "data_off",
        "geom",
        "ref",
        "ref_addr",
        "_states",
        "rfd",
        "state_path",
    )

    @staticmethod
    def create(
        dirpath: str,
        name: str,
        seq: int,
        slot_size: int,
        slot_count: int,
        mode: int = 0o600,
        epoch_ms: int | None = None,
    ) -> str:
        """Create segment ``seq`` complete and durable: the state file, then the record file.

        Replaces an earlier segment of that number (the callers hold the writer lock and create
        only past the linked tail, so one there is a dead writer's unlinked, unpublished debris).
        Returns the record file's path.  Raises QueueFullError (with the bytes needed and the path)
        when the space cannot be allocated; OSError for other OS failures.  Leaves no partial file.
        """
        check_geometry(slot_size, slot_count)
        epoch = int(time.time() * 1000) if epoch_ms is None else epoch_ms
        _state_off, data_off, _size = seg_layout(slot_size, slot_count)
        final = os.path.join(dirpath, segment_name(name, seq))
        state_path = os.path.join(dirpath, state_name(name, seq))
        # The earlier pair goes before the new one is written, its record file first: a process
        # killed at any step leaves no pair (a state file alone is debris recovery removes) or a
        # whole new one, never the old record file beside the new state file.
        for path in (final, state_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        write_file(
            state_path,
            data_off,
            static_header(STATE_MAGIC, seq, slot_size, slot_count, epoch),
            mode,
        )
        try:
            write_file(
                final,
                rec_file_size(slot_size, slot_count),
                static_header(SEG_MAGIC, seq, slot_size, slot_count, epoch),
                mode,
            )
        except BaseException:
            try:
                os.unlink(state_path)  # no record file: nothing refers to it yet
            except OSError:
                pass
            raise
        fsync_dir(dirpath)
        return final

    @staticmethod
    def create_state(path: str, mode: int = 0o600) -> None:
        """Give the record file ``path`` a fresh, empty state file (every slot EMPTY, tail 0), from
        its validated header; recovery then takes back every intact record.  Replaces a damaged
        one.  Raises CorruptionError if the record file itself is not valid."""
        fd = open_nofollow(path, os.O_RDONLY)
        try:
            fields = read_static(path, os.pread(fd, 68, 0), os.fstat(fd).st_size, SEG_MAGIC)
        finally:
            os.close(fd)
        seq, slot_size, slot_count, epoch = fields[3], fields[4], fields[5], fields[6]
        _s, data_off, _n = seg_layout(slot_size, slot_count)
        write_file(
            state_path_of(path),
            data_off,
            static_header(STATE_MAGIC, seq, slot_size, slot_count, epoch),
            mode,
        )
        fsync_dir(os.path.dirname(path) or ".")

    def __init__(
        self,
        path: str,
        readonly: bool = False,
        expect_seq: int | None = None,
        expect_geometry: tuple[int, int] | None = None,
    ) -> None:
        self.origin = 0  # the identity of the queue whose member it is (SegmentSet), 0: none
        """Open, validate and map a segment.  ``readonly`` maps its state file PROT_READ too (loads
        only: for verify).  ``expect_seq`` and ``expect_geometry`` (slot size, slot count), when
        given, are checked against the record file first (CorruptionError).  Raises FileNotFoundError if the record file is gone, StateFileError if
        its state file is missing, damaged or of another geometry, CorruptionError."""
        flags = os.O_RDONLY if readonly else os.O_RDWR
        spath = state_path_of(path)
        rfd = open_nofollow(path, flags)
        sfd = -1
        try:
            fields = read_static(path, os.pread(rfd, 68, 0), os.fstat(rfd).st_size, SEG_MAGIC)
            # The record file answers for the segment: checked before its state file is looked at.
            if expect_seq is not None and fields[3] != expect_seq:
                raise CorruptionError(
                    f"{path}: header says segment {fields[3]}, name says {expect_seq}"
                )
            if expect_geometry is not None and (fields[4], fields[5]) != tuple(expect_geometry):
                raise CorruptionError(
                    f"{path}: geometry {(fields[4], fields[5])} (slot size, slot count) differs from the "
                    f"queue's {tuple(expect_geometry)}: a segment of another queue"
                )
            try:
                sfd = open_nofollow(spath, flags)
            except FileNotFoundError:
                raise StateFileError(
                    f"{spath}: state file missing next to its record file"
                ) from None
            sfields = read_static(spath, os.pread(sfd, 68, 0), os.fstat(sfd).st_size, STATE_MAGIC)
            if sfields[3:7] != fields[3:7]:
                raise StateFileError(
                    f"{spath}: state file of segment {sfields[3]} (slot size {sfields[4]}, {sfields[5]} slots, "
                    f"epoch {sfields[6]}) disagrees with its record file {path} (segment {fields[3]}, slot size "
                    f"{fields[4]}, {fields[5]} slots, epoch {fields[6]})"
                )
            self.seq, self.slot_size, self.slot_count, self.epoch_ms = fields[3:7]
            self.state_off, self.data_off, size = seg_layout(self.slot_size, self.slot_count)
            out = ffi.new("uint8_t **")
            native.check(
                lib.ringq_map_pair(
                    sfd,
                    self.data_off,
                    rfd,
                    REC_DATA_OFF,
                    size - self.data_off,
                    0 if readonly else 1,
                    out,
                ),
                f"map {path}",
            )
        except BaseException:
            os.close(rfd)
            if sfd >= 0:
                os.close(sfd)
            raise
        self.path = path
        self.state_path = spath
        self.fd = sfd
        self.rfd = rfd
        self.size = size
        # The mapping goes when the last reference does (a numpy view of the state table keeps it),
        # never under a live view: the pointer's destructor unmaps.
        self.ptr = ffi.gc(out[0], lambda p, n=size: lib.ringq_unmap(p, n), size)
        self.mm = ffi.buffer(self.ptr, size)
        self.geom = ffi.new(
            "ringq_geom *",
            {
                "seg_seq": self.seq,
                "state_off": self.state_off,
                "data_off": self.data_off,
                "slot_size": self.slot_size,
                "slot_count": self.slot_count,
            },
        )
        # The handle the per-job calls take (ringq_seg_ref); a caller keeps ``ptr`` while using it.
        self.ref = ffi.new(
            "ringq_seg_ref *",
            {"base": self.ptr, "maplen": size, "g": self.geom, "epoch_ms": self.epoch_ms},
        )
        self.ref_addr = int(ffi.cast("uintptr_t", self.ref))  # the handle for ringq.engine._jobs
        self._states: np.ndarray | None = None

    def record_file_off(self, slot: int) -> int:
        """File offset of ``slot`` in the record file."""
        return REC_DATA_OFF + slot * self.slot_size

    @property
    def states(self) -> np.ndarray:
        """``(slot_count, 2)`` uint64 view of the state table: column 0 state word, 1 owner word.

        Plain loads: good for counting and hints, never for decisions (those go through CAS).
        """
        if self._states is None:
            import numpy as np  # on first use: an enqueue never needs it

            self._states = np.frombuffer(
                self.mm, dtype="<u8", count=2 * self.slot_count, offset=self.state_off
            ).reshape(-1, 2)
        return self._states

    def state_codes(self, lo: int, hi: int) -> bytes:
        """The state (0..7, ringq/engine/words.py ST_*) of slots ``[lo, hi)``, one byte each: plain
        loads, for the checks made at open and at retirement (``codes.translate(None, wanted)``
        is empty when every slot is in ``wanted``), without loading numpy."""
        off = self.state_off + lo * 16
        with memoryview(self.mm) as mv:
            low = bytes(mv[off : off + (hi - lo) * 16 : 16])  # each state word's low byte
        return low.translate(_STATE_BITS)

    def state_off_of(self, slot: int) -> int:
        return self.state_off + slot * 16

    def load_state(self, slot: int) -> int:
        """The state word of ``slot`` (acquire load)."""
        return self.load64(self.state_off + slot * 16)

    def cas_state(self, slot: int, expected: int, desired: int) -> tuple[bool, int]:
        """CAS the state word of ``slot``; ``(swapped, current word)``.  The change must be a
        transition of ringq/engine/transitions.py (StateTransitionError otherwise)."""
        transitions.check(expected, desired)
        return self.cas64(self.state_off + slot * 16, expected, desired)

    def load_owner(self, slot: int) -> int:
        return self.load64(self.state_off + slot * 16 + 8)

    def cas_owner(self, slot: int, expected: int, desired: int) -> tuple[bool, int]:
        return self.cas64(self.state_off + slot * 16 + 8, expected, desired)

    # -- header words (acquire loads, release stores, atomic updates) -------------------------------

    def tail(self) -> int:
        """Next free slot (the stored value; recovery repairs one beyond slot_count)."""
        return self.load32(OFF_TAIL)

    def bounded_tail(self) -> int:
        return min(self.load32(OFF_TAIL), self.slot_count)

    def set_tail(self, tail: int) -> None:
        self.store32(OFF_TAIL, tail)

    def sealed(self) -> bool:
        """True once a newer segment took over appends (acquire: the final tail is visible after)."""
        return bool(self.load32(OFF_SEALED))

    def seal(self) -> None:
        self.store32(OFF_SEALED, 1)

    def retired(self) -> bool:
        return bool(self.load32(OFF_RETIRED))

    def begin_retirement(self) -> bool:
        """Set the retired flag; True if this call set it (only one retirer wins)."""
        return self.cas32(OFF_RETIRED, 0, 1)

    def clear_retired(self) -> None:
        self.store32(OFF_RETIRED, 0)

    def change(self) -> int:
        """Bumped whenever a job of this segment returns to READY."""
        return self.load64(OFF_CHANGE)

    def bump_change(self) -> None:
        self.add64(OFF_CHANGE)

    def finished(self) -> int:
        """Records that reached DONE or GONE (may lag after a crash; never decides alone)."""
        return self.load64(OFF_FINISHED)

    def add_finished(self, n: int = 1) -> int:
        """Add ``n``; returns the new count."""
        return self.add64(OFF_FINISHED, n) + n

    def nrecords(self) -> int:
        """Records published (heads below the tail)."""
        return self.load64(OFF_NRECORDS)

    def last_seq(self) -> int:
        """Seq of the last record published here."""
        return self.load64(OFF_LAST_SEQ)

    def publish_tail(self, tail: int, count: int, last_seq: int) -> None:
        """Under the writer lock: ``count`` more records are published, up to slot ``tail``."""
        if count:
            self.add64(OFF_NRECORDS, count)
            self.store64(OFF_LAST_SEQ, last_seq)
            self.store32(OFF_TAIL, tail)

    def sync_header(self) -> None:
        """msync the state file's header page (rotation: the final tail and the seal)."""
        self.msync(0, PAGE)

    def sync_state(self) -> None:
        """msync the whole state file (header and state table): the background state flush."""
        self.msync(0, self.data_off)

    def close(self) -> None:
        if self.mm is None:
            return
        self._states = None
        # A stale reference used after this gets a bounds error from the C helper (size 0).
        self.size = 0
        self.ref.maplen = 0
        self.mm = None
        self.ptr = None
        os.close(self.fd)
        os.close(self.rfd)
