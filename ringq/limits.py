"""Cross-process limits: concurrency caps, rate limits and unique windows, in shared memory.

Theory of operation
-------------------
A job may carry a *key* (``enqueue(..., key="tenant-7")``; stored in the record, see
``ringq/codec.py``).  A *limit* is named after a key, or after the queue itself (its *kind*: a
limit named like the queue applies to every job of it).  Limits live in ``<name>.limits``, a
fixed-layout file every process maps (docs/limits.md has the layout):

* **Concurrency cap** ``c``: the cap of limit *i* is ``c`` one-byte ranges of the limits file,
  starting at ``LOCK_BASE + i * MAX_CONCURRENCY`` (far past its end: a lock needs no bytes).  A
  lease of a keyed job first takes an exclusive OFD lock (``F_OFD_SETLK``, as the owner locks of
  ringq/owner.py) on one free byte of its key's range; no free byte means the key is at its cap
  and the job stays READY.  The byte is unlocked at ack or nack; the kernel drops it when the
  holder dies, however it dies, so a SIGKILLed holder's slot is free at once.
* **Rate limit** ``n`` per ``per`` seconds: a token bucket kept in one 64-bit word, changed only
  by compare-and-swap, so it is exact across processes.  The word holds the bucket in its
  virtual-scheduling form (the generic cell rate algorithm of ITU-T I.371): the time, in ns since
  the Unix epoch, at which the bucket would be full again.  A token is due when that time is at
  most ``(burst - 1) * per / n`` ahead of now; taking one moves it ``per / n`` further.  A lease
  that finds no token leaves the job READY and sleeps until the next token is due.
* **Unique window**: ``enqueue(..., key=k, unique_for=s)`` records ``(hash of k, expiry, job id)``
  in a table of the same file, under an ``flock`` of it; an enqueue of ``k`` while an entry is
  live returns the job that opened the window instead of adding one.

Settings are written under the ``flock`` and published with a sequence lock (a generation word that
is odd while a writer changes entries); readers copy the table when the generation moves.  A writer
killed mid-change leaves the generation odd: the next reader that can take the ``flock`` re-checks
every entry's CRC, drops torn ones and makes the generation even again.
"""

from __future__ import annotations

import fcntl
import hashlib
import heapq
import math
import numbers
import os
import random
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import codec, errors, forksafe, lifecycle
from ._native import lib
from .errors import LimitError, LimitsFileError
from .mapped import Mapped, crc32c, fsync_dir
from .mapped import open_nofollow as _open_nofollow
from .segment import Segment
from .words import LC_MASK, ST_LEASED

__all__ = ["LimitGate", "LimitInfo", "MAX_LIMITS", "MAX_CONCURRENCY", "MAX_UNIQUE"]

MAGIC = 0x314D494C51474E52  # bytes "RNGQLIM1"
VERSION = 1
PAGE = 4096
MAX_LIMITS = 64
ENTRY = 256
MAX_UNIQUE = 1024
UENTRY = 128
MAX_UNIQUE_ID = 96  # bytes of job id a unique entry keeps
MAX_CONCURRENCY = 4096
MAX_NAME = codec.MAX_KEY_BYTES
LOCK_BASE = 1 << 30  # first lock byte of cap slots: far past the end of the file
OFF_GEN = 64
OFF_ENTRIES = PAGE
OFF_UNIQUE = PAGE + MAX_LIMITS * ENTRY
FILE_SIZE = OFF_UNIQUE + MAX_UNIQUE * UENTRY
_HEAD = struct.Struct(
    "<QIIIIII"
)  # magic, version, max limits, entry size, max unique, unique entry size, max cap
OFF_HCRC = _HEAD.size
# limit entry: used u32, name length u32, cap u32, rate count u32, per f64, burst u32, CRC u32 (of
# bytes 0..28 and the name), then the bucket word at 32 and the name at 64.
_ENT = struct.Struct("<IIIIdI")
E_CRC, E_BUCKET, E_NAME = 28, 32, 64
# unique entry: key hash u64, expires (ms since the epoch) u64, job id length u16, job id at 32.
_UNI = struct.Struct("<QQH")
U_EXPIRES, U_ID = 8, 32
LATE_SLACK = (
    0.05  # seconds of tokens the default burst holds: a consumer woken late keeps its token
)
MAX_UNIQUE_FOR = 86400 * 366 * 30  # seconds: the longest unique window (about 30 years)
BUCKET_SLACK_NS = 1_000_000_000  # a bucket time this far past its possible maximum is damage
CAP_RECHECK = 0.25  # seconds a lease blocked only by caps sleeps before trying again
REOFFER = 8  # blocked jobs per limit offered again per lease attempt


