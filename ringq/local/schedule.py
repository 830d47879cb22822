"""Periodic jobs: a schedule enqueues one job per tick, however many processes serve the queue.

Theory of operation
-------------------
Two files in the queue directory (byte layouts in ``docs/format.md``):

* ``<name>.sched`` holds the definitions (name, payload, ``every`` or ``cron`` + ``tz``, priority,
  max attempts).  It is only ever replaced whole: a new version is written to
  ``<name>.sched.tmp``, fsynced, renamed over it, and the directory fsynced, so a crash leaves the
  old or the new version, never a mix.  Writers of definitions take ``flock`` on ``<name>.ticks``.
* ``<name>.ticks`` is a fixed table mapped by every process: per schedule a *fire word* (the next
  tick, in ms since the Unix epoch) and, in the header, the earliest next tick of all schedules
  and a version counter of the definitions file.

Firing a tick is decided by compare-and-swap on the fire word, not by a leader: whoever sees
``IDLE(t)`` with ``t <= now`` swaps it to ``FIRING(tick, owner)``, where ``tick`` is the latest tick
at or before now (missed ticks collapse into this one catch-up job) and ``owner`` is the firer's
owner index (an OFD lock on one byte of ``<name>.owners``, held while the process lives, as for
leases).  Exactly one process wins; it enqueues the job with the idempotent id
``schedule:<name>:<tick ms>``, then swaps the word to ``IDLE(next tick)``.  A firer that dies in
between leaves ``FIRING`` with an owner byte nobody holds: the next process to look takes the
claim over and enqueues the same id, which the queue de-duplicates if the dead firer got that far.
So a killed firer neither loses the tick nor doubles it.  (A claim older than ``CLAIM_STALE``
seconds is taken over too, in case the dead firer's owner byte was taken by a new process.)

Checking is cheap: one atomic load of the earliest-tick word (:meth:`Scheduler.due_in`); only when
it has passed are the definitions and fire words read.  ``Worker`` checks on every lease-loop
iteration and bounds its lease wait by the next tick; scripts call :meth:`ringq.Queue.run_schedules`.
"""

from __future__ import annotations

import base64
import builtins
import errno
import json
import os
import re
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, overload

from ringq import codec
from ringq.backend import as_float, check_attempts, check_priority
from ringq.engine import forksafe
from ringq.engine.mapped import Mapped, crc32c, fsync_dir, write_whole
from ringq.engine.owner import OwnerRegistry
from ringq.errors import CorruptionError, FormatVersionError, QueueClosedError, RingqError

if TYPE_CHECKING:
    from ringq.job import Job

    from .queue import Queue

__all__ = [
    "Schedule",
    "Scheduler",
    "Schedules",
    "ScheduleFileError",
    "ScheduleNotFoundError",
    "job_id_for",
    "CAPACITY",
]

SCHED_MAGIC = b"RNGQSCH1"
TICKS_MAGIC = b"RNGQTCK1"
VERSION = 1
CAPACITY = 1024  # schedules per queue: entries of the ticks table
PAGE = 4096
ENTRY = 32
TICKS_SIZE = PAGE + CAPACITY * ENTRY
_SCHED_HEAD = struct.Struct(
    "<8sIII"
)  # magic, version, body length, body CRC32C; then u32 CRC of these 20
_TICKS_HEAD = struct.Struct(
    "<8sII"
)  # magic, version, capacity; then u32 CRC32C of these 16 at offset 16
OFF_EARLIEST = 64  # u64: (earliest next tick ms << 20) | generation
OFF_DEFS_VERSION = 72  # u64: bumped after every replacement of <name>.sched
E_UID, E_FIRE, E_CLAIMED, E_LAST = (
    0,
    8,
    16,
    24,
)  # entry fields: uid, fire word, claimed at ms, last tick ms
PH_NONE, PH_IDLE, PH_FIRING = 0, 1, 2
TIME_SHIFT = 18  # fire word: bits 0-1 phase, 2-17 owner index, 18-63 time in ms (46 bits)
NEVER = (1 << 44) - 1  # ms: "no schedule", beyond any real tick (about year 2527)
CLAIM_STALE = (
    60.0  # seconds after which a FIRING claim is taken over even if its owner byte is held
)
FIRING_RECHECK = 1.0  # seconds: how soon others look again at a claim in progress
MIN_EVERY = 0.01  # seconds
MAX_EVERY = 86400.0 * 366 * 30  # seconds
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_EXISTS_RECHECK = 1.0  # seconds between looks for a ticks file that did not exist


