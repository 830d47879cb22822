"""Where the fan-out row's latency goes, through the public API only (docs/benchmarks.md).

    python benchmarks/fanout_parts.py [--jobs N] [--dir DIR]

The set-up of the harness's fan-out row (ringq/bench/harness.py): a producer process enqueues one
job about every millisecond (``durability="none"``) carrying ``time.monotonic_ns()`` taken just
before its ``enqueue``; one consumer process blocked in ``lease_one(wait=5)`` reads the payload,
stamps and acks.  Printed, as p50 in µs over ``N`` jobs:

* the producer's ``enqueue`` call between two sleeps (``cold``), and the same call in a tight
  loop of 2,000 on another queue (``hot``): what the millisecond's sleep costs the producer;
* for the consumer, from the producer's stamp to ``lease_one`` returning, and from there to the
  payload decoded (the row's end).

The consumer's wake-up happens inside the producer's call, at its end (the C append publishes and
then wakes).  Last, how long after the producer's ``enqueue`` returned the consumer's
``lease_one`` returned (p1, p10, p50, p90), and how many returned before it: on the project
machine the woken consumer runs only once the producer's call is over, so the whole ``cold`` call
is on the row's critical path.  And on how many wake-ups the consumer ran on the vCPU the
producer's ``enqueue`` returned on (``sched_getcpu``).
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from typing import Any

from ringq import Queue

PAYLOAD_PAD = "x" * 40
_getcpu = ctypes.CDLL(None).sched_getcpu  # the vCPU the calling thread runs on


def _consumer(path: str, ready: Any, out: Any) -> None:
    q = Queue(path, durability="none")
    got: list[tuple[int, int, int, int]] = []
    ready.set()
    while True:
        job = q.lease_one(wait=5.0)
        leased = time.monotonic_ns()
        cpu = _getcpu()
        if job is None:
            break
        t = job.payload["t"]
        decoded = time.monotonic_ns()
        q.ack(job)
        if t is None:  # the stop message
            break
        got.append((t, leased, decoded, cpu))
    out.send(got)
    q.close()


def _p50_us(xs: list[int]) -> float:
    return statistics.median(xs) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="fanout-parts-", dir=args.dir)
    try:
        hot_q = Queue(f"{scratch}/hot", durability="none")
        hot = []
        for _ in range(2000):
            t = time.monotonic_ns()
            hot_q.enqueue({"t": t, "pad": PAYLOAD_PAD})
            hot.append(time.monotonic_ns() - t)
        hot_q.close()

        path = f"{scratch}/fan"
        q = Queue(path, durability="none")
        ctx = mp.get_context("fork")
        ready = ctx.Event()
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_consumer, args=(path, ready, w))
        p.start()
        if not ready.wait(10):
            raise SystemExit("the consumer did not start")
        time.sleep(0.05)
        cold = []
        returned = {}
        cpus = {}
        for _ in range(args.jobs):
            time.sleep(0.0008 + (time.monotonic_ns() % 400) / 1e6)
            t = time.monotonic_ns()
            q.enqueue({"t": t, "pad": PAYLOAD_PAD})
            returned[t] = time.monotonic_ns()
            cpus[t] = _getcpu()
            cold.append(returned[t] - t)
        q.enqueue({"t": None})
        got = r.recv()
        p.join(10)
        q.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"producer enqueue call: cold p50 {_p50_us(cold):.1f} µs, hot p50 {_p50_us(hot):.1f} µs")
    print(
        f"consumer: stamp -> lease_one returns p50 {_p50_us([b - a for a, b, _, _ in got]):.1f} µs, "
        f"-> payload decoded {_p50_us([c - b for _, b, c, _ in got]):.1f} µs, "
        f"whole row p50 {_p50_us([c - a for a, _, c, _ in got]):.1f} µs ({len(got)} jobs)"
    )
    after = sorted(b - returned[a] for a, b, _, _ in got if a in returned)
    print(
        "lease_one returns after the producer's enqueue returned: "
        + ", ".join(f"p{p} {after[len(after) * p // 100] / 1000:.1f} µs" for p in (1, 10, 50, 90))
        + f" ({sum(x < 0 for x in after)} of {len(after)} before it)"
    )
    same = sum(1 for a, _, _, cpu in got if cpus.get(a) == cpu)
    print(f"consumer woken on the vCPU the producer's enqueue returned on: {same} of {len(got)}")


if __name__ == "__main__":
    main()
