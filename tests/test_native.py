"""The C helper: CRC32C known answers, hardware/table agreement, atomics across processes, futex, owner locks."""

import mmap
import os
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ringq.engine._native import ffi, lib

from ringq import errors
from ringq.engine import native

# Known answers: RFC 3720 appendix B.4 and the common "check" value of CRC-32C.
VECTORS = [
    (b"", 0x00000000),
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


@pytest.mark.parametrize("data,expected", VECTORS)
@pytest.mark.parametrize("fn", ["ringq_crc32c", "ringq_crc32c_sw", "ringq_crc32c_hw"])
def test_crc32c_known_answers(fn, data, expected):
    assert getattr(lib, fn)(0, data, len(data)) == expected


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_crc32c_buffer_kinds(kind):
    from ringq.engine.mapped import crc32c

    assert crc32c(kind(b"123456789")) == 0xE3069283


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096), st.integers(0, 15), st.integers(0, 0xFFFFFFFF))
def test_crc32c_hw_and_table_agree(data, offset, seed):
    data = data[offset:] if offset <= len(data) else data
    assert lib.ringq_crc32c_hw(seed, data, len(data)) == lib.ringq_crc32c_sw(seed, data, len(data))


@given(st.binary(max_size=512), st.binary(max_size=512))
def test_crc32c_is_incremental(a, b):
    whole = lib.ringq_crc32c(0, a + b, len(a + b))
    assert lib.ringq_crc32c(lib.ringq_crc32c(0, a, len(a)), b, len(b)) == whole


def test_atomics_check_bounds_and_alignment():
    buf = ffi.new("uint8_t[]", 64)
    out = ffi.new("uint64_t *")
    assert lib.ringq_load64(buf, 64, 56, out) == 0
    assert lib.ringq_load64(buf, 64, 49, out) == lib.RINGQ_EALIGN
    assert lib.ringq_load64(buf, 64, 64, out) == lib.RINGQ_EBOUNDS
    assert lib.ringq_load64(buf, 64, 2**63, out) == lib.RINGQ_EBOUNDS
    assert lib.ringq_store32(buf, 64, 58, 1) == lib.RINGQ_EALIGN
    with pytest.raises(errors.CorruptionError):
        native.check(lib.ringq_load64(buf, 64, 64, out), "test")


def test_cas_semantics():
    buf = ffi.new("uint8_t[]", 16)
    actual = ffi.new("uint64_t *")
    assert lib.ringq_cas64(buf, 16, 8, 0, 5, actual) == 1 and actual[0] == 5
    assert lib.ringq_cas64(buf, 16, 8, 0, 7, actual) == 0 and actual[0] == 5
    prev = ffi.new("uint64_t *")
    assert lib.ringq_fetch_add64(buf, 16, 8, 3, prev) == 0 and prev[0] == 5


def test_fetch_add_and_cas_from_processes_lose_no_update(tmp_path):
    path = str(tmp_path / "word")
    with open(path, "wb") as fh:
        fh.write(bytes(4096))
    code = """
import mmap, os, sys
from ringq.engine._native import ffi, lib
fd = os.open(sys.argv[1], os.O_RDWR)
mm = mmap.mmap(fd, 4096)
p = ffi.from_buffer("uint8_t[]", mm)
prev = ffi.new("uint64_t *"); cur = ffi.new("uint64_t *")
for _ in range(20000):
    lib.ringq_fetch_add64(p, 4096, 0, 1, prev)
    while True:  # CAS increment of a second word
        lib.ringq_load64(p, 4096, 8, cur)
        if lib.ringq_cas64(p, 4096, 8, cur[0], cur[0] + 1, ffi.NULL) == 1:
            break
    lib.ringq_fetch_add32(p, 4096, 16, 1, ffi.NULL)
"""
    from procs import spawn

    procs = [spawn(code, path) for _ in range(4)]
    assert all(p.wait(120) == 0 for p in procs)
    with open(path, "rb") as fh:
        a, b, c = struct.unpack_from("<QQI", fh.read())
    assert (a, b, c) == (80000, 80000, 80000)


