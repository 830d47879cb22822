"""Per-job metadata carried in a record: the block of a record of kind ``KIND_META``.

A record of kind 3 starts its payload with a versioned metadata block of tagged entries (a
job's expiry, hard timeout, W3C trace context), then the codec's bytes; its header's codec byte
is ``codec.IN_META`` and the real codec is in the block.  The record's CRC covers the block like
the rest of the payload.  Layout (docs/format.md, "Metadata block")::

    u8 version (1), u8 codec of what follows the block, u16 block length B (bytes 0..B),
    then entries up to B: u8 tag, u16 value length L, L bytes of value

A tag of ``REQUIRED`` or above must be understood: a reader that meets one it does not know
refuses the record (CorruptionError: the claim path marks it BAD and reports it, never delivering
a job without that field).  An unknown tag below it is skipped.  A tag may appear once; a block
that does not parse, or an entry of a known tag with the wrong length, is damage.  New fields are
new tags: neither the block's version nor the record format changes for them.

Records of kind 1 (plain) and 2 (expiry prefix, ringq/engine/lifecycle.py) keep their layouts; an
enqueue with an expiry alone still writes kind 2, and kind 3 is written only when a job carries
another field, so a plain enqueue is exactly what it was.  The C fast paths (``ringq_take_run``,
``ringq_wait_claim``) lease kind 1 only: a kind-3 job takes the Python path, whose snapshot
validates the record (CRC) and splits the block here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ringq import codec
from ringq.errors import CorruptionError
from ringq.tracing import clean, valid_traceparent, valid_tracestate

__all__ = [
    "KIND_JOB",
    "KIND_META",
    "KIND_EXPIRES",
    "Meta",
    "NONE",
    "of",
    "wrap",
    "split",
    "body",
    "TAG_EXPIRES",
    "TAG_TIMEOUT",
    "TAG_TRACEPARENT",
    "TAG_TRACESTATE",
    "TAG_DEPS",
    "TAG_AFTER",
    "REQUIRED",
    "section_bytes",
]

KIND_JOB = 1  # record kind: a plain job (the header and the codec's bytes)
KIND_EXPIRES = 2  # record kind: a job whose payload starts with an 8-byte expires-at (ms)
KIND_META = 3  # record kind: a job whose payload starts with a metadata block
VERSION = 1
REQUIRED = 0x80  # tags from here up must be understood by a reader, or the record is refused
TAG_EXPIRES = 0x81  # i64 expires-at, ms since the Unix epoch
TAG_TIMEOUT = 0x02  # u32 hard timeout of one attempt, ms (>= 1)
TAG_TRACEPARENT = 0x03  # the W3C traceparent of the enqueue (55 ASCII bytes, version 00)
TAG_TRACESTATE = 0x04  # the W3C tracestate of the enqueue (1..512 printable ASCII bytes)
# u32 parents n, u32 section length S, u8 flags (bit 0: allow_failure): the job depends on n
# parents, whose ids fill a section of S bytes right after the block (u16 length + UTF-8 bytes
# each, then zero padding), before the codec's bytes.  Required: a reader that ignored it would
# run the job before its parents.
TAG_DEPS = 0x85
# u64 position (ringq/engine/words.py) of the run this job waits for besides the record it
# supersedes (a replacement of a waiting rerun: ringq/engine/deps.py).  Required, for the same
# reason.
TAG_AFTER = 0x86
FLAG_ALLOW_FAILURE = 0x01

_HEAD = struct.Struct("<BBH")
_ENTRY = struct.Struct("<BH")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")
_DEPS = struct.Struct("<IIB")


@dataclass(frozen=True, slots=True)
class Meta:
    """What a record carries besides its header fields and payload.  ``expires_ms``: expires-at,
    ms since the Unix epoch; ``timeout_ms``: hard timeout of an attempt; ``traceparent`` and
    ``tracestate``: the W3C trace context of the enqueue.  ``parents``: the ids of the jobs it
    depends on (None: none), ``allow_failure``: it runs once they all finished, whatever their
    outcome; ``section``: bytes of the parents' section after the block (ids and padding; when
    writing, the least length wanted).  ``after``: the position of a run this job waits for
    (ringq/engine/deps.py), or 0."""

    expires_ms: int | None = None
    timeout_ms: int | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    parents: tuple[str, ...] | None = None
    allow_failure: bool = False
    section: int = 0
    after: int = 0

    def needs_block(self) -> bool:
        """True if a kind-3 block is needed (anything but an expiry alone)."""
        return (
            self.timeout_ms is not None
            or self.traceparent is not None
            or self.tracestate is not None
            or self.parents is not None
            or self.after != 0
        )

    def trace_context(self) -> dict[str, str] | None:
        """The trace context as W3C headers, or None."""
        if self.traceparent is None:
            return None
        out = {"traceparent": self.traceparent}
        if self.tracestate is not None:
            out["tracestate"] = self.tracestate
        return out


NONE = Meta()


def of(expires_ms: int | None, timeout_ms: int | None, trace: dict[str, str] | None) -> Meta | None:
    """The Meta of an enqueue (None when it carries nothing: a plain record).  ``trace``: W3C
    headers; a malformed trace context is dropped (ringq/tracing.py clean)."""
    tp, ts = clean(trace) if trace else (None, None)
    if expires_ms is None and timeout_ms is None and tp is None:
        return None
    return Meta(expires_ms, timeout_ms, tp, ts)


def wrap(codec_id: int, data: bytes, meta: Meta) -> tuple[int, bytes, int]:
    """``(record codec byte, payload bytes, record kind)`` of encoded payload ``data`` (codec
    ``codec_id``) carrying ``meta``: kind 1 for nothing, kind 2 for an expiry alone, else kind 3."""
    if not meta.needs_block():
        if meta.expires_ms is None:
            return codec_id, data, KIND_JOB
        return codec_id, _I64.pack(meta.expires_ms) + data, KIND_EXPIRES
    entries = b""
    if meta.expires_ms is not None:
        entries += _ENTRY.pack(TAG_EXPIRES, 8) + _I64.pack(meta.expires_ms)
    if meta.timeout_ms is not None:
        entries += _ENTRY.pack(TAG_TIMEOUT, 4) + _U32.pack(meta.timeout_ms)
    for tag, text in ((TAG_TRACEPARENT, meta.traceparent), (TAG_TRACESTATE, meta.tracestate)):
        if text is not None:
            raw = text.encode("ascii")
            entries += _ENTRY.pack(tag, len(raw)) + raw
    section = b""
    if meta.parents is not None:
        section = b"".join(
            _U16.pack(len(raw)) + raw for raw in (p.encode("utf-8") for p in meta.parents)
        )
        if len(section) < meta.section:
            section += bytes(meta.section - len(section))
        flags = FLAG_ALLOW_FAILURE if meta.allow_failure else 0
        entries += _ENTRY.pack(TAG_DEPS, _DEPS.size) + _DEPS.pack(
            len(meta.parents), len(section), flags
        )
    if meta.after:
        entries += _ENTRY.pack(TAG_AFTER, 8) + _U64.pack(meta.after)
    return (
        codec.IN_META,
        _HEAD.pack(VERSION, codec_id, _HEAD.size + len(entries)) + entries + section + data,
        KIND_META,
    )


def section_bytes(parents: list[str]) -> int:
    """Bytes the ids of ``parents`` take in a record's parents' section (before padding)."""
    return sum(2 + len(p.encode("utf-8")) for p in parents)


def _parse(block: bytes | bytearray | memoryview, after_block: memoryview | None = None) -> Meta:
    """The entries of a block (bytes 0..B, the head included); ``after_block``: the payload's
    bytes after it, where a parents' section lies.  Raises CorruptionError."""
    seen: set[int] = set()
    fields: dict[int, object] = {}
    pos, end = _HEAD.size, len(block)
    while pos < end:
        if pos + _ENTRY.size > end:
            raise CorruptionError("metadata block: an entry is cut short")
        tag, n = _ENTRY.unpack_from(block, pos)
        pos += _ENTRY.size
        if pos + n > end:
            raise CorruptionError(f"metadata block: entry {tag:#x} runs past the block")
        if tag in seen:
            raise CorruptionError(f"metadata block: entry {tag:#x} appears twice")
        seen.add(tag)
        value = bytes(block[pos : pos + n])
        pos += n
        if tag == TAG_EXPIRES and n == 8:
            fields[tag] = _I64.unpack(value)[0]
        elif tag == TAG_TIMEOUT and n == 4 and _U32.unpack(value)[0] >= 1:
            fields[tag] = _U32.unpack(value)[0]
        elif tag == TAG_TRACEPARENT and valid_traceparent(value.decode("latin-1")):
            fields[tag] = value.decode("ascii")
        elif tag == TAG_TRACESTATE and valid_tracestate(value.decode("latin-1")):
            fields[tag] = value.decode("ascii")
        elif tag == TAG_DEPS and n == _DEPS.size:
            count, size, flags = _DEPS.unpack(value)
            if not 1 <= count or size < 3 * count:
                raise CorruptionError("metadata block: entry 0x85 has an invalid value")
            fields[tag] = (count, size, bool(flags & FLAG_ALLOW_FAILURE))
        elif tag == TAG_AFTER and n == 8 and _U64.unpack(value)[0]:
            fields[tag] = _U64.unpack(value)[0]
        elif tag in (
            TAG_EXPIRES,
            TAG_TIMEOUT,
            TAG_TRACEPARENT,
            TAG_TRACESTATE,
            TAG_DEPS,
            TAG_AFTER,
        ):
            raise CorruptionError(f"metadata block: entry {tag:#x} has an invalid value")
        elif tag >= REQUIRED:
            raise CorruptionError(
                f"metadata block: required entry {tag:#x} is unknown to this reader "
                "(written by a newer ringq)"
            )
        # an unknown optional entry: skipped
    parents: tuple[str, ...] | None = None
    allow, size = False, 0
    deps = fields.get(TAG_DEPS)
    if deps is not None:
        count, size, allow = deps  # type: ignore[misc]
        if after_block is None or len(after_block) < size:
            raise CorruptionError("metadata block: the parents' section runs past the record")
        parents = _ids(after_block[:size], count)
    return Meta(
        fields.get(TAG_EXPIRES),  # type: ignore[arg-type]
        fields.get(TAG_TIMEOUT),  # type: ignore[arg-type]
        fields.get(TAG_TRACEPARENT),  # type: ignore[arg-type]
        fields.get(TAG_TRACESTATE),  # type: ignore[arg-type]
        parents,
        allow,
        size,
        fields.get(TAG_AFTER, 0),  # type: ignore[arg-type]
    )


