"""The limits file ``<name>.limits``: its layout, validation, the sequence-locked table of
limits, and the words processes share through it (token buckets, cap-slot locks).

docs/limits.md has the layout; ringq/local/limits.py has the theory of operation.  The table is written
under an ``flock`` of the file and published with a sequence lock: a generation word that is odd
while a writer changes entries.  Readers copy the table when the generation moves.  A writer killed
mid-change leaves the generation odd: the next reader that can take the ``flock`` re-checks every
entry's CRC, drops torn ones and makes the generation even again.
"""

from __future__ import annotations

import fcntl
import math
import os
import random
import struct
import time
from dataclasses import dataclass
from typing import Any

from ringq import codec
from ringq.backend import as_float, as_int
from ringq.errors import LimitError, LimitsFileError

from . import forksafe, native
from ._native import lib
from .mapped import Mapped, crc32c, fsync_dir, write_whole
from .mapped import open_nofollow as _open_nofollow

__all__ = ["Limit", "LimitsFile", "MAX_CONCURRENCY", "MAX_LIMITS", "MAX_UNIQUE", "free_slot_on"]

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
UNI = struct.Struct("<QQH")
U_EXPIRES, U_ID = 8, 32
LATE_SLACK = (
    0.05  # seconds of tokens the default burst holds: a consumer woken late keeps its token
)
BUCKET_SLACK_NS = 1_000_000_000  # a bucket time this far past its possible maximum is damage


@dataclass(slots=True)
class Limit:
    index: int
    concurrency: int
    rate_n: int
    per: float
    burst: int

    @property
    def interval_ns(self) -> int:
        return max(1, int(round(self.per * 1e9 / self.rate_n)))


def _check_rate(rate: Any) -> tuple[int, float]:
    """``(count, per)`` of a rate: a 2-tuple (or list) of an int >= 1 and finite seconds > 0."""
    count, seconds = None, math.nan
    if isinstance(rate, (tuple, list)) and len(rate) == 2:
        count, seconds = as_int(rate[0]), as_float(rate[1])
    if count is None or not 1 <= count <= 0xFFFFFFFF or not 0 < seconds < math.inf:
        raise LimitError(
            "rate must be a 2-tuple (count, per): an int count in [1, 2**32 - 1] and a finite "
            f"number of seconds per > 0, got {rate!r}"
        )
    return count, seconds


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
        write_whole(fd, bytes(page), FILE_SIZE, f"the limits file {path}")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
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
    except LimitsFileError as exc:
        os.close(fd)
        raise LimitsFileError(f"{exc}. {_REPAIR}") from None
    except BaseException:
        os.close(fd)
        raise
    return Mapped(path, fd, FILE_SIZE)


# What a failed open of the limits file says to do (it holds no job).
_REPAIR = (
    "Jobs are not affected: with no process using the queue, remove the file to drop every "
    "limit and unique window, then set the limits again (Queue.limit)"
)


def _entry(mm: Any, i: int) -> tuple[bool, str | None, Limit | None]:
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
    return True, name, Limit(i, conc, rate_n, per, max(1, burst))


def _parse(mm: Any, path: str, strict: bool) -> dict[str, Limit]:
    """The valid entries of the table.  A damaged entry raises LimitsFileError if ``strict``,
    else is skipped."""
    out: dict[str, Limit] = {}
    for i in range(MAX_LIMITS):
        used, name, lim = _entry(mm, i)
        if used and lim is None:
            if strict:
                raise LimitsFileError(
                    f"{path}: limit entry {i} is damaged (CRC mismatch or impossible values). {_REPAIR}"
                )
            continue
        if lim is not None and name:
            out[name] = lim
    return out


class _Flock:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


