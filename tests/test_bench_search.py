"""benchmarks/search.py, the run docs/benchmarks.md ("Search") reports, on a small queue: every
query answers with the matches the queue was built to have."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from procs import ROOT, child_env


def test_search_benchmark_runs_small(tmp_path):
    out = tmp_path / "s.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "search.py"),
            "--jobs",
            "5000",
            "--repeat",
            "1",
            "--dir",
            str(tmp_path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["counts"]["total"] == 5000 and doc["counts"]["dead"] == 500
    q = doc["queries"]
    assert q["state=dead"]["matches"] == 500
    assert q["id (one job)"]["matches"] == 1
    assert q["error~'no such text'"]["matches"] == 0
    assert q["error~'DISK FULL'"]["matches"] == 167
    assert all(v["first_page_median_s"] > 0 for v in q.values())
