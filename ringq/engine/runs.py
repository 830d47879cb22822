"""Job objects built by one call each, from ``ringq.engine._jobs`` (compiled from
csrc/ext/jobs.c by ``pip install``): :func:`build` for a run of jobs leased in C, :func:`fresh`
for a batch just appended; and :func:`first_ack`, an ack's first try in one call.

``build(run, mm, base, size, epoch_ms, segseq, origin, keyed, key_of, held, mark_bad, seg)``
returns the jobs of ``run`` (the bytes of ringq_claimed records, records.CLAIMED_FIELDS, as one C
call leased them from segment ``seg``): ``mm`` is its mapping, ``base`` the mapping offset of slot
0's record header plus the header's size, ``size`` its slot size, ``epoch_ms``, ``segseq`` and
``origin`` its epoch, seq and queue identity, ``keyed`` the keyed envelope's codec id, whose key
``key_of(raw payload)`` reads (:func:`envelope_key`).  Each job gets what a first lease gives it: state
LEASED, attempts, version and fencing token 1, the lease deadline the C call wrote, the record's
fields as reported, its key (a limit key is a field) and its payload left undecoded (Job.payload
decodes it on first access).  With ``held`` (a dict), ``held[(segseq, slot)] = 1`` for each job.
A job whose key does not read (SerializationError) is left out and passed to
``mark_bad(seg, slot, reason)``.  Raises ValueError for a record that runs past ``mm``.

``fresh(placed, heads, seq0, enq_us, avail_ms, payloads, job_ids, priority, max_attempts, key,
shown, origin)`` returns the snapshots of jobs just appended (READY, never leased): ``placed`` a
list of ``(segseq, first, count)`` (jobs ``first`` to ``first + count - 1`` went to segment
``segseq``), ``heads[i]`` job ``i``'s head slot, its seq ``seq0 + i``, its payload
``payloads[i]`` (the value as stored) and its id ``job_ids[i]`` (None: the automatic ids); the
enqueue time (µs), available-at (ms), priority, max_attempts and key shared by all; ``shown`` the
fields ``(expires_at, progress, progress_message, timeout, trace_context)``, the trace context
copied for each job; ``origin`` the queue's identity.  Raises ValueError when ``placed`` names
more jobs than it was given.

``first_ack(job, views, identity, ctl_ref_addr, out_addr)`` is an ack's first try for a Job
snapshot of a lease whose segment ``views`` (the index's, segment seq -> View) maps: the C
helper's ``ringq_ack`` (claim.ack) given the job's slot, fencing token and seq, called with the
GIL held.  Returns ``(view, slot)`` when the ack went in (the job's ``ack_accepted`` set; the
buffer at ``out_addr``, claim.ack_out's, holds the DONE word, the segment's finished count and
the dependents counter), the helper's answer (an int) when it did not, and None when the first
try does not apply (another queue's snapshot, ``identity`` being this queue's; a segment not
mapped here; a token that is not a lease count of 1 to 1024; no seq).  ``ctl_ref_addr`` is the
control page's ``Control.ref_addr``.

The module fills each Job's slots itself and runs no ``__init__``: it checks at import that
Job's fields are the ones it fills, each a plain slot (tests/test_runs.py compares its jobs with
the general path's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ringq.codec import JSON, LONG_DIGITS, MAX_DEPTH, json_decoders, key_at
from ringq.errors import SerializationError
from ringq.job import UNDECODED, Job, JobState, slots, use_payload_descriptor

from . import _jobs
from ._jobs import build, first_ack, fresh
from ._native import ffi, lib

__all__ = ["build", "envelope_key", "express", "first_ack", "fresh"]


def envelope_key(raw: bytes) -> str:
    """The key of a keyed payload's stored bytes (codec.KEYED).  Raises SerializationError."""
    return key_at(raw, 0, len(raw))[0]


if hasattr(Job, "__post_init__"):  # pragma: no cover - build() runs no __init__
    raise ImportError("ringq.engine.runs builds Job without __init__: Job has a __post_init__")
_jobs.setup(Job, *slots(), UNDECODED, JobState.LEASED, JobState.READY, "1", SerializationError)
# Job.payload decodes a JSON payload in C on first access (csrc/ext/jobs.c, "Job.payload").
use_payload_descriptor(lambda getter: _jobs.payload(JSON, LONG_DIGITS, *json_decoders(), getter))
_jobs.set_ack(int(ffi.cast("uintptr_t", ffi.addressof(lib, "ringq_ack"))))
_jobs.set_express(int(ffi.cast("uintptr_t", ffi.addressof(lib, "ringq_append_fast"))), MAX_DEPTH)
# express(plan_address, payload, max_attempts, lock_fd, segseq, origin) -> Job | int
# (csrc/ext/jobs.c; Appender.express, for which None turns the express path off).
express: Callable[..., Job | int] | None = _jobs.express
_jobs.set_wait(int(ffi.cast("uintptr_t", ffi.addressof(lib, "ringq_wait_claim"))))
# wait_job(seg_ref, keep, ctl_ref, args, out, rec, segseq, origin, keyed)
#   -> None | int | (slot, word, prev, record | None, Job | None): claim.WaitClaimed's fields
# (csrc/ext/jobs.c; claim.wait_claim, for which None turns it off: the wait then reports the
# record and the caller builds its Job).
wait_job: Callable[..., Any] | None = _jobs.wait_job
