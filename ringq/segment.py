"""Segment and control files: creation, validation, mapping.  Byte layouts: ``docs/format.md``.

A segment is created whole (``posix_fallocate``, then zero-filled page by page so that later msyncs
never have to convert unwritten extents, and write back only the pages an append changed), its header written and fsynced, and only then renamed to its final
name and the directory fsynced: a crash at any point leaves either no segment or a complete empty
one.  A file is validated from ``pread`` bytes *before* it is mapped, and only the length its
header declares -- checked against the file's real size -- is ever mapped, so a truncated or
foreign file is refused instead of raising SIGBUS later.
"""

from __future__ import annotations

import os
import struct
import time

import numpy as np

from . import transitions
from ._native import ffi
from .errors import CorruptionError, FormatVersionError, QueueFullError
from .mapped import Mapped, crc32c, fsync_dir, open_nofollow

__all__ = ["Segment", "PAGE", "FORMAT_VERSION", "segment_name", "seg_layout", "check_geometry"]

PAGE = 4096
FORMAT_VERSION = 1
SEG_MAGIC = 0x3147455351474E52  # b"RNGQSEG1"
MAX_SLOT_SIZE = 1 << 20
# Bytes per write of the zero fill.  The page cache keeps a file in folios as large as the writes
# that filled it, and a store through a writable mapping dirties its whole folio: with 1 MiB fill
# writes every msync after an append wrote about 1 MiB (benchmarks/pagecost.c, docs/benchmarks.md).
# Page-sized fill writes keep each sync to the pages actually changed.
FILL_WRITE = 4096
MAX_SLOT_COUNT = 1 << 24  # slot numbers must fit the 24 bits of a ``supersedes`` reference

# Segment header, static part (CRC-covered): magic, version, header size, seq, slot size, slot
# count, epoch ms, state offset, data offset, file size; then the CRC32C of those 64 bytes.
_SEG_STATIC = struct.Struct("<QIIQIIQQQQ")
assert _SEG_STATIC.size == 64
OFF_HDR_CRC = 64
# Mutable words of the segment header page.
OFF_TAIL = 128  # u32: next free slot (writers, under the lock)
OFF_SEALED = 132  # u32: 1 once a newer segment took over appends
OFF_CHANGE = 136  # u64: bumped when a job of this segment returns to READY
OFF_RETIRED = 144  # u32: 1 once retirement began (the file is about to be unlinked)
OFF_FINISHED = 152  # u64: records that reached DONE or GONE
OFF_NRECORDS = 160  # u64: records published (heads below the tail)
OFF_LAST_SEQ = 168  # u64: seq of the last record published here
OFF_JTAIL = 176  # u64: bytes of the ack journal reserved by writers (ringq/ackjournal.py)
OFF_JSIZE = 184  # u64: bytes of the ack journal zero-filled so far


def segment_name(name: str, seq: int) -> str:
    """File name of segment ``seq`` of queue ``name``: ``<name>.<seq as 16 hex digits>.seg``."""
    return f"{name}.{seq:016x}.seg"


