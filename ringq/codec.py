"""Payload codecs: how a payload becomes record bytes and back.

A record stores its payload as bytes plus a one-byte codec id (``docs/format.md``):

======  ===========  ===================================================================
id      name         bytes on disk
======  ===========  ===================================================================
1       ``json``     UTF-8 JSON text (RFC 8259: no NaN or Infinity), any JSON value
2       ``bytes``    the raw bytes of a ``bytes``/``bytearray``/``memoryview`` payload
3       ``ndarray``  u32 header length, a JSON header ``{"dtype", "shape"}``, C-order data
                     (``dtype``: numpy's dtype string, or its ``descr`` list for a structured dtype)
4       ``mixed``    u32 tree length, a JSON tree, then binary blocks: dicts and lists holding
                     arrays, numpy scalars and bytes anywhere inside (see :func:`encode`)
5       ``keyed``    an envelope around one of the above: u16 key length *k*, *k* bytes of
                     UTF-8 key, u8 inner codec id (1-4), the inner codec's bytes
======  ===========  ===================================================================

The ``keyed`` envelope carries a job's limit key (``enqueue(..., key=...)``, ringq/local/limits.py)
inside the payload bytes, so every path that copies a record's payload and codec verbatim
(relocation, requeue, salvage) keeps the key without knowing about it.

Arrays round-trip exactly -- dtype (including byte order and structured fields) and shape -- and
never through pickle.  Object arrays are refused.  Decoding checks every length against the
record's own length.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from collections.abc import Callable, Sequence
from itertools import chain
from operator import itemgetter
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .errors import SerializationError

if TYPE_CHECKING:  # numpy is imported where an array is decoded, never to encode JSON
    import numpy as np

__all__ = [
    "JSON",
    "BYTES",
    "NDARRAY",
    "MIXED",
    "KEYED",
    "IN_META",
    "MAX_KEY_BYTES",
    "MAX_DEPTH",
    "MAX_FIELD_DEPTH",
    "encode",
    "encode_stored",
    "encode_stored_many",
    "stored_many",
    "stored",
    "decode",
    "jsonable",
    "wrap_key",
    "split_key",
    "key_at",
    "json_decoders",
    "LONG_DIGITS",
]

JSON = 1
BYTES = 2
NDARRAY = 3
MIXED = 4
KEYED = 5
# The codec byte of a record of kind 3 (ringq/engine/meta.py): the payload's own codec is in its
# metadata block.  Never a payload codec itself, so a reader that does not know kind 3 refuses the
# payload (unknown codec) instead of decoding the block as part of it.
IN_META = 6
MAX_KEY_BYTES = 128  # a key is a limit's name, and a limit's name has 128 bytes in <name>.limits
# How deep a payload's lists and dicts may nest.  Decoding recurses (the json module's C parser,
# the mixed payload's tree), and the interpreter's recursion limit counts the caller's frames too:
# a payload nested near that limit, accepted where it was enqueued, would fail to decode in a
# consumer that calls from deeper.  This leaves hundreds of frames to every consumer.
MAX_DEPTH = 256
MAX_FIELD_DEPTH = 32  # levels of a structured numpy dtype's fields within fields
_U16 = struct.Struct("<H")

# Blocks of a mixed payload start at multiples of this many bytes from the payload's start, so a
# decoded array is aligned for any dtype numpy has (the largest itemsize of a builtin is 16).
_ALIGN = 16
# Tags of a mixed payload's tree: a dict with exactly one key that starts with "$" is a tag.
_TAG_BYTES, _TAG_ARRAY, _TAG_SCALAR, _TAG_DICT = "$b", "$a", "$s", "$d"


class _NotJSON(Exception):
    """Raised inside the JSON encoder when the payload holds an array, a numpy scalar or bytes."""


def _loaded_numpy() -> Any:
    """The numpy module if something imported it, else None: without it, no value can be an array
    or a numpy scalar, so a payload needs no numpy to be encoded.  A numpy that another thread is
    importing right now counts as not imported: no array can exist before its import finished,
    and its attributes may not be there yet."""
    np = sys.modules.get("numpy")
    if np is None or getattr(getattr(np, "__spec__", None), "_initializing", False):
        return None
    return np


def _not_json(obj: Any) -> Any:
    np = _loaded_numpy()
    if isinstance(obj, (bytes, bytearray, memoryview)) or (
        np is not None and isinstance(obj, (np.ndarray, np.generic))
    ):
        raise _NotJSON
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


# One encoder for both paths: a payload of plain JSON values never leaves the C encoder; one that
# holds an array or bytes is detected there (``default`` is only called for unknown types) and
# re-encoded as a mixed payload.
_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_not_json
)
_tree_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# The same encoder without JSONEncoder.encode's per-call set-up (it builds a C encoder on every
# call; this one is built once, about 1 us less per payload): the standard library's C encoder
# with _encoder's settings and no cycle markers -- a cycle ends in RecursionError instead, which
# encode() handles like any other failure.  None where the C accelerator is missing.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_json_once = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(
        None, _not_json, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
)


_orjson: ModuleType | None
try:  # optional: a faster parser for decoding only (~0.2 us instead of ~1.7 us per small payload)
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


LONG_DIGITS = 19  # a run of this many digits or more is parsed by json, never by orjson
_LONG_NUMBER = re.compile(rb"[0-9]{%d}" % LONG_DIGITS)


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


def json_decoders() -> tuple[Callable[[bytes], Any] | None, Callable[[str, int], tuple[Any, int]]]:
    """What :func:`decode` parses a JSON payload with, for a compiled decoder that must agree with
    it: orjson's ``loads`` (None without orjson), for a text with no run of :data:`LONG_DIGITS`
    digits, and json's scanner with json's defaults, ``scan(text, index) -> (value, end)``, for
    the rest and whatever orjson refuses."""
    # json's own parser of a text at an index (the C scanner json.loads runs), with its defaults
    scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
    return (None if _orjson is None else _orjson.loads), scan


_U32 = struct.Struct("<I")


def encode(payload: Any) -> tuple[int, bytes]:
    """Encode ``payload``; returns ``(codec id, bytes)``.

    ``payload`` is a JSON value (dict, list, tuple, str, int, float, bool, None), ``bytes``, a numpy
    array, or dicts and lists holding any of these -- arrays, numpy scalars and bytes included --
    at any depth.  What comes back from :func:`decode`:

    * arrays keep dtype (byte order, structured fields), shape and values; they come back
      C-contiguous and writable, as ``numpy.ndarray`` (a ``numpy.memmap`` too).  Other ndarray
      subclasses (``numpy.ma.MaskedArray``, ``numpy.matrix``, ...) carry state the bytes do not,
      and are refused;
    * numpy scalars keep their type (``np.int8(3)`` stays ``np.int8``), except ``np.float64``,
      ``np.str_`` and ``np.bytes_``, which *are* Python ``float``, ``str`` and ``bytes``
      (subclasses) and come back as those, wherever they are;
    * ``bytes``, ``bytearray`` and ``memoryview`` come back as ``bytes``, never confused with text;
    * tuples come back as lists and dict keys are strings, as in JSON (``{1: "a"}`` comes back
      as ``{"1": "a"}``).

    Raises:
        SerializationError: the payload holds something else (a set, an object array, an
            ndarray subclass, a NaN Python float, a cycle, ...), or a dict with two keys that
            JSON writes as the same key (``1`` and ``"1"``, ``True`` and ``"true"``, ``None`` and
            ``"null"``: one would be lost); the message names the offending type or keys and
            where they are.
    """
    codec, data = _encode(payload)
    if codec == JSON and not _unchanged(payload, _JSON_LEAVES):
        _check_keys(payload)  # only a dict with a key that is not a str can lose one
    return codec, data


def _encode(payload: Any) -> tuple[int, bytes]:
    """:func:`encode` without the check of a JSON payload's keys, which the callers that walk
    the payload anyway (:func:`encode_stored`, :func:`stored_many`) make only when a key is not
    a str.  A mixed payload's keys are checked here, by the walk that builds its tree."""
    cls = payload.__class__
    if cls is not dict and cls is not list and cls is not str:  # these go to the JSON encoder
        if isinstance(payload, (bytes, bytearray, memoryview)):
            return BYTES, bytes(payload)
        np = _loaded_numpy()
        if np is not None and isinstance(payload, np.ndarray):
            _check_array(payload, "payload")
            header = json.dumps(
                {"dtype": _spec(payload.dtype), "shape": list(payload.shape)}
            ).encode()
            data = np.ascontiguousarray(payload).tobytes()
            return NDARRAY, _U32.pack(len(header)) + header + data
    try:
        if _json_once is None:
            text = _encoder.encode(payload).encode("utf-8")
        else:
            text = "".join(_json_once(payload, 0)).encode("utf-8")
        if len(text) > _DEPTH_TEXT:  # shorter text cannot nest too deep: no call
            _check_depth(text)
        return JSON, text
    except _NotJSON:
        return MIXED, _encode_mixed(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        # Walk it again (only on this failing path) for a message that says where the culprit is.
        try:
            _encode_mixed(payload)
        except SerializationError as located:
            why = str(located).removeprefix("payload is not serialisable: ")
            raise SerializationError(f"payload is not JSON-serialisable: {why}") from None
        raise SerializationError(f"payload is not JSON-serialisable: {exc}") from None
    except UnicodeEncodeError as exc:
        raise SerializationError(f"payload holds text that is not valid Unicode: {exc}") from None


# Types that JSON gives back as themselves (exact types: a subclass comes back as its base).
_JSON_LEAVES: frozenset[type] = frozenset({str, int, float, bool, type(None)})
_STR_KEYS: frozenset[type] = frozenset({str})
_mixed_leaves: frozenset[type] | None = None
_first, _second = itemgetter(0), itemgetter(1)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _check_depth(text: bytes) -> None:
    """Refuse JSON ``text`` whose lists and dicts nest deeper than MAX_DEPTH.  Costs nothing for
    text too short to nest that deep or with too few brackets.  Otherwise the strings are cut out
    and a few passes remove the innermost containers (one level a pass, at C speed: a shallow
    payload ends there); the depth of what is left is its deepest running count of brackets."""
    if len(text) <= _DEPTH_TEXT or text.count(b"[") + text.count(b"{") <= MAX_DEPTH:
        return
    left = _JSON_STRING.sub(b"", text).translate(None, _NOT_BRACKETS)
    for _ in range(_DEPTH_PASSES):
        left, removed = _INNERMOST.subn(b"", left)
        if not left or not removed:
            return
    # Opening brackets as +1, closing ones as -1: the deepest running sum is the depth.  (numpy:
    # this is the rare payload that is both large and deeper than the passes.)
    import numpy as np

    steps = np.frombuffer(left.translate(_BRACKET_STEPS), np.int8).astype(np.int32) - 1
    deepest = _DEPTH_PASSES + int(np.cumsum(steps).max())
    if deepest > MAX_DEPTH:
        raise SerializationError(
            f"payload nests lists and dicts more than {MAX_DEPTH} deep, which a consumer could "
            "not decode"
        )


_DEPTH_TEXT = 2 * MAX_DEPTH  # bytes of the shortest JSON text nested deeper than MAX_DEPTH
_DEPTH_PASSES = 3  # most payloads are no deeper: they end in these passes
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


def _unchanged(obj: Any, leaves: frozenset[type]) -> bool:
    """True if ``obj`` is built of dicts with str keys, lists and ``leaves`` only (exact types, at
    any depth): decoding its encoding gives back an equal value of the same types.  False for a
    tuple, a dict key that is not a str, a subclass (an IntEnum, a str subclass), ...  One plain
    loop over each container (cheaper than any C-level pass that calls type() per item)."""
    t = type(obj)
    if t is dict:
        for k, v in obj.items():
            if type(k) is not str:
                return False
            tv = type(v)
            if tv not in leaves and not ((tv is dict or tv is list) and _unchanged(v, leaves)):
                return False
        return True
    if t is list:
        for v in obj:
            tv = type(v)
            if tv not in leaves and not ((tv is dict or tv is list) and _unchanged(v, leaves)):
                return False
        return True
    return t in leaves


def _key_text(key: Any) -> str | None:
    """The text the json module writes for the dict key ``key``, or None for a key it refuses."""
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, float):
        return float.__repr__(key)
    if key is True or key is False or key is None:
        return json.dumps(key)
    if isinstance(key, int):
        return int.__repr__(key)
    return None


