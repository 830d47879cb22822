"""A consumer blocked in ``lease(wait=...)`` leases a job appended meanwhile in the C call it waits
in (ringq_wait_claim) -- but only the job its index would rank first; anything else is left to
the general path.  Real processes: a waiting consumer and a producer that appends, delays, expires
or returns jobs while it waits."""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import pytest
from procs import spawn

from ringq import Job, JobState, Queue, QueueClosedError

CONSUMER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], durability="none", spin=float(sys.argv[3]))
print("ready", flush=True)
t0 = time.monotonic()
for _ in range(int(sys.argv[2])):
    job = q.lease_one(wait=30)
    print(repr(job.payload), job.lease_token, round(time.monotonic() - t0, 3), flush=True)
    q.ack(job)
"""


def start(qdir, n, spin=0.0):
    Queue(qdir, durability="none").close()
    child = spawn(CONSUMER, str(qdir), str(n), str(spin), stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # asleep in lease_one (or spinning)
    return child


def results(child):
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    return [line.split() for line in out.splitlines()]


@pytest.mark.parametrize("spin", [0.0, 0.5])
def test_a_job_appended_while_waiting_is_leased_once_with_token_1(tmp_path, spin):
    child = start(tmp_path, 1, spin)
    with Queue(tmp_path, durability="none") as q:
        q.enqueue("one")
        rows = results(child)
        assert rows[0][:2] == ["'one'", "1"]
        assert q.stats().done == 1 and q.stats().leased == 0


def test_a_delayed_job_appended_while_waiting_is_not_leased_early(tmp_path):
    child = start(tmp_path, 1)
    with Queue(tmp_path, durability="none") as q:
        t = time.monotonic()
        q.enqueue("later", delay=0.5)
        rows = results(child)
        assert rows[0][0] == "'later'"
        assert time.monotonic() - t >= 0.5


def test_a_higher_priority_job_in_the_same_append_goes_first(tmp_path):
    # import_jobs publishes both records in one append: the waiter sees the pair at once, and
    # the later record outranks the first, so the call must not lease the first.
    child = start(tmp_path, 2)
    with Queue(tmp_path, durability="none") as q:
        q.import_jobs([Job(id="low", payload="low", priority=0), Job(id="high", payload="high", priority=5)])
    assert [r[0] for r in results(child)] == ["'high'", "'low'"]


def test_more_new_jobs_than_one_call_looks_at_are_all_leased_in_order(tmp_path):
    child = start(tmp_path, 20)
    with Queue(tmp_path, durability="none") as q:
        q.enqueue_many([f"j{i}" for i in range(20)])
    assert [r[0] for r in results(child)] == [f"'j{i}'" for i in range(20)]


def test_a_job_returned_by_another_process_while_waiting_is_leased(tmp_path):
    with Queue(tmp_path, durability="none") as q:
        q.enqueue("retry_me")
        held = q.lease_one()
        child = start(tmp_path, 1)
        q.nack(held, delay=0)  # back to READY: a return, not an append
        rows = results(child)
    assert rows[0][:2] == ["'retry_me'", "2"]


def test_an_expiring_job_appended_while_waiting_is_leased_by_the_general_path(tmp_path):
    child = start(tmp_path, 1)
    with Queue(tmp_path, durability="none") as q:
        job = q.enqueue("soon_gone", expires_in=30)
        assert results(child)[0][0] == "'soon_gone'"
        assert q.get(job.id).state is JobState.DONE


def waiting(q: Queue) -> tuple[threading.Thread, list[Any]]:
    """A started thread blocked in ``q.lease_one(wait=5)``, and the list it puts what that gave
    into: the job (or None), or the QueueClosedError it raised."""
    out: list[Any] = []

    def wait() -> None:
        try:
            out.append(q.lease_one(wait=5))
        except QueueClosedError as exc:
            out.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    return t, out


def test_closing_a_queue_while_a_thread_waits_in_lease_raises_closed(tmp_path):

    q = Queue(tmp_path, durability="none")
    t, out = waiting(q)
    time.sleep(0.2)  # asleep inside the C call that waits on the shared mappings
    q.close()  # wakes it and lets it leave before unmapping: never a crash
    t.join(10)
    assert not t.is_alive() and isinstance(out[0], QueueClosedError)


def test_a_job_leased_in_the_wait_as_its_queue_closes_goes_back_unleased(tmp_path):
    """The C call leases a job just appended while the waiting queue object is being closed:
    the lease is given back (READY, never leased: no attempt used), not left to be reclaimed
    as a dead holder's -- which, with max_attempts=1, would dead-letter a job that never ran."""
    from ringq.engine.ring import Ring

    producer = Queue(tmp_path, durability="none", max_attempts=1)
    try:
        for _ in range(20):
            q = Queue(tmp_path, durability="none", max_attempts=1)
            t, out = waiting(q)
            time.sleep(0.05)  # asleep in the wait
            job = producer.enqueue({"x": 1})
            q.close()  # often while the woken thread holds the lease the C call took
            t.join(10)
            assert not t.is_alive()
            if isinstance(out[0], QueueClosedError):
                back = producer.get(job.id)
                assert back.state is JobState.READY and back.attempts == 0, back
                # Its owner word untagged too: the next lease is count 1 again, and a tag of
                # count 1 left there would name the closed object as its holder.
                segseq, slot, _origin = job.record_position
                ring = Ring(str(tmp_path), "default")
                try:
                    assert ring.segs.get(segseq).load_owner(slot) == 0
                finally:
                    ring.close()
                again = producer.lease_one()
                assert again.id == job.id and again.lease_token == "1"
                producer.ack(again)
            else:  # the thread got the job before the close: its first lease
                assert out[0].id == job.id and out[0].lease_token == "1"
        st = producer.stats()
        assert st.dead == 0 and st.dead_lettered_total == 0
    finally:
        producer.close()


