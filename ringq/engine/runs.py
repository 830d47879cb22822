"""Job objects built by one call each, from ``ringq.engine._jobs`` (compiled from
csrc/ext/jobs.c by ``pip install``): :func:`build` for a run of jobs leased in C, :func:`fresh`
for a batch just appended.

``build(run, mm, base, size, epoch_ms, segseq, origin, keyed, key_of, held, mark_bad, seg)``
returns the jobs of ``run`` (the bytes of ringq_claimed records, records.CLAIMED_FIELDS, as one C
call leased them from segment ``seg``): ``mm`` is its mapping, ``base`` the mapping offset of slot
0's record header plus the header's size, ``size`` its slot size, ``epoch_ms``, ``segseq`` and
``origin`` its epoch, seq and queue identity, ``keyed`` the keyed envelope's codec id, whose key
``key_of(raw payload)`` reads (:func:`key_of`).  Each job gets what a first lease gives it: state
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

The module fills each Job's slots itself and runs no ``__init__``: it checks at import that
Job's fields are the ones it fills, each a plain slot (tests/test_runs.py compares its jobs with
the general path's).
"""

from __future__ import annotations

from ringq.codec import key_at
from ringq.errors import SerializationError
from ringq.job import UNDECODED, Job, JobState, slots

from . import _jobs
from ._jobs import build, fresh

__all__ = ["build", "fresh", "key_of"]


def key_of(raw: bytes) -> str:
    """The key of a keyed payload's stored bytes (codec.KEYED).  Raises SerializationError."""
    return key_at(raw, 0, len(raw))[0]


if hasattr(Job, "__post_init__"):  # pragma: no cover - build() runs no __init__
    raise ImportError("ringq.engine.runs builds Job without __init__: Job has a __post_init__")
_jobs.setup(Job, *slots(), UNDECODED, JobState.LEASED, JobState.READY, "1", SerializationError)
