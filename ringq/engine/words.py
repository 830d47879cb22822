"""The shared words of a segment: the state word, the owner word, and queue-wide positions.

Every bit of these words is defined here, once, with a scalar form (Python ints) and a numpy form
(vectors of words copied out of a state table).  Nothing else spells a mask or a shift.  The state
and reason numbers come from the C header (``RINGQ_ST_*``, ``RINGQ_WHY_*`` in ``csrc/ringq.h``),
which the C helper shares.  Byte layouts: ``docs/format.md``.

State word (u64, changed only by CAS after it is published)::

    bits 0-2   state        EMPTY READY LEASED DONE DEAD GONE CONT BAD
    bits 3-4   reason       why the job last left LEASED: none, lease expired, holder died, purged;
                            in a DONE word with the cancel flag: why it ended unrun (cancelled, expired)
    bit 5      cancel flag  LEASED: cancel requested (the holder should stop); DONE: the job ended
                            without completing (cancelled, or expired before it was leased);
                            READY: the job is DEFERRED (waits for its parents, ringq/engine/deps.py),
                            its time TIME_MAX, lease count 0 and reason 0
    bits 6-23  lease count  leases so far: the job's fencing token
    bits 24-63 time         ms since the segment's epoch: available-at (READY), lease deadline
                            (LEASED), finish time (DONE, DEAD)

Owner word (u64, next to each state word)::

    bits 0-15  owner index  the lease holder's byte in ``<name>.owners`` (0: detached lease)
    bits 16-33 lease count  the lease the owner word belongs to (a stale owner word is recognised)
    bits 34-63 pid          for people reading the file, and to find the leases of a stopped
                            child being killed (kill_and_give_back); never a sign that it lives

Position (u64): ``(segment seq << 24) | slot``; orders every slot of the queue.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ._native import lib

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "ST_EMPTY",
    "ST_READY",
    "ST_LEASED",
    "ST_DONE",
    "ST_DEAD",
    "ST_GONE",
    "ST_CONT",
    "ST_BAD",
    "WHY_NONE",
    "WHY_EXPIRED",
    "WHY_DIED",
    "WHY_PURGED",
    "FLAG_CANCEL",
    "END_CANCELLED",
    "END_EXPIRED",
    "END_RECLAIMED",
    "cancel_flag",
    "np_cancel_flag",
    "DEFERRED_TIME",
    "deferred_word",
    "is_deferred",
    "np_deferred",
    "np_why",
    "LC_MASK",
    "TIME_SHIFT",
    "TIME_MAX",
    "SLOT_BITS",
    "pack",
    "unpack",
    "state",
    "why",
    "lease_count",
    "rel_time",
    "with_state",
    "with_time",
    "owner_pack",
    "owner_index",
    "owner_lease_count",
    "owner_pid",
    "position",
    "split_position",
    "np_state",
    "np_lease_count",
    "np_rel_time",
    "np_owner_index",
    "np_owner_lease_count",
    "np_owner_pid",
    "np_pack",
    "now_ms",
]

ST_EMPTY = lib.RINGQ_ST_EMPTY
ST_READY = lib.RINGQ_ST_READY
ST_LEASED = lib.RINGQ_ST_LEASED
ST_DONE = lib.RINGQ_ST_DONE
ST_DEAD = lib.RINGQ_ST_DEAD
ST_GONE = lib.RINGQ_ST_GONE
ST_CONT = lib.RINGQ_ST_CONT
ST_BAD = lib.RINGQ_ST_BAD
WHY_NONE = lib.RINGQ_WHY_NONE
WHY_EXPIRED = lib.RINGQ_WHY_EXPIRED
WHY_DIED = lib.RINGQ_WHY_DIED
WHY_PURGED = lib.RINGQ_WHY_PURGED

STATE_MASK = 0x7
WHY_SHIFT = lib.RINGQ_W_WHY_SHIFT
WHY_MASK = 0x3
# Bit 5 is set only by Python (policy); the C helper never builds a word with it and hands a
# word carrying it back to Python (ringq_take_run, ringq_ack).
FLAG_CANCEL = lib.RINGQ_W_CANCEL
# The reason field of a DONE word carrying FLAG_CANCEL: how the job ended without completing.
END_CANCELLED = lib.RINGQ_END_CANCELLED  # pending, or its holder acked/nacked a cancel request
END_EXPIRED = lib.RINGQ_END_EXPIRED  # its expires-at passed before anyone leased it
END_RECLAIMED = lib.RINGQ_END_RECLAIMED  # its cancel-requested lease was reclaimed: never acked
LC_SHIFT = lib.RINGQ_W_LC_SHIFT
LC_MASK = lib.RINGQ_W_LC_MASK
LC_BITS = LC_MASK.bit_length()
TIME_SHIFT = lib.RINGQ_W_TIME_SHIFT
TIME_MAX = lib.RINGQ_W_TIME_MAX  # ms: about 34.8 years after a segment's epoch
DEFERRED_TIME = TIME_MAX  # the time field of a DEFERRED word (deferred_word)
LOW_MASK = (1 << TIME_SHIFT) - 1  # state, reason and lease count: everything but the time

OWNER_IDX_MASK = 0xFFFF
OWNER_LC_SHIFT = lib.RINGQ_OW_LC_SHIFT
OWNER_PID_SHIFT = 34
OWNER_PID_MASK = 0x3FFFFFFF

SLOT_BITS = 24  # slot counts are below 2**24 (segment.MAX_SLOT_COUNT)
SLOT_MASK = (1 << SLOT_BITS) - 1


# -- scalar forms ------------------------------------------------------------------------------------


def pack(st: int, reason: int, lc: int, time_rel: int) -> int:
    """Build a state word; ``time_rel`` (ms since the segment's epoch) is clamped to [0, TIME_MAX]."""
    if time_rel < 0:
        time_rel = 0
    elif time_rel > TIME_MAX:
        time_rel = TIME_MAX
    return st | (reason << WHY_SHIFT) | ((lc & LC_MASK) << LC_SHIFT) | (time_rel << TIME_SHIFT)


def unpack(word: int) -> tuple[int, int, int, int]:
    """Split a state word into ``(state, reason, lease count, time ms since the segment's epoch)``."""
    return state(word), why(word), lease_count(word), word >> TIME_SHIFT


def state(word: int) -> int:
    return word & STATE_MASK


def why(word: int) -> int:
    return (word >> WHY_SHIFT) & WHY_MASK


def cancel_flag(word: int) -> bool:
    """True if the word carries the cancel flag (see the module docstring)."""
    return bool(word & FLAG_CANCEL)


def deferred_word() -> int:
    """The state word of a DEFERRED job: READY with the cancel flag, lease count 0 and the
    farthest time.  Every lease path leases only READY words without the flag (the C helper's
    one-call leases hand such a word back to Python, which never leases it), and the time is
    never due, so a path that forgot the flag would still see a job delayed for 34 years."""
    return pack(ST_READY, WHY_NONE, 0, TIME_MAX) | FLAG_CANCEL


def is_deferred(word: int) -> bool:
    """True for the state word of a DEFERRED job (READY with the cancel flag)."""
    return word & (STATE_MASK | FLAG_CANCEL) == ST_READY | FLAG_CANCEL


def lease_count(word: int) -> int:
    return (word >> LC_SHIFT) & LC_MASK


def rel_time(word: int) -> int:
    """The word's time, ms since its segment's epoch."""
    return word >> TIME_SHIFT


def with_state(word: int, st: int, reason: int | None = None) -> int:
    """``word`` with its state replaced (and its reason, if given); lease count and time kept."""
    if reason is None:
        return (word & ~STATE_MASK) | st
    return (word & ~(STATE_MASK | (WHY_MASK << WHY_SHIFT))) | st | (reason << WHY_SHIFT)


def with_time(word: int, time_rel: int) -> int:
    """``word`` with its time replaced (clamped to [0, TIME_MAX] ms)."""
    return (word & LOW_MASK) | (min(max(time_rel, 0), TIME_MAX) << TIME_SHIFT)


def owner_pack(index: int, lc: int, pid: int) -> int:
    """An owner word: owner index, the lease count it belongs to, and the holder's pid."""
    return index | ((lc & LC_MASK) << OWNER_LC_SHIFT) | ((pid & OWNER_PID_MASK) << OWNER_PID_SHIFT)


def owner_index(word: int) -> int:
    return word & OWNER_IDX_MASK


def owner_lease_count(word: int) -> int:
    return (word >> OWNER_LC_SHIFT) & LC_MASK


def owner_pid(word: int) -> int:
    """The pid field of an owner word (the holder's pid, its low 30 bits)."""
    return (word >> OWNER_PID_SHIFT) & OWNER_PID_MASK


def position(seg_seq: int, slot: int) -> int:
    """The queue-wide position of ``slot`` in segment ``seg_seq``; positions order all slots."""
    return (seg_seq << SLOT_BITS) | slot


def split_position(pos: int) -> tuple[int, int]:
    """``(segment seq, slot)`` of a position (also the form of a record's ``supersedes`` field)."""
    return pos >> SLOT_BITS, pos & SLOT_MASK


# -- numpy forms (vectors of uint64 words) ---------------------------------------------------------
# numpy is imported by the first call, not with this module: an enqueue never needs it.


def np_state(words: np.ndarray) -> np.ndarray:
    import numpy as np

    return words & np.uint64(STATE_MASK)


def np_cancel_flag(words: np.ndarray) -> np.ndarray:
    import numpy as np

    return (words & np.uint64(FLAG_CANCEL)) != 0


def np_deferred(words: np.ndarray) -> np.ndarray:
    """True where a word is DEFERRED (:func:`is_deferred`)."""
    import numpy as np

    return (words & np.uint64(STATE_MASK | FLAG_CANCEL)) == np.uint64(ST_READY | FLAG_CANCEL)


def np_why(words: np.ndarray) -> np.ndarray:
    import numpy as np

    return (words >> np.uint64(WHY_SHIFT)) & np.uint64(WHY_MASK)


def np_lease_count(words: np.ndarray) -> np.ndarray:
    import numpy as np

    return (words >> np.uint64(LC_SHIFT)) & np.uint64(LC_MASK)


def np_rel_time(words: np.ndarray) -> np.ndarray:
    """Times of the words as int64 ms since the segment's epoch."""
    import numpy as np

    return (words >> np.uint64(TIME_SHIFT)).astype(np.int64)


def np_owner_index(owners: np.ndarray) -> np.ndarray:
    import numpy as np

    return owners & np.uint64(OWNER_IDX_MASK)


def np_owner_lease_count(owners: np.ndarray) -> np.ndarray:
    import numpy as np

    return (owners >> np.uint64(OWNER_LC_SHIFT)) & np.uint64(LC_MASK)


def np_owner_pid(owners: np.ndarray) -> np.ndarray:
    import numpy as np

    return (owners >> np.uint64(OWNER_PID_SHIFT)) & np.uint64(OWNER_PID_MASK)


def np_pack(st: np.ndarray, reason: np.ndarray, lc: np.ndarray, time_rel: int) -> np.ndarray:
    """Vector :func:`pack` with one time (ms since the epoch, >= 0) for every word."""
    import numpy as np

    u = np.uint64
    return (
        st.astype(u)
        | (reason.astype(u) << u(WHY_SHIFT))
        | (lc.astype(u) << u(LC_SHIFT))
        | (u(time_rel) << u(TIME_SHIFT))
    )


def now_ms() -> int:
    """The wall clock in ms since the Unix epoch: the clock every time in a state word counts by."""
    return time.time_ns() // 1_000_000
