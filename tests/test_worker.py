"""Worker: ack on return, nack on exception, DLQ, heartbeats, graceful stop, limits, processes.

Real queues in real directories, real threads, real child processes and real signals.  Times are
short (visibility timeouts of a fraction of a second) but nothing asserts on speed: every wait is a
bounded poll for a condition.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from procs import child_env

from ringq import BackoffPolicy, JobState, Queue
from ringq.worker import Worker

NO_BACKOFF = BackoffPolicy(base=0.0, jitter=0.0)


def _queue(path, **kw) -> Queue:
    kw.setdefault("backoff", NO_BACKOFF)
    return Queue(path, **kw)


def _wait_for(cond, timeout: float = 20.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _run_in_thread(worker: Worker) -> tuple[threading.Thread, dict]:
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("stats", worker.run()), daemon=True)
    t.start()
    return t, box


def test_return_acks_and_exception_nacks_with_type_and_message(tmp_path):
    with _queue(tmp_path, max_attempts=1) as q:
        ok = q.enqueue({"n": 1})
        bad = q.enqueue({"n": -1})

        def handler(job):
            if job.payload["n"] < 0:
                raise ValueError(f"negative: {job.payload['n']}")

        stats = Worker(q, handler, idle_timeout=0.3, handle_signals=False).run()
        assert q.get(ok.id).state is JobState.DONE
        dead = q.get(bad.id)
        assert dead.state is JobState.DEAD
        assert dead.last_error == "ValueError: negative: -1"
        assert (stats.leased, stats.succeeded, stats.failed, stats.dead, stats.lost_leases) == (2, 1, 1, 1, 0)


def test_handler_raising_goes_to_dlq_after_max_attempts(tmp_path):
    with _queue(tmp_path, max_attempts=3) as q:
        job = q.enqueue("poison")
        calls = []

        def handler(j):
            calls.append(j.attempts)
            raise RuntimeError("cannot digest")

        stats = Worker(q, handler, idle_timeout=0.5, handle_signals=False).run()
        assert calls == [1, 2, 3]
        dead = q.get(job.id)
        assert dead.state is JobState.DEAD and dead.attempts == 3
        assert dead.last_error == "RuntimeError: cannot digest"
        assert [j.id for j in q.dlq()] == [job.id]
        assert (stats.failed, stats.dead, stats.succeeded) == (3, 1, 0)


def _steal_attempts(path, started: threading.Event, stop: threading.Event, stolen: list) -> None:
    """Another consumer (its own Queue, so its own owner identity) leasing as fast as it can."""
    started.wait(10)
    with _queue(path, visibility_timeout=0.5) as other:
        while not stop.is_set():
            job = other.lease_one(wait=0.05)
            if job is not None:
                stolen.append(job)
                other.ack(job)


@pytest.mark.parametrize(
    "heartbeat",
    [None, __import__("numpy").float32(0.15), 60.0],
    ids=["heartbeat", "numpy-heartbeat", "no-heartbeat-control"],
)
def test_heartbeat_protects_a_handler_slower_than_the_visibility_timeout(tmp_path, heartbeat):
    vt = 0.5
    with _queue(tmp_path, visibility_timeout=vt) as q:
        job = q.enqueue("slow")
        started, stop, stolen = threading.Event(), threading.Event(), []
        thief = threading.Thread(target=_steal_attempts, args=(tmp_path, started, stop, stolen), daemon=True)
        thief.start()

        def handler(j):
            started.set()
            time.sleep(vt * 3.2)  # well past the visibility timeout

        try:
            stats = Worker(q, handler, max_jobs=1, heartbeat=heartbeat, handle_signals=False).run()
        finally:
            stop.set()
            thief.join(10)
        if heartbeat is None or heartbeat < 1:  # default: beats every vt/3
            assert stolen == []
            assert (stats.succeeded, stats.lost_leases) == (1, 0)
            done = q.get(job.id)
            assert done.state is JobState.DONE and done.attempts == 1
        else:  # the control: without beats the lease expires and the job is redelivered
            assert [j.id for j in stolen] == [job.id]
            assert (stats.succeeded, stats.lost_leases) == (0, 1)


def test_heartbeat_keeps_the_deadline_near_now_plus_visibility_timeout(tmp_path):
    vt = 0.6
    with _queue(tmp_path, visibility_timeout=vt) as q:
        job = q.enqueue("slow")
        seen = []

        def handler(j):
            for _ in range(6):
                time.sleep(0.25)
                seen.append(q.get(j.id).lease_deadline - time.time())

        Worker(q, handler, max_jobs=1, handle_signals=False).run()
        assert q.get(job.id).state is JobState.DONE
        # Beats move the deadline to now + vt; they never pile extensions on top of each other.
        assert max(seen) <= vt + 0.05, seen


def test_stop_mid_handler_finishes_and_acks_it(tmp_path):
    with _queue(tmp_path) as q:
        first = q.enqueue("first")
        rest = q.enqueue_many(["second", "third"])
        started, release = threading.Event(), threading.Event()

        def handler(j):
            started.set()
            release.wait(10)

        w = Worker(q, handler, handle_signals=False)
        t, box = _run_in_thread(w)
        assert started.wait(10)
        w.stop()
        release.set()
        t.join(10)
        assert not t.is_alive()
        assert q.get(first.id).state is JobState.DONE
        assert [q.get(j.id).state for j in rest] == [JobState.READY, JobState.READY]
        assert (box["stats"].succeeded, box["stats"].leased) == (1, 1)


def test_job_purged_while_its_handler_runs_does_not_kill_the_worker(tmp_path):
    with _queue(tmp_path) as q:
        q.enqueue("purge-me")
        seen = []

        def handler(j):
            seen.append(j.payload)
            if j.payload == "purge-me":
                with _queue(tmp_path) as other:  # another client purges under our feet
                    other.purge()
                    other.enqueue("after")

        stats = Worker(q, handler, idle_timeout=0.5, handle_signals=False).run()
        assert seen == ["purge-me", "after"]
        assert (stats.succeeded, stats.lost_leases) == (1, 1)
        assert q.stats().done == 1


def test_max_jobs_stops_the_worker(tmp_path):
    with _queue(tmp_path) as q:
        q.enqueue_many(list(range(5)))
        stats = Worker(q, lambda j: None, concurrency=2, max_jobs=2, handle_signals=False).run()
        assert stats.leased == 2 and stats.succeeded == 2
        st = q.stats()
        assert (st.done, st.ready) == (2, 3)


def test_idle_timeout_stops_an_idle_worker_but_not_a_busy_one(tmp_path):
    with _queue(tmp_path) as q:
        stats = Worker(q, lambda j: None, idle_timeout=0.3, handle_signals=False).run()
        assert stats.leased == 0
        # A handler running longer than idle_timeout is not "idle": the job after it still runs.
        q.enqueue_many(["slow", "next"])
        stats = Worker(q, lambda j: time.sleep(0.6 if j.payload == "slow" else 0), idle_timeout=0.3,
                       handle_signals=False).run()
        assert stats.succeeded == 2


def test_processes_mode_processes_every_job_exactly_once(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    qdir = tmp_path / "q"
    with _queue(qdir) as q:
        ids = [j.id for j in q.enqueue_many([{"i": i} for i in range(60)])]

        def handler(j):  # runs in forked children: record who ran what, with O_APPEND
            fd = os.open(ledger / f"{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                os.write(fd, f"{j.id}\n".encode())
            finally:
                os.close(fd)

        stats = Worker(q, handler, processes=2, concurrency=2, idle_timeout=0.5, handle_signals=False).run()
        runs = [line for f in ledger.iterdir() for line in f.read_text().split()]
        assert sorted(runs) == sorted(ids)
        assert os.getpid() not in {int(f.stem) for f in ledger.iterdir()}
        assert stats.succeeded == 60 and stats.leased == 60
        assert q.stats().done == 60


def _record_child_options(out: str, parent_queue: int, qdir: str, job) -> None:
    # Runs in a forked child: the options of the queue that child opened itself on ``qdir`` (not
    # the parent's object, which fork copied into the child, nor queues of earlier tests that the
    # test process still holds).
    import dataclasses
    import gc
    import json

    try:
        mine = []
        for o in gc.get_objects():
            if isinstance(o, Queue) and id(o) != parent_queue:
                try:
                    if not o.closed and str(o.path) == qdir:
                        mine.append(o)
                except Exception:  # noqa: BLE001 - an earlier test's Queue whose __init__ raised
                    continue
        row = {"pid": os.getpid(), "options": [dataclasses.asdict(o.options) for o in mine]}
    except Exception as exc:  # noqa: BLE001 - reported to the test, not retried in silence
        row = {"pid": os.getpid(), "error": repr(exc)}
    with open(out, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def test_processes_mode_children_open_the_queue_with_every_option_of_the_parent(tmp_path):
    import dataclasses
    import json

    out = tmp_path / "opts.jsonl"
    qdir = tmp_path / "q"
    with Queue(qdir, durability="fdatasync", sync_acks=True, flush_interval=0.2, state_flush_interval=None,
               lock_timeout=3.0, mode=0o640, allow_network_fs=True, visibility_timeout=12.0, max_attempts=7,
               backoff=BackoffPolicy(base=0.5, jitter=0.0), slot_size=128, slot_count=64) as q:
        q.enqueue_many([1, 2])
        Worker(q, functools.partial(_record_child_options, str(out), id(q), str(qdir)), processes=1, max_jobs=2,
               idle_timeout=10, handle_signals=False).run()  # ends after both jobs; a loaded machine's slow child start is no idle time
        expected = json.loads(json.dumps(dataclasses.asdict(q.options)))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["pid"] != os.getpid() and "error" not in r for r in rows), rows
    for r in rows:
        assert r["options"] == [expected]
    assert expected["sync_acks"] and expected["state_flush_interval"] is None and expected["mode"] == 0o640


# -- real signals to a worker process started with the CLI ---------------------------------------------

HANDLERS = textwrap.dedent("""
    import os, time

    def slow(job):
        marks = os.environ["MARKS"]
        open(os.path.join(marks, f"started-{job.id}"), "w").close()
        time.sleep(float(os.environ.get("SLOW", "1.0")))
        open(os.path.join(marks, f"finished-{job.id}"), "w").close()
