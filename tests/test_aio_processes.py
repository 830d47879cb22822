"""ringq.aio across real OS processes: SIGKILL and SIGSTOP mid-handler, two servers on one queue.

Every test runs on both backends (``target``: a directory, or a database of a real redis-server).
On Redis a dead process's leases come back only after the visibility timeout, so the tests that
kill a holder use a short one there.
"""

import asyncio
import signal
import subprocess
import time

from procs import spawn

from ringq.aio import Queue, Status

# A serving process.  argv: target (directory or URL), log file, mode, visibility timeout, [job count to wait for].
#   hang:   submit one job of kind "work" whose handler logs "start" and never returns
#   block:  the same, but the handler blocks the loop for 1.5 s and then returns
#   long:   the same, but the handler awaits 1.5 s (the loop runs: heartbeats go on) and returns
#   finish: serve "work" (log "run", return "done by <pid>") until no job is unfinished
#   share:  serve "w" with concurrency 4 until no job is unfinished, logging S/E around each run
#   serve:  the same, without waiting for a second server first
SERVER = r"""
import asyncio, os, random, sys, time
from ringq.aio import Queue

target, logf, mode, vt = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
queue = Queue(target, visibility_timeout=vt, slot_size=128, slot_count=256)
fd = os.open(logf, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

def log(*words):
    os.write(fd, (" ".join(str(w) for w in words) + "\n").encode())

@queue.handler("work")
async def work(job):
    if mode == "hang":
        log("start", job.id, os.getpid())
        await asyncio.sleep(3600)
    if mode == "block":
        log("start", job.id, os.getpid())
        time.sleep(1.5)  # blocks the whole loop: no heartbeat, the lease expires
        log("unblocked", job.id, os.getpid())
    if mode == "long":
        log("start", job.id, os.getpid())
        await asyncio.sleep(1.5)
    log("run", job.id, os.getpid())
    return f"done by {os.getpid()}"

@queue.handler("w", concurrency=4)
async def w(job):
    log("S", job.id, os.getpid(), time.time())
    await asyncio.sleep(random.uniform(0.001, 0.006))
    log("E", job.id, os.getpid(), time.time())
    return os.getpid()

async def main():
    if mode == "share":  # a barrier, so that both servers take part
        open(f"{logf}.ready.{os.getpid()}", "w").close()
        d, base = os.path.split(logf)
        while sum(f.startswith(base + ".ready.") for f in os.listdir(d)) < 2:
            await asyncio.sleep(0.005)
    async with queue:
        if mode == "hang":
            print(queue.submit("work", None), flush=True)
            await asyncio.sleep(3600)
        if mode in ("block", "long"):
            print(queue.submit("work", None), flush=True)
        while queue.running():
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # anything run twice would show now
        assert not queue.running()

asyncio.run(main())
"""


