"""Regressions, each named for the behaviour it keeps: the first things people run into."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from procs import child_env

from ringq import Queue


def ringq_cli(qdir, *args, **kw) -> subprocess.CompletedProcess:
    where = [] if qdir is None else ["--dir", str(qdir)]
    return subprocess.run(
        [sys.executable, "-m", "ringq", *where, *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
        **kw,
    )


def test_segment_copied_from_a_queue_of_other_geometry_is_quarantined(tmp_path):
    """Finding: a foreign segment passed `verify` and its jobs were served with duplicate ids."""
    a, b = tmp_path / "a", tmp_path / "b"
    with Queue(str(a)) as q:
        q.enqueue_many(list(range(3)))
    with Queue(str(b), slot_size=64 * 2, slot_count=16) as q:
        q.enqueue_many(["foreign"] * 20)  # segments 1 and 2
    shutil.copy(b / "default.0000000000000002.seg", a / "default.0000000000000002.seg")
    ver = ringq_cli(a, "verify")
    assert ver.returncode == 1 and "another queue" in ver.stdout + ver.stderr
    with Queue(str(a)) as q:
        assert [j.payload for j in q.lease(20)] == [0, 1, 2]
        assert any("another queue" in reason for _p, reason in q.recovery.quarantined)


def test_verify_flags_a_symlink_where_a_segment_belongs(tmp_path):
    """Finding: `verify` said ok while the symlinked segment's jobs were invisible."""
    qdir = tmp_path / "q"
    with Queue(str(qdir)) as q:
        q.enqueue_many(list(range(10)))
    seg = qdir / "default.0000000000000001.seg"
    elsewhere = tmp_path / "elsewhere.seg"
    os.rename(seg, elsewhere)
    os.symlink(elsewhere, seg)
    ver = ringq_cli(qdir, "verify")
    assert ver.returncode == 1 and "symbolic link" in ver.stdout + ver.stderr


def test_damage_found_on_open_is_never_silent_on_the_command_line(tmp_path):
    """Finding: `ringq stats` printed total=0 and exit 0 over a quarantined segment, saying nothing."""
    qdir = tmp_path / "q"
    with Queue(str(qdir)) as q:
        q.enqueue_many(list(range(10)))
    seg = qdir / "default.0000000000000001.seg"
    with open(seg, "r+b") as fh:
        fh.write(os.urandom(64))  # a random header
    first = ringq_cli(qdir, "stats")
    assert "warning: quarantined" in first.stderr
    # Said once, by the command whose open quarantined it, in one line per file (the salvage it
    # made is part of that line, not a second one); later commands repeat nothing ...
    assert first.stderr.count("\n") == 1 and "10 intact jobs salvaged" in first.stderr, first.stderr
    for cmd in ("stats", "list", "lease"):
        assert ringq_cli(qdir, cmd).stderr == "", cmd
    # ... while verify reports the quarantined files as damage and recover lists them
    ver = ringq_cli(qdir, "verify")
    assert ver.returncode == 1 and "quarantined earlier" in ver.stdout
    # what each file was and what became of its jobs: the salvaged ones are served from the tail
    assert (
        f"{seg}.quarantined: quarantined earlier: a record file that failed validation; nothing is served from this file"
        in ver.stdout
    )
    assert (
        "first copies the intact jobs in it that had not finished to the tail segment" in ver.stdout
    )
    state = qdir / "default.0000000000000001.state"
    assert (
        f"{state}.quarantined: quarantined earlier: the state file of the record file {seg.name}.quarantined, set aside with it"
        in ver.stdout
    )
    assert "not served" not in ver.stdout
    assert "quarantined earlier await an operator" in ringq_cli(qdir, "recover").stdout
    with Queue(str(qdir)) as q:  # job 0 is the one `ringq lease` took above
        assert q.stats().total == 10 and sorted(j.payload for j in q.lease(20)) == list(
            range(1, 10)
        )


