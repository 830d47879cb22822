"""Durability strategies (ringq/engine/durability.py): each one round-trips, group commit shares syncs
across real processes without losing a job, the interval flusher and the state flush run.

No assertion here is about speed; "fewer syncs than jobs" counts syscalls, it does not time them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest
from procs import spawn

from ringq import Queue
from ringq.codec import JSON
from ringq.engine.durability import STRATEGIES, position
from ringq.engine.records import NewRecord
from ringq.engine.ring import Ring

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wait_for(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


@pytest.mark.parametrize("durability", STRATEGIES)
def test_strategy_round_trips_across_processes(tmp_path, durability):
    with Queue(tmp_path, durability=durability, slot_count=32) as q:
        for i in range(40):  # crosses segment rotations
            q.enqueue({"i": i})
        q.enqueue_many([{"i": i} for i in range(40, 100)])
    # A fresh process sees every job, in order.
    code = (
        "import sys, json; from ringq import Queue\n"
        f"q = Queue(sys.argv[1], durability={durability!r})\n"
        "out = []\n"
        "while (j := q.lease_one()) is not None:\n"
        "    out.append(j.payload['i']); q.ack(j)\n"
        "print(json.dumps(out)); q.close()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == list(range(100))


def test_unknown_strategy_and_bad_intervals_are_refused(tmp_path):
    with pytest.raises(ValueError, match="durability must be one of"):
        Queue(tmp_path, durability="sometimes")
    with pytest.raises(ValueError, match="flush_interval"):
        Queue(tmp_path, durability="interval", flush_interval=0)
    with pytest.raises(ValueError, match="state_flush_interval"):
        Queue(tmp_path, state_flush_interval=-1)


def test_numpy_intervals_are_taken_and_the_flusher_lives(tmp_path):
    import threading

    import numpy as np

    died: list[BaseException | None] = []
    before, threading.excepthook = threading.excepthook, lambda a: died.append(a.exc_value)
    try:
        for kw in (
            dict(durability="interval", flush_interval=np.float32(0.01), state_flush_interval=np.int64(1)),
            dict(state_flush_interval=np.float32(0.02)),
            dict(state_flush_interval=np.float16(0.05)),
        ):
            with Queue(tmp_path / str(len(died)), **kw) as q:
                for i in range(3):
                    q.enqueue(i)
                    q.ack(q.lease_one())
                    time.sleep(0.06)  # the flusher runs meanwhile
            assert died == [], (kw, died)
    finally:
        threading.excepthook = before


@pytest.mark.parametrize(
    "kw",
    [
        dict(flush_interval=10**400),
        dict(flush_interval=float("inf")),
        dict(state_flush_interval=1e300),
        dict(state_flush_interval=float("nan")),
        dict(state_flush_interval=True),
    ],
    ids=repr,
)
def test_an_interval_the_flusher_cannot_sleep_is_a_value_error(tmp_path, kw):
    with pytest.raises(ValueError, match="flush_interval must be a number of seconds"):
        Queue(tmp_path, durability="interval", **kw)


def test_fsync_false_still_means_none(tmp_path):
    with Queue(tmp_path, fsync=False) as q:
        assert q.durability == "none"
        q.enqueue(1)
        assert q.sync_counters()["queue_append_syncs"] == 0


@pytest.mark.parametrize("durability", ["msync", "fdatasync", "group"])
def test_durable_strategies_sync_before_returning(tmp_path, durability):
    with Queue(tmp_path, durability=durability) as q:
        q.enqueue("a")
        assert q.sync_counters()["queue_append_syncs"] == 1
        q.enqueue_many(["b"] * 10)  # one sync per call, not per job
        assert q.sync_counters()["queue_append_syncs"] == 2


def _group_producer(path: str, who: int, n: int, go) -> None:
    q = Queue(path, durability="group", slot_count=256)
    go.wait()
    for i in range(n):
        q.enqueue({"p": who, "i": i})
    q.close()


def test_group_commit_four_processes_loses_nothing_and_shares_syncs(tmp_path):
    n, procs = 300, 4
    Queue(tmp_path, durability="group", slot_count=256).close()
    ctx = mp.get_context("fork")
    go = ctx.Event()
    ps = [ctx.Process(target=_group_producer, args=(str(tmp_path), w, n, go)) for w in range(procs)]
    for p in ps:
        p.start()
    go.set()
    for p in ps:
        p.join(120)
        assert p.exitcode == 0
    with Queue(tmp_path, durability="group") as q:
        seen = {}
        while (j := q.lease_one()) is not None:
            seen.setdefault(j.payload["p"], []).append(j.payload["i"])
            q.ack(j)
        syncs = q.sync_counters()["queue_append_syncs"]
        # The watermark covers every record appended (the last producer's sync did).
        info = q.introspect()
        seq = info["tail_segment"]
        assert info["synced_position"] >= position(seq, info["segments"][seq]["tail"])
    assert sorted(seen) == list(range(procs))
    for w in range(procs):
        assert seen[w] == list(range(n)), f"producer {w} lost or reordered jobs"
    assert 0 < syncs < n * procs, f"{syncs} syncs for {n * procs} enqueues: no sync was shared"


def test_group_commit_threads_share_syncs(tmp_path):
    import threading

    n, threads = 200, 4
    with Queue(tmp_path, durability="group") as q:

        def run(w):
            for i in range(n):
                q.enqueue({"t": w, "i": i})

        ts = [threading.Thread(target=run, args=(w,)) for w in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(q) == n * threads
        c = q.sync_counters()
        assert c["append_syncs"] + c["covered"] == n * threads
        assert c["queue_append_syncs"] == c["append_syncs"]


def test_group_commit_in_forked_child_uses_its_own_leader_lock(tmp_path):
    with Queue(tmp_path, durability="group") as q:
        q.enqueue("parent")
        pid = os.fork()
        if pid == 0:
            try:
                before = q.sync_counters()["queue_append_syncs"]
                q.enqueue(
                    "child"
                )  # leads its own sync: the parent's leader lock is not the child's
                os._exit(0 if q.sync_counters()["queue_append_syncs"] == before + 1 else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        q.enqueue("parent again")
    with Queue(tmp_path) as q:
        assert [j.payload for j in q.lease(10)] == ["parent", "child", "parent again"]


def test_interval_flusher_syncs_in_the_background(tmp_path):
    with Queue(tmp_path, durability="interval", flush_interval=0.01) as q:
        q.enqueue_many(list(range(10)))
        assert q.sync_counters()["append_syncs"] <= 1  # returned without syncing
        assert _wait_for(lambda: q.sync_counters()["queue_append_syncs"] >= 1), (
            "the flusher never synced"
        )
        assert _wait_for(lambda: q.sync_counters()["pending"] == 0)


def test_interval_close_flushes_what_is_pending(tmp_path):
    q = Queue(tmp_path, durability="interval", flush_interval=3600)
    q.enqueue("x")
    assert q.sync_counters()["pending"]
    syncs_before = q.sync_counters()["queue_append_syncs"]
    q.close()
    with Queue(tmp_path) as again:
        assert again.sync_counters()["queue_append_syncs"] == syncs_before + 1


def test_sync_acks_syncs_acks_and_nacks(tmp_path):
    with Queue(tmp_path, sync_acks=True) as q:
        q.enqueue_many([1, 2])
        a, b = q.lease(2)
        assert (
            q.sync_counters()["state_syncs"] == 0
        )  # a lost lease only means an earlier redelivery
        q.extend(a, 10)
        assert q.sync_counters()["state_syncs"] == 0
        q.ack(a)
        q.nack(b, delay=0)
        assert q.sync_counters()["state_syncs"] == 2


def test_state_changes_are_flushed_within_the_interval(tmp_path):
    with Queue(tmp_path, state_flush_interval=0.01) as q:
        q.enqueue(1)
        q.ack(q.lease_one())
        assert _wait_for(lambda: q.sync_counters()["state_syncs"] >= 1), (
            "state changes were never flushed"
        )
        assert _wait_for(lambda: q.sync_counters()["pending"] == 0)


def test_none_strategy_never_syncs_state_by_default(tmp_path):
    with Queue(tmp_path, durability="none") as q:
        q.enqueue(1)
        q.ack(q.lease_one())
        assert q.sync_counters()["flusher"] == 0


def _one_group_enqueue(path: str, inherited_fd: int) -> None:
    os.close(inherited_fd)  # fork copied the "dead leader's" descriptor; only the test may hold it
    with Queue(path, durability="group") as q:
        q.enqueue("after the leader died")


def test_group_commit_follower_takes_over_from_a_dead_leader(tmp_path):
    import fcntl

    Queue(tmp_path, durability="group").close()
    # Play a leader that took the leader lock and died mid-sync: hold the flock, never bump the
    # generation.  The producer must not return (its record is not synced) until the lock is free.
    fd = os.open(tmp_path / "default.sync", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_one_group_enqueue, args=(str(tmp_path), fd))
    p.start()
    time.sleep(0.3)
    assert p.is_alive(), "the producer returned without a sync covering its record"
    os.close(fd)  # the kernel drops a dead process's flock the same way
    p.join(30)
    assert p.exitcode == 0
    with Queue(tmp_path) as q:
        assert q.sync_counters()["queue_append_syncs"] == 1
        info = q.introspect()
        seq = info["tail_segment"]
        assert info["synced_position"] >= position(seq, info["segments"][seq]["tail"])
        assert [j.payload for j in q.lease(5)] == ["after the leader died"]


def test_fork_while_the_flusher_holds_the_map_lock_does_not_deadlock_the_child(tmp_path):
    ring = Ring(tmp_path, durability="interval", flush_interval=3600)
    ring.append([NewRecord(b'"x"', JSON)])
    ring.segs.maplock.acquire()  # as the flusher thread would, mid-sync
    try:
        pid = os.fork()
        if pid == 0:
            try:
                ring.append([NewRecord(b'"y"', JSON)])
                ring.dur.flush()
                with ring.segs.maplock:
                    pass
                os._exit(0)
            except BaseException:
                os._exit(5)
    finally:
        ring.segs.maplock.release()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child deadlocked on the map lock")
    assert os.waitstatus_to_exitcode(status) == 0
    ring.close()


def _group_checker(path: str, who: int, n: int, go, out) -> None:
    q = Queue(path, durability="group", slot_count=128)
    go.wait()
    bad = 0
    for i in range(n):
        job = q.enqueue({"p": who, "i": i})
        seq, slot, _ = job.record_position
        # The postcondition of every durable return: a completed sync covers the record.
        if q.introspect()["synced_position"] < position(seq, slot + 1):
            bad += 1
    out.send(bad)
    q.close()


def test_group_commit_never_returns_before_a_sync_covers_the_record(tmp_path):
    Queue(tmp_path, durability="group", slot_count=128).close()
    ctx = mp.get_context("fork")
    go = ctx.Event()
    pipes, ps = [], []
    for w in range(4):
        r, s = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_group_checker, args=(str(tmp_path), w, 200, go, s))
        p.start()
        pipes.append(r)
        ps.append(p)
    go.set()
    assert [r.recv() for r in pipes] == [0, 0, 0, 0]
    for p in ps:
        p.join(60)
        assert p.exitcode == 0


EXIT_WHILE_FLUSHING = r"""
import sys
from ringq import Queue
q = Queue(sys.argv[1], state_flush_interval=0.001)  # the flusher syncs state pages all the time
for _ in range(200):
    for job in q.lease(50):
        q.ack(job)
# No close: the queue is closed while the interpreter shuts down, its flusher mid-sync or not.
"""


def test_a_process_exits_promptly_without_closing_its_queue(tmp_path):
    qdir = str(tmp_path / "q")
    with Queue(qdir) as q:
        q.enqueue_many(list(range(4000)))
    # Interpreter shutdown stops daemon threads wherever they are: a flusher stopped inside a
    # sync must not leave the closing queue waiting for a lock it will never release.
    for _ in range(12):
        proc = spawn(EXIT_WHILE_FLUSHING, qdir)
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()
            proc.wait()
        with Queue(qdir) as q:
            q.enqueue_many(list(range(200)))