def _same_key(d: dict[Any, Any]) -> tuple[Any, Any, str] | None:
    """Two keys of ``d`` that JSON writes as the same text, and that text; None if none are."""
    seen: dict[str, Any] = {}
    for key in d:
        text = _key_text(key)
        if text is None:
            continue  # refused by the encoder itself
        if text in seen:
            return seen[text], key, text
        seen[text] = key
    return None


def _lost_key(obj: Any) -> tuple[str, Any, Any, str] | None:
    """``(where, key, other key, text)``: the first dict in ``obj`` (``where`` is its path from
    ``obj``, ``""`` for ``obj`` itself) with two keys that JSON writes as the same text; None if
    there is none.  Only a dict with a key that is not a str can have such keys."""
    if isinstance(obj, dict):
        for key in obj:
            if type(key) is not str:
                same = _same_key(obj)
                if same is not None:
                    return ("", *same)
                break
        for key, v in obj.items():
            if isinstance(v, (dict, list, tuple)):
                found = _lost_key(v)
                if found is not None:
                    return (f"[{key!r}]{found[0]}", *found[1:])
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            if isinstance(v, (dict, list, tuple)):
                found = _lost_key(v)
                if found is not None:
                    return (f"[{i}]{found[0]}", *found[1:])
    return None


def _lost_key_error(where: str, key: Any, other: Any, text: str) -> SerializationError:
    return SerializationError(
        f"{where} has the keys {key!r} and {other!r}, which JSON writes as the same key "
        f"{json.dumps(text, ensure_ascii=False)}: one of them would be lost (use distinct str keys)"
    )