def _ids(section: memoryview, count: int) -> tuple[str, ...]:
    """The ``count`` ids of a parents' section (the rest of it is zero padding).  Raises
    CorruptionError."""
    out = []
    pos, end = 0, len(section)
    for _ in range(count):
        if pos + 2 > end:
            raise CorruptionError("metadata block: the parents' section is cut short")
        (k,) = _U16.unpack_from(section, pos)
        pos += 2
        if not k or pos + k > end:
            raise CorruptionError("metadata block: a parent id runs past its section")
        try:
            out.append(bytes(section[pos : pos + k]).decode("utf-8"))
        except UnicodeDecodeError:
            raise CorruptionError("metadata block: a parent id is not UTF-8") from None
        pos += k
    if any(section[pos:]):
        raise CorruptionError("metadata block: the parents' section has bytes after its ids")
    return tuple(out)


def _head(data: bytes | bytearray | memoryview, plen: int) -> tuple[int, int]:
    """``(inner codec, block length)`` of a kind-3 payload of ``plen`` bytes starting ``data``.
    Raises CorruptionError."""
    if plen < _HEAD.size or len(data) < _HEAD.size:
        raise CorruptionError("record of kind 3 is shorter than its metadata block")
    version, inner, blen = _HEAD.unpack_from(data, 0)
    if version != VERSION:
        raise CorruptionError(
            f"metadata block version {version} is unknown to this reader (written by a newer ringq?)"
        )
    if not _HEAD.size <= blen <= plen:
        raise CorruptionError(f"metadata block length {blen} does not fit its record")
    if inner == codec.IN_META or not 1 <= inner <= codec.KEYED:
        raise CorruptionError(f"metadata block names payload codec {inner}")
    return inner, blen


