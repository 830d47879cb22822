"""An exception (a signal handler's: KeyboardInterrupt, an alarm-based timeout) raised at any point
of an enqueue where the interpreter runs a handler -- entering a Python function, returning from a
call into C -- never leaves the writer lock held: neither this process's part of it (its thread
lock: every other thread's enqueue would block for ever) nor the ``flock`` (every other process's
would time out) nor a count among the writers waiting for it (every release would make a futex
wake for nobody, for good), never leaves a batch half-written, and never leaves the enqueue
counted among the users of the mappings (close would wait for it).  Real processes: the calls run
in a child (test_wait_claim.py's injection harness), a grandchild takes the writer lock after each
point."""

from __future__ import annotations

from test_wait_claim import run_injected

WRITER_LEFT = """
import fcntl, os, subprocess, threading, time
from ringq import Queue
from ringq.engine import runs
from ringq.engine.control import OFF_LOCK_WAITERS

# Another process: on each line it reads, an enqueue that must take the writer lock within a
# second (LockTimeoutError otherwise).
OTHER = '''
import sys
from ringq import LockTimeoutError, Queue
q = Queue(sys.argv[1], lock_timeout=1)
for line in sys.stdin:
    try:
        q.enqueue({"from": "process"}, priority=1)  # a taken flock is waited for, 1 s at most
        print("ok", flush=True)
    except LockTimeoutError:
        print("held", flush=True)
'''
other = subprocess.Popen([sys.executable, "-c", OTHER, sys.argv[1]], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)


def other_process_enqueues():
    other.stdin.write("go\\n")
    other.stdin.flush()
    return other.stdout.readline().strip() == "ok"


def other_thread_enqueues():
    got = []
    t = threading.Thread(target=lambda: got.append(q.enqueue({"from": "thread"})), daemon=True)
    t.start()
    t.join(5)
    return bool(got)


def waiters():
    # The writers of the queue registered as waiting for the flock (docs/format.md).
    with open(os.path.join(sys.argv[1], "default.ctl"), "rb") as f:
        return int.from_bytes(os.pread(f.fileno(), 4, OFF_LOCK_WAITERS), "little")


def held_till_waited():
    # The flock, held from another open file description of the lock file (as another process
    # holds it) until a writer registers as waiting for it, and 2 ms more (or the call ended):
    # a call now finds it taken and waits for it.  Returns what ends the hold.
    fd = os.open(os.path.join(sys.argv[1], "default.lock"), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ended = threading.Event()

    def hold():
        while not (ended.is_set() or waiters()):
            time.sleep(0.0002)
        ended.wait(0.002)
        os.close(fd)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    return lambda: (ended.set(), holder.join())


q = Queue(sys.argv[1])
ids = iter(range(10**9))
calls = {  # name: (jobs per call, the call, what runs before it)
    "enqueue": (1, lambda: q.enqueue({"k": 1}), None),
    "enqueue priority": (1, lambda: q.enqueue({"k": 1}, priority=1), None),
    "enqueue_many": (3, lambda: q.enqueue_many([{"k": 1}, {"k": 2}, {"k": 3}]), None),
    # Decided under the writer lock's with-statement (the others take the flock in C).
    "enqueue job_id": (1, lambda: q.enqueue({"k": 1}, job_id=f"id-{next(ids)}"), None),
    # The with-statement's entry finds the flock taken and waits (WriterLock._flock).
    "enqueue contended": (1, lambda: q.enqueue({"k": 1}, priority=1), held_till_waited),
}
for k, call, before in calls.values():  # once each, uninterrupted: what a first call builds
    release = before() if before else None
    call()
    if release:
        release()
waits = []
sys.setprofile(lambda f, e, a: e == "call" and f.f_code.co_name == "_flock" and waits.append(f))
release = held_till_waited()
q.enqueue({"k": 1}, priority=1)
sys.setprofile(None)
release()
assert waits, "the contended call did not wait"
real = runs.express  # the module's: a recorder may stand in for it
got = []
runs.express = lambda *a: got.append(real(*a)) or got[-1]
q.enqueue({"k": 1})
runs.express = real
assert len(got) == 1 and not isinstance(got[0], int), got  # the express path: one C call
assert other_process_enqueues() and other_thread_enqueues()
for name, (k, call, before) in calls.items():
    n = 0
    while True:
        n += 1
        total = q.stats().total
        release = before() if before else None
        at["n"], at["events"] = n, 0
        sys.setprofile(profiler)
        try:
            call()
            done = True
        except Interrupt:
            done = False
        finally:
            sys.setprofile(None)
        if release:
            release()
        assert other_process_enqueues(), (name, n, "another process could not take the writer lock")
        assert other_thread_enqueues(), (name, n, "another thread could not enqueue")
        assert waiters() == 0, (name, n, "a writer was left counted among the lock's waiters")
        added = q.stats().total - total - 2  # the other process's job and the other thread's
        # Done: its whole batch.  Interrupted: nothing, or its whole batch (cut short after it).
        assert added == k if done else added in (0, k), (name, n, done, added)
        if done:
            break
    print(name.replace(" ", "_"), n, flush=True)
other.stdin.close()
assert other.wait(10) == 0
t0 = time.monotonic()
q.close()  # no enqueue left itself counted among the mappings' users: no wait for one
assert time.monotonic() - t0 < 5, time.monotonic() - t0
print("done", flush=True)
"""


def test_an_exception_at_any_point_of_an_enqueue_leaves_the_writer_lock_free(tmp_path):
    # Each of enqueue (the express path: a dict payload, nothing else), enqueue with a priority
    # (the general path, its flock taken in C), enqueue_many, enqueue with a job_id (under the
    # writer lock's with-statement) and enqueue finding the flock taken (it waits), with an
    # exception raised at its 1st point, then its 2nd, ... until one call completes: after each,
    # another process and another thread of this one enqueue at once, no writer is counted as
    # waiting for the lock, and the call left no job or its whole batch.
    out = run_injected(WRITER_LEFT, str(tmp_path))
    assert out.splitlines()[-1] == "done", out
    points = {name: int(n) for name, n in (line.split() for line in out.splitlines()[:-1])}
    print("points tried:", points)
    want = {"enqueue", "enqueue_priority", "enqueue_many", "enqueue_job_id", "enqueue_contended"}
    assert set(points) == want and min(points.values()) > 20, out