def _check_keys(payload: Any) -> None:
    """Raise SerializationError if a dict in ``payload`` has two keys that JSON writes as the
    same key (``1`` and ``"1"``): decoding would give back one of them.  For a payload that
    :func:`_unchanged` refused (a key that is not a str, a tuple, a subclass): the rest never
    has such keys."""
    found = _lost_key(payload)
    if found is not None:
        where, key, other, text = found
        raise _lost_key_error(f"payload{where}", key, other, text)


def stored(payload: Any, codec: int, data: bytes) -> Any:
    """``payload`` as :func:`decode` gives it back from ``(codec, data)`` (what :func:`encode`
    made of it), so that a producer sees what a consumer will: dict keys become strings and tuples
    lists (JSON), a ``bytearray`` or ``memoryview`` becomes ``bytes``.  ``payload`` itself where
    that changes nothing (the common case costs a walk of its containers, no decoding); an array
    is returned as given (same dtype, shape and values as the consumer's copy).  Raises
    SerializationError for a dict with two keys that JSON writes as the same key (as
    :func:`encode`), found only where ``payload`` is not unchanged: a key is not a str."""
    global _mixed_leaves
    if codec == JSON:
        if _unchanged(payload, _JSON_LEAVES):
            return payload
        _check_keys(payload)
        return _loads(data)
    if codec == BYTES:
        return data
    if codec == MIXED:
        if _mixed_leaves is None:
            import numpy as np

            _mixed_leaves = _JSON_LEAVES | {bytes, np.ndarray}
        leaves = _mixed_leaves
        return payload if _unchanged(payload, leaves) else decode(MIXED, data)
    return payload


