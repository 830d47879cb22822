"""Workflows across real processes: a random DAG run by Worker processes while one of them is
SIGKILLed again and again, and a debounce burst from four processes (docs/workflows.md).

The DAG's shape, its planned failures and the kills come from the run's seed (conftest's SEED,
printed); ``RINGQ_SLOW=1`` (or ``-m slow``) runs the issue's 500-job version as well.  Every
worker logs each handler start and end (one ``write`` on an ``O_APPEND`` file, so a SIGKILL
loses at most the line in flight); the checker then judges the history:

* every job that ran started after each of its parents finished (a parent's handler ended, or,
  killed, was last started) -- never before;
* every job ends as the DAG says: a planned failure dead, a job with a failed parent cancelled
  (its error naming a failed parent) and never run unless enqueued with ``allow_failure``, every
  other job done;
* nothing runs twice beyond at-least-once redelivery: a job's handler starts carry distinct
  fencing tokens, and every start but the last belongs to a process that was killed during it.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time

import pytest
from conftest import SEED
from procs import spawn

from ringq import JobState, Queue

WORKER = r"""
import json, os, sys, time
from ringq import Queue
from ringq.worker import Worker

d, logpath, label = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(logpath, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

def log(ev, job):
    rec = {"ev": ev, "id": job.id, "tok": job.lease_token, "t": time.time(), "p": label}
    os.write(fd, (json.dumps(rec) + "\n").encode())

def handler(job):
    log("start", job)
    time.sleep(job.payload["ms"] / 1000)
    log("end", job)
    if job.payload["fail"]:
        raise RuntimeError("planned failure")

q = Queue(d, visibility_timeout=3)
print("up", flush=True)
Worker(q, handler, concurrency=2, poll_interval=0.05).run()
"""


def plan(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        k = 0 if i < 3 or rng.random() < 0.2 else rng.randint(1, 3)
        parents = sorted(rng.sample(range(max(0, i - 25), i), min(k, i)))
        jobs.append(
            {
                "i": i,
                "parents": parents,
                "fail": rng.random() < 0.06,
                "allow": bool(parents) and rng.random() < 0.3,
                "ms": rng.choice((1, 5, 10, 20)),
            }
        )
    return jobs


def expected(jobs: list[dict]) -> list[JobState]:
    out: list[JobState] = []
    for j in jobs:
        failed = any(out[p] is not JobState.DONE for p in j["parents"])
        if failed and not j["allow"]:
            out.append(JobState.CANCELLED)
        else:
            out.append(JobState.DEAD if j["fail"] else JobState.DONE)
    return out


def run_dag(tmp_path, seed: int, n: int, kills_every: float) -> None:
    print(f"DAG seed {seed}: {n} jobs (replay: RINGQ_SEED={SEED})")
    rng = random.Random(seed ^ 0x5EED)
    jobs = plan(seed, n)
    d, logpath = str(tmp_path / "q"), str(tmp_path / "log.jsonl")
    q = Queue(d)
    killed: list[tuple[str, float]] = []  # (label, time of the kill)

    def start(label: str) -> subprocess.Popen:
        p = spawn(WORKER, d, logpath, label, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "up"
        return p

    steady = [start("s1"), start("s2")]
    victims = [start("v0")]
    stop = threading.Event()

    def killer() -> None:
        # SIGKILLs the victim again and again, from the first enqueue until the DAG finished.
        while not stop.wait(rng.uniform(0.5, 1.5) * kills_every):
            victims[-1].send_signal(signal.SIGKILL)
            victims[-1].wait()
            killed.append((f"v{len(victims) - 1}", time.time()))
            victims.append(start(f"v{len(victims)}"))

    kills = threading.Thread(target=killer)
    kills.start()
    try:
        # Enqueued while the workers run: a parent may finish while its dependent is written.
        for j in jobs:
            q.enqueue(
                {"ms": j["ms"], "fail": j["fail"], "i": j["i"]},
                job_id=f"j{j['i']}",
                max_attempts=1 if j["fail"] else 50,
                key=f"tenant-{j['i'] % 3}",  # the workers lease in fair order across keys
                depends_on=[f"j{p}" for p in j["parents"]] or None,
                allow_failure=j["allow"],
            )
            if rng.random() < 0.1:
                time.sleep(0.02)
        deadline = time.monotonic() + 120
        while True:
            st = q.stats()
            if st.ready + st.leased + st.deferred + st.delayed == 0:
                break
            assert time.monotonic() < deadline, (st, "the DAG did not finish")
            time.sleep(0.02)
    finally:
        stop.set()
        kills.join()
        for p in [*steady, victims[-1]]:
            p.send_signal(signal.SIGTERM)
        for p in [*steady, victims[-1]]:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert killed, "no worker was killed: the run is too short for its kill interval"

    with open(logpath) as f:
        log = [json.loads(line) for line in f if line.endswith("\n")]
    starts: dict[str, list[dict]] = {}
    ends: dict[str, list[dict]] = {}
    for r in log:
        (starts if r["ev"] == "start" else ends).setdefault(r["id"], []).append(r)
    kill_of = dict(killed)
    again = sum(len(v) - 1 for v in starts.values())
    print(f"{len(killed)} kills, {again} runs redelivered after a kill")
    want = expected(jobs)
    problems = []
    for j in jobs:
        jid = f"j{j['i']}"
        got = q.get(jid)
        if got.state is not want[j["i"]]:
            problems.append(f"{jid}: {got.state.value}, expected {want[j['i']].value}")
        mine = starts.get(jid, [])
        if want[j["i"]] is JobState.CANCELLED:
            if mine:
                problems.append(f"{jid} ran though a parent failed: {mine}")
            failed = [f"j{p}" for p in j["parents"] if want[p] is not JobState.DONE]
            if not any(repr(p) in (got.last_error or "") for p in failed):
                problems.append(f"{jid}: error {got.last_error!r} names none of {failed}")
            continue
        if not mine:
            problems.append(f"{jid} never ran")
            continue
        tokens = [r["tok"] for r in mine]
        if len(set(tokens)) != len(tokens):
            problems.append(f"{jid}: one lease ran twice: {mine}")
        for r in sorted(mine, key=lambda r: r["t"])[:-1]:
            if r["p"] not in kill_of or kill_of[r["p"]] < r["t"]:
                problems.append(f"{jid} ran again though its holder {r['p']} was not killed: {mine}")
        first = min(r["t"] for r in mine)
        for p in j["parents"]:
            pid = f"j{p}"
            done_at = [r["t"] for r in ends.get(pid, [])] or [
                r["t"] for r in starts.get(pid, [])
            ][-1:]
            if want[p] is JobState.CANCELLED:
                continue  # never ran: cancelled when its own failed parent finished
            if not done_at or first < min(done_at):
                problems.append(f"{jid} started at {first} before its parent {pid} finished")
    assert not problems, f"DAG seed {seed}:\n" + "\n".join(problems[:20])
    st = q.stats()
    assert (st.deferred, st.ready, st.leased, st.total) == (0, 0, 0, n)
    q.close()


def test_a_random_dag_run_by_workers_while_one_is_killed_again_and_again(tmp_path):
    run_dag(tmp_path, random.Random(SEED).randrange(2**32), 200, kills_every=0.3)


@pytest.mark.slow
def test_a_500_job_dag_run_by_workers_while_one_is_killed_again_and_again(tmp_path):
    run_dag(tmp_path, random.Random(SEED + 1).randrange(2**32), 500, kills_every=0.3)


DEBOUNCER = r"""
import json, sys, time
from ringq import Queue
d, label, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = Queue(d)
sys.stdin.readline()  # every process starts its burst together
for i in range(n):
    t0 = time.time()
    q.enqueue({"from": label, "i": i}, job_id="report", debounce=30)
    print(json.dumps([label, i, t0, time.time()]), flush=True)
"""


def test_debounce_from_four_processes_runs_once_with_the_last_payload(tmp_path):
    d = str(tmp_path / "q")
    q = Queue(d)
    procs = [
        spawn(DEBOUNCER, d, f"p{k}", "25", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for k in range(4)
    ]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    calls = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        calls += [json.loads(line) for line in out.splitlines()]
    assert len(calls) == 100
    st = q.stats()
    assert (st.total, st.delayed, st.enqueued_total) == (1, 1, 100)
    q.reschedule("report", delay=0)  # the run after the burst, now
    job = q.lease_one()
    # The last payload: no other enqueue began after this one returned.
    label, i = job.payload["from"], job.payload["i"]
    mine = next(c for c in calls if c[0] == label and c[1] == i)
    later = [c for c in calls if c[2] > mine[3]]
    assert not later, (job.payload, later[:3])
    q.ack(job)
    assert q.lease_one() is None and q.stats().total == 1
    q.close()
