"""The consume path against the interpreter's floor, and worker processes against the standard
library's pool: the rows of docs/benchmarks.md's "consume" set.

* ``consume_path``: per job, in one process, interleaved in rounds (each figure the sum of its
  chunks): the interpreter floor -- the cheapest loop a cffi-based API can run per job: one 64-bit
  load and two CASes through ringq's own helper and one small ``__slots__`` object built --, then
  ``lease_one()`` + ``ack()``, ``lease(100)`` + an ``ack`` per job, and ``consume()`` + an ``ack``
  per job, each on its own queue (default durability: acks are not synced), and the same
  ``lease_one()`` + ``ack()`` with a deep backlog (``deep`` jobs pending).
* ``drain``: ``Worker(processes=2)`` with a no-op handler draining ``n`` pre-enqueued jobs, and
  ``multiprocessing.Pool(2).imap_unordered(noop, range(n), chunksize=1)``, alternately.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .harness import Row, Sizes, payload

__all__ = ["consume_path", "drain", "floor_loop", "FLOOR_LOOP"]

FLOOR_LOOP = "interpreter floor"
ACK_BATCH = 100


class _Item:
    __slots__ = ("slot", "word", "token")

    def __init__(self, slot: int, word: int, token: int) -> None:
        self.slot = slot
        self.word = word
        self.token = token


def floor_loop(n: int) -> Callable[[int], None]:
    """The interpreter floor's loop (see the module) as ``run(k)``, which runs ``k`` jobs."""
    from ringq.engine.native import ffi, lib

    size = 16 * 4096
    buf = ffi.new("uint8_t[]", size)
    out = ffi.new("uint64_t *")
    seen = ffi.new("uint64_t *")
    load, cas = lib.ringq_load64, lib.ringq_cas64

    def run(k: int) -> None:
        for i in range(k):
            off = (i & 4095) * 16
            load(buf, size, off, out)
            w = out[0]
            cas(buf, size, off, w, w + 1, seen)
            item = _Item(i, w + 1, 1)
            cas(buf, size, off, item.word, w, seen)

    return run


def _queue(scratch: str, jobs: int) -> Any:
    from ringq.local.queue import Queue

    q = Queue(tempfile.mkdtemp(prefix="consume-", dir=scratch))
    done = 0
    while done < jobs:
        k = min(10_000, jobs - done)
        q.enqueue_many([payload(done + i) for i in range(k)])
        done += k
    q.ack_many(q.lease(1))  # the reader's side is built and warm
    return q


def consume_path(scratch: str, sz: Sizes, log: Callable[[str], None], deep: int) -> list[Row]:
    n = sz.ops * 5
    chunk = max(1, n // sz.rounds)
    queues: dict[str, Any] = {}

    def lease_one_ack(q: Any) -> Callable[[int], None]:
        def run(k: int) -> None:
            for _ in range(k):
                q.ack(q.lease_one())

        return run

    def lease_many_ack(q: Any) -> Callable[[int], None]:
        def run(k: int) -> None:
            left = k
            while left > 0:
                for job in q.lease(min(ACK_BATCH, left)):
                    q.ack(job)
                    left -= 1

        return run

    def consume_ack(q: Any) -> Callable[[int], None]:
        def run(k: int) -> None:
            for job in q.consume(count=k):
                q.ack(job)

        return run

    contestants: list[tuple[str, Callable[[int], None]]] = [(FLOOR_LOOP, floor_loop(n))]
    for label, make, jobs in (
        ("ringq lease_one+ack", lease_one_ack, n),
        (f"ringq lease({ACK_BATCH})+ack each", lease_many_ack, n),
        ("ringq consume()+ack each", consume_ack, n),
        (f"ringq lease_one+ack, {deep:,} pending", lease_one_ack, max(deep, n) + 1),
    ):
        q = queues[label] = _queue(scratch, jobs + 1)
        contestants.append((label, make(q)))
    secs = {label: 0.0 for label, _ in contestants}
    done = dict.fromkeys(secs, 0)
    try:
        for r in range(sz.rounds):
            k = r % len(contestants)
            for label, fn in contestants[k:] + contestants[:k]:
                t = time.perf_counter()
                fn(chunk)
                secs[label] += time.perf_counter() - t
                done[label] += chunk
    finally:
        for q in queues.values():
            path = q.location
            q.close()
            shutil.rmtree(path, ignore_errors=True)
    rows = []
    for label, _fn in contestants:
        row = Row("consume", label, "per job, one process", False, 1, done[label], secs[label])
        row.ops_per_s = done[label] / secs[label] if secs[label] else 0.0
        row.extra["us_per_job"] = 1e6 * secs[label] / max(1, done[label])
        rows.append(row)
        log(f"  {label:40s} {row.extra['us_per_job']:8.2f} µs per job")
    return rows


def _noop(_x: Any) -> None:
    return None


def _handler(_job: Any) -> None:
    return None


def drain(scratch: str, n: int, rounds: int, log: Callable[[str], None]) -> list[Row]:
    """Worker(processes=2) draining ``n`` jobs against Pool(2).imap_unordered over ``n`` items."""
    from ringq.local.queue import Queue
    from ringq.worker.worker import Worker

    secs = {"ringq Worker(processes=2)": 0.0, "multiprocessing.Pool(2) imap_unordered": 0.0}
    ctx = mp.get_context("fork")
    for r in range(rounds):
        order = list(secs) if r % 2 == 0 else list(secs)[::-1]
        for label in order:
            if label.startswith("ringq"):
                path = tempfile.mkdtemp(prefix="drain-", dir=scratch)
                q = Queue(path, durability="none")
                q.enqueue_many([payload(i) for i in range(n)])
                t = time.perf_counter()
                Worker(q, _handler, processes=2, idle_timeout=0.05, handle_signals=False).run()
                secs[label] += time.perf_counter() - t - 0.05  # the idle timeout that ends it
                left = q.stats().ready
                q.close()
                shutil.rmtree(path, ignore_errors=True)
                if left:
                    raise RuntimeError(f"the worker left {left} jobs")
            else:
                t = time.perf_counter()  # with the pool's start, as the Worker's run has its own
                with ctx.Pool(2) as pool:
                    for _ in pool.imap_unordered(_noop, range(n), chunksize=1):
                        pass
                secs[label] += time.perf_counter() - t
    rows = []
    for label, s in secs.items():
        row = Row("drain", label, f"{n:,} jobs, no-op handler", False, 2, n * rounds, s)
        row.ops_per_s = n * rounds / s if s else 0.0
        rows.append(row)
        log(f"  {label:40s} {row.ops_per_s:10,.0f} jobs/s")
    return rows