def split(kind: int, codec_id: int, payload: bytearray) -> tuple[int, bytearray, Meta]:
    """``(codec, codec bytes, meta)`` of a validated record's payload bytes (the prefix removed in
    place).  Raises CorruptionError for a prefix that does not parse or that this reader must not
    ignore."""
    if kind == KIND_EXPIRES:
        if len(payload) < _I64.size:
            raise CorruptionError(
                "record of kind 2 (expiring job) is shorter than its expiry field"
            )
        (ms,) = _I64.unpack_from(payload, 0)
        del payload[: _I64.size]
        return codec_id, payload, Meta(expires_ms=ms)
    if kind != KIND_META:
        if kind != KIND_JOB:
            raise CorruptionError(f"record kind {kind} is unknown to this reader")
        return codec_id, payload, NONE
    inner, blen = _head(payload, len(payload))
    mv = memoryview(payload)
    meta = _parse(mv[:blen], mv[blen:])
    mv.release()
    del payload[: blen + meta.section]
    return inner, payload, meta


def body(kind: int, codec_id: int, buf: object, start: int, plen: int) -> tuple[int, int, int]:
    """``(codec, start, length)`` of the codec's bytes of a record whose payload of ``plen`` bytes
    starts at ``start`` of buffer ``buf``, read without a CRC check (the caller validates before
    it acts).  Raises CorruptionError for a prefix that does not fit."""
    if kind == KIND_EXPIRES:
        if plen < _I64.size:
            raise CorruptionError("record of kind 2 is shorter than its expiry field")
        return codec_id, start + _I64.size, plen - _I64.size
    if kind != KIND_META:
        return codec_id, start, plen
    mv = memoryview(buf)  # type: ignore[arg-type]
    inner, blen = _head(mv[start : start + _HEAD.size], plen)
    skip = blen + _section_len(mv[start : start + blen])
    if skip > plen:
        raise CorruptionError("metadata block: the parents' section runs past the record")
    return inner, start + skip, plen - skip


