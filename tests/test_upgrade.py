"""Format-1 directories: refused with an error naming `ringq upgrade DIR`, never opened as an empty
queue; upgraded in place by `ringq upgrade`, crash-safely (a kill after any file-changing step of
the upgrade leaves a directory that opens -- after running the upgrade again where it still
refuses -- with every job)."""

from __future__ import annotations

import os
import subprocess
import sys

import format1
import pytest
from crashkit import NAME, SLOT, SLOTS, Recorder, drain, open_queue, restore, snapshot

from ringq import FormatVersionError
from ringq.engine.upgrade import upgrade
from ringq.engine.words import ST_DEAD, ST_DONE, ST_LEASED, ST_READY

# Segment 1 (sealed): two done, one ready, one dead, one leased by a process long gone, one ready
# spanning two slots.  Segment 2 (the tail): two ready.
SEGMENTS = [
    [
        ("d1", ST_DONE, 1),
        ("r1", ST_READY, 0),
        ("d2", ST_DONE, 1),
        ("x1", ST_DEAD, 5),
        ("l1", ST_LEASED, 1),
        ("r2" * 40, ST_READY, 0),
    ],
    [("r3", ST_READY, 0), ("r4", ST_READY, 0)],
]
EXPECTED = ["r1", "l1", "r2" * 40, "r3", "r4"]


def _make(path: str) -> None:
    format1.make_queue(path, NAME, SEGMENTS, SLOT, SLOTS)


def test_opening_a_format1_directory_refuses_and_names_the_upgrade(tmp_path):
    path = str(tmp_path / "q")
    _make(path)
    before = snapshot(path)
    with pytest.raises(FormatVersionError, match=rf"ringq upgrade {path}"):
        open_queue(path)
    after = snapshot(path)
    # Nothing rewritten, nothing renamed aside: the refusal touched no segment (the open took the
    # writer lock, whose file may be created).
    assert {k: v for k, v in after.items() if k != f"{NAME}.lock"} == before


def test_ringq_upgrade_keeps_every_job_state_and_order(tmp_path):
    path = str(tmp_path / "q")
    _make(path)
    out = subprocess.run(
        [sys.executable, "-m", "ringq", "upgrade", path, "--queue", NAME],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("upgraded") == 2
    names = sorted(os.listdir(path))
    assert f"{NAME}.0000000000000001.state" in names and f"{NAME}.0000000000000002.state" in names
    with open_queue(path) as q:
        assert q.recovery.clean, q.recovery.describe()
        assert sorted(drain(q)) == sorted(EXPECTED)
        dead = q.dlq()
        assert [j.payload for j in dead] == ["x1"]
    # A second run finds nothing to do.
    assert upgrade(path).upgraded == []
    again = subprocess.run(
        [sys.executable, "-m", "ringq", "upgrade", path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "nothing to upgrade" in again.stdout


def test_upgrade_cut_short_at_every_step_keeps_every_job(tmp_path):
    src = str(tmp_path / "src")
    _make(src)
    rec = Recorder(src, key_of=lambda b: None)
    with rec.recording():
        upgrade(src)
    steps = [s for s in rec.steps if s.what != "start"]
    assert any(s.what.startswith("rename") and s.what.endswith(".seg") for s in steps)
    assert len(steps) > 10
    for i, step in enumerate(rec.steps):
        path = restore(step.image, str(tmp_path / f"img{i}"))
        try:
            q = open_queue(path)
        except FormatVersionError:
            upgrade(path)
            q = open_queue(path)
        with q:
            assert sorted(drain(q)) == sorted(EXPECTED), step.what
            assert [j.payload for j in q.dlq()] == ["x1"], step.what
            assert not q.recovery.quarantined and not q.recovery.corrupt_records, step.what


def test_a_damaged_format1_header_is_quarantined_not_deleted(tmp_path):
    path = str(tmp_path / "q")
    _make(path)
    seg1 = os.path.join(path, f"{NAME}.0000000000000001.seg")
    with open(seg1, "r+b") as fh:
        fh.seek(20)
        fh.write(b"\xff")  # inside the CRC-covered static header
    rep = upgrade(path)
    assert [p for p, _why in rep.quarantined] == [seg1 + ".quarantined"]
    assert os.path.exists(seg1 + ".quarantined")
    with open_queue(path) as q:
        assert drain(q) == ["r3", "r4"]


def test_verify_and_upgrade_speak_plainly_of_a_format1_queue(tmp_path):
    # verify reports an older format as such (no damage, no repair promised that the open will
    # not make), and upgrade of a queue name that is not there says so.
    path = str(tmp_path / "q")
    _make(path)
    before = snapshot(path)

    def ringq(*args):
        return subprocess.run([sys.executable, "-m", "ringq", "-d", path, *args],
                              capture_output=True, text=True, timeout=120)

    out = ringq("-q", NAME, "verify")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ringq upgrade" in out.stdout and "DAMAGE" not in out.stdout and "copies the intact" not in out.stdout
    missing = subprocess.run([sys.executable, "-m", "ringq", "upgrade", path, "--queue", "nosuch"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no queue 'nosuch'" in missing.stderr, missing.stdout + missing.stderr
    assert {k: v for k, v in snapshot(path).items() if k != f"{NAME}.lock"} == before
