"""The control file ``<name>.ctl``: one page of queue-wide shared words (docs/format.md).

Geometry of new segments, the next job seq, the tail segment, the ring generation, the futex words
that consumers, lock waiters and group-commit followers sleep on, cumulative counters, and the
lease-deadline floor.  Its operations are here too, so that no other module spells an offset.
"""

from __future__ import annotations

import os
import struct

from ringq.errors import CorruptionError, FormatVersionError

from . import native
from ._native import ffi, lib
from .mapped import Mapped, crc32c, fsync_dir, open_nofollow, write_whole
from .segment import PAGE, check_geometry

CTL_VERSION = 1  # the control page's own layout (unchanged by segment format 2)

__all__ = ["Control"]

CTL_MAGIC = 0x314C544351474E52  # b"RNGQCTL1"
# Control file: static part (CRC-covered) then mutable words.
_CTL_STATIC = struct.Struct("<QIII")
OFF_CTL_CRC = 20
# u64: random, written when the file is created (0 in a file made before it existed): with the
# file's device and inode it makes the queue's identity, so that a queue deleted and created again
# at the same path (its control file may get the old inode) is another queue to old snapshots.
OFF_INSTANCE = 24
OFF_NEXT_SEQ = 64  # u64: next job seq to assign (reserved before records are written)
OFF_TAIL_SEG = 72  # u64: seq of the segment appends go to
OFF_RING_GEN = 80  # u64: bumped on every rotation and retirement
OFF_WAKE = 88  # u32: futex word; producers bump it and wake sleepers
# u32: consumers asleep on OFF_WAKE: each adds 1, and one asleep in ringq_wait_claim adds
# WAITER_CLAIMS more (the high 16 bits count those: csrc/ringq.h, RINGQ_CLAIM_WAITER).
OFF_WAITERS = 92
WAITER_CLAIMS = 1 << 16
OFF_CTL_CHANGE = 96  # u64: bumped whenever any job returns to READY (hint to rescan)
OFF_BOOT = (
    104  # 16 bytes: the kernel boot id of the boot in which recovery last ran (zero: unknown)
)
# Durability words (ringq/engine/durability.py), in the free space after 104.
OFF_SYNCED = 192  # u64: group commit's synced-up-to watermark, a position (seg seq << 24) | slot
OFF_SYNC_COUNT = (
    200  # u64: append syncs issued by all processes (any strategy); for tests and bench
)
OFF_SYNC_GEN = 208  # u32: futex word; a group-commit leader bumps it after raising OFF_SYNCED
OFF_LOCK_WAKE = 212  # u32: futex word; a writer releasing the lock bumps it if writers wait
OFF_LOCK_WAITERS = 216  # u32: writers waiting for the writer lock (registered before they retry)
# Cumulative counters since the queue was created (statistics only; never used for a decision).
OFF_ENQUEUED_TOTAL = 224  # u64: jobs enqueued (requeues and relocation copies are not counted)
OFF_ACKED_TOTAL = 232  # u64: leases acked (LEASED -> DONE)
OFF_DEAD_TOTAL = 240  # u64: jobs dead-lettered (nack or reclaim with attempts used up)
OFF_MIN_DEADLINE = 248  # u64: ms since the Unix epoch; no lease of this queue expires before it
# u64: +1 after every record of a DEFERRED job is published (ringq/engine/deps.py): a process
# whose index caught up after reading it knows every dependent published before; 0 in a queue
# that never had one, so a finished job looks for dependents only when it is not.
OFF_DEPS = 256
_U64 = struct.Struct("<Q")
# The words above that the C helper's one-call append and ack update themselves.  With
# CTL_WORDS_WAKE the one-call append also wakes sleeping consumers (Control.wake).
_WORDS = {
    "tail_seg": OFF_TAIL_SEG,
    "next_seq": OFF_NEXT_SEQ,
    "enqueued": OFF_ENQUEUED_TOTAL,
    "acked": OFF_ACKED_TOTAL,
    "lock_waiters": OFF_LOCK_WAITERS,
    "lock_wake": OFF_LOCK_WAKE,
}
CTL_WORDS = ffi.new("ringq_ctl_words *", _WORDS)
CTL_WORDS_WAKE = ffi.new("ringq_ctl_words *", {**_WORDS, "wake": OFF_WAKE, "waiters": OFF_WAITERS})