@pytest.mark.parametrize("pause_key", [False, True])
def test_a_pause_set_while_a_consumer_waits_holds_the_job_back(tmp_path, pause_key):
    child = start(tmp_path, 1)
    with Queue(tmp_path, durability="none") as q:
        if pause_key:
            q.pause("k")
        else:
            q.pause()
        q.enqueue("held", key="k")
        time.sleep(0.3)
        assert q.stats().leased == 0  # the waiter's C call leased it, saw the pause, gave it back
        q.resume("k") if pause_key else q.resume()
        rows = results(child)
    assert rows[0][:2] == ["'held'", "1"]  # leased once the pause ended, still its first lease


WAITER_OPS = """
import json, sys
from ringq import Queue
q = Queue(sys.argv[1], durability="none")
print("ready", flush=True)
job = q.lease_one(wait=30)
# Straight from the wait, before any other call of this process reads the record in.
snap = {f: getattr(job, f) for f in ("id", "priority", "max_attempts", "available_at",
                                     "enqueued_at", "lease_token", "seq", "attempts")}
snap["state"] = job.state.value
snap["deadline"] = job.lease_deadline
ext = q.extend(job, 60)
nacked = q.nack(job, delay=0, error="once more")
again = q.lease_one(wait=30)
q.ack(again)
print(json.dumps({"snap": snap, "ext": ext.lease_deadline, "nacked": nacked.state.value,
                  "again": [again.id, again.lease_token, again.payload]}), flush=True)
"""


