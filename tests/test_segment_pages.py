"""benchmarks/segment_pages.py (ringq's enqueue next to the floor, with and without the new
segment's pages in the page cache; docs/benchmarks.md, "Why format 2") still runs.  Tiny N: this
checks that the script works, never a figure."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_prints_the_three_contestants_and_cleans_up(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "segment_pages.py"),
            "--dir",
            str(tmp_path),
            "-n",
            "60",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    rows = [line.split()[0:2] for line in res.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ["floor", "ringq", "ringq"]  # "ringq evicted" splits in two
    assert "evicted" in res.stdout.splitlines()[3]
    assert os.listdir(tmp_path) == []


def test_refuses_a_count_that_would_rotate(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "segment_pages.py"),
            "--dir",
            str(tmp_path),
            "-n",
            "20000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "-n must be" in res.stderr
