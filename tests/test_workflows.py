"""Workflows on the local queue: dependencies, failure propagation, batch callbacks, debounce and
replace, rescheduling (docs/workflows.md).

Real queues in real directories; the crash case SIGKILLs a real process between a parent's ack
and the release of its dependent.  Waits are bounded polls, never sleeps a pass depends on.
"""

from __future__ import annotations

import random
import time

import pytest
from conftest import SEED
from procs import run_py

from ringq import (
    JobNotFoundError,
    JobNotWaitingError,
    JobState,
    Queue,
)


def _run(q: Queue, payload) -> None:
    """Lease the job with ``payload`` (it must be the only ready one) and ack it."""
    j = q.lease_one()
    assert j is not None and j.payload == payload, (j, payload)
    q.ack(j)


# -- dependencies ---------------------------------------------------------------------------------


def test_a_dependent_waits_for_every_parent_then_is_ready_once(tmp_path):
    with Queue(tmp_path) as q:
        a, b = q.enqueue("a"), q.enqueue("b", job_id="bee")
        c = q.enqueue("c", depends_on=[a, "bee", a.id])  # a duplicate counts once
        assert c.state is JobState.DEFERRED and c.depends_on == [a.id, "bee"]
        assert q.get(c.id).depends_on == [a.id, "bee"]
        assert q.dependents(a) == [c.id] and q.dependents("bee") == [c.id]
        st = q.stats()
        assert (st.ready, st.deferred, st.total) == (2, 1, 3)
        assert [j.id for j in q.list_jobs("deferred")] == [c.id]
        assert [j.id for j in q.list_jobs("ready")] == [a.id, b.id]
        _run(q, "a")
        assert q.get(c.id).state is JobState.DEFERRED
        _run(q, "b")
        assert q.get(c.id).state is JobState.READY and q.stats().deferred == 0
        j = q.lease_one()
        assert j.id == c.id and j.depends_on == [a.id, "bee"]
        q.ack(j)
        assert q.lease_one() is None


def test_an_unknown_parent_writes_nothing_and_a_done_parent_counts_as_done(tmp_path):
    with Queue(tmp_path) as q:
        p = q.enqueue("p")
        with pytest.raises(JobNotFoundError, match="'nope'"):
            q.enqueue("x", depends_on=[p, "nope"])
        assert q.stats().total == 1 and q.stats().enqueued_total == 1
        _run(q, "p")
        assert q.enqueue("after", depends_on=[p.id]).state is JobState.READY
        for bad in ([], [""], 3):
            with pytest.raises((ValueError, TypeError)):
                q.enqueue("x", depends_on=bad)
        with pytest.raises(ValueError):
            q.enqueue("x", allow_failure=True)
        with pytest.raises(ValueError, match="own id"):
            q.enqueue("x", job_id="me", depends_on=["me"])


def test_a_failed_parent_cancels_its_dependents_transitively_unless_allow_failure(tmp_path):
    with Queue(tmp_path) as q:
        x = q.enqueue("x", max_attempts=1)
        y = q.enqueue("y", depends_on=[x])
        z = q.enqueue("z", depends_on=[y])
        w = q.enqueue("w", depends_on=[x], allow_failure=True)
        v = q.enqueue("v", depends_on=[y], allow_failure=True)
        j = q.lease_one()
        q.nack(j, error="boom")
        assert q.get(x.id).state is JobState.DEAD
        gy, gz = q.get(y.id), q.get(z.id)
        assert gy.state is JobState.CANCELLED and gz.state is JobState.CANCELLED
        assert gy.last_error == f"parent job {x.id!r} ended dead-lettered"
        assert gz.last_error == f"parent job {y.id!r} ended cancelled"
        assert q.get(w.id).state is JobState.READY and q.get(v.id).state is JobState.READY
        # Cancelling a parent cancels its dependents too; expiry likewise.
        p = q.enqueue("p")
        d = q.enqueue("d", depends_on=[p])
        d2 = q.enqueue("d2", depends_on=[d])
        q.cancel(p)
        assert q.get(d.id).state is JobState.CANCELLED and repr(p.id) in q.get(d.id).last_error
        assert q.get(d2.id).state is JobState.CANCELLED  # a cancelled deferred job fails its own
        p2 = q.enqueue("p2", delay=600)
        d3 = q.enqueue("d3", depends_on=[p2])
        d4 = q.enqueue("d4", depends_on=[d3])
        assert q.cancel(d3.id).state is JobState.CANCELLED  # a deferred job cancelled directly
        assert q.get(d4.id).state is JobState.CANCELLED and q.get(p2.id).state is JobState.READY
        e = q.enqueue("e", expires_in=0.01)
        f = q.enqueue("f", depends_on=[e])
        time.sleep(0.02)
        assert {j.payload for j in q.lease(10)} == {"w", "v"}
        assert q.get(e.id).state is JobState.EXPIRED
        assert q.get(f.id).state is JobState.CANCELLED and "expired" in q.get(f.id).last_error


