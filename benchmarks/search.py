"""Search over a large queue: how long one page of ``Queue.search`` takes (docs/benchmarks.md,
"Search").

    python benchmarks/search.py --jobs 1000000 --out docs/benchmarks/search-run1.json

builds a queue of ``--jobs`` jobs in a temporary directory (on ``--dir``'s file system if given):
priorities 0, 1 and 9, a tenth of them keyed (``tenant-0`` .. ``tenant-99``), a tenth failed once
and dead-lettered with one of a few error texts that also name the job; then times each query of
QUERIES, one page of 50 and the next page, ``--repeat`` times, in a fresh process's open queue.
Prints one JSON document (and writes it to ``--out``): the queue's counts and, per query, the
total matches and the median and worst seconds of a page.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from ringq import Queue

ERRORS = ["OSError: disk full", "ValueError: bad header in", "TimeoutError: upstream slow for"]
QUERIES = {
    "state=dead": {"state": "dead"},
    "state=ready": {"state": "ready"},
    "priority=9": {"priority": 9},
    "key=tenant-42": {"key": "tenant-42"},
    "error~'DISK FULL'": {"error": "DISK FULL"},
    "state=dead, error~'upstream', priority=9": {"state": "dead", "error": "upstream", "priority": 9},
    "id (one job)": None,  # filled in: an id in the middle of the queue
    "error~'no such text'": {"error": "no such text"},
}


def build(qdir: str, jobs: int, batch: int = 10_000) -> dict[str, int]:
    with Queue(qdir, durability="none", max_attempts=1) as q:
        for start in range(0, jobs, batch):
            n = min(batch, jobs - start)
            plain = [{"i": start + i} for i in range(n) if (start + i) % 10]
            q.enqueue_many(plain[: len(plain) // 2], priority=0)
            q.enqueue_many(plain[len(plain) // 2 :], priority=1 if start % 20_000 else 9)
            for t in range(0, 10):  # a tenth keyed, in ten keys per batch
                q.enqueue_many(
                    [{"k": start + t}] * (n // 100), key=f"tenant-{(start // batch * 10 + t) % 100}"
                )
        failed = 0
        while failed < jobs // 10:
            got = q.lease(min(1000, jobs // 10 - failed))
            if not got:
                break
            for job in got:
                q.nack(job, error=f"{ERRORS[failed % 3]} job {job.id}")
                failed += 1
        return q.stats().to_dict()


def measure(qdir: str, repeat: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    with Queue(qdir) as q:
        middle = q.search(state="dead", limit=None).jobs
        QUERIES["id (one job)"] = {"job_id": middle[len(middle) // 2].id}
        for name, filters in QUERIES.items():
            firsts, seconds, total = [], [], 0
            for _ in range(repeat):
                t = time.perf_counter()
                page = q.search(**filters, limit=50)
                firsts.append(time.perf_counter() - t)
                total = page.total
                if page.next is not None:
                    t = time.perf_counter()
                    q.search(**filters, limit=50, after=page.next)
                    seconds.append(time.perf_counter() - t)
            out[name] = {
                "matches": total,
                "first_page_median_s": statistics.median(firsts),
                "first_page_worst_s": max(firsts),
                "next_page_median_s": statistics.median(seconds) if seconds else None,
            }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dir", help="build the queue under this directory (default: a temporary one)")
    p.add_argument("--out", help="also write the JSON document here")
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        t = time.perf_counter()
        counts = build(os.path.join(root, "q"), args.jobs)
        built = time.perf_counter() - t
        doc = {
            "jobs": args.jobs,
            "counts": counts,
            "build_s": built,
            "host": {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()},
            "queries": measure(os.path.join(root, "q"), args.repeat),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
