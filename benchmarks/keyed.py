"""What keyed jobs cost a reader: opening a queue of them, and leasing past jobs a limit holds back.

    python benchmarks/keyed.py                 # 100,000 keyed jobs, 5,000 held back, 5 rounds
    python benchmarks/keyed.py --jobs 40000 --held 2000 --rounds 3

Two figures, each the median of ``--rounds`` runs in fresh processes (a fresh process is what a
script that opens the queue per job pays):

* **open + first lease** of a queue of ``--jobs`` pending jobs under a key per thousand, one
  key capped at one running job whose slot is taken, so its jobs wait: the reader reads every
  record's key into its lanes, then leases past the held-back key;
* **a lease past held-back jobs**: ``--held`` jobs of one key wait for its cap, a few plain jobs
  behind them; the first ``lease_one`` of a second queue object in a process that has leased
  through a first (what a script that opens a queue object per job pays each time).

Each round copies the same filled queue, so every run starts from the same bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

CHILD_OPEN = """
import sys, time
from ringq import Queue
t = time.perf_counter()
q = Queue(sys.argv[1])
q.lease_one()
print(time.perf_counter() - t)
"""

CHILD_HELD = """
import sys, time
from ringq import Queue
Queue(sys.argv[1]).lease_one()  # imports and the first reader; the filler holds the key's slot
t = time.perf_counter()
Queue(sys.argv[1]).lease_one()
print(time.perf_counter() - t)
"""


def _fill_open(path: str, jobs: int) -> None:
    from ringq import Queue

    q = Queue(path, durability="none")
    q.limit("k0", concurrency=1)
    q.enqueue("running", key="k0", max_attempts=100)
    q.lease_one(visibility_timeout=3600, detach=True)
    for start in range(0, jobs, 1000):
        q.enqueue_many([{"i": start + i} for i in range(1000)], key=f"k{start // 1000}")
    q.close()


def _fill_held(path: str, held: int) -> None:
    from ringq import Queue

    q = Queue(path, durability="none")
    q.limit("k", concurrency=1)
    q.enqueue("running", key="k")
    q.lease_one(visibility_timeout=3600, detach=True)
    q.enqueue_many(list(range(held)), key="k")
    q.enqueue_many(["free"] * 10)
    q.close()


def _run(script: str, path: str) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", script, path], capture_output=True, text=True, check=True
    )
    return [float(x) for x in out.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--held", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="ringq-keyed-")
    try:
        filled_open, filled_held = os.path.join(scratch, "open"), os.path.join(scratch, "held")
        _fill_open(filled_open, args.jobs)
        _fill_held(filled_held, args.held)
        opens, fresh = [], []
        run = os.path.join(scratch, "run")
        for _ in range(args.rounds):
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(filled_open, run)
            opens += _run(CHILD_OPEN, run)
            shutil.rmtree(run)
            shutil.copytree(filled_held, run)
            fresh += _run(CHILD_HELD, run)
        ms = lambda xs: f"{statistics.median(xs) * 1000:.2f} ms"  # noqa: E731
        print(f"open + first lease, {args.jobs:,} keyed jobs: {ms(opens)}")
        print(
            f"first lease of a second queue object past {args.held:,} held-back jobs: {ms(fresh)}"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