def stored_many(payloads: Sequence[Any], encoded: Sequence[tuple[int, bytes]]) -> list[Any]:
    """:func:`stored` of each payload, given its :func:`encode` result.  A batch of flat dicts
    with str keys (the usual jobs) is recognised from the encoded text without a call per
    payload: JSON codec throughout, one ``{`` per payload and no ``[`` in all the text (no nested
    container, no tuple), and every key a str; such payloads are returned as given (a value of
    a subclass of str, int or float, such as an IntEnum member, then stays as given: equal to the
    consumer's).  Any other batch (text holding a brace or bracket included) goes payload by
    payload (:func:`stored`, which checks the keys where one is not a str)."""
    n = len(payloads)
    try:
        text = b"".join(map(_second, encoded))
        if (
            list(map(_first, encoded)).count(JSON) == n
            and text.count(b"{") == n
            and b"[" not in text
            and isinstance("".join(chain.from_iterable(map(dict.keys, payloads))), str)
        ):
            return list(payloads)
    except TypeError:  # a payload that is not a dict, or a key that is not a str
        pass
    return [stored(p, c, d) for p, (c, d) in zip(payloads, encoded)]


def encode_stored(payload: Any) -> tuple[int, bytes, Any]:
    """``(codec id, bytes, stored value)``: :func:`encode` and :func:`stored` in one call, with
    one walk of the payload: a payload of dicts with str keys (the usual) is never walked
    twice.  Raises SerializationError as :func:`encode`."""
    codec, data = _encode(payload)
    if codec == JSON:  # stored()'s first case, without its call
        if _unchanged(payload, _JSON_LEAVES):
            return codec, data, payload
        _check_keys(payload)
        return codec, data, _loads(data)
    return codec, data, stored(payload, codec, data)


