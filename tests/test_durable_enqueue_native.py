"""The durable end of a one-call enqueue: ``ringq_append_writeback`` and ``ringq_append_sync``.

Invariants: ``ringq_append_sync`` syncs the slots it is given (fdatasync of the descriptor, or
msync of their range of the mapping), then counts one sync and wakes consumers only if asked and
only if the sync succeeded; it refuses bad ranges and words outside the mappings with the C
helper's codes and touches nothing then.  ``ringq_append_writeback`` is a hint that refuses bad
ranges and never changes a byte.  A durable enqueue through them counts one sync per call and
wakes a consumer asleep in ``lease_one``.  Both entry points run under ASan + UBSan with random
arguments (the sanitizer build of tests/test_native_sanitized.py).
"""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import threading
import time

import pytest
from ringq.engine._native import ffi, lib
from test_native_sanitized import ROOT, _build, _runtime_works

from ringq import Queue

SLOT, SLOTS = 128, 64
STATE_OFF, DATA_OFF = 256, 4096  # state table after a header, slot 0 on the second page
MAPLEN = DATA_OFF + SLOT * SLOTS
CTL_LEN = 4096
SYNC_COUNT, WAKE, WAITERS = 1024, 1032, 1036  # words of the scratch control page


@pytest.fixture
def seg(tmp_path):
    """A file mapped shared (the segment pair's layout in one file) and a scratch control page."""
    path = tmp_path / "seg"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, bytes(MAPLEN), 0)
    mm = mmap.mmap(fd, MAPLEN, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    ctl = bytearray(CTL_LEN)
    geom = ffi.new(
        "ringq_geom *",
        {
            "seg_seq": 1,
            "state_off": STATE_OFF,
            "data_off": DATA_OFF,
            "slot_size": SLOT,
            "slot_count": SLOTS,
        },
    )
    base = ffi.from_buffer("uint8_t[]", mm)
    cbuf = ffi.from_buffer("uint8_t[]", ctl)
    words = {
        "plain": ffi.new("ringq_ctl_words *", {}),
        "wake": ffi.new("ringq_ctl_words *", {"wake": WAKE, "waiters": WAITERS}),
    }
    try:
        yield fd, base, geom, ctl, cbuf, words
    finally:
        ffi.release(base)
        mm.close()
        os.close(fd)


def word(buf: bytearray, off: int, size: int) -> int:
    return int.from_bytes(buf[off : off + size], "little")


@pytest.mark.parametrize("use_fd", [False, True])
def test_sync_counts_once_and_wakes_only_when_asked(seg, use_fd):
    fd, base, geom, ctl, cbuf, words = seg
    sync_fd = fd if use_fd else -1
    os.pwrite(fd, b"r" * SLOT, DATA_OFF + 3 * SLOT)
    rc = lib.ringq_append_sync(
        base, MAPLEN, geom, sync_fd, 3, 4, cbuf, CTL_LEN, SYNC_COUNT, words["plain"]
    )
    assert rc == 0
    assert (word(ctl, SYNC_COUNT, 8), word(ctl, WAKE, 4)) == (1, 0)
    rc = lib.ringq_append_sync(
        base, MAPLEN, geom, sync_fd, 3, 4, cbuf, CTL_LEN, SYNC_COUNT, words["wake"]
    )
    assert rc == 0
    assert (word(ctl, SYNC_COUNT, 8), word(ctl, WAKE, 4)) == (2, 1)
    # An empty range syncs nothing and still counts: the sync the append asked for happened.
    rc = lib.ringq_append_sync(
        base, MAPLEN, geom, sync_fd, 5, 5, cbuf, CTL_LEN, SYNC_COUNT, words["wake"]
    )
    assert rc == 0
    assert (word(ctl, SYNC_COUNT, 8), word(ctl, WAKE, 4)) == (3, 2)
    # A sync alone (no control page): nothing counted.
    assert (
        lib.ringq_append_sync(base, MAPLEN, geom, sync_fd, 0, SLOTS, ffi.NULL, 0, 0, ffi.NULL) == 0
    )
    assert word(ctl, SYNC_COUNT, 8) == 3


@pytest.mark.parametrize(
    "lo,hi,ctl_len,count_off,wake,expected",
    [
        (4, 3, CTL_LEN, SYNC_COUNT, False, "RINGQ_EINVAL"),  # lo > hi
        (0, SLOTS + 1, CTL_LEN, SYNC_COUNT, False, "RINGQ_EINVAL"),  # past the last slot
        (0, 1, CTL_LEN, CTL_LEN - 4, False, "RINGQ_EBOUNDS"),  # the count word outside the page
        (0, 1, CTL_LEN, SYNC_COUNT + 4, False, "RINGQ_EALIGN"),  # a misaligned count word
        (0, 1, WAKE + 2, SYNC_COUNT, True, "RINGQ_EBOUNDS"),  # the wake word outside the page
    ],
)
def test_sync_refuses_bad_arguments_and_changes_nothing(
    seg, lo, hi, ctl_len, count_off, wake, expected
):
    fd, base, geom, ctl, cbuf, words = seg
    w = words["wake" if wake else "plain"]
    rc = lib.ringq_append_sync(base, MAPLEN, geom, -1, lo, hi, cbuf, ctl_len, count_off, w)
    assert rc == getattr(lib, expected)
    assert ctl == bytes(CTL_LEN)


def test_sync_refuses_a_control_page_without_its_words_and_a_bad_geometry(seg):
    fd, base, geom, ctl, cbuf, words = seg
    assert (
        lib.ringq_append_sync(base, MAPLEN, geom, -1, 0, 1, cbuf, CTL_LEN, SYNC_COUNT, ffi.NULL)
        == lib.RINGQ_EINVAL
    )
    small = MAPLEN - SLOT  # the table no longer fits the mapping
    assert (
        lib.ringq_append_sync(
            base, small, geom, -1, 0, 1, cbuf, CTL_LEN, SYNC_COUNT, words["plain"]
        )
        == lib.RINGQ_EBOUNDS
    )
    assert ctl == bytes(CTL_LEN)


def test_a_failed_sync_counts_nothing_and_wakes_nobody(seg, tmp_path):
    fd, base, geom, ctl, cbuf, words = seg
    d = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    os.close(d)  # a descriptor number that is closed now
    rc = lib.ringq_append_sync(
        base, MAPLEN, geom, d, 0, 1, cbuf, CTL_LEN, SYNC_COUNT, words["wake"]
    )
    assert rc == -9  # -EBADF
    assert ctl == bytes(CTL_LEN)


def test_writeback_is_a_hint_that_refuses_bad_ranges_and_changes_nothing(seg):
    fd, base, geom, ctl, cbuf, words = seg
    os.pwrite(fd, b"w" * SLOT, DATA_OFF)
    before = os.pread(fd, MAPLEN, 0)
    assert lib.ringq_append_writeback(fd, DATA_OFF, geom, 0, 1) == 0
    assert lib.ringq_append_writeback(fd, DATA_OFF, geom, 2, 2) == 0
    assert lib.ringq_append_writeback(-1, DATA_OFF, geom, 0, 1) == lib.RINGQ_EINVAL
    assert lib.ringq_append_writeback(fd, DATA_OFF, geom, 2, 1) == lib.RINGQ_EINVAL
    assert lib.ringq_append_writeback(fd, DATA_OFF, geom, 0, SLOTS + 1) == lib.RINGQ_EINVAL
    assert lib.ringq_append_writeback(fd, 2**63, geom, 0, 1) == lib.RINGQ_EINVAL
    assert os.pread(fd, MAPLEN, 0) == before


@pytest.mark.parametrize("durability", ["msync", "fdatasync"])
def test_durable_enqueue_counts_one_sync_per_call_and_wakes_a_sleeping_consumer(
    tmp_path, durability
):
    with Queue(tmp_path, durability=durability) as q:
        for i in range(5):
            q.enqueue(i)
        assert q.sync_counters()["queue_append_syncs"] == 5
        assert [q.lease_one().payload for _ in range(5)] == [0, 1, 2, 3, 4]
        got: list = []

        def consumer() -> None:
            got.append(q.lease_one(wait=30))

        t = threading.Thread(target=consumer)
        t.start()
        time.sleep(0.2)  # asleep on the futex by now (it re-checks every quarter second anyway)
        start = time.monotonic()
        q.enqueue("wake")
        t.join(30)
        assert got and got[0].payload == "wake"
        assert time.monotonic() - start < 5


SELFTEST = r"""
#include "ringq.h"
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t s = 88172645463325252ull;
static uint64_t rnd(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000;
    char path[] = "/tmp/ringq-durable-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 2;
    unlink(path);
    size_t len = 8 * 4096;
    if (ftruncate(fd, (off_t)len)) return 2;
    uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 2;
    uint8_t *ctl = malloc(4096);
    long ok = 0;
    for (long i = 0; i < n; i++) {
        ringq_geom g = {rnd(), (rnd() % 64) * 8, (rnd() % 4096) * 8, (uint32_t)(64 * (1 + rnd() % 8)),
                        (uint32_t)(rnd() % 300)};
        size_t maplen = rnd() % (len + 1);
        size_t ctl_len = rnd() % 4097;
        memset(ctl, 0, 4096);
        ringq_ctl_words w = {0};
        if (rnd() & 1) { w.wake = rnd() % 4100; w.waiters = rnd() % 4100; }
        uint32_t lo = (uint32_t)(rnd() % 310), hi = (uint32_t)(rnd() % 310);
        int use_ctl = (int)(rnd() % 3);
        int rc = ringq_append_sync(m, maplen, &g, (rnd() & 1) ? fd : -1, lo, hi, use_ctl ? ctl : NULL, ctl_len,
                                   rnd() % 4100, use_ctl == 2 ? NULL : &w);
        if (rc > 0) { printf("bad rc %d\n", rc); return 1; }
        rc = ringq_append_writeback((rnd() & 7) ? fd : -1, rnd() % 8192, &g, lo, hi);
        if (rc > 0) { printf("bad rc %d\n", rc); return 1; }
        ok += rc == 0;
    }
    printf("%ld calls, %ld writebacks started\n", n, ok);
    return ok ? 0 : 1;
}
"""


def test_sync_and_writeback_under_sanitizers(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    flags = next(
        (
            f
            for f in (["-fsanitize=address,undefined"], ["-fsanitize=undefined"])
            if _runtime_works(tmp_path, f)
        ),
        None,
    )
    if flags is None:
        pytest.skip("no sanitizer runtime usable with this gcc")
    src = tmp_path / "durable_selftest.c"
    src.write_text(SELFTEST)
    sources = [
        str(src),
        *sorted(
            os.path.join(ROOT, "csrc", f)
            for f in os.listdir(os.path.join(ROOT, "csrc"))
            if f.endswith(".c")
        ),
    ]
    exe = _build(tmp_path, flags, sources, str(tmp_path / "durable_selftest"))
    env = dict(
        os.environ,
        ASAN_OPTIONS="abort_on_error=0:detect_leaks=0",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )
    out = subprocess.run([exe, "3000"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "3000 calls" in out.stdout


@pytest.mark.parametrize("durability,sync_call", [("msync", "msync"), ("fdatasync", "fdatasync")])
def test_a_durable_enqueue_starts_the_write_back_before_its_sync(tmp_path, durability, sync_call):
    # docs/durability.md: the write-back of an append's pages starts as soon as they are written
    # (sync_file_range), and the promise comes from the msync or fdatasync after it.  Seen in the
    # system calls of a real enqueue, under strace: the write-back comes once the writer lock is
    # released (other producers do not wait for it), in the same call as the write.
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (.ci/run installs it)")
    code = (
        "import sys\nfrom ringq import Queue\n"
        f"q = Queue(sys.argv[1], durability={durability!r})\n"
        "q.enqueue('warm')\nprint('MARK', flush=True)\n"
        "for i in range(3):\n    q.enqueue({'n': i})\n"
    )
    import sys as _sys

    out = subprocess.run(
        [strace, "-f", "-e", f"trace=sync_file_range,{sync_call},write,pwrite64,flock", "-o", str(tmp_path / "st"),
         _sys.executable, "-c", code, str(tmp_path / "q")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    calls = []
    marked = False
    for line in (tmp_path / "st").read_text().splitlines():
        if "MARK" in line:
            marked = True
            continue
        name = line.split(None, 1)[1].split("(", 1)[0] if " " in line else ""
        if marked and name in ("sync_file_range", sync_call, "pwrite64", "flock"):
            calls.append(name if name != "flock" else line.split(", ")[1].split(")")[0])
    one = ["LOCK_EX|LOCK_NB", "pwrite64", "LOCK_UN", "sync_file_range", sync_call]
    assert calls == one * 3, calls
