"""Jobs a killed Worker child had leased but not started go back to READY uncharged
(``kill_and_give_back``; docs/operations.md, "Hard timeouts").

A child's Worker leases through ``consume``, which on a local queue leases in batches and hands
the jobs out one at a time.  When the parent kills the child (a job past its hard timeout, or a
drain past its grace period) it nacks the jobs the board says the child runs, and gives back the
rest of the child's leases by the pid in their owner words before the SIGKILL -- while the frozen
child still holds its owner lock, so no reaper reclaims them as a dead holder's (which counts an
attempt: with ``max_attempts=1``, a dead letter for a job that never ran).  Real processes, real
SIGSTOP and SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from procs import spawn

from ringq import BackoffPolicy, JobState, Queue, Worker
from ringq.backend import PID_MAX, check_pid
from ringq.engine.deps import Deps
from ringq.engine.index import Index
from ringq.engine.owner import OwnerRegistry
from ringq.engine.relocate import Relocator
from ringq.engine.ring import Ring
from ringq.local.leases import Leases
from ringq.local.limits import LimitGate
from ringq.worker.board import ID_CAP

NOBACKOFF = BackoffPolicy(base=0, jitter=0)


def _hang_or_not(job):
    if job.payload == "hang":
        time.sleep(60)  # holds its child until the parent kills it


def test_a_timed_out_childs_unstarted_batch_goes_back_uncharged(tmp_path, caplog):
    # 300 fast jobs first: the child's stream grows its batches (to tens of jobs).  Then, while
    # that stream waits for more (or has just started a new one, at batch size 1), one batch of
    # [fast, hang, fast x 200] arrives: the hanging job is leased with the jobs after it in the
    # same batch, leased but never started when the parent kills the child 0.5 s later.
    with Queue(tmp_path / "q", backoff=NOBACKOFF) as q:
        q.enqueue_many(["warm"] * 300, max_attempts=1)
        w = Worker(
            q, _hang_or_not, processes=1, timeout=0.5, idle_timeout=1.0, handle_signals=False
        )
        caplog.set_level(logging.WARNING, logger="ringq.worker")
        runner = threading.Thread(target=w.run)
        runner.start()
        try:
            deadline = time.monotonic() + 20
            while q.stats().acked_total < 300 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert q.stats().acked_total == 300
            jobs = q.enqueue_many(["fast", "hang"] + ["fast"] * 200, max_attempts=1)
        finally:
            runner.join(30)
        assert not runner.is_alive()
        hang = q.get(jobs[1].id)
        assert hang.state is JobState.DEAD and hang.last_error == "timeout after 0.5 s"
        others = [q.get(j.id) for j in jobs if j.id != hang.id]
        assert [(j.state, j.attempts) for j in others if j.state is not JobState.DONE] == []
        assert {j.attempts for j in others} == {1}
        assert q.stats().dead == 1
        # The kill did find leases the child had not started (the case under test).
        back = [
            int(m.group(1))
            for r in caplog.records
            if (m := re.search(r"(\d+) leased job\(s\) it had not started", r.getMessage()))
        ]
        assert len(back) == 1 and back[0] >= 1, [r.getMessage() for r in caplog.records]
        assert w.pool is not None and w.pool.timeouts == 1


LEASE_AND_STOP = """
import json, os, signal, sys
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=600)
a, b, c = q.lease(3)
d = q.lease_one(detach=True)
print(json.dumps([j.id for j in (a, b, c, d)]), flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _stopped(proc: subprocess.Popen) -> None:
    """Wait until ``proc`` (our child) is stopped, leaving it unreaped."""
    os.waitid(os.P_PID, proc.pid, os.WSTOPPED | os.WNOWAIT)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_kill_and_give_back_returns_a_stopped_childs_leases_uncharged_and_kills_it(tmp_path):
    where = str(tmp_path / "q")
    with Queue(where, visibility_timeout=600) as q:
        q.enqueue_many(["a", "b", "c", "d", "mine"])
        child = spawn(LEASE_AND_STOP, where, stdout=subprocess.PIPE, text=True)
        try:
            a, b, c, d = json.loads(child.stdout.readline())
            _stopped(child)
            mine = q.lease_one()
            assert mine is not None and mine.payload == "mine"
            assert q.cancel(c).cancel_requested  # asked to cancel: its holder decides
            assert q.kill_and_give_back(child.pid) == 2
            assert child.wait(10) == -signal.SIGKILL  # killed before the call returned
            for jid in (a, b):
                got = q.get(jid)
                assert got.state is JobState.READY and got.attempts == 0, (got.state, got.attempts)
                assert got.available_at <= time.time()
            again = q.lease(5)  # at once: no delay, and nothing else is leasable
            assert sorted(j.id for j in again) == sorted([a, b])
            assert {j.attempts for j in again} == {1}
            # Not given back: asked to cancel, it ends as cancelled once its holder is gone.
            assert q.get(c).state is JobState.CANCELLED
            assert q.get(d).state is JobState.LEASED  # detached: only its timeout ends it
            assert q.get(mine.id).state is JobState.LEASED  # another process's lease
            q.ack(mine)
            with pytest.raises(ValueError, match="not a stopped child"):
                q.kill_and_give_back(child.pid)  # reaped: no longer a stopped child
        finally:
            _kill(child)


@contextlib.contextmanager
def _leases(where: str) -> Iterator[Leases]:
    """A queue's leases built from their parts as a queue builds them, with an index caught up
    once and never again (its catch-up is a no-op), and no check of the process asked about."""
    ring = Ring(where)
    index = Index(ring)
    index.catch_up()
    owners = OwnerRegistry(os.path.join(where, "default.owners"))
    gate = LimitGate(where, "default")
    try:
        yield Leases(
            ring,
            index,
            owners,
            Relocator(ring, index, index.catch_up),
            lambda: None,  # no catch-up: a record appended since stays unread until read in
            lambda force: None,  # nor a reclaim before an ack decides
            gate,
            Deps(ring, index, index.catch_up),
        )
    finally:
        index.reset()
        gate.close()
        owners.close()
        ring.close()


ENQUEUE_LEASE_AND_STOP = """
import json, os, signal, sys
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=600)
q.enqueue("late", job_id="late")
job = q.lease_one()
print(json.dumps([job.id, job.available_at, list(job.record_position[:2])]), flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_lease_of_a_record_the_index_has_not_read_goes_back_at_its_available_at(tmp_path):
    # The index giving the leases back has read the segment, but not the record the stopped
    # process appended and leased since: it reads it in first, so the first lease goes back at
    # the record's own available-at (not at the segment's epoch, as an unread slot's zeros say).
    where = str(tmp_path / "q")
    with Queue(where, visibility_timeout=600) as q:
        q.enqueue("first")
        q.ack(q.lease_one())
        with _leases(where) as leases:
            index = leases.index
            time.sleep(0.02)  # the record's available-at is later than the segment's epoch
            child = spawn(ENQUEUE_LEASE_AND_STOP, where, stdout=subprocess.PIPE, text=True)
            try:
                jid, available_at, (segseq, slot) = json.loads(child.stdout.readline())
                _stopped(child)
                view = index.views[segseq]
                assert slot >= view.scanned  # unread here
                assert leases.give_back_leases_of(child.pid) == 1
                got = q.get(jid)
                assert got.state is JobState.READY and got.attempts == 0
                assert got.available_at == pytest.approx(available_at, abs=0.002)
                assert int(view.seq[slot]) == got.seq  # read in
            finally:
                _kill(child)


def test_kill_and_give_back_checks_its_pid_and_is_0_on_redis(queue_factory):
    q = queue_factory()
    for bad in (0, -1, True, "12", 1.5, os.getpid(), os.getppid(), PID_MAX + 1):
        with pytest.raises(ValueError):
            q.kill_and_give_back(bad)
    if queue_factory.backend == "redis":
        q.enqueue("x")
        assert q.lease_one() is not None
        child = subprocess.Popen(["sleep", "30"])
        try:
            child.send_signal(signal.SIGSTOP)
            _stopped(child)
            assert q.kill_and_give_back(child.pid) == 0
            assert child.wait(10) == -signal.SIGKILL
        finally:
            _kill(child)


LEASE_AS_PID_1 = """
import json, os, sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=600)
job = q.lease_one()
print(json.dumps([os.getpid(), job.id, job.lease_token]), flush=True)
time.sleep(60)
"""


def test_a_lease_tagged_with_the_same_pid_in_another_pid_namespace_is_not_taken(tmp_path):
    # Two containers sharing a queue directory can both have a process with pid N.  A lease's
    # owner word carries the pid only as a tag: giving back by that tag alone would return the
    # other namespace's live lease to READY with its count lowered, and the next lease would reuse
    # the fencing token its holder still has.  The pid must also hold the lease's owner index.
    import shutil
    import sys

    from procs import child_env

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a PID namespace")
    where = str(tmp_path / "q")
    with Queue(where, visibility_timeout=600) as q:
        q.enqueue("theirs")
        holder = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c"]
            + [LEASE_AS_PID_1, where],
            env=child_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            pid, jid, token = json.loads(holder.stdout.readline())
            assert pid == 1  # its pid in its own namespace: what its owner word says
            # The queue refuses a process that is not its stopped child (our pid 1 is init), so the
            # owner-index check is asked below it, of leases built as the queue builds them.
            with pytest.raises(ValueError, match="not a stopped child"):
                q.kill_and_give_back(1)
            with _leases(where) as leases:
                assert leases.give_back_leases_of(1) == 0  # our pid 1 holds none of its locks
            got = q.get(jid)
            assert got.state is JobState.LEASED and got.lease_token == token
        finally:
            holder.kill()
            holder.wait()


LEASE_AND_RUN = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], visibility_timeout=600)
q.lease(2)
print("leased", flush=True)
time.sleep(60)
"""


