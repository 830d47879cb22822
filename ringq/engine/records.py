"""Records: the immutable bytes of a job in a segment's slots.

The record header is declared once, as ``ringq_rec_header`` in ``csrc/ringq.h``; the Python packing
below is built from that declaration's field offsets (cffi), so the two cannot drift.  Writing,
validating (magic, length, CRC32C seeded with the segment seq and slot) and scanning happen in the
C helper (``ringq_append`` builds each header from a template there); this module checks sizes,
reads records and their scan results, and builds record bytes the Python way (:func:`build`,
:func:`fill_header`: the reference layout tests compare the C writer's bytes with).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from ringq.errors import RecordTooLargeError

from . import native
from ._native import ffi, lib
from .meta import KIND_JOB
from .native import CData
from .segment import Segment
from .words import ST_READY

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "NewRecord",
    "REC_HEADER",
    "CLAIMED",
    "rec_info_dtype",
    "REC_MAGIC",
    "KIND_JOB",
    "build",
    "check_sizes",
    "scan",
    "FewScanner",
    "read_record",
    "read_id",
    "read_body",
    "body_span",
    "fill_header",
    "check_one",
    "job_id",
]

_CODES = {
    ("uint", 1): "B",
    ("uint", 2): "H",
    ("uint", 4): "I",
    ("uint", 8): "Q",
    ("int", 1): "b",
    ("int", 2): "h",
    ("int", 4): "i",
    ("int", 8): "q",
}


def _struct_of(ctype: str) -> tuple[struct.Struct, tuple[str, ...]]:
    """A little-endian ``struct.Struct`` with the fields of C struct ``ctype``, in offset order."""
    fields = sorted(ffi.typeof(ctype).fields, key=lambda f: f[1].offset)
    fmt, pos = "<", 0
    for _name, f in fields:
        assert f.offset == pos, f"{ctype} has padding before {_name}"
        signed = "int" if f.type.cname.startswith("int") else "uint"
        fmt += _CODES[(signed, ffi.sizeof(f.type))]
        pos += ffi.sizeof(f.type)
    return struct.Struct(fmt), tuple(n for n, _f in fields)


REC_HEADER, REC_FIELDS = _struct_of("ringq_rec_header")
assert REC_HEADER.size == lib.RINGQ_REC_HEADER == ffi.sizeof("ringq_rec_header")
REC_MAGIC = lib.RINGQ_REC_MAGIC
# What ringq_claim_run reports per job leased (csrc/ringq.h), read as an array with struct.
CLAIMED, CLAIMED_FIELDS = _struct_of("ringq_claimed")
assert CLAIMED.size == ffi.sizeof("ringq_claimed")
MAX_RECORD_FIELD = 0xFFFFFFFF  # the record header's length fields are 32-bit
MAX_ID_FIELD = 0xFFFF  # and its id length field 16-bit

_INFO_FIELDS = [
    n for n, _f in sorted(ffi.typeof("ringq_rec_info").fields, key=lambda f: f[1].offset)
]
_NP = {
    "uint32_t": "<u4",
    "int32_t": "<i4",
    "uint64_t": "<u8",
    "int64_t": "<i8",
    "uint16_t": "<u2",
    "uint8_t": "u1",
}


@cache
def rec_info_dtype() -> np.dtype:
    """numpy view of ``ringq_rec_info`` (what the C scan reports per record), from its C
    declaration.  Built on first use (numpy is not loaded by an enqueue); also spelled
    ``REC_INFO_DTYPE``."""
    import numpy as np

    return np.dtype(
        {
            "names": _INFO_FIELDS,
            "formats": [
                _NP[dict(ffi.typeof("ringq_rec_info").fields)[n].type.cname] for n in _INFO_FIELDS
            ],
            "offsets": [ffi.offsetof("ringq_rec_info", n) for n in _INFO_FIELDS],
            "itemsize": ffi.sizeof("ringq_rec_info"),
        }
    )


def __getattr__(name: str) -> Any:
    if name == "REC_INFO_DTYPE":
        return rec_info_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(slots=True)
class NewRecord:
    """A job record to append.  ``delay_ms`` is added to the append time to get available-at."""

    payload: bytes
    codec: int
    id_bytes: bytes = b""
    priority: int = 0
    delay_ms: int = 0
    max_attempts: int = 5
    attempts_before: int = 0
    supersedes: int = 0  # position (ringq/engine/words.py) of the record this one replaces, or 0
    state: int = (
        ST_READY  # the state the record is published in (READY, or DEAD for a relocated dead job)
    )
    at_ms: int | None = (
        None  # absolute available-at (or finish time), ms since the epoch; None: now + delay_ms
    )
    enqueued_us: int | None = (
        None  # enqueue time, µs since the epoch (a copy keeps its original's); None: now
    )
    kind: int = KIND_JOB  # header byte 51: 1 job, 2 expiry prefix, 3 metadata block (meta.py)
    # Published DEFERRED (words.deferred_word: it waits for its parents or the run it replaces,
    # ringq/engine/deps.py) instead of in ``state``; ``hold_ms`` (ms since the Unix epoch): held
    # until then, as a copy being confirmed is (deps.HOLD).
    deferred: bool = False
    hold_ms: int | None = None

    def length(self) -> int:
        """Bytes of the record: header, id and payload."""
        return REC_HEADER.size + len(self.id_bytes) + len(self.payload)


def check_sizes(recs: Iterable[NewRecord], limit: int, queue: str) -> None:
    """Raise RecordTooLargeError if any record exceeds ``limit`` bytes or the id field (nothing
    allocated).  ``limit`` is what one segment holds, at most the 32-bit length field."""
    for rec in recs:
        length = rec.length()
        if length > limit:
            raise RecordTooLargeError(
                f"record of {length} bytes (payload {len(rec.payload)} + id {len(rec.id_bytes)} + 64 header) "
                f"exceeds the largest record queue {queue!r} stores: {limit} bytes"
                + (" (the 32-bit length field)" if limit == MAX_RECORD_FIELD else " (one segment)")
            )
        if len(rec.id_bytes) > MAX_ID_FIELD:
            raise RecordTooLargeError(
                f"job id of {len(rec.id_bytes)} bytes exceeds the 65535-byte limit"
            )


def build(rec: NewRecord) -> bytearray:
    """Record bytes with the header left for :func:`fill_header` (id and payload in place)."""
    buf = bytearray(rec.length())
    buf[REC_HEADER.size : REC_HEADER.size + len(rec.id_bytes)] = rec.id_bytes
    buf[REC_HEADER.size + len(rec.id_bytes) :] = rec.payload
    return buf


def fill_header(
    buf: bytearray, rec: NewRecord, span: int, seq: int, enq_us: int, avail_ms: int
) -> None:
    """Write the header of ``rec`` into ``buf`` (the CRC stays 0: the C writer computes it)."""
    REC_HEADER.pack_into(
        buf,
        0,
        REC_MAGIC,
        0,
        len(buf),
        span,
        seq,
        enq_us,
        avail_ms,
        rec.priority,
        rec.max_attempts,
        rec.attempts_before,
        len(rec.id_bytes),
        rec.codec,
        rec.kind,
        len(rec.payload),
        rec.supersedes,
    )


def scan(
    seg: Segment, start: int, limit: int | None = None, end: int | None = None
) -> tuple[np.ndarray, int]:
    """Validate records with heads in ``[start, end)`` (default: the segment's tail); returns
    ``(infos, next slot)``.  ``infos`` is a REC_INFO_DTYPE array; records that fail validation
    come back with ``status != 0``.  Takes no lock."""
    tail = seg.bounded_tail() if end is None else end
    if limit is not None:
        tail = min(tail, start + limit)
    import numpy as np

    dtype = rec_info_dtype()
    if start >= tail:
        return np.empty(0, dtype), start
    cap = tail - start
    out = ffi.new("ringq_rec_info[]", cap)
    nxt = ffi.new("uint32_t *")
    n = native.check(
        lib.ringq_seg_scan(seg.ptr, seg.size, seg.geom, start, tail, out, cap, nxt), seg.path
    )
    arr = np.frombuffer(ffi.buffer(out, n * dtype.itemsize), dtype=dtype).copy()
    return arr, nxt[0]


class FewScanner:
    """Like :func:`scan`, for a handful of records: ``scan(seg, start, tail)`` validates those with
    heads in ``[start, min(tail, start + cap))`` into a buffer allocated once, and returns ``(count,
    next slot)``; ``infos[i]`` are their ``ringq_rec_info``, read field by field without numpy,
    which costs less than building arrays when a woken consumer ingests the record just appended."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.infos = ffi.new("ringq_rec_info[]", cap)
        self._next = ffi.new("uint32_t *")

    def scan(self, seg: Segment, start: int, tail: int) -> tuple[int, int]:
        tail = min(tail, start + self.cap)
        if start >= tail:
            return 0, start
        n = native.check(
            lib.ringq_seg_scan(
                seg.ptr, seg.size, seg.geom, start, tail, self.infos, tail - start, self._next
            ),
            seg.path,
        )
        return n, self._next[0]


def check_one(seg: Segment, slot: int) -> CData | None:
    """The ``ringq_rec_info`` of the valid record at ``slot``, or None if it fails validation."""
    info = ffi.new("ringq_rec_info *")
    if lib.ringq_rec_check(seg.ptr, seg.size, seg.geom, slot, info) != 0:
        return None
    return info


def read_record(seg: Segment, slot: int) -> tuple[CData, bytes, bytearray]:
    """Validate and copy one record: ``(info cdata, id bytes, payload bytearray)``.

    Raises CorruptionError if it fails validation (the caller marks it BAD).
    """
    info = ffi.new("ringq_rec_info *")
    rc = lib.ringq_rec_check(seg.ptr, seg.size, seg.geom, slot, info)
    if rc != 0:
        native.check(rc if rc < 0 else lib.RINGQ_ECORRUPT, f"{seg.path} slot {slot}")
    base = seg.data_off + slot * seg.slot_size + REC_HEADER.size
    id_bytes = seg.mm[base : base + info.id_len]
    # One copy out of the mapping, into a buffer the payload may then use in place (an array
    # payload wraps it without copying again).
    start = base + info.id_len
    payload = bytearray(info.payload_len)
    with memoryview(seg.mm) as mv:
        payload[:] = mv[start : start + info.payload_len]
    return info, id_bytes, payload


# id_len, codec, kind and payload_len lie next to each other in the header (checked here): read
# together, by whoever needs a record's body without its CRC check (ringq/engine/lifecycle.py too).
OFF_BODY = ffi.offsetof("ringq_rec_header", "id_len")
BODY = struct.Struct("<HBBI")
assert [
    ffi.offsetof("ringq_rec_header", f) - OFF_BODY for f in ("codec", "kind", "payload_len")
] == [2, 3, 4]


def read_body(seg: Segment, slot: int) -> tuple[int, bytes, bytes]:
    """``(codec, id bytes, payload bytes)`` of a record validated a moment ago, without checking
    it again: for a job a C fast path (ringq_take_run, ringq_wait_claim) just leased, which validated it first."""
    base = seg.data_off + slot * seg.slot_size
    mm = seg.mm
    id_len, codec, _kind, plen = BODY.unpack_from(mm, base + OFF_BODY)
    start = base + REC_HEADER.size + id_len
    return codec, mm[start - id_len : start], mm[start : start + plen]


def body_span(seg: Segment, slot: int) -> tuple[int, int]:
    """``(offset in the mapping, length)`` of the payload of the record at ``slot``, read from
    its header without a CRC check (bounded by the mapping)."""
    base = seg.data_off + slot * seg.slot_size
    id_len, _codec, _kind, plen = BODY.unpack_from(seg.mm, base + OFF_BODY)
    start = base + REC_HEADER.size + id_len
    return start, max(0, min(plen, seg.size - start))


def read_id(seg: Segment, slot: int, id_len: int) -> bytes:
    """The explicit id bytes of the (validated) record at ``slot``."""
    base = seg.data_off + slot * seg.slot_size + REC_HEADER.size
    return bytes(seg.mm[base : base + id_len])


def job_id(info: CData, id_bytes: bytes) -> str:
    """A record's job id: its explicit id, or 16 hex digits of its seq."""
    return bytes(id_bytes).decode("utf-8", "replace") if info.id_len else f"{info.seq:016x}"
