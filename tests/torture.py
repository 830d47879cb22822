"""SIGKILL torture: producers, consumers and workers as separate processes, killed at random.

Invariant: every enqueue that returned is processed; nothing is processed that was never
enqueued; a job is handled more than once only if a process that handled it was SIGKILLed; and
the queue verifies clean at the end.

The ledger is kept outside the queue, one append-only file per process incarnation, written with
plain ``os.write`` (the page cache survives a SIGKILL, so no fsync is needed for this test):

    R <payload>   producer: enqueue of <payload> returned
    H <payload>   consumer / worker: handler ran for <payload> (before the ack)
    N <payload>   consumer: about to nack <payload> (it will be handled again: not a redelivery)

Run it directly for a long manual session::

    python tests/torture.py --seconds 600 --seed 7 [--dir /path]

or through pytest: ``RINGQ_TORTURE_SECONDS=600 python -m pytest -m slow tests/test_processes_torture.py``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
QUEUE_KW = dict(
    slot_size=128, slot_count=16, visibility_timeout=120.0, max_attempts=1000
)  # rotate and retire often


def _ledger(path: str, tag: str) -> int:
    return os.open(os.path.join(path, f"{tag}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def child(role: str, qdir: str, ledger: str, tag: str, seed: int) -> None:
    import ringq

    rng = random.Random(seed)
    fd = _ledger(ledger, tag)
    q = ringq.Queue(qdir, "t", **QUEUE_KW)
    os.write(fd, b"S started\n")
    if role == "producer":
        n = 0
        while True:
            batch = [f"{tag}:{n + i}" for i in range(rng.choice((1, 1, 1, 3, 20)))]
            n += len(batch)
            q.enqueue_many(
                batch,
                priority=rng.choice((0, 0, 0, 5, -5)),
                delay=rng.choice((0, 0, 0, 0, 0.05, 0.3)),
            )
            os.write(fd, "".join(f"R {p}\n" for p in batch).encode())
            time.sleep(rng.random() * 0.004)
    elif role == "consumer":
        while True:
            for job in q.lease(rng.choice((1, 4)), wait=0.05):
                os.write(fd, f"H {job.payload}\n".encode())
                time.sleep(
                    rng.random() * 0.003
                )  # a handler that takes a while: kills land inside it
                if rng.random() < 0.05:
                    os.write(fd, f"N {job.payload}\n".encode())
                    q.nack(job, error="torture", delay=rng.choice((0, 0.02)))
                else:
                    q.ack(job)
    elif role == "worker":
        from ringq.worker import Worker

        def handler(job: ringq.Job) -> None:
            os.write(fd, f"H {job.payload}\n".encode())
            time.sleep(rng.random() * 0.003)

        Worker(q, handler, concurrency=2, poll_interval=0.05, handle_signals=False).run()
    else:
        raise SystemExit(f"unknown role {role}")


@dataclass
class Result:
    returned: set = field(default_factory=set)
    handled: Counter = field(default_factory=Counter)
    handlers: dict = field(default_factory=lambda: defaultdict(list))
    nacked: Counter = field(default_factory=Counter)
    killed: set = field(default_factory=set)
    kills: int = 0
    redelivered: int = 0
    problems: list = field(default_factory=list)


def _read_ledgers(ledger: str, res: Result) -> None:
    for fname in os.listdir(ledger):
        tag = fname[:-4]
        with open(os.path.join(ledger, fname), encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    continue  # torn last line of a killed process
                kind, _, payload = line.rstrip("\n").partition(" ")
                if kind == "R":
                    res.returned.add(payload)
                elif kind == "H":
                    res.handled[payload] += 1
                    res.handlers[payload].append(tag)
                elif kind == "N":
                    res.nacked[payload] += 1


def run(
    seconds: float,
    seed: int,
    qdir: str | None = None,
    producers: int = 2,
    consumers: int = 2,
    workers: int = 1,
    log=print,
) -> Result:
    """Run the torture for ``seconds``; returns the checked result (``problems`` lists violations)."""
    import ringq

    rng = random.Random(seed)
    top = qdir or tempfile.mkdtemp(prefix="ringq-torture-")
    qpath, ledger = os.path.join(top, "queue"), os.path.join(top, "ledger")
    os.makedirs(ledger, exist_ok=True)
    ringq.Queue(qpath, "t", **QUEUE_KW).close()
    # The children import ringq exactly as this process did (an installed copy, or PYTHONPATH=.
    # for an in-place build): never the checkout's sources first, which may not be built.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = Result()
    live: dict[str, subprocess.Popen] = {}
    count = Counter()

    def spawn(role: str) -> None:
        count[role] += 1
        tag = f"{role}{count[role]}"
        live[tag] = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                role,
                qpath,
                ledger,
                tag,
                str(rng.randrange(1 << 30)),
            ],
            env=env,
        )

    for role, n in (("producer", producers), ("consumer", consumers), ("worker", workers)):
        for _ in range(n):
            spawn(role)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.02, 0.4))
            for tag, p in list(live.items()):
                if p.poll() is not None:
                    res.problems.append(f"{tag} exited by itself with {p.returncode}")
                    del live[tag]
            tag = rng.choice(sorted(live))
            live[tag].send_signal(signal.SIGKILL)
            live.pop(tag).wait()
            res.killed.add(tag)
            res.kills += 1
            spawn(tag.rstrip("0123456789"))
    finally:
        for tag, p in live.items():
            p.send_signal(signal.SIGKILL)
            p.wait()
            res.killed.add(tag)
    # Drain what is left in this process (its own ledger), reclaiming the dead holders' leases.
    fd = _ledger(ledger, "final")
    with ringq.Queue(qpath, "t", **QUEUE_KW) as q:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = q.lease(64, wait=0.3)
            for job in jobs:
                os.write(fd, f"H {job.payload}\n".encode())
                q.ack(job)
            st = q.stats()
            if not jobs and st.ready + st.delayed + st.leased == 0:
                break
        st = q.stats()
        from ringq.engine.verify import examine

        damaged = examine(qpath, "t").damaged
        if damaged or not q.recovery.clean:
            res.problems.append(f"verify: {damaged} recovery: {q.recovery}")
        if st.ready + st.delayed + st.leased or st.dead or st.corrupt:
            res.problems.append(f"left over at the end: {st}")
    os.close(fd)
    _read_ledgers(ledger, res)
    lost = res.returned - set(res.handled)
    if lost:
        res.problems.append(
            f"{len(lost)} returned enqueues never processed, e.g. {sorted(lost)[:5]}"
        )
    for payload, n in res.handled.items():
        if ":" not in payload:
            res.problems.append(f"phantom payload {payload!r}")
        again = n - 1 - res.nacked[payload]  # handled again although nobody nacked it
        if again > 0:
            res.redelivered += again
            dead = sum(1 for t in res.handlers[payload] if t in res.killed)
            if dead < again:
                res.problems.append(
                    f"{payload} handled {n} times by {res.handlers[payload]}; only {dead} were killed"
                )
    log(
        f"torture seed={seed} {seconds:.0f}s: {res.kills} kills, {len(res.returned)} returned, "
        f"{sum(res.handled.values())} handled, {res.redelivered} redelivered, problems={len(res.problems)}"
    )
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6], int(sys.argv[6]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--dir", default=None, help="keep the queue and ledgers here (default: a temp dir)"
    )
    args = ap.parse_args()
    res = run(args.seconds, args.seed, args.dir)
    for p in res.problems:
        print("PROBLEM:", p)
    sys.exit(1 if res.problems else 0)


if __name__ == "__main__":
    main()
