"""Files mapped MAP_SHARED, and the word operations the C helper does on them.

``Mapped`` is the one way Python touches a shared word: acquire loads, release stores, seq-cst CAS
and fetch-add, futex wait and wake, msync, all through the C helper, which checks every offset
against the mapping's length (a stale reference after ``close`` gets a bounds error, never a
dereference of unmapped pages).  Also here: opening queue files without following links, CRC32C,
and fsync of a directory.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading
import time
from typing import Any

from ringq.errors import CorruptionError, QueueFullError

from . import native
from ._native import ffi, lib

__all__ = ["Mapped", "Watch", "crc32c", "open_nofollow", "fsync_dir"]


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``crc``."""
    buf = ffi.from_buffer(data)
    return lib.ringq_crc32c(crc, buf, len(buf))


def write_whole(fd: int, data: bytes, size: int, path: str) -> None:
    """Write ``data`` at offset 0 of the new file ``fd`` and allocate it to ``size`` bytes (never
    sparse: a page the disk cannot hold would be SIGBUS when read through a mapping).  Raises
    QueueFullError when the disk, a quota or a file size limit (RLIMIT_FSIZE) leaves no room: a
    short write included, which would leave a file of an impossible size."""
    try:
        written = os.pwrite(fd, data, 0)
        if written == len(data) and size > len(data):
            os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in native.FULL:
            raise
        raise QueueFullError(
            exc.errno, f"cannot write {path} ({size} bytes): {os.strerror(exc.errno)}"
        ) from None
    if written != len(data):
        raise QueueFullError(
            errno.ENOSPC,
            f"cannot write {path} ({size} bytes): short write (no room, or a file size limit)",
        )


def open_nofollow(path: str, flags: int, mode: int = 0o600) -> int:
    """Open a queue file without following a symbolic link; refuse anything but a regular file.

    Raises CorruptionError for a link, a directory, a FIFO, a device or a socket in the place of a
    queue file (O_NONBLOCK: opening a FIFO must not hang); OSError for other failures.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptionError(
                f"{path}: is a symbolic link; ringq does not follow links in a queue directory"
            ) from None
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
        # The buffer over the mapping (an mmap here, a cffi buffer for a segment's pair of
        # files), None once closed.
        self.mm: Any = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        self.ptr = ffi.from_buffer("uint8_t[]", self.mm)

    # Atomic word access (acquire loads, release stores, seq-cst RMW), offsets checked in C.
    def load64(self, off: int) -> int:
        out = _scratch.u64
        native.check(lib.ringq_load64(self.ptr, self.size, off, out), self.path)
        return out[0]

    def store64(self, off: int, value: int) -> None:
        native.check(lib.ringq_store64(self.ptr, self.size, off, value), self.path)

    def cas64(self, off: int, expected: int, desired: int) -> tuple[bool, int]:
        out = _scratch.u64
        rc = native.check(
            lib.ringq_cas64(self.ptr, self.size, off, expected, desired, out), self.path
        )
        return rc == 1, out[0]

    def add64(self, off: int, delta: int = 1) -> int:
        out = _scratch.u64
        native.check(lib.ringq_fetch_add64(self.ptr, self.size, off, delta, out), self.path)
        return out[0]

    def load32(self, off: int) -> int:
        out = _scratch.u32
        native.check(lib.ringq_load32(self.ptr, self.size, off, out), self.path)
        return out[0]

    def load32_64(self, off32: int, off64: int) -> tuple[int, int]:
        """The u32 at ``off32`` and the u64 at ``off64``, each an acquire load, in that order
        (one Python call for two words a hot path compares together)."""
        s = _scratch
        rc = lib.ringq_load32_64(self.ptr, self.size, off32, off64, s.u32, s.u64)
        if rc:
            native.check(rc, self.path)
        return s.u32[0], s.u64[0]

    def store32(self, off: int, value: int) -> None:
        native.check(lib.ringq_store32(self.ptr, self.size, off, value), self.path)

    def cas32(self, off: int, expected: int, desired: int) -> bool:
        rc = native.check(
            lib.ringq_cas32(self.ptr, self.size, off, expected, desired, ffi.NULL), self.path
        )
        return rc == 1

    def add32(self, off: int, delta: int = 1) -> int:
        out = _scratch.u32
        native.check(
            lib.ringq_fetch_add32(self.ptr, self.size, off, delta & 0xFFFFFFFF, out), self.path
        )
        return out[0]

    def futex_wait(self, off: int, expected: int, timeout: float) -> None:
        """Sleep while the u32 at ``off`` equals ``expected``, at most ``timeout`` seconds.

        Returns early on a wake-up, a change of the word or a signal; where futex(2) is missing
        it sleeps a short slice instead (callers re-check their condition in a loop)."""
        rc = lib.ringq_futex_wait(self.ptr, self.size, off, expected, int(max(timeout, 0.0) * 1e9))
        if native.futex_missing(rc):
            time.sleep(min(timeout, 0.005))

    def futex_wake(self, off: int, n: int = 0x7FFFFFFF) -> None:
        """Wake up to ``n`` processes sleeping on the u32 at ``off``."""
        lib.ringq_futex_wake(self.ptr, self.size, off, n)

    def msync(self, off: int, length: int) -> None:
        native.check(lib.ringq_msync(self.ptr, self.size, off, length), f"msync {self.path}")

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


class Watch:
    """Words of shared mappings that a hot path compares, in one C call (ringq_watch), with what
    they read at its last :meth:`reset`: ``words`` are ``(mapping, offset, width)``, width 4 or 8.

    The caller keeps the mappings open while it uses the watch (a closed mapping's words are not
    checked against its new size): a queue's watch is used and dropped under the queue's lock,
    under which its mappings are closed.  Not thread-safe on its own (the lock serialises it)."""

    __slots__ = ("maps", "_w", "_n", "_from")

    def __init__(self, words: list[tuple[Mapped, int, int]]) -> None:
        self.maps = [m for m, _, _ in words]  # referenced for as long as the watch lives
        self._n = len(words)
        self._w = ffi.new("ringq_watched[]", max(1, self._n))
        for i, (m, off, width) in enumerate(words):
            e = self._w[i]
            e.base, e.maplen, e.off, e.width = m.ptr, m.size, off, width
        # A pointer to each word's entry: :meth:`same` makes none per call.
        self._from = [self._w + i for i in range(self._n + 1)]
        self.reset()

    def same(self, first: int = 0) -> bool:
        """True if every word from the ``first``-th on reads as at the last reset (an acquire load
        each)."""
        rc = lib.ringq_watch(self._from[first], self._n - first, 0)
        if rc < 0:
            native.check(rc, self.maps[0].path)
        return rc == 1

    def reset(self) -> None:
        """Take the words' values now as what :meth:`same` compares with."""
        native.check(lib.ringq_watch(self._w, self._n, 1), self.maps[0].path if self.maps else "")
