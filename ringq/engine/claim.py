"""A lease and an ack in one C call each (csrc/claim.c), as a consumer of another package calls them.

The C calls write their results into structs the caller passes.  Threads of one process call
them at once -- a waiting lease runs outside the queue lock -- so every struct here is per
thread: no thread ever reads another's results; except the ack's, which is per queue and used
under the queue's lock (:func:`ack_out`).
"""

from __future__ import annotations

import threading
from array import array
from typing import Any

from ringq.codec import KEYED
from ringq.job import Job

from . import native, runs
from .control import OFF_CTL_CHANGE, OFF_MIN_DEADLINE, OFF_TAIL_SEG, OFF_WAITERS, OFF_WAKE, Control
from .native import CData, ffi, lib
from .records import CLAIMED
from .segment import Segment

__all__ = [
    "WaitClaimed",
    "wait_claim",
    "wait_reached",
    "claim_run",
    "pending_run",
    "RUN_END",
    "RUN_ASK",
    "RUN_BOUND",
    "RUN_FULL",
    "ack",
    "ack_out",
    "ACKED",
    "REPEATED",
    "REFUSED",
    "CANCEL_REQUESTED",
    "EXPIRED",
    "OTHER",
]

# ringq_ack's answers (csrc/ringq.h)
ACKED, REPEATED, REFUSED, CANCEL_REQUESTED = 0, 1, 2, 3
EXPIRED, OTHER = lib.RINGQ_ACK_EXPIRED, lib.RINGQ_ACK_OTHER
# Why ringq_claim_run stopped.
RUN_END, RUN_ASK, RUN_BOUND, RUN_FULL = (
    lib.RINGQ_RUN_END,
    lib.RINGQ_RUN_ASK,
    lib.RINGQ_RUN_BOUND,
    lib.RINGQ_RUN_FULL,
)
RUN_CAP = 256  # most jobs one ringq_claim_run call leases
# ringq_claim_out.status: what the wait's look found (read per wake-up: module constants, not
# attributes of the helper's lib)
_NONE, _CLAIMED = lib.RINGQ_CLAIM_NONE, lib.RINGQ_CLAIMED


# A lease ringq_wait_claim took: (slot, the LEASED word it wrote, the READY word it replaced,
# record, job) -- either its Job, built in the same call (record None), or its ringq_claimed
# record as claim_run reports a job (bytes: records.CLAIMED_FIELDS; job None).  A plain tuple:
# the extension builds it, and the caller unpacks it.
WaitClaimed = tuple[int, int, int, "bytes | None", "Job | None"]