""")


def _spawn_worker(tmp_path, *extra: str, slow: float = 1.0) -> tuple[subprocess.Popen, str]:
    (tmp_path / "handlers_mod.py").write_text(HANDLERS)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    env = dict(child_env(), MARKS=str(marks), SLOW=str(slow))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(tmp_path)) if p)
    proc = subprocess.Popen([sys.executable, "-m", "ringq", "--dir", str(tmp_path / "q"), "work",
                             "handlers_mod:slow", *extra], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, str(marks)


@pytest.mark.parametrize("mode", [[], ["--processes", "2"]], ids=["threads", "processes"])
def test_sigterm_mid_handler_finishes_and_acks(tmp_path, mode):
    with _queue(tmp_path / "q") as q:
        jobs = q.enqueue_many(["a", "b", "c", "d", "e"])
    proc, marks = _spawn_worker(tmp_path, *mode)
    try:
        _wait_for(lambda: any(n.startswith("started-") for n in os.listdir(marks)), what="a handler to start")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    started = {n.split("-", 1)[1] for n in os.listdir(marks) if n.startswith("started-")}
    finished = {n.split("-", 1)[1] for n in os.listdir(marks) if n.startswith("finished-")}
    assert started and started == finished  # every handler that began, finished
    with _queue(tmp_path / "q") as q:
        states = {j.id: q.get(j.id).state for j in jobs}
    assert {i for i, s in states.items() if s is JobState.DONE} == started
    assert all(s is JobState.READY for i, s in states.items() if i not in started)


def test_second_sigint_aborts_and_the_lease_comes_back(tmp_path):
    with _queue(tmp_path / "q") as q:
        job = q.enqueue("a")
    proc, marks = _spawn_worker(tmp_path, slow=30.0)
    try:
        _wait_for(lambda: os.listdir(marks), what="the handler to start")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    with _queue(tmp_path / "q") as q:  # its holder is dead: the lease comes back at once
        j = q.get(job.id)
        assert j.state is JobState.READY and j.attempts == 1


def test_stop_before_children_start_stops_them_cleanly(tmp_path):
    with _queue(tmp_path) as q:
        q.enqueue_many(list(range(5)))
        w = Worker(q, lambda j: time.sleep(0.05), processes=2, handle_signals=False)
        w.stop()  # before run(): the children must see it as a stop request, not die of SIGTERM
        stats = w.run()
        assert [p.exitcode for p in w.pool.children] == [0, 0]
        assert stats.leased == stats.succeeded
        assert q.stats().leased == 0


def _note_pid_and_nap(path: str, job) -> None:
    with open(path, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    time.sleep(0.005)


def test_a_killed_worker_process_is_replaced_and_its_work_counted(qdir, tmp_path):
    pids = tmp_path / "pids"
    pids.touch()
    with Queue(qdir, visibility_timeout=60) as q:
        q.enqueue_many(list(range(600)))
        w = Worker(q, functools.partial(_note_pid_and_nap, str(pids)), concurrency=2, processes=2,
                   idle_timeout=1.0, handle_signals=False)
        out = {}
        runner = threading.Thread(target=lambda: out.setdefault("stats", w.run()))
        runner.start()
        deadline = time.monotonic() + 60
        while len(pids.read_text().split()) < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        victim = int(pids.read_text().split()[0])
        os.kill(victim, signal.SIGKILL)
        runner.join(120)
        assert not runner.is_alive()
        stats = out["stats"]
        assert w.restarts == 1
        assert q.stats().acked_total == 600 and q.stats().ready == 0
        by_victim = pids.read_text().split().count(str(victim))
        assert by_victim >= 40  # the victim did a good share before it died...
        # ...and it is counted: every ack but at most one caught between its ack and its count.
        assert 599 <= stats.succeeded <= 600, stats
        assert stats.leased >= stats.succeeded


def test_a_redis_outage_logs_a_few_lines_and_backs_off(spawn_redis, caplog):
    import logging
    import re

    import ringq

    server = spawn_redis()
    q = ringq.connect(server.url, "outage")
    done = []
    worker = Worker(q, lambda job: done.append(job.payload), concurrency=4, handle_signals=False)
    runner = threading.Thread(target=worker.run)
    caplog.set_level(logging.INFO, logger="ringq.worker")
    runner.start()
    try:
        q.enqueue("before")
        _until(lambda: done == ["before"])
        _until(lambda: q.stats().acked_total == 1)  # its ack is in, not racing the kill below
        server.kill()
        down = time.monotonic()
        _until(lambda: any("lease failed" in r.getMessage() for r in caplog.records))
        time.sleep(max(0.0, 4.0 - (time.monotonic() - down)))  # the outage of the reproducer: 4 s
        server.start()
        _until(lambda: any("lease works again" in r.getMessage() for r in caplog.records))
        q.enqueue("after")
        _until(lambda: done == ["before", "after"])
    finally:
        worker.stop()
        runner.join(30)
    lines = [r for r in caplog.records if r.name == "ringq.worker"]
    assert 2 <= len(lines) <= 3, [r.getMessage() for r in lines]  # first, maybe one "still", recovery
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert lines[0].getMessage().startswith("lease failed: ")
    failures = int(re.search(r"\((\d+) failures\)", lines[-1].getMessage())[1])
    assert failures <= 4 * 12  # 4 threads backing off to 1 s over ~4 s; at a 0.1 s poll it was ~160


def _until(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.mark.parametrize(
    "kw",
    [
        dict(concurrency=float("nan")),
        dict(concurrency=2.5),
        dict(concurrency=10**20),
        dict(concurrency=__import__("numpy").timedelta64(2, "s")),
        dict(heartbeat=__import__("numpy").timedelta64(2, "s")),
        dict(processes=-1),
        dict(max_jobs=2.5),
        dict(max_jobs=0),
        dict(idle_timeout=float("nan")),
        dict(idle_timeout=10**400),
        dict(poll_interval=0),
        dict(heartbeat=float("inf")),
        dict(grace=10**400),
        dict(grace=-1),
    ],
    ids=repr,
)
def test_a_worker_option_that_would_kill_or_stall_a_thread_is_a_value_error(tmp_path, kw):
    with _queue(tmp_path) as q, pytest.raises(ValueError, match="must be"):
        Worker(q, lambda job: None, handle_signals=False, **kw)


def test_numpy_numbers_are_taken_for_every_worker_option(tmp_path):
    import numpy as np

    with _queue(tmp_path) as q:
        q.enqueue_many([1, 2])
        w = Worker(
            q,
            lambda job: None,
            concurrency=np.int64(2),
            poll_interval=np.float32(0.05),
            max_jobs=np.int32(2),
            idle_timeout=np.float16(0.5),
            heartbeat=np.float32(1),
            grace=np.int64(1),
            handle_signals=False,
        )
        assert w.run().succeeded == 2
