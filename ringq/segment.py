"""Segment and control files: creation, validation, mapping.  Byte layouts: ``docs/format.md``.

A segment is created whole (``posix_fallocate``, then zero-filled so that later msyncs never have to
convert unwritten extents), its header written and fsynced, and only then renamed to its final
name and the directory fsynced: a crash at any point leaves either no segment or a complete empty
one.  A file is validated from ``pread`` bytes *before* it is mapped, and only the length its
header declares -- checked against the file's real size -- is ever mapped, so a truncated or
foreign file is refused instead of raising SIGBUS later.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import struct
import threading
import time

import numpy as np

from . import errors
from ._native import ffi, lib
from .errors import CorruptionError, FormatVersionError, QueueFullError

__all__ = ["Segment", "Control", "PAGE", "FORMAT_VERSION", "segment_name"]

PAGE = 4096
FORMAT_VERSION = 1
SEG_MAGIC = 0x3147455351474E52  # b"RNGQSEG1"
CTL_MAGIC = 0x314C544351474E52  # b"RNGQCTL1"
MAX_SLOT_SIZE = 1 << 20
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

# Control file: static part (CRC-covered) then mutable words.
_CTL_STATIC = struct.Struct("<QIII")
OFF_CTL_CRC = 20
OFF_NEXT_SEQ = 64  # u64: next job seq to assign (reserved before records are written)
OFF_TAIL_SEG = 72  # u64: seq of the segment appends go to
OFF_RING_GEN = 80  # u64: bumped on every rotation and retirement
OFF_WAKE = 88  # u32: futex word; producers bump it and wake sleepers
OFF_WAITERS = 92  # u32: number of consumers asleep on OFF_WAKE
OFF_CTL_CHANGE = 96  # u64: bumped whenever any job returns to READY (hint to rescan)
# Durability words (ringq/durability.py), in the free space after 104.
OFF_SYNCED = 192  # u64: group commit's synced-up-to watermark, a position (seg seq << 24) | slot
OFF_SYNC_COUNT = 200  # u64: append syncs issued by all processes (any strategy); for tests and bench
OFF_SYNC_GEN = 208  # u32: futex word; a group-commit leader bumps it after raising OFF_SYNCED
OFF_LOCK_WAKE = 212  # u32: futex word; a writer releasing the lock bumps it if writers wait
OFF_LOCK_WAITERS = 216  # u32: writers waiting for the writer lock (registered before they retry)
# Cumulative counters since the queue was created (statistics only; never used for a decision).
OFF_ENQUEUED_TOTAL = 224  # u64: jobs enqueued (requeues and relocation copies are not counted)
OFF_ACKED_TOTAL = 232  # u64: leases acked (LEASED -> DONE)
OFF_DEAD_TOTAL = 240  # u64: jobs dead-lettered (nack or reclaim with attempts used up)
OFF_MIN_DEADLINE = 248  # u64: ms since the Unix epoch; no lease of this queue expires before it


def segment_name(name: str, seq: int) -> str:
    """File name of segment ``seq`` of queue ``name``: ``<name>.<seq as 16 hex digits>.seg``."""
    return f"{name}.{seq:016x}.seg"


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``crc``."""
    buf = ffi.from_buffer(data)
    return lib.ringq_crc32c(crc, buf, len(buf))