class ScheduleFileError(CorruptionError):
    """``<name>.sched`` or ``<name>.ticks`` is damaged or not a ringq schedule file.

    Nothing is overwritten: the message names the file and how to start over (remove both files;
    their schedules are lost, the queue's jobs are not touched).
    """


class ScheduleNotFoundError(RingqError, KeyError):
    """No schedule with that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Schedule:
    """A periodic job as stored, plus where its ticks stand.

    ``next_fire`` and ``last_fire`` are seconds since the Unix epoch (``last_fire`` None until the
    first tick fired); ``firing`` is True while some process is enqueuing the job of the tick
    ``firing_tick`` (then ``next_fire`` is None).
    """

    name: str
    payload: Any
    cron: str | None
    every: float | None
    tz: str
    priority: int
    max_attempts: int | None
    next_fire: float | None
    last_fire: float | None
    firing: bool
    firing_tick: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "payload": codec.jsonable(self.payload),
            "cron": self.cron,
            "every": self.every,
            "tz": self.tz,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "next_fire": self.next_fire,
            "last_fire": self.last_fire,
            "firing": self.firing,
            "firing_tick": self.firing_tick,
        }


def job_id_for(name: str, tick_ms: int) -> str:
    """The idempotent job id of schedule ``name``'s tick at ``tick_ms`` (ms since the Unix epoch)."""
    return f"schedule:{name}:{tick_ms}"


def _pack(phase: int, owner: int, ms: int) -> int:
    return (min(ms, NEVER) << TIME_SHIFT) | ((owner & 0xFFFF) << 2) | phase


