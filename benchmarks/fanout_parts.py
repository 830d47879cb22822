"""Where the fan-out row's latency goes, through the public API only (docs/benchmarks.md).

    python benchmarks/fanout_parts.py [--jobs N] [--consumers C] [--dir DIR]

The set-up of the harness's fan-out row (ringq/bench/harness.py): the script's process enqueues one
job about every millisecond (``durability="none"``) carrying ``time.monotonic_ns()`` taken just
before its ``enqueue``; ``C`` consumer processes (default 1) blocked in ``lease_one(wait=5)``
read the payload, stamp and ack.  Then the same with faster-fifo (``put`` and ``get``), if it is
installed, for comparison.  Printed for each, as p50 in µs over ``N`` jobs less each consumer's
first three (its first wake-ups run on cold caches, as in the harness's row):

* the producer's call between two sleeps (``cold``), and the same call in a tight loop of 2,000
  (``hot``): what the millisecond's sleep costs the producer;
* for the consumer, from the producer's stamp to the job in hand (``lease_one`` or ``get``
  returned), and from there to the payload decoded (the row's end);
* how long after the producer's call returned the job was in hand (p1, p10, p50, p90), and how
  often before it: on the project machine the woken consumer mostly runs on the producer's vCPU
  once the producer's call is over, so the whole ``cold`` call is on the row's critical path;
  and on how many wake-ups the consumer ran on the vCPU the producer's call returned on
  (``sched_getcpu``);
* the CPU time the consumer processes spent per job counted, waiting included: what a consumer
  costs the machine between jobs.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ringq import Queue

PAYLOAD_PAD = "x" * 40
_getcpu = ctypes.CDLL(None).sched_getcpu  # the vCPU the calling thread runs on


WARM = 3  # each consumer's first jobs, not counted: its first wake-ups run on cold caches


def _count(receive: Callable[[], tuple[Any, int, int, int] | None], ready: Any, out: Any) -> None:
    """A consumer's loop: ``receive()`` returns ``(stamp, in hand ns, decoded ns, vCPU)`` of the
    next message (the stamp None for the stop message), or None when none came.  Sends back the
    messages after the first WARM, and the process's CPU time from the WARM-th on."""
    got: list[tuple[int, int, int, int]] = []
    seen = 0
    first = time.process_time()
    ready.set()
    while True:
        msg = receive()
        if msg is None or msg[0] is None:
            break
        seen += 1
        if seen > WARM:
            got.append(msg)
        elif seen == WARM:
            first = time.process_time()  # the CPU time of the messages counted, from here
    out.send((got, time.process_time() - first if got else 0.0))


def _ringq_consumer(path: str, ready: Any, out: Any) -> None:
    q = Queue(path, durability="none")
    q.lease_one()  # nothing there yet: the reader's first build (and its imports) done here

    def receive() -> tuple[Any, int, int, int] | None:
        job = q.lease_one(wait=5.0)
        leased = time.monotonic_ns()
        cpu = _getcpu()
        if job is None:
            return None
        t = job.payload["t"]
        decoded = time.monotonic_ns()
        q.ack(job)
        return t, leased, decoded, cpu

    _count(receive, ready, out)
    q.close()


def _fifo_consumer(fifo: Any, ready: Any, out: Any) -> None:
    def receive() -> tuple[Any, int, int, int]:
        msg = fifo.get(timeout=5.0)
        got = time.monotonic_ns()
        return msg["t"], got, got, _getcpu()  # the message arrives decoded

    _count(receive, ready, out)


def _p50_us(xs: list[int]) -> float:
    return statistics.median(xs) / 1000


def _hot(send: Callable[[dict[str, Any]], Any]) -> list[int]:
    """The same call 2,000 times back to back (ns each)."""
    hot = []
    for _ in range(2000):
        t = time.monotonic_ns()
        send({"t": t, "pad": PAYLOAD_PAD})
        hot.append(time.monotonic_ns() - t)
    return hot


def _measure(
    name: str,
    call: str,
    send: Callable[[dict[str, Any]], Any],
    consumer: Callable[..., None],
    arg: Any,
    jobs: int,
    hot: list[int],
    consumers: int,
) -> None:
    """Run ``consumer(arg, ready, pipe)`` in ``consumers`` forked processes, ``send`` them
    ``jobs`` stamped messages about a millisecond apart and a stop message each, and print where
    the latency went."""
    ctx = mp.get_context("fork")
    procs = []
    for _ in range(consumers):
        ready = ctx.Event()
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=consumer, args=(arg, ready, w))
        p.start()
        if not ready.wait(10):
            raise SystemExit(f"the {name} consumer did not start")
        procs.append((p, r))
    time.sleep(0.05)
    cold = []
    returned = {}
    cpus = {}
    for _ in range(jobs):
        time.sleep(0.0008 + (time.monotonic_ns() % 400) / 1e6)
        t = time.monotonic_ns()
        send({"t": t, "pad": PAYLOAD_PAD})
        returned[t] = time.monotonic_ns()
        cpus[t] = _getcpu()
        cold.append(returned[t] - t)
    for _ in procs:
        send({"t": None})
    got = []
    spent = 0.0
    for p, r in procs:
        lat, cpu_s = r.recv()
        got += lat
        spent += cpu_s
        p.join(10)
    print(
        f"{name}: producer {call} call: cold p50 {_p50_us(cold):.1f} µs, hot p50 {_p50_us(hot):.1f} µs"
    )
    print(
        f"{name}: consumer: stamp -> job in hand p50 {_p50_us([b - a for a, b, _, _ in got]):.1f} µs, "
        f"-> payload decoded {_p50_us([c - b for _, b, c, _ in got]):.1f} µs, "
        f"whole row p50 {_p50_us([c - a for a, _, c, _ in got]):.1f} µs ({len(got)} jobs)"
    )
    after = sorted(b - returned[a] for a, b, _, _ in got if a in returned)
    print(
        f"{name}: job in hand after the producer's {call} returned: "
        + ", ".join(f"p{p} {after[len(after) * p // 100] / 1000:.1f} µs" for p in (1, 10, 50, 90))
        + f" ({sum(x < 0 for x in after)} of {len(after)} before it)"
    )
    same = sum(1 for a, _, _, cpu in got if cpus.get(a) == cpu)
    print(
        f"{name}: consumer woken on the vCPU the producer's call returned on: {same} of {len(got)}"
    )
    print(
        f"{name}: CPU time of the consumer processes per job: {spent / max(1, len(got)) * 1e6:.1f} µs"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--consumers", type=int, default=1, help="consumer processes (default 1)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="fanout-parts-", dir=args.dir)
    try:
        hot_q = Queue(f"{scratch}/hot", durability="none")
        hot = _hot(hot_q.enqueue)
        hot_q.close()
        path = f"{scratch}/fan"
        q = Queue(path, durability="none")
        try:
            _measure(
                "ringq", "enqueue", q.enqueue, _ringq_consumer, path, args.jobs, hot, args.consumers
            )
        finally:
            q.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        import faster_fifo
    except ImportError:
        print("faster-fifo: not installed (pip install faster-fifo)")
        return
    fifo = faster_fifo.Queue()
    hot = _hot(fifo.put)
    for _ in range(2000):
        fifo.get()
    _measure("faster-fifo", "put", fifo.put, _fifo_consumer, fifo, args.jobs, hot, args.consumers)


if __name__ == "__main__":
    main()