def names_others(buf: object, span: tuple[int, int]) -> bool:
    """True if the kind-3 payload at ``span`` (start, length) of ``buf`` names other jobs (its
    block has TAG_DEPS or TAG_AFTER), read without a CRC check: what a reader looks at before it
    reads the whole record of a dependent."""
    start, plen = span
    mv = memoryview(buf)  # type: ignore[arg-type]
    try:
        _inner, blen = _head(mv[start : start + _HEAD.size], plen)
    except CorruptionError:
        return True  # let the full read decide (and refuse it)
    block = mv[start : start + blen]
    pos = _HEAD.size
    while pos + _ENTRY.size <= blen:
        tag, n = _ENTRY.unpack_from(block, pos)
        if tag in (TAG_DEPS, TAG_AFTER):
            return True
        pos += _ENTRY.size + n
    return False


def _section_len(block: memoryview) -> int:
    """Bytes of the parents' section after ``block`` (0: none), read from its TAG_DEPS entry
    without parsing the rest (the entries are checked when the record is read in full)."""
    pos, end = _HEAD.size, len(block)
    while pos + _ENTRY.size <= end:
        tag, n = _ENTRY.unpack_from(block, pos)
        pos += _ENTRY.size
        if tag == TAG_DEPS and n == _DEPS.size and pos + n <= end:
            return int(_DEPS.unpack_from(block, pos)[1])
        pos += n
    return 0


def peek(kind: int, buf: object, start: int, plen: int) -> Meta:
    """The meta of a record's payload at ``start`` of ``buf`` without a CRC check (a claim reads
    the expiry of every job so; it re-validates the record before acting).  Raises
    CorruptionError."""
    mv = memoryview(buf)  # type: ignore[arg-type]
    if kind == KIND_EXPIRES:
        if plen < _I64.size:
            raise CorruptionError("record of kind 2 is shorter than its expiry field")
        return Meta(expires_ms=_I64.unpack_from(mv, start)[0])
    if kind != KIND_META:
        return NONE
    _inner, blen = _head(mv[start : start + _HEAD.size], plen)
    return _parse(mv[start : start + blen], mv[start + blen : start + plen])