class _Buffers(threading.local):
    def __init__(self) -> None:
        self.args = ffi.new(
            "ringq_wait_args *",
            {
                "wake_off": OFF_WAKE,
                "waiters_off": OFF_WAITERS,
                "change_off": OFF_CTL_CHANGE,
                "floor_off": OFF_MIN_DEADLINE,
                "floor_gen_bits": Control.FLOOR_GEN_BITS,
                "tail_seg_off": OFF_TAIL_SEG,
            },
        )
        self.out = ffi.new("ringq_claim_out *")
        self.rec = ffi.new("ringq_claimed *")
        self.rec_buf = ffi.buffer(self.rec)
        # The same three, as runs.wait_job takes them.
        self.addrs = tuple(int(ffi.cast("uintptr_t", p)) for p in (self.args, self.out, self.rec))
        # claim_run's run keys, next index, reason and count of jobs leased (the count stays
        # until the caller holds their jobs: pending_run), results, the run_fields ``keys``
        # points at (a view's, fixed for the view's life) and the segment of the last run: one
        # attribute, because each read of a thread-local attribute costs.
        run = ffi.new("ringq_claimed[]", RUN_CAP)
        fields: list[Any] = [None, None]
        self.take = (
            ffi.new("ringq_run_keys *"),
            ffi.new("uint32_t[3]"),
            run,
            ffi.buffer(run),
            fields,
        )


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
    first of them for ``vt_ms`` ms with owner word ``owner_base``, lowering ``ctl``'s
    lease-deadline floor to its deadline (csrc/ringq.h has the exact rule); returns the lease as
    :data:`WaitClaimed` describes, with its Job built in the same call (runs.wait_job) unless the
    job is keyed or that call is off.  None: timed out, or woken by something the caller must
    look at itself -- also at once when ``seg`` was closed (retired by another thread: the caller
    waits without the queue lock)."""
    mapping, size = seg.ptr, seg.size  # in this order: a close zeroes the size, then drops ptr
    if mapping is None or not size:
        return None
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
    co.status = _NONE  # nothing pending (pending_claim) until the call claims
    # ``mapping`` keeps the segment mapped through the call, whoever closes it meanwhile.
    wait_job = runs.wait_job
    if wait_job is not None:  # the lease's Job built in the same call
        args_addr, out_addr, rec_addr = bufs.addrs
        made = wait_job(
            seg.ref_addr,
            mapping,
            ctl.ref_addr,
            args_addr,
            out_addr,
            rec_addr,
            seg.seq,
            seg.origin,
            KEYED,
        )
        if made is None:
            return None
        if made.__class__ is int:
            native.check(made, seg.path)
        # WaitClaimed's fields, in a plain tuple.  An exception (a signal's handler) raised before
        # the status is cleared leaves the lease to pending_claim; from the clearing to the
        # caller's assignment nothing can raise one (the interpreter runs handlers after calls
        # and on entering functions, and none is made).
        co.status = _NONE
        return made
    rc = lib.ringq_wait_claim(ctl.ptr, ctl.size, mapping, size, seg.geom, a, co, bufs.rec)
    if rc < 0:
        native.check(rc, seg.path)
    if co.status != _CLAIMED:
        return None
    got = (co.slot, co.word, co.prev, bufs.rec_buf[:], None)
    co.status = _NONE
    return got


def pending_claim() -> WaitClaimed | None:
    """The lease the last :func:`wait_claim` of this thread took in C if an exception (a signal
    handler's, raised as the call returned) kept it from reaching the caller; None otherwise.
    Each such lease is returned once: the caller gives it back."""
    co = _buffers.out
    if co.status != _CLAIMED:
        return None
    co.status = _NONE
    return (co.slot, co.word, co.prev, _buffers.rec_buf[:], None)


def wait_reached() -> int:
    """The slot the last :func:`wait_claim` of this thread looked up to: the new records before
    it, from its ``from_slot`` on, were all taken by other consumers (ringq_claim_out.index)."""
    return int(_buffers.out.index)


def ack_out() -> tuple[CData, array[int], int]:
    """The buffer :func:`ack` reports into, one per queue and used under the queue's lock: the
    pointer to pass, the three words it holds (read from the array: no conversion per word), and
    its address (for ringq/engine/runs.py's first_ack)."""
    words = array("Q", (0, 0, 0))
    ptr = ffi.from_buffer("uint64_t[]", words)
    return ptr, words, int(ffi.cast("uintptr_t", ptr))


def ack(seg: Segment, slot: int, token: int, seq: int, ctl: Control, out: CData) -> int:
    """CAS ``slot``'s lease with fencing token ``token`` (0: any) to DONE at the current time,
    counting it finished and acked (ringq_ack).  Returns ACKED (then ``out`` holds the DONE word,
    the segment's new finished count and the control page's dependents counter read after the
    CAS), REPEATED, REFUSED (``out[0]`` the word seen) or CANCEL_REQUESTED; raises for a bounds
    error (a closed segment or control page).  A nonzero ``seq`` (the job's) is for a caller that
    has not looked at the slot: nothing is changed and the answer is OTHER when the slot's record
    is another job's, EXPIRED when the lease the token names has run out.  ``out`` is the
    caller's (:func:`ack_out`).  The control page is unmapped only under the queue's lock, which
    the caller holds."""
    mapping = seg.ptr  # held through the call: a close meanwhile cannot unmap under it
    rc: int = lib.ringq_ack(seg.ref, ctl.ref, slot, token, seq, out)
    del mapping
    if rc < 0:
        native.check(rc, seg.path)
    return rc


def claim_run(
    seg: Segment,
    ctl: Control,
    order: CData,
    n: int,
    start: int,
    plain: CData,
    fields: tuple[CData, CData, CData],
    bound: tuple[int, int, int] | None,
    vt_ms: int,
    owner_base: int,
    cap: int,
) -> tuple[int, bytes, int, int, CData]:
    """Lease up to ``cap`` (at most RUN_CAP) of a lane's plain jobs due now, each for ``vt_ms``
    milliseconds, in one call (ringq_take_run, which also lowers ``ctl``'s lease-deadline floor to
    their deadline): ``order[start:n]`` its head slots, ``plain`` the index's per-slot flags,
    ``fields`` its per-slot available-at (ms), enqueue time (µs) and seq vectors, ``bound`` the
    ``(available ms, enqueue µs, seq)`` of the best candidate outside the lane (None: none ranks
    near).  Returns ``(jobs leased, their ringq_claimed records (bytes), next index, why it
    stopped, marker)`` (records.CLAIMED_FIELDS).  Raises for a bounds error.

    The jobs leased stay this thread's pending run until the caller sets ``marker[2]`` to 0,
    with no call between its holding their jobs and that store (:func:`pending_run` finds them
    again if an exception, a signal handler's, kept them from the caller)."""
    k, nxt, run, run_buf, pointed = _buffers.take
    pointed[1] = seg  # the run's segment, for pending_run
    if fields is not pointed[0]:
        k.avail_ms, k.enq_us, k.seq = fields
        pointed[0] = fields
    if bound is None:
        k.bounded = 0
    else:
        k.bounded = 1
        k.bound_avail_ms, k.bound_enq_us, k.bound_seq32 = bound[0], bound[1], bound[2] & 0xFFFFFFFF
    mapping = seg.ptr  # held through the call: a close meanwhile cannot unmap under it
    got = lib.ringq_take_run(
        seg.ref,
        ctl.ref,
        order,
        n,
        start,
        plain,
        k,
        vt_ms,
        owner_base,
        run,
        min(cap, RUN_CAP),
        nxt,
    )
    del mapping
    if got < 0:
        native.check(got, seg.path)
    return got, run_buf[: got * CLAIMED.size], nxt[0], nxt[1], nxt


def pending_run() -> tuple[Segment, bytes] | None:
    """The last :func:`claim_run` of this thread whose jobs the caller never came to hold (an
    exception, a signal handler's, cut it short between the C call and the store of its
    marker's ``[2]``): its segment and its ringq_claimed records, once; None otherwise.  The
    caller gives the leases back."""
    _k, nxt, _run, run_buf, pointed = _buffers.take
    n = nxt[2]
    seg = pointed[1]
    if not n or seg is None:
        return None
    nxt[2] = 0
    return seg, run_buf[: n * CLAIMED.size]
