"""Hostile and malformed input: payloads, and files that are not what their names say.

Invariant: whatever a caller passes and whatever lies in the queue directory, ringq answers with a
typed error (a RingqError subclass, or ValueError for a bad argument) or with a repair that it
reports -- never a crash, a hang, a silently lost job, or a file it was not asked to touch.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from crashkit import (
    NAME,
    SLOT,
    SLOTS,
    drain,
    geometry,
    open_queue,
    restore,
    seg_file,
    snapshot,
    verify,
)

import ringq
from ringq import codec
from ringq.engine.control import OFF_TAIL_SEG
from ringq.engine.segment import OFF_RETIRED, OFF_TAIL
from ringq.errors import (
    CorruptionError,
    FormatVersionError,
    RecordTooLargeError,
    SerializationError,
)

# -- payloads -------------------------------------------------------------------------------------------


def _deep(n):
    v: list = []
    for _ in range(n):
        v = [v]
    return v


BAD_PAYLOADS = {
    "object": object(),
    "set": {1, 2},
    "function": len,
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf-nested": {"a": [1, float("-inf")]},
    "tuple-key": {(1, 2): 3},
    "deep-nesting": _deep(100_000),
    "lone-surrogate": "abc\ud800def",
    "surrogate-key": {"\udfff": 1},
    "huge-int": 10**5000,
    "object-array": np.array([object()], dtype=object),
}


@pytest.mark.parametrize("name", sorted(BAD_PAYLOADS))
def test_unencodable_payload_is_refused_and_nothing_written(tmp_path, name):
    with open_queue(str(tmp_path)) as q:
        q.enqueue("ok")
        with pytest.raises(SerializationError):
            q.enqueue_many(["fine", BAD_PAYLOADS[name]])  # the good one is not written either
        assert q.stats().total == 1
        assert drain(q) == ["ok"]


def test_bad_job_ids(tmp_path):
    with open_queue(str(tmp_path)) as q:
        with pytest.raises(SerializationError):
            q.enqueue(1, job_id="id\ud800")
        for bad in ("", 5, b"bytes-id"):
            with pytest.raises(ValueError):
                q.enqueue(1, job_id=bad)
        with pytest.raises(RecordTooLargeError):
            q.enqueue(1, job_id="i" * 70_000)
        assert q.stats().total == 0


@pytest.mark.parametrize(
    "kw",
    [
        dict(delay=float("nan")),
        dict(delay=float("inf")),
        dict(delay=float("-inf")),
        dict(priority=2**31),
        dict(priority=1.5),
        dict(max_attempts=0),
    ],
)
def test_bad_enqueue_arguments(tmp_path, kw):
    with open_queue(str(tmp_path)) as q:
        with pytest.raises(ValueError):
            q.enqueue(1, **kw)


@pytest.mark.parametrize("vt", [float("nan"), float("inf"), 0, -1, 1e300])
def test_bad_visibility_timeouts(tmp_path, vt):
    with open_queue(str(tmp_path)) as q:
        q.enqueue(1)
        with pytest.raises(ValueError):
            q.lease(1, visibility_timeout=vt)
        job = q.lease_one()
        with pytest.raises(ValueError):
            q.extend(job, vt)
        q.ack(job)


def test_payloads_that_round_trip_exactly(tmp_path):
    values = [
        b"\xff\xfe\x00not utf-8",
        "\u2603 snow \U0001f600",
        {"n": None, "f": 1.5, "big": 2**80},
        _deep(200),
        "",
        [],
        {},
        0,
        -1,
        True,
        None,
    ]
    arrays = [
        np.arange(6, dtype=">i4").reshape(2, 3),
        np.zeros((0, 3)),
        np.array(3.5),
        np.array([1 + 2j]),
    ]
    with open_queue(str(tmp_path), slot_size=256, slot_count=64) as q:
        q.enqueue_many(values + arrays)
        got = drain(q)
    assert got[: len(values)] == values
    for a, b in zip(arrays, got[len(values) :]):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _limit_payload(total):
    """A bytes payload whose record (64-byte header + payload) is ``total`` bytes."""
    return b"p" * (total - 64)


@pytest.mark.parametrize("total,span", [(SLOT, 1), (SLOT + 1, 2), (SLOT * SLOTS, SLOTS)])
def test_records_at_the_slot_and_segment_limits(tmp_path, total, span):
    with open_queue(str(tmp_path)) as q:
        q.enqueue(b"x")  # the big one must rotate to a fresh segment when it needs all of one
        job = q.enqueue(_limit_payload(total))
        assert drain(q) == [b"x", _limit_payload(total)]
        assert job.payload == _limit_payload(total)
    info = struct.unpack_from(
        "<II",
        snapshot(str(tmp_path))[seg_file(job.record_position[0])],
        geometry()[1] + job.record_position[1] * SLOT + 8,
    )
    assert info == (total, span)


def test_one_byte_over_the_segment_limit(tmp_path):
    with open_queue(str(tmp_path)) as q:
        with pytest.raises(RecordTooLargeError, match=str(SLOT * SLOTS)):
            q.enqueue(_limit_payload(SLOT * SLOTS + 1))
        with pytest.raises(RecordTooLargeError):
            q.enqueue("s" * (1 << 20))
        assert q.stats().total == 0
        q.enqueue(1)
        assert drain(q) == [1]


FORGED_NDARRAY = [
    b"",
    b"\x05\x00\x00\x00{}",  # header longer than the record
    struct.pack("<I", 2) + b"{}",  # no dtype
    struct.pack("<I", 27) + b'{"dtype":"|O","shape":[1]}' + b"\0" * 8,  # object dtype: never
    struct.pack("<I", 30) + b'{"dtype":"<i4","shape":[1000]}' + b"\0" * 4,  # shape larger than data
    struct.pack("<I", 30) + b'{"dtype":"<i4","shape":[-2,-2]}' + b"\0" * 16,
    struct.pack("<I", 37) + b'{"dtype":"<U99999999999","shape":[1]}',
    struct.pack("<I", 28) + b'{"dtype":"<i4","shape":"xy"}',
]


@pytest.mark.parametrize("data", FORGED_NDARRAY)
def test_decoded_sizes_are_bounded_by_the_record(data):
    with pytest.raises(SerializationError):
        codec.decode(codec.NDARRAY, data)


@pytest.mark.parametrize("data", [b"[" * 100_000, b"1" * 5000, b"\xff", b"nul\x00", b'{"a":'])
def test_hostile_json_bytes_decode_to_a_typed_error(data):
    with pytest.raises(SerializationError):
        codec.decode(codec.JSON, data)
    with pytest.raises(SerializationError):
        codec.decode(99, b"")


def test_payloads_are_never_unpickled(tmp_path):
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned > /dev/null",))

    raw = pickle.dumps(Boom())
    with open_queue(str(tmp_path)) as q:
        q.enqueue(raw)  # bytes stay bytes
        assert drain(q) == [raw]
        with pytest.raises(SerializationError):
            q.enqueue(Boom())
    src = open(os.path.join(os.path.dirname(ringq.__file__), "codec.py")).read()
    assert "pickle" not in src.replace("no pickle", "").replace("never through pickle", "")


# -- files ------------------------------------------------------------------------------------------------


def _queue_with_two_segments(tmp_path):
    """Segment 1 full (jobs 0-7), segment 2 the tail (jobs 8-9)."""
    path = str(tmp_path / "q")
    with open_queue(path) as q:
        q.enqueue_many(list(range(10)))
    return path


def _seg(path, seq):
    return os.path.join(path, seg_file(seq))


def _write(path, data, mode="wb"):
    with open(path, mode) as fh:
        fh.write(data)


REPLACEMENTS = {
    "zero-length": b"",
    "all-zero": bytes(geometry()[2]),
    "foreign-text": b"hello, I am not a segment\n" * 400,
    "one-byte": b"R",
}


@pytest.mark.parametrize("kind", sorted(REPLACEMENTS))
def test_unusable_segment_is_quarantined_and_reported(tmp_path, kind):
    path = _queue_with_two_segments(tmp_path)
    _write(_seg(path, 1), REPLACEMENTS[kind])
    with open_queue(path) as q:
        assert drain(q) == [8, 9]
        [(where, why)] = q.recovery.quarantined
        assert where.endswith(".quarantined") and seg_file(1) in where and why
        assert not q.recovery.clean
        assert any(seg_file(1) in d for d in verify(q).damaged)
        q.enqueue("new")
        assert drain(q) == ["new"]
    assert (
        open(_seg(path, 1) + ".quarantined", "rb").read() == REPLACEMENTS[kind]
    )  # kept as evidence


def _patch_header(path, seq, off, fmt, value, fix_crc=True):
    """Patch the static header of segment ``seq``'s record file, or (``off`` >= 128, the mutable
    words) its state file's header."""
    from ringq.engine.mapped import crc32c

    target = _seg(path, seq) if off < 128 else _seg(path, seq)[: -len(".seg")] + ".state"
    data = bytearray(open(target, "rb").read())
    struct.pack_into(fmt, data, off, value)
    if fix_crc:
        struct.pack_into("<I", data, 64, crc32c(bytes(data[:64])))
    _write(target, bytes(data))