def _open_nofollow(path: str, flags: int, mode: int = 0o600) -> int:
    """Open a queue file without following a symbolic link; refuse anything but a regular file.

    Raises CorruptionError for a link, a directory, a FIFO, a device or a socket in the place of a
    queue file (O_NONBLOCK: opening a FIFO must not hang); OSError for other failures.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptionError(f"{path}: is a symbolic link; ringq does not follow links in a queue directory") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise CorruptionError(f"{path}: is not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CorruptionError(f"{path}: is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_dir(path: str) -> None:
    """fsync a directory so that names created or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Mapped:
    """A MAP_SHARED mapping of a whole file prefix, with the pointer the C helper needs."""

    __slots__ = ("path", "fd", "mm", "ptr", "size")

    def __init__(self, path: str, fd: int, size: int, readonly: bool = False) -> None:
        self.path = path
        self.fd = fd
        self.size = size
        prot = mmap.PROT_READ if readonly else mmap.PROT_READ | mmap.PROT_WRITE
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        self.ptr = ffi.from_buffer("uint8_t[]", self.mm)

    # Atomic word access (acquire loads, release stores, seq-cst RMW), offsets checked in C.
    def load64(self, off: int) -> int:
        out = _scratch.u64
        errors.check(lib.ringq_load64(self.ptr, self.size, off, out), self.path)
        return out[0]

    def store64(self, off: int, value: int) -> None:
        errors.check(lib.ringq_store64(self.ptr, self.size, off, value), self.path)

    def cas64(self, off: int, expected: int, desired: int) -> tuple[bool, int]:
        out = _scratch.u64
        rc = errors.check(lib.ringq_cas64(self.ptr, self.size, off, expected, desired, out), self.path)
        return rc == 1, out[0]

    def add64(self, off: int, delta: int = 1) -> int:
        out = _scratch.u64
        errors.check(lib.ringq_fetch_add64(self.ptr, self.size, off, delta, out), self.path)
        return out[0]

    def load32(self, off: int) -> int:
        out = _scratch.u32
        errors.check(lib.ringq_load32(self.ptr, self.size, off, out), self.path)
        return out[0]

    def store32(self, off: int, value: int) -> None:
        errors.check(lib.ringq_store32(self.ptr, self.size, off, value), self.path)

    def cas32(self, off: int, expected: int, desired: int) -> bool:
        rc = errors.check(lib.ringq_cas32(self.ptr, self.size, off, expected, desired, ffi.NULL), self.path)
        return rc == 1

    def add32(self, off: int, delta: int = 1) -> int:
        out = _scratch.u32
        errors.check(lib.ringq_fetch_add32(self.ptr, self.size, off, delta & 0xFFFFFFFF, out), self.path)
        return out[0]

    def msync(self, off: int, length: int) -> None:
        errors.check(lib.ringq_msync(self.ptr, self.size, off, length), f"msync {self.path}")

    def close(self) -> None:
        if self.mm is None:
            return
        # A stale reference used after this gets a bounds error from the C helper (every access
        # is checked against the size), never a dereference of the unmapped pages.
        self.size = 0
        ffi.release(self.ptr)
        try:
            self.mm.close()
        except BufferError:
            # A numpy view still exports the buffer; the mapping goes when the view does.
            pass
        os.close(self.fd)
        self.mm = None


class _Scratch(threading.local):
    """Per-thread out-words for the atomics: no allocation per operation.  Per thread, because
    cffi releases the GIL during the C call, so another thread may run while one is in use."""

    def __init__(self) -> None:
        self.u64 = ffi.new("uint64_t *")
        self.u32 = ffi.new("uint32_t *")


_scratch = _Scratch()


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
        fd = _open_nofollow(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
                zeros = bytes(1 << 20)
                done = 0
                while done < size:
                    done += os.pwrite(fd, zeros[: min(len(zeros), size - done)], done)
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
        fd = _open_nofollow(path, os.O_RDONLY if readonly else os.O_RDWR)
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

    def close(self) -> None:
        self._states = None
        super().close()


class Control(Mapped):
    """The queue's control file ``<name>.ctl``: one page of shared words (docs/format.md)."""

    __slots__ = ("slot_size", "slot_count")

    @staticmethod
    def create(path: str, slot_size: int, slot_count: int, mode: int = 0o600) -> None:
        """Create the control file durably (write to a temp name, fsync, rename, fsync dir)."""
        check_geometry(slot_size, slot_count)
        static = _CTL_STATIC.pack(CTL_MAGIC, FORMAT_VERSION, slot_size, slot_count)
        page = bytearray(PAGE)
        page[:20] = static
        struct.pack_into("<I", page, OFF_CTL_CRC, crc32c(static))
        struct.pack_into("<Q", page, OFF_NEXT_SEQ, 1)
        tmp = path + ".tmp"
        try:
            os.unlink(tmp)  # a leftover; never open it: it could be a link to someone else's file
        except FileNotFoundError:
            pass
        fd = _open_nofollow(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.pwrite(fd, bytes(page), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")

    def __init__(self, path: str, readonly: bool = False) -> None:
        fd = _open_nofollow(path, os.O_RDONLY if readonly else os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, 24, 0)
            if size < PAGE or len(head) < 24:
                raise CorruptionError(f"{path}: control file is {size} bytes, expected {PAGE}")
            magic, version, slot_size, slot_count = _CTL_STATIC.unpack_from(head)
            if magic != CTL_MAGIC:
                raise CorruptionError(f"{path}: not a ringq control file (bad magic {head[:8]!r})")
            if version != FORMAT_VERSION:
                raise FormatVersionError(f"{path}: control format version {version}; this ringq reads {FORMAT_VERSION}")
            (crc,) = struct.unpack_from("<I", head, OFF_CTL_CRC)
            if crc != crc32c(head[:20]):
                raise CorruptionError(f"{path}: control file header CRC mismatch")
            check_geometry(slot_size, slot_count)
        except ValueError as exc:
            os.close(fd)
            raise CorruptionError(f"{path}: impossible geometry: {exc}") from None
        except BaseException:
            os.close(fd)
            raise
        super().__init__(path, fd, PAGE, readonly)
        self.slot_size = slot_size
        self.slot_count = slot_count