def test_a_running_process_is_refused(tmp_path):
    # Its leases may be in use: given back, the next lease would reuse their fencing tokens.
    where = str(tmp_path / "q")
    with Queue(where, visibility_timeout=600) as q:
        q.enqueue_many(["a", "b"])
        child = spawn(LEASE_AND_RUN, where, stdout=subprocess.PIPE, text=True)
        try:
            child.stdout.readline()
            with pytest.raises(ValueError, match="not a stopped child"):
                q.kill_and_give_back(child.pid)
            assert q.stats().leased >= 2
        finally:
            _kill(child)
    with pytest.raises(ValueError):
        check_pid(PID_MAX + 1)  # beyond any Linux pid (an owner word keeps 30 bits of one)


def test_a_running_job_whose_id_the_board_cannot_hold_is_not_given_back_uncharged(tmp_path):
    # The board names a running job by its id, up to ID_CAP bytes.  A longer one cannot be
    # nacked by the parent, and it is among the child's leases: given back uncharged it would run
    # and time out forever.  The child's leases are left to the reaper then (an attempt counted).
    runs = tmp_path / "runs"
    long_id = "L" * (ID_CAP + 1)

    def handler(job):
        with open(runs, "a") as f:
            f.write("run\n")
        time.sleep(30)

    with Queue(tmp_path / "q", backoff=NOBACKOFF) as q:
        q.enqueue("x", job_id=long_id, max_attempts=1, timeout=0.3)
        w = Worker(q, handler, processes=1, handle_signals=False)
        runner = threading.Thread(target=w.run)
        runner.start()
        try:
            deadline = time.monotonic() + 15
            while q.get(long_id).state is not JobState.DEAD and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            w.stop()
            runner.join(30)
        got = q.get(long_id)
        assert got.state is JobState.DEAD and got.attempts == 1, (got.state, got.attempts)
        assert runs.read_text().count("run") == 1