def test_a_batch_callback_runs_once_after_its_last_parent_whatever_they_ended(tmp_path):
    with Queue(tmp_path) as q:
        batch = q.enqueue_many(list(range(130)), max_attempts=1)  # three words of fired bits
        cb = q.enqueue("callback", depends_on=batch, allow_failure=True, priority=-1)
        for i in range(130):
            j = q.lease_one()
            assert j is not None and j.payload == i
            (q.nack(j, error="odd") if i % 2 else q.ack(j, result=i * 10))
            assert q.get(cb.id).state is (JobState.READY if i == 129 else JobState.DEFERRED)
        j = q.lease_one()
        assert j.id == cb.id
        assert q.result(batch[2].id) == 20  # a parent's result is read by id
        q.ack(j)
        assert q.lease_one() is None


def test_a_dependent_is_released_when_the_finisher_dies_between_its_ack_and_the_release(tmp_path):
    # The child acks the parent and is SIGKILLed inside the firing of its dependents: the ack
    # went in, the dependent is still DEFERRED.  This (running) process's sweep releases it,
    # and a process opening the queue afterwards would too.
    with Queue(tmp_path) as q:
        p = q.enqueue("p")
        d = q.enqueue("d", depends_on=[p])
        assert q.stats().deferred == 1  # this process reads the queue: its sweeps run
        proc = run_py(
            """
            import os, signal, sys
            from ringq import Queue
            from ringq.engine.deps import Deps
            q = Queue(sys.argv[1])
            j = q.lease_one()
            Deps.changed = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
            q.ack(j)
            """,
            str(tmp_path),
        )
        assert proc.returncode == -9, proc.stderr
        assert q.get(p.id).state is JobState.DONE
        assert q.get(d.id).state is JobState.DEFERRED
        j = q.lease_one(wait=5)
        assert j is not None and j.id == d.id
        q.ack(j)
        assert q.get(d.id).state is JobState.DONE


def test_sweeps_take_the_dependents_in_turn_and_reach_every_one(tmp_path):
    # A sweep looks at SWEEP_BATCH deferred jobs; more wait for a parent that is still pending,
    # ahead of the 40 whose parents finished in a process that never fired their edges.  The
    # next sweeps go on from where the last stopped, so those 40 are released too.
    from ringq.engine.deps import SWEEP_BATCH

    n = 40
    with Queue(tmp_path, durability="none") as q:
        pending = q.enqueue("pending", delay=600)
        for _ in range(SWEEP_BATCH + 8):
            q.enqueue("waits", depends_on=[pending])
        parents = q.enqueue_many(list(range(n)), priority=1)
        for p in parents:
            q.enqueue("d", depends_on=[p])
        proc = run_py(
            """
            import sys
            from ringq import Queue
            from ringq.engine.deps import Deps
            q = Queue(sys.argv[1])
            Deps.changed = lambda *a: None  # this process never fires an edge
            for j in q.lease(len(q.list_jobs("ready"))):
                q.ack(j)
            """,
            str(tmp_path),
        )
        assert proc.returncode == 0, proc.stderr
        assert q.stats().deferred == SWEEP_BATCH + 8 + n  # this reader sweeps in batches
        got = 0
        end = time.monotonic() + 30
        while got < n and time.monotonic() < end:
            jobs = q.lease(100, wait=0.5)
            for j in jobs:
                q.ack(j)
            got += len(jobs)
        assert got == n and q.stats().deferred == SWEEP_BATCH + 8