@pytest.mark.parametrize(
    "field,off,fmt,value",
    [
        ("magic", 0, "<Q", 0x1234),
        ("header-crc", 64, "<I", 0),
        ("seq-vs-name", 16, "<Q", 7),
        ("slot-size", 24, "<I", 100),
        ("slot-count", 28, "<I", 0),
        ("file-size", 56, "<Q", 1 << 40),
        ("data-offset", 48, "<Q", 12),
    ],
)
def test_bad_segment_header_fields_are_quarantined(tmp_path, field, off, fmt, value):
    path = _queue_with_two_segments(tmp_path)
    _patch_header(path, 1, off, fmt, value, fix_crc=field != "header-crc")
    with open_queue(path) as q:
        # The header is unusable, the records are not (each has its own CRC): they are salvaged
        # to the tail before the file is set aside.
        assert drain(q) == [8, 9, *range(8)]
        assert len(q.recovery.quarantined) == 1
        assert any("8 intact jobs salvaged" in what for _p, what in q.recovery.repairs)


def test_future_format_version_is_refused(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    _patch_header(path, 1, 8, "<I", 3)
    with pytest.raises(FormatVersionError, match="version 3"):
        open_queue(path)
    assert os.path.exists(_seg(path, 1))  # refused, not quarantined: a newer ringq can read it


def test_truncated_segment_is_refused_before_mapping(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    os.truncate(_seg(path, 1), geometry()[1] + 2 * SLOT)  # the record file, records 2.. cut off
    with open_queue(path) as q:
        [(where, why)] = q.recovery.quarantined
        assert "truncated" in why and "declares" in why
        assert drain(q) == [8, 9]


def test_truncated_tail_segment_gets_a_new_tail(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    os.truncate(_seg(path, 2), 100)
    with open_queue(path) as q:
        assert drain(q) == list(range(8))
        q.enqueue("new")
        assert drain(q) == ["new"]
        assert q.introspect()["tail_segment"] == 3  # never the seq of the segment that vanished
    with open_queue(path) as q:
        q.enqueue("again")
        assert drain(q) == ["again"]


def test_missing_segment_in_the_middle(tmp_path):
    path = str(tmp_path / "q")
    with open_queue(path) as q:
        q.enqueue_many(list(range(20)))  # segments 1, 2, 3
    os.unlink(_seg(path, 2))
    with open_queue(path) as q:
        assert drain(q) == list(range(8)) + list(range(16, 20))
        q.enqueue("new")
        assert drain(q) == ["new"]


def test_symlink_in_place_of_a_segment_is_not_followed(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    victim = str(tmp_path / "victim")
    _write(victim, open(_seg(path, 1), "rb").read())  # even a valid segment behind a link
    before = open(victim, "rb").read()
    os.unlink(_seg(path, 1))
    os.symlink(victim, _seg(path, 1))
    with open_queue(path) as q:
        assert drain(q) == [8, 9]
        [(where, why)] = q.recovery.quarantined
        assert "symbolic link" in why
    assert open(victim, "rb").read() == before


@pytest.mark.parametrize("which", ["ctl", "lock", "owners"])
def test_symlinked_queue_files_are_refused(tmp_path, which):
    path = _queue_with_two_segments(tmp_path)
    victim = str(tmp_path / "victim")
    target = os.path.join(path, f"{NAME}.{which}")
    if os.path.exists(target):
        os.rename(target, victim)
    else:
        _write(victim, b"")
    os.symlink(victim, target)
    with pytest.raises(CorruptionError, match="symbolic link"):
        with open_queue(path) as q:
            q.lease_one()  # the owners file is opened at the first lease


def test_symlinked_error_side_file_is_not_followed(tmp_path):
    path = str(tmp_path / "q")
    victim = str(tmp_path / "victim")
    _write(victim, b"precious")
    with open_queue(path) as q:
        q.enqueue(1)
        os.symlink(victim, os.path.join(path, f"{NAME}.{1:016x}.err"))
        job = q.lease_one()
        back = q.nack(job, error="boom", delay=0)  # the note is lost, the nack is not
        assert back.state.value == "ready" and back.last_error is None
    assert open(victim, "rb").read() == b"precious"


@pytest.mark.parametrize("what", ["dir", "fifo"])
def test_non_regular_file_named_like_a_segment(tmp_path, what):
    path = _queue_with_two_segments(tmp_path)
    os.unlink(_seg(path, 1))
    if what == "dir":
        os.mkdir(_seg(path, 1))
    else:
        os.mkfifo(_seg(path, 1))
    with open_queue(path) as q:  # must not hang on the FIFO
        assert drain(q) == [8, 9]
        assert "not a regular file" in q.recovery.quarantined[0][1]


def test_garbage_in_the_lock_file_is_harmless(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    _write(os.path.join(path, f"{NAME}.lock"), os.urandom(10_000))
    with open_queue(path) as q:
        assert drain(q) == list(range(10))
        assert q.recovery.clean


@pytest.mark.parametrize(
    "data", [b"garbage" * 1000, b"short", bytes(4096)], ids=["garbage", "short", "zeros"]
)
def test_damaged_control_file_is_refused(tmp_path, data):
    path = _queue_with_two_segments(tmp_path)
    _write(os.path.join(path, f"{NAME}.ctl"), data)
    with pytest.raises(CorruptionError, match="control file"):
        open_queue(path)


def test_empty_control_file_is_rebuilt_from_the_segments(tmp_path):
    path = str(tmp_path / "q")
    with open_queue(path, slot_size=192, slot_count=4) as q:
        q.enqueue_many(list(range(6)))
    _write(os.path.join(path, f"{NAME}.ctl"), b"")
    with open_queue(path) as q:  # default geometry asked for: the segments' one wins
        assert (q.options.slot_size, q.options.slot_count) == (192, 4)
        new = q.enqueue("new")
        assert new.seq == 7
        assert drain(q) == list(range(6)) + ["new"]
        assert q.recovery.repairs


def test_retired_flag_on_unfinished_segment_is_cleared_not_obeyed(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    _patch_header(path, 1, OFF_RETIRED, "<I", 1, fix_crc=False)
    with open_queue(path) as q:
        assert drain(q) == list(range(10))
        assert any("retired flag" in why for _p, why in q.recovery.repairs)


def test_impossible_tail_word_is_rebuilt(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    for seq in (1, 2):
        _patch_header(path, seq, OFF_TAIL, "<I", 0xFFFFFFF0, fix_crc=False)
    with open_queue(path) as q:
        assert drain(q) == list(range(10))
        assert len(q.recovery.repairs) == 2


def test_absurd_tail_segment_in_control_file(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    with open_queue(path) as q:
        fd = os.open(os.path.join(path, f"{NAME}.ctl"), os.O_WRONLY)
        os.pwrite(
            fd, struct.pack("<Q", 1 << 60), OFF_TAIL_SEG
        )  # the mapping sees it at the next refresh
        os.close(fd)
        assert q.stats().ready == 10  # does not try 2**60 file names
    with open_queue(path) as q:
        assert drain(q) == list(range(10))
        q.enqueue("new")
        assert drain(q) == ["new"]
        assert (
            q.introspect()["tail_segment"] == 2
        )  # the damaged word is ignored, the real tail kept
        assert any("impossible" in why for _p, why in q.recovery.repairs)


def test_stray_files_are_left_alone(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    strays = {
        "other.0000000000000001.seg": b"other queue",
        "q.0000000000000001.seg.bak": b"x",
        "q.1.seg": b"y",
        "README": b"z",
    }
    for name, data in strays.items():
        _write(os.path.join(path, name), data)
    with open_queue(path) as q:
        assert drain(q) == list(range(10))
        assert q.recovery.clean
    for name, data in strays.items():
        assert open(os.path.join(path, name), "rb").read() == data


def test_leftover_temp_segment_is_removed(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    _write(_seg(path, 3) + ".tmp", b"half a segment")
    with open_queue(path) as q:
        assert q.recovery.removed_temp == [_seg(path, 3) + ".tmp"]
        assert drain(q) == list(range(10))


UNPRIVILEGED = textwrap.dedent("""
    import os, sys
    import ringq  # before dropping privileges: the interpreter's own files may be root-only
    from ringq import Queue  # (the engine loads on first use of the name)
    os.setgid(65534); os.setuid(65534)
    try:
        Queue(sys.argv[1], "q")
    except PermissionError as exc:
        print("PermissionError", exc)
    except ringq.RingqError as exc:
        print("RingqError", type(exc).__name__, exc)
    else:
        print("opened")
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
@pytest.mark.parametrize("setup", ["readonly-dir", "foreign-files"])
def test_directory_without_write_permission(setup):
    import shutil
    import tempfile

    top = tempfile.mkdtemp(
        prefix="ringq-perm-"
    )  # pytest's tmp_path is inside a root-only directory
    os.chmod(top, 0o755)
    try:
        _run_unprivileged(top, setup)
    finally:
        shutil.rmtree(top)


def _run_unprivileged(top, setup):
    from pathlib import Path

    tmp_path = Path(top)
    path = str(tmp_path / "q")
    if setup == "readonly-dir":
        os.makedirs(path, mode=0o755)  # owned by root, not writable by nobody
    else:
        _queue_with_two_segments(tmp_path)
        os.chmod(path, 0o777)  # writable, but the files are root's 0600
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED, path],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=top,  # not the checkout: "python -c" puts the cwd first, and its ringq may be unbuilt
    )
    assert out.returncode == 0, out.stderr
    # a directory it may read but not write is read-only to it; files it may not open are not
    expected = "RingqError ReadOnlyQueueError" if setup == "readonly-dir" else "PermissionError"
    assert out.stdout.startswith(expected) and path in out.stdout, out.stdout


def test_restore_helper_roundtrip(tmp_path):
    path = _queue_with_two_segments(tmp_path)
    copy = restore(snapshot(path), str(tmp_path / "copy"))
    with open_queue(copy) as q:
        assert drain(q) == list(range(10))


def test_segment_retired_between_listing_and_opening(tmp_path, monkeypatch):
    """Retirement takes no lock, so a segment listed by a recovering process can be unlinked
    before it is opened: the open must go on without it."""
    path = _queue_with_two_segments(tmp_path)
    real = os.scandir

    def scandir_then_retire(p):
        entries = list(real(p))
        if os.path.exists(_seg(path, 1)):
            os.unlink(_seg(path, 1))  # as a concurrent retirer would, right after the listing
        return iter(entries)

    monkeypatch.setattr(os, "scandir", scandir_then_retire)
    with open_queue(path) as q:
        monkeypatch.undo()
        assert drain(q) == [8, 9]
        assert q.recovery.clean


def test_records_with_a_valid_crc_that_no_enqueue_writes_are_damage(tmp_path, monkeypatch):
    # A writer that does not hold to the key rule (a NUL in the key), or whose payload bytes do
    # not decode as their codec byte says: the CRC covers the bytes, so only a decode tells.
    # verify reports each; a reader never hands out a job whose key cannot be read (it marks
    # it BAD), and a job whose payload cannot be decoded raises SerializationError on access.
    def loose(key, kind, data):
        raw = key.encode()
        if key == "garbled":
            kind, data = codec.JSON, b"\xff{not json"
        return codec.KEYED, struct.pack("<H", len(raw)) + raw + bytes((kind,)) + data

    q = open_queue(str(tmp_path / "q"))
    with monkeypatch.context() as m:
        m.setattr(codec, "wrap_key", loose)
        q.enqueue("nul", key="a\x00b")
        q.enqueue_many(["m1", "m2"], key="a\x00c")
        q.enqueue("g", key="garbled")
    q.enqueue("fine", key="fine")
    damage = verify(q).damaged
    assert len(damage) == 4 and all("payload does not decode" in d for d in damage), damage
    assert sum("holds a NUL" in d for d in damage) == 3
    q.close()

    fresh = open_queue(str(tmp_path / "q"))
    stats = fresh.stats()  # read in, not leased: quarantined as they are read
    assert (stats.corrupt, stats.ready) == (3, 2), stats
    assert sorted(r[1] for r in fresh.recovery.corrupt_records) == [0, 1, 2]
    jobs = {job.key: job for job in fresh.lease(10)}
    assert sorted(jobs) == ["fine", "garbled"]
    assert jobs["fine"].payload == "fine"
    with pytest.raises(SerializationError):
        _ = jobs["garbled"].payload
    assert fresh.stats().corrupt == 3
    with monkeypatch.context() as m:  # one more, read in by a reader that is open already
        m.setattr(codec, "wrap_key", loose)
        q2 = open_queue(str(tmp_path / "q"))
        q2.enqueue("late", key="b\x00")
        q2.close()
    assert fresh.stats().corrupt == 4 and fresh.lease(10) == []
    fresh.close()


def test_a_stored_job_id_that_is_not_utf8_is_damage_to_verify(tmp_path, monkeypatch):
    from ringq.local import producer

    q = open_queue(str(tmp_path / "q"))
    with monkeypatch.context() as m:  # a writer that does not hold to the id rule
        m.setattr(producer, "encode_ids", lambda ids: [b"\xff\xfeid" for _ in ids])
        q.enqueue_many(["x"], job_ids=["any"])
    assert verify(q).damaged[-1].endswith("job id is not valid UTF-8"), verify(q).damaged
    q.close()