def test_a_job_leased_in_the_wait_is_the_job_the_queue_shows_and_takes_extend_nack_and_ack(tmp_path):
    # The wait builds the job from the fields the C call read from the record, and this process
    # reads the record into its index only later: the job must equal the queue's own view of it,
    # and extend, nack and ack straight after the wait must find the lease.
    import json

    Queue(tmp_path, durability="none").close()
    child = spawn(WAITER_OPS, str(tmp_path), stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # asleep in the C wait
    with Queue(tmp_path, durability="none") as q:
        q.enqueue({"n": 1}, priority=3, max_attempts=4, job_id="the-job")
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0, out
        got = json.loads(out.strip().splitlines()[-1])
        after = q.get("the-job")
    snap = got["snap"]
    assert snap["id"] == "the-job" and snap["state"] == "leased" and snap["lease_token"] == "1"
    assert (snap["priority"], snap["max_attempts"], snap["attempts"]) == (3, 4, 1)
    assert snap["seq"] == after.seq and snap["enqueued_at"] == after.enqueued_at
    assert snap["available_at"] == after.available_at
    assert snap["deadline"] is not None and got["ext"] > snap["deadline"]
    assert got["nacked"] == "ready"
    assert got["again"] == ["the-job", "2", {"n": 1}]
    assert after.state is JobState.DONE and after.attempts == 2


def test_a_wait_on_a_segment_closed_meanwhile_returns_for_a_new_look(tmp_path):
    """A consumer waits without the queue lock, on the tail segment it saw; another thread may
    retire and close that segment first (a purge, the last job acked).  The wait then returns
    at once, for the caller to look again -- never a TypeError from the closed mapping."""
    from ringq.engine import claim
    from ringq.engine.ring import Ring

    ring = Ring(tmp_path, "q", slot_size=256, slot_count=16, durability="none")
    try:
        seg = next(iter(ring.segs))
        seg.close()
        got = claim.wait_claim(ring.ctl, seg, 0, 0, 0, 5.0, 0.0, 30_000, 0)
        assert got is None
    finally:
        ring.close()


@pytest.mark.parametrize("reclaimed_first", [False, True])
def test_a_job_leased_in_the_wait_whose_lease_ran_out_stays_leasable_after_a_stale_ack(
    tmp_path, reclaimed_first
):
    # The consumer leases the job in the C call it waits in, so its index reads the record in
    # only at the ack.  Its lease runs out first; the stale ack is refused, and the job -- READY
    # again, reclaimed by another process's queue before the ack or by the ack itself -- is the
    # consumer's next lease.
    from ringq import NotLeasedError

    q = Queue(tmp_path, durability="none", visibility_timeout=0.2)
    other = Queue(tmp_path, durability="none")
    try:
        assert q.lease(1) == []
        got = []
        waiter = threading.Thread(target=lambda: got.append(q.lease_one(wait=10)))
        waiter.start()
        time.sleep(0.2)  # asleep in the wait
        other.enqueue("one")
        waiter.join(10)
        (job,) = got
        assert job.payload == "one" and job.lease_token == "1"
        time.sleep(0.35)  # its lease runs out
        if reclaimed_first:
            assert other.get(job.id).state is JobState.READY  # reclaimed there
        with pytest.raises(NotLeasedError):
            q.ack(job)
        again = q.lease_one()
        assert again is not None and again.id == job.id and again.lease_token == "2"
        q.ack(again)
        assert q.stats().done == 1
    finally:
        q.close()
        other.close()


@pytest.mark.parametrize("news", ["append", "other"])
def test_a_waiter_whose_new_job_another_consumer_took_sleeps_on_in_c_unless_more_happened(
    tmp_path, news
):
    """Every sleeper wakes for an append, and all but one find its job taken.  With one step of
    the wake word (an append's) since it slept and every new record taken, a loser sleeps again
    inside the C call, past those records, and leases the next job appended, rather than
    returning for a look of its own.  Other news (Control.wake: a step of 2, as a close or a
    pause makes) sends it back to its caller."""
    from ringq.codec import JSON
    from ringq.engine import claim
    from ringq.engine.control import OFF_WAKE
    from ringq.engine.records import NewRecord
    from ringq.engine.ring import Ring

    Queue(tmp_path, durability="none").close()
    ring = Ring(str(tmp_path), "default", durability="none")
    other = Queue(tmp_path, durability="none")
    try:
        seg = ring.tail_segment()
        ctl = ring.ctl
        seen, tail = ctl.wake_word(), seg.tail()
        got: list[Any] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                claim.wait_claim(ctl, seg, seen, ctl.change_counter(), tail, 10.0, 0.0, 30_000, 0)
            )
        )
        waiter.start()
        time.sleep(0.2)  # asleep in the wait
        ring.append_nowait([NewRecord(b'"taken"', JSON)])  # published; nobody woken yet
        taken = other.lease(1)
        assert [j.payload for j in taken] == ["taken"]
        if news == "other":
            ctl.wake()
            waiter.join(10)
            assert got == [None]  # back to the caller, for a look
            return
        ctl.add32(OFF_WAKE, 1)  # the append's wake-up (csrc/append.c): its one job is gone
        ctl.futex_wake(OFF_WAKE)
        time.sleep(0.2)
        assert waiter.is_alive() and got == []  # asleep again, in the same call
        (placed,) = ring.append([NewRecord(b'"next"', JSON)])
        waiter.join(10)
        (lease,) = got
        assert lease is not None
        slot, _word, _prev, _record, job = lease
        assert slot == placed[1] and job is not None and job.payload == "next"
        assert slot > tail  # past the record another consumer took
        other.ack(taken[0])
    finally:
        other.close()
        ring.close()