def encode_stored_many(payloads: Sequence[Any]) -> tuple[list[tuple[int, bytes]], list[Any]]:
    """``([(codec id, bytes)], [stored value])`` of every payload: :func:`encode_stored` for a
    batch, whose values :func:`stored_many` finds without a walk per payload when they are flat
    dicts with str keys.  Raises SerializationError as :func:`encode`."""
    encoded = [_encode(p) for p in payloads]
    return encoded, stored_many(payloads, encoded)


def _check_array(obj: np.ndarray, where: str) -> None:
    """Refuse what a plain array's dtype, shape and bytes cannot carry back exactly."""
    import numpy as np

    if type(obj) is not np.ndarray and not isinstance(obj, np.memmap):
        # A subclass keeps state outside the data (a masked array's mask, a matrix's 2-d
        # semantics); stored as its data it would come back as a plain array and lose it.
        cls = type(obj)
        raise SerializationError(
            f"{where} is a {cls.__module__}.{cls.__qualname__}, a numpy array subclass, which "
            "cannot be stored exactly (plain numpy.ndarray only; convert it, e.g. a masked "
            "array to its .data and .mask arrays)"
        )
    if obj.dtype.itemsize == 0:
        raise SerializationError(
            f"{where} is a numpy array of dtype {obj.dtype}, whose items are 0 bytes wide, "
            "which cannot be stored (numpy cannot rebuild such an array from its bytes)"
        )
    if obj.dtype.hasobject:
        if obj.dtype == object:
            raise SerializationError(
                f"{where} is a numpy array of dtype object, which cannot be stored (no pickle)"
            )
        raise SerializationError(  # StringDType: its items live outside the array's bytes
            f"{where} is a numpy array of dtype {obj.dtype}, whose items live outside the "
            "array's bytes, which cannot be stored; a fixed-width dtype such as '<U16' or 'S16' can"
        )


