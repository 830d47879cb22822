"""``ringq bench --here DIR``: runs end to end on a temporary directory in a fast mode, and the
promises it prints are the ones docs/durability.md makes.  Nothing here judges a figure."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from ringq.bench.promises import GOALS, PROMISES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "durability.md")


def _plain(cell: str) -> str:
    """A Markdown table cell as text: no code ticks, no emphasis, no quotes around a name."""
    return re.sub(r"\s+", " ", cell.replace("`", "").replace("**", "")).strip().strip('"')


def _strategy_table() -> dict[str, list[str]]:
    """docs/durability.md's strategies table (the one whose header has "an `enqueue` returns
    after"): durability= value -> its other cells."""
    with open(DOC, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    start = next(
        i for i, ln in enumerate(lines) if ln.startswith("|") and "an `enqueue` returns after" in ln
    )
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [_plain(c) for c in line.strip().strip("|").split("|")]
        rows[re.search(r"\w+", cells[0]).group(0)] = cells[1:]
    return rows


def test_promises_are_the_words_of_docs_durability():
    table = _strategy_table()
    enqueue = [p for p in PROMISES if p.variant == "enqueue x1"]
    assert {p.strategy for p in enqueue} == set(table)
    for p in enqueue:
        returns_after, process_crash, power_loss, _window = table[p.strategy]
        assert (p.returns_after, p.process_crash, p.power_loss) == (
            returns_after,
            process_crash,
            power_loss,
        )
    with open(DOC, encoding="utf-8") as fh:
        doc = re.sub(r"\s+", " ", fh.read().replace("`", ""))
    acks = next(p for p in PROMISES if p.strategy == "sync_acks")
    assert acks.power_loss in doc
    assert "no redelivery of acked jobs after a power loss | add sync_acks=True" in doc


def test_goals_follow_from_the_promises():
    enqueue = [p for p in PROMISES if p.variant == "enqueue x1"]
    by_name = {g.name: set(g.strategies) for g in GOALS}
    assert by_name["an enqueue that returned survives power loss"] == {
        p.strategy for p in enqueue if p.power_loss == "survives"
    }
    assert by_name["an enqueue that returned survives a process crash"] == {
        p.strategy for p in enqueue if p.process_crash == "survives"
    }
    assert by_name["a power loss loses at most the last flush_interval of enqueues"] == {
        p.strategy
        for p in enqueue
        if p.power_loss == "survives" or "flush_interval" in p.power_loss
    }
    assert by_name["an acked job is not redelivered after power loss"] == {"sync_acks"}


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
    )


def test_here_json_names_cost_promise_and_cheapest_of_every_strategy(tmp_path):
    res = _run("ringq.bench", "--here", str(tmp_path), "--ops", "200", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)
    assert data["ops"] == 200 and data["file_system"]
    assert {s["strategy"] for s in data["strategies"]} == {p.strategy for p in PROMISES}
    for s in data["strategies"]:
        p = next(p for p in PROMISES if p.strategy == s["strategy"])
        assert s["promise"] == p.line and s["operation"] == p.variant
        assert s["ops_per_s"] > 0 and 0 < s["p50_us"] <= s["p99_us"] and s["x_floor"] > 0
    floor = data["floors"]["raw pwrite+fdatasync"]
    assert floor["ops_per_s"] > 0 and floor["x_floor"] == 1
    assert [c["goal"] for c in data["cheapest"]] == [g.name for g in GOALS]
    for c, g in zip(data["cheapest"], GOALS):
        assert c["strategy"] in g.strategies and set(c["ties"]) <= set(g.strategies)
        cost = next(s["ops_per_s"] for s in data["strategies"] if s["strategy"] == c["strategy"])
        assert cost == max(
            s["ops_per_s"] for s in data["strategies"] if s["strategy"] in g.strategies
        )
    # The scratch directory inside the user's directory is gone.
    assert list(tmp_path.iterdir()) == []


def test_here_through_the_cli_prints_promises_costs_and_the_cheapest(tmp_path):
    res = _run("ringq", "bench", "--here", str(tmp_path), "--ops", "50", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    for p in PROMISES:
        assert p.line in out
    assert "cheapest strategy for each promise, on this disk:" in out
    for g in GOALS:
        assert re.search(
            rf"^  {re.escape(g.name)}: ({'|'.join(g.strategies)}) — [\d,.]+/s", out, re.M
        ), out
    assert list(tmp_path.iterdir()) == []


def test_here_refuses_a_missing_directory_in_one_line(tmp_path):
    res = _run("ringq.bench", "--here", str(tmp_path / "nope"), "--ops", "10", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == f"ringq bench --here: {tmp_path / 'nope'} is not a directory"


def test_cheapest_is_the_fastest_keeper_of_each_promise_and_names_ties():
    from ringq.bench import FLOOR, Row
    from ringq.bench.here import summarize

    def row(system: str, variant: str, ops: float) -> Row:
        return Row(
            "single", system, variant, True, ops_per_s=ops, p50_us=1e6 / ops, p99_us=2e6 / ops
        )

    rows = [
        row(FLOOR, "enqueue x1", 1000.0),
        row("ringq none", "enqueue x1", 9000.0),
        row("ringq msync", "enqueue x1", 600.0),
        row("ringq fdatasync", "enqueue x1", 650.0),
        row("ringq group", "enqueue x1", 500.0),
        row("ringq interval", "enqueue x1", 8500.0),
        row("ringq msync, sync_acks", "lease_one+ack", 400.0),
    ]
    got = {c["goal"]: c for c in summarize(rows)["cheapest"]}
    power = got["an enqueue that returned survives power loss"]
    assert (power["strategy"], power["ties"], power["x_floor"]) == ("fdatasync", ["msync"], 0.65)
    window = got["a power loss loses at most the last flush_interval of enqueues"]
    assert (window["strategy"], window["ties"]) == ("interval", [])
    crash = got["an enqueue that returned survives a process crash"]
    assert (crash["strategy"], crash["ties"]) == ("none", ["interval"])
    assert got["an acked job is not redelivered after power loss"]["strategy"] == "sync_acks"


def test_the_global_json_is_honoured_and_the_mmap_store_is_no_floor(tmp_path, capsys):
    """`ringq --json bench --here DIR` printed text (only `bench --here DIR --json` printed JSON),
    and the report called the raw mmap store+msync loop a floor."""
    from ringq.bench import FLOOR, MMAP_STORE
    from ringq.cli import main

    res = _run("ringq", "--json", "bench", "--here", str(tmp_path), "--ops", "50", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)
    assert set(data["floors"]) == {FLOOR} and set(data["contrast"]) == {MMAP_STORE}
    assert main(["--json", "bench", "--here", str(tmp_path), "--ops", "50"]) == 0
    assert set(json.loads(capsys.readouterr().out)["contrast"]) == {MMAP_STORE}
    text = _run("ringq", "bench", "--here", str(tmp_path), "--ops", "50", cwd=tmp_path).stdout
    assert re.search(rf"^floor +{re.escape(FLOOR)} ", text, re.M)
    assert re.search(rf"^contrast +{re.escape(MMAP_STORE)} ", text, re.M)
    assert not re.search(rf"floor +{re.escape(MMAP_STORE)}", text) and "not a floor" in text
    assert list(tmp_path.iterdir()) == []
