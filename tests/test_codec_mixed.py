"""Mixed payloads: dicts and lists holding arrays, numpy scalars and bytes round-trip exactly."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ringq import Queue, codec
from ringq.errors import SerializationError

# numpy's float64, str_ and bytes_ are subclasses of Python float, str and bytes and come back as
# those (docs: codec.encode); every other numpy scalar keeps its type.
_PYTHON_SUBCLASSES = (np.float64, np.str_, np.bytes_)


def expected(value):
    """What decode(encode(value)) must give."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, np.float64):
        return float(value)
    if isinstance(value, np.str_):
        return str(value)
    if isinstance(value, dict):
        return {k: expected(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [expected(v) for v in value]
    return value


def same(a, b) -> bool:
    """Exact equality: types, dtypes (byte order, fields), shapes and bytes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return (
            a.dtype == b.dtype
            and a.dtype.str == b.dtype.str
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.dtype.str == b.dtype.str and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


def round_trip(value):
    kind, data = codec.encode(value)
    return kind, codec.decode(kind, data), codec.decode(kind, bytearray(data))


DTYPES = st.one_of(
    hnp.scalar_dtypes(),
    hnp.byte_string_dtypes(),
    hnp.unicode_string_dtypes(),
    hnp.integer_dtypes(endianness="="),
    hnp.integer_dtypes(endianness=">"),
    hnp.floating_dtypes(endianness=">"),
    hnp.array_dtypes(allow_subarrays=True),  # structured, with subarray fields
)
ARRAYS = DTYPES.flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
)
SCALARS = (
    hnp.from_dtype(np.dtype("i1"))
    | hnp.from_dtype(np.dtype(">u8"))
    | hnp.from_dtype(np.dtype("f4"))
    | hnp.from_dtype(np.dtype("c16"))
    | hnp.from_dtype(np.dtype("?"))
    | hnp.from_dtype(np.dtype("M8[s]"))
    | hnp.from_dtype(np.dtype("f8"), allow_nan=False, allow_infinity=False)
)
JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
LEAVES = JSON_LEAVES | st.binary(max_size=40) | ARRAYS | SCALARS
KEYS = st.text(max_size=6) | st.sampled_from(["$a", "$b", "$s", "$d", "$", "$x"])
TREES = st.recursive(
    LEAVES,
    lambda kids: (
        st.lists(kids, max_size=4) | st.tuples(kids, kids) | st.dictionaries(KEYS, kids, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TREES)
def test_nested_payloads_round_trip_exactly(value):
    _kind, out, out2 = round_trip(value)
    want = expected(value)
    assert same(out, want), (value, out)
    assert same(out2, want)


def test_image_with_metadata():
    image = np.arange(2 * 3 * 4, dtype=">u2").reshape(2, 3, 4)
    payload = {
        "image": image,
        "meta": {
            "name": "cat.png",
            "size": [2, 3],
            "raw": b"\x00\xff",
            "gain": np.float32(1.5),
            "ok": np.bool_(True),
            "text": "\x00\xff",
        },
    }
    kind, out, _ = round_trip(payload)
    assert kind == codec.MIXED
    assert out["image"].dtype.str == ">u2" and out["image"].shape == (2, 3, 4)
    np.testing.assert_array_equal(out["image"], image)
    assert out["meta"]["raw"] == b"\x00\xff" and type(out["meta"]["raw"]) is bytes
    assert out["meta"]["text"] == "\x00\xff" and type(out["meta"]["text"]) is str
    assert type(out["meta"]["gain"]) is np.float32 and type(out["meta"]["ok"]) is np.bool_
    out["image"][0, 0, 0] = 7  # decoded arrays are writable


def test_structured_array_and_scalar_inside_a_list():
    dt = np.dtype([("x", "<f4"), ("name", "S5"), ("v", ">i2", (2,))])
    arr = np.array([(1.5, b"ab", [1, 2]), (2.5, b"cd", [3, 4])], dtype=dt)
    _kind, out, _ = round_trip([arr, arr[1], {"zero_d": np.array(5, dtype="<i8")}])
    assert out[0].dtype == dt and out[0].tobytes() == arr.tobytes()
    assert type(out[1]) is np.void and out[1].tobytes() == arr[1].tobytes()
    assert type(out[2]["zero_d"]) is np.ndarray and out[2]["zero_d"].shape == ()


def test_dicts_that_look_like_tags_stay_dicts():
    for d in ({"$a": [0, 1, "<i4", [1]]}, {"$b": [0, 0]}, {"$d": {"$b": 1}}, {"$zzz": 1}):
        _kind, out, _ = round_trip({"arr": np.zeros(1), "user": d})
        assert out["user"] == d


def test_plain_json_payloads_keep_the_json_codec():
    for value in ({"n": 1, "kind": "resize"}, [1, "a", None], "text", 3, np.float64(1.5)):
        assert codec.encode(value)[0] == codec.JSON
    assert codec.encode(b"ab")[0] == codec.BYTES
    assert codec.encode(np.zeros(3))[0] == codec.NDARRAY
    assert codec.encode({"b": b"ab"})[0] == codec.MIXED
    assert codec.encode(np.int64(3))[0] == codec.MIXED


@pytest.mark.parametrize(
    "payload, where",
    [
        ({"a": np.zeros(1), "s": {1, 2}}, "payload['s'] is of type set"),
        ({"s": [1, {2}]}, "payload['s'][1] is of type set"),
        ({"o": np.array([None, 1], dtype=object)}, "payload['o'] is a numpy array of dtype object"),
        ([b"x", object()], "payload[1] is of type object"),
        ({"a": np.zeros(1), (1, 2): 3}, "has a key of type tuple"),
        ({np.True_: 1}, "has a key of type numpy.bool"),  # not a "bool", which keys may be
        ({"a": np.zeros(1), "f": float("nan")}, "Out of range float"),
    ],
)
def test_what_cannot_be_encoded_is_a_serialization_error(payload, where):
    with pytest.raises(SerializationError, match=r".*" + __import__("re").escape(where)):
        codec.encode(payload)


def test_a_cycle_is_a_serialization_error():
    d: dict = {"a": np.zeros(1)}
    d["self"] = d
    with pytest.raises(SerializationError, match="circular"):
        codec.encode(d)


PADDED = {
    "aligned": np.dtype([("a", "u1"), ("b", "<f8")], align=True),
    "padded at the end": np.dtype(
        {"names": ["a", "b"], "formats": ["u1", "<f8"], "offsets": [0, 8], "itemsize": 24}
    ),
    "overlapping": np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i2"], "offsets": [0, 0]}),
    "titles and a subarray": np.dtype([(("title", "a"), "u1"), ("b", "<f8", (2,))]),
    "nested aligned": np.dtype(
        [
            ("a", "u1"),
            ("n", np.dtype([("x", "u1"), ("y", "<f4")], align=True)),
            ("s", np.dtype([("p", "u1"), ("q", ">i8")], align=True), (2,)),
        ],
        align=True,
    ),
}


@pytest.mark.parametrize("name", list(PADDED))
def test_structured_dtypes_with_padding_come_back_exactly(tmp_path, name):
    # An aligned struct came back with its padding as extra fields ("f1" of dtype V7), and a
    # dtype of overlapping fields was refused with a bare ValueError.
    dt = PADDED[name]
    arr = np.zeros(3, dt)
    arr.view(np.uint8)[:] = np.arange(arr.nbytes) % 251
    with Queue(tmp_path / "q") as q:
        q.enqueue(arr)
        q.enqueue({"rows": arr, "row": arr[1]})
        alone, mixed = q.lease_one().payload, q.lease_one().payload
    for back, want in ((alone, arr), (mixed["rows"], arr), (mixed["row"], arr[1])):
        assert back.dtype == dt and back.dtype.names == dt.names
        assert back.dtype.itemsize == dt.itemsize
        assert back.dtype.isalignedstruct == dt.isalignedstruct
        assert back.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "header",
    [
        b'{"dtype":{"names":["a"],"formats":["u1"],"offsets":[0]},"shape":[1]}',
        b'{"dtype":{"names":"a","formats":["u1"],"offsets":[0],"itemsize":1},"shape":[1]}',
        b'{"dtype":{"names":["a"],"formats":[{"base":"u1"}],"offsets":[0],"itemsize":1},"shape":[1]}',
        b'{"dtype":{"names":["a"],"formats":["u1"],"offsets":[0],"itemsize":99},"shape":[1]}',
    ],
)
def test_damaged_dtype_specs_are_serialization_errors(header):
    data = len(header).to_bytes(4, "little") + header + b"\0"
    with pytest.raises(SerializationError):
        codec.decode(codec.NDARRAY, data)


def _nested(depth, leaf, kind):
    for _ in range(depth):
        leaf = {"k": leaf} if kind == "dict" else [leaf]
    return leaf


def _decode_from_deep_in_the_stack(depth, cid, data):
    # A consumer decodes from far deeper in the stack than a producer encodes (a Worker's
    # thread, a framework's handler): each level here is one more frame under the decode.
    if depth:
        return _decode_from_deep_in_the_stack(depth - 1, cid, data)
    return codec.decode(cid, data)


LEAVES = {"str": "s", "bytes": b"b", "array": np.arange(3.0), "scalar": np.int8(3)}


@pytest.mark.parametrize("kind", ["dict", "list"])
@pytest.mark.parametrize("leaf", list(LEAVES))
def test_what_nests_deeper_than_a_consumer_decodes_is_refused_at_encode(kind, leaf):
    # Dicts about 500 to 985 deep around bytes or an array were accepted and never decoded:
    # every lease of the job failed, and the record was marked damaged.
    for depth in (codec.MAX_DEPTH + 1, 495, 985, 5000):
        with pytest.raises(SerializationError, match=f"more than {codec.MAX_DEPTH} deep"):
            codec.encode(_nested(depth, LEAVES[leaf], kind))
    value = _nested(codec.MAX_DEPTH, LEAVES[leaf], kind)
    cid, data = codec.encode(value)
    back = _decode_from_deep_in_the_stack(300, cid, data)
    while isinstance(back, (dict, list)):
        back, value = (back["k"], value["k"]) if kind == "dict" else (back[0], value[0])
    assert type(back) is type(value) and np.array_equal(back, value)


def test_the_depth_check_reads_brackets_in_strings_as_text():
    wide = {"s": "[" * 5000 + "{" * 5000, "list": [[1, "]]]}}"]] * 1000}
    cid, data = codec.encode(wide)
    assert codec.decode(cid, data) == wide


def test_a_batch_with_one_payload_nested_too_deep_stores_nothing(tmp_path):
    with Queue(tmp_path / "q") as q:
        with pytest.raises(SerializationError, match="deep"):
            q.enqueue_many([{"ok": 1}, _nested(600, b"x", "dict")])
        with pytest.raises(SerializationError, match="deep"):
            q.enqueue(_nested(985, np.zeros(2), "dict"))
        assert q.stats().total == 0 and q.lease_one() is None


@pytest.mark.parametrize(
    "data",
    [
        b"\x05\x00\x00\x00{}",  # tree longer than the record
        b'\x10\x00\x00\x00{"$a":[0,8,"<f8",[1]]}',  # (truncated tree)
        b'\x17\x00\x00\x00{"$a":[0,80,"<f8",[10]]}',  # block outside the record
        b'\x16\x00\x00\x00{"$a":[0,8,"|O",[1]]}\0\0\0\0\0\0\0\0',  # object dtype
        b'\x0e\x00\x00\x00{"$q":[0,0]}  ',  # unknown tag
        b'\x16\x00\x00\x00{"$a":[0,8,"<f8",[2]]}\0\0\0\0\0\0\0\0',  # length does not match the shape
    ],
)
def test_damaged_mixed_payloads_are_serialization_errors(data):
    with pytest.raises(SerializationError):
        codec.decode(codec.MIXED, data)


def test_mixed_payload_through_a_queue_and_another_process(tmp_path):
    import subprocess
    import sys

    from procs import child_env

    q = Queue(tmp_path)
    arr = np.linspace(0, 1, 7, dtype=">f4")
    q.enqueue(
        {"image": arr, "meta": {"id": 7, "blob": b"\x01\x02", "k": np.uint16(9)}}, job_id="m1"
    )
    code = (
        "import sys, numpy as np; from ringq import Queue\n"
        "j = Queue(sys.argv[1]).lease_one()\n"
        "p = j.payload\n"
        "assert p['image'].dtype.str == '>f4' and p['image'].shape == (7,), p\n"
        "assert p['meta'] == {'id': 7, 'blob': b'\\x01\\x02', 'k': np.uint16(9)} and type(p['meta']['k']) is np.uint16\n"
        "print('ok', j.id)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok m1"
    assert q.get("m1").to_dict()["payload"] == {
        "image": {"$ndarray": {"dtype": ">f4", "shape": [7]}},
        "meta": {"id": 7, "blob": {"$bytes": 2}, "k": {"$scalar": {"dtype": "<u2", "value": "9"}}},
    }


@pytest.mark.parametrize(
    "payload, where, cls",
    [
        (np.ma.array([1, 2, 3], mask=[0, 1, 0]), "payload is a", "numpy.ma.MaskedArray"),
        ({"m": np.ma.array([1.0, 2.0], mask=[1, 0])}, "payload['m'] is a", "MaskedArray"),
        (
            [b"x", {"k": [np.ma.masked_invalid([1.0, 2.0])]}],
            "payload[1]['k'][0] is a",
            "MaskedArray",
        ),
        ({"m": np.ma.masked}, "payload['m'] is a", "MaskedConstant"),
        (np.matrix([[1, 2], [3, 4]]), "payload is a", "numpy.matrix"),
        ({"x": np.matrix([[1, 2]]), "n": 1}, "payload['x'] is a", "numpy.matrix"),
        (np.rec.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]), "payload is a", "recarray"),
    ],
)
def test_an_ndarray_subclass_is_refused_not_stored_as_a_plain_array(tmp_path, payload, where, cls):
    with Queue(str(tmp_path / "q")) as q:
        with pytest.raises(SerializationError, match="array subclass") as info:
            q.enqueue(payload)
        assert where in str(info.value) and cls in str(info.value)
        with pytest.raises(SerializationError):
            q.enqueue_many([{"ok": 1}, payload])  # never half a batch
        assert q.stats().ready == 0
        # the plain data of the same array is stored, and the mask can travel beside it
        m = np.ma.array([1, 2, 3], mask=[0, 1, 0])
        q.enqueue({"data": m.data, "mask": np.ma.getmaskarray(m)})
        got = q.lease_one().payload
        back = np.ma.array(got["data"], mask=got["mask"])
        assert back.mask.tolist() == [False, True, False] and back.sum() == 4


def test_a_memmap_is_stored_as_its_values(tmp_path):
    mm = np.memmap(tmp_path / "m.bin", dtype="<i4", mode="w+", shape=(4,))
    mm[:] = [1, 2, 3, 4]
    with Queue(str(tmp_path / "q")) as q:
        q.enqueue(mm)
        q.enqueue({"m": mm[1:]})
        a, b = q.lease(2)
        assert type(a.payload) is np.ndarray and a.payload.tolist() == [1, 2, 3, 4]
        assert type(b.payload["m"]) is np.ndarray and b.payload["m"].tolist() == [2, 3, 4]


def test_a_job_whose_payload_does_not_decode_still_has_a_repr(tmp_path):
    """A payload nested deeper than the consumer's recursion limit allows does not decode: reading
    it raises SerializationError every time, and the job's repr (a log line) describes it."""
    with Queue(tmp_path) as q:
        q.enqueue({"deep": _nested(codec.MAX_DEPTH - 1, b"x", "list")})  # as deep as allowed
    frames, f = 0, sys._getframe()
    while f is not None:
        frames, f = frames + 1, f.f_back
    with Queue(tmp_path) as q:
        job = q.lease_one()
        assert job is not None
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(frames + 120)  # a consumer that allows less than the producer's
        try:
            for _ in range(2):
                with pytest.raises(SerializationError):
                    job.payload  # noqa: B018
            text = repr(job)
        finally:
            sys.setrecursionlimit(limit)
        assert text.startswith(f"Job(id={job.id!r}, payload=<undecodable: ") and "lease_token='1'" in text
        q.ack(job)


@pytest.mark.skipif(not hasattr(np.dtypes, "StringDType"), reason="numpy < 2 has no StringDType")
def test_a_stringdtype_array_is_refused_by_its_name_with_the_dtype_that_works():
    arr = np.array(["a", "bc"], dtype=np.dtypes.StringDType())
    with pytest.raises(SerializationError, match=r"dtype StringDType\(\).*'<U16'"):
        codec.encode({"names": arr})
    cid, data = codec.encode(arr.astype("<U2"))
    assert codec.decode(cid, data).tolist() == ["a", "bc"]


def test_a_field_dtype_with_metadata_is_stored_without_it_and_a_bytes_title_is_refused(tmp_path):
    # Both raised a bare ValueError or TypeError from numpy or json.
    meta = np.zeros(2, np.dtype([("a", np.dtype("<i4", metadata={"u": 1})), ("b", "u1")]))
    meta["a"] = [7, 8]
    for payload in (meta, {"x": meta}):
        cid, data = codec.encode(payload)
        back = codec.decode(cid, data)
        back = back if isinstance(back, np.ndarray) else back["x"]
        assert back.dtype.names == ("a", "b") and back["a"].tolist() == [7, 8]
    titled = np.zeros(2, np.dtype({"names": ["a"], "formats": ["u1"], "titles": [b"t"]}))
    for payload in (titled, {"x": titled}):
        with pytest.raises(SerializationError, match="title of type bytes"):
            codec.encode(payload)


def _fields_within_fields(levels: int) -> np.dtype:
    dt = np.dtype("<i4")
    for _ in range(levels):
        dt = np.dtype([("f", dt)])
    return dt


@pytest.mark.parametrize(
    "payload, match",
    [
        # a bytes title one level down (plain field, then a subarray field): bare TypeError from json
        (np.zeros(2, np.dtype([("a", np.dtype([((b"t", "n"), "<i4")]))])), "title of type bytes"),
        (
            {"x": np.zeros(2, np.dtype([("a", np.dtype([((b"t", "n"), "<i4")]), (2,))]))},
            "title of type bytes",
        ),
        # fields 500 levels within fields: bare RecursionError from json
        (np.zeros(1, _fields_within_fields(500)), "nest more than 32 deep"),
        ({"x": np.zeros(1, _fields_within_fields(33))}, "nest more than 32 deep"),
        # items 0 bytes wide: accepted, then undecodable in every consumer
        (np.zeros(3, "V0"), "0 bytes wide"),
        ({"x": np.zeros(3, np.dtype([]))}, "0 bytes wide"),
        ({"x": np.void(b"")}, "0 bytes wide"),
    ],
)
def test_a_dtype_the_header_cannot_give_back_is_refused_by_name(tmp_path, payload, match):
    q = Queue(str(tmp_path / "q"))
    with pytest.raises(SerializationError, match=match):
        q.enqueue(payload)
    assert q.stats().ready == 0  # nothing half-stored


def test_the_deepest_dtype_within_the_deepest_payload_decodes():
    arr = np.arange(2, dtype="<i4").view(_fields_within_fields(codec.MAX_FIELD_DEPTH))
    payload: object = arr
    for _ in range(codec.MAX_DEPTH - 1):
        payload = [payload]
    back = codec.decode(*codec.encode(payload))
    for _ in range(codec.MAX_DEPTH - 1):
        back = back[0]
    assert back.dtype == arr.dtype and back.tobytes() == arr.tobytes()