def _check_fields(dt: np.dtype, depth: int) -> None:
    """Refuse a structured dtype (``depth`` levels of fields deep so far) that the stored header
    cannot give back: a title that is not a str, at any depth, or fields nested more than
    MAX_FIELD_DEPTH deep (each level is several levels of the header's JSON)."""
    if depth > MAX_FIELD_DEPTH:
        raise SerializationError(
            f"a numpy dtype whose structured fields nest more than {MAX_FIELD_DEPTH} deep "
            "cannot be stored"
        )
    for name, (fdt, _off, *title) in (dt.fields or {}).items():
        if title and not isinstance(title[0], str):
            raise SerializationError(
                f"a numpy dtype whose field {name!r} has a title of type "
                f"{type(title[0]).__name__} cannot be stored (titles must be str)"
            )
        base = fdt.subdtype[0] if fdt.subdtype is not None else fdt
        if base.fields is not None:
            _check_fields(base, depth + 1)


def _spec(dt: np.dtype) -> Any:
    """A dtype as JSON: its string for a plain dtype; numpy's ``descr`` list for a structured
    dtype whose fields are packed (that list gives it back exactly); otherwise -- padding
    between or after the fields, an aligned struct, overlapping fields -- the names, formats,
    offsets and item size as ``np.dtype`` takes them in a dict (a ``descr`` list would come back
    with its padding as extra fields)."""
    if dt.fields is None:
        return dt.str
    import numpy as np

    _check_fields(dt, 1)
    try:
        descr: Any = dt.descr
        if not dt.isalignedstruct and all(f[0] for f in descr) and np.dtype(descr) == dt:
            return descr
    except (ValueError, TypeError):  # overlapping or out-of-order fields, a field's metadata
        pass
    names = list(dt.names or ())
    formats, titles = [], []
    for name in names:
        fdt, _off, *title = dt.fields[name]
        titles.append(title[0] if title else None)
        if fdt.subdtype is not None:
            base, shape = fdt.subdtype
            formats.append({"base": _spec(base), "shape": list(shape)})
        else:
            formats.append(_spec(fdt))
    spec = {
        "names": names,
        "formats": formats,
        "offsets": [dt.fields[name][1] for name in names],
        "itemsize": dt.itemsize,
        "aligned": dt.isalignedstruct,
    }
    if any(t is not None for t in titles):
        spec["titles"] = titles
    return spec