class Control(Mapped):
    """The queue's control file ``<name>.ctl``: one page of shared words (docs/format.md)."""

    __slots__ = ("slot_size", "slot_count", "ref", "ref_addr")

    @staticmethod
    def create(path: str, slot_size: int, slot_count: int, mode: int = 0o600) -> None:
        """Create the control file durably (write to a temp name, fsync, rename, fsync dir)."""
        check_geometry(slot_size, slot_count)
        static = _CTL_STATIC.pack(CTL_MAGIC, CTL_VERSION, slot_size, slot_count)
        page = bytearray(PAGE)
        page[:20] = static
        struct.pack_into("<I", page, OFF_CTL_CRC, crc32c(static))
        struct.pack_into("<Q", page, OFF_NEXT_SEQ, 1)
        struct.pack_into("<Q", page, OFF_INSTANCE, int.from_bytes(os.urandom(8), "little") or 1)
        tmp = path + ".tmp"
        try:
            os.unlink(tmp)  # a leftover; never open it: it could be a link to someone else's file
        except FileNotFoundError:
            pass
        fd = open_nofollow(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            write_whole(fd, bytes(page), PAGE, f"the control file {path}")
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        os.close(fd)
        os.rename(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")

    def __init__(self, path: str, readonly: bool = False) -> None:
        fd = open_nofollow(path, os.O_RDONLY if readonly else os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, 24, 0)
            if size < PAGE or len(head) < 24:
                raise CorruptionError(f"{path}: control file is {size} bytes, expected {PAGE}")
            magic, version, slot_size, slot_count = _CTL_STATIC.unpack_from(head)
            if magic != CTL_MAGIC:
                raise CorruptionError(f"{path}: not a ringq control file (bad magic {head[:8]!r})")
            if version != CTL_VERSION:
                raise FormatVersionError(
                    f"{path}: control format version {version}; this ringq reads {CTL_VERSION}"
                )
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
        # The handle the per-job calls take (ringq_ctl_ref); a caller keeps ``ptr`` while using it.
        self.ref = ffi.new(
            "ringq_ctl_ref *",
            {
                "base": self.ptr,
                "len": PAGE,
                "words": CTL_WORDS,
                "deps": OFF_DEPS,
                "floor": OFF_MIN_DEADLINE,
                "floor_gen_bits": self.FLOOR_GEN_BITS,
            },
        )
        self.ref_addr = int(ffi.cast("uintptr_t", self.ref))  # the handle for ringq.engine._jobs

    def close(self) -> None:
        self.ref.len = 0  # before the unmap: a call through the handle then fails its bounds check
        super().close()

    # -- wake-ups ----------------------------------------------------------------------------------

    def wake(self, appended: bool = False) -> None:
        """Bump the wake word and wake sleeping consumers (a syscall only if someone sleeps).

        ``appended``: the news is records appended, and nothing else.  Such a wake-up moves the
        word by 1 (as the appends of csrc/append.c do), any other by 2: a consumer in
        ringq_wait_claim that finds one step and every new job taken knows that nothing else
        happened, and sleeps on."""
        self.add32(OFF_WAKE, 1 if appended else 2)
        if self.load32(OFF_WAITERS):
            self.futex_wake(OFF_WAKE)

    def sleepers(self) -> int:
        """How many consumers are asleep on the wake word now (in every process)."""
        return self.load32(OFF_WAITERS) % WAITER_CLAIMS

    def wake_word(self) -> int:
        return self.load32(OFF_WAKE)

    def sleep(self, seen: int, timeout: float, spin: float = 0.0) -> None:
        """Sleep until the wake word moves from ``seen`` or ``timeout`` seconds pass.

        ``spin``: first poll the word for up to this many seconds (ringq_spin_wait) without
        registering as a sleeper, so a producer that bumps it meanwhile makes no syscall and this
        process sees the bump within about a microsecond; then sleep on the futex."""
        if timeout <= 0:
            return
        if spin > 0:
            rc = lib.ringq_spin_wait(
                self.ptr, self.size, OFF_WAKE, seen, int(min(spin, timeout) * 1e9)
            )
            if native.check(rc, self.path) == 0:
                return
            timeout -= spin
            if timeout <= 0:
                return
        self.add32(OFF_WAITERS, 1)
        try:
            self.futex_wait(OFF_WAKE, seen, timeout)
        finally:
            self.add32(OFF_WAITERS, -1)

    def note_returned(self) -> None:
        """A job went back to READY somewhere: readers look again."""
        self.add64(OFF_CTL_CHANGE)
        self.wake()

    def change_counter(self) -> int:
        return self.load64(OFF_CTL_CHANGE)

    # -- the boot recovery last ran in ----------------------------------------------------------------

    def boot_id(self) -> bytes:
        """The 16-byte boot id recovery stored (``recovery.this_boot``), zeros if none."""
        return bytes(self.mm[OFF_BOOT : OFF_BOOT + 16])

    def set_boot_id(self, boot: bytes) -> None:
        """Under the writer lock, at open."""
        self.mm[OFF_BOOT : OFF_BOOT + 16] = boot

    # -- queue-wide words --------------------------------------------------------------------------

    def next_seq(self) -> int:
        return self.load64(OFF_NEXT_SEQ)

    def tail_seq(self) -> int:
        """Seq of the segment appends go to."""
        return self.load64(OFF_TAIL_SEG)

    def set_next_seq(self, seq: int) -> None:
        self.store64(OFF_NEXT_SEQ, seq)

    def set_tail_seq(self, seq: int) -> None:
        self.store64(OFF_TAIL_SEG, seq)

    def ring_gen(self) -> int:
        """Bumped on every rotation and retirement."""
        return self.load64(OFF_RING_GEN)

    def stamp(self) -> tuple[int, int]:
        """``(wake word, ring generation)``: they move on every append or return to READY, and on
        every rotation or retirement (what a catch-up compares to know nothing moved)."""
        return self.load32_64(OFF_WAKE, OFF_RING_GEN)

    def stamp_words(self) -> list[tuple[Mapped, int, int]]:
        """The words :meth:`stamp` reads, as ``(mapping, offset, width)`` for a Watch."""
        return [(self, OFF_WAKE, 4), (self, OFF_RING_GEN, 8)]

    def instance(self) -> int:
        """The random number written when the file was created (OFF_INSTANCE; 0: an older file)."""
        return self.load64(OFF_INSTANCE)

    def bump_ring_gen(self) -> None:
        self.add64(OFF_RING_GEN)

    def sync_count(self) -> int:
        """Append syncs issued on this queue by all processes since it was created."""
        return self.load64(OFF_SYNC_COUNT)

    def lock_waiters(self) -> int:
        """Writers waiting for the writer lock now."""
        return self.load32(OFF_LOCK_WAITERS)

    def sync_page(self) -> None:
        """msync the control page (its words outlive a power loss from here on)."""
        self.msync(0, PAGE)

    # -- dependents ---------------------------------------------------------------------------------

    def deps_count(self) -> int:
        """The dependents counter (OFF_DEPS) by a plain aligned load, the cheapest there is: the
        ack path reads it after every CAS.  ringq/engine/deps.py's ordering argument needs the
        load after the finisher's CAS, which the CAS's locked instruction gives on x86; where a
        CPU may reorder them, a dependent missed this way is released by the next sweep."""
        n: int = _U64.unpack_from(self.mm, OFF_DEPS)[0]
        return n

    def bump_deps(self) -> None:
        """A DEFERRED job's record was just published (or found with the counter at 0)."""
        self.add64(OFF_DEPS)

    # -- cumulative counters -----------------------------------------------------------------------

    COUNTERS = {"enqueued": OFF_ENQUEUED_TOTAL, "acked": OFF_ACKED_TOTAL, "dead": OFF_DEAD_TOTAL}

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to a cumulative counter (``"enqueued"``, ``"acked"``, ``"dead"``)."""
        if n:
            self.add64(self.COUNTERS[what], n)

    def totals(self) -> dict[str, int]:
        """The cumulative counters: ``{"enqueued": n, "acked": n, "dead": n}`` since creation."""
        return {k: self.load64(off) for k, off in self.COUNTERS.items()}

    # -- the lease-deadline floor ------------------------------------------------------------------
    # One word says when the earliest lease of the queue may expire, so that a reader scans the
    # state tables for expired leases when that moment comes instead of on a fixed period: an
    # expired lease is leasable again within milliseconds of its deadline, and nobody scans per
    # lease.  It packs (deadline ms since the Unix epoch << FLOOR_GEN_BITS) | generation.  Every
    # claimer lowers the deadline to its own if that is earlier and bumps the generation (one CAS);
    # a scanner may raise it to the earliest deadline it saw only if the generation did not move
    # since it read the word *before* its scan -- otherwise a lease it did not see could be hidden.

    FLOOR_GEN_BITS = 20
    FLOOR_NEVER = (1 << 44) - 1  # ms: no lease known

    def deadline_floor(self) -> tuple[int, int]:
        """``(word, ms)``: the raw floor word (pass it to :meth:`raise_deadline_floor`) and its deadline."""
        w = self.load64(OFF_MIN_DEADLINE)
        return w, w >> self.FLOOR_GEN_BITS

    def lower_deadline_floor(self, ms: int) -> None:
        """A lease expiring at ``ms`` (ms since the epoch) was just taken."""
        ms = min(max(ms, 0), self.FLOOR_NEVER)
        native.check(
            lib.ringq_lower_packed64(
                self.ptr, self.size, OFF_MIN_DEADLINE, self.FLOOR_GEN_BITS, ms
            ),
            self.path,
        )

    def raise_deadline_floor(self, seen: int, ms: int) -> bool:
        """After a full scan begun when the floor word was ``seen``: set the floor to ``ms`` (the
        earliest deadline the scan saw), unless a lease was taken since.  True if it was set."""
        ms = min(max(ms, 0), self.FLOOR_NEVER)
        mask = (1 << self.FLOOR_GEN_BITS) - 1
        return self.cas64(
            OFF_MIN_DEADLINE, seen, (ms << self.FLOOR_GEN_BITS) | ((seen + 1) & mask)
        )[0]