def read_log(path):
    try:
        with open(path) as fh:
            return [line.split() for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def wait_for(pred, timeout=20.0):
    t = time.monotonic()
    while not pred():
        assert time.monotonic() - t < timeout, "condition not reached in time"
        time.sleep(0.01)


def get(target, job_id):
    async def main():
        async with Queue(target) as q:
            return q.get(job_id)

    return asyncio.run(main())


def start_holder(target, logf, mode, vt):
    """A server that submitted one job and is running its handler: (process, job id)."""
    proc = spawn(SERVER, target, logf, mode, vt, stdout=subprocess.PIPE, text=True)
    job_id = proc.stdout.readline().strip()
    wait_for(lambda: any(r[0] == "start" for r in read_log(logf)))
    return proc, job_id


def reclaim_timeout(target):
    """A visibility timeout for tests that kill a holder: on Redis only it brings the job back."""
    return "1.0" if "://" in target else "30"


def test_sigkilled_process_mid_handler_job_reruns_in_the_next_process_and_finishes_once(
    target, tmp_path
):
    logf = str(tmp_path / "log")
    vt = reclaim_timeout(target)
    a, job_id = start_holder(target, logf, "hang", vt)
    try:
        assert get(target, job_id).status is Status.RUNNING
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait()
    t = time.monotonic()
    b = spawn(SERVER, target, logf, "finish", vt)
    assert b.wait(60) == 0
    waited = time.monotonic() - t
    if (
        "://" in target
    ):  # the lease expires: at least two thirds of the timeout after the last heartbeat
        assert 0.6 <= waited < 10
    else:
        assert waited < 10  # far less than the 30 s visibility timeout: the owner lock died
    rows = read_log(logf)
    assert [(r[0], r[1], int(r[2])) for r in rows] == [
        ("start", job_id, a.pid),
        ("run", job_id, b.pid),
    ]
    job = get(target, job_id)
    assert job.status is Status.DONE and job.result == f"done by {b.pid}" and job.attempts == 2
    c = spawn(SERVER, target, logf, "finish", vt)  # a third process finds nothing to rerun
    assert c.wait(60) == 0
    assert len(read_log(logf)) == 2


def test_stuck_process_loses_its_job_to_another_after_the_visibility_timeout(target, tmp_path):
    logf = str(tmp_path / "log")
    a, job_id = start_holder(target, logf, "hang", "1.0")
    b = None
    try:
        a.send_signal(signal.SIGSTOP)  # alive, holding its owner lock, but stuck: no heartbeat
        t = time.monotonic()
        b = spawn(SERVER, target, logf, "finish", "1.0")
        assert b.wait(60) == 0
        waited = time.monotonic() - t
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait()
        if b is not None and b.poll() is None:
            b.kill()
    assert 0.7 <= waited < 10
    runs = [r for r in read_log(logf) if r[0] == "run"]
    assert [(r[1], int(r[2])) for r in runs] == [(job_id, b.pid)]
    job = get(target, job_id)
    assert job.status is Status.DONE and job.result == f"done by {b.pid}"


def test_a_holder_that_lost_its_lease_stores_no_result(target, tmp_path):
    logf = str(tmp_path / "log")
    a, job_id = start_holder(target, logf, "block", "0.3")
    try:
        b = spawn(SERVER, target, logf, "finish", "0.3")  # takes the job once A's lease expires
        assert b.wait(60) == 0
        assert a.wait(60) == 0
    finally:
        if a.poll() is None:
            a.kill()
    rows = [(r[0], int(r[2])) for r in read_log(logf)]
    assert ("unblocked", a.pid) in rows and (
        "run",
        b.pid,
    ) in rows  # both ran the handler to its end
    job = get(target, job_id)
    assert job.status is Status.DONE and job.result == f"done by {b.pid}"  # only the holder stored


def test_two_processes_serving_one_queue_never_run_a_job_at_the_same_time(target, tmp_path):
    logf = str(tmp_path / "log")

    async def submit():
        async with Queue(target, slot_size=128, slot_count=256) as q:  # a producer with no handlers
            return [q.submit("w", i) for i in range(300)]

    ids = asyncio.run(submit())
    servers = [spawn(SERVER, target, logf, "share", "0.5") for _ in range(2)]
    assert all(s.wait(60) == 0 for s in servers)
    rows = read_log(logf)
    spans: dict[str, list[list[float]]] = {}
    for kind, job_id, pid, at in rows:
        if kind == "S":
            spans.setdefault(job_id, []).append([float(at), None, pid])
        else:
            span = next(s for s in spans[job_id] if s[2] == pid and s[1] is None)
            span[1] = float(at)
    assert sorted(spans) == sorted(ids)
    for job_id, runs in spans.items():
        runs.sort()
        for x, y in zip(runs, runs[1:]):
            assert x[1] <= y[0], f"job {job_id} ran in two places at once: {runs}"
    assert all(len(runs) == 1 for runs in spans.values())  # healthy servers: exactly once
    pids = {s.pid for s in servers}
    assert {runs[0][2] for runs in spans.values()} == {str(p) for p in pids}  # both took part

    async def check():
        async with Queue(target) as q:
            done = [q.get(i) for i in ids]
            assert all(j.status is Status.DONE for j in done)
            assert {j.result for j in done} == pids
            assert q.running() == []

    asyncio.run(check())


def test_repeated_sigkills_of_a_busy_server_lose_nothing_and_rerun_only_what_was_running(
    target, tmp_path
):
    logf = str(tmp_path / "log")

    async def submit():
        async with Queue(target, slot_size=128, slot_count=256) as q:
            return [q.submit("w", i) for i in range(200)]

    ids = asyncio.run(submit())
    vt = reclaim_timeout(target)
    for k in range(3):
        server = spawn(SERVER, target, logf, "serve", vt)
        ended = 40 * (k + 1)
        wait_for(
            lambda s=server, n=ended: (
                sum(r[0] == "E" for r in read_log(logf)) >= n or s.poll() is not None
            )
        )
        server.send_signal(signal.SIGKILL)
        server.wait()
    last = spawn(SERVER, target, logf, "serve", vt)
    assert last.wait(60) == 0
    starts: dict[str, int] = {}
    ends: set[str] = set()
    for kind, job_id, _pid, _at in read_log(logf):
        if kind == "S":
            starts[job_id] = starts.get(job_id, 0) + 1
        else:
            ends.add(job_id)
    assert ends == set(ids)  # every job ran to completion somewhere
    rerun = [j for j, n in starts.items() if n > 1]
    assert len(rerun) <= 3 * 4  # only what was running at a kill: concurrency 4, three kills

    async def check():
        async with Queue(target) as q:
            done = [q.get(i) for i in ids]
            assert all(j.status is Status.DONE for j in done)
            assert all(j.attempts >= starts[j.id] for j in done)
            assert q.running() == []

    asyncio.run(check())


SUBMITTER = r"""
import asyncio, sys
from ringq.aio import Queue

queue = Queue(sys.argv[1], slot_size=128, slot_count=64)

@queue.handler("echo")
async def echo(job):
    return job.payload

async def main():
    async with queue:
        i = 0
        while True:
            job_id = queue.submit("echo", i)
            print(job_id, flush=True)  # only after submit returned: the job is durable
            i += 1
            if i % 10 == 0:
                await asyncio.sleep(0)

asyncio.run(main())
"""


def test_every_submit_that_returned_survives_a_sigkill(target):
    proc = spawn(SUBMITTER, target, stdout=subprocess.PIPE, text=True)
    returned = []
    while len(returned) < 300:
        returned.append(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    returned += [
        line.strip() for line in proc.stdout.read().splitlines() if len(line.strip()) == 32
    ]

    async def check():
        async with Queue(target) as q:
            jobs = [q.get(i) for i in returned]
            assert all(j is not None for j in jobs)
            assert [j.payload for j in jobs] == list(range(len(returned)))
            # the unfinished ones are there to be rerun
            assert {j.id for j in q.running()} == {j.id for j in jobs if j.status is Status.RUNNING}

    asyncio.run(check())


def test_a_healthy_handler_outliving_the_visibility_timeout_keeps_its_job(target, tmp_path):
    logf = str(tmp_path / "log")
    a, job_id = start_holder(target, logf, "long", "0.3")  # runs 1.5 s = 5 visibility timeouts
    try:
        b = spawn(SERVER, target, logf, "finish", "0.3")  # would take the job if its lease lapsed
        assert b.wait(60) == 0
        assert a.wait(60) == 0
    finally:
        if a.poll() is None:
            a.kill()
    assert [(r[0], int(r[2])) for r in read_log(logf)] == [("start", a.pid), ("run", a.pid)]
    job = get(target, job_id)
    assert job.status is Status.DONE and job.result == f"done by {a.pid}" and job.attempts == 1


PRUNER = r"""
import asyncio, sys
from ringq.aio import Queue

queue = Queue(sys.argv[1], keep_jobs=10, keep_seconds=None, sweep_interval=3600, durability="none",
              slot_size=128, slot_count=64)

async def main():
    async with queue:
        print("ready", flush=True)
        sys.stdin.readline()
        total = 0
        for _ in range(50):
            total += queue.prune()
        print(total, flush=True)

asyncio.run(main())
"""


def test_two_processes_pruning_at_once_keep_exactly_the_newest(target):
    opts = dict(keep_jobs=None, keep_seconds=None, durability="none", slot_size=128, slot_count=64)
    queue = Queue(target, **opts)

    @queue.handler("x")
    async def x(job):
        return job.payload

    async def finish_all():
        async with queue:
            ids = [queue.submit("x", i) for i in range(300)]
            while queue.running():
                await asyncio.sleep(0.01)
            return ids

    ids = asyncio.run(finish_all())
    pruners = [
        spawn(PRUNER, target, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in pruners:
        assert p.stdout.readline().strip() == "ready"
    for p in pruners:
        p.stdin.write("go\n")
        p.stdin.flush()
    pruned = [int(p.communicate(timeout=60)[0]) for p in pruners]
    assert sum(pruned) == 290

    async def check():
        async with Queue(target, **opts) as q:
            kept = [q.get(i) for i in ids]
            assert [j is not None for j in kept] == [False] * 290 + [True] * 10

    asyncio.run(check())