class _Blocks:
    """The binary blocks of a mixed payload, each padded to ``_ALIGN`` bytes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> list[int]:
        at = self.size
        self.parts.append(data)
        pad = -len(data) % _ALIGN
        if pad:
            self.parts.append(b"\0" * pad)
        self.size += len(data) + pad
        return [at, len(data)]


def _encode_mixed(payload: Any) -> bytes:
    blocks = _Blocks()
    try:
        tree = _to_tree(payload, blocks, "payload", [])
        text = _tree_encoder.encode(tree).encode("utf-8")
    except SerializationError:
        raise
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"payload is not serialisable: {exc}") from None
    except UnicodeEncodeError as exc:
        raise SerializationError(f"payload holds text that is not valid Unicode: {exc}") from None
    # Spaces after the tree (valid JSON whitespace) put the first block on an aligned offset.
    text += b" " * (-(4 + len(text)) % _ALIGN)
    return b"".join([_U32.pack(len(text)), text, *blocks.parts])


def _type_name(obj: Any) -> str:
    """``obj``'s type as a message names it: qualified unless built in (``numpy.bool``, not a
    ``bool`` that reads as Python's)."""
    cls = type(obj)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _to_tree(obj: Any, blocks: _Blocks, where: str, stack: list[int]) -> Any:
    """The JSON tree of ``obj``: arrays, numpy scalars and bytes become tags that point at blocks.
    ``stack``: the ids of the containers ``obj`` is in (a cycle, and the depth, are refused)."""
    if obj is None or isinstance(obj, (str, int, float)):  # bool is an int; np.float64 a float
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {_TAG_BYTES: blocks.add(bytes(obj))}
    np = _loaded_numpy()
    if np is not None and isinstance(obj, np.ndarray):
        _check_array(obj, where)
        return {
            _TAG_ARRAY: [
                *blocks.add(np.ascontiguousarray(obj).tobytes()),
                _spec(obj.dtype),
                list(obj.shape),
            ]
        }
    if np is not None and isinstance(obj, np.generic):
        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise SerializationError(
                f"{where} is a numpy object scalar, which cannot be stored (no pickle)"
            )
        if arr.dtype.itemsize == 0:
            raise SerializationError(
                f"{where} is a numpy scalar of dtype {arr.dtype}, 0 bytes wide, which cannot be "
                "stored (numpy cannot rebuild it from its bytes)"
            )
        return {_TAG_SCALAR: [*blocks.add(arr.tobytes()), _spec(arr.dtype)]}
    if isinstance(obj, (dict, list, tuple)):
        if id(obj) in stack:
            raise SerializationError(f"{where} contains itself (a circular reference)")
        if len(stack) >= MAX_DEPTH:
            raise SerializationError(
                f"payload nests lists and dicts more than {MAX_DEPTH} deep, which a consumer "
                "could not decode"
            )
        stack.append(id(obj))
        try:
            if isinstance(obj, dict):
                out = {}
                str_keys = True
                for k, v in obj.items():
                    if type(k) is not str:
                        str_keys = False
                        if not isinstance(k, (str, int, float, bool)) and k is not None:
                            raise SerializationError(
                                f"{where} has a key of type {_type_name(k)} (keys must be str, int, float, bool or None)"
                            )
                    out[k] = _to_tree(v, blocks, f"{where}[{k!r}]", stack)
                if not str_keys:
                    same = _same_key(obj)
                    if same is not None:
                        raise _lost_key_error(where, *same)
                # A one-key dict whose key starts with "$" would read as a tag: wrap it.
                if (
                    len(out) == 1
                    and isinstance(next(iter(out)), str)
                    and next(iter(out)).startswith("$")
                ):
                    return {_TAG_DICT: out}
                return out
            return [_to_tree(v, blocks, f"{where}[{i}]", stack) for i, v in enumerate(obj)]
        finally:
            stack.pop()
    raise SerializationError(
        f"{where} is of type {type(obj).__name__}, which a payload cannot hold "
        "(JSON values, bytes, numpy arrays and numpy scalars only; no pickle)"
    )


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
            buf = (
                data if isinstance(data, bytearray) else bytearray(data)
            )  # writable, no copy when given one
            return _array(memoryview(buf)[4 + hlen :], header["dtype"], header["shape"])
        if codec == MIXED:
            (tlen,) = _U32.unpack_from(data, 0)
            if tlen > len(data) - 4:
                raise ValueError("tree longer than the record")
            tree = _loads(bytes(data[4 : 4 + tlen]))
            buf = data if isinstance(data, bytearray) else bytearray(data)
            return _from_tree(tree, memoryview(buf)[4 + tlen :])
    except (ValueError, KeyError, TypeError, IndexError, struct.error, RecursionError) as exc:
        raise SerializationError(f"stored payload (codec {codec}) does not decode: {exc}") from None
    raise SerializationError(f"unknown payload codec {codec}")


def _array(body: memoryview, spec: Any, shape: Any) -> np.ndarray:
    import numpy as np

    dtype = np.dtype(_descr(spec))
    if dtype.hasobject:
        raise ValueError("object dtype")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"bad shape {shape!r}")
    shape = tuple(shape)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count * dtype.itemsize != len(body):
        raise ValueError("array data length does not match dtype and shape")
    return np.frombuffer(body, dtype=dtype, count=count).reshape(shape)


def _block(blocks: memoryview, ref: Any) -> memoryview:
    if not (
        isinstance(ref, list)
        and len(ref) >= 2
        and all(isinstance(n, int) and n >= 0 for n in ref[:2])
    ):
        raise ValueError(f"bad block reference {ref!r}")
    at, n = ref[0], ref[1]
    if at + n > len(blocks):
        raise ValueError("block outside the record")
    return blocks[at : at + n]


