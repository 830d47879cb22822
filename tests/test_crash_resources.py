"""Full disks, file size limits, and resources that must stay bounded.

Invariant: when a new segment cannot be allocated the producer gets QueueFullError naming the
bytes needed and the path, no process dies (no SIGBUS: segments are allocated and zero-filled
before they are mapped), committed jobs are untouched, and enqueue works again once space is
freed; and however many segments rotate and retire, file descriptors and mappings stay bounded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
from crashkit import NAME, SLOTS, drain, geometry, open_queue, verify
from procs import child_env

from ringq import Queue
from ringq.errors import QueueFullError


@pytest.fixture
def small_tmpfs():
    """A 48 KiB tmpfs (ctl page + a few 9 KiB segments), or skip if mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tempfile.mkdtemp(prefix="ringq-full-")
    rc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k,mode=0700", "tmpfs", mnt], capture_output=True
    ).returncode
    if rc != 0:
        os.rmdir(mnt)
        pytest.skip("cannot mount a tmpfs here (no CAP_SYS_ADMIN?)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)
        os.rmdir(mnt)


def test_full_tmpfs_rotation_fails_cleanly_and_recovers(small_tmpfs):
    path = os.path.join(small_tmpfs, "q")
    seg_bytes = geometry()[2]
    with open_queue(path) as q:
        returned = []
        with pytest.raises(QueueFullError) as info:
            for i in range(1000):
                q.enqueue(i)
                returned.append(i)
        msg = str(info.value)
        assert f"{seg_bytes} bytes" in msg and path in msg, msg
        assert info.value.errno == 28
        assert not [f for f in os.listdir(path) if f.endswith(".tmp")]  # nothing half-made left
        names = os.listdir(path)
        assert {f[: -len(".state")] for f in names if f.endswith(".state")} == {
            f[: -len(".seg")] for f in names if f.endswith(".seg")
        }  # no state file of a segment whose record file could not be made
        with pytest.raises(QueueFullError):
            q.enqueue_many(["a", "b", "c", "d", "e", "f", "g", "h", "i"])  # a batch: all or nothing
        # Every job whose enqueue returned is intact, in another process's view too.
        with open_queue(path) as other:
            assert other.stats().ready == len(returned)
            assert not verify(other).damaged
        got = drain(q)  # acking retires full segments: space comes back
        assert got == returned
        for i in range(8):  # one more segment: what the 48 KiB holds beside the full tail
            q.enqueue(("again", i))
        assert len(drain(q)) == 8


@pytest.fixture
def one_segment_tmpfs():
    """A 24 KiB tmpfs: the control page and one 12 KiB segment fit, a second segment does not."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tempfile.mkdtemp(prefix="ringq-one-")
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=24k,mode=0700", "tmpfs", mnt], capture_output=True
        ).returncode
        != 0
    ):
        os.rmdir(mnt)
        pytest.skip("cannot mount a tmpfs here (no CAP_SYS_ADMIN?)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)
        os.rmdir(mnt)


def _fill(q):
    n = 0
    with pytest.raises(QueueFullError):
        while True:
            q.enqueue(("job", n))
            n += 1
    return n


def test_a_volume_that_holds_one_segment_takes_work_again_once_its_jobs_finish(one_segment_tmpfs):
    path = os.path.join(one_segment_tmpfs, "q")
    with open_queue(path) as q:
        n = _fill(q)
        assert n == SLOTS  # the tail segment is full and no second one fits
        assert len(drain(q)) == n  # every job finished
        for _round in range(3):  # the same space, again and again
            assert _fill(q) == SLOTS
            assert len(drain(q)) == SLOTS
        _fill(q)
    # After reopening too: a full, finished tail found at open.
    with open_queue(path) as q:
        assert len(drain(q)) == SLOTS
    with open_queue(path) as q:
        q.enqueue_many(["a", "b"])
        q.enqueue("c", job_id="idempotent")
        assert sorted(map(str, drain(q))) == ["a", "b", "c"]
        assert q.stats().enqueued_total == 5 * SLOTS + 3
    with open_queue(path) as q:
        assert not verify(q).damaged
        n = _fill(q)  # after the finished a, b, c: their slots stay until the segment retires
        with pytest.raises(QueueFullError):  # unfinished jobs are never thrown away for room
            q.enqueue("no room")
        assert sorted(p[1] for p in drain(q)) == list(range(n))
        assert _fill(q) == SLOTS


RLIMIT_CHILD = textwrap.dedent("""
    import os, resource, sys, json
    sys.path[:0] = json.loads(sys.argv[2])
    import crashkit, ringq
    path = sys.argv[1]
    q = crashkit.open_queue(path)
    for i in range(8):
        q.enqueue(i)                      # segment 1 is full
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    sys.dont_write_bytecode = True  # a module first imported under the limit: no truncated cache
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # the next segment cannot be written
    try:
        q.enqueue(8)
    except ringq.QueueFullError as exc:
        print("full:", exc)
    job = q.lease_one()
    q.nack(job, error="e" * 4000, delay=0)  # the error note cannot be kept either: nack still works
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    q.enqueue(8)
    print("payloads:", sorted(j.payload for j in q.lease(20)))
""")


def test_a_control_file_that_cannot_be_written_whole_is_queue_full(tmp_path):
    # Under a 3000-byte file size limit the 4096-byte control page was written short, and the
    # open said the control file was damaged (remove it and reopen) instead of full.
    code = textwrap.dedent("""
        import resource, sys, ringq
        sys.dont_write_bytecode = True  # no bytecode cache written short under the limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            ringq.Queue(sys.argv[1])
        except ringq.QueueFullError as exc:
            print("full:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q")], capture_output=True,
                         text=True, env=child_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("full:") and "cannot write the control file" in out.stdout, out.stdout
    assert [f for f in os.listdir(tmp_path / "q") if not f.endswith(".lock")] == []
    with Queue(tmp_path / "q") as q:  # without the limit the queue is created
        q.enqueue(1)


