"""Instructions per job of the consume path, counted by valgrind's callgrind (docs/benchmarks.md).

    python benchmarks/instructions.py                  # every loop
    python benchmarks/instructions.py lease_one fanout # some of them
    python benchmarks/instructions.py --bytecodes lease_one consume  # bytecodes per job, by function

Counts instead of times: callgrind's counts repeat for the same code and inputs whatever else the
machine is doing, so two versions of the code can be compared on a busy machine.  Each loop runs
twice in a fresh process under callgrind, for ``SMALL`` and ``LARGE`` jobs; its figure is the
difference of the two counts of the main thread divided by the difference in jobs, so start-up,
imports and the queue's set-up cancel out.

Set-up, the same for every loop: ``durability="none"`` (no flusher thread), a visibility timeout of
an hour (under callgrind a job takes a few hundred times longer than natively, and no lease may run
out), ``PYTHONHASHSEED=0``; the reaper's interval, the full catch-up's period and a stream's batch
span pinned long, and the reaper's re-read of the lease-deadline floor pinned to 0.4 s (natively
each runs about once in a hundred jobs or less; slowed down, they would run on every job).

Loops: ``floor`` (the interpreter floor of ringq/bench/consume.py), ``lease_one`` (+ ack),
``lease100`` (``lease(100)`` + an ack each), ``consume`` (+ ack), ``enqueue`` (one job per call),
``enqueue_many`` (batches of 1,000), over a queue of 6,300 jobs; and ``fanout``: a consumer process blocked in ``lease_one(wait=5)``,
woken by a producer process that enqueues one job every 20 ms, which decodes the payload and acks
(what the consumer of the fan-out row runs per job; only the consumer is counted).
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

SMALL, LARGE = 2000, 6000
FANOUT_SMALL, FANOUT_LARGE = 200, 600
LOOPS = ("floor", "lease_one", "lease100", "consume", "enqueue", "enqueue_many", "fanout")
PAD = "x" * 40


def _pin() -> None:
    import ringq.backend as backend
    import ringq.engine.catchup as catchup
    import ringq.engine.reaper as reaper

    reaper.FLOOR_READ_EVERY = 0.4
    reaper.REAP_INTERVAL = 1e6
    reaper.Reaper.interval = 1e6
    catchup.FULL_CATCH_UP = 1e6
    backend.CONSUME_BATCH_SPAN = 1e6


def _loop(kind: str, n: int, traced: int = 0) -> None:
    """One run of ``kind`` over ``n`` jobs (in the process callgrind counts); with ``traced``, a
    second run of that many jobs under :func:`_bytecodes`, whose table is printed."""
    _pin()
    from ringq import Queue
    from ringq.bench.consume import floor_loop

    d = tempfile.mkdtemp(prefix="ringq-instr-")
    try:
        q = Queue(d, durability="none", visibility_timeout=3600)
        for i in range(0, 6300, 1000):
            q.enqueue_many([{"i": i + j, "pad": PAD} for j in range(1000)])
        q.ack_many(q.lease(1))
        batch = [{"i": i, "pad": PAD} for i in range(1000)]

        def run(n: int) -> None:
            if kind == "lease_one":
                for _ in range(n):
                    q.ack(q.lease_one())
            elif kind == "lease100":
                left = n
                while left > 0:
                    for job in q.lease(min(100, left)):
                        q.ack(job)
                        left -= 1
            elif kind == "consume":
                for job in q.consume(count=n):
                    q.ack(job)
            elif kind == "enqueue":
                for i in range(n):
                    q.enqueue({"i": i, "pad": PAD})
            elif kind == "enqueue_many":
                for _ in range(n // len(batch)):
                    q.enqueue_many(batch)
            elif kind == "floor":
                floor_loop(n)(n)

        run(n)
        if traced:
            _bytecodes(kind, run, traced)
        q.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _bytecodes(kind: str, run: Callable[[int], None], n: int) -> None:
    """Print the bytecodes per job that ``run(n)`` executes, in all and by function (the
    interpreter's opcode events, through ``sys.settrace``: exact counts, not samples)."""
    counts: collections.Counter[tuple[str, str, int]] = collections.Counter()

    def trace(frame: Any, event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[
                (code.co_filename.rpartition("/ringq/")[2], code.co_name, code.co_firstlineno)
            ] += 1
        return trace

    sys.settrace(trace)
    try:
        run(n)
    finally:
        sys.settrace(None)
    print(f"{kind}: {sum(counts.values()) / n:,.1f} bytecodes per job")
    for (path, name, line), k in counts.most_common(15):
        print(f"  {k / n:8.1f}  {path}:{line} {name}")


def _fanout_consumer(d: str, n: int) -> None:
    _pin()
    from ringq import Queue

    q = Queue(d, durability="none", visibility_timeout=3600)
    q.ack_many(q.lease(10))
    open(os.path.join(d, "ready"), "w").close()
    got = 0
    while got < n:
        job = q.lease_one(wait=5)
        if job is None:
            continue
        job.payload  # noqa: B018 - the handler reads it
        q.ack(job)
        got += 1
    q.close()


def _fanout_producer(d: str, n: int) -> None:
    from ringq import Queue

    q = Queue(d, durability="none", visibility_timeout=3600)
    while not os.path.exists(os.path.join(d, "ready")):
        time.sleep(0.01)
    time.sleep(0.5)
    for i in range(n):
        q.enqueue({"i": i, "pad": PAD})
        time.sleep(0.02)
    q.close()


def _main_thread_count(prefix: str) -> int:
    (path,) = glob.glob(prefix + ".*-01")  # --separate-threads: thread 1 is the main thread
    with open(path) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def _callgrind(out: str, args: list[str]) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            f"--callgrind-out-file={out}.%p",
            sys.executable,
            __file__,
            *args,
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _main_thread_count(out)


def count(kind: str, scratch: str) -> float:
    """Instructions per job of loop ``kind`` (see the module docstring)."""
    if kind != "fanout":
        a = _callgrind(os.path.join(scratch, f"{kind}-small"), ["--run", kind, str(SMALL)])
        b = _callgrind(os.path.join(scratch, f"{kind}-large"), ["--run", kind, str(LARGE)])
        return (b - a) / (LARGE - SMALL)
    totals = []
    for n in (FANOUT_SMALL, FANOUT_LARGE):
        d = tempfile.mkdtemp(prefix="ringq-instr-fanout-", dir=scratch)
        from ringq import Queue

        Queue(d, durability="none").close()
        producer = subprocess.Popen([sys.executable, __file__, "--producer", d, str(n)])
        try:
            totals.append(
                _callgrind(os.path.join(scratch, f"fanout-{n}"), ["--consumer", d, str(n)])
            )
        finally:
            producer.wait(timeout=120)
    return (totals[1] - totals[0]) / (FANOUT_LARGE - FANOUT_SMALL)


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--run"]:
        _loop(args[1], int(args[2]))
        return
    if args[:1] == ["--bytecodes"]:
        for kind in args[1:] or [k for k in LOOPS if k != "fanout"]:
            if kind not in LOOPS or kind == "fanout":
                sys.exit(f"unknown loop {kind!r} for --bytecodes: one of {', '.join(LOOPS[:-1])}")
            _loop(kind, 500, traced=1000)
        return
    if args[:1] == ["--consumer"]:
        _fanout_consumer(args[1], int(args[2]))
        return
    if args[:1] == ["--producer"]:
        _fanout_producer(args[1], int(args[2]))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    kinds = args or list(LOOPS)
    for kind in kinds:
        if kind not in LOOPS:
            sys.exit(f"unknown loop {kind!r}: one of {', '.join(LOOPS)}")
    scratch = tempfile.mkdtemp(prefix="ringq-callgrind-")
    try:
        floor = None
        for kind in kinds:
            per_job = count(kind, scratch)
            if kind == "floor":
                floor = per_job
            ratio = f"  {per_job / floor:5.2f} x floor" if floor and kind != "floor" else ""
            print(f"{kind:10s} {per_job:10,.0f} instructions per job{ratio}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
