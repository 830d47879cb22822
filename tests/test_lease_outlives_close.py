"""A lease belongs to the process that took it, not to the Queue object it was taken through
(ringq/engine/owner.py): closing or dropping that object keeps the lease held -- no other process
leases the job, no attempt is charged -- and a new object of the same process acks it.  The
process's death still ends it at once, even with a forked child alive.  Real processes, real
SIGKILL."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time

from procs import run_py, spawn

from ringq import JobState, Queue
from ringq.engine.owner import OwnerRegistry

HOLD = """
import gc, os, sys, time
from ringq import Queue
q = Queue(sys.argv[1])
a = q.lease_one(visibility_timeout=300)
q.close()
q = Queue(sys.argv[1])
b = q.lease_one(visibility_timeout=300)
del q
gc.collect()
child = os.fork() if sys.argv[2] == "fork" else -1
if child == 0:
    time.sleep(300)  # a child that outlives its parent must not keep the parent's leases alive
    os._exit(0)
print(a.id, b.id, child, flush=True)
time.sleep(300)
"""


def _held_by_another_process(tmp_path, fork: bool) -> None:
    path = tmp_path / "q"
    with Queue(path) as q:
        q.enqueue_many(["a", "b", "c"])
        child = "-1"
        holder = spawn(HOLD, str(path), "fork" if fork else "-", stdout=-1, text=True)
        try:
            *ids, child = holder.stdout.readline().split()
            assert len(ids) == 2, ids
            time.sleep(0.3)  # past any reaper's schedule: nothing reclaims a live holder's lease
            third = q.lease_one()
            assert third.payload == "c"
            assert q.lease_one() is None
            assert [q.get(i).state for i in ids] == [JobState.LEASED] * 2
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            back = [q.lease_one(wait=5) for _ in ids]
            assert sorted(j.id for j in back) == sorted(ids)
            assert [j.attempts for j in back] == [2, 2]  # the dead holder's attempt counts
            for j in (*back, third):
                q.ack(j)
        finally:
            holder.kill()
            holder.wait()
            if fork and int(child) > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(child), signal.SIGKILL)


def test_leases_of_closed_queue_objects_stay_held_until_the_process_dies(tmp_path):
    _held_by_another_process(tmp_path, fork=False)


def test_a_forked_child_does_not_keep_the_leases_of_closed_queue_objects(tmp_path):
    _held_by_another_process(tmp_path, fork=True)


def test_opening_and_closing_with_a_lease_each_time_keeps_one_owner_index(tmp_path):
    # Each new object adopts the index the closed one kept (with its leases): a loop that opens a
    # queue per job never runs out of owner indexes or descriptors.
    path = tmp_path / "q"
    with Queue(path) as q:
        q.enqueue_many(range(50))
    jobs = []
    for _ in range(50):
        q = Queue(path)
        jobs.append(q.lease_one())
        q.close()
    gc.collect()
    owners = OwnerRegistry(str(path / "default.owners"))
    assert len(owners.held_by(os.getpid())) == 1
    with Queue(path) as q:
        for job in jobs:
            q.ack(job)
        assert q.stats().done == 50
    assert owners.held_by(os.getpid()) == set()  # nothing left to hold: the index is given up
    owners.close()


def test_a_concurrency_slot_stays_taken_while_the_lease_of_a_closed_queue_object_stands(tmp_path):
    # A cap of 1: the job leased through a closed object still runs, so nobody (another process,
    # another object of this one) leases the key's next job until it is acked.
    path = tmp_path / "q"
    with Queue(path) as q:
        q.limit("k", concurrency=1)
        q.enqueue_many(["first", "second"], key="k")
        job = q.lease_one()
    other = run_py(LEASE_ONE, str(path))
    assert other.returncode == 0 and other.stdout.strip() == "None", other.stderr
    with Queue(path) as q:
        assert q.lease_one() is None
        assert [(lim.name, lim.running) for lim in q.limits()] == [("k", 1)]
        q.ack(job)
        assert [(lim.name, lim.running) for lim in q.limits()] == [("k", 0)]
    other = run_py(LEASE_ONE, str(path))
    assert other.stdout.strip() == "second", other.stderr


LEASE_ONE = """
import sys
from ringq import Queue
job = Queue(sys.argv[1]).lease_one()
print(job and job.payload)
"""


def test_an_object_open_before_the_close_acks_the_lease_and_frees_its_locks(tmp_path):
    # The ack goes through an object that was open all along (it adopted nothing): the closed
    # object's kept cap slot and owner index are given up then, not at the process's exit.
    path = tmp_path / "q"
    keeper = Queue(path)
    keeper.limit("k", concurrency=1)
    keeper.enqueue("mine")
    mine = keeper.lease_one()  # the keeper has an owner index of its own
    keeper.enqueue_many(["first", "second"], key="k")
    first = Queue(path)
    job = first.lease_one()
    first.close()
    owners = OwnerRegistry(str(path / "default.owners"))
    assert len(owners.held_by(os.getpid())) == 2  # the keeper's, and the one kept for `job`
    assert keeper.lease_one() is None  # the cap is taken by the closed object's lease
    keeper.ack(job)
    assert [(lim.name, lim.running) for lim in keeper.limits()] == [("k", 0)]
    assert len(owners.held_by(os.getpid())) == 1  # the kept index held nothing more: given up
    other = run_py(LEASE_ONE, str(path))
    assert other.stdout.strip() == "second", other.stderr
    keeper.ack(mine)
    keeper.close()
    owners.close()


def test_a_close_racing_an_ack_through_another_object_keeps_nothing_for_the_acked_lease(tmp_path):
    # Threads lease through their own objects and close them while other threads ack the same
    # jobs through one shared object: an ack landing between the close's look at its leases and
    # their keeping found nothing kept, and the index and cap slot stayed kept for good.
    import queue as stdqueue
    import threading

    path = tmp_path / "q"
    shared = Queue(path)
    shared.limit("k", concurrency=64)
    shared.enqueue_many(list(range(400)), key="k")
    handoff: stdqueue.Queue = stdqueue.Queue()
    failures: list[str] = []

    def leaser():
        for _ in range(100):
            q = Queue(path)
            job = q.lease_one(wait=2.0)
            if job is not None:
                handoff.put(job)
            q.close()

    def acker():
        while (job := handoff.get()) is not None:
            try:
                shared.ack(job)
            except Exception as exc:  # noqa: BLE001 -- reported below
                failures.append(repr(exc))

    leasers = [threading.Thread(target=leaser) for _ in range(4)]
    ackers = [threading.Thread(target=acker) for _ in range(2)]
    for t in leasers + ackers:
        t.start()
    for t in leasers:
        t.join()
    for _ in ackers:
        handoff.put(None)
    for t in ackers:
        t.join()
    assert failures == [] and shared.stats().done == 400
    assert [(lim.name, lim.running) for lim in shared.limits()] == [("k", 0)]
    # The shared object may have adopted a kept index when its reader opened: it holds that as
    # its own until it closes.  Then nothing of this queue is held by the process.
    shared.close()
    owners = OwnerRegistry(str(path / "default.owners"))
    assert owners.held_by(os.getpid()) == set()
    owners.close()


def test_kept_slots_of_leases_ended_by_expiry_or_purge_are_freed(tmp_path):
    # Not by an ack or nack of this process: an expiry (freed at this process's next lease
    # under the cap) and a purge (every lease ended).
    for how in ("expiry", "purge"):
        path = tmp_path / how
        keeper = Queue(path)
        keeper.limit("k", concurrency=1)
        keeper.stats()  # its reader is open before the other object's close
        keeper.enqueue("first", key="k", max_attempts=1)  # its expiry dead-letters it
        closing = Queue(path)
        closing.lease_one(visibility_timeout=0.2)
        closing.close()
        if how == "expiry":
            time.sleep(0.3)
        else:
            assert keeper.purge() == 1
        keeper.enqueue("second", key="k")
        got = keeper.lease_one(wait=2.0)
        assert got is not None and got.payload == "second", how
        keeper.ack(got)
        assert [(lim.name, lim.running) for lim in keeper.limits()] == [("k", 0)], how
        keeper.close()


FORK_WINDOWS = """
import os, sys, threading
sys.setswitchinterval(0.0001)  # thread switches as often as the interpreter allows
from ringq import Queue