SPILL_CONSUMER = """
import sys, time
from ringq import Queue
q = Queue(sys.argv[1], durability="none", slot_size=256, slot_count=4)
assert q.lease_one() is None
print("ready", flush=True)
job = q.lease_one(wait=5)
print(job.payload, time.time(), flush=True)
q.ack(job)
"""


def test_a_batch_that_spills_into_a_new_segment_is_leased_at_once_by_waiting_consumers(tmp_path):
    """One append's wake-up, its first job (the last slot of the segment the waits sleep on)
    taken by one waiting consumer, its second in a new segment: the other consumer must not
    sleep on past the first (it would wait out its sleep, up to 0.25 s), but look."""
    with Queue(tmp_path, durability="none", slot_size=256, slot_count=4) as producer:
        for _ in producer.enqueue_many(["x", "x", "x"]):  # slots 0-2 of the first segment
            producer.ack(producer.lease_one())
        children = [spawn(SPILL_CONSUMER, str(tmp_path), stdout=subprocess.PIPE, text=True) for _ in range(2)]
        for child in children:
            assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # both asleep in the wait
        t0 = time.time()
        placed = producer.enqueue_many(["a", "b"])
        assert placed[0].record_position[0] != placed[1].record_position[0]  # two segments
        rows = [child.communicate(timeout=30)[0].split() for child in children]
        assert sorted(r[0] for r in rows) == ["a", "b"]
        assert max(float(r[1]) for r in rows) - t0 < 0.12


CANCEL_AND_PAUSE = """
import sys
from ringq import Queue
q = Queue(sys.argv[1], durability="none")
q.cancel(sys.argv[2])
q.pause()
q.close()
"""


def test_a_lease_given_back_after_a_cancel_request_is_not_left_leased_by_nobody(
    tmp_path, monkeypatch
):
    """The C wait leases a job; before the thread hands it out, another process requests its
    cancel and pauses the queue, so the lease is given back -- but its word now carries the
    cancel flag and does not go back to READY.  It must stay this holder's (reclaimed at once,
    and then cancelled), not be left unowned until its visibility timeout runs out."""
    from ringq.local import leases

    q = Queue(tmp_path, durability="none", visibility_timeout=30)
    other = Queue(tmp_path, durability="none")
    try:
        assert q.lease_one() is None
        real = leases.Leases.wait_claim

        def wait_claim(self: Any, *a: Any) -> Any:
            got = real(self, *a)
            if got is not None:
                job_id = other.list_jobs()[0].id
                child = spawn(CANCEL_AND_PAUSE, str(tmp_path), job_id)
                assert child.wait(30) == 0
            return got

        monkeypatch.setattr(leases.Leases, "wait_claim", wait_claim)
        threading.Timer(0.2, lambda: other.enqueue({"x": 1})).start()
        assert q.lease_one(wait=0.6) is None  # given back: the queue was paused meanwhile
        monkeypatch.setattr(leases.Leases, "wait_claim", real)
        other.resume()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with Queue(tmp_path, durability="none") as r:
                r.lease_one()  # a look, with a reaper pass
            if other.list_jobs()[0].state is not JobState.LEASED:
                break
            time.sleep(0.2)
        assert other.list_jobs()[0].state is JobState.CANCELLED
    finally:
        q.close()
        other.close()


INTERRUPTED_WAIT = """
import sys, threading, time
from ringq import Queue
from ringq.local.context import Outside

q = Queue(sys.argv[1], durability="none")
other = Queue(sys.argv[1], durability="none")
assert q.lease_one() is None
real = Outside.leave_held


class Interrupted(Exception):
    pass


def interrupted(self):
    if threading.current_thread() is not threading.main_thread():
        return real(self)  # the producer's thread counts itself out too
    Outside.leave_held = real
    raise Interrupted


Outside.leave_held = interrupted
threading.Timer(0.2, lambda: other.enqueue({"x": 1})).start()
try:
    q.lease_one(wait=5)
    print("not interrupted")
except Interrupted:
    t = time.monotonic()
    q.close()
    print("closed in", round(time.monotonic() - t, 3))
other.close()
"""


