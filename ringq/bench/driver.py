"""``ringq bench``: the command line of the harness (scenarios, sizes, output)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .harness import (
    BATCH,
    FLOOR,
    MMAP_STORE,
    SIZES,
    Row,
    Sizes,
    cold_open,
    environment,
    fanout,
    loadavg,
    markdown,
    plots,
    producer_processes,
    raw_floor,
    single_producer,
)

# -- driver ----------------------------------------------------------------------------------------

SCENARIOS = ("floor", "single", "processes", "peers", "fanout", "cold", "consume")


def sized(n: int) -> Sizes:
    """The sizes of ``--jobs N``: N operations per figure; enough ``enqueue_many`` calls of
    ``BATCH`` jobs for N jobs (one at least); interleaved in 4 rounds from 400 operations up."""
    return Sizes(
        ops=n,
        batches=max(1, n // BATCH),
        fanout=n,
        cold=n,
        floor=n,
        rounds=4 if n >= 400 else 1,
    )


def row_json(r: Row) -> dict[str, Any]:
    """One row as ``--json`` prints it: nobroker's keys (``name``, ``ops``, ``seconds``,
    ``ops_per_sec``, ``usec_per_op``: jobs, and µs per job, of the figure; the last two None for
    a latency-only figure) and ringq's own
    (scenario, system, variant, durable, producers, p50/p99/p99.9 per call in µs, extra)."""
    return {
        "name": f"{r.system}: {r.variant}",
        "ops": r.jobs,
        "seconds": r.seconds,
        "ops_per_sec": r.ops_per_s or None,  # None: a latency-only figure (fan-out, cold open)
        "usec_per_op": 1e6 / r.ops_per_s if r.ops_per_s else None,
        "scenario": r.scenario,
        "system": r.system,
        "variant": r.variant,
        "durable": r.durable,
        "producers": r.producers,
        "p50_us": r.p50_us,
        "p99_us": r.p99_us,
        "p999_us": r.p999_us,
        "extra": r.extra,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ringq bench",
        description="Benchmark ringq's durability strategies against "
        "the raw fdatasync limit and peer queues (docs/benchmarks.md).",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds (CI)")
    size.add_argument(
        "--full", action="store_true", help="the full run of docs/benchmarks.md (minutes)"
    )
    size.add_argument(
        "-n",
        "--jobs",
        type=int,
        metavar="N",
        help="N operations per figure (enqueues, round trips, wake-ups, cold-open jobs): the "
        "short run's scenarios at that size (nobroker's bench flag)",
    )
    p.add_argument(
        "--dir", help="scratch directory on the file system to measure (default: a temp dir)"
    )
    p.add_argument("--out", default="benchmarks/out", help="where results.json and the plots go")
    p.add_argument(
        "--only",
        help=f"comma-separated scenarios out of {','.join(SCENARIOS)} ('peers' adds the "
        "peer queues to 'single')",
    )
    p.add_argument("--peers", action="store_true", help="include peer queues in the short run")
    p.add_argument("--no-peers", action="store_true", help="skip peer queues")
    p.add_argument(
        "--cold-jobs", type=int, help="pending jobs for cold open / memory (overrides the size)"
    )
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print the table as Markdown (it always is; nobroker's bench flag)",
    )
    p.add_argument("--quiet", action="store_true", help="only the table")
    p.add_argument(
        "--replot",
        metavar="RESULTS_JSON",
        help="redraw the table and plots of an earlier run into --out",
    )
    from . import fs, here  # their options live with their code

    fs.add_arguments(p)
    here.add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.replot:
        with open(args.replot, encoding="utf-8") as fh:
            old = json.load(fh)
        rows: list[Row] = [Row(**r) for r in old["rows"]]
        os.makedirs(args.out, exist_ok=True)
        print(markdown(rows, old["floor_ops_per_s"]))
        for p in plots(rows, args.out, old["floor_ops_per_s"], lambda s: print(s, file=sys.stderr)):
            print(f"plot: {p}", file=sys.stderr)
        return 0
    if args.here:
        from . import here

        return here.run(args.here, ops=args.ops, as_json=args.json, quiet=args.quiet)
    mode = "smoke" if args.smoke else "full" if args.full else "short"
    sz = SIZES[mode]
    if args.jobs is not None:
        if args.jobs < 1:
            print("ringq bench: --jobs must be at least 1", file=sys.stderr)
            return 2
        sz = sized(args.jobs)
    if args.fs:
        from . import fs

        return fs.run(args, mode, sz)
    if args.cold_jobs:
        sz = Sizes(**{**asdict(sz), "cold": args.cold_jobs})
    only = set(SCENARIOS if not args.only else args.only.split(","))
    bad = only - set(SCENARIOS)
    if bad:
        print(
            f"ringq bench: unknown scenario(s) {sorted(bad)}; choose from {SCENARIOS}",
            file=sys.stderr,
        )
        return 2
    if args.no_peers or (mode == "short" and not args.peers and not args.only):
        only.discard("peers")  # the short run is ringq alone unless asked
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    os.makedirs(args.out, exist_ok=True)
    own = args.dir is None
    scratch = tempfile.mkdtemp(prefix="ringq-bench-") if own else os.path.abspath(args.dir)
    os.makedirs(scratch, exist_ok=True)
    rows = []
    try:
        env = environment(scratch)
        log(
            f"ringq bench ({mode}) in {scratch} [{env['file_system']}] on {env['cpu']} x{env['cpus']}, "
            f"Linux {env['kernel']}, Python {env['python']}"
        )
        if "floor" in only:
            log("physical limit, and format 1's write path for contrast (not a floor):")
            for kind in (FLOOR, MMAP_STORE):
                rows.append(raw_floor(scratch, sz.floor, "start", kind))
                log(f"  {kind}: {rows[-1].ops_per_s:,.0f}/s")
        if "single" in only:
            rows += single_producer(scratch, sz, log, "peers" in only)
        if "processes" in only:
            rows += producer_processes(scratch, sz, log)
        if "consume" in only:
            from .consume import consume_path, drain

            log("the consume path, per job (interleaved rounds):")
            rows += consume_path(scratch, sz, log, min(sz.cold * 4, 4_000_000))
            log("draining jobs with two worker processes:")
            rows += drain(scratch, sz.ops * 10, max(4, sz.rounds // 4), log)
        if "fanout" in only:
            log("fan-out latency:")
            rows += fanout(scratch, sz, log)
        if "cold" in only:
            log("cold open, stats(), memory:")
            try:
                importlib.import_module("nobroker")
                nb = "peers" in only or mode != "short"
            except ImportError:
                log(
                    "  skipped nobroker cold open: nobroker is not installed (pip install nobroker==0.1.2)"
                )
                nb = False
            rows += cold_open(scratch, sz, log, nb and not args.no_peers)
        if "floor" in only:
            for kind in (FLOOR, MMAP_STORE):
                rows.append(raw_floor(scratch, sz.floor, "end", kind))
                log(f"  {kind} (end of run): {rows[-1].ops_per_s:,.0f}/s")
    finally:
        if own:
            shutil.rmtree(scratch, ignore_errors=True)
    floors = [r.ops_per_s for r in rows if r.scenario == "floor" and r.system == FLOOR]
    floor = sum(floors) / len(floors) if floors else None
    table = markdown(rows, floor)
    print(json.dumps([row_json(r) for r in rows], indent=1) if args.json else table)
    env["loadavg_at_end"] = loadavg()
    result = {
        "mode": mode,
        "sizes": asdict(sz),
        "env": env,
        "floor_ops_per_s": floor,
        "rows": [asdict(r) for r in rows],
    }
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as fh:
        fh.write(table + "\n")
    if not args.no_plots:
        for p in plots(rows, args.out, floor, log):
            log(f"plot: {p}")
    log(f"raw figures and environment: {os.path.join(args.out, 'results.json')}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
