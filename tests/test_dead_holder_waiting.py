"""A consumer already blocked in ``lease(wait=...)`` gets a SIGKILLed holder's jobs within about
a quarter second (README: a waiting consumer looks at least every REAP_INTERVAL), not after its
visibility timeout and not after a long sleep of its own."""

from __future__ import annotations

import signal
import subprocess
import time

from procs import spawn

from ringq import Queue
from ringq.engine.reaper import REAP_INTERVAL

HOLDER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=600)
job = q.lease_one()
print(job.id, flush=True)
time.sleep(600)
"""


def test_a_waiting_consumer_gets_a_killed_holders_job_soon(tmp_path):
    with Queue(tmp_path, visibility_timeout=600) as q:
        q.enqueue("held")
        holder = spawn(HOLDER, str(tmp_path), stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip()
        assert q.lease_one() is None  # the only job is held: this consumer will wait
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        t = time.monotonic()
        job = q.lease_one(wait=5)
        took = time.monotonic() - t
        assert job is not None and job.payload == "held"
        assert took < 3 * REAP_INTERVAL + 0.25, took  # was up to 4 x REAP_INTERVAL asleep
