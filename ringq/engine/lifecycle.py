"""Job lifecycle beyond lease and ack, as stored: expiry before start, pause and resume, progress.

* **Expiry** is stored in the record: a record of kind ``KIND_EXPIRES`` (header byte 51) starts
  its payload with an 8-byte little-endian expires-at (ms since the Unix epoch), followed by the
  codec's bytes; a record of kind 3 carries it in its metadata block (ringq/engine/meta.py).  A claim that finds such a job past its expiry CASes it to EXPIRED instead
  (``transitions.expired``); snapshots strip the prefix and show ``Job.expires_at``.
* **Pause** lives in ``<name>.pause``, one mapped page (layout below): a whole-queue word every
  lease reads before it looks for work, and a table of paused keys.  It is durable: a paused queue
  stays paused across restarts until resumed.
* **Progress** frames go to a per-segment side file ``<name>.<seq>.prog`` with the error side
  file's frame format (ringq/engine/errtext.py): text ``"<fraction>\\t<message>"`` tagged with the slot and
  the lease count, so a stale holder's report is never shown for a later lease.

Layouts: docs/format.md.  Nothing here reaches into another module's private state.
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import TYPE_CHECKING, Any

from ringq import codec
from ringq.backend import check_fraction
from ringq.errors import CorruptionError, SerializationError
from ringq.job import Job

from . import errtext, forksafe, meta, records, transitions
from .mapped import Mapped, crc32c, open_nofollow
from .meta import KIND_EXPIRES, KIND_JOB
from .words import lease_count

if TYPE_CHECKING:  # pragma: no cover
    from .ring import Ring
    from .segment import Segment

__all__ = [
    "KIND_EXPIRES",
    "wrap_expiry",
    "expire",
    "unwrap",
    "expires_ms",
    "key_of",
    "PauseFile",
    "progress_path",
    "write_progress",
    "show_progress",
    "trace_path",
    "write_first_attempt",
    "read_first_attempt",
    "MAX_KEY",
]

_REC_HEADER = records.REC_HEADER.size


# -- expiry ----------------------------------------------------------------------------------------


def wrap_expiry(data: bytes, expires_at_ms: int) -> bytes:
    """The payload bytes of a job that expires at ``expires_at_ms`` (ms since the Unix epoch)."""
    return meta.wrap(0, data, meta.Meta(expires_ms=expires_at_ms))[1]


def unwrap(info: Any, payload: bytearray) -> tuple[int, bytearray, meta.Meta]:
    """``(codec, codec bytes, meta)`` of a validated record's payload bytes (ringq/engine/meta.py:
    the expiry prefix of kind 2, the metadata block of kind 3).

    Raises CorruptionError for a prefix too short or that does not parse."""
    return meta.split(info.kind, info.codec, payload)


def expires_ms(seg: Segment, slot: int) -> int | None:
    """The expires-at (ms since the Unix epoch) of the record at ``slot``, or None if it has none.

    Reads the immutable header bytes without a CRC check (a claim calls it for every job); the
    caller re-validates the record before it acts on an expiry that has passed."""
    base = seg.data_off + slot * seg.slot_size
    mm = seg.mm  # a buffer over the mapping: unpack_from reads a number whatever its type
    id_len, _codec, kind, plen = records.BODY.unpack_from(mm, base + records.OFF_BODY)
    if kind == KIND_JOB:
        return None
    off = base + _REC_HEADER + id_len
    if off + plen > len(mm):
        return None
    try:
        return meta.peek(kind, mm, off, plen).expires_ms
    except CorruptionError:
        return None  # the record is refused (marked BAD) when its snapshot is read


def expire(ring: Ring, seg: Segment, slot: int, w: int, now: int) -> bool:
    """CAS the READY job with word ``w`` to EXPIRED; True if this call did it.  The record is
    re-validated first: a damaged expiry field must not end a job (it is marked BAD instead)."""
    if records.check_one(seg, slot) is None:
        ring.mark_bad(seg, slot, "record failed validation (magic, length or CRC)")
        return False
    if seg.cas_state(slot, w, transitions.expired(w, now - seg.epoch_ms))[0]:
        ring.segs.note_finished(seg)
        return True
    return False


# -- keys ------------------------------------------------------------------------------------------


def key_of(seg: Segment, slot: int) -> str | None:
    """The key of the job at ``slot`` (the short string given at ``enqueue(..., key=...)``), or
    None: read from the record's bytes without decoding the payload.

    The one place a job's key is read (per-key pause here, limits in ringq/local/limits.py): the key is
    the keyed envelope (codec.KEYED) around the payload's codec bytes, behind the record's expiry
    prefix or metadata block (ringq/engine/meta.py)."""
    return _key(seg, slot)[0]


def key_problem(seg: Segment, slot: int) -> str | None:
    """Why the keyed envelope of the record at ``slot`` does not read (SerializationError's
    text: bytes no enqueue writes, such as a key with a NUL in it), or None: it reads, or the
    record has no key."""
    return _key(seg, slot)[1]


def _key(seg: Segment, slot: int) -> tuple[str | None, str | None]:
    base = seg.data_off + slot * seg.slot_size
    mm = seg.mm
    if mm is None or base + _REC_HEADER > seg.size:
        return None, None
    id_len, codec_id, kind, plen = records.BODY.unpack_from(mm, base + records.OFF_BODY)
    if codec_id != codec.KEYED and codec_id != codec.IN_META:
        return None, None
    start = base + _REC_HEADER + id_len
    if start + plen > seg.size:
        return None, None
    try:
        codec_id, start, plen = meta.body(kind, codec_id, mm, start, plen)
    except CorruptionError:
        return None, None
    if codec_id != codec.KEYED:
        return None, None
    try:
        return codec.key_at(mm, start, min(start + plen, seg.size))[0], None
    except SerializationError as exc:
        return None, str(exc)


def keys_of_plain(
    seg: Segment, slots: Any, id_lens: Any, plens: Any
) -> tuple[list[str | None], Any]:
    """The keys of many records of kind KIND_JOB whose codec is :data:`codec.KEYED` (no expiry
    prefix, no metadata block), read
    as :func:`key_of` reads one, in a few numpy calls: ``slots``, ``id_lens`` and ``plens`` are
    arrays of the records' head slots, id and payload lengths, from a validated scan (every
    record lies within the mapping).  Returns ``(keys, which)``: the distinct keys (None for a
    malformed envelope, as key_of gives) and for each record the index of its key in them."""
    import numpy as np

    n = len(slots)
    buf = np.frombuffer(seg.mm, np.uint8)
    start = (
        seg.data_off
        + slots.astype(np.int64) * seg.slot_size
        + _REC_HEADER
        + id_lens.astype(np.int64)
    )
    plens = plens.astype(np.int64)
    room = plens >= 3  # the envelope's length, a key byte and the inner codec byte
    k = np.zeros(n, np.int64)
    k[room] = buf[start[room]].astype(np.int64) | (buf[start[room] + 1].astype(np.int64) << 8)
    ok = room & (k >= 1) & (k <= codec.MAX_KEY_BYTES) & (k + 3 <= plens)
    ok[ok] = buf[start[ok] + 2 + k[ok]] != codec.KEYED  # a key in a key is malformed
    width = 2 + (int(k[ok].max()) if ok.any() else 0)
    cols = np.arange(width)
    # Each record's length bytes and key, zero-padded to the longest (the length tells a key
    # that ends in NULs from a shorter one); a malformed record's row is all 0xFF.
    rows = np.full((n, width), 0xFF, np.uint8)
    last = len(buf) - 1
    picked = buf[np.minimum(start[ok, None] + cols, last)]
    picked[cols >= (k[ok, None] + 2)] = 0
    rows[ok] = picked
    uniq, which = np.unique(
        np.ascontiguousarray(rows).view(np.dtype((np.void, width))).ravel(), return_inverse=True
    )
    keys: list[str | None] = []
    for raw in uniq.tolist():
        klen = raw[0] | (raw[1] << 8) if raw[:2] != b"\xff\xff" else 0
        try:
            keys.append(codec.stored_key(raw[2 : 2 + klen]) if klen else None)
        except SerializationError:
            keys.append(None)
    return keys, which.ravel()


# -- pause -----------------------------------------------------------------------------------------

PAUSE_MAGIC = 0x3155415051474E52  # bytes "RNGQPAU1"
PAUSE_VERSION = 1
PAUSE_SIZE = 4096
_OFF_CRC = 12  # u32 CRC32C of bytes 0..12
_OFF_QUEUE = 16  # u64: 1 while the whole queue is paused
_OFF_CHANGES = 24  # u64: +1 on every pause or resume
_KEYS_OFF = 64
_KEY_ENTRY = 64  # u16 length, u16 0, u32 CRC32C of the key bytes, 56 bytes key
MAX_KEY = _KEY_ENTRY - 8
_KEY_SLOTS = (PAUSE_SIZE - _KEYS_OFF) // _KEY_ENTRY  # 63


class PauseFile:
    """``<name>.pause``: whether leases of the whole queue, or of some keys, are paused.

    Created on open if missing.  A file of the wrong size, magic, version or header CRC is renamed
    to ``<name>.pause.quarantined`` (noted in the recovery report) and a fresh, unpaused one made:
    damage never stops the queue.  Key entries whose CRC fails are ignored.
    """

    def __init__(self, ring: Ring) -> None:
        self.path = os.path.join(ring.dir, f"{ring.name}.pause")
        self.report = ring.report
        fd = self._open(ring.mode)
        self.map = Mapped(self.path, fd, PAUSE_SIZE)
        self._keys: tuple[int, frozenset[str]] = (-1, frozenset())
        self._clear_at = -1  # the change counter when paused() last found nothing paused

    def _open(self, mode: int) -> int:
        for _ in range(2):
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, mode)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                head = os.pread(fd, PAUSE_SIZE, 0)
                if not head:
                    page = bytearray(PAUSE_SIZE)
                    struct.pack_into("<QI", page, 0, PAUSE_MAGIC, PAUSE_VERSION)
                    struct.pack_into("<I", page, _OFF_CRC, crc32c(page[:_OFF_CRC]))
                    os.pwrite(fd, page, 0)
                    os.fsync(fd)
                    return fd
                if valid_pause_header(head):
                    return fd
                aside = self.path + ".quarantined"
                os.rename(self.path, aside)
                self.report.repairs.append(
                    (self.path, f"pause file damaged (moved to {aside}); the queue is not paused")
                )
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        raise CorruptionError(f"{self.path}: cannot create a valid pause file")

    def close(self) -> None:
        self.map.close()

    def queue_paused(self) -> bool:
        """True while the whole queue is paused (one atomic load of the shared word)."""
        return self.map.load64(_OFF_QUEUE) != 0

    def watched(self) -> tuple[Mapped, int, int]:
        """The change counter :meth:`paused` reads, as ``(mapping, offset, width)`` for a Watch."""
        return self.map, _OFF_CHANGES, 8

    def paused(self) -> tuple[bool, bool]:
        """``(queue paused, any key paused)``, for the lease path: one load of the change counter
        while it stays where a look found nothing paused (every pause and resume bumps it after
        its change, so an answer read before the bump is the answer from just before the pause)."""
        changes = self.map.load64(_OFF_CHANGES)
        if changes == self._clear_at:
            return False, False
        queue, keys = self.queue_paused(), bool(self.paused_keys())
        if not queue and not keys:
            self._clear_at = changes
        return queue, keys

    def set_queue(self, paused: bool) -> None:
        self.map.store64(_OFF_QUEUE, int(paused))
        self.map.add64(_OFF_CHANGES)
        self.map.msync(0, PAUSE_SIZE)

    def paused_keys(self) -> frozenset[str]:
        """The keys paused now (re-read only when the change counter moved)."""
        changes = self.map.load64(_OFF_CHANGES)
        if self._keys[0] == changes:
            return self._keys[1]
        keys = set()
        mm = self.map.mm
        for i in range(_KEY_SLOTS):
            off = _KEYS_OFF + i * _KEY_ENTRY
            n, _z, crc = struct.unpack_from("<HHI", mm, off)
            if 0 < n <= MAX_KEY:
                raw = bytes(mm[off + 8 : off + 8 + n])
                if crc32c(raw) == crc:
                    keys.add(raw.decode("utf-8", "replace"))
        out = frozenset(keys)
        self._keys = (changes, out)
        return out

    def set_key(self, key: str, paused: bool) -> None:
        """Pause or resume one key.  Raises ValueError for a key longer than MAX_KEY bytes or when
        all 63 entries are taken."""
        raw = key.encode("utf-8")
        if not 0 < len(raw) <= MAX_KEY:
            raise ValueError(f"a paused key must be 1..{MAX_KEY} bytes of UTF-8, got {key!r}")
        mm = self.map.mm
        # Writers of the key table take turns (a brief flock that no forked child keeps).
        with forksafe.flocked(self.path, os.O_RDWR | os.O_NOFOLLOW):
            free = None
            for i in range(_KEY_SLOTS):
                off = _KEYS_OFF + i * _KEY_ENTRY
                n, _z, crc = struct.unpack_from("<HHI", mm, off)
                valid = 0 < n <= MAX_KEY and crc32c(bytes(mm[off + 8 : off + 8 + n])) == crc
                if valid and bytes(mm[off + 8 : off + 8 + n]) == raw:
                    if not paused:
                        mm[off : off + _KEY_ENTRY] = bytes(_KEY_ENTRY)
                        break
                    return
                if not valid and free is None:
                    free = off
            else:
                if not paused:
                    return
                if free is None:
                    raise ValueError(f"at most {_KEY_SLOTS} keys can be paused at once")
                # Key bytes and CRC first, the length last: a reader never believes a half entry.
                mm[free + 8 : free + _KEY_ENTRY] = raw.ljust(MAX_KEY, b"\0")
                struct.pack_into("<HHI", mm, free, 0, 0, crc32c(raw))
                struct.pack_into("<H", mm, free, len(raw))
            self.map.add64(_OFF_CHANGES)
            self.map.msync(0, PAUSE_SIZE)

    def blocks(self, seg: Segment, slot: int) -> bool:
        """True if the job at ``slot`` must not be leased now because its key is paused."""
        keys = self.paused_keys()
        return bool(keys) and key_of(seg, slot) in keys


def valid_pause_header(head: bytes) -> bool:
    if len(head) != PAUSE_SIZE:
        return False
    magic, version = struct.unpack_from("<QI", head, 0)
    (crc,) = struct.unpack_from("<I", head, _OFF_CRC)
    return magic == PAUSE_MAGIC and version == PAUSE_VERSION and crc == crc32c(head[:_OFF_CRC])


# -- progress --------------------------------------------------------------------------------------


def progress_path(ring: Ring, seq: int) -> str:
    return os.path.join(ring.dir, f"{ring.name}.{seq:016x}.prog")


def write_progress(
    ring: Ring, seg: Segment, slot: int, lc: int, fraction: float, message: str | None
) -> str | None:
    """Append a progress frame for (slot, lease count); None, or why it was not kept."""
    text = repr(fraction) + "\t" + ("" if message is None else str(message))
    return errtext.write_error(progress_path(ring, seg.seq), slot, lc, text, ring.mode)


def report_progress(
    ring: Ring,
    view_seg: Segment,
    slot: int,
    w: int,
    job_id: str,
    token: int | None,
    fraction: float,
    message: str | None,
) -> None:
    """The holder's progress report for the lease in word ``w``: refused (NotLeasedError) unless
    the job is leased with ``token``, exactly as an ack would be.  A frame that cannot be written
    is noted in the recovery report, never raised."""
    transitions.require_lease(w, job_id, token, "report progress of")
    why = write_progress(ring, view_seg, slot, lease_count(w), fraction, message)
    if why is not None:
        ring.report.repairs.append((progress_path(ring, view_seg.seq), why))


def read_progress(ring: Ring, seq: int) -> dict[int, list[tuple[int, str]]]:
    """slot -> [(lease count, text)]; damaged frames are skipped (errtext's reader)."""
    return errtext.read_errors(progress_path(ring, seq))


def show_progress(ring: Ring, seg: Segment, slot: int, lc: int, job: Job) -> None:
    """Fill ``job.progress``/``progress_message`` from the newest frame of lease ``lc``.

    Only a leased-at-least-once job can have progress; frames of an earlier lease are not shown
    (a retry starts from nothing).  A frame whose text does not parse is ignored."""
    if not lc:
        return
    frames = read_progress(ring, seg.seq).get(slot)
    if not frames:
        return
    mine = [text for flc, text in frames if flc == lc]
    if not mine:
        return
    frac, _, msg = mine[-1].partition("\t")
    try:
        job.progress = check_fraction(float(frac))
    except ValueError:
        return
    job.progress_message = msg or None


# -- first attempts' spans ---------------------------------------------------------------------------


def trace_path(ring: Ring, seq: int) -> str:
    """``<name>.<seq>.trace``: the traceparent of each job's first attempt that a Worker recorded
    (ringq/tracing.py), in the error side file's frames with the attempt number (1) for the lease
    count.  Deleted with its segment."""
    return os.path.join(ring.dir, f"{ring.name}.{seq:016x}.trace")


def write_first_attempt(ring: Ring, seg: Segment, slot: int, traceparent: str) -> None:
    """Keep ``traceparent`` as the span of the first attempt of the job at ``slot`` (best effort:
    a frame not written is noted in the recovery report, never raised)."""
    why = errtext.write_error(trace_path(ring, seg.seq), slot, 1, traceparent, ring.mode)
    if why is not None:
        ring.report.repairs.append((trace_path(ring, seg.seq), why))


def read_first_attempt(ring: Ring, seg: Segment, slot: int) -> str | None:
    """The traceparent recorded for the first attempt of the job at ``slot``, or None."""
    frames = errtext.read_errors(trace_path(ring, seg.seq)).get(slot)
    return next((text for att, text in frames if att == 1), None) if frames else None