def test_verify_says_a_quarantined_state_file_was_rebuilt_and_its_segment_is_served(tmp_path):
    """A state file that failed validation is set aside by the open, which rebuilds the segment's
    state from its record file: `verify` says so and that the segment's jobs are served, and they
    are (every one of them is leased, a finished one again)."""
    qdir = tmp_path / "q"
    with Queue(str(qdir)) as q:
        q.enqueue_many(["a", "b", "c"])
        q.ack(q.lease_one())  # "a" is done: only the old state file says so
    state = qdir / "default.0000000000000001.state"
    with open(state, "r+b") as fh:
        fh.write(b"X")  # the state file's magic: it fails validation
    first = ringq_cli(qdir, "stats")  # this open sets it aside and rebuilds it
    assert (
        first.returncode == 0 and "a fresh state file was made from the record file" in first.stderr
    )
    assert (qdir / "default.0000000000000001.state.quarantined").exists() and state.exists()
    ver = ringq_cli(qdir, "verify")
    assert ver.returncode == 1, ver
    [line] = [x for x in ver.stdout.splitlines() if x.startswith("DAMAGE:")]
    assert line == (
        f"DAMAGE: {state}.quarantined: quarantined earlier: a state file that failed validation at "
        "an open, which kept it here for inspection and rebuilt the segment's state from its record "
        "file default.0000000000000001.seg; the segment's jobs are served (every intact record was "
        "made ready again, so a job acked or leased before may be delivered again)"
    )
    # served indeed: every job of the segment is leased from it, "a" again although it was acked
    leased = json.loads(ringq_cli(qdir, "--json", "lease", "--count", "5").stdout)
    assert sorted(j["payload"] for j in leased) == ["a", "b", "c"]


def test_verify_says_what_a_state_file_left_behind_by_a_retired_segment_is(tmp_path):
    """A quarantined state file outlives its segment's retirement: nothing is served from it."""
    qdir = tmp_path / "q"
    with Queue(str(qdir), slot_size=128, slot_count=8) as q:
        q.enqueue_many(list(range(8)))  # segment 1 is full
    state = qdir / "default.0000000000000001.state"
    with open(state, "r+b") as fh:
        fh.write(b"X")
    with Queue(str(qdir), slot_size=128, slot_count=8) as q:
        assert any(p.endswith(".state.quarantined") for p, _w in q.recovery.quarantined)
        for job in q.lease(8):
            q.ack(job)
        q.enqueue("next")  # in segment 2: segment 1 is sealed, every job in it done
        q.compact()
    assert not (qdir / "default.0000000000000001.seg").exists()
    ver = ringq_cli(qdir, "verify")
    assert (
        ver.returncode == 1
        and (
            f"DAMAGE: {state}.quarantined: quarantined earlier: the state file of "
            "default.0000000000000001.seg, which is no longer in the queue (a segment's record file goes "
            "when every job in it finished); nothing is served from it"
        )
        in ver.stdout.splitlines()
    ), ver.stdout


def test_a_damaged_record_is_reported_by_the_open_that_marks_it(tmp_path):
    """After a record was quarantined (BAD), every later command printed the same warning again."""
    qdir = tmp_path / "q"
    with Queue(str(qdir)) as q:
        q.enqueue_many(["first", "second", "third"])
        [_a, victim, _c] = q.list_jobs()
    seg = qdir / "default.0000000000000001.seg"
    data = bytearray(seg.read_bytes())
    at = data.find(b'"second"')
    data[at + 2] ^= 0x20  # one payload byte: the record fails its CRC
    seg.write_bytes(bytes(data))
    first = ringq_cli(qdir, "list")
    assert "slot 1" in first.stderr and "quarantined (BAD)" in first.stderr, first.stderr
    assert victim.id not in first.stdout
    again = ringq_cli(qdir, "list")
    assert again.stderr == "" and victim.id not in again.stdout
    assert json.loads(ringq_cli(qdir, "--json", "stats").stdout)["corrupt"] == 1
    ver = ringq_cli(qdir, "verify")
    assert ver.returncode == 1 and "slot 1" in ver.stdout