def test_limits_and_schedule_files_that_cannot_be_written_whole_are_queue_full(tmp_path):
    # The schedule file was left at 4096 bytes (every later schedule call then refused it as
    # damaged), and the limits file was sparse (SIGBUS when a nearly full tmpfs had no page).
    code = textwrap.dedent("""
        import resource, sys, ringq
        q = ringq.Queue(sys.argv[1])
        sys.dont_write_bytecode = True  # no bytecode cache written short under the limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        for call in (lambda: q.limit("k", concurrency=1), lambda: q.schedule("s", 1, every=60)):
            try:
                call()
            except ringq.QueueFullError as exc:
                print("full:", "cannot write" in str(exc))
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q")], capture_output=True,
                         text=True, env=child_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["full: True", "full: True"], out.stdout
    with Queue(tmp_path / "q") as q:  # without the limit both work
        q.limit("k", concurrency=1)
        q.schedule("s", 1, every=60)
        assert [s.name for s in q.schedules()] == ["s"]


def test_a_geometry_no_disk_holds_leaves_no_queue_behind(tmp_path):
    # A first segment of 16 TiB cannot be allocated: the open fails with QueueFullError, and
    # leaves no control file with that geometry (every later open would try it again) and no
    # state file of the segment.
    path = tmp_path / "q"
    # Refused before any of it is allocated ("... bytes free"): fallocate would first take all
    # the file system's free space, failing every other writer of it meanwhile.
    with pytest.raises(QueueFullError, match=r"17592184999936 bytes .*\(\d+ bytes free\)"):
        Queue(path, slot_size=2**20, slot_count=2**24 - 1)
    assert [f for f in os.listdir(path) if not f.endswith(".lock")] == []
    with Queue(path) as q:
        q.enqueue("fits")
        assert q.lease_one().payload == "fits"
        assert not verify(q).damaged


def test_rlimit_fsize_gives_queue_full_not_a_signal(tmp_path):
    env = dict(os.environ)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            RLIMIT_CHILD,
            str(tmp_path / "q"),
            __import__("json").dumps(sys.path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr  # a SIGXFSZ death would be -25
    lines = out.stdout.splitlines()
    assert lines[0].startswith("full:") and "File too large" in lines[0] and "bytes" in lines[0]
    assert lines[1] == "payloads: " + str(list(range(9))), out.stdout


def _counts():
    return len(os.listdir("/proc/self/fd")), sum(1 for _ in open("/proc/self/maps"))


def test_fds_and_mappings_stay_bounded_through_rotation_and_retirement(tmp_path):
    path = str(tmp_path / "q")
    with open_queue(path, durability="none") as q, open_queue(path, durability="none") as other:

        def cycle(i):
            q.enqueue_many([(i, k) for k in range(12)])  # 1.5 segments: rotates every cycle
            for _ in range(12):
                job = other.lease_one()
                other.ack(job)
            q.stats()

        for i in range(20):
            cycle(i)
        fds, maps = _counts()
        for i in range(20, 150):
            cycle(i)
        fds2, maps2 = _counts()
        assert fds2 <= fds + 4 and maps2 <= maps + 8, (fds, fds2, maps, maps2)
        segs = [f for f in os.listdir(tmp_path / "q") if f.endswith(".seg")]
        assert len(segs) <= 3, segs  # disk bounded: only the live tail and its neighbour


def test_many_queues_opened_and_closed_leak_nothing(tmp_path):
    def round_(n):
        for i in range(n):
            with open_queue(str(tmp_path / f"q{i % 7}")) as q:
                q.enqueue(i)
                job = q.lease_one()
                q.ack(job)

    round_(20)
    fds, maps = _counts()
    round_(200)
    fds2, maps2 = _counts()
    assert fds2 <= fds + 2 and maps2 <= maps + 4, (fds, fds2, maps, maps2)


def test_no_sparse_segments(tmp_path):
    with open_queue(str(tmp_path)) as q:
        q.enqueue(1)
    st = os.stat(os.path.join(tmp_path, f"{NAME}.{1:016x}.seg"))
    assert st.st_blocks * 512 >= st.st_size  # every block allocated: no SIGBUS on a full disk later