def test_a_dependent_whose_state_word_was_lost_waits_again_and_is_released_from_its_parent(
    tmp_path,
):
    # A power loss can keep a record and lose its state page: the dependent's word reads EMPTY
    # (and its tree's bits may be anything).  Reopened, it is DEFERRED again with a zeroed tree,
    # and its edges fire from its parents' states: its parent is done, so it is ready.
    import glob
    import struct

    from ringq.engine.segment import PAGE

    with Queue(tmp_path) as q:
        p = q.enqueue("p")
        d = q.enqueue("d", depends_on=[p], delay=600)  # delayed: its released word says so
        _run(q, "p")
        assert q.get(d.id).state is JobState.READY
    [path] = glob.glob(str(tmp_path / "*.state"))
    with open(path, "r+b") as f:
        f.seek(PAGE + 16 * 1)  # slot 1: the dependent's head (the parent is slot 0)
        assert struct.unpack("<Q", f.read(8))[0] & 7 == 1  # READY
        f.seek(PAGE + 16 * 1)
        f.write(bytes(8))
    with Queue(tmp_path) as q:
        g = q.get(d.id)
        assert g.state is JobState.READY and g.available_at > time.time() + 500
        q.reschedule(d, delay=0)
        j = q.lease_one()
        assert j.id == d.id and q.lease_one() is None


# -- debounce, replace, reschedule -----------------------------------------------------------------


def test_debounce_replaces_a_waiting_job_and_queues_a_new_run_after_a_leased_one(tmp_path):
    with Queue(tmp_path) as q:
        for i in range(5):
            q.enqueue(f"v{i}", job_id="k", debounce=60)
        g = q.get("k")
        assert g.payload == "v4" and g.available_at > time.time() + 50
        st = q.stats()
        assert (st.delayed, st.total) == (1, 1)
        q.enqueue("v5", job_id="k", replace=True)  # replace: no delay
        assert q.get("k").payload == "v5"
        j = q.lease_one()
        assert j.payload == "v5"
        q.enqueue("v6", job_id="k", replace=True)  # leased: a new run after this one
        q.enqueue("v7", job_id="k", replace=True)  # replaces that new run, still waiting
        assert q.lease_one() is None
        assert q.get("k").state is JobState.LEASED
        q.ack(j)
        j2 = q.lease_one()
        assert j2.id == "k" and j2.payload == "v7"
        q.ack(j2)
        assert q.lease_one() is None
        q.enqueue("v8", job_id="k", replace=True)  # finished: a new run
        assert q.lease_one().payload == "v8"
        # Nacked while a new run waits behind it: the retry never runs, the new run does.
        q.enqueue("n1", job_id="n")
        j = q.lease_one()
        q.enqueue("n2", job_id="n", replace=True)
        q.nack(j, error="retry me", delay=0)
        j = q.lease_one()
        assert (j.id, j.payload, j.attempts) == ("n", "n2", 1)
        q.ack(j)
        assert q.lease_one() is None
        # A retry waiting after a nack is waiting too: replaced, attempts from scratch.
        q.enqueue("r1", job_id="r", max_attempts=3)
        q.nack(q.lease_one(), error="again", delay=60)
        assert q.get("r").attempts == 1
        q.enqueue("r2", job_id="r", replace=True)
        j = q.lease_one()
        assert (j.id, j.payload, j.attempts) == ("r", "r2", 1)
        # While a new run waits behind a leased one, the id names the leased run (ack by id).
        q.enqueue("r3", job_id="r", debounce=0, max_attempts=2)
        q.ack("r")
        j = q.lease_one()
        assert (j.payload, j.attempts) == ("r3", 1)
        q.nack(j, error="again", delay=0)
        q.nack(q.lease_one(), error="last")
        assert q.get("r").state is JobState.DEAD and [d.id for d in q.dlq()] == ["r"]
        q.enqueue("r4", job_id="r", replace=True)  # dead-lettered: replaced, out of the DLQ
        assert q.dlq() == [] and q.lease_one().payload == "r4"
        # A replacement may not depend on a job that depends on the job it replaces.
        q.enqueue("base", job_id="base", delay=60)
        q.enqueue("mid", job_id="mid", depends_on=["base"])
        q.enqueue("top", job_id="top", depends_on=["mid"])
        with pytest.raises(ValueError, match="wait for itself"):
            q.enqueue("base2", job_id="base", replace=True, depends_on=["top"])
        assert q.get("base").payload == "base"
        with pytest.raises(ValueError):
            q.enqueue("x", debounce=1)
        with pytest.raises(ValueError):
            q.enqueue("x", job_id="k", debounce=1, replace=True)


