"""``ringq bench --here DIR``: what each durability strategy promises and costs on the user's own disk.

A short run (well under a minute) in a scratch directory made inside ``DIR`` and removed afterwards:
the raw floor, format 1's write path for contrast, and every strategy, interleaved exactly as the full harness does
(``single_producer``), then for each strategy its promise (ringq/bench/promises.py, the wording of
docs/durability.md), its throughput, p50 and p99 per call, and its ratio to this disk's raw
``pwrite`` + ``fdatasync`` floor; last, the cheapest strategy for each promise a user chooses by.

The number of operations per row is sized from a quick probe of the floor so that the run stays
under a minute on slow disks too (``--ops`` overrides it; the smoke test uses ``--ops 200``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, overload

from .harness import FLOOR, MMAP_STORE, Row, Sizes, environment, raw_floor, single_producer
from .promises import GOALS, PROMISES

__all__ = ["add_arguments", "run", "measure", "summarize", "text_report", "TIE"]

#: Two strategies whose throughputs differ by less than this fraction are called a tie: a short
#: run on a shared disk does not separate them (docs/benchmarks.md shows ±30% between full runs).
TIE = 0.10
#: Seconds of syncs the sized run aims for; queue creation and the CPU-bound rows come on top.
SYNC_BUDGET_S = 20.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--here DIR [--json] [--ops N]`` on the harness's parser."""
    p.add_argument(
        "--here",
        metavar="DIR",
        help="short run on DIR: what each strategy promises and costs there, "
        "and the cheapest for each promise (under a minute)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON instead of the table (with --here: its report as one "
        "object; else the rows, each with nobroker's keys name, ops, seconds, ops_per_sec, "
        "usec_per_op)",
    )
    p.add_argument(
        "--ops",
        type=int,
        help="with --here: operations per row (default: sized from a probe of the "
        "disk so the run stays under a minute)",
    )


def _ops_for(probe_per_s: float) -> int:
    """Operations per row so that the durable rows fit in ``SYNC_BUDGET_S``.

    Six rows sync once per call (the floor, the contrast row, msync, fdatasync, group, the
    sync_acks ack); the mapped ones can cost twice the probe's pwrite+fdatasync
    (docs/benchmarks.md), hence 8.
    """
    return max(50, min(3000, int(probe_per_s * SYNC_BUDGET_S / 8)))


def measure(
    scratch: str, ops: int | None, log: Callable[[str], None]
) -> tuple[list[Row], int, int]:
    """Run the floor, the contrast row and every strategy in ``scratch``; returns (rows, ops per
    row, rounds)."""
    if ops is None:
        probe = raw_floor(scratch, 50, "probe")
        ops = _ops_for(probe.ops_per_s)
        log(f"probe: raw pwrite+fdatasync {probe.ops_per_s:,.0f}/s -> {ops} operations per row")
    rounds = 4 if ops >= 200 else 2
    sz = Sizes(ops=ops, batches=2, fanout=0, cold=0, floor=0, rounds=rounds)
    return single_producer(scratch, sz, log, with_peers=False), ops, rounds


def summarize(rows: list[Row]) -> dict[str, Any]:
    """The --here result from measured rows: the floor, the contrast row, each promise's cost,
    the cheapest per goal."""

    def find(system: str, variant: str) -> Row | None:
        return next((r for r in rows if r.system == system and r.variant == variant), None)

    floor = find(FLOOR, "enqueue x1")
    mstore = find(MMAP_STORE, "enqueue x1")
    base = floor.ops_per_s if floor else None

    @overload
    def cost(r: Row) -> dict[str, Any]: ...

    @overload
    def cost(r: Row | None) -> dict[str, Any] | None: ...

    def cost(r: Row | None) -> dict[str, Any] | None:
        if r is None:
            return None
        return {
            "ops_per_s": r.ops_per_s,
            "p50_us": r.p50_us,
            "p99_us": r.p99_us,
            "x_floor": r.ops_per_s / base if base else None,
        }

    strategies = []
    for p in PROMISES:
        c = cost(find(p.label, p.variant))
        if c is not None:
            strategies.append(
                {"strategy": p.strategy, "operation": p.variant, "promise": p.line, **c}
            )
    by = {s["strategy"]: s for s in strategies}
    cheapest = []
    for g in GOALS:
        cands = sorted((by[s] for s in g.strategies if s in by), key=lambda s: -s["ops_per_s"])
        if not cands:
            continue
        best = cands[0]
        ties = [s["strategy"] for s in cands[1:] if s["ops_per_s"] >= best["ops_per_s"] * (1 - TIE)]
        cheapest.append(
            {
                "goal": g.name,
                "strategy": best["strategy"],
                "ops_per_s": best["ops_per_s"],
                "x_floor": best["x_floor"],
                "ties": ties,
            }
        )
    batch = find(
        "ringq msync", next((r.variant for r in rows if r.variant.startswith("enqueue_many")), "")
    )
    return {
        "floors": {FLOOR: cost(floor)},
        # format 1's write path, for contrast: not a floor (format 2 does not write through a
        # mapping, and its msync row can run faster than this loop)
        "contrast": {MMAP_STORE: cost(mstore)},
        "strategies": strategies,
        "cheapest": cheapest,
        "enqueue_many_msync": cost(batch) | {"variant": batch.variant} if batch else None,
    }


