"""A process that exits without Queue.close() must exit: nothing ringq runs at interpreter exit
(atexit hooks, __del__, weakref finalizers) may wait for a lock a daemon thread can hold."""

from __future__ import annotations

import subprocess

import pytest
from procs import spawn

LEASED_THEN_SLEEP = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1]); q.enqueue({"a": 1}); q.lease_one(); time.sleep(float(sys.argv[2]))
"""

INTERVAL_ENQUEUE = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], durability="interval"); q.enqueue({"a": 1}); time.sleep(float(sys.argv[2]))
"""

# Daemon threads busy on the queue when the main thread returns: shutdown freezes them wherever
# they stand, inside the queue's own locks included.
DAEMONS_BUSY = """
import sys, threading, time
from ringq import Queue
q = Queue(sys.argv[1], durability="interval", state_flush_interval=0.01)
def churn():
    while True:
        q.enqueue({"a": 1})
        for j in q.lease(4):
            j.ack()
for _ in range(3):
    threading.Thread(target=churn, daemon=True).start()
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.parametrize(
    ("code", "sleep"),
    [
        (LEASED_THEN_SLEEP, "1.0"),  # the state flusher wakes after 1 s: exit races it
        (INTERVAL_ENQUEUE, "0.05"),  # the interval flusher wakes every 0.05 s
        (DAEMONS_BUSY, "0.2"),
    ],
)
def test_unclosed_queue_lets_the_process_exit(tmp_path, code, sleep):
    runs = 12  # the fault this guards against hung 5 runs in 6
    for batch in range(0, runs, 4):
        procs = [
            spawn(
                code, str(tmp_path / f"q{i}"), sleep, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            for i in range(batch, batch + 4)
        ]
        hung = 0
        for p in procs:
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                hung += 1
                p.kill()
                p.communicate()
        assert hung == 0, f"{hung} of {len(procs)} processes hung at exit"
        assert all(p.returncode == 0 for p in procs), [p.stderr for p in procs]
