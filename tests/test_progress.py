"""Live worker progress: drawn on a real terminal (a pseudo-terminal), absent when piped."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest
from procs import child_env

from ringq import Queue
from ringq.worker.progress import progress_text

pytest.importorskip("rich")

HANDLER = """
def run(job):
    if job.payload.get("fail"):
        raise RuntimeError("no")
"""


def work_cmd(qdir: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ringq",
        "--dir",
        qdir,
        "work",
        "handler:run",
        "--idle-timeout",
        "1",
    ]


def fill(qdir: str) -> None:
    q = Queue(qdir)
    q.enqueue_many([{"n": i} for i in range(20)])
    q.enqueue({"fail": True}, max_attempts=1)
    q.close()


def test_progress_on_a_terminal(qdir, tmp_path):
    fill(qdir)
    (tmp_path / "handler.py").write_text(HANDLER)
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        work_cmd(qdir),
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        cwd=tmp_path,
        env={**child_env(), "COLUMNS": "120", "TERM": "xterm"},
    )
    os.close(secondary)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(primary)
    assert proc.wait(30) == 0
    text = out.decode("utf-8", "replace")
    assert "done 20  failed 1 (dead 1)  in flight 0" in text, text
    assert "jobs/s" in text


def test_no_progress_when_piped(qdir, tmp_path):
    fill(qdir)
    (tmp_path / "handler.py").write_text(HANDLER)
    res = subprocess.run(
        work_cmd(qdir), capture_output=True, text=True, cwd=tmp_path, env=child_env(), timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "jobs/s" not in res.stdout + res.stderr
    assert "\x1b" not in res.stdout + res.stderr
    assert "succeeded=20" in res.stdout


def test_progress_text():
    st = {"leased": 12, "succeeded": 9, "failed": 2, "dead": 1, "lost_leases": 0}
    assert (
        progress_text(st, 3.25, 3725)
        == "done 9  failed 2 (dead 1)  in flight 1  3.2 jobs/s  1:02:05"
    )
    assert progress_text(st, None, 0).endswith("- jobs/s  0:00:00")