def _n(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def text_report(res: dict[str, Any]) -> str:
    """The human-readable report of :func:`run` (``res`` as ``--json`` prints it)."""
    out = [
        f"ringq bench --here {res['dir']}  [{res['file_system']}; {res['ops']} operations per row, "
        f"{res['rounds']} interleaved rounds, {res['seconds']:.0f} s]"
    ]
    rows = [("floor", n, c) for n, c in res["floors"].items()]
    rows += [("contrast", n, c) for n, c in res.get("contrast", {}).items()]
    for what, name, c in rows:
        if c:
            out.append(
                f"{what:8s} {name:24s} {_n(c['ops_per_s']):>9s}/s   p50 {_n(c['p50_us']):>7s} µs   "
                f"p99 {_n(c['p99_us']):>7s} µs   {_n(c['x_floor'])} x floor"
            )
    if res.get("contrast"):
        out.append(
            "  (contrast: a store through a writable shared mapping + msync, as format 1 wrote "
            "records; not a floor: ringq writes records with pwrite)"
        )
    out.append("")
    out.append(
        f"{'strategy':10s} {'measured':14s} {'ops/s':>9s} {'p50 µs':>8s} {'p99 µs':>8s} {'x floor':>8s}"
    )
    for s in res["strategies"]:
        out.append(
            f"{s['strategy']:10s} {s['operation']:14s} {_n(s['ops_per_s']):>9s} {_n(s['p50_us']):>8s} "
            f"{_n(s['p99_us']):>8s} {_n(s['x_floor']):>8s}"
        )
    out.append("")
    out.append("what each promises (docs/durability.md):")
    for s in res["strategies"]:
        out.append(f"  {s['strategy']:10s} {s['promise']}")
    out.append("")
    out.append("cheapest strategy for each promise, on this disk:")
    for c in res["cheapest"]:
        tie = f" (a tie with {', '.join(c['ties'])}: within {TIE:.0%})" if c["ties"] else ""
        out.append(
            f"  {c['goal']}: {c['strategy']} — {_n(c['ops_per_s'])}/s, {_n(c['x_floor'])} x floor{tie}"
        )
    b = res.get("enqueue_many_msync")
    if b:
        out.append(
            f"  (batches: enqueue_many of 1,000 with msync ran {_n(b['ops_per_s'])} jobs/s, "
            f"{_n(b['x_floor'])} x floor: one sync per batch.)"
        )
    out.append(
        "  group shares syncs between concurrent producers; with this run's one producer it costs what msync does."
    )
    return "\n".join(out)


def run(directory: str, ops: int | None = None, as_json: bool = False, quiet: bool = False) -> int:
    """Measure in a scratch directory inside ``directory``; print the report (or JSON) to stdout.

    Returns the exit status: 0, or 2 when ``directory`` is not an existing directory or ``ops``
    is below 1 (said in one line on stderr).
    """
    if not os.path.isdir(directory):
        print(f"ringq bench --here: {directory} is not a directory", file=sys.stderr)
        return 2
    if ops is not None and ops < 1:
        print("ringq bench --here: --ops must be at least 1", file=sys.stderr)
        return 2
    log = (
        (lambda s: None)
        if (quiet or as_json)
        else (lambda s: print(s, file=sys.stderr, flush=True))
    )
    t0 = time.monotonic()
    scratch = tempfile.mkdtemp(prefix=".ringq-bench-here-", dir=directory)
    try:
        env = environment(scratch)
        log(f"measuring in {scratch} [{env['file_system']}]")
        rows, ops, rounds = measure(scratch, ops, log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res = {
        "dir": os.path.abspath(directory),
        "file_system": env["file_system"],
        "mount": env["mount"],
        "ops": ops,
        "rounds": rounds,
        "seconds": time.monotonic() - t0,
        **summarize(rows),
        "env": env,
        "rows": [asdict(r) | {"cdf_us": None} for r in rows],
    }
    print(json.dumps(res, indent=1) if as_json else text_report(res))
    return 0
