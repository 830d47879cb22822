"""The benchmark harness runs end to end at tiny sizes, with and without its optional peers, so
that it never rots.  Nothing here judges a figure: the full run is manual (benchmarks/README.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BLOCK_OPTIONAL = """
import sys
class _Block:
    names = {"nobroker", "persistqueue", "litequeue", "redis", "faster_fifo", "matplotlib"}
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"{name} blocked by the smoke test")
        return None
sys.meta_path.insert(0, _Block())
from ringq.bench import main
sys.exit(main(sys.argv[1:]))
"""


def _run(tmp_path, *args: str, block: bool = False) -> subprocess.CompletedProcess:
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    code = BLOCK_OPTIONAL if block else "import sys; from ringq.bench import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code, "--smoke", "--out", str(out), "--dir", str(scratch), *args],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def test_smoke_run_writes_table_json_and_environment(tmp_path):
    res = _run(tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| scenario | system |" in res.stdout
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["mode"] == "smoke"
    env = data["env"]
    for key in ("cpu", "kernel", "file_system", "python", "versions"):
        assert key in env
    scenarios = {r["scenario"] for r in data["rows"]}
    assert {"floor", "single", "processes", "fanout", "cold-open"} <= scenarios
    strategies = {f"ringq {s}" for s in ("none", "msync", "fdatasync", "group", "interval")}
    for scenario in ("single", "processes"):
        rows = [r for r in data["rows"] if r["scenario"] == scenario and r["variant"] == "enqueue x1"]
        assert {r["system"] for r in rows} >= strategies
    assert {r["producers"] for r in data["rows"] if r["scenario"] == "processes"} == {1, 4}
    leases = {r["system"] for r in data["rows"] if r["variant"] == "lease_one+ack"}
    assert {"ringq none", "ringq msync (default)", "ringq msync, sync_acks"} <= leases
    assert data["floor_ops_per_s"] > 0
    cold = next(r for r in data["rows"] if r["scenario"] == "cold-open" and r["system"] == "ringq")
    assert cold["extra"]["leased"] and cold["extra"]["stats_total"] == 2000
    # Scratch data lives in --dir, never in the working directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "scratch"]


def test_smoke_run_without_peers_or_matplotlib_says_what_it_skipped(tmp_path):
    res = _run(tmp_path, "--only", "floor,single,peers,fanout,processes", block=True)
    assert res.returncode == 0, res.stderr[-3000:]
    for line in ("skipped nobroker: nobroker is not installed", "skipped redis: redis is not installed",
                 "skipped faster-fifo fan-out", "no plots: matplotlib is not installed"):
        assert line in res.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    peers = {r["system"] for r in data["rows"] if r["scenario"] == "single" and not r["system"].startswith("ringq")}
    assert peers == {"sqlite3 WAL synchronous=FULL", "sqlite3 WAL synchronous=NORMAL"}  # stdlib only
    assert not list((tmp_path / "out").glob("*.png"))


def test_unknown_scenario_is_a_usage_error(tmp_path):
    res = _run(tmp_path, "--only", "everything")
    assert res.returncode == 2
    assert "unknown scenario" in res.stderr


def test_bytecode_counts_of_the_consume_path_run_and_name_the_functions(tmp_path):
    # The by-function counts docs/benchmarks.md cites: they come from the script as it is.
    script = os.path.join(ROOT, "benchmarks", "instructions.py")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([sys.executable, script, "--bytecodes", "lease_one", "enqueue_many"],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "lease_one: " in res.stdout and "enqueue_many: " in res.stdout
    # lease_one's fast path (Index.take_top) is what its loop runs, as docs/benchmarks.md says.
    assert "engine/index.py" in res.stdout and " take_top" in res.stdout
    bad = subprocess.run([sys.executable, script, "--bytecodes", "fanout"],
                         capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert bad.returncode != 0 and "fanout" in bad.stderr


def test_the_fan_out_parts_script_runs_and_prints_each_part(tmp_path):
    # The figures docs/benchmarks.md cites for the fan-out's critical path come from it as it is.
    script = os.path.join(ROOT, "benchmarks", "fanout_parts.py")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([sys.executable, script, "--jobs", "20", "--consumers", "2",
                          "--dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ringq: producer enqueue call: cold p50" in res.stdout and "hot p50" in res.stdout
    assert "ringq: consumer: stamp -> job in hand" in res.stdout
    # Every job but each consumer's first three (warm-up), whichever consumer leased it.
    counted = re.search(r"ringq: consumer: .*\((\d+) jobs\)", res.stdout)
    assert counted is not None and 20 - 2 * 3 <= int(counted.group(1)) <= 20 - 3
    assert "ringq: CPU time of the consumer processes per job" in res.stdout
    try:
        import faster_fifo  # noqa: F401
    except ImportError:
        assert "faster-fifo: not installed" in res.stdout
    else:
        assert "faster-fifo: producer put call: cold p50" in res.stdout
    assert os.listdir(tmp_path) == []  # its scratch queues are removed
