"""A history checker for the queue's semantics under real threads, processes and SIGKILL.

Theory of operation
-------------------
A seed decides a workload (:func:`plan`): 1-4 worker processes of 1-8 threads each, every thread
a producer, a consumer, both, an admin (stats, list_jobs, cancel, purge) or, in some processes, a
``Worker`` (in a workload without cancels, often with a hard timeout that some handlers outlive:
the Worker gives them up and hands the rest of their thread's batch back); short visibility
timeouts; SIGKILLs of running processes (each replaced by a fresh one).
Every thread logs each call it makes -- its start and end on the wall clock (the clock lease
deadlines use, shared by all processes of the host), its arguments and its result -- one JSON
line per call, written with one ``write`` on an ``O_APPEND`` descriptor, so a SIGKILL loses at
most the calls in flight.  An enqueue is logged before it is made as well ("invoke"), so a job
whose enqueue was cut short by a kill is known.  When the workers are stopped, the checker itself
reads the quiescent queue (stats, list_jobs, get of every job), drains what is left, and purges.

Then :func:`check` judges the whole history, job by job.  A lease *grant* is one job returned by
one lease call: ``(job, seq, token)`` names it (a relocated copy has a new seq, and its lease
count starts again).  Its holder certainly holds it from the end of the lease call until the
earliest of: the start of its ack or nack, its deadline (as extended), its process's kill or close.
The rules, each a violation when broken:

* no grant is handed out twice (two lease results with one ``(job, seq, token)``);
* no two grants of one job are certainly held at overlapping times;
* an ack is accepted only from the current holder: not once a later grant of the job was
  returned before the ack began, and at most one ack is accepted per job;
* no job is leased again by a call that began after an accepted ack of it returned;
* a live holder's ack, nack or extend is not refused while its lease is in time and nothing
  else (a later grant, a cancel, a purge) can explain the refusal;
* every job whose enqueue returned is accounted for at the end: done after an accepted ack,
  dead after its attempts, cancelled or expired as asked, purged, or delivered by the drain; and
  no job exists that nobody enqueued;
* at quiescence ``stats()``, ``list_jobs()`` and ``get`` agree, no job is listed twice, ``purge()``
  removes exactly ``stats().total`` jobs and leaves none.

Run by tests/test_processes_history.py (a short seeded run in CI), or by hand::

    python tests/history.py --runs 200            # the long run: random seeds, printed
    python tests/history.py --seed 12345 -v       # replay one workload (timing differs)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SLACK = 0.003  # seconds: a deadline is stored in whole ms, and clocks are read around the calls
STOP = "stop"


# -- the workload -----------------------------------------------------------------------------------


def plan(seed: int) -> dict[str, Any]:
    """The workload a seed stands for (JSON-able: it is handed to the worker processes)."""
    r = random.Random(seed)
    nproc = r.randint(1, 4)
    procs = []
    for _ in range(nproc):
        worker = nproc > 1 and r.random() < 0.2
        nthreads = r.randint(1, 8)
        if r.random() < 0.3:
            # fan-out: every thread waits in lease_one(wait=1) and acks at once (Worker's shape)
            roles = ["waiter"] * nthreads
            if r.random() < 0.5:
                roles[0] = "producer"
        else:
            roles = [r.choice(["producer", "consumer", "consumer", "both", "admin", "waiter"])
                     for _ in range(nthreads)]
        procs.append({"worker": worker, "roles": roles, "concurrency": r.randint(1, 6)})
    roles = [ro for p in procs for ro in p["roles"]]
    if "producer" not in roles:  # a "both" thread may spend the whole run waiting in a lease
        procs[0]["roles"][0] = "producer"
        roles = [ro for p in procs for ro in p["roles"]]  # that thread may have been the consumer
    if not any(p["worker"] for p in procs) and not {"consumer", "both", "waiter"} & set(roles):
        procs[-1]["roles"].append("consumer")
    duration = r.uniform(1.0, 2.5)
    kills = sorted(
        (round(r.uniform(0.2, duration), 3), r.randrange(nproc)) for _ in range(r.choice([0, 0, 1, 1, 2, 3]))
    )
    cfg = {
        "seed": seed,
        "procs": procs,
        "duration": duration,
        "kills": kills,
        "vt": r.choice([0.15, 0.3, 0.6, 2.0]),
        "max_attempts": r.choice([2, 3, 5]),
        "durability": r.choice(["none", "none", "msync", "interval"]),
        "slot_count": r.choice([16, 64, 1024, 16384]),
        "jobs": r.randint(40, 400),
        "purge": r.random() < 0.15,
        "cancel": r.random() < 0.5,
        "spin": r.choice([0.0, 0.0, 0.0005]),
    }
    # Hard timeouts for the Worker processes of a workload without cancels (so a handler that
    # finds its job's ``cancelled`` set knows the Worker gave it up).  Drawn from a generator of
    # their own, so every other draw of each seed's workload stayed what it was.
    t = random.Random(seed ^ 0x7153)
    for p in procs:
        if p["worker"] and not cfg["cancel"] and t.random() < 0.6:
            p["timeout"] = t.choice([0.05, 0.15])
    return cfg


def open_queue(d: str, cfg: dict[str, Any], vt: float | None = None) -> Any:
    from ringq import BackoffPolicy, Queue

    return Queue(
        d,
        visibility_timeout=cfg["vt"] if vt is None else vt,
        max_attempts=cfg["max_attempts"],
        backoff=BackoffPolicy(base=0.005, factor=1.0, jitter=0.0),
        durability=cfg["durability"],
        slot_size=128,
        slot_count=cfg["slot_count"],
        spin=cfg["spin"],
    )


class Log:
    """One process's history file: one line per call, one write each (a SIGKILL tears none)."""

    def __init__(self, path: str, label: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.label = label

    def __call__(self, **event: Any) -> None:
        event["p"] = self.label
        event.setdefault("t", threading.current_thread().name)
        os.write(self.fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())


def grant(job: Any) -> list[Any]:
    """What a history keeps of a leased job: [tag, id, seq, token, attempts, deadline]."""
    return [job.payload["tag"], job.id, job.seq, job.lease_token, job.attempts, job.lease_deadline]


def worker_main(d: str, cfg: dict[str, Any], index: int, label: str, logpath: str) -> None:
    """One worker process of the workload: its threads run until the stop file appears."""
    from ringq import JobNotFoundError, NotLeasedError, RingqError, Worker

    log = Log(logpath, label)
    me = cfg["procs"][index]
    r0 = random.Random(f"{cfg['seed']}/{label}")
    stop = threading.Event()
    q = open_queue(d, cfg, vt=30.0 if me["worker"] else None)
    quota = [cfg["jobs"] // max(1, sum(ro in ("producer", "both") for p in cfg["procs"] for ro in p["roles"]))]
    mine: list[str] = []  # ids this process enqueued (cancel picks among them)
    counter = iter(range(10**9))
    stopfile = os.path.join(d, STOP)

    def stopped() -> bool:
        if not stop.is_set() and os.path.exists(stopfile):
            stop.set()
        return stop.is_set()

    def produce(r: random.Random, n: int) -> None:
        kind = r.random()
        k = r.randint(2, 10) if kind < 0.3 else 1
        tags = [f"{label}.{threading.current_thread().name}.{next(counter)}" for _ in range(k)]
        prio = r.choice([-1, 0, 0, 1])
        delay = r.choice([0.0, 0.0, 0.0, 0.01, 0.03])
        expires = r.random() < 0.05
        kw: dict[str, Any] = {"priority": prio, "delay": delay}
        if expires:
            kw["expires_in"] = 0.02
        use_id = k == 1 and r.random() < 0.1
        s = time.time()
        log(op="invoke", what="enqueue", s=s, tags=tags, expires=expires)
        try:
            if k == 1:
                job = q.enqueue({"tag": tags[0]}, job_id=f"id-{tags[0]}" if use_id else None, **kw)
                jobs = [job]
            else:
                jobs = q.enqueue_many([{"tag": t} for t in tags], **kw)
        except RingqError as exc:
            log(op="enqueue", s=s, e=time.time(), tags=tags, ok=False, err=repr(exc))
            return
        log(op="enqueue", s=s, e=time.time(), tags=tags, ids=[j.id for j in jobs], ok=True, expires=expires)
        mine.extend(j.id for j in jobs)

    def settle(r: random.Random, jobs: list[Any]) -> None:
        for job in jobs:
            g = grant(job)
            x = r.random()
            if x < 0.6 and r.random() < 0.3:
                time.sleep(r.choice([0.0005, 0.002]))
            op = "ack" if x < 0.82 else "nack" if x < 0.9 else "extend" if x < 0.96 else "abandon"
            if op == "abandon":
                log(op="abandon", s=time.time(), e=time.time(), g=g)
                continue
            s = time.time()
            if op != "extend":  # a kill may cut a release short, taken effect or not
                log(op="invoke", what="release", s=s, g=g)
            try:
                if op == "ack":
                    q.ack(job)
                    out: Any = None
                elif op == "nack":
                    out = q.nack(job, error="history", delay=r.choice([None, 0.0, 0.01])).state.value
                else:
                    ext = q.extend(job, r.choice([0.05, 0.5]))
                    out = ext.lease_deadline
                    log(op="extend", s=s, e=time.time(), g=g, ok=True, deadline=out)
                    s = time.time()
                    log(op="invoke", what="release", s=s, g=g)
                    q.ack(job)
                    op, out = "ack", None
                log(op=op, s=s, e=time.time(), g=g, ok=True, out=out)
            except (NotLeasedError, JobNotFoundError) as exc:
                log(op=op, s=s, e=time.time(), g=g, ok=False, err=type(exc).__name__, msg=str(exc))

    def wait_one(r: random.Random) -> None:
        s = time.time()
        j = q.lease_one(wait=1.0)
        jobs = [] if j is None else [j]
        log(op="lease", s=s, e=time.time(), wait=1.0, n=1, jobs=[grant(j) for j in jobs])
        for j in jobs:
            s = time.time()
            log(op="invoke", what="release", s=s, g=grant(j))
            try:
                q.ack(j)
                log(op="ack", s=s, e=time.time(), g=grant(j), ok=True)
            except (NotLeasedError, JobNotFoundError) as exc:
                log(op="ack", s=s, e=time.time(), g=grant(j), ok=False, err=type(exc).__name__, msg=str(exc))

    def consume(r: random.Random) -> None:
        form = r.random()
        wait = r.choice([None, 0.0, 0.05, 0.2, 1.0, 1.0])
        n = r.choice([2, 3, 10, 100])
        s = time.time()
        if form < 0.55:
            j = q.lease_one(wait=wait)
            jobs = [] if j is None else [j]
            call = {"n": 1}
        else:
            jobs = q.lease(n, wait=wait)
            call = {"n": n}
        log(op="lease", s=s, e=time.time(), wait=wait, jobs=[grant(j) for j in jobs], **call)
        if len(jobs) > call["n"]:
            log(op="violation", s=s, e=time.time(), what=f"lease({call['n']}) returned {len(jobs)} jobs")
        if not jobs and not wait:
            time.sleep(0.002)
        settle(r, jobs)

    def admin(r: random.Random) -> None:
        x = r.random()
        s = time.time()
        if x < 0.4:
            st = q.stats()
            parts = st.ready + st.delayed + st.leased + st.done + st.dead + st.cancelled + st.expired
            if parts != st.total:
                log(op="violation", s=s, e=time.time(), what=f"stats parts {parts} != total {st.total}")
            log(op="stats", s=s, e=time.time(), total=st.total)
        elif x < 0.75:
            jobs = q.list_jobs()
            ids = [j.id for j in jobs]
            if len(set(ids)) != len(ids):
                dup = sorted({i for i in ids if ids.count(i) > 1})
                log(op="violation", s=s, e=time.time(), what=f"list_jobs shows {dup[:5]} twice")
            log(op="list", s=s, e=time.time(), n=len(jobs))
        elif x < 0.97 and cfg["cancel"] and mine:
            jid = r.choice(mine)
            try:
                out = q.cancel(jid).state.value
                log(op="cancel", s=s, e=time.time(), id=jid, ok=True, out=out)
            except RingqError as exc:
                log(op="cancel", s=s, e=time.time(), id=jid, ok=False, err=type(exc).__name__)
        elif cfg["purge"] and r.random() < 0.2:
            log(op="invoke", what="purge", s=s)
            n = q.purge()
            log(op="purge", s=s, e=time.time(), n=n)
        time.sleep(r.choice([0.001, 0.005, 0.02]))

    def thread_main(role: str, r: random.Random) -> None:
        try:
            while not stopped():
                if role in ("producer", "both") and quota[0] > 0 and (role == "producer" or r.random() < 0.5):
                    quota[0] -= 1
                    produce(r, 1)
                    if r.random() < 0.1:
                        time.sleep(r.choice([0.001, 0.003, 0.01]))  # bursts, then a pause
                    continue
                if role == "producer":
                    time.sleep(0.01)
                elif role == "admin":
                    admin(r)
                elif role == "waiter":
                    wait_one(r)
                else:
                    consume(r)
        except BaseException:  # a crash of the queue's own: the history says so
            log(op="violation", s=time.time(), e=time.time(), what="exception: " + traceback.format_exc()[-1500:])

    threads = [
        threading.Thread(target=thread_main, args=(role, random.Random(r0.random())), name=f"t{i}", daemon=True)
        for i, role in enumerate(me["roles"])
    ]
    worker = None
    if me["worker"]:
        timeout = me.get("timeout")

        def handler(job: Any) -> None:
            g = grant(job)
            log(op="handle", s=time.time(), e=time.time(), g=g, phase="start", timeout=timeout)
            if timeout is not None and r0.random() < 0.05:
                # Past its hard timeout: the Worker gives it up (sets ``cancelled``, nacks it and
                # hands the rest of this thread's batch back) and a new thread serves meanwhile.
                job.cancelled.wait(timeout * 20)
            else:
                time.sleep(r0.choice([0.0, 0.0005, 0.003]))
            log(op="handle", s=time.time(), e=time.time(), g=g, phase="end", timeout=timeout)

        class Settles:
            """The Worker's view of the queue, logging its acks, nacks and extends: with a hard
            timeout the Worker decides a job's outcome itself (a handler's return may come after
            its job was given up), so the history takes it from these calls."""

            def __getattr__(self, name: str) -> Any:
                return getattr(q, name)

            def consume(self, **kw: Any) -> Any:
                # Each job as the stream hands it to the Worker: a grant (its lease was taken in
                # a batch before, and a job the stream gives back unused is never a grant).
                inner = q.consume(**kw)

                def handed() -> Any:
                    try:
                        for job in inner:
                            t = time.time()
                            log(op="lease", s=t, e=t, n=1, jobs=[grant(job)], stream=True)
                            yield job
                    finally:
                        inner.close()

                return handed()

            def ack(self, job: Any, **kw: Any) -> Any:
                return self._logged("ack", job, lambda: q.ack(job, **kw))

            def nack(self, job: Any, **kw: Any) -> Any:
                return self._logged("nack", job, lambda: q.nack(job, **kw))

            def extend(self, job: Any, seconds: float) -> Any:
                return self._logged("extend", job, lambda: q.extend(job, seconds))

            def _logged(self, op: str, job: Any, call: Any) -> Any:
                s, g = time.time(), grant(job)
                if op != "extend":
                    log(op="invoke", what="release", s=s, g=g)
                try:
                    out = call()
                except (NotLeasedError, JobNotFoundError) as exc:
                    log(op=op, s=s, e=time.time(), g=g, ok=False, err=type(exc).__name__, msg=str(exc))
                    raise
                extra = {"deadline": out.lease_deadline} if op == "extend" else {}
                log(op=op, s=s, e=time.time(), g=g, ok=True, **extra)
                return out

        worker = Worker(Settles() if timeout is not None else q, handler, concurrency=me["concurrency"],  # type: ignore[arg-type]
                        poll_interval=0.05, handle_signals=False, timeout=timeout)
        threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
    for t in threads:
        t.start()
    if worker is not None:
        wt = threading.Thread(target=worker.run, name="worker", daemon=True)
        wt.start()
    open(os.path.join(os.path.dirname(logpath), f"{label}.ready"), "w").close()
    while not stopped():
        time.sleep(0.01)
    for t in threads:
        t.join(10)
    if worker is not None:
        wt.join(10)
    log(op="close", s=time.time(), e=time.time(), t="main")
    q.close()
    log(op="closed", s=time.time(), e=time.time(), t="main")


# -- running a workload -----------------------------------------------------------------------------


@dataclass
class Run:
    seed: int
    cfg: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)


def spawn(d: str, cfg: dict[str, Any], index: int, label: str, logdir: str) -> subprocess.Popen:
    args = [sys.executable, os.path.abspath(__file__), "--worker", d, json.dumps(cfg), str(index), label,
            os.path.join(logdir, f"{label}.log")]
    return subprocess.Popen(args, cwd=os.path.dirname(HERE), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run(seed: int, keep: bool = False) -> Run:
    """Run the workload of ``seed`` in a fresh directory and check its history."""
    cfg = plan(seed)
    top = tempfile.mkdtemp(prefix=f"ringq-history-{seed}-")
    d, logdir = os.path.join(top, "q"), os.path.join(top, "log")
    os.mkdir(logdir)
    q = open_queue(d, cfg)  # created once, before the workers race to create it
    q.close()
    out = Run(seed, cfg)
    procs: dict[int, tuple[str, subprocess.Popen]] = {}
    gen = defaultdict(int)
    for i in range(len(cfg["procs"])):
        procs[i] = (f"p{i}g0", spawn(d, cfg, i, f"p{i}g0", logdir))
    # The workload's clock starts when every first-generation process runs: on a loaded machine
    # starting interpreters can take longer than the whole workload.
    give_up = time.time() + 60
    while time.time() < give_up and not all(
        os.path.exists(os.path.join(logdir, f"{label}.ready")) or p.poll() is not None for label, p in procs.values()
    ):
        time.sleep(0.01)
    t0 = time.time()
    for at, i in cfg["kills"]:
        time.sleep(max(0.0, t0 + at - time.time()))
        label, p = procs[i]
        if p.poll() is None:
            s = time.time()
            p.send_signal(signal.SIGKILL)
            p.wait()
            out.events.append({"op": "kill", "p": label, "s": s, "e": time.time(), "t": "main"})
        gen[i] += 1
        label = f"p{i}g{gen[i]}"
        procs[i] = (label, spawn(d, cfg, i, label, logdir))
    time.sleep(max(0.0, t0 + cfg["duration"] - time.time()))
    open(os.path.join(d, STOP), "w").close()
    for label, p in procs.values():
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            out.violations.append(f"{label} did not stop within 60 s of the stop file")
        if p.returncode != 0:
            out.violations.append(f"{label} exited {p.returncode}: {err.decode(errors='replace')[-1500:]}")
    for name in sorted(os.listdir(logdir)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(logdir, name)) as f:
            for line in f:
                if line.endswith("\n"):
                    out.events.append(json.loads(line))
    out.final = final_phase(d, cfg, out)
    check(out)
    if not keep:
        shutil.rmtree(top, ignore_errors=True)
    return out


def final_phase(d: str, cfg: dict[str, Any], out: Run) -> dict[str, Any]:
    """The quiescent reads, the drain and the purge, made by this process (never a lease holder)."""
    from ringq import JobNotFoundError, JobState
    from ringq.engine.reaper import CLAIM_GRACE

    q = open_queue(d, cfg, vt=60.0)
    v = out.violations
    try:
        st = q.stats()
        listed = q.list_jobs()
        ids = [j.id for j in listed]
        if len(set(ids)) != len(ids):
            v.append(f"final list_jobs shows a job twice: {sorted({i for i in ids if ids.count(i) > 1})[:5]}")
        now = time.time()
        counts: dict[str, int] = defaultdict(int)
        for j in listed:
            k = j.state.value
            if j.state is JobState.READY and j.available_at > now:
                k = "delayed"
            counts[k] += 1
        got = {k: getattr(st, k) for k in ("ready", "delayed", "leased", "done", "dead", "cancelled", "expired")}
        # A job delayed by milliseconds may come due between the two reads.
        if {k: n for k, n in got.items() if k not in ("ready", "delayed")} != {
            k: counts[k] for k in got if k not in ("ready", "delayed")
        } or got["ready"] + got["delayed"] != counts["ready"] + counts["delayed"]:
            v.append(f"final stats {got} disagree with list_jobs {dict(counts)}")
        if len(listed) != st.total:
            v.append(f"final stats total {st.total} != {len(listed)} jobs listed")
        states: dict[str, Any] = {}
        for j in listed:
            try:
                g = q.get(j.id)
            except JobNotFoundError:
                v.append(f"job {j.id} listed but get finds nothing")
                continue
            if g.state is not j.state and not (j.state is JobState.LEASED and g.state is JobState.READY):
                v.append(f"job {j.id}: list_jobs says {j.state.value}, get says {g.state.value}")
            states[j.payload["tag"]] = {"id": j.id, "state": g.state.value, "attempts": g.attempts}
        drained: list[dict[str, Any]] = []
        idle = 0
        # A lease whose claimer was killed between its two CAS has no owner word: it is reclaimed
        # once a reaper has seen it unowned for CLAIM_GRACE (docs/guarantees.md).  The drain
        # waits that long for leases still held before it judges them stranded.
        grace_until = time.monotonic() + CLAIM_GRACE + 1.0
        while idle < 2 or (q.stats().leased and time.monotonic() < grace_until):
            s = time.time()
            jobs = q.lease(100, wait=0.3)
            e = time.time()
            if not jobs:
                idle += 1
                continue
            idle = 0
            for j in jobs:
                drained.append({"g": grant(j), "s": s, "e": e})
                q.ack(j)
        after = q.stats()
        if after.ready or after.delayed or after.leased:
            left = [(j.id, j.state.value, round(j.available_at - time.time(), 3), j.attempts, j.last_error)
                    for j in q.list_jobs() if j.state in (JobState.READY, JobState.LEASED)]
            v.append(f"after the drain: {after}; not leasable: {left[:5]}")
        total = after.total
        n = q.purge()
        if n != total:
            v.append(f"purge removed {n} jobs, stats said total {total}")
        left = q.stats().total, len(q.list_jobs())
        if left != (0, 0):
            v.append(f"after purge: stats total and list_jobs {left}, want (0, 0)")
    finally:
        q.close()
    return {"states": states, "drained": drained}


# -- judging a history ------------------------------------------------------------------------------


@dataclass
class Grant:
    tag: str
    id: str
    seq: int
    token: str
    attempts: int
    deadline: float
    p: str
    t: str
    s: float
    e: float
    release: dict[str, Any] | None = None
    handled: tuple[float, float] | None = None
    # The start of the holder's first ack or nack of it: one cut short by a kill (not logged as
    # done) may have taken effect at any moment after it began.
    releasing: float | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.seq, int(self.token))

    def name(self) -> str:
        return f"{self.tag} (id {self.id} seq {self.seq} token {self.token}) to {self.p}/{self.t}"


def check(run_: Run) -> None:
    """Judge ``run_.events`` and ``run_.final`` by the rules of the module docstring."""
    v = run_.violations
    ev = sorted(run_.events, key=lambda x: (x.get("s", 0.0), x.get("e", 0.0)))
    killed = {x["p"]: x["s"] for x in ev if x["op"] == "kill"}
    closed = {x["p"]: x["s"] for x in ev if x["op"] == "close"}
    ends = {**closed, **killed}
    invoked: dict[str, dict[str, Any]] = {}
    enqueued: set[str] = set()
    expires: set[str] = set()
    # (start, end) of every purge; one cut short by a kill may have run until the kill
    done_purges = {(x["p"], x["t"], x["s"]): x["e"] for x in ev if x["op"] == "purge"}
    purges = [
        {"s": x["s"], "e": done_purges.get((x["p"], x["t"], x["s"]), float("inf"))}
        for x in ev
        if x["op"] == "invoke" and x.get("what") == "purge"
    ]
    cancels: dict[str, list[dict[str, Any]]] = defaultdict(list)
    id_of: dict[str, str] = {}
    grants: dict[str, list[Grant]] = defaultdict(list)
    by_holder: dict[tuple[str, str, str, int, str], Grant] = {}
    for x in ev:
        op = x["op"]
        if op == "violation":
            v.append(f"{x['p']}/{x['t']}: {x['what']}")
        elif op == "invoke" and x["what"] == "release":
            tag, jid, seq, token = x["g"][:4]
            gr = by_holder.get((x["p"], tag, jid, seq, token))
            if gr is not None and gr.releasing is None:
                gr.releasing = x["s"]
        elif op == "invoke" and x["what"] == "enqueue":
            for t in x["tags"]:
                invoked[t] = x
                if x.get("expires"):
                    expires.add(t)
        elif op == "enqueue" and x["ok"]:
            enqueued.update(x["tags"])
            for t, i in zip(x["tags"], x["ids"]):
                id_of[t] = i
        elif op == "cancel":
            cancels[x["id"]].append(x)
        elif op == "lease":
            for g in x["jobs"]:
                gr = Grant(g[0], g[1], g[2], g[3], g[4], g[5] or 0.0, x["p"], x["t"], x["s"], x["e"])
                grants[gr.tag].append(gr)
                hk = (gr.p, gr.tag, gr.id, gr.seq, gr.token)
                if hk in by_holder:
                    v.append(f"one process was handed one lease twice: {gr.name()}")
                by_holder[hk] = gr
        elif op == "handle":
            tag, jid, seq, token, attempts, deadline = x["g"]
            hk = (x["p"], tag, jid, seq, token)
            if x.get("timeout") is not None:
                pass  # with a hard timeout the grant is the stream's, settled by the Worker's calls
            elif x["phase"] == "start":
                # The Worker acks once the handler returns: the lease is held until then.
                gr = Grant(tag, jid, seq, token, attempts, float("inf"), x["p"], x["t"], x["s"], x["s"])
                grants[tag].append(gr)
                by_holder[hk] = gr
            elif hk in by_holder:
                gr = by_holder[hk]
                gr.handled = (gr.s, x["e"])
                # The Worker acks after the handler returns: the lease is certainly held until
                # then.  In a process killed later the ack may not have been made (the kill can
                # fall between the handler's return and the ack): its fate is unknown, as for a
                # lease held at a kill, so it is no accepted ack.
                if x["p"] not in killed:
                    gr.release = {"op": "handled", "s": x["e"], "e": x["e"], "ok": True}
        elif op in ("ack", "nack", "extend", "abandon"):
            tag, jid, seq, token = x["g"][:4]
            gr = by_holder.get((x["p"], tag, jid, seq, token))
            if gr is None:
                v.append(f"{op} of a job never leased by {x['p']}: {x['g']}")
                continue
            if op == "extend":
                if x["ok"]:
                    gr.deadline = max(gr.deadline, x["deadline"])
                else:
                    gr.release = x
            elif gr.release is None:
                gr.release = x
    for item in run_.final["drained"]:
        g = item["g"]
        grants[g[0]].append(Grant(g[0], g[1], g[2], g[3], g[4], float("inf"), "checker", "drain",
                                  item["s"], item["e"], release={"op": "ack", "s": item["e"], "e": item["e"], "ok": True}))

    def live_end(g: Grant, with_release: bool = True) -> float:
        end = g.deadline - SLACK
        if g.p in ends:
            end = min(end, ends[g.p])
            if g.p in killed and g.releasing is not None:
                end = min(end, g.releasing)
        if with_release and g.release is not None and g.release["op"] != "abandon":
            end = min(end, g.release["s"])  # an abandoned lease stays held until its deadline
        return end

    for tag, gs in grants.items():
        if tag not in invoked:
            v.append(f"a job nobody enqueued was leased: {gs[0].name()}")
            continue
        seen: dict[tuple[int, str], Grant] = {}
        for g in gs:
            k = (g.seq, g.token)
            if k in seen:
                v.append(f"one lease handed out twice: {g.name()} and {seen[k].p}/{seen[k].t}")
            seen[k] = g
        ordered = sorted(gs, key=lambda g: g.e)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1:]:
                if a.key == b.key:
                    continue
                if b.e < live_end(a) and a.e < live_end(b):
                    v.append(f"two live leases at once: {a.name()} held until {live_end(a):.4f}, "
                             f"{b.name()} from {b.e:.4f}")
        acks = [g for g in gs if g.release and g.release["op"] in ("ack", "handled") and g.release["ok"]]
        if len({g.key for g in acks}) > 1:
            v.append(f"{len(acks)} acks accepted for one job: {[g.name() for g in acks]}")
        for a in acks:
            for b in gs:
                if b.key > a.key and b.e < a.release["s"] and b.p != "checker":
                    v.append(f"a stale holder's ack was accepted: {a.name()} after {b.name()} was granted")
                if b.s > a.release["e"] and b.key != a.key:
                    v.append(f"a job leased again after its ack was accepted: {b.name()} after {a.name()}")
        for a in gs:
            r = a.release
            if r is None or r.get("ok", True) or r["op"] == "abandon":
                continue
            if r["e"] >= live_end(a, with_release=False):
                continue  # its lease may have expired (or its process died) meanwhile
            if any(b.key > a.key and b.s < r["e"] for b in gs) or cancels.get(a.id):
                continue
            if any(p["s"] < r["e"] for p in purges):
                continue
            v.append(f"a live holder's {r['op']} was refused ({r.get('msg', r.get('err'))}): {a.name()}")

    states = run_.final["states"]
    max_attempts = run_.cfg["max_attempts"]
    drained = {item["g"][0] for item in run_.final["drained"]}
    for tag in sorted(set(invoked) | set(states)):
        if tag not in invoked:
            v.append(f"a job nobody enqueued is in the queue: {tag} {states[tag]}")
            continue
        gs = grants.get(tag, [])
        st = states.get(tag)
        acked = any(g.release and g.release["op"] in ("ack", "handled") and g.release["ok"] for g in gs)
        # a holder killed with the lease may have acked it in its last call
        unknown = any(g.release is None and g.p in killed for g in gs)
        purged = any(p["e"] > invoked[tag]["s"] for p in purges)
        jid = id_of.get(tag) or (gs[0].id if gs else None)
        cancelled = bool(jid and cancels.get(jid))
        if st is None:
            if tag not in enqueued:
                continue  # its enqueue failed or was cut short by a kill: either way is right
            if acked or unknown or purged or cancelled or tag in expires:
                continue  # finished (and retired with its segment), or removed by a purge
            v.append(f"job {tag} (id {jid}) was enqueued and is gone without an accepted ack "
                     f"({len(gs)} leases)")
            continue
        s = st["state"]
        if s in ("ready", "leased") and tag not in drained and tag not in expires:  # (or expired since)
            v.append(f"job {tag} was {s} at the end, and the drain never leased it")
        if s == "done" and not (acked or unknown):
            v.append(f"job {tag} is done, but no ack of it was accepted")
        if s == "dead" and st["attempts"] < max_attempts:
            v.append(f"job {tag} is dead after {st['attempts']} attempts of {max_attempts}")
        if s == "cancelled" and not cancelled:
            v.append(f"job {tag} is cancelled, but nobody cancelled it")
        if s == "expired" and tag not in expires:
            v.append(f"job {tag} expired, but was enqueued without an expiry")
        seen_attempts = max((g.attempts for g in gs if g.p != "checker"), default=0)
        if st["attempts"] < seen_attempts:
            v.append(f"job {tag} shows {st['attempts']} attempts after a lease with attempt {seen_attempts}")
    run_.stats = {
        "events": len(ev),
        "enqueued": len(enqueued),
        "enqueue_errors": sorted({x["err"] for x in ev if x["op"] == "enqueue" and not x["ok"]})[:3],
        "grants": sum(len(g) for g in grants.values()),
        "kills": len(killed),
        "drained": len(drained),
    }


# -- command line -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, action="append", help="replay this workload (repeatable)")
    ap.add_argument("--runs", type=int, default=20, help="random workloads to run (without --seed)")
    ap.add_argument("--keep", action="store_true", help="keep each run's queue and logs")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        d, cfg, index, label, logpath = a.worker
        worker_main(d, json.loads(cfg), int(index), label, logpath)
        return 0
    seeds = a.seed or [random.SystemRandom().randrange(2**32) for _ in range(a.runs)]
    bad = 0
    for seed in seeds:
        t = time.time()
        r = run(seed, keep=a.keep)
        print(f"seed {seed}: {len(r.violations)} violations, {r.stats}, {time.time() - t:.1f} s", flush=True)
        if a.verbose:
            print("  plan:", json.dumps(r.cfg))
        for line in r.violations[:20]:
            print("  VIOLATION:", line)
        bad += bool(r.violations)
    print(f"{len(seeds)} histories, {bad} with violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
