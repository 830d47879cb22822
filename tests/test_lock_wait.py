"""The writer lock waits on a futex word instead of polling: timeouts, wake-ups and the waiter
count still hold under contention and with a holder that never releases."""

from __future__ import annotations

import fcntl
import math
import multiprocessing as mp
import os
import threading
import time

import pytest

from ringq import LockTimeoutError, Queue


def test_lock_timeout_still_raises_and_leaves_no_waiter_registered(tmp_path):
    with Queue(tmp_path, durability="none", lock_timeout=0.2) as q:
        fd = os.open(tmp_path / "default.lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a holder that is stuck (suspended, say)
        try:
            t = time.monotonic()
            with pytest.raises(LockTimeoutError, match="not acquired within 0.2 s"):
                q.enqueue("x")
            assert time.monotonic() - t >= 0.2
        finally:
            os.close(fd)
        assert q.introspect()["lock_waiters"] == 0
        q.enqueue("after the holder let go")
        assert len(q) == 1


def test_a_lock_timeout_of_0_does_not_wait_and_one_of_inf_waits_for_the_holder(tmp_path):
    with (
        Queue(tmp_path, durability="none", lock_timeout=0) as at_once,
        Queue(tmp_path, durability="none", lock_timeout=math.inf) as patient,
    ):
        fd = os.open(tmp_path / "default.lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            t = time.monotonic()
            with pytest.raises(LockTimeoutError, match="not acquired within 0.0 s"):
                at_once.enqueue("x")
            assert time.monotonic() - t < 1
            threading.Timer(0.3, fcntl.flock, (fd, fcntl.LOCK_UN)).start()
            patient.enqueue("waited for the holder")
            assert time.monotonic() - t >= 0.3
        finally:
            os.close(fd)
        assert [j.payload for j in patient.lease(5)] == ["waited for the holder"]


def _contend(path: str, who: int, n: int) -> None:
    with Queue(path, durability="none") as q:
        for i in range(n):
            q.enqueue({"w": who, "i": i})


def test_contended_writers_lose_nothing(tmp_path):
    Queue(tmp_path).close()
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=_contend, args=(str(tmp_path), w, 300)) for w in range(4)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
        assert p.exitcode == 0
    with Queue(tmp_path) as q:
        jobs = q.lease(2000)
        assert len(jobs) == 1200
        for w in range(4):
            assert [j.payload["i"] for j in jobs if j.payload["w"] == w] == list(range(300))
        assert q.introspect()["lock_waiters"] == 0


def test_a_waiting_writer_proceeds_when_a_killed_holder_releases(tmp_path):
    Queue(tmp_path).close()
    ctx = mp.get_context("fork")
    ready = ctx.Event()

    def hold(path):  # takes the lock and is SIGKILLed with it: nobody bumps the wake word
        fd = os.open(os.path.join(path, "default.lock"), os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        ready.set()
        time.sleep(60)

    holder = ctx.Process(target=hold, args=(str(tmp_path),))
    holder.start()
    assert ready.wait(10)
    writer = ctx.Process(target=_contend, args=(str(tmp_path), 0, 1))
    writer.start()
    time.sleep(0.2)
    assert writer.is_alive()
    holder.kill()
    holder.join(10)
    writer.join(30)
    assert writer.exitcode == 0
    with Queue(tmp_path) as q:
        assert len(q) == 1