def test_futex_wait_times_out_and_is_woken_across_processes(tmp_path):
    path = str(tmp_path / "futex")
    with open(path, "wb") as fh:
        fh.write(bytes(4096))
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, 4096)
    p = ffi.from_buffer("uint8_t[]", mm)
    t = time.monotonic()
    assert lib.ringq_futex_wait(p, 4096, 0, 0, 50_000_000) == 1  # timed out
    assert time.monotonic() - t >= 0.04
    assert lib.ringq_futex_wait(p, 4096, 0, 1, 50_000_000) == 0  # value differs: returns at once
    waker = """
import mmap, os, sys, time
from ringq.engine._native import ffi, lib
fd = os.open(sys.argv[1], os.O_RDWR); mm = mmap.mmap(fd, 4096); p = ffi.from_buffer("uint8_t[]", mm)
time.sleep(0.3)
lib.ringq_fetch_add32(p, 4096, 0, 1, ffi.NULL)
lib.ringq_futex_wake(p, 4096, 0, 10)
"""
    from procs import spawn

    proc = spawn(waker, path)
    t = time.monotonic()
    rc = lib.ringq_futex_wait(p, 4096, 0, 0, 10_000_000_000)
    waited = time.monotonic() - t
    assert proc.wait(30) == 0
    assert rc == 0 and waited < 5
    ffi.release(p)
    mm.close()
    os.close(fd)


def test_msync_checks_bounds(tmp_path):
    buf = ffi.new("uint8_t[]", 64)
    assert lib.ringq_msync(buf, 64, 60, 8) == lib.RINGQ_EBOUNDS


def test_owner_locks_are_released_when_the_holder_dies(tmp_path):
    path = str(tmp_path / "owners")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    holder = """
import os, sys, time
from ringq.engine._native import lib
fd = os.open(sys.argv[1], os.O_RDWR)
assert lib.ringq_owner_trylock(fd, 7) == 1
print("held", flush=True)
time.sleep(60)
"""
    import signal
    import subprocess

    from procs import spawn

    proc = spawn(holder, path, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    assert lib.ringq_owner_probe(fd, 7) == 1
    assert lib.ringq_owner_trylock(fd, 7) == 0
    assert lib.ringq_owner_probe(fd, 8) == 0
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert lib.ringq_owner_probe(fd, 7) == 0
    assert lib.ringq_owner_trylock(fd, 7) == 1
    os.close(fd)


def test_rec_check_rejects_garbage_without_crashing():
    from ringq.engine.records import REC_INFO_DTYPE  # noqa: F401  (layout read from the C header)

    size = 4096 + 4096 + 8 * 256
    buf = ffi.new("uint8_t[]", os.urandom(size))
    g = ffi.new("ringq_geom *", {"seg_seq": 1, "state_off": 4096, "data_off": 8192, "slot_size": 256, "slot_count": 8})
    info = ffi.new("ringq_rec_info *")
    for slot in range(8):
        assert lib.ringq_rec_check(buf, size, g, slot, info) in (0, lib.RINGQ_ECORRUPT)
    assert lib.ringq_rec_check(buf, size, g, 8, info) == lib.RINGQ_EBOUNDS
    bad = ffi.new("ringq_geom *", {"seg_seq": 1, "state_off": 4096, "data_off": 8192, "slot_size": 256, "slot_count": 9})
    assert lib.ringq_rec_check(buf, size, bad, 0, info) == lib.RINGQ_EBOUNDS
    out = ffi.new("ringq_rec_info[]", 8)
    nxt = ffi.new("uint32_t *")
    n = lib.ringq_seg_scan(buf, size, g, 0, 8, out, 8, nxt)
    assert 1 <= n <= 8 and nxt[0] <= 8
