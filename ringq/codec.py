"""Payload codecs: how a payload becomes record bytes and back.

A record stores its payload as bytes plus a one-byte codec id (``docs/format.md``):

======  ===========  ===================================================================
id      name         bytes on disk
======  ===========  ===================================================================
1       ``json``     UTF-8 JSON text (RFC 8259: no NaN or Infinity), any JSON value
2       ``bytes``    the raw bytes of a ``bytes``/``bytearray``/``memoryview`` payload
3       ``ndarray``  u32 header length, a JSON header ``{"dtype", "shape"}``, C-order data
                     (``dtype``: numpy's dtype string, or its ``descr`` list for a structured dtype)
4       ``keyed``    an envelope around one of the above: u16 key length *k*, *k* bytes of
                     UTF-8 key, u8 inner codec id (1-3), the inner codec's bytes
======  ===========  ===================================================================

The ``keyed`` envelope carries a job's limit key (``enqueue(..., key=...)``, ringq/limits.py)
inside the payload bytes, so every path that copies a record's payload and codec verbatim
(relocation, requeue, salvage) keeps the key without knowing about it.

Arrays round-trip exactly -- dtype (including byte order) and shape -- and never through pickle.
Object arrays are refused.  Decoding checks every length against the record's own length.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import numpy as np

from .errors import SerializationError

__all__ = ["JSON", "BYTES", "NDARRAY", "KEYED", "MAX_KEY_BYTES", "encode", "decode", "wrap_key", "split_key"]

JSON = 1
BYTES = 2
NDARRAY = 3
KEYED = 4
MAX_KEY_BYTES = 128  # a key is a limit's name, and a limit's name has 128 bytes in <name>.limits
_U16 = struct.Struct("<H")

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))

try:  # optional: a faster parser for decoding only (~0.2 us instead of ~1.7 us per small payload)
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def _loads(data: bytes | bytearray) -> Any:
    """Parse JSON text.  orjson refuses some of what json accepts (NaN/Infinity, lone surrogates)
    and turns integers beyond 64 bits into floats; the refused go to json, and so does any text
    with a run of 19 or more digits.  So the result never depends on whether orjson is installed.
    Encoding stays with json: orjson would write NaN as null instead of refusing it."""
    if _orjson is not None and not _LONG_NUMBER.search(data):
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(data)
_U32 = struct.Struct("<I")


def encode(payload: Any) -> tuple[int, bytes]:
    """Encode ``payload``; returns ``(codec id, bytes)``.

    Raises:
        SerializationError: the payload is not a JSON value, bytes, or a non-object numpy array
            (the message names the offending type or value).
    """
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return BYTES, bytes(payload)
    if isinstance(payload, np.ndarray):
        if payload.dtype.hasobject:
            raise SerializationError("numpy arrays of dtype object cannot be stored (no pickle)")
        dt = payload.dtype
        # A structured dtype keeps its field names (and offsets) through numpy's descr list.
        spec = dt.descr if dt.fields is not None else dt.str
        header = json.dumps({"dtype": spec, "shape": list(payload.shape)}).encode()
        data = np.ascontiguousarray(payload).tobytes()
        return NDARRAY, _U32.pack(len(header)) + header + data
    try:
        return JSON, _encoder.encode(payload).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"payload is not JSON-serialisable: {exc}") from None
    except UnicodeEncodeError as exc:
        raise SerializationError(f"payload holds text that is not valid Unicode: {exc}") from None


def decode(codec: int, data: bytes | bytearray) -> Any:
    """Decode bytes written by :func:`encode`.

    Raises:
        SerializationError: unknown codec id, or bytes that do not decode (corrupt or foreign).
    """
    if codec == KEYED:
        _key, codec, data = split_key(codec, data)
    try:
        if codec == JSON:
            return _loads(data)
        if codec == BYTES:
            return bytes(data)
        if codec == NDARRAY:
            (hlen,) = _U32.unpack_from(data, 0)
            if hlen > len(data) - 4:
                raise ValueError("array header longer than the record")
            header = json.loads(bytes(data[4 : 4 + hlen]))
            dtype = np.dtype(_descr(header["dtype"]))
            if dtype.hasobject:
                raise ValueError("object dtype")
            shape = tuple(int(n) for n in header["shape"])
            buf = data if isinstance(data, bytearray) else bytearray(data)  # writable, no copy when given one
            body = memoryview(buf)[4 + hlen :]
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if count * dtype.itemsize != len(body):
                raise ValueError("array data length does not match dtype and shape")
            return np.frombuffer(body, dtype=dtype, count=count).reshape(shape)
    except (ValueError, KeyError, TypeError, struct.error, RecursionError) as exc:
        raise SerializationError(f"stored payload (codec {codec}) does not decode: {exc}") from None
    raise SerializationError(f"unknown payload codec {codec}")


def _descr(spec: Any) -> Any:
    """A JSON-decoded dtype spec back to what ``np.dtype`` takes (lists of fields become tuples)."""
    if isinstance(spec, str):
        return spec
    if not isinstance(spec, list):
        raise ValueError(f"bad dtype spec {spec!r}")
    out = []
    for field in spec:
        if not isinstance(field, list) or not 2 <= len(field) <= 3:
            raise ValueError(f"bad dtype field {field!r}")
        name, kind = field[0], _descr(field[1])
        name = tuple(name) if isinstance(name, list) else name
        out.append((name, kind, tuple(field[2])) if len(field) == 3 else (name, kind))
    return out


def wrap_key(key: str, codec: int, data: bytes) -> tuple[int, bytes]:
    """Put ``key`` in front of encoded payload bytes: returns ``(KEYED, envelope bytes)``.

    Raises:
        ValueError: ``key`` is not a non-empty string of at most :data:`MAX_KEY_BYTES` UTF-8
            bytes, or holds a NUL or a lone surrogate.
    """
    if not isinstance(key, str) or not key or "\x00" in key:
        raise ValueError(f"a job key must be a non-empty string without NUL, got {key!r}")
    try:
        raw = key.encode("utf-8", "strict")
    except UnicodeEncodeError:
        raise ValueError(f"a job key must be valid Unicode text, got {key!r}") from None
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"a job key has at most {MAX_KEY_BYTES} UTF-8 bytes, got {len(raw)}")
    return KEYED, _U16.pack(len(raw)) + raw + bytes((codec,)) + data


def split_key(codec: int, data: bytes | bytearray) -> tuple[str | None, int, bytes | bytearray]:
    """``(key, inner codec, inner bytes)`` of a stored payload; ``(None, codec, data)`` unless
    ``codec`` is :data:`KEYED`.  Raises SerializationError for a malformed envelope."""
    if codec != KEYED:
        return None, codec, data
    if len(data) < 3:
        raise SerializationError("stored keyed payload is shorter than its envelope")
    (k,) = _U16.unpack_from(data, 0)
    if k == 0 or k > MAX_KEY_BYTES or 2 + k + 1 > len(data):
        raise SerializationError(f"stored keyed payload has an impossible key length {k}")
    try:
        key = bytes(data[2 : 2 + k]).decode("utf-8", "strict")
    except UnicodeDecodeError:
        raise SerializationError("stored job key is not valid UTF-8") from None
    inner = data[2 + k]
    if inner == KEYED:
        raise SerializationError("stored keyed payload nests another key")
    body = data[3 + k :]
    return key, inner, bytearray(body) if isinstance(data, bytearray) else bytes(body)