@dataclass(frozen=True)
class LimitInfo:
    """One limit as configured, plus its live use.

    Attributes:
        name: the key (or the queue's name: the limit of the whole queue) it applies to.
        concurrency: most leases of jobs with this key held at once, or None.
        rate: ``(count, per seconds)``, or None.
        burst: tokens the bucket holds when full: how many jobs may start at once after an idle
            spell (default: the tokens of 50 ms, at least 2); None without a rate.
        running: leases holding a cap slot now (0 without a cap).
        next_token_in: seconds until the next token is due (0 if one is available; None without a rate).
    """

    name: str
    concurrency: int | None
    rate: tuple[int, float] | None
    burst: int | None
    running: int
    next_token_in: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "rate": None if self.rate is None else list(self.rate),
            "burst": self.burst,
            "running": self.running,
            "next_token_in": self.next_token_in,
        }


@dataclass(slots=True)
class _Limit:
    index: int
    concurrency: int
    rate_n: int
    per: float
    burst: int

    @property
    def interval_ns(self) -> int:
        return max(1, int(round(self.per * 1e9 / self.rate_n)))


@dataclass(slots=True)
class _Ticket:
    """What one admitted lease holds: cap slots ``(limit index, byte)`` and tokens ``(limit index, interval)``."""

    slots: list[tuple[int, int]] = field(default_factory=list)
    tokens: list[tuple[int, int]] = field(default_factory=list)


def _check_rate(rate: Any) -> tuple[int, float]:
    """``(count, per)`` of a rate: a 2-tuple (or list) of an int >= 1 and finite seconds > 0."""
    ok = isinstance(rate, (tuple, list)) and len(rate) == 2
    if ok:
        n, per = rate
        ok = (
            isinstance(n, numbers.Integral)
            and not isinstance(n, bool)
            and 1 <= n <= 0xFFFFFFFF
            and isinstance(per, numbers.Real)
            and not isinstance(per, bool)
            and math.isfinite(per)
            and per > 0
        )
    if not ok:
        raise LimitError(
            "rate must be a 2-tuple (count, per): an int count in [1, 2**32 - 1] and a finite "
            f"number of seconds per > 0, got {rate!r}"
        )
    return int(n), float(per)


def _lock_off(index: int, j: int) -> int:
    return LOCK_BASE + index * MAX_CONCURRENCY + j