class LimitsFile:
    """One process's handle on a queue's limits file: the map, the lock descriptor, the last
    table read.  Callers serialise calls (LimitGate holds its mutex).

    The file is created by the first :meth:`set_limit` or unique window; until then every read
    finds no limits, looking for a file another process created at most every
    :attr:`STAT_INTERVAL` seconds.
    """

    STAT_INTERVAL = 0.5  # seconds between looks for a limits file created by another process

    def __init__(self, path: str, mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        self.map: Mapped | None = None
        self._lockfd = -1
        self._pid = os.getpid()
        self._next_look = 0.0
        self._gen = -1
        self._cfg: dict[str, Limit] = {}

    def drop_inherited_lock(self) -> None:
        """In a forked child: close the copy of the parent's lock descriptor (its cap slots are
        the parent's; forksafe closed it)."""
        self._lockfd = -1
        self._pid = os.getpid()

    def lock_fd(self) -> int:
        """This process's descriptor of the file, which carries its ``flock`` and cap-slot locks."""
        if self._lockfd < 0 or self._pid != os.getpid():
            self._lockfd = forksafe.opened(lambda: _open_nofollow(self.path, os.O_RDWR))
            self._pid = os.getpid()
        return self._lockfd

    def give_lock_fd(self) -> int:
        """Hand over this process's lock descriptor, with the cap-slot locks it carries (-1 if
        none is open): this object forgets it and never closes it.  The caller holds
        ``forksafe.moving()`` until it has recorded the descriptor elsewhere."""
        fd = self._lockfd if self._pid == os.getpid() else -1
        self._lockfd = -1
        return fd

    def take_lock_fd(self, fd: int) -> None:
        """Use ``fd`` (another object's, on the same file: :meth:`give_lock_fd`) as this one's
        lock descriptor.  Only while this object holds no cap slot: its own is closed."""
        with forksafe.moving():
            old = self._lockfd if self._pid == os.getpid() else -1
            self._lockfd, self._pid = fd, os.getpid()
            if old >= 0:
                forksafe.close(old)

    def mapped(self, create_missing: bool = False) -> Mapped | None:
        """The file's map (created first if ``create_missing``), or None if there is no file yet.
        Raises LimitsFileError for a damaged file."""
        if self.map is not None:
            return self.map
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
        self.map = m
        return m

    def flock(self) -> _Flock:
        """The file's ``flock``, as a context manager: writers of the table and of unique windows."""
        return _Flock(self.lock_fd())

    def watched(self) -> tuple[Mapped, int, int] | None:
        """The generation word :meth:`config` compares, as ``(mapping, offset, width)`` for a
        Watch; None while the file is not mapped (:meth:`next_look` says when it is looked for)."""
        return None if self.map is None else (self.map, OFF_GEN, 8)

    def next_look(self) -> float:
        """While the file is not mapped: the monotonic time before which :meth:`config` does not
        look for it (another process may create it); ``inf`` once mapped."""
        return float("inf") if self.map is not None else self._next_look

    def config(self) -> dict[str, Limit]:
        """The limits by name, as last published (empty without a file)."""
        m = self.mapped()
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
        fd = self.lock_fd()
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
        """Close the descriptor (in the process that opened it) and the map."""
        fd = self._lockfd if self._pid == os.getpid() else -1
        self._lockfd = -1
        if fd >= 0:
            forksafe.close(fd)
        if self.map is not None:
            self.map.close()
            self.map = None

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
        cap = None if concurrency is None else as_int(concurrency)
        if concurrency is not None and (cap is None or not 1 <= cap <= MAX_CONCURRENCY):
            raise LimitError(
                f"concurrency must be an int in [1, {MAX_CONCURRENCY}], got {concurrency!r}"
            )
        rate_n, per = 0, 0.0
        if rate is not None:
            rate_n, per = _check_rate(rate)
        tokens = None if burst is None else as_int(burst)
        if burst is not None and (tokens is None or not 1 <= tokens <= 0xFFFFFFFF):
            raise LimitError(f"burst must be an int >= 1, got {burst!r}")
        if burst is not None and rate is None:
            raise LimitError("burst applies to a rate limit: give rate=(count, per) too")
        concurrency, burst = cap, tokens  # ints (a numpy integer too)
        if rate is not None and burst is None:
            burst = min(0xFFFFFFFF, max(2, math.ceil(LATE_SLACK * rate_n / per)))
        m = self.mapped(create_missing=True)
        assert m is not None
        with self.flock():
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

    # -- token buckets -----------------------------------------------------------------------------

    def take_token(self, lim: Limit) -> int:
        """Take a token of ``lim``'s bucket: 0 if taken, else the time (ns) the next one is due."""
        m = self.map
        assert m is not None
        off = OFF_ENTRIES + lim.index * ENTRY + E_BUCKET
        interval = lim.interval_ns
        tau = (lim.burst - 1) * interval
        while True:
            tat, now = self.bucket(lim)
            base = max(tat, now)
            if base - now > tau:
                return base - tau
            if m.cas64(off, tat, base + interval)[0]:
                return 0

    def bucket(self, lim: Limit) -> tuple[int, int]:
        """``(bucket word, now)`` of ``lim``, the word repaired if it is further ahead than any run
        of takes can put it.  ``now`` is read after the word, so another process's take between
        the two never makes the word look further ahead than it is.

        Taking a token sets the word to at most ``now + burst * per / n``; a word beyond that (by
        more than ``BUCKET_SLACK_NS``, for clocks of processes read a moment apart) is damage
        (the word is outside the entry's CRC), which would hold the key back for as long.  It is
        set to that maximum, an empty bucket: no token is granted that a real history could not
        have left.
        """
        m = self.map
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

    def refund(self, index: int, interval: int) -> None:
        """Give back a token of limit ``index`` taken by :meth:`take_token` (``interval`` ns)."""
        m = self.map
        if m is None:
            return
        off = OFF_ENTRIES + index * ENTRY + E_BUCKET
        while True:
            tat = m.load64(off)
            if tat < interval or m.cas64(off, tat, tat - interval)[0]:
                return

    # -- cap slots: OFD locks on bytes far past the file's end ------------------------------------

    def try_slot(self, index: int, j: int) -> bool:
        """Take cap slot ``j`` of limit ``index``; False if another holder has it."""
        return bool(
            native.check(
                lib.ringq_owner_trylock(self.lock_fd(), _lock_off(index, j)),
                f"lock cap slot of {self.path}",
            )
        )

    def slot_taken(self, index: int, j: int) -> bool:
        """True if another process holds cap slot ``j`` of limit ``index``."""
        return bool(
            native.check(
                lib.ringq_owner_probe(self.lock_fd(), _lock_off(index, j)),
                f"probe cap slot of {self.path}",
            )
        )

    def free_slot(self, index: int, j: int) -> None:
        """Unlock cap slot ``j`` of limit ``index`` (nothing in a forked child: it is the parent's)."""
        if self._lockfd >= 0 and self._pid == os.getpid():
            free_slot_on(self._lockfd, index, j)


def free_slot_on(fd: int, index: int, j: int) -> None:
    """Unlock cap slot ``j`` of limit ``index`` held through descriptor ``fd`` of a limits file."""
    native.check(lib.ringq_owner_unlock(fd, _lock_off(index, j)), "unlock cap slot")