def _from_tree(node: Any, blocks: memoryview) -> Any:
    if isinstance(node, list):
        return [_from_tree(v, blocks) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((key, value),) = node.items()
        if key.startswith("$"):
            if key == _TAG_DICT and isinstance(value, dict):
                return {k: _from_tree(v, blocks) for k, v in value.items()}
            if key == _TAG_BYTES:
                return bytes(_block(blocks, value))
            if key == _TAG_ARRAY and isinstance(value, list) and len(value) == 4:
                return _array(_block(blocks, value), value[2], value[3])
            if key == _TAG_SCALAR and isinstance(value, list) and len(value) == 3:
                return _array(_block(blocks, value), value[2], [])[()]
            raise ValueError(f"unknown tag {key!r}")
    return {k: _from_tree(v, blocks) for k, v in node.items()}


def _descr(spec: Any) -> Any:
    """A JSON-decoded dtype spec back to what ``np.dtype`` takes (lists of fields become tuples)."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, dict):  # a structured dtype with padding (see _spec)
        fields = {k: spec[k] for k in ("names", "formats", "offsets", "itemsize")}
        if not all(isinstance(v, list) for k, v in fields.items() if k != "itemsize"):
            raise ValueError(f"bad dtype spec {spec!r}")
        fields["formats"] = [
            (_descr(f["base"]), tuple(f["shape"]))
            if isinstance(f, dict) and "base" in f
            else _descr(f)
            for f in fields["formats"]
        ]
        if "titles" in spec:
            fields["titles"] = spec["titles"]
        fields["aligned"] = spec.get("aligned") is True
        return fields
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
    key, at = key_at(data, 0, len(data))
    body = data[at + 1 :]
    return key, data[at], bytearray(body) if isinstance(data, bytearray) else bytes(body)


def stored_key(raw: bytes) -> str:
    """The key whose stored bytes are ``raw``, held to the rule :func:`wrap_key` wrote it by
    (UTF-8, no NUL).  Raises SerializationError for bytes no enqueue could have stored."""
    try:
        key = raw.decode("utf-8", "strict")
    except UnicodeDecodeError:
        raise SerializationError("stored job key is not valid UTF-8") from None
    if "\x00" in key:
        raise SerializationError("stored job key holds a NUL")
    return key


def key_at(buf: Any, start: int, end: int) -> tuple[str, int]:
    """The key of the keyed envelope stored in ``buf[start:end]`` (bytes, a bytearray or a
    mapping: nothing is copied but the key), and the offset in ``buf`` of its inner codec byte.
    Raises SerializationError for a malformed envelope."""
    if end - start < 3:
        raise SerializationError("stored keyed payload is shorter than its envelope")
    (k,) = _U16.unpack_from(buf, start)
    at = start + 2 + k
    if k == 0 or k > MAX_KEY_BYTES or at + 1 > end:
        raise SerializationError(f"stored keyed payload has an impossible key length {k}")
    key = stored_key(bytes(buf[start + 2 : at]))
    if buf[at : at + 1][0] == KEYED:  # (a slice: a mapping's item may be a 1-byte bytes)
        raise SerializationError("stored keyed payload nests another key")
    return key, at


def jsonable(payload: Any) -> Any:
    """A JSON-friendly view of a decoded payload for display: bytes, arrays and numpy scalars
    inside it are described (``{"$bytes": n}``, ``{"$ndarray": {"dtype", "shape"}}``,
    ``{"$scalar": {"dtype", "value"}}``), not embedded."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return {"$bytes": len(payload)}
    np = _loaded_numpy()
    if np is not None and isinstance(payload, np.ndarray):
        return {"$ndarray": {"dtype": payload.dtype.str, "shape": list(payload.shape)}}
    if np is not None and isinstance(payload, np.generic) and not isinstance(payload, (float, str)):
        return {"$scalar": {"dtype": payload.dtype.str, "value": str(payload)}}
    if isinstance(payload, dict):
        return {k: jsonable(v) for k, v in payload.items()}
    if isinstance(payload, (list, tuple)):
        return [jsonable(v) for v in payload]
    return payload
