"""Durable one-per-call enqueue of ringq next to the raw pwrite+fdatasync floor, with the queue's
segment as ringq creates it and with the same segment's pages dropped from the page cache.

Why: ``benchmarks/pagecost.c`` shows that on Linux 6.18 / ext4 a sync after a store through a
writable mapping writes back about as many bytes as the writes that zero-filled the file (ringq
fills a new segment with 1 MiB writes), unless the pages were dropped from the page cache and came
back through page faults.  This script checks what that means for ringq itself.

Three contestants in one interleaved loop (chunks of 50 operations, rotating order):

* ``floor``: 128-byte ``pwrite`` + ``fdatasync`` into a zero-filled file;
* ``ringq``: ``Queue.enqueue`` with the default ``durability="msync"`` into a new queue;
* ``ringq evicted``: the same, but the queue was closed after creation, its segment files' pages
  dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)``, and the queue opened again.

Usage: ``python benchmarks/segment_pages.py [--dir DIR] [-n N]`` (DIR on the file system to
measure; default a temporary directory under the current one; N below the segment's 16,384
slots, so that no rotation creates a fresh segment mid-run).  Prints ops/s, p50 latency, the
ratios to the floor and the KiB the block device wrote per operation.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time

from ringq import Queue

PAYLOAD = {"n": 1, "kind": "resize", "path": "/srv/images/00000001.jpg", "w": 640}
CHUNK = 50


def _sectors_written(path: str) -> int | None:
    """Sectors written by the block device holding ``path`` (all processes), or None."""
    dev = os.stat(path).st_dev
    try:
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") as fh:
            return int(fh.read().split()[6])
    except (OSError, IndexError, ValueError):
        return None


def _evicted_queue(path: str) -> Queue:
    Queue(path).close()
    for seg in glob.glob(os.path.join(path, "*.seg")):
        fd = os.open(seg, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return Queue(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dir", help="directory on the file system to measure (default: a temp dir here)"
    )
    ap.add_argument("-n", type=int, default=3000, help="operations per contestant (default 3000)")
    args = ap.parse_args(argv)
    if not 0 < args.n < 16384:
        ap.error("-n must be between 1 and 16383 (one segment, no rotation)")
    base = tempfile.mkdtemp(prefix="segment-pages.", dir=args.dir or ".")
    try:
        plain = Queue(os.path.join(base, "plain"))
        evicted = _evicted_queue(os.path.join(base, "evicted"))
        fd = os.open(os.path.join(base, "floor.dat"), os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, bytes(max(args.n * 128, 1 << 20)), 0)
        os.fsync(fd)
        rec = b"r" * 128

        def floor(i: int) -> None:
            os.pwrite(fd, rec, i * 128)
            os.fdatasync(fd)

        ops = {
            "floor": floor,
            "ringq": lambda i: plain.enqueue(PAYLOAD),
            "ringq evicted": lambda i: evicted.enqueue(PAYLOAD),
        }
        names = list(ops)
        lat: dict[str, list[float]] = {k: [] for k in names}
        sectors: dict[str, int] = dict.fromkeys(names, 0)
        for c, start in enumerate(range(0, args.n, CHUNK)):
            for j in range(len(names)):
                name = names[(c + j) % len(names)]
                op, out = ops[name], lat[name]
                s0 = _sectors_written(base)
                for i in range(start, min(start + CHUNK, args.n)):
                    t = time.perf_counter()
                    op(i)
                    out.append(time.perf_counter() - t)
                s1 = _sectors_written(base)
                if s0 is not None and s1 is not None:
                    sectors[name] += s1 - s0
        plain.close()
        evicted.close()
        os.close(fd)
        f_ops = args.n / sum(lat["floor"])
        f_p50 = statistics.median(lat["floor"])
        print(
            f"{'contestant':14} {'ops/s':>8} {'p50 us':>8} {'x floor':>8} {'p50 x':>7} {'KiB/op':>7}"
        )
        for name in names:
            ops_s = args.n / sum(lat[name])
            p50 = statistics.median(lat[name])
            kib = sectors[name] * 512 / 1024 / args.n
            print(
                f"{name:14} {ops_s:8.0f} {p50 * 1e6:8.1f} {ops_s / f_ops:8.2f} {f_p50 / p50:7.2f} {kib:7.0f}"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
