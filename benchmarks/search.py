"""Search over a large queue: how long one page of ``Queue.search`` takes (docs/benchmarks.md,
"Search").

    python benchmarks/search.py --jobs 1000000 --out docs/benchmarks/search-run1.json

builds a queue of ``--jobs`` jobs in a temporary directory (on ``--dir``'s file system if given):
priorities 0, 1 and 9, a tenth of the waiting ones keyed (``tenant-0`` .. ``tenant-99``), a tenth
dead-lettered with one of a few error texts that also name the job; then times each query of
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

from ringq import Job, JobState, Queue

ERRORS = ["OSError: disk full", "ValueError: bad header in", "TimeoutError: upstream slow for"]
QUERIES = {
    "state=dead": {"state": "dead"},
    "state=ready": {"state": "ready"},
    "priority=9": {"priority": 9},
    "key=tenant-42": {"key": "tenant-42"},
    "error~'DISK FULL'": {"error": "DISK FULL"},
    "state=dead, error~'upstream', priority=9": {
        "state": "dead",
        "error": "upstream",
        "priority": 9,
    },
    "id (one job)": None,  # filled in: an id in the middle of the queue
    "error~'no such text'": {"error": "no such text"},
}


def build(qdir: str, jobs: int, batch: int = 10_000) -> dict[str, int]:
    """Nine tenths enqueued (a tenth of those keyed), one tenth imported dead with an error text
    (as a dead job after one failed attempt: its record in the dead-letter queue, the text in the
    error side file).  Import writes each text once; nacking them one by one would also read the
    side file back for each nack's snapshot, which only makes the build slow."""
    dead_n = jobs // 10
    live_n = jobs - dead_n
    with Queue(qdir, durability="none", max_attempts=1) as q:
        for start in range(0, live_n, batch):
            n = min(batch, live_n - start)
            keyed = n // 10
            plain = [{"i": start + i} for i in range(n - keyed)]
            q.enqueue_many(plain[: len(plain) // 2], priority=0)
            q.enqueue_many(plain[len(plain) // 2 :], priority=1 if start % 20_000 else 9)
            for t in range(10):  # ten keys per batch, a hundred keys in all
                q.enqueue_many(
                    [{"k": start + t}] * (keyed // 10),
                    key=f"tenant-{(start // batch * 10 + t) % 100}",
                )
        for start in range(0, dead_n, batch):
            n = min(batch, dead_n - start)
            q.import_jobs(
                [
                    Job(
                        id=f"dead-{start + i}",
                        payload={"d": start + i},
                        priority=(0, 1, 9)[(start + i) % 3],
                        state=JobState.DEAD,
                        attempts=1,
                        max_attempts=1,
                        last_error=f"{ERRORS[(start + i) % 3]} job dead-{start + i}",
                    )
                    for i in range(n)
                ]
            )
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
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
            "host": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "machine": platform.machine(),
            },
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