def _unpack(word: int) -> tuple[int, int, int]:
    return word & 3, (word >> 2) & 0xFFFF, word >> TIME_SHIFT


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- definitions --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Def:
    name: str
    slot: int
    uid: int
    codec: int
    data: bytes
    cron: str | None
    every_ms: int | None
    tz: str
    priority: int
    max_attempts: int | None
    anchor_ms: int

    def timing(self) -> tuple[str | None, int | None, str, int | None]:
        return (self.cron, self.every_ms, self.tz, self.anchor_ms if self.every_ms else None)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "slot": self.slot,
            "uid": self.uid,
            "codec": self.codec,
            "data": base64.b64encode(self.data).decode("ascii"),
            "cron": self.cron,
            "every_ms": self.every_ms,
            "tz": self.tz,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "anchor_ms": self.anchor_ms,
        }

    @staticmethod
    def from_json(d: Any) -> _Def:
        if not isinstance(d, dict):
            raise ValueError("a schedule entry is not an object")
        out = _Def(
            name=str(d["name"]),
            slot=int(d["slot"]),
            uid=int(d["uid"]),
            codec=int(d["codec"]),
            data=base64.b64decode(d["data"], validate=True),
            cron=d["cron"],
            every_ms=None if d["every_ms"] is None else int(d["every_ms"]),
            tz=str(d["tz"]),
            priority=int(d["priority"]),
            max_attempts=None if d["max_attempts"] is None else int(d["max_attempts"]),
            anchor_ms=int(d["anchor_ms"]),
        )
        if not NAME_RE.match(out.name) or not 0 <= out.slot < CAPACITY or not 0 < out.uid < 2**64:
            raise ValueError(f"schedule entry {out.name!r} has an impossible name, slot or uid")
        if (out.cron is None) == (out.every_ms is None):
            raise ValueError(f"schedule {out.name!r} needs exactly one of cron and every")
        return out

    def next_after(self, t_ms: int) -> int:
        """The first tick strictly after ``t_ms``."""
        if self.every_ms is not None:
            k = max(1, (t_ms - self.anchor_ms) // self.every_ms + 1)
            return self.anchor_ms + k * self.every_ms
        assert self.cron is not None  # exactly one of cron and every_ms (add, from_json)
        return _cron_next(self.cron, self.tz, t_ms)

    def latest_at_or_before(self, now_ms: int, floor_ms: int) -> int:
        """The latest tick in ``[floor_ms, now_ms]`` (``floor_ms`` is a tick at or before now)."""
        if self.every_ms is not None:
            k = (now_ms - self.anchor_ms) // self.every_ms
            return max(floor_ms, self.anchor_ms + k * self.every_ms)
        assert self.cron is not None  # exactly one of cron and every_ms (add, from_json)
        tick = floor_ms
        for _ in range(10_000):  # a cron tick at most every second: bounded by the time missed
            nxt = _cron_next(self.cron, self.tz, tick)
            if nxt > now_ms:
                return tick
            tick = nxt
        return max(floor_ms, _cron_prev(self.cron, self.tz, now_ms))


def _zone(tz: str) -> Any:
    """The ``ZoneInfo`` of ``tz``; ValueError for anything but the name of a known time zone."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not isinstance(tz, str):
        raise ValueError(
            f"tz must be the name of a time zone (a str such as 'UTC' or 'Europe/Paris'), "
            f"got {type(tz).__name__} {tz!r}"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(
            f"unknown time zone {tz!r} (an IANA name such as 'UTC' or 'Europe/Paris'): {exc}"
        ) from None


def _cronsim() -> Any:
    try:
        import cronsim
    except ImportError:  # pragma: no cover - cronsim is a declared dependency
        raise RingqError("cron= needs the cronsim package: pip install cronsim") from None
    return cronsim


def _cron_next(expr: str, tz: str, t_ms: int) -> int:
    dt = datetime.fromtimestamp(t_ms / 1000, _zone(tz))
    return int(next(_cronsim().CronSim(expr, dt)).timestamp() * 1000)


def _cron_prev(expr: str, tz: str, t_ms: int) -> int:
    # cronsim's reverse iteration starts at the given second itself when it has microseconds.
    dt = datetime.fromtimestamp(t_ms // 1000 + 0.5, _zone(tz))
    return int(next(_cronsim().CronSim(expr, dt, reverse=True)).timestamp() * 1000)


def check_cron(expr: object, tz: str) -> None:
    """Raise ValueError unless ``expr`` is a cron expression cronsim accepts (5 fields, or 6 with
    seconds first) and ``tz`` a known time zone."""
    if not isinstance(expr, str):
        raise ValueError(f"cron must be a string, got {expr!r}")
    zone = _zone(tz)
    cs = _cronsim()
    try:
        next(cs.CronSim(expr, datetime.now(zone)))
    except cs.CronSimError as exc:
        raise ValueError(f"bad cron expression {expr!r}: {exc}") from None
    except StopIteration:  # pragma: no cover - cronsim iterates forever
        raise ValueError(f"cron expression {expr!r} never fires") from None


# -- files ----------------------------------------------------------------------------------------------


def _read_defs(path: str) -> list[_Def]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ScheduleFileError(
                f"{path}: is a symbolic link; ringq does not follow links in a queue directory"
            ) from None
        raise
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read()
    except IsADirectoryError:
        raise ScheduleFileError(f"{path}: is not a regular file") from None
    advice = f" (remove {path} and the .ticks file beside it to start over; their schedules are lost, jobs are not)"
    if len(raw) < 24 or raw[:8] != SCHED_MAGIC:
        raise ScheduleFileError(
            f"{path}: not a ringq schedule file (bad magic or too short){advice}"
        )
    magic, version, length, body_crc = _SCHED_HEAD.unpack_from(raw, 0)
    (head_crc,) = struct.unpack_from("<I", raw, 20)
    if crc32c(raw[:20]) != head_crc:
        raise ScheduleFileError(f"{path}: header fails its CRC{advice}")
    if version != VERSION:
        raise FormatVersionError(
            f"{path}: schedule file format version {version}; this ringq reads version {VERSION}"
        )
    body = raw[24:]
    if len(body) != length or crc32c(body) != body_crc:
        raise ScheduleFileError(f"{path}: body is damaged (length or CRC){advice}")
    try:
        doc = json.loads(body)
        defs = [_Def.from_json(d) for d in doc["schedules"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ScheduleFileError(f"{path}: body does not parse: {exc}{advice}") from None
    if len({d.name for d in defs}) != len(defs) or len({d.slot for d in defs}) != len(defs):
        raise ScheduleFileError(f"{path}: two schedules share a name or a slot{advice}")
    return defs


def _write_defs(path: str, defs: list[_Def], mode: int) -> None:
    body = json.dumps({"schedules": [d.to_json() for d in defs]}, separators=(",", ":")).encode()
    head = _SCHED_HEAD.pack(SCHED_MAGIC, VERSION, len(body), crc32c(body))
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, head + struct.pack("<I", crc32c(head)) + body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def _create_ticks(path: str, mode: int) -> None:
    """Create the ticks table whole under a temporary name and link it into place (a crash leaves
    no table or a complete one; of two processes creating it at once, one table wins)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        head = _TICKS_HEAD.pack(TICKS_MAGIC, VERSION, CAPACITY)
        buf = bytearray(TICKS_SIZE)
        buf[: len(head)] = head
        struct.pack_into("<I", buf, 16, crc32c(head))
        struct.pack_into("<Q", buf, OFF_EARLIEST, NEVER << 20)
        write_whole(fd, bytes(buf), TICKS_SIZE, f"the schedule file {path}")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    fsync_dir(os.path.dirname(path) or ".")


def _open_ticks(path: str) -> Mapped:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ScheduleFileError(
                f"{path}: is a symbolic link; ringq does not follow links in a queue directory"
            ) from None
        raise
    try:
        advice = f" (remove {path} and the .sched file beside it to start over; their schedules are lost, jobs are not)"
        head = os.pread(fd, 20, 0)
        if len(head) < 20 or head[:8] != TICKS_MAGIC:
            raise ScheduleFileError(
                f"{path}: not a ringq ticks table (bad magic or too short){advice}"
            )
        _magic, version, capacity = _TICKS_HEAD.unpack_from(head, 0)
        if crc32c(head[:16]) != struct.unpack_from("<I", head, 16)[0]:
            raise ScheduleFileError(f"{path}: header fails its CRC{advice}")
        if version != VERSION:
            raise FormatVersionError(
                f"{path}: ticks table format version {version}; this ringq reads version {VERSION}"
            )
        if capacity != CAPACITY or os.fstat(fd).st_size < TICKS_SIZE:
            raise ScheduleFileError(
                f"{path}: capacity {capacity} or size {os.fstat(fd).st_size} is impossible{advice}"
            )
        return Mapped(path, fd, TICKS_SIZE)
    except BaseException:
        os.close(fd)
        raise


# -- the scheduler -----------------------------------------------------------------------------------------


class Scheduler:
    """The schedules of one :class:`ringq.Queue` (one per Queue object; see ``Queue.schedule``)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = weakref.ref(queue)
        self.dir = str(queue.path)
        self.name = queue.name
        self.sched_path = os.path.join(self.dir, f"{queue.name}.sched")
        self.ticks_path = os.path.join(self.dir, f"{queue.name}.ticks")
        try:
            self.mode = os.stat(os.path.join(self.dir, f"{queue.name}.ctl")).st_mode & 0o666
        except OSError:
            self.mode = 0o600
        self._owners = OwnerRegistry(os.path.join(self.dir, f"{queue.name}.owners"), self.mode)
        self._lock = threading.RLock()
        self._tab: Mapped | None = None
        self._looked = -1e9  # monotonic time of the last look for a missing ticks table
        self._open_error: Exception | None = None
        self._defs: list[_Def] = []
        self._defs_version = -1
        self._firing = 0  # claims this process is in the middle of (under self._lock)
        weakref.finalize(queue, self.close)

    # -- plumbing

    def _q(self) -> Queue:
        q = self._queue()
        if q is None or q.closed:
            self.close()
            from ringq.errors import QueueClosedError

            raise QueueClosedError(f"queue {self.name!r} in {self.dir} is closed")
        return q

    def close(self) -> None:
        with self._lock:
            if self._tab is not None:
                self._tab.close()
                self._tab = None
            self._owners.close()

    @overload
    def _table(self, create: Literal[True]) -> Mapped: ...

    @overload
    def _table(self, create: Literal[False]) -> Mapped | None: ...

    def _table(self, create: bool) -> Mapped | None:
        """The ticks table, opened once; created if missing when ``create``, else None if
        there is none (looked for at most every ``_EXISTS_RECHECK`` seconds)."""
        if self._tab is not None:
            return self._tab
        if not create:
            now = time.monotonic()
            if now - self._looked < _EXISTS_RECHECK:
                if self._open_error is not None:
                    raise self._open_error
                return None
            self._looked = now
            if not os.path.exists(self.ticks_path):
                self._open_error = None
                return None
        elif not os.path.exists(self.ticks_path):
            _create_ticks(self.ticks_path, self.mode)
        try:
            self._tab = _open_ticks(self.ticks_path)
        except (CorruptionError, OSError) as exc:
            self._open_error = exc  # raised again by the throttled looks, not forgotten
            raise
        self._open_error = None
        return self._tab

    def _defs_now(self, tab: Mapped) -> list[_Def]:
        """The definitions, re-read when another process replaced the file."""
        v = tab.load64(OFF_DEFS_VERSION)
        if v != self._defs_version:
            self._defs = _read_defs(self.sched_path)
            self._defs_version = v
        return self._defs

    @staticmethod
    def _eoff(slot: int, field: int) -> int:
        return PAGE + slot * ENTRY + field

    def _lower_earliest(self, tab: Mapped, ms: int) -> None:
        w = tab.load64(OFF_EARLIEST)
        while ms < w >> 20:
            ok, w = tab.cas64(OFF_EARLIEST, w, (ms << 20) | (((w & 0xFFFFF) + 1) & 0xFFFFF))
            if ok:
                return

    def _recompute_earliest(self, tab: Mapped, defs: list[_Def]) -> None:
        # Expect the word read *before* the scan: a lowering by an add meanwhile makes this CAS
        # fail, so a scan that missed a new schedule never hides it.
        seen = tab.load64(OFF_EARLIEST)
        m = NEVER
        now = _now_ms()
        for d in defs:
            if tab.load64(self._eoff(d.slot, E_UID)) != d.uid:
                m = min(m, now)
                continue
            phase, _owner, t = _unpack(tab.load64(self._eoff(d.slot, E_FIRE)))
            m = min(m, t if phase == PH_IDLE else now + int(FIRING_RECHECK * 1000))
        tab.cas64(OFF_EARLIEST, seen, (m << 20) | (((seen & 0xFFFFF) + 1) & 0xFFFFF))

    def _init_entry(self, tab: Mapped, d: _Def) -> None:
        """Give ``d`` a fresh entry (first tick after now); under the definitions flock."""
        first = d.next_after(_now_ms())
        tab.store64(self._eoff(d.slot, E_UID), 0)
        tab.store64(self._eoff(d.slot, E_LAST), 0)
        tab.store64(self._eoff(d.slot, E_CLAIMED), 0)
        tab.store64(self._eoff(d.slot, E_FIRE), _pack(PH_IDLE, 0, first))
        tab.store64(self._eoff(d.slot, E_UID), d.uid)
        tab.msync(self._eoff(d.slot, 0), ENTRY)
        self._lower_earliest(tab, first)

    # -- public operations

    def add(
        self,
        name: str,
        payload: Any,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        priority: int = 0,
        max_attempts: int | None = None,
    ) -> Schedule:
        """Create or replace schedule ``name``; see :meth:`ringq.Queue.schedule`."""
        q = self._q()
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError(f"schedule name must match [A-Za-z0-9_.-]{{1,64}}, got {name!r}")
        if (cron is None) == (every is None):
            raise ValueError("give exactly one of cron= (a cron expression) and every= (seconds)")
        _zone(tz)
        every_ms = None
        if every is not None:
            secs = as_float(every)
            if not MIN_EVERY <= secs <= MAX_EVERY:
                raise ValueError(
                    f"every must be a number of seconds in [{MIN_EVERY}, {MAX_EVERY:.0f}], got {every!r}"
                )
            every_ms = max(1, int(round(secs * 1000)))
        else:
            check_cron(cron, tz)
        priority = check_priority(priority)
        if max_attempts is not None:
            max_attempts = check_attempts(max_attempts)
        kind, data = codec.encode(payload)
        with self._lock:
            tab = self._table(create=True)
            with forksafe.flocked(self.ticks_path, os.O_RDWR | os.O_NOFOLLOW):
                defs = _read_defs(self.sched_path)
                old = next((d for d in defs if d.name == name), None)
                now = _now_ms()
                new = _Def(
                    name=name,
                    slot=-1,
                    uid=0,
                    codec=kind,
                    data=data,
                    cron=cron,
                    every_ms=every_ms,
                    tz=tz,
                    priority=priority,
                    max_attempts=max_attempts,
                    anchor_ms=now,
                )
                if old is not None:
                    same_timing = (old.cron, old.every_ms, old.tz) == (cron, every_ms, tz)
                    keep = dict(
                        slot=old.slot,
                        uid=old.uid if same_timing else _uid(defs),
                        anchor_ms=old.anchor_ms if same_timing else now,
                    )
                    new = _Def(**{**new.__dict__, **keep})
                    if new == old and tab.load64(self._eoff(old.slot, E_UID)) == old.uid:
                        self._defs, self._defs_version = defs, tab.load64(OFF_DEFS_VERSION)
                        return self._view(tab, old)
                    defs = [new if d.name == name else d for d in defs]
                else:
                    used = {d.slot for d in defs}
                    free = next((s for s in range(CAPACITY) if s not in used), None)
                    if free is None:
                        raise RingqError(
                            f"{self.sched_path}: all {CAPACITY} schedules are in use; remove one first"
                        )
                    new = _Def(**{**new.__dict__, "slot": free, "uid": _uid(defs)})
                    defs = [*defs, new]
                _write_defs(self.sched_path, defs, self.mode)
                if (
                    old is None
                    or old.uid != new.uid
                    or tab.load64(self._eoff(new.slot, E_UID)) != new.uid
                ):
                    self._init_entry(tab, new)
                tab.add64(OFF_DEFS_VERSION, 1)
                self._defs, self._defs_version = defs, tab.load64(OFF_DEFS_VERSION)
            result = self._view(tab, new)
        q.wake()  # sleeping workers re-read their wait bound
        return result

    def list(self) -> list[Schedule]:
        """Every schedule, in the order they were created."""
        self._q()
        with self._lock:
            tab = self._table(create=False) if self._tab is None else self._tab
            if tab is None:
                self._looked = -1e9  # an explicit call always looks
                tab = self._table(create=False)
                if tab is None:
                    return []
            return [self._view(tab, d) for d in self._defs_now(tab)]

    def remove(self, name: str) -> None:
        """Delete schedule ``name``; its jobs already enqueued stay.  Raises ScheduleNotFoundError."""
        self._q()
        with self._lock:
            self._looked = -1e9
            tab = self._table(create=False)
            if tab is None:
                raise ScheduleNotFoundError(f"no schedule named {name!r} in queue {self.name!r}")
            with forksafe.flocked(self.ticks_path, os.O_RDWR | os.O_NOFOLLOW):
                defs = _read_defs(self.sched_path)
                gone = next((d for d in defs if d.name == name), None)
                if gone is None:
                    raise ScheduleNotFoundError(
                        f"no schedule named {name!r} in queue {self.name!r}"
                    )
                defs = [d for d in defs if d.name != name]
                _write_defs(self.sched_path, defs, self.mode)
                tab.store64(self._eoff(gone.slot, E_UID), 0)
                tab.store64(self._eoff(gone.slot, E_FIRE), 0)
                tab.msync(self._eoff(gone.slot, 0), ENTRY)
                tab.add64(OFF_DEFS_VERSION, 1)
                self._defs, self._defs_version = defs, tab.load64(OFF_DEFS_VERSION)

    def due_in(self) -> float | None:
        """Seconds until the earliest tick of any schedule (<= 0: one is due now), or None if the
        queue has no schedules.  One atomic load; a missing table is looked for once a second."""
        with self._lock:
            tab = self._tab if self._tab is not None else self._table(create=False)
            if tab is None:
                return None
            ms = tab.load64(OFF_EARLIEST) >> 20
        return None if ms >= NEVER else ms / 1000 - time.time()

    def run_due(self) -> builtins.list[Job]:
        """Fire every tick that is due; returns the jobs enqueued (one per schedule at most).

        Raises whatever the enqueue raises (QueueFullError, LockTimeoutError, ...) after giving the
        tick back, so that the next call (in any process) fires it; ScheduleFileError for damage.
        """
        q = self._q()
        fired: list[Job] = []
        with self._lock:
            tab = self._tab if self._tab is not None else self._table(create=False)
            if tab is None:
                return fired
            defs = self._defs_now(tab)
            me = self._owners.acquire()
            for d in defs:
                job = self._fire_one(q, tab, d, me)
                if job is not None:
                    fired.append(job)
            self._recompute_earliest(tab, defs)
        return fired

    def _fire_one(self, q: Queue, tab: Mapped, d: _Def, me: int) -> Job | None:
        if tab.load64(self._eoff(d.slot, E_UID)) != d.uid:
            # an add that died before initialising the entry
            with forksafe.flocked(self.ticks_path, os.O_RDWR | os.O_NOFOLLOW):
                if (
                    _read_defs(self.sched_path) == self._defs
                    and tab.load64(self._eoff(d.slot, E_UID)) != d.uid
                ):
                    self._init_entry(tab, d)
            return None
        off = self._eoff(d.slot, E_FIRE)
        w = tab.load64(off)
        phase, owner, t = _unpack(w)
        now = _now_ms()
        if phase == PH_IDLE:
            if t > now:
                return None
            tick = d.latest_at_or_before(now, t)
        elif phase == PH_FIRING:
            claimed = tab.load64(self._eoff(d.slot, E_CLAIMED))
            stale = now - claimed > CLAIM_STALE * 1000
            if not stale and (owner != me or self._firing) and self._owners.is_alive(owner):
                return None  # a live process is firing it
            tick = t  # take the claim over: the same tick, so the same job id
        else:
            return None
        claim = _pack(PH_FIRING, me, tick)
        ok, _ = tab.cas64(off, w, claim)
        if not ok:
            return None  # another process decided this tick
        tab.store64(self._eoff(d.slot, E_CLAIMED), now)
        self._firing += 1
        try:
            try:
                job = q.enqueue(
                    codec.decode(d.codec, d.data),
                    priority=d.priority,
                    max_attempts=d.max_attempts,
                    job_id=job_id_for(d.name, tick),
                )
            except BaseException:
                # Give the tick back (as due), so the next look in any process fires it.
                tab.cas64(off, claim, _pack(PH_IDLE, 0, tick))
                raise
            tab.store64(self._eoff(d.slot, E_LAST), tick)
            tab.cas64(off, claim, _pack(PH_IDLE, 0, d.next_after(tick)))
            tab.msync(self._eoff(d.slot, 0), ENTRY)
        finally:
            self._firing -= 1
        return job

    def _view(self, tab: Mapped, d: _Def) -> Schedule:
        phase, _owner, t = _unpack(tab.load64(self._eoff(d.slot, E_FIRE)))
        known = tab.load64(self._eoff(d.slot, E_UID)) == d.uid
        last = tab.load64(self._eoff(d.slot, E_LAST)) if known else 0
        return Schedule(
            name=d.name,
            payload=codec.decode(d.codec, d.data),
            cron=d.cron,
            every=None if d.every_ms is None else d.every_ms / 1000,
            tz=d.tz,
            priority=d.priority,
            max_attempts=d.max_attempts,
            next_fire=(t / 1000 if phase == PH_IDLE else None) if known else None,
            last_fire=last / 1000 if last else None,
            firing=known and phase == PH_FIRING,
            firing_tick=t / 1000 if known and phase == PH_FIRING else None,
        )


def _uid(defs: list[_Def]) -> int:
    taken = {d.uid for d in defs}
    while True:
        u = int.from_bytes(os.urandom(8), "little")
        if u and u not in taken:
            return u


class Schedules:
    """The periodic jobs of one local queue (the API is :class:`ringq.Queue`'s).  Its
    :class:`Scheduler` is made on first use, so a queue without schedules never maps their files."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._made: Scheduler | None = None
        self._making = threading.Lock()

    def _scheduler(self) -> Scheduler:
        with self._making:
            if self._made is None:
                self._made = Scheduler(self.queue)
            return self._made

    def close(self) -> None:
        with self._making:
            if self._made is not None:
                self._made.close()

    def schedule(
        self,
        name: str,
        payload: Any,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        priority: int = 0,
        max_attempts: int | None = None,
    ) -> Schedule:
        """As :meth:`ringq.Queue.schedule`."""
        return self._scheduler().add(
            name,
            payload,
            cron=cron,
            every=every,
            tz=tz,
            priority=priority,
            max_attempts=max_attempts,
        )

    def schedules(self) -> list[Schedule]:
        """As :meth:`ringq.Queue.schedules`."""
        return self._scheduler().list()

    def unschedule(self, name: str) -> None:
        """As :meth:`ringq.Queue.unschedule`."""
        self._scheduler().remove(name)

    def run_schedules(self) -> list[Job]:
        """As :meth:`ringq.Queue.run_schedules`."""
        if self.queue.closed:
            raise QueueClosedError(f"queue {self.queue.name!r} in {self.queue.path} is closed")
        return self._scheduler().run_due()

    def next_schedule_fire(self) -> float | None:
        """As :meth:`ringq.Queue.next_schedule_fire`."""
        if self.queue.closed:
            raise QueueClosedError(f"queue {self.queue.name!r} in {self.queue.path} is closed")
        return self._scheduler().due_in()
