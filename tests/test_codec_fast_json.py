"""Decoding JSON payloads gives the same values whether or not the optional orjson is installed;
encoding gives the same bytes and refusals whether or not the prebuilt C encoder is used."""

from __future__ import annotations

import math

import pytest

from ringq import codec

VALUES = [
    0,
    -1,
    2**63 - 1,
    2**63,
    -(2**63),
    2**64,
    2**70,
    -(2**65),
    12345678901234567890,
    0.1,
    1 / 3,
    1e300,
    -0.0,
    "é☃",
    {"a": [1, 2.5, None, True, False]},
    [],
    {},
    "",
    [[[[]]]],
    {"n": 1, "kind": "resize", "path": "/srv/images/00000001.jpg", "w": 640},
]
TEXTS = [b"NaN", b"-Infinity", b'"\\ud800"', b'{"a": 1, "a": 2}', b"1E400", b" [1 , 2 ] "]


@pytest.fixture(params=["json", "orjson"])
def parser(request, monkeypatch):
    if request.param == "orjson":
        if codec._orjson is None:
            pytest.skip("orjson is not installed")
    else:
        monkeypatch.setattr(codec, "_orjson", None)
    return request.param


def _same(a, b) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b and repr(a) == repr(b)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_round_trip_is_exact(parser, value):
    kind, data = codec.encode(value)
    assert _same(codec.decode(kind, data), value)


@pytest.mark.parametrize("text", TEXTS, ids=repr)
def test_foreign_json_decodes_as_the_standard_library_does(parser, text):
    import json

    assert _same(codec.decode(codec.JSON, text), json.loads(text))


def test_damaged_json_is_a_serialization_error(parser):
    with pytest.raises(codec.SerializationError):
        codec.decode(codec.JSON, b'{"a": ')


@pytest.fixture(params=["prebuilt", "per-call"])
def encoder(request, monkeypatch):
    if request.param == "per-call":
        monkeypatch.setattr(codec, "_json_once", None)
    elif codec._json_once is None:
        pytest.skip("this Python has no C JSON encoder")
    return request.param


ENCODED = [
    *VALUES,
    "line\u2028sep",
    '\x00ctl"quote\\',
    (1, [2, (3,)]),
    {1: "int key", "k": True},
    10**30,
    1e-7,
]


@pytest.mark.parametrize("value", ENCODED, ids=repr)
def test_encoding_is_the_standard_encoders(encoder, value):
    import json

    want = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    assert codec.encode(value) == (codec.JSON, want)


def _cyclic_list():
    x: list = []
    x.append(x)
    return x


def _cyclic_dict():
    d: dict = {}
    d["a"] = [d]
    return d


@pytest.mark.parametrize(
    "value, where",
    [
        (float("nan"), "Out of range float"),
        ({"a": float("inf")}, "Out of range float"),
        ({1, 2}, "set"),
        ([object()], "object"),
        ("\ud800", "surrogates not allowed"),
        (_cyclic_list(), "circular reference"),
        (_cyclic_dict(), "circular reference"),
    ],
    ids=["nan", "inf", "set", "object", "surrogate", "cyclic-list", "cyclic-dict"],
)
def test_refusals_are_the_same_serialization_errors(encoder, value, where):
    with pytest.raises(codec.SerializationError, match=where):
        codec.encode(value)


class _Dict(dict):
    pass


class _List(list):
    pass


class _Str(str):
    pass


@pytest.mark.parametrize(
    "value, plain",
    [
        (_Dict(a=1), {"a": 1}),
        (_List([1, "x"]), [1, "x"]),
        (_Str("s"), "s"),
        ({"k": _Dict(b=_List([2]))}, {"k": {"b": [2]}}),
    ],
    ids=repr,
)
def test_subclasses_of_dict_list_and_str_encode_as_their_base_types(value, plain):
    assert codec.encode(value) == codec.encode(plain)
    assert codec.decode(*codec.encode(value)) == plain