def test_an_exception_before_a_waited_lease_is_handed_out_does_not_leave_close_waiting(tmp_path):
    """An exception (a signal handler's, say) between the C wait's return with a lease and the
    thread's counting itself out of the users of the mappings: it is still counted out, so a
    close of the queue object does not wait for it (it used to wait out its 10 s).  In a child
    process: the fault is injected by replacing a method of the class."""
    child = spawn(INTERRUPTED_WAIT, str(tmp_path), stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    words = out.split()
    assert words[:2] == ["closed", "in"] and float(words[2]) < 2, out


INJECT = """
import sys


class Interrupt(BaseException):  # as KeyboardInterrupt: not an Exception
    pass


at = {"n": None, "events": 0, "armed": False}  # raise at the n-th point counted from 1


def profiler(frame, event, arg):
    # The points where the interpreter runs a signal's handler: entering a function, and
    # returning from a call into C.
    if event in ("call", "c_return"):
        at["events"] += 1
        if at["events"] == at["n"]:
            sys.setprofile(None)
            raise Interrupt


def cut_short(q, calls, total, attempts):
    # Each call again and again, cut short at its n-th point from the one its script arms at
    # (n from 0), until it returns having armed: every point before its return was tried.
    # Cut short, it leaves nothing leased; every job it or the rest leases has ``attempts``.
    leased = 0
    for name, call in calls.items():
        n = 0
        while True:
            at["n"], at["armed"] = n, False
            try:
                jobs = call()
            except Interrupt:
                jobs = None
            finally:
                sys.setprofile(None)
                at["n"] = None
            st = q.stats()
            if jobs is not None:
                assert jobs and all(j.attempts == attempts for j in jobs), (name, n, jobs)
                for j in jobs:
                    q.ack(j)
                leased += len(jobs)
                if at["armed"]:
                    break
                continue  # returned before the point that arms: the same n again
            assert st.leased == 0, (name, n, st)
            n += 1
        print(name, n, flush=True)
    rest = q.lease(1000)
    assert len(rest) == total - leased and all(j.attempts == attempts for j in rest), len(rest)
    print("all given back", flush=True)
"""


def run_injected(code: str, *args: str) -> str:
    """Run ``code`` (one of the scripts below, after :data:`INJECT`'s ``Interrupt``, ``at``,
    ``profiler`` and ``cut_short``) in a real child process; its stdout, once it exited 0."""
    import sys

    from procs import child_env

    out = subprocess.run([sys.executable, "-c", INJECT + code, *args], capture_output=True,
                         text=True, timeout=300, env=child_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


INTERRUPTED = """
import os, signal, sys, threading, time
from ringq import Queue
from ringq.engine import claim as claim_mod
from ringq.engine import runs as runs_mod

real = claim_mod.lib


def on_signal(signum, frame):
    raise Interrupt


signal.signal(signal.SIGUSR1, on_signal)


class Proxy:
    def __getattr__(self, name):
        return getattr(real, name)

    def ringq_wait_claim(self, *a):
        rc = real.ringq_wait_claim(*a)
        if at["n"] is not None and a[6].status == real.RINGQ_CLAIMED:
            at["armed"] = True
            if at["n"] == 0:  # a signal that came during the call: its handler runs next
                os.kill(os.getpid(), signal.SIGUSR1)
            else:  # an exception at each later point the interpreter could raise one
                at["events"] = 0
                sys.setprofile(profiler)
        return rc


claim_mod.lib = Proxy()
real_wait_job = runs_mod.wait_job


def wait_job(*a):  # the same for a lease whose Job the wait's C call builds (runs.wait_job)
    made = real_wait_job(*a)
    if at["n"] is not None and made is not None and made.__class__ is not int:
        at["armed"] = True
        if at["n"] == 0:
            os.kill(os.getpid(), signal.SIGUSR1)
        else:
            at["events"] = 0
            sys.setprofile(profiler)
    return made


if real_wait_job is not None:
    runs_mod.wait_job = wait_job
q = Queue(sys.argv[1], visibility_timeout=30)
n = 0
while True:
    producer = threading.Thread(target=lambda: (time.sleep(0.02), q.enqueue({"n": n})))
    at["n"], at["armed"] = n, False
    producer.start()
    job = None
    try:
        jobs = q.lease(int(sys.argv[2]), wait=5)
        job = jobs[0] if jobs else None
    except Interrupt:
        pass
    finally:
        sys.setprofile(None)
        at["n"] = None
    producer.join()
    if job is not None:
        assert job.attempts == 1, job
        q.ack(job)
        if at["armed"]:
            break  # leased without an exception: every point before the return was tried
        continue  # leased outside the C call's wait: the same point again
    st = q.stats()
    assert st.leased == 0 and st.ready == 1, (n, st)
    again = q.lease_one()
    # Given back unleased: the first lease of the job is still to come.
    assert again is not None and again.attempts == 1 and again.payload == {"n": n}, (n, again)
    q.ack(again)
    n += 1
assert q.introspect()["claiming"] == 0, q.introspect()
print("points", n, flush=True)
"""


@pytest.mark.parametrize("count", [1, 3])
def test_an_exception_as_the_wait_leases_gives_the_job_back_unleased(tmp_path, count):
    # KeyboardInterrupt (any signal handler's exception) raised as lease's wait returns with a
    # job it leased in C, or at any later point before lease returns it (with a count of 3, also
    # in the pass that looks for more, and in its catch-up): nobody sees the job, so it goes
    # back READY with no attempt counted, and is leased at once by the next call (not charged an
    # attempt as a dead holder's lease, not held until its visibility timeout, not passed over
    # by an index whose catch-up was cut short).
    out = run_injected(INTERRUPTED, str(tmp_path), str(count))
    assert int(out.split()[-1]) > 10, out  # the signal right after the call, then every later point


LOCK_LEFT = """
import sys, threading, time
from ringq import Queue


q = Queue(sys.argv[1])
q.lease_one()  # the reader is built
calls = {
    "lease_one": lambda: q.lease_one(wait=0.001),
    "stats": q.stats,
    "enqueue_many": lambda: q.enqueue_many([{"k": 1}, {"k": 2}]),
}
for name, call in calls.items():
    n = 0
    while True:
        n += 1
        at["n"], at["events"] = n, 0
        sys.setprofile(profiler)
        try:
            call()
            done = True
        except Interrupt:
            done = False
        finally:
            sys.setprofile(None)
        other = threading.Thread(target=q.stats)  # the queue lock is free again
        other.start()
        other.join(10)
        assert not other.is_alive(), (name, n, "the queue lock was left held")
        if done:
            break
    print(name, n, flush=True)
t0 = time.monotonic()
q.close()  # nothing left counted among the mappings' users: no wait for one
assert time.monotonic() - t0 < 5, time.monotonic() - t0
print("closed", flush=True)
"""


def test_an_exception_at_any_point_of_a_call_leaves_the_queue_lock_free(tmp_path):
    # A signal handler's exception (KeyboardInterrupt, a timeout) raised at each point of a call
    # where the interpreter runs handlers: the queue's lock is never left held by the thread
    # that got the exception (another thread's call would block for ever), and close does not
    # wait for a user of the mappings that left.
    assert "closed" in run_injected(LOCK_LEFT, str(tmp_path))


RESET_LOOK = """
import sys
from ringq import Queue


q = Queue(sys.argv[1])
q.enqueue_many([{"i": i} for i in range(1000)])
q.stats()  # the reader built and what stats imports imported
n = 0
while True:
    n += 1
    q.ack(q.lease_one())  # a look that found all clear: later leases may trust it
    at["n"], at["events"] = n, 0
    sys.setprofile(profiler)
    try:
        q.stats()
        done = True
    except Interrupt:
        done = False
    finally:
        sys.setprofile(None)
    job = q.lease_one()  # at once, whatever the cut-short catch-up left of the index
    assert job is not None, (n, q.stats())
    q.ack(job)
    if done:
        break
print("points", n, flush=True)
"""


def test_a_catch_up_cut_short_outside_lease_leaves_every_job_leasable_at_once(tmp_path):
    # An exception (a signal handler's) at any point of stats(), whose catch-up may be cut
    # short: the index then reads everything again, and the next lease_one() looks in full
    # rather than trusting its last look (nothing it watches moved), so it leases a ready job at
    # once, not after the quiet look's second.
    out = run_injected(RESET_LOOK, str(tmp_path))
    assert int(out.split()[-1]) > 10, out


@pytest.mark.parametrize(
    "kw", [{}, {"key": "tenant-é"}, {"job_id": "the-job-é"}, {"priority": -2, "max_attempts": 9}]
)
def test_a_job_a_waiting_thread_leases_equals_the_queues_own_snapshot(tmp_path, kw):
    # The wait builds a plain job in its C call, and leaves a keyed one to the caller, built from
    # the record: either way every field is what the queue shows for the job.
    import dataclasses

    with Queue(tmp_path, durability="none") as q:
        q.ack(q.enqueue("first") and q.lease_one())  # the reader built, a segment appended to
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(q.lease_one(wait=10)))
        waiter.start()
        time.sleep(0.2)  # asleep in the C wait
        q.enqueue({"p": "é"}, **kw)
        waiter.join(10)
        job = got[0]
        snap = q.get(job.id)
        for f in dataclasses.fields(job):
            if f.name not in ("payload", "_raw", "cancelled"):
                assert getattr(job, f.name) == getattr(snap, f.name), f.name
        assert job.payload == snap.payload == {"p": "é"}
        assert job.state is JobState.LEASED and job.lease_token == "1" and job.attempts == 1
        assert job.key == kw.get("key")
        q.ack(job)
        assert q.stats().done == 2


def assert_cut_short(out: str, *calls: str) -> None:
    """What a script ending in ``cut_short`` printed: every call was cut short at more than three
    points, and every job was given back."""
    assert "all given back" in out, out
    counts = dict(line.rsplit(" ", 1) for line in out.splitlines() if line.startswith(calls))
    assert all(int(counts[c]) > 3 for c in calls), out


TAKE_CUT_SHORT = """
import sys
from ringq import Queue
from ringq.engine import index as index_mod

real_claim_run = index_mod.claim_run


def claim_run(*a):  # a run of jobs leased in one C call: raise at every later point
    got = real_claim_run(*a)
    if at["n"] is not None and got[0] > 0:
        at["armed"] = True
        if at["n"] == 0:
            raise Interrupt  # as the call returns: its jobs not made yet
        at["events"] = 0
        sys.setprofile(profiler)
    return got


index_mod.claim_run = claim_run
q = Queue(sys.argv[1], visibility_timeout=30)
q.enqueue_many([{"i": i} for i in range(400)])
q.stats()  # the reader built and what it imports imported
cut_short(q, {"lease_one": lambda: [q.lease_one()], "lease(5)": lambda: q.lease(5)}, 400, 1)
"""


def test_a_lease_cut_short_by_an_exception_gives_back_every_job_it_took(tmp_path):
    # A signal handler's exception at each point of lease_one() and lease(5) where the interpreter
    # runs handlers, jobs being due (no wait): the jobs a C call leased whose Job objects were not
    # made yet, and those made but not returned, go back READY at once with no attempt used,
    # rather than staying leased by a live process until their visibility timeout.
    assert_cut_short(run_injected(TAKE_CUT_SHORT, str(tmp_path)), "lease_one", "lease(5)")


GENERAL_CUT_SHORT = """
import sys
from ringq import Queue
from ringq.engine import segment as seg_mod
from ringq.engine.words import ST_LEASED, state

real_cas = seg_mod.Segment.cas_state


def cas_state(self, slot, expected, desired):  # a lease's CAS in Python: raise at every later point
    got = real_cas(self, slot, expected, desired)
    if at["n"] is not None and not at["armed"] and got[0] and state(desired) == ST_LEASED:
        at["armed"] = True
        if at["n"] == 0:
            raise Interrupt  # as the CAS returns
        at["events"] = 0
        sys.setprofile(profiler)
    return got


seg_mod.Segment.cas_state = cas_state
q = Queue(sys.argv[1], visibility_timeout=300)
q.enqueue_many([{"i": i} for i in range(120)])
for job in q.lease(120):
    q.nack(job, error="again", delay=0)  # leased once: their next lease is the Python path's
cut_short(q, {"lease_one": lambda: [q.lease_one()], "lease(3)": lambda: q.lease(3)}, 120, 2)
"""


def test_a_lease_cut_short_in_its_python_claim_gives_the_job_back(tmp_path):
    # The same for jobs leased one at a time in Python (given back or nacked before, so not
    # plain): an exception as the lease's CAS returns, or at any later point before the lease
    # returns the job, leaves it READY, its attempt not used.
    assert_cut_short(run_injected(GENERAL_CUT_SHORT, str(tmp_path)), "lease_one", "lease(3)")
