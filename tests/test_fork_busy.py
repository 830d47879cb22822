"""A child forked while other threads of its parent are inside calls of a Queue can use the queue:
locks those threads held at the fork are replaced in the child (ringq/engine/forksafe.py), so the child
never waits for a thread that does not exist in it."""

from __future__ import annotations

import os
import signal
import threading
import time

from ringq import Queue


def test_children_forked_while_threads_enqueue_can_use_the_queue(tmp_path):
    q = Queue(tmp_path, durability="none")
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            q.enqueue_many([{"x": i} for i in range(50)])

    threads = [threading.Thread(target=busy) for _ in range(3)]
    for t in threads:
        t.start()
    pids = []
    try:
        for i in range(30):
            time.sleep(0.005)
            pid = os.fork()
            if pid == 0:  # the child: one enqueue and one lease through the inherited queue
                try:
                    q.enqueue({"child": i})
                    q.lease_one()
                finally:
                    os._exit(0)
            pids.append(pid)
    finally:
        stop.set()
        for t in threads:
            t.join()
    hung, end = 0, time.monotonic() + 30  # one deadline for all: a hung child never exits
    for pid in pids:
        while time.monotonic() < end:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            hung += 1
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    q.close()
    assert hung == 0