def test_reschedule_a_waiting_job_and_refuse_a_leased_or_finished_one(tmp_path):
    with Queue(tmp_path) as q:
        a = q.enqueue("a", delay=600)
        b = q.enqueue("b")
        r = q.reschedule(a, delay=0)
        assert r.id == a.id and r.available_at <= time.time()
        r = q.reschedule(a, priority=5)
        assert r.priority == 5
        t = q.enqueue("t", priority=99)
        q.nack(q.lease_one(), error="later", delay=600)
        t = q.reschedule(t, delay=0, priority=-5)
        assert (t.attempts, t.last_error) == (1, "later")  # its attempts are kept
        p = q.enqueue("p", delay=600)
        d = q.enqueue("d", depends_on=[p])
        assert q.reschedule(d, priority=9).state is JobState.DEFERRED
        j = q.lease_one()
        assert j.id == a.id
        with pytest.raises(JobNotWaitingError, match="leased"):
            q.reschedule(j, priority=1)
        q.ack(j)
        with pytest.raises(JobNotWaitingError):
            q.reschedule(a.id, delay=1)
        with pytest.raises(JobNotFoundError):
            q.reschedule("nope", delay=1)
        with pytest.raises(ValueError):
            q.reschedule(b)
        q.reschedule(p, delay=0)
        _run(q, "b")
        _run(q, "p")
        j = q.lease_one()
        assert j.id == d.id and j.priority == 9
        q.ack(j)
        _run(q, "t")
        assert q.stats().total == 5


# -- fan-in at scale ---------------------------------------------------------------------------------


def test_a_callback_of_10000_parents_costs_one_edge_per_completion_and_is_released_once(tmp_path):
    # Counted, not timed: the finisher's path (Deps.changed) fires exactly one edge per parent
    # that finished and never looks a parent up (Deps.parent: the scan a check makes).
    from ringq.engine.deps import Deps

    counts = {"fire": 0, "parent_in_changed": 0}
    inside = []
    fire, parent, changed = Deps.fire, Deps.parent, Deps.changed

    def counting_fire(self, *a):
        counts["fire"] += 1
        return fire(self, *a)

    def counting_parent(self, *a):
        counts["parent_in_changed"] += bool(inside)
        return parent(self, *a)

    def counting_changed(self, *a):
        inside.append(1)
        try:
            return changed(self, *a)
        finally:
            inside.pop()

    n = 10_000
    with Queue(tmp_path) as q:
        batch = q.enqueue_many([None] * n)
        cb = q.enqueue("callback", depends_on=batch, allow_failure=True, priority=-1)
        assert len(q.get(cb.id).depends_on) == n
        Deps.fire, Deps.parent, Deps.changed = counting_fire, counting_parent, counting_changed
        try:
            left = n
            while left:
                jobs = q.lease(min(1000, left - 1) or 1)
                assert jobs and cb.id not in {j.id for j in jobs}
                for j in jobs:
                    q.ack(j)
                left -= len(jobs)
                if left == 1:
                    assert q.get(cb.id).state is JobState.DEFERRED  # until the very last one
        finally:
            Deps.fire, Deps.parent, Deps.changed = fire, parent, changed
        assert counts == {"fire": n, "parent_in_changed": 0}
        assert q.get(cb.id).state is JobState.READY
        assert [j.id for j in q.lease(5)] == [cb.id]


