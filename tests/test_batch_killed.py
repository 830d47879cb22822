"""A producer SIGKILLed in the middle of an ``enqueue_many`` that spans segments, while other
processes keep using the queue: nothing of the batch that was never published comes back later
(no holes, no job id stored twice), and the batch retried with the same ids completes it.

The kill is real (SIGKILL of the producer process) at a chosen point: the producer's C calls go
through a proxy that kills the process when the batch's second part is about to be published."""

from __future__ import annotations

import collections
import signal

import pytest
from procs import run_py

from ringq import Queue

GEOMETRY = dict(slot_size=256, slot_count=64)  # a 3 KB job takes 13 slots: 4 to a segment

KILLED = """
import os, signal, sys
from ringq import Queue
from ringq.engine import appends as appends_mod
real = appends_mod.lib
when = int(sys.argv[2])

class Proxy:
    calls = 0
    def __getattr__(self, name):
        return getattr(real, name)
    def ringq_append_publish(self, *a):
        Proxy.calls += 1
        if Proxy.calls == when:
            os.kill(os.getpid(), signal.SIGKILL)
        return real.ringq_append_publish(*a)

appends_mod.lib = Proxy()
q = Queue(sys.argv[1], slot_size=256, slot_count=64)
ids = [f"id-{i}" for i in range(40)] if sys.argv[3] == "ids" else None
q.enqueue_many([{"i": i, "pad": "x" * 3000} for i in range(40)], job_ids=ids)
print("not killed")
"""


@pytest.mark.parametrize("when", [1, 2, 3])
def test_a_batch_killed_midway_never_comes_back_in_pieces(tmp_path, when):
    with Queue(tmp_path, **GEOMETRY) as live:  # a process that keeps working through the kill
        live.enqueue({"live": -1})
        out = run_py(KILLED, str(tmp_path), str(when), "ids")
        assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr
        for i in range(10):  # rotating through new segments, as the killed batch had
            live.enqueue({"live": i, "pad": "y" * 3000})
        # The producer's retry: what was published is returned, the rest written once.
        again = live.enqueue_many([{"i": i, "pad": "x" * 3000} for i in range(40)],
                                  job_ids=[f"id-{i}" for i in range(40)])
        assert [j.id for j in again] == [f"id-{i}" for i in range(40)]
        with Queue(tmp_path, **GEOMETRY) as opened:  # a new process opens (recovery runs)
            opened.enqueue({"live": 10})
    with Queue(tmp_path, **GEOMETRY) as q:  # and once more, as after everything stopped
        seen = collections.Counter()
        live_seen = set()
        while (job := q.lease_one()) is not None:
            if "live" in job.payload:
                live_seen.add(job.payload["live"])
            else:
                seen[job.id] += 1
            q.ack(job)
        assert live_seen == set(range(-1, 11))
        assert seen == {f"id-{i}": 1 for i in range(40)}


@pytest.mark.parametrize("when", [1, 2, 3])
def test_what_comes_back_of_a_killed_batch_is_a_prefix(tmp_path, when):
    # The killed batch's later parts lie in segments it created but never linked; a live producer
    # then takes over the first of those seqs.  A process that opens afterwards must not adopt
    # the rest: the batch would come back with a hole where the live producer's segment went.
    with Queue(tmp_path, **GEOMETRY) as live:
        live.enqueue({"live": -1})
        out = run_py(KILLED, str(tmp_path), str(when), "plain")
        assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr
        for i in range(6):
            live.enqueue({"live": i, "pad": "y" * 3000})
        with Queue(tmp_path, **GEOMETRY) as q:
            assert q.recovery.clean  # a dead writer's debris is not damage
            batch, live_seen = [], set()
            while (job := q.lease_one()) is not None:
                if "live" in job.payload:
                    live_seen.add(job.payload["live"])
                else:
                    batch.append(job.payload["i"])
                q.ack(job)
    assert live_seen == set(range(-1, 6))
    assert sorted(batch) == list(range(len(batch)))  # nothing, or a prefix: never a hole