def seg_layout(slot_size: int, slot_count: int) -> tuple[int, int, int]:
    """``(state_off, data_off, file_size)`` in bytes for a segment of this geometry."""
    state_off = PAGE
    data_off = state_off + -(-slot_count * 16 // PAGE) * PAGE
    return state_off, data_off, data_off + slot_count * slot_size


def check_geometry(slot_size: int, slot_count: int) -> None:
    """Raise ValueError unless slot_size is a multiple of 64 in [64, 1 MiB] and slot_count in [1, 2**24)."""
    if not (64 <= slot_size <= MAX_SLOT_SIZE) or slot_size % 64:
        raise ValueError(f"slot_size must be a multiple of 64 between 64 and {MAX_SLOT_SIZE} bytes, got {slot_size}")
    if not (1 <= slot_count < MAX_SLOT_COUNT):
        raise ValueError(f"slot_count must be between 1 and {MAX_SLOT_COUNT - 1}, got {slot_count}")


class Segment(Mapped):
    """One mapped segment file.  Attributes are the validated static header fields."""

    __slots__ = ("seq", "slot_size", "slot_count", "epoch_ms", "state_off", "data_off", "geom", "_states")

    @staticmethod
    def create(dirpath: str, name: str, seq: int, slot_size: int, slot_count: int, mode: int = 0o600) -> str:
        """Create segment ``seq`` complete and durable, then link it under its final name.

        Returns the path.  Raises QueueFullError (with the bytes needed and the path) when the
        space cannot be allocated; OSError for other OS failures.  Leaves no partial file behind.
        """
        check_geometry(slot_size, slot_count)
        state_off, data_off, size = seg_layout(slot_size, slot_count)
        final = os.path.join(dirpath, segment_name(name, seq))
        tmp = final + ".tmp"
        try:
            os.unlink(tmp)  # a leftover of a crash during an earlier creation
        except FileNotFoundError:
            pass
        fd = open_nofollow(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
                zeros = bytes(FILL_WRITE)
                done = 0
                while done < size:
                    done += os.pwrite(fd, zeros[: min(FILL_WRITE, size - done)], done)
            except OSError as exc:
                if exc.errno in (28, 27, 122):  # ENOSPC, EFBIG, EDQUOT
                    raise QueueFullError(
                        exc.errno, f"cannot allocate a new segment of {size} bytes at {final}: {os.strerror(exc.errno)}"
                    ) from None
                raise
            static = _SEG_STATIC.pack(
                SEG_MAGIC, FORMAT_VERSION, PAGE, seq, slot_size, slot_count, int(time.time() * 1000),
                state_off, data_off, size,
            )
            os.pwrite(fd, static + struct.pack("<I", crc32c(static)), 0)
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
        fsync_dir(dirpath)
        return final

    def __init__(self, path: str, readonly: bool = False) -> None:
        """Open, validate and map a segment.  ``readonly`` maps it PROT_READ (loads only: for verify)."""
        fd = open_nofollow(path, os.O_RDONLY if readonly else os.O_RDWR)
        try:
            st = os.fstat(fd)
            head = os.pread(fd, 68, 0)
            fields = self._validate(path, head, st.st_size)
        except BaseException:
            os.close(fd)
            raise
        (_m, _v, _h, self.seq, self.slot_size, self.slot_count, self.epoch_ms, self.state_off, self.data_off, size) = fields
        super().__init__(path, fd, size, readonly)
        self.geom = ffi.new("ringq_geom *", {
            "seg_seq": self.seq, "state_off": self.state_off, "data_off": self.data_off,
            "slot_size": self.slot_size, "slot_count": self.slot_count,
        })
        self._states = None

    @staticmethod
    def _validate(path: str, head: bytes, real_size: int) -> tuple:
        if len(head) < 68:
            raise CorruptionError(f"{path}: {real_size} bytes is too short to be a ringq segment")
        fields = _SEG_STATIC.unpack_from(head)
        magic, version, hsize, seq, slot_size, slot_count, _epoch, state_off, data_off, size = fields
        if magic != SEG_MAGIC:
            raise CorruptionError(f"{path}: not a ringq segment (bad magic {head[:8]!r})")
        if version != FORMAT_VERSION:
            raise FormatVersionError(
                f"{path}: segment format version {version}; this ringq reads version {FORMAT_VERSION}"
            )
        (crc,) = struct.unpack_from("<I", head, OFF_HDR_CRC)
        if crc != crc32c(head[:64]):
            raise CorruptionError(f"{path}: segment header CRC mismatch")
        try:
            check_geometry(slot_size, slot_count)
        except ValueError as exc:
            raise CorruptionError(f"{path}: impossible geometry: {exc}") from None
        if hsize != PAGE or (state_off, data_off, size) != seg_layout(slot_size, slot_count):
            raise CorruptionError(f"{path}: header offsets disagree with its geometry")
        if real_size < size:
            raise CorruptionError(
                f"{path}: file is {real_size} bytes but its header declares {size}; truncated by someone else"
            )
        return fields

    @property
    def states(self) -> np.ndarray:
        """``(slot_count, 2)`` uint64 view of the state table: column 0 state word, 1 owner word.

        Plain loads: good for counting and hints, never for decisions (those go through CAS).
        """
        if self._states is None:
            self._states = np.frombuffer(self.mm, dtype="<u8", count=2 * self.slot_count, offset=self.state_off).reshape(-1, 2)
        return self._states

    def state_off_of(self, slot: int) -> int:
        return self.state_off + slot * 16

    def load_state(self, slot: int) -> int:
        """The state word of ``slot`` (acquire load)."""
        return self.load64(self.state_off + slot * 16)

    def cas_state(self, slot: int, expected: int, desired: int) -> tuple[bool, int]:
        """CAS the state word of ``slot``; ``(swapped, current word)``.  The change must be a
        transition of ringq/transitions.py (StateTransitionError otherwise)."""
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
        self.msync(0, PAGE)

    def close(self) -> None:
        self._states = None
        super().close()