def create(path: str, mode: int = 0o600) -> None:
    """Create ``path`` durably and atomically (never replacing a file another process created)."""
    page = bytearray(PAGE)
    _HEAD.pack_into(page, 0, MAGIC, VERSION, MAX_LIMITS, ENTRY, MAX_UNIQUE, UENTRY, MAX_CONCURRENCY)
    struct.pack_into("<I", page, OFF_HCRC, crc32c(bytes(page[: _HEAD.size])))
    tmp = f"{path}.{os.getpid()}.{random.getrandbits(32):08x}.tmp"
    fd = _open_nofollow(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.pwrite(fd, bytes(page), 0)
        os.ftruncate(fd, FILE_SIZE)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another process created it first: theirs is kept
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    fsync_dir(os.path.dirname(path) or ".")


def _open(path: str) -> Mapped:
    """Map ``path`` after validating it from ``pread`` bytes.  Raises LimitsFileError."""
    fd = _open_nofollow(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, OFF_HCRC + 4, 0)
        if size != FILE_SIZE or len(head) < OFF_HCRC + 4:
            raise LimitsFileError(f"{path}: limits file is {size} bytes, expected {FILE_SIZE}")
        magic, version, *geometry = _HEAD.unpack_from(head)
        if magic != MAGIC:
            raise LimitsFileError(f"{path}: not a ringq limits file (bad magic {head[:8]!r})")
        if version != VERSION:
            raise LimitsFileError(
                f"{path}: limits format version {version}; this ringq reads {VERSION}"
            )
        if struct.unpack_from("<I", head, OFF_HCRC)[0] != crc32c(head[: _HEAD.size]):
            raise LimitsFileError(f"{path}: limits file header CRC mismatch")
        if geometry != [MAX_LIMITS, ENTRY, MAX_UNIQUE, UENTRY, MAX_CONCURRENCY]:
            raise LimitsFileError(f"{path}: limits file geometry {geometry} is not this ringq's")
    except BaseException:
        os.close(fd)
        raise
    return Mapped(path, fd, FILE_SIZE)


def _entry(mm: Any, i: int) -> tuple[bool, str | None, _Limit | None]:
    """``(used, name, limit)`` of entry ``i``; a used entry that is torn or damaged gives
    ``(True, None, None)``."""
    base = OFF_ENTRIES + i * ENTRY
    raw = bytes(mm[base : base + E_NAME + MAX_NAME])
    used, nlen, conc, rate_n, per, burst = _ENT.unpack_from(raw)
    if not used:
        return False, None, None
    ok = nlen <= MAX_NAME and struct.unpack_from("<I", raw, E_CRC)[0] == crc32c(
        raw[:E_CRC] + raw[E_NAME : E_NAME + nlen]
    )
    if not ok or conc > MAX_CONCURRENCY or (rate_n and not (math.isfinite(per) and per > 0)):
        return True, None, None
    try:
        name = raw[E_NAME : E_NAME + nlen].decode("utf-8", "strict")
    except UnicodeDecodeError:
        return True, None, None
    return True, name, _Limit(i, conc, rate_n, per, max(1, burst))


def _parse(mm: Any, path: str, strict: bool) -> dict[str, _Limit]:
    """The valid entries of the table.  A damaged entry raises LimitsFileError if ``strict``,
    else is skipped."""
    out: dict[str, _Limit] = {}
    for i in range(MAX_LIMITS):
        used, name, lim = _entry(mm, i)
        if used and lim is None:
            if strict:
                raise LimitsFileError(
                    f"{path}: limit entry {i} is damaged (CRC mismatch or impossible values)"
                )
            continue
        if lim is not None and name:
            out[name] = lim
    return out


class LimitGate:
    """One queue's limits as one process sees them; the Queue calls it around each lease.

    Not for direct use: :meth:`ringq.Queue.limit`, :meth:`ringq.Queue.limits` and ``enqueue``'s
    ``key`` and ``unique_for`` arguments are the public interface.  Callers serialise calls (the
    Queue holds its lock).
    """

    STAT_INTERVAL = 0.5  # seconds between looks for a limits file created by another process

    def __init__(self, directory: str | os.PathLike[str], name: str, mode: int = 0o600) -> None:
        self.path = os.path.join(directory, f"{name}.limits")
        self.kind = name
        self.mode = mode
        self._map: Mapped | None = None
        self._lockfd = -1
        self._pid = os.getpid()
        self._next_look = 0.0
        self._gen = -1
        self._cfg: dict[str, _Limit] = {}
        self._keys: dict[tuple[int, int], str | None] = {}
        self._held: dict[
            tuple[int, int], tuple[_Ticket, Segment, int]
        ] = {}  # job loc -> ticket, segment, lease count
        self._mine: dict[tuple[int, int], tuple[int, int]] = {}  # (limit index, byte) -> job loc
        self._blocked: dict[str, list[tuple]] = {}
        self._blocked_set: set[tuple[int, int]] = set()
        self._due: dict[str, int] = {}  # limit name -> ns when its next token is due
        self._mutex = threading.RLock()
        forksafe.register(self)

    # -- the file ----------------------------------------------------------------------------------

    def drop_inherited_locks(self) -> None:
        """In a forked child: close the copy of the parent's lock descriptor (its cap slots are
        the parent's) and forget what the parent held."""
        if self._lockfd >= 0:
            os.close(self._lockfd)
        self._lockfd = -1
        self._held.clear()
        self._mine.clear()
        self._pid = os.getpid()

    def _lock_fd(self) -> int:
        if self._lockfd < 0 or self._pid != os.getpid():
            self._lockfd = _open_nofollow(self.path, os.O_RDWR)
            self._pid = os.getpid()
        return self._lockfd

    def _mapped(self, create_missing: bool = False) -> Mapped | None:
        if self._map is not None:
            return self._map
        if not create_missing:
            now = time.monotonic()
            if now < self._next_look:
                return None
            self._next_look = now + self.STAT_INTERVAL
        try:
            m = _open(self.path)
        except FileNotFoundError:
            if not create_missing:
                return None
            create(self.path, self.mode)
            m = _open(self.path)
        try:
            if not m.load64(OFF_GEN) & 1:  # odd: a writer is (or died) mid-change; repaired on read
                _parse(m.mm, self.path, strict=True)
        except BaseException:
            m.close()
            raise
        self._map = m
        return m

    def _flock(self) -> _Flock:
        return _Flock(self._lock_fd())

    def _config(self) -> dict[str, _Limit]:
        m = self._mapped()
        if m is None:
            return {}
        gen = m.load64(OFF_GEN)
        if gen == self._gen:
            return self._cfg
        while True:
            gen = m.load64(OFF_GEN)
            if gen & 1:
                self._repair_if_abandoned(m)
                time.sleep(0.0005)
                continue
            cfg = _parse(m.mm, self.path, strict=False)
            if m.load64(OFF_GEN) == gen:
                self._gen, self._cfg = gen, cfg
                return cfg

    def _repair_if_abandoned(self, m: Mapped) -> None:
        """An odd generation with nobody holding the flock: its writer died mid-change."""
        fd = self._lock_fd()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        try:
            gen = m.load64(OFF_GEN)
            if gen & 1:
                for i in range(MAX_LIMITS):
                    used, _name, lim = _entry(m.mm, i)
                    if used and lim is None:
                        base = OFF_ENTRIES + i * ENTRY
                        m.mm[base : base + 4] = bytes(4)  # torn by the dead writer: drop the entry
                m.store64(OFF_GEN, gen + 1)
                m.msync(0, FILE_SIZE)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._mutex:
            for loc in list(self._held):
                self.release(loc)
            if self._lockfd >= 0 and self._pid == os.getpid():
                os.close(self._lockfd)
            self._lockfd = -1
            if self._map is not None:
                self._map.close()
                self._map = None

    # -- configuration ---------------------------------------------------------------------------

    def set_limit(
        self,
        name: str,
        concurrency: int | None,
        rate: tuple[float, float] | None,
        burst: int | None,
    ) -> None:
        """Create, change or (with neither ``concurrency`` nor ``rate``) remove the limit ``name``."""
        if not isinstance(name, str) or not name or "\x00" in name:
            raise LimitError(f"a limit name must be a non-empty string, got {name!r}")
        raw = name.encode("utf-8", "strict")
        if len(raw) > MAX_NAME:
            raise LimitError(f"a limit name has at most {MAX_NAME} UTF-8 bytes, got {len(raw)}")
        if concurrency is not None and (
            not isinstance(concurrency, int)
            or isinstance(concurrency, bool)
            or not 1 <= concurrency <= MAX_CONCURRENCY
        ):
            raise LimitError(
                f"concurrency must be an int in [1, {MAX_CONCURRENCY}], got {concurrency!r}"
            )
        rate_n, per = 0, 0.0
        if rate is not None:
            rate_n, per = _check_rate(rate)
        if burst is not None and (
            not isinstance(burst, int) or isinstance(burst, bool) or not 1 <= burst <= 0xFFFFFFFF
        ):
            raise LimitError(f"burst must be an int >= 1, got {burst!r}")
        if burst is not None and rate is None:
            raise LimitError("burst applies to a rate limit: give rate=(count, per) too")
        if rate is not None and burst is None:
            burst = min(0xFFFFFFFF, max(2, math.ceil(LATE_SLACK * rate_n / per)))
        with self._mutex:
            m = self._mapped(create_missing=True)
            assert m is not None
            with self._flock():
                cfg = _parse(m.mm, self.path, strict=False)
                old = cfg.get(name)
                if old is None and concurrency is None and rate is None:
                    return
                if old is not None:
                    index = old.index
                else:
                    free = set(range(MAX_LIMITS)) - {lim.index for lim in cfg.values()}
                    if not free:
                        raise LimitError(
                            f"{self.path}: all {MAX_LIMITS} limits are in use; remove one first"
                        )
                    index = min(free)
                base = OFF_ENTRIES + index * ENTRY
                entry = bytearray(E_NAME + MAX_NAME)
                if concurrency is not None or rate is not None:
                    _ENT.pack_into(entry, 0, 1, len(raw), concurrency or 0, rate_n, per, burst or 1)
                    entry[E_NAME : E_NAME + len(raw)] = raw
                    struct.pack_into("<I", entry, E_CRC, crc32c(bytes(entry[:E_CRC]) + raw))
                gen = m.load64(OFF_GEN)
                m.store64(OFF_GEN, gen | 1)  # odd: readers wait (or repair, if we die here)
                m.mm[base : base + E_BUCKET] = entry[:E_BUCKET]
                m.mm[base + E_NAME : base + E_NAME + MAX_NAME] = entry[E_NAME:]
                if old is None or (old.rate_n, old.per, old.burst) != (rate_n, per, burst or 1):
                    m.store64(base + E_BUCKET, 0)  # a new rate starts with a full bucket
                m.store64(OFF_GEN, (gen | 1) + 1)
                m.msync(0, FILE_SIZE)

    def describe(self) -> list[LimitInfo]:
        """Every limit with its live use, ordered by name."""
        with self._mutex:
            cfg = self._config()
            m = self._map
            out = []
            for name in sorted(cfg):
                lim = cfg[name]
                running = self._running(lim) if lim.concurrency else 0
                nxt = None
                if lim.rate_n and m is not None:
                    tau = (lim.burst - 1) * lim.interval_ns
                    tat, now = self._bucket(lim)
                    nxt = max(0.0, (tat - tau - now) / 1e9)
                out.append(
                    LimitInfo(
                        name,
                        lim.concurrency or None,
                        (lim.rate_n, lim.per) if lim.rate_n else None,
                        lim.burst if lim.rate_n else None,
                        running,
                        nxt,
                    )
                )
            return out

    def _running(self, lim: _Limit) -> int:
        fd = self._lock_fd()
        n = 0
        for j in range(lim.concurrency):
            if (lim.index, j) in self._mine:
                n += 1
            else:
                n += errors.check(
                    lib.ringq_owner_probe(fd, _lock_off(lim.index, j)),
                    f"probe cap slot of {self.path}",
                )
        return n

    # -- the lease path ------------------------------------------------------------------------------

    def active(self) -> bool:
        """True if any limit is configured (cheap: one atomic load once the file is mapped)."""
        return bool(self._config())

    def key_of(self, seg: Segment, slot: int) -> str | None:
        """The key of the published record at ``slot`` (read from its bytes; None if unkeyed)."""
        loc = (seg.seq, slot)
        if loc in self._keys:
            return self._keys[loc]
        key = lifecycle.key_of(seg, slot)
        if len(self._keys) > 1 << 16:
            self._keys.clear()
        self._keys[loc] = key
        return key

    def admit(self, seg: Segment, slot: int, entry: Callable[[], tuple]) -> _Ticket | None | bool:
        """Decide whether the READY job at ``slot`` may be leased now.

        Returns None when no limit applies, a ticket (pass it to :meth:`bind` or :meth:`undo`)
        when admitted, and False when a limit refuses: the job is then remembered (``entry()`` is
        its heap entry) and offered again by :meth:`reoffer`.
        """
        cfg = self._config()
        if not cfg:
            return None
        key = self.key_of(seg, slot)
        names = [n for n in dict.fromkeys((key, self.kind)) if n is not None and n in cfg]
        if not names:
            return None
        with self._mutex:
            ticket = _Ticket()
            for name in names:
                lim = cfg[name]
                if lim.concurrency:
                    j = self._take_slot(lim)
                    if j is None:
                        self.undo(ticket)
                        return self._block(name, seg, slot, entry)
                    ticket.slots.append((lim.index, j))
                if lim.rate_n:
                    due = self._take_token(lim)
                    if due:
                        self._due[name] = due
                        self.undo(ticket)
                        return self._block(name, seg, slot, entry)
                    ticket.tokens.append((lim.index, lim.interval_ns))
            return ticket

    def _block(self, name: str, seg: Segment, slot: int, entry: Callable[[], tuple]) -> bool:
        loc = (seg.seq, slot)
        if loc not in self._blocked_set:
            self._blocked_set.add(loc)
            heapq.heappush(self._blocked.setdefault(name, []), entry())
        return False

    def _take_slot(self, lim: _Limit) -> int | None:
        fd = self._lock_fd()
        for attempt in range(2):
            for j in range(lim.concurrency):
                if (lim.index, j) in self._mine:
                    continue
                if errors.check(
                    lib.ringq_owner_trylock(fd, _lock_off(lim.index, j)),
                    f"lock cap slot of {self.path}",
                ):
                    return j
            if attempt == 0 and not self._sweep(lim.index):
                break
        return None

    def _sweep(self, index: int) -> bool:
        """Release this process's slots of limit ``index`` whose leases ended without ack or nack
        here (expired and handed out again, acked by id elsewhere).  True if any was released."""
        freed = False
        for (idx, _j), loc in list(self._mine.items()):
            if idx != index or loc not in self._held:
                continue
            _ticket, seg, lc = self._held[loc]
            try:
                w = seg.load64(seg.state_off_of(loc[1]))
            except errors.RingqError:
                w = 0  # the segment retired: the job finished
            if w & 7 != ST_LEASED or (w >> 6) & LC_MASK != lc:
                freed |= self.release(loc)
        return freed

    def _take_token(self, lim: _Limit) -> int:
        """Take a token of ``lim``'s bucket: 0 if taken, else the time (ns) the next one is due."""
        m = self._map
        assert m is not None
        off = OFF_ENTRIES + lim.index * ENTRY + E_BUCKET
        interval = lim.interval_ns
        tau = (lim.burst - 1) * interval
        while True:
            tat, now = self._bucket(lim)
            base = max(tat, now)
            if base - now > tau:
                return base - tau
            if m.cas64(off, tat, base + interval)[0]:
                return 0

    def _bucket(self, lim: _Limit) -> tuple[int, int]:
        """``(bucket word, now)`` of ``lim``, the word repaired if it is further ahead than any run
        of takes can put it.  ``now`` is read after the word, so another process's take between
        the two never makes the word look further ahead than it is.

        Taking a token sets the word to at most ``now + burst * per / n``; a word beyond that (by
        more than ``BUCKET_SLACK_NS``, for clocks of processes read a moment apart) is damage
        (the word is outside the entry's CRC), which would hold the key back for as long.  It is
        set to that maximum, an empty bucket: no token is granted that a real history could not
        have left.
        """
        m = self._map
        assert m is not None
        off = OFF_ENTRIES + lim.index * ENTRY + E_BUCKET
        while True:
            tat = m.load64(off)
            now = time.time_ns()
            most = now + lim.burst * lim.interval_ns
            if tat <= most + BUCKET_SLACK_NS:
                return tat, now
            if m.cas64(off, tat, most)[0]:
                return most, now

    def _refund(self, index: int, interval: int) -> None:
        m = self._map
        if m is None:
            return
        off = OFF_ENTRIES + index * ENTRY + E_BUCKET
        while True:
            tat = m.load64(off)
            if tat < interval or m.cas64(off, tat, tat - interval)[0]:
                return

    def undo(self, ticket: _Ticket | None) -> None:
        """Give back what an admitted lease took (its CAS lost, or the record failed to read)."""
        if not ticket:
            return
        with self._mutex:
            for index, j in ticket.slots:
                self._unlock(index, j)
            for index, interval in ticket.tokens:
                self._refund(index, interval)
            ticket.slots.clear()
            ticket.tokens.clear()

    def _unlock(self, index: int, j: int) -> None:
        self._mine.pop((index, j), None)
        if self._lockfd >= 0 and self._pid == os.getpid():
            errors.check(
                lib.ringq_owner_unlock(self._lockfd, _lock_off(index, j)),
                f"unlock cap slot of {self.path}",
            )

    def bind(self, ticket: _Ticket | None, seg: Segment, slot: int, lc: int) -> None:
        """Record that ``ticket``'s lease (token ``lc``) succeeded: its slots go with the job."""
        if not ticket or not ticket.slots:
            return
        with self._mutex:
            loc = (seg.seq, slot)
            if loc in self._held:
                self.release(loc)
            self._held[loc] = (ticket, seg, lc)
            for s in ticket.slots:
                self._mine[s] = loc

    def release(self, loc: tuple[int, int]) -> bool:
        """Free the cap slots held for the job at ``loc`` (at its ack or nack).  True if any was held."""
        with self._mutex:
            held = self._held.pop(loc, None)
            if held is None:
                return False
            for index, j in held[0].slots:
                self._unlock(index, j)
            return True

    def reoffer(self) -> list[tuple]:
        """Heap entries of blocked jobs worth another try now (the best few per limit)."""
        if not self._blocked:
            return []
        out = []
        now = time.time_ns()
        with self._mutex:
            for name in list(self._blocked):
                if self._due.get(name, 0) > now:
                    continue
                heap = self._blocked[name]
                for _ in range(min(REOFFER, len(heap))):
                    e = heapq.heappop(heap)
                    self._blocked_set.discard((e[4], e[6]))
                    out.append(e)
                if not heap:
                    del self._blocked[name]
                    self._due.pop(name, None)
        return out

    def blocked(self, segseq: int, slot: int) -> bool:
        """True if the job at ``(segseq, slot)`` waits for a limit in this process."""
        return (segseq, slot) in self._blocked_set

    def nap(self) -> float | None:
        """Seconds a lease waiting for work should sleep at most because of blocked jobs: until the
        next token of a rate that blocks one, or :data:`CAP_RECHECK` for caps (a slot freed by an
        ack wakes sleepers at once; one freed by a holder's death is seen at the next recheck)."""
        if not self._blocked:
            return None
        now = time.time_ns()
        best = None
        for name in self._blocked:
            due = self._due.get(name)
            t = CAP_RECHECK if due is None else max(0.0, (due - now) / 1e9) + 0.0005
            best = t if best is None else min(best, t)
        return best

    # -- unique windows ----------------------------------------------------------------------------

    def enqueue_unique(
        self, key: str, unique_for: float, enqueue: Callable[[], Any], find: Callable[[str], Any]
    ) -> Any:
        """Run ``enqueue()`` unless a unique window for ``key`` is open; then return ``find(id)``
        of the job that opened it.  Raises DuplicateJobError if that job is no longer retained,
        LimitError if ``unique_for`` is not a positive number of seconds or the table is full."""
        if (
            isinstance(unique_for, bool)
            or not isinstance(unique_for, (int, float))
            or not 0 < unique_for < MAX_UNIQUE_FOR
        ):
            raise LimitError(
                f"unique_for must be seconds > 0 and below {MAX_UNIQUE_FOR} (about 30 years), "
                f"got {unique_for!r}"
            )
        h = (
            int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")
            | 1
        )
        with self._mutex:
            m = self._mapped(create_missing=True)
            assert m is not None
            with self._flock():
                now = int(time.time() * 1000)
                free = None
                for i in range(MAX_UNIQUE):
                    base = OFF_UNIQUE + i * UENTRY
                    uh, expires, idlen = _UNI.unpack_from(m.mm, base)
                    if expires <= now:
                        free = i if free is None else free
                    elif uh == h:
                        job_id = bytes(
                            m.mm[base + U_ID : base + U_ID + min(idlen, MAX_UNIQUE_ID)]
                        ).decode("utf-8", "replace")
                        try:
                            return find(job_id)
                        except errors.JobNotFoundError:
                            raise errors.DuplicateJobError(
                                f"key {key!r} has a unique window open until {expires / 1000:.3f} (seconds since "
                                f"the epoch), opened by job {job_id!r}, which is no longer retained",
                                job_id,
                            ) from None
                if free is None:
                    raise LimitError(
                        f"{self.path}: all {MAX_UNIQUE} unique windows are open; wait for one to close"
                    )
                job = enqueue()
                raw = job.id.encode("utf-8")
                if len(raw) > MAX_UNIQUE_ID:
                    raise LimitError(
                        f"job id of {len(raw)} bytes is too long for a unique window (at most {MAX_UNIQUE_ID})"
                    )
                base = OFF_UNIQUE + free * UENTRY
                m.store64(base + U_EXPIRES, 0)
                m.mm[base : base + U_ID + MAX_UNIQUE_ID] = _UNI.pack(h, 0, len(raw)).ljust(
                    U_ID, b"\0"
                ) + raw.ljust(MAX_UNIQUE_ID, b"\0")
                m.store64(
                    base + U_EXPIRES, now + int(unique_for * 1000)
                )  # last: the entry counts from here
                m.msync(
                    OFF_UNIQUE + (free * UENTRY // PAGE) * PAGE,
                    PAGE * 2 if (free * UENTRY) % PAGE + UENTRY > PAGE else PAGE,
                )
                return job


class _Flock:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


class LimitMethods:
    """The limits part of :class:`ringq.Queue`'s API (a mixin: ``Queue`` owns ``_gate``)."""

    _gate: LimitGate

    def limit(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
        burst: int | None = None,
    ) -> None:
        """Set the limit of key ``name`` (or of every job of this queue, when ``name`` is the
        queue's name), for every process on the host at once; it persists in ``<name>.limits``.

        Args:
            name: a job key (``enqueue(..., key=name)``) or this queue's name.
            concurrency: most leases of such jobs held at once (1..4096).  A holder's slot is
                freed by its ack or nack, or at once when its process dies.
            rate: ``(count, per)``: ``count`` leases per ``per`` seconds, spaced evenly (a token
                bucket, exact across processes): in any span of ``t`` seconds at most
                ``burst + t * count / per`` leases.  A 2-tuple: an int count (not a bool) in
                1..2**32-1 and a finite number of seconds > 0.
            burst: tokens the bucket holds when full: how many leases may start at once after
                an idle spell (default: the tokens of 50 ms, at least 2, so that a consumer
                woken a few ms late does not lose its token).
            Neither ``concurrency`` nor ``rate``: remove the limit.
        Raises:
            LimitError: bad values, or all 64 limits of the queue in use.  LimitsFileError: the
            limits file is damaged.  QueueClosedError.
        """
        self._live()  # type: ignore[attr-defined]
        self._gate.set_limit(name, concurrency, rate, burst)
        self.wake()  # type: ignore[attr-defined]  # a raised or removed limit may free held-back jobs

    def limits(self) -> list[LimitInfo]:
        """Every limit of this queue with its live use (``running`` leases, next token)."""
        self._live()  # type: ignore[attr-defined]
        return self._gate.describe()
