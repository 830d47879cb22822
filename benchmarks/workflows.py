"""The cost of a dependency (docs/benchmarks.md, "Workflows"; docs/workflows.md).

    python benchmarks/workflows.py --jobs 2000 --rounds 7 --out docs/benchmarks/workflows-run1.json

Each round measures, on fresh queues in a temporary directory (on ``--dir``'s file system if
given), in an order that rotates from round to round so that no row always runs first:

* ``enqueue``: a plain ``enqueue`` per call (the baseline);
* ``enqueue, one parent``: ``enqueue(..., depends_on=[parent])``, each job its own (pending)
  parent's dependent;
* ``lease_one+ack``: lease and ack of a plain job (the baseline);
* ``lease_one+ack, releases one``: lease and ack of a parent whose one dependent the ack
  releases (checked: every dependent ready afterwards);
* ``lease_one+ack, one of 10,000 parents``: the parents of one batch callback (released once,
  after the last: checked).

All with ``--durability`` (default ``none``: the work of the dependency itself, no sync on the
path).  Prints one JSON document (and writes it to ``--out``): per row the median and the worst
of the rounds' microseconds per job, and the ratio of each row's median to its baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

from ringq import JobState, Queue

FANIN = 10_000


def enqueue_plain(d: str, n: int, durability: str) -> float:
    with Queue(d, durability=durability) as q:
        q.stats()  # the reader opened, as the other row's first dependent opens it: not timed
        t = time.perf_counter()
        for i in range(n):
            q.enqueue(i)
        return time.perf_counter() - t


def enqueue_one_parent(d: str, n: int, durability: str) -> float:
    with Queue(d, durability=durability) as q:
        parents = q.enqueue_many(list(range(n)))
        q.stats()  # a dependent's enqueue reads the queue: the reader's first open is not timed
        t = time.perf_counter()
        for p in parents:
            q.enqueue(p.id, depends_on=[p])
        return time.perf_counter() - t


def _drain(q: Queue, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        q.ack(q.lease_one())
    return time.perf_counter() - t


def ack_plain(d: str, n: int, durability: str) -> float:
    with Queue(d, durability=durability) as q:
        q.enqueue_many(list(range(n)))
        return _drain(q, n)


def ack_releases_one(d: str, n: int, durability: str) -> float:
    with Queue(d, durability=durability) as q:
        parents = q.enqueue_many(list(range(n)), priority=1)  # leased before their dependents
        for p in parents:
            q.enqueue(p.id, depends_on=[p])
        took = _drain(q, n)
        st = q.stats()
        assert (st.deferred, st.ready) == (0, n), st
        return took


def ack_fan_in(d: str, n: int, durability: str) -> float:
    with Queue(d, durability=durability) as q:
        parents = q.enqueue_many(list(range(FANIN)), priority=1)
        cb = q.enqueue("callback", depends_on=parents, allow_failure=True)
        q.ack(q.lease_one())  # the first lease opens the reader: not timed
        rest = FANIN - 1 - n
        for _ in range(rest):
            q.ack(q.lease_one())
        took = _drain(q, n)  # the last n parents, the release among them
        assert q.get(cb.id).state is JobState.READY
        return took


ROWS: dict[str, tuple[Callable[[str, int, str], float], str | None]] = {
    "enqueue": (enqueue_plain, None),
    "enqueue, one parent": (enqueue_one_parent, "enqueue"),
    "lease_one+ack": (ack_plain, None),
    "lease_one+ack, releases one": (ack_releases_one, "lease_one+ack"),
    f"lease_one+ack, one of {FANIN:,} parents": (ack_fan_in, "lease_one+ack"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="jobs timed per row and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--durability", default="none")
    ap.add_argument("--dir", help="scratch queues go under this directory")
    ap.add_argument("--out", help="also write the JSON document here")
    args = ap.parse_args()
    if not 1 <= args.jobs < FANIN:
        ap.error(f"--jobs must be in 1..{FANIN - 1}")
    names = list(ROWS)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            d = tempfile.mkdtemp(prefix="ringq-wf-", dir=args.dir)
            try:
                took = ROWS[name][0](os.path.join(d, "q"), args.jobs, args.durability)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            times[name].append(took / args.jobs * 1e6)
    rows = {}
    for name in names:
        med = statistics.median(times[name])
        base = ROWS[name][1]
        rows[name] = {
            "us_per_job_median": round(med, 2),
            "us_per_job_worst": round(max(times[name]), 2),
            "vs_baseline": None if base is None else round(med / statistics.median(times[base]), 2),
        }
    doc = {
        "jobs": args.jobs,
        "rounds": args.rounds,
        "durability": args.durability,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
