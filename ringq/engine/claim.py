"""A lease and an ack in one C call each (csrc/claim.c), as a consumer of another package calls them.

The C calls write their results into structs the caller passes.  Threads of one process call
them at once -- a waiting lease runs outside the queue lock -- so every struct here is per
thread: no thread ever reads another's results.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from . import native
from .control import CTL_WORDS, OFF_CTL_CHANGE, OFF_WAITERS, OFF_WAKE, Control
from .native import ffi, lib
from .segment import Segment

__all__ = [
    "WaitClaimed",
    "wait_claim",
    "ack_slot",
    "ACKED",
    "REPEATED",
    "REFUSED",
    "CANCEL_REQUESTED",
]

# ringq_ack_slot's answers (csrc/ringq.h)
ACKED, REPEATED, REFUSED, CANCEL_REQUESTED = 0, 1, 2, 3


class WaitClaimed(NamedTuple):
    """A lease ringq_wait_claim took: the slot, the LEASED word it wrote, the READY word it replaced."""

    slot: int
    word: int
    prev: int


class _Buffers(threading.local):
    def __init__(self) -> None:
        self.args = ffi.new(
            "ringq_wait_args *",
            {"wake_off": OFF_WAKE, "waiters_off": OFF_WAITERS, "change_off": OFF_CTL_CHANGE},
        )
        self.out = ffi.new("ringq_claim_out *")
        self.word = ffi.new("uint64_t *")
        self.finished = ffi.new("uint64_t *")


_buffers = _Buffers()


def wait_claim(
    ctl: Control,
    seg: Segment,
    seen: int,
    change_seen: int,
    from_slot: int,
    timeout: float,
    spin: float,
    vt_ms: int,
    owner_base: int,
) -> WaitClaimed | None:
    """Sleep until the wake word moves from ``seen`` (spinning first for ``spin`` seconds), at
    most ``timeout`` seconds; then, if the only news is new plain records of ``seg`` (the tail
    segment) from ``from_slot`` on and no job returned to READY since ``change_seen``, lease the
    first of them for ``vt_ms`` ms with owner word ``owner_base`` (csrc/ringq.h has the exact
    rule).  None: timed out, or woken by something the caller must look at itself."""
    bufs = _buffers
    a, co = bufs.args, bufs.out
    a.wake_seen = seen
    a.change_seen = change_seen
    a.spin_ns = int(min(spin, timeout) * 1e9)
    a.timeout_ns = int(timeout * 1e9)
    a.epoch_ms = seg.epoch_ms
    a.vt_ms = vt_ms
    a.owner_base = owner_base
    a.from_slot = from_slot
    native.check(
        lib.ringq_wait_claim(ctl.ptr, ctl.size, seg.ptr, seg.size, seg.geom, a, co), seg.path
    )
    if co.status != lib.RINGQ_CLAIMED:
        return None
    return WaitClaimed(co.slot, co.word, co.prev)


def ack_slot(
    seg: Segment, slot: int, token: int, now_rel: int, ctl: Control
) -> tuple[int, int, int]:
    """CAS ``slot``'s lease with fencing token ``token`` (0: any) to DONE at ``now_rel`` (ms since
    the segment's epoch), counting it finished and acked.  Returns ``(answer, word, finished)``:
    ACKED (``word`` the DONE word, ``finished`` the segment's new finished count), REPEATED,
    REFUSED (``word`` the word seen) or CANCEL_REQUESTED; raises for a bounds error."""
    bufs = _buffers
    rc = lib.ringq_ack_slot(
        seg.ptr,
        seg.size,
        seg.geom,
        slot,
        token,
        now_rel,
        ctl.ptr,
        ctl.size,
        CTL_WORDS,
        bufs.word,
        bufs.finished,
    )
    native.check(min(rc, 0), seg.path)
    return rc, bufs.word[0], bufs.finished[0]
