"""End-to-end throughput of ``ringq.aio`` in one process: trivial jobs per second, submitted from
the loop and run by one async handler, for each durability strategy (docs/aio.md quotes it).

    python benchmarks/aio_throughput.py [--jobs N] [--rounds R] [--dir DIR]

Each round submits N jobs (``submit`` from the loop, as a burst) and waits until the handler has
run N times and the last job is DONE (its result stored);
a figure is jobs / seconds of a round, median of R rounds per strategy, with the rounds of the two
strategies interleaved.  Prints one JSON object: the figures, the load average and the versions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from ringq.aio import Queue, Status


async def _round(queue: Queue, n: int, ran: list[int], all_ran: asyncio.Event) -> float:
    ran[0], ran[1] = 0, n
    all_ran.clear()
    t0 = time.perf_counter()
    ids = [queue.submit("noop", {"n": i}) for i in range(n)]
    last = ids[-1]
    await all_ran.wait()  # the handler ran n times; then the last result is stored and acked
    while True:
        job = queue.get(last)
        if job is not None and job.status is Status.DONE:
            break
        await asyncio.sleep(0)
    secs = time.perf_counter() - t0
    assert all(queue.get(i).status is Status.DONE for i in ids)
    return n / secs


async def _measure(root: str, strategies: list[str], n: int, rounds: int) -> dict[str, list[float]]:
    queues = {}
    ran = [0, 0]  # handler calls this round, and how many the round waits for
    all_ran = asyncio.Event()
    for s in strategies:
        q = Queue(tempfile.mkdtemp(prefix=f"aio-{s}-", dir=root), durability=s)

        @q.handler("noop")
        async def noop(job):  # noqa: ARG001 - a trivial job
            ran[0] += 1
            if ran[0] == ran[1]:
                all_ran.set()

        await q.open()
        queues[s] = q
    out: dict[str, list[float]] = {s: [] for s in strategies}
    try:
        for r in range(rounds):
            for s in strategies[r % len(strategies) :] + strategies[: r % len(strategies)]:
                out[s].append(await _round(queues[s], n, ran, all_ran))
    finally:
        for q in queues.values():
            await q.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2000, help="jobs per round (default 2000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds per strategy (default 5)")
    p.add_argument("--dir", help="scratch directory (default: a temporary one)")
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="ringq-aio-bench-", dir=args.dir)
    load0 = os.getloadavg()
    runs = asyncio.run(_measure(root, ["msync", "none"], args.jobs, args.rounds))
    import ringq

    print(
        json.dumps(
            {
                "jobs_per_round": args.jobs,
                "rounds": args.rounds,
                "jobs_per_s_median": {s: round(statistics.median(v)) for s, v in runs.items()},
                "jobs_per_s_rounds": {s: [round(x) for x in v] for s, v in runs.items()},
                "loadavg_start_end": [load0, os.getloadavg()],
                "python": platform.python_version(),
                "ringq": ringq.__version__,
                "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=1,
        )
    )
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