def test_a_dict_or_list_holding_bytes_or_an_array_is_encoded_mixed_not_refused():
    np = pytest.importorskip("numpy")
    for value in ({"b": b"\x00\xff"}, [np.arange(3, dtype=np.int16)]):
        kind, data = codec.encode(value)
        assert kind == codec.MIXED
        back = codec.decode(kind, data)
        assert type(back) is type(value) and len(back) == len(value)


MERGED_KEYS = [
    ({1: "a", "1": "b"}, "payload", "1 and '1'", '"1"'),
    ({"1": "b", 1: "a"}, "payload", "'1' and 1", '"1"'),
    ({True: 1, "true": 2}, "payload", "True and 'true'", '"true"'),
    ({False: 1, "false": 2}, "payload", "False and 'false'", '"false"'),
    ({None: 1, "null": 2}, "payload", "None and 'null'", '"null"'),
    ({1.5: 1, "1.5": 2}, "payload", "1.5 and '1.5'", '"1.5"'),
    ({-(2**70): 1, str(-(2**70)): 2}, "payload", "-1180591620717411303424 and", '"-1180'),
    ({"outer": [{"x": 0}, {2: "a", "2": "b"}]}, "payload['outer'][1]", "2 and '2'", '"2"'),
    (({0: "a", "0": "b"},), "payload[0]", "0 and '0'", '"0"'),
    ([{"k": {"é": 1, 3: {"3": 1, 3: 2}}}], "payload[0]['k'][3]", "'3' and 3", '"3"'),
]


@pytest.mark.parametrize("value, where, keys, text", MERGED_KEYS, ids=repr)
def test_keys_that_json_would_merge_are_refused(encoder, value, where, keys, text):
    # {1: "a", "1": "b"} would decode as {"1": "b"}: one value lost without a word.
    import re

    message = (
        rf"^{re.escape(where)} has the keys {re.escape(keys)}.* "
        rf"which JSON writes as the same key {re.escape(text)}"
    )
    for encode in (
        codec.encode,
        codec.encode_stored,
        lambda v: codec.encode_stored_many([{"fine": 1}, v]),
    ):
        with pytest.raises(codec.SerializationError, match=message):
            encode(value)


def test_keys_that_json_would_merge_are_refused_in_a_mixed_payload_too():
    np = pytest.importorskip("numpy")
    value = {"arr": np.arange(2), "d": [{1: "a", "1": "b"}]}
    for encode in (codec.encode, codec.encode_stored, lambda v: codec.encode_stored_many([v])):
        with pytest.raises(codec.SerializationError, match=r"payload\['d'\]\[0\] has the keys 1"):
            encode(value)


@pytest.mark.parametrize(
    "value, back",
    [
        ({1: "a", 2: "b", "k": "c"}, {"1": "a", "2": "b", "k": "c"}),
        ({True: 1, "false": 2, None: 3, 1.5: 4}, {"true": 1, "false": 2, "null": 3, "1.5": 4}),
        ({"a": [{1: "x"}], "b": ({2: "y"},)}, {"a": [{"1": "x"}], "b": [{"2": "y"}]}),
    ],
    ids=repr,
)
def test_keys_that_stay_apart_in_json_are_taken(encoder, value, back):
    assert codec.decode(*codec.encode(value)) == back
    assert codec.encode_stored(value)[2] == back
    assert codec.encode_stored_many([value])[1] == [back]


def test_payloads_with_str_keys_only_are_never_walked_for_the_key_check(monkeypatch):
    # The check costs nothing where no key can be lost: only a dict with a key that is not a
    # str (which the stored value's walk finds anyway) is looked at for merged keys.
    def walked(obj):
        raise AssertionError(f"walked for merged keys: {obj!r}")

    monkeypatch.setattr(codec, "_lost_key", walked)
    flat = [{"n": i, "kind": "resize", "path": "/a/b.jpg"} for i in range(3)]
    nested = {"a": {"b": [1, {"c": "{["}]}, "d": []}
    for value in (*flat, nested, "text", 5, [1, "x"]):
        codec.encode_stored(value)
    codec.encode_stored_many(flat)
    codec.encode_stored_many([nested, *flat])
