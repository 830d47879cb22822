"""A lease skips its first look (catch-up, pause and limits checks) only while nothing those
read has moved (ringq/local/quiet.py): every change made in this process or in another one is
seen by the very next lease, except a limits file that another process creates, which is looked
for every LimitsFile.STAT_INTERVAL seconds as before."""

from __future__ import annotations

import threading
import time

import pytest
from procs import run_py

from ringq import Queue
from ringq.engine.limits_file import LimitsFile


def _quiet(q: Queue) -> None:
    """Lease and ack one job twice, so that the second lease went through the quiet path."""
    for _ in range(2):
        q.ack(q.lease_one())


def test_a_limit_set_in_this_process_holds_at_the_next_lease(qdir):
    q = Queue(qdir, name="q")
    q.enqueue_many(list(range(10)))
    _quiet(q)
    q.limit("q", concurrency=2)  # creates the limits file: a mapping the quiet look did not watch
    assert len(q.lease(10)) == 2
    q.limit("q", concurrency=3)  # the same file's generation moves
    assert len(q.lease(10)) == 1


@pytest.mark.parametrize("file_exists", [True, False])
def test_a_limit_set_by_another_process_holds(qdir, file_exists):
    # With a limits file already mapped here its generation is watched: the very next lease sees
    # the limit.  A file that another process creates is looked for every STAT_INTERVAL.
    q = Queue(qdir, name="q")
    q.enqueue_many(list(range(10)))
    if file_exists:
        q.limit("q", concurrency=8)
    _quiet(q)
    run_py(f"from ringq import Queue; Queue({qdir!r}, name='q').limit('q', concurrency=1)")
    if not file_exists:
        time.sleep(LimitsFile.STAT_INTERVAL + 0.05)
    assert len(q.lease(10)) == 1


def test_pause_and_resume_from_another_process_hold_at_the_next_lease(qdir):
    q = Queue(qdir, name="q")
    q.enqueue_many(list(range(10)))
    _quiet(q)
    run_py(f"from ringq import Queue; Queue({qdir!r}, name='q').pause()")
    assert q.lease(10) == []
    run_py(f"from ringq import Queue; Queue({qdir!r}, name='q').resume()")
    assert len(q.lease(3)) == 3
    _quiet(q)
    run_py(f"from ringq import Queue; Queue({qdir!r}, name='q').pause(key='k')")
    q.enqueue("keyed", key="k")
    got = q.lease(20)
    assert got and all(j.key != "k" for j in got)


def test_jobs_appended_by_another_process_are_leased_at_once(qdir):
    q = Queue(qdir, name="q")
    q.enqueue_many([0, 1])
    _quiet(q)
    assert q.lease_one() is None
    run_py(f"from ringq import Queue; Queue({qdir!r}, name='q').enqueue_many(['a', 'b'])")
    assert sorted(j.payload for j in q.lease(5)) == ["a", "b"]


def test_threads_pausing_and_leasing_at_once_lease_nothing_while_paused(qdir):
    # One thread pauses and resumes the queue while two lease: a lease that starts after a
    # pause() returned never gets a job, however quiet the look was before it.
    q = Queue(qdir, name="q")
    q.enqueue_many(list(range(4000)))
    _quiet(q)
    stop = threading.Event()
    wrong: list[str] = []
    paused = threading.Event()

    def leaser() -> None:
        while not stop.is_set():
            was_paused = paused.is_set()
            got = q.lease(2)
            if was_paused and paused.is_set() and got:
                wrong.append(got[0].id)
            for job in got:
                q.ack(job)

    threads = [threading.Thread(target=leaser) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(30):
            q.pause()
            paused.set()
            time.sleep(0.003)
            paused.clear()
            q.resume()
            time.sleep(0.002)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert wrong == []
    q.close()