def test_the_pipeline_of_docs_workflows_md_prints_what_the_doc_says(tmp_path):
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "workflows.md"), encoding="utf-8") as fh:
        text = fh.read()
    program = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    printed = re.findall(r"prints:\n\n```\n(.*?)```", text, re.S)[0]
    proc = run_py(program, str(tmp_path / "jobs"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == printed


# -- fair scheduling across keys ----------------------------------------------------------------------


def _keys(jobs) -> str:
    return "".join((j.payload[0] if j.payload else "-") for j in jobs)


@pytest.mark.parametrize("batch", [1, 7])
def test_keys_take_turns_at_equal_priority_fifo_within_each(tmp_path, batch):
    # Small segments: a key's jobs lie in several segments' lanes, and still lease FIFO.
    with Queue(tmp_path, slot_count=64) as q:
        for k in "abc":
            q.enqueue_many([f"{k}{i}" for i in range(40)], key=k)
        q.enqueue_many(["", ""])  # unkeyed jobs count as one key
        q.enqueue("z-urgent", key="z", priority=5)
        got = []
        while len(got) < 123:
            got += q.lease(batch)
        assert got[0].payload == "z-urgent"  # priority first
        order = [j.payload for j in got[1:]]
        assert _keys(got[1:9]) == "abc-abc-"
        for k in "abc":
            mine = [p for p in order if p[:1] == k]
            assert mine == [f"{k}{i}" for i in range(40)]  # FIFO within a key
        assert _keys(got[9:]) == "abc" * 38


def test_a_backlog_of_one_key_delays_another_key_by_one_lease_and_saves_no_credit(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue_many([f"a{i}" for i in range(5000)], key="a")
        for _ in range(50):
            q.ack(q.lease_one())  # key a alone: no turns to save for later
        q.enqueue_many([f"b{i}" for i in range(5)], key="b")
        got = [q.lease_one() for _ in range(12)]
        assert _keys(got) == "bababababaaa"  # b0..b4 alternate with a, then a alone


@pytest.mark.parametrize("how", ["lease", "consume"])
def test_a_backlog_leased_in_one_call_saves_no_credit_either(tmp_path, how):
    # 100 of key a in one lease(100) (or a stream of 100) move the round as 100 leases of one
    # job each would: a key that comes later alternates with a, it does not run 100 in a row.
    with Queue(tmp_path) as q:
        q.enqueue_many([f"a{i}" for i in range(400)], key="a")
        got = q.lease(100) if how == "lease" else list(q.consume(count=100))
        assert len(got) == 100
        q.ack_many(got)
        q.enqueue_many([f"b{i}" for i in range(5)], key="b")
        assert _keys([q.lease_one() for _ in range(12)]) == "bababababaaa"


def _fair_history(seed: int) -> list[tuple]:
    rnd = random.Random(seed)
    keys = rnd.choice(
        [[None, "a", "b"], ["a", "b", "c", "d"], ["tenant-1371838", "tenant-2000402", None]]
    )
    prios = rnd.choice([[0], [0, 1], [-1, 0, 5]])
    ops: list[tuple] = []
    for _ in range(rnd.randint(50, 200)):
        if rnd.random() < 0.7:
            ops.append(("enqueue", rnd.choice(keys), rnd.choice(prios), rnd.choice([1, 1, 1, 5])))
        else:
            ops.append(("take", rnd.randint(1, 40)))
    return ops + [("take", 10**6)]


def _fair_play(tmp_path, ops: list[tuple], how: str, seed: int) -> list[int]:
    rnd = random.Random(seed)
    out: list[int] = []
    n = 0
    with Queue(tmp_path / how, durability="none") as q:
        for op in ops:
            if op[0] == "enqueue":
                _, key, prio, m = op
                q.enqueue_many(list(range(n, n + m)), key=key, priority=prio)
                n += m
                continue
            got: list = []
            while len(got) < op[1]:
                want = min(op[1] - len(got), rnd.randint(1, 300))
                if how == "lease_one":
                    jobs = [j for j in [q.lease_one()] if j is not None]
                elif how == "lease":
                    jobs = q.lease(want)
                else:
                    jobs = list(q.consume(count=want))
                if not jobs:
                    break
                got += jobs
            out += [j.payload for j in got]
            q.ack_many(got)
    return out


_seeds = random.Random(SEED)
FAIR_SEEDS = [_seeds.randrange(2**32) for _ in range(4)]


@pytest.mark.parametrize("seed", FAIR_SEEDS)
def test_a_lease_of_several_jobs_takes_them_in_the_order_of_as_many_single_leases(tmp_path, seed):
    # docs/workflows.md: lease(n) and consume() take jobs in the order lease_one() would, on a
    # random history (its seed in the test's id) of keys, priorities and batch sizes.
    ops = _fair_history(seed)
    one = _fair_play(tmp_path, ops, "lease_one", seed)
    assert _fair_play(tmp_path, ops, "lease", seed) == one
    assert _fair_play(tmp_path, ops, "consume", seed) == one


def test_a_snapshot_of_another_queue_is_no_parent_and_is_not_rescheduled(tmp_path):
    q, other = Queue(tmp_path / "q"), Queue(tmp_path / "other")
    q.enqueue("mine", job_id="a")
    theirs = other.enqueue("theirs", job_id="a")
    with pytest.raises(JobNotFoundError, match="another queue"):
        q.reschedule(theirs, priority=3)
    with pytest.raises(JobNotFoundError, match="another queue"):
        q.enqueue("x", depends_on=[theirs])
    assert q.get("a").priority == 0 and q.stats().total == 1
    q.close()
    other.close()
