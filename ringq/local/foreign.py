"""Other queues' files: recognise them, refuse to mistake them for an empty ringq queue, read nobroker's.

A program switched from ``nobroker`` (or from ``errand``) by changing its import still points at
the old queue's path.  Opening it as a ringq queue would silently start an empty queue next to the
old jobs, so :func:`check_not_foreign` refuses, in one line that says what the files are and what
to do; :class:`ringq.Queue`, :class:`ringq.aio.Queue` and the ``ringq`` commands call it on
every open, so they agree: a directory holding a nobroker queue is refused, whatever queue name is
asked for, until ringq/local/nobroker.py's ``import_nobroker`` has imported it there.

:func:`read_nobroker_log` reads a nobroker queue's jobs, for that import.  It reads nobroker's log
itself (read-only; the nobroker package is not needed).  nobroker 0.1.2's format, as its codec
documents it::

    <name>.current          the live generation, one line of ASCII digits (absent: 0)
    <name>.NNNNNN.log       generation N, zero-padded to 6 digits
    file header  <8s magic "NOBROKER"><H version = 1><I generation><H reserved>     16 bytes, little-endian
    record       <I body length><B type><I crc32 of type byte + body><body: JSON>   9 + n bytes

Record types: 1 ENQUEUE (the whole job), 2 LEASE, 3 ACK, 4 NACK, 5 RECLAIM, 6 DEAD, 7 REQUEUE,
8 PURGE, 9 EXTEND.  Replaying them in order gives each job's state; reading stops at the first
record that is torn or fails its checksum (nobroker itself truncates the log there on its next open).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
from typing import Any

from ringq.engine import forksafe
from ringq.errors import CorruptionError, ForeignQueueError
from ringq.job import Job, JobState

__all__ = [
    "check_not_foreign",
    "imported_marker",
    "read_locked",
    "nobroker_queues",
    "read_nobroker_log",
    "unimported_nobroker_queues",
]

NOBROKER_MAGIC = b"NOBROKER"
NOBROKER_VERSION = 1
_FILE_HEADER = struct.Struct("<8sHIH")
_RECORD_HEADER = struct.Struct("<IBI")
_MAX_BODY = 8 * 1024 * 1024  # nobroker refuses larger records; a larger length is damage
_LOG_RE = re.compile(r"^(?P<name>.+)\.(?P<gen>[0-9]{6})\.log$")
SQLITE_MAGIC = b"SQLite format 3\x00"
IMPORTED_SUFFIX = ".nobroker-imported"
ENQUEUE, LEASE, ACK, NACK, RECLAIM, DEAD, REQUEUE, PURGE, EXTEND = range(1, 10)


def _is_nobroker_log(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(NOBROKER_MAGIC)) == NOBROKER_MAGIC
    except OSError:
        return False


def nobroker_queues(path: str | os.PathLike[str]) -> dict[str, str]:
    """The nobroker queues in directory ``path``: ``{queue name: path of its live log}``.

    A queue counts if its live generation's log (per ``<name>.current``, else the highest
    generation present) starts with nobroker's magic.  Returns {} for a missing directory.
    """
    path = os.fspath(path)
    try:
        names = os.listdir(path)
    except OSError:
        return {}
    gens: dict[str, list[int]] = {}
    for fname in names:
        m = _LOG_RE.match(fname)
        if m:
            gens.setdefault(m["name"], []).append(int(m["gen"]))
    found = {}
    for name, have in gens.items():
        gen = max(have)
        try:
            with open(os.path.join(path, f"{name}.current"), encoding="ascii") as fh:
                gen = int(fh.read().strip())
        except (OSError, ValueError):
            pass
        log = os.path.join(path, f"{name}.{gen:06d}.log")
        if _is_nobroker_log(log):
            found[name] = log
    return found


def imported_marker(path: str | os.PathLike[str], name: str) -> str:
    """The file ``import_nobroker`` writes in directory ``path`` once nobroker queue ``name``
    has been imported into the ringq queue ``name`` there: ``<name>.nobroker-imported``."""
    return os.path.join(os.fspath(path), f"{name}{IMPORTED_SUFFIX}")


def unimported_nobroker_queues(path: str | os.PathLike[str]) -> dict[str, str]:
    """The nobroker queues in directory ``path`` (as :func:`nobroker_queues`) not yet imported there."""
    return {
        n: log
        for n, log in nobroker_queues(path).items()
        if not os.path.exists(imported_marker(path, n))
    }


def check_not_foreign(path: str | os.PathLike[str], name: str | None = None) -> None:
    """Raise :class:`ForeignQueueError` if ``path`` is another library's queue, not a ringq one.

    The one rule used by :class:`ringq.Queue`, :class:`ringq.aio.Queue` and every ``ringq``
    command, whatever queue ``name`` they open (the argument is accepted and not used):

    * ``path`` is a SQLite database file (an ``errand`` queue keeps its jobs in one);
    * directory ``path`` holds a nobroker queue that has not been imported into it with
      ``ringq import-nobroker`` (which writes ``<name>.nobroker-imported`` there once done):
      a queue of any name is refused until then, so that no program starts on an empty queue
      beside the old jobs.
    """
    p = os.fspath(path)
    if os.path.isfile(p):
        try:
            with open(p, "rb") as fh:
                head = fh.read(len(SQLITE_MAGIC))
        except OSError:
            return
        if head == SQLITE_MAGIC:
            raise ForeignQueueError(
                f"{p} is a SQLite database file (an errand queue keeps its jobs in one), not a ringq queue "
                f"directory; ringq cannot read its jobs: give ringq a new directory path (such as {p}.ringq) "
                "and let the errand program finish the old jobs first"
            )
        return
    found = unimported_nobroker_queues(p)
    if found:
        first = sorted(found)[0]
        raise ForeignQueueError(
            f"{p} holds a nobroker queue ({first!r}: {os.path.basename(found[first])}) not imported into ringq; "
            f"run `ringq import-nobroker {p}` once to bring its jobs over, then open it again"
        )


def _records(data: bytes) -> tuple[list[tuple[int, dict[str, Any]]], str | None]:
    """Decode records after the file header; returns (records, why reading stopped early or None)."""
    import zlib  # here, not at module level: Queue() imports this module, and needs no zlib to open

    out: list[tuple[int, dict[str, Any]]] = []
    off = _FILE_HEADER.size
    while off < len(data):
        if off + _RECORD_HEADER.size > len(data):
            return out, f"torn record header at byte {off}"
        length, rtype, crc = _RECORD_HEADER.unpack_from(data, off)
        body_at = off + _RECORD_HEADER.size
        if length > _MAX_BODY:
            return out, f"impossible record length {length} at byte {off}"
        if body_at + length > len(data):
            return out, f"torn record at byte {off}"
        body = data[body_at : body_at + length]
        if zlib.crc32(bytes([rtype]) + body) & 0xFFFFFFFF != crc:
            return out, f"checksum mismatch at byte {off}"
        if not 1 <= rtype <= 9:
            return out, f"unknown record type {rtype} at byte {off}"
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return out, f"undecodable record at byte {off}"
        out.append((rtype, payload))
        off = body_at + length
    return out, None


def read_nobroker_log(log_path: str | os.PathLike[str]) -> tuple[list[Job], str | None]:
    """Replay one nobroker log into job snapshots, in enqueue order.

    Returns ``(jobs, stopped)``: every job the log holds (all states), and why reading stopped
    before the end of the file (None if it did not).  ``lease_deadline`` is set for LEASED jobs.
    Raises CorruptionError if the file is not a nobroker log of a known version.
    """
    log_path = os.fspath(log_path)
    with open(log_path, "rb") as fh:
        data = fh.read()
    if len(data) < _FILE_HEADER.size:
        raise CorruptionError(f"{log_path}: {len(data)} bytes, shorter than a nobroker log header")
    magic, version, _gen, _res = _FILE_HEADER.unpack_from(data, 0)
    if magic != NOBROKER_MAGIC:
        raise CorruptionError(f"{log_path} is not a nobroker log (magic {magic!r})")
    if version != NOBROKER_VERSION:
        raise CorruptionError(
            f"{log_path}: nobroker log format version {version}; only version 1 can be imported"
        )
    records, stopped = _records(data)
    jobs: dict[str, Job] = {}
    job: Job | None
    for rtype, r in records:
        if rtype == PURGE:
            jobs.clear()
            continue
        if rtype == ENQUEUE:
            job = Job.from_dict(r)
            jobs[job.id] = job
            continue
        job_id = r.get("id")
        job = None if job_id is None else jobs.get(job_id)
        if job is None:
            continue  # history of a purged job, or of one compacted away
        if rtype == LEASE:
            job.state, job.attempts = JobState.LEASED, int(r["attempts"])
            job.lease_deadline = float(r["deadline"])
        elif rtype == EXTEND and job.state is JobState.LEASED:
            job.lease_deadline = float(r["deadline"])
        elif rtype == ACK:
            job.state, job.lease_deadline = JobState.DONE, None
        elif rtype == NACK:
            job.state, job.lease_deadline = JobState.READY, None
            job.attempts = int(r.get("attempts", job.attempts))
            job.available_at = float(r["available_at"])
            job.last_error = r.get("error")
        elif rtype == RECLAIM:
            job.state, job.lease_deadline = JobState.READY, None
            job.available_at = float(r.get("available_at", job.available_at))
        elif rtype == DEAD:
            job.state, job.lease_deadline = JobState.DEAD, None
            job.last_error = r.get("error", job.last_error)
        elif rtype == REQUEUE:
            job.state, job.lease_deadline, job.attempts = JobState.READY, None, 0
            job.available_at = float(r.get("available_at", 0.0))
            job.max_attempts = int(r.get("max_attempts", job.max_attempts))
    return sorted(jobs.values(), key=lambda j: j.seq), stopped


def read_locked(source: str, name: str, log: str) -> tuple[list[Job], str | None]:
    """Read ``log`` while holding nobroker's queue lock, released before anything is written."""
    lock_path = os.path.join(source, f"{name}.lock")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(forksafe.flocked(lock_path, os.O_RDONLY, shared=True))
        except OSError:
            pass  # no lock file (or not readable): nobody to exclude
        return read_nobroker_log(log)