def test_records_taken_back_after_a_restart_are_reported_once(tmp_path):
    # The batch killed before it published anything, then the machine restarted (the boot id in
    # the control file no longer matches): recovery adopts its intact records, and reports each
    # segment's count once.
    from crashkit import restore, snapshot

    live = tmp_path / "live"
    Queue(live, **GEOMETRY).close()
    out = run_py(KILLED, str(live), "1", "plain")
    assert out.returncode == -signal.SIGKILL
    with Queue(restore(snapshot(str(live)), str(tmp_path / "img")), **GEOMETRY) as q:
        paths = [p for p, _n in q.recovery.readopted]
        assert len(paths) == len(set(paths)) and paths
        assert sum(n for _p, n in q.recovery.readopted) == q.stats().ready


WRITER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], slot_size=256, slot_count=64)
q.enqueue({"w": -1})
print("open", flush=True)
sys.stdin.readline()  # the control file is replaced meanwhile
for i in range(40):
    q.enqueue({"w": i, "pad": "z" * 3000})  # rotations, linked in the control file it mapped
print("done", flush=True)
"""


def test_segments_linked_in_a_replaced_control_file_are_kept(tmp_path):
    # An operator removes the control file while a writer runs (error messages suggest removing
    # it); the next open rebuilds it naming an older tail.  The writer's later segments hold
    # published jobs: the open after must adopt them, never take them for a dead writer's debris.
    import subprocess

    from procs import spawn

    Queue(tmp_path, **GEOMETRY).close()
    w = spawn(WRITER, str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline().strip() == "open"
    (tmp_path / "default.ctl").unlink()
    Queue(tmp_path, **GEOMETRY).close()  # rebuilt from the segments, with this boot's id
    w.stdin.write("go\n")
    w.stdin.flush()
    assert w.stdout.readline().strip() == "done"
    w.kill()
    w.wait()
    with Queue(tmp_path, **GEOMETRY) as q:
        got = set()
        while (job := q.lease_one()) is not None:
            got.add(job.payload["w"])
            q.ack(job)
    assert got == set(range(-1, 40))


TAKER = """
import os, signal, sys
from ringq import Queue
q = Queue(sys.argv[1], slot_size=256, slot_count=64)
q.enqueue({"t": -1})
print("open", flush=True)
sys.stdin.readline()  # a killed batch has left unlinked segments past the tail meanwhile
when = int(sys.argv[2])
calls = 0
real = {"rename": os.rename, "unlink": os.unlink}

def killing(name):
    def call(*a, **kw):
        global calls
        if str(a[0]).endswith((".seg", ".state", ".tmp")):
            calls += 1
            if calls == when:
                os.kill(os.getpid(), signal.SIGKILL)
        return real[name](*a, **kw)
    return call

os.rename, os.unlink = killing("rename"), killing("unlink")
for i in range(10):
    q.enqueue({"t": i, "pad": "z" * 3000})  # the first rotation takes over the debris's seq
    print("enqueued", i, flush=True)
print("not killed", flush=True)
"""


@pytest.mark.parametrize("when", range(1, 7))
def test_a_writer_killed_while_taking_over_a_dead_writers_segment_leaves_no_damage(tmp_path, when):
    # A killed batch leaves segments it created but never linked; the next rotation of a process
    # that was already open creates the same seq over them (six file-system steps: two unlinks of
    # the old pair, then for each file a leftover temporary's unlink and the rename into place).
    # Killed at any of them, the queue opens clean: no state file of one creation beside the
    # record file of the other, nothing quarantined, every returned enqueue there.
    import subprocess

    from procs import spawn

    from ringq.engine.verify import examine

    Queue(tmp_path, **GEOMETRY).close()
    w = spawn(TAKER, str(tmp_path), str(when), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline().strip() == "open"
    out = run_py(KILLED, str(tmp_path), "1", "plain")
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr
    w.stdin.write("go\n")
    w.stdin.flush()
    returned = {int(line.split()[1]) for line in w.stdout if line.startswith("enqueued")}
    assert w.wait() == -signal.SIGKILL
    assert examine(str(tmp_path), "default").damaged == []
    with Queue(tmp_path, **GEOMETRY) as q:
        assert q.recovery.clean, q.recovery
        got = set()
        while (job := q.lease_one()) is not None:
            if "t" in job.payload:
                got.add(job.payload["t"])
            q.ack(job)
    assert got >= returned | {-1}