def test_damage_an_open_found_is_a_json_warning_under_json(tmp_path):
    qdir = tmp_path / "q"
    with Queue(str(qdir)) as q:
        q.enqueue_many(["first", "second", "third"])
    seg = qdir / "default.0000000000000001.seg"
    data = bytearray(seg.read_bytes())
    data[data.find(b'"second"') + 2] ^= 0x20  # one payload byte: the record fails its CRC
    seg.write_bytes(bytes(data))
    out = ringq_cli(qdir, "--json", "list")
    assert out.returncode == 0, out.stderr
    [warning] = [json.loads(line) for line in out.stderr.splitlines()]
    assert warning["command"] == "list" and "quarantined (BAD)" in warning["warning"], warning
    assert len(json.loads(out.stdout)) == 2


def test_verify_reads_a_queue_it_cannot_write(tmp_path):
    """Finding: `verify` and `inspect` opened the control file read-write and failed on a read-only queue."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid")
    qdir = tmp_path / "q"
    with Queue(str(qdir)) as q:
        q.enqueue_many(list(range(5)))
    os.chmod(tmp_path, 0o755)
    os.chmod(qdir, 0o755)
    for f in qdir.iterdir():
        os.chmod(f, 0o644)
    code = "import os, sys; os.setgid(65534); os.setuid(65534); from ringq.cli import main; sys.exit(main(sys.argv[1:]))"
    probe = subprocess.run(
        [sys.executable, "-c", "import os; os.setgid(65534); os.setuid(65534); import json, ringq"],
        capture_output=True,
        env=child_env(),
        timeout=60,
        cwd=tmp_path,
    )
    if probe.returncode != 0:
        pytest.skip("this Python or ringq is not readable by an unprivileged uid here")
    for cmd in ("verify", "inspect"):
        proc = subprocess.run(
            [sys.executable, "-c", code, "--dir", str(qdir), cmd],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=60,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, (cmd, proc.stdout, proc.stderr)


def test_verify_and_inspect_work_on_a_read_only_file_system(tmp_path):
    """The same finding, through a read-only bind mount (where root cannot write either); and
    `Queue()`, `ringq stats` and `ringq list` there raised a bare `OSError [Errno 30]`."""
    import ringq

    qdir, ro = tmp_path / "q", tmp_path / "ro"
    with Queue(str(qdir)) as q:
        q.enqueue_many(list(range(5)))
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(qdir), str(ro)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        if (
            subprocess.run(
                ["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True
            ).returncode
            != 0
        ):
            pytest.skip("cannot remount read-only here")
        with pytest.raises(ringq.ReadOnlyQueueError, match="read-only file system") as info:
            Queue(str(ro))
        assert "`ringq verify` and `ringq inspect`" in str(info.value)
        for cmd in ("stats", "list"):
            proc = ringq_cli(ro, cmd)
            assert proc.returncode == 1 and proc.stderr.count("\n") == 1, (cmd, proc.stderr)
            assert "is read-only" in proc.stderr and "ringq verify" in proc.stderr, proc.stderr
        for cmd in ("verify", "inspect"):
            proc = ringq_cli(ro, cmd)
            assert proc.returncode == 0, (cmd, proc.stdout, proc.stderr)
        assert "5 record(s) checked" in ringq_cli(ro, "verify").stdout
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


# The interpreter's own files may be root-only: everything the commands import is imported (and
# the parser built, by --help) before the switch to the unprivileged user.
UNPRIVILEGED_CLI = (
    "import contextlib, datetime, io, os, sys; import numpy, ringq.cli, ringq.engine.verify, ringq.local.queue\n"
    "with contextlib.redirect_stdout(io.StringIO()): ringq.cli.main(['--help'])\n"
    "os.setgid(65534); os.setuid(65534); sys.exit(ringq.cli.main(sys.argv[1:]))"
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
def test_a_directory_another_user_cannot_write_is_read_only_to_it():
    """`Queue()` by a user who may read but not write the directory: ReadOnlyQueueError, and
    `ringq verify` / `ringq inspect` by that user work there."""
    import tempfile

    top = tempfile.mkdtemp(prefix="ringq-ro-")  # pytest's tmp_path is inside a root-only directory
    try:
        os.chmod(top, 0o755)
        qdir = os.path.join(top, "q")
        with Queue(qdir) as q:
            q.enqueue_many(list(range(5)))
        os.chmod(qdir, 0o755)
        for f in os.listdir(qdir):
            os.chmod(os.path.join(qdir, f), 0o644)

        def run(*args):
            return subprocess.run(
                [sys.executable, "-c", UNPRIVILEGED_CLI, "--dir", qdir, *args],
                capture_output=True,
                text=True,
                env=child_env(),
                timeout=60,
                cwd=top,
            )

        probe = run("--version")
        if probe.returncode != 0:
            pytest.skip(
                f"this Python or ringq is not readable by an unprivileged uid here: {probe.stderr[-300:]}"
            )
        stats = run("stats")
        assert (
            stats.returncode == 1 and "is read-only (not writable by this user" in stats.stderr
        ), stats.stderr
        assert "ringq verify" in stats.stderr and "Traceback" not in stats.stderr
        for cmd in ("verify", "inspect"):
            proc = run(cmd)
            assert proc.returncode == 0, (cmd, proc.stdout, proc.stderr)
    finally:
        shutil.rmtree(top)


def test_a_file_where_the_queue_directory_belongs_is_a_ringq_error(tmp_path):
    """Finding: `Queue("/path/to/a-file")` raised `FileExistsError: cannot create queue directory`."""
    import ringq

    f = tmp_path / "a-file"
    f.write_text("not a queue")
    for path in (f, f / "below"):
        with pytest.raises(ringq.QueuePathError, match="a file is in the way"):
            Queue(str(path))
    proc = ringq_cli(f, "enqueue", "x")
    assert (
        proc.returncode == 1
        and "a file is in the way" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    assert f.read_text() == "not a queue"


def test_structured_arrays_keep_their_field_names(tmp_path):
    """Finding: a structured dtype came back as raw void bytes ('|V12')."""
    arr = np.zeros(3, dtype=[("a", "<i4"), ("b", [("x", ">f8"), ("y", "<u2", (2,))])])
    arr["a"] = [1, 2, 3]
    with Queue(str(tmp_path / "q")) as q:
        q.enqueue(arr)
        got = q.lease_one().payload
    assert got.dtype == arr.dtype and got.dtype.names == ("a", "b") and np.array_equal(got, arr)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--threads", "0"], "--threads must be at least 1"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--limit", "-5"], "--limit must be at least 1"),
        (["--source", "/nonexistent/dir"], "no such directory"),
    ],
)
def test_demo_refuses_bad_arguments_in_one_line(tmp_path, args, needle):
    """Finding: --threads 0 printed worker tracebacks and negative redelivery counts."""
    proc = ringq_cli(None, "demo", *args)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_demo_refuses_a_used_keep_directory(tmp_path):
    """Finding: re-running with the same --keep DIR reported negative redeliveries and FAILED."""
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "something").write_text("x")
    proc = ringq_cli(None, "demo", "--keep", str(keep), "--limit", "5")
    assert proc.returncode == 2 and "new or empty directory" in proc.stderr


def test_worker_processes_stop_when_their_parent_is_sigkilled(tmp_path):
    """Finding: SIGKILL of `ringq work --processes 2` left children leasing forever."""
    (tmp_path / "orphan_handlers.py").write_text(
        "import time\n\ndef slow(job):\n    time.sleep(0.05)\n"
    )
    qdir = tmp_path / "q"
    with Queue(str(qdir)) as q:
        q.enqueue_many(list(range(10000)))
    env = dict(child_env(), PYTHONPATH=f"{tmp_path}{os.pathsep}{child_env()['PYTHONPATH']}")
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ringq",
            "--dir",
            str(qdir),
            "work",
            "orphan_handlers:slow",
            "--processes",
            "2",
        ],
        env=env,
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        with Queue(str(qdir)) as q:
            while q.stats().leased < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        kids = subprocess.run(
            ["pgrep", "-P", str(parent.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(kids) >= 2
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 15
        alive = kids
        while alive and time.monotonic() < deadline:
            alive = [k for k in alive if os.path.exists(f"/proc/{k}") and "Z" not in _state(k)]
            time.sleep(0.1)
        assert not alive, f"orphaned workers still running: {alive}"
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _state(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_empty_job_id_and_negative_limits_are_refused(tmp_path):
    """Finding: `--job-id ''` silently got an automatic id; a negative --limit must not pass."""
    qdir = tmp_path / "q"
    assert ringq_cli(qdir, "enqueue", "x").returncode == 0
    for args, needle in (
        (["enqueue", "x", "--job-id", ""], "--job-id must not be empty"),
        (["list", "--limit", "-1"], "--limit must be >= 0"),
        (["dlq", "--limit", "-1"], "--limit must be >= 0"),
        (["inspect", "--limit", "-1"], "--limit must be >= 0"),
    ):
        proc = ringq_cli(qdir, *args)
        assert proc.returncode == 2 and needle in proc.stderr, (args, proc.stderr)


def test_one_record_segments_are_not_relocated_over_and_over(tmp_path):
    """Finding (second round): with a record filling a segment, every open relocated every
    segment, and stats/dlq saw 1 of N jobs."""
    qdir = str(tmp_path / "q")
    with Queue(qdir, slot_size=128, slot_count=8, max_attempts=1) as q:
        for _ in range(4):
            q.enqueue(b"x" * 700, delay=3600)  # 6 of 8 slots: one record per segment
        for _ in range(4):
            q.enqueue(b"y" * 700)
            q.nack(q.lease_one())  # dead
        before = sorted(f for f in os.listdir(qdir) if f.endswith(".seg"))
    for _ in range(3):
        with Queue(qdir) as q:
            st = q.stats()
            assert (st.delayed, st.dead) == (4, 4) and len(q.dlq()) == 4
        assert sorted(f for f in os.listdir(qdir) if f.endswith(".seg")) == before


def test_relocation_killed_after_its_append_leaves_one_live_copy(tmp_path):
    """Finding (second round): a relocator killed between writing the copy and retiring the
    original left two live copies of a delayed job (one leasable at once) or of a dead job.
    The image is built as that kill leaves it: the copy appended, the original untouched."""
    from ringq.codec import JSON
    from ringq.engine.records import NewRecord
    from ringq.engine.ring import Ring

    qdir = str(tmp_path / "q")
    with Queue(qdir, max_attempts=1) as q:
        late = q.enqueue("late", delay=3600)
        dead = q.enqueue("dead")
        q.nack(q.lease_one(), error="boom")
    ring = Ring(qdir)
    for job, state, at in (
        (late, 1, int(late.available_at * 1000)),
        (dead, 4, int(time.time() * 1000)),
    ):
        seg, slot, _ = job.record_position
        ring.append(
            [
                NewRecord(
                    json.dumps(job.payload).encode(),
                    JSON,
                    job.id.encode(),
                    0,
                    0,
                    1,
                    1 if state == 4 else 0,
                    (seg << 24) | slot,
                    state=state,
                    at_ms=at,
                )
            ]
        )
    ring.close()
    with Queue(qdir) as q:
        st = q.stats()
        assert (st.delayed, st.dead, st.ready) == (1, 1, 0)
        assert [j.payload for j in q.dlq()] == ["dead"]
        assert q.lease_one() is None  # the delayed job is still delayed
        assert [j.payload for j in q.list_jobs()] == ["late", "dead"]


def test_lost_control_file_is_rebuilt_from_the_segments_geometry(tmp_path):
    """Finding (second round): a deleted .ctl of a non-default-geometry queue made the next
    enqueue quarantine every segment as 'of another queue'."""
    qdir = tmp_path / "q"
    with Queue(str(qdir), slot_size=128, slot_count=8) as q:
        q.enqueue_many(list(range(20)))
    os.unlink(qdir / "default.ctl")
    assert ringq_cli(qdir, "stats").returncode == 0
    assert ringq_cli(qdir, "enqueue", "1").returncode == 0
    with Queue(str(qdir)) as q:
        assert q.stats().ready == 21 and not q.recovery.quarantined


def test_usage_errors_are_one_line_and_json_with_json(tmp_path):
    """Finding (second round): argparse errors were three lines of usage, and not JSON under --json."""
    proc = ringq_cli(tmp_path, "enqueue")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "payload" in proc.stderr
    proc = ringq_cli(tmp_path, "--json", "list", "--state", "bogus")
    assert proc.returncode == 2 and "invalid choice" in json.loads(proc.stderr)["error"]


def test_list_state_delayed(tmp_path):
    """Finding (second round): `list --state delayed` was refused although list shows that state."""
    qdir = tmp_path / "q"
    with Queue(str(qdir)) as q:
        q.enqueue("later", delay=100)
        q.enqueue("now")
    rows = json.loads(ringq_cli(qdir, "--json", "list", "--state", "delayed").stdout)
    assert [r["payload"] for r in rows] == ["later"]


def test_control_characters_in_ids_and_errors_are_escaped_in_text_output(tmp_path):
    # A newline or a terminal escape sequence in a job id (any non-empty string is an id) or in a
    # handler's error was written raw by `ringq list` and `ringq get`.
    odd = "a\nb\x1b[31mred"
    with Queue(tmp_path / "q") as q:
        q.enqueue("x", job_id=odd)
        q.enqueue("y", job_id="plain")
        q.nack(q.lease_one(), error="bad\x1b[2Jclear", delay=100)
    listed = ringq_cli(tmp_path / "q", "list").stdout
    got = ringq_cli(tmp_path / "q", "get", odd).stdout
    for out in (listed, got):
        assert "\x1b" not in out and "\\x1b[31m" in out and "\\x1b[2J" in out
    assert len(listed.splitlines()) == 3 and listed.splitlines()[1].startswith("a\\nb\\x1b[31mred ")
    assert json.loads(ringq_cli(tmp_path / "q", "--json", "get", odd).stdout)["id"] == odd
    inspected = ringq_cli(tmp_path / "q", "inspect").stdout
    assert "\x1b" not in inspected and "a\\nb\\x1b[31mred" in inspected
    # A worker's log lines (-v: with the handler's traceback) and ack's echo.
    (tmp_path / "hmod.py").write_text(
        "def bad(job):\n    raise RuntimeError('bad\\x1b[2J\\r\\nFAKE LINE')\n"
    )
    worked = ringq_cli(tmp_path / "q", "work", "hmod:bad", "--max-jobs", "1", "-v", cwd=tmp_path)
    assert "\x1b" not in worked.stderr and "\r" not in worked.stderr, worked.stderr
    assert "RuntimeError: bad\\x1b[2J\\r\\nFAKE LINE" in worked.stderr
    with Queue(tmp_path / "q") as q:
        q.enqueue("z", job_id="ack\x1b[1m")
        q.lease_one()  # the only due job
    acked = ringq_cli(tmp_path / "q", "ack", "ack\x1b[1m")
    assert acked.stdout == "acked ack\\x1b[1m\n", acked.stderr


def test_control_characters_in_a_dir_are_escaped_in_warnings_and_errors(tmp_path):
    # The --dir a command names comes back in its warnings and errors: escaped, never raw.
    odd = tmp_path / "a\x1b[31mred\nFAKE LINE"
    odd.mkdir()
    for cmd in ("stats", "inspect", "purge"):
        out = ringq_cli(odd / "q", cmd)
        assert "\x1b" not in out.stderr and "\\x1b[31mred" in out.stderr, out.stderr
        assert not any(line.startswith("FAKE LINE") for line in out.stderr.splitlines())
    as_json = ringq_cli(odd / "q", "--json", "inspect")
    assert "\x1b" not in as_json.stderr  # JSON escapes it on the wire ...
    assert "a\x1b[31mred\nFAKE LINE" in json.loads(as_json.stderr)["error"]  # ... whole
    warned = ringq_cli(odd / "q", "--json", "stats")  # the no-queue warning is JSON too
    assert "a\x1b[31mred" in json.loads(warned.stderr.splitlines()[0])["warning"]
    # A queue there: what verify, inspect and upgrade print on stdout names the directory.
    with Queue(odd / "q") as q:
        q.enqueue(1)
    (odd / "q" / "stray\x1b[2Jname").write_text("x")  # a file of the directory's that inspect lists
    for cmd in (["verify"], ["inspect"]):
        out = ringq_cli(odd / "q", *cmd)
        assert "\x1b" not in out.stdout and "\\x1b[31mred" in out.stdout, out.stdout
        assert not any(line.startswith("FAKE LINE") for line in out.stdout.splitlines())
    up = ringq_cli(None, "upgrade", str(odd / "q"))
    assert "\x1b" not in up.stdout + up.stderr and "FAKE LINE" in up.stdout + up.stderr
