"""What a reader knows of each segment: the per-slot copy of its records' immutable fields
(``View``), its lanes (``Lane``), the growable vectors behind them (``Grow``), and the keys jobs
are ordered by (``order``, ``due``).  Built by ringq/engine/catchup.py, ordered by ringq/engine/index.py."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ._native import ffi
from .mapped import crc32c
from .segment import Segment
from .words import lease_count, now_ms, rel_time

if TYPE_CHECKING:  # pragma: no cover
    from .control import Control

__all__ = [
    "View",
    "Lane",
    "Grow",
    "Direct",
    "now_ms",
    "order",
    "due",
    "lane_key",
    "lane_keys",
    "key_id",
]


class Direct:
    """How :meth:`Index.take` leases plain candidates itself: for ``vt_ms`` milliseconds, with
    owner word ``owner_base`` (ringq/engine/words.py owner_pack with lease count 0);
    ``made_run(view, run)`` returns the caller's results for jobs just leased in C (by one
    ringq_claim_run, or the one ringq_wait_claim took), ``run`` the bytes of their ringq_claimed
    records (records.CLAIMED_FIELDS), dropping any it cannot hand out; ``adopt(view, slot, job)``
    the same for one job the C call built itself (ringq_wait_claim's); ``ctl`` the control page whose
    lease-deadline floor each run lowers; ``claim(view, slot, word, now)`` the same lease's
    general path, for a candidate the C call hands back (Index.take's ``claim``)."""

    __slots__ = ("vt_ms", "owner_base", "made_run", "adopt", "ctl", "claim")

    def __init__(
        self,
        vt_ms: int,
        owner_base: int,
        made_run: Callable[[View, bytes], list[Any]],
        adopt: Callable[[View, int, Any], Any],
        ctl: Control,
        claim: Callable[[View, int, int, int], Any],
    ) -> None:
        self.vt_ms = vt_ms
        self.owner_base = owner_base
        self.made_run = made_run
        self.adopt = adopt
        self.ctl = ctl
        self.claim = claim


class Grow:
    """A growable numpy vector with a stable C pointer (``ptr``) between appends."""

    __slots__ = ("a", "n", "ptr", "cptr")

    def __init__(self, dtype: str, cap: int = 64) -> None:
        self.a = np.empty(cap, dtype)
        self.n = 0
        self.ptr = self.a.ctypes.data
        self.cptr = ffi.cast("uint32_t *", self.ptr)  # for uint32 vectors: what the C helper takes

    def extend(self, values: np.ndarray) -> None:
        k = len(values)
        if self.n + k > len(self.a):
            bigger = np.empty(max(2 * len(self.a), self.n + k), self.a.dtype)
            bigger[: self.n] = self.a[: self.n]
            self.a = bigger
            self.ptr = bigger.ctypes.data
            self.cptr = ffi.cast("uint32_t *", self.ptr)
        self.a[self.n : self.n + k] = values
        self.n += k

    def append(self, value: int) -> None:
        if self.n == len(self.a):
            self.extend(np.array([value], self.a.dtype))
            return
        self.a[self.n] = value
        self.n += 1

    def view(self) -> np.ndarray:
        return self.a[: self.n]


class Lane:
    """The head slots of one segment's jobs of one priority (and, for keyed jobs, one key), in
    enqueue order.  ``key``: the lane's key in ``View.lanes`` (:func:`lane_key`)."""

    __slots__ = ("prio", "key", "slots", "cursor", "queued")

    def __init__(self, prio: int, key: int | None = None) -> None:
        self.prio = prio
        self.key = prio if key is None else key
        self.slots = Grow("<u4")
        self.cursor = 0
        self.queued = False  # an entry for this lane is in the ready heap


class View:
    """What this process knows of one segment: immutable record fields, lanes, scan position."""

    __slots__ = (
        "seg",
        "scanned",
        "sealed",
        "change",
        "lanes",
        "heads",
        "head_seqs",
        "prio",
        "seq",
        "enq",
        "avail",
        "maxatt",
        "attb",
        "idlen",
        "lanepos",
        "parkme",
        "entered",
        "plain",
        "plain_ptr",
        "run_fields",
        "lanekey",
    )

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.scanned = 0
        self.sealed = False
        self.change = seg.change()
        self.lanes: dict[int, Lane] = {}
        self.heads = Grow("<u4")
        self.head_seqs = Grow("<u8")
        n = seg.slot_count
        self.prio = np.zeros(n, "<i4")
        self.seq = np.zeros(n, "<u8")
        self.enq = np.zeros(n, "<i8")  # enqueued at, µs (a relocated copy keeps its original's)
        self.avail = np.zeros(n, "<i8")  # available-at from the record header, ms
        self.maxatt = np.zeros(n, "<u2")
        self.attb = np.zeros(n, "<u2")
        self.idlen = np.zeros(n, "<u2")
        self.lanepos = np.zeros(n, "<u4")  # index of each head slot in its lane
        # The lane of each head slot (lane_key): its priority, or its priority and key.
        self.lanekey = np.zeros(n, "<i8")
        self.parkme = np.zeros(
            n, bool
        )  # enqueued with a delay: ordered individually, not by its lane
        # True only while the index holds an individual entry for the slot (Index.parked): the
        # look for returned jobs skips those in one vector operation.
        self.entered = np.zeros(n, bool)
        # 1: no policy applies to the job at this head slot (never delayed, no expiry, not a copy,
        # no carried attempts), so ringq_take_run may lease it directly when it comes first.
        self.plain = np.zeros(n, np.uint8)
        self.plain_ptr = ffi.cast("uint8_t *", self.plain.ctypes.data)
        # What ringq_claim_run compares candidates by (ringq_run_keys): pointers into the vectors.
        self.run_fields = (
            ffi.cast("int64_t *", self.avail.ctypes.data),
            ffi.cast("int64_t *", self.enq.ctypes.data),
            ffi.cast("uint64_t *", self.seq.ctypes.data),
        )


def lane_key(prio: int, kid: int) -> int:
    """The key of a lane in ``View.lanes``: the priority for jobs without a key (``kid`` 0), else
    the priority and the key's id (:func:`key_id`), above every priority."""
    return prio if not kid else (kid << 32) | (prio & 0xFFFFFFFF)


def lane_keys(prio: np.ndarray, kid: np.ndarray) -> np.ndarray:
    """:func:`lane_key` of each element of two int64 arrays."""
    return np.where(kid != 0, (kid << 32) | (prio & 0xFFFFFFFF), prio)


def lane_prio(lanekey: int) -> int:
    """The priority of a lane key (:func:`lane_key`)."""
    if -(1 << 31) <= lanekey < 1 << 31:
        return lanekey
    low = lanekey & 0xFFFFFFFF
    return low - (1 << 32) if low >= 1 << 31 else low


def lane_kid(lanekey: int) -> int:
    """The key id of a lane key (:func:`lane_key`): 0 for the lane of jobs without a key."""
    return 0 if -(1 << 31) <= lanekey < 1 << 31 else lanekey >> 32


@functools.lru_cache(maxsize=1 << 16)  # a reader reads the same few keys again and again
def key_id(key: str) -> int:
    """A job key's id in the lanes: 31 bits of its CRC32C, never 0 (two keys that share one
    share their turns, which only makes them take turns as one key)."""
    return (crc32c(key.encode("utf-8")) & 0x7FFFFFFF) or 1


def order(view: View, slot: int) -> int:
    """FIFO rank of a job among jobs of equal priority and available-at: its enqueue time (µs),
    then its seq.  A relocated copy keeps its original's enqueue time, so it keeps its place."""
    return (view.enq.item(slot) << 32) | (view.seq.item(slot) & 0xFFFFFFFF)


def due(view: View, slot: int, w: int) -> int:
    """Available-at (ms since the epoch) of the READY job at ``slot`` with state word ``w``.

    A state word's time cannot go below its segment's epoch: a relocated copy of a job that was
    due before the copy's segment existed reads as due at that epoch.  Its record header keeps
    the exact time; use it, so the copy keeps its place among jobs due in between."""
    rel = rel_time(w)
    if rel == 0 and not lease_count(w):
        return min(view.seg.epoch_ms, view.avail.item(slot))
    return view.seg.epoch_ms + rel