d, rounds = sys.argv[1], int(sys.argv[2])
first = Queue(d)
first.limit("k", concurrency=4096)
first.enqueue_many(list(range(rounds + 10)), key="k")
first.close()

def churn():  # objects that adopt what a closed one kept, and keep it again at their close
    for i in range(rounds):
        q = Queue(d, durability="group" if i % 2 else "msync")  # group: a leader's lock file
        q.enqueue(i, key="k")
        q.lease_one(visibility_timeout=600)
        q.close()

def locked():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.endswith((".lock", ".owners", ".sync")):  # a lock the parent may take
                out.append(target)
            elif target.endswith(".limits"):  # its map stays; its cap-slot locks must not
                out += ["x"] if "OFDLCK" in open(f"/proc/self/fdinfo/{fd}").read() else []
        except OSError:
            pass
    return out

t = threading.Thread(target=churn)
t.start()
bad = forks = 0
while t.is_alive():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        for fd in (r, w):
            try:
                os.fstat(fd)
            except OSError:
                code |= 1  # a fork hook closed a descriptor that was not ringq's
        os._exit(code | (2 if locked() else 0))  # 2: kept a descriptor with the parent's locks
    _, status = os.waitpid(pid, 0)
    os.close(r)
    os.close(w)
    forks += 1
    bad += os.waitstatus_to_exitcode(status) != 0
t.join()
print(forks, bad)
"""


def test_forks_while_threads_open_and_close_queue_objects_inherit_no_lock_and_lose_no_fd(tmp_path):
    # Forks land while another thread opens queue objects (writer lock, group-commit leader,
    # owner and limits files), hands kept descriptors from a closed object to a new one, and
    # closes them: no child may hold a descriptor that carries, or may later carry, the parent's
    # locks, nor find one of its own descriptors closed by a fork hook.  CI runs 150 rounds (a
    # smoke test); RINGQ_FORK_ROUNDS=2000, several at once on a busy machine, is the long run.
    rounds = os.environ.get("RINGQ_FORK_ROUNDS", "150")
    out = run_py(FORK_WINDOWS, str(tmp_path / "q"), rounds, timeout=600)
    assert out.returncode == 0, out.stderr
    forks, bad = map(int, out.stdout.split())
    assert forks > 50 and bad == 0, out.stdout


FORK_IN_FLOCK = """
import os, sys, threading, time, fcntl
from ringq.engine import forksafe

path = sys.argv[1]
open(path, "w").close()
inside, leave = threading.Event(), threading.Event()

def holder():  # a schedule writer, say, inside its brief flock when the fork lands
    with forksafe.flocked(path, os.O_RDWR):
        inside.set()
        leave.wait()

t = threading.Thread(target=holder)
t.start()
inside.wait()
r, w = os.pipe()
up_r, up_w = os.pipe()
pid = os.fork()
if pid == 0:  # the fork hooks have run by now
    os.close(w)
    os.write(up_w, b"u")
    os.read(r, 1)  # lives on until the parent has looked
    os._exit(0)
os.close(r)
os.read(up_r, 1)  # the child is past its fork hooks
leave.set()
t.join()
fd = os.open(path, os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held by the child")
finally:
    os.write(w, b"x")
    os.waitpid(pid, 0)
"""


def test_a_brief_flock_ends_with_its_block_though_a_child_forked_inside_it_lives(tmp_path):
    # The schedule table's writers, nobroker imports and the like hold a flock for one block: a
    # child forked from another thread meanwhile must not keep it held after the block ends.
    out = run_py(FORK_IN_FLOCK, str(tmp_path / "f"), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["free"]


FORK_IN_COLLECTION = """
import gc, os, sys
from ringq import Queue

def lock_files():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith((".lock", ".owners", ".sync")):
            out.append(os.path.basename(target))
    return out

class ForksWhenCollected:  # a fork that lands while the collector finalises an unclosed queue
    def __del__(self):
        pid = os.fork()
        if pid == 0:
            os._exit(3 if lock_files() else 0)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))

probe = ForksWhenCollected()  # made first: finalised before the queue
q = Queue(sys.argv[1], durability="group")  # never closed: the collector frees it
q.enqueue(1)
q.lease_one()
q.probe, probe.q = probe, q  # the queue and the probe: garbage of one cycle
del q, probe
gc.collect()
"""


def test_a_fork_while_the_collector_frees_an_unclosed_queue_gives_the_child_no_lock(tmp_path):
    # The collector drops an object's weak references before its finaliser closes what it
    # holds: a fork in between must still leave no lock descriptor in the child.
    out = run_py(FORK_IN_COLLECTION, str(tmp_path / "q"), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"], out.stdout
