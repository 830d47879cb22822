"""Whole histories of real processes and threads, checked against the queue's semantics.

Each case runs one seeded workload of tests/history.py -- 1-4 processes of 1-8 threads,
producers and consumers in the same process and in others, lease_one and lease(n) with and
without waits, ack, nack, extend, abandoned leases, cancel, stats, list_jobs, purge, Worker
threads (with and without hard timeouts), short visibility timeouts and SIGKILLs -- and judges the whole history: no lease held
by two holders at once, no stale ack accepted, no job lost or invented, and the counts of
stats(), list_jobs() and purge() agreeing with it.  The seeds come from the run's seed (the
``ringq seed`` in pytest's header); a failing case names its own seed, which
``python tests/history.py --seed N -v`` replays (the same workload; its timing differs).
The long run is ``python tests/history.py --runs 500``.
"""

from __future__ import annotations

import random

import history
import pytest
from conftest import SEED

RUNS = 8  # about 32 s on 2 cores (and 2 more below)
_rng = random.Random(SEED)
SEEDS = [_rng.randrange(2**32) for _ in range(RUNS)]  # eight workloads, not one eight times


def _with_timeouts(rng: random.Random, n: int) -> list[int]:
    """The next ``n`` seeds whose workload has a Worker with a hard timeout (one in eight)."""
    out: list[int] = []
    while len(out) < n:
        seed = rng.randrange(2**32)
        if any(p.get("timeout") for p in history.plan(seed)["procs"]):
            out.append(seed)
    return out


# and two whose Worker gives handlers up at their hard timeout and hands their threads' batches back
SEEDS += _with_timeouts(_rng, 2)


@pytest.mark.parametrize("seed", SEEDS)
def test_history(seed):
    run = history.run(seed)
    assert run.stats["enqueued"] > 0 and run.stats["grants"] > 0, (run.stats, run.violations[:5])
    assert not run.violations, (
        f"seed {seed} (replay: python tests/history.py --seed {seed} -v), plan {run.cfg}:\n"
        + "\n".join(run.violations[:20])
    )


def test_every_plan_has_a_producer_and_a_consumer():
    # A plan whose only consumer thread was turned into its producer leased nothing (seed
    # 110923689 had one process of a producer and an admin thread).
    for seed in [110923689, *range(2000)]:
        cfg = history.plan(seed)
        roles = {ro for p in cfg["procs"] for ro in p["roles"]}
        assert "producer" in roles, seed
        assert any(p["worker"] for p in cfg["procs"]) or {"consumer", "both", "waiter"} & roles, seed


def _crafted(events: list[dict], state: dict) -> history.Run:
    run = history.Run(seed=0, cfg={"max_attempts": 5})
    run.events = events
    run.final = {"states": {"j1": state}, "drained": []}
    history.check(run)
    return run


def _enqueued(g: list) -> list[dict]:
    """The history of job ``g``'s enqueue by process a (tag j1), before anything else."""
    return [
        {"op": "invoke", "what": "enqueue", "tags": ["j1"], "p": "a", "t": "t0", "s": 1.0},
        {"op": "enqueue", "tags": ["j1"], "ids": [g[1]], "ok": True, "p": "a", "t": "t0", "s": 1.0, "e": 1.1},
    ]


def test_a_handler_that_returned_in_a_process_killed_before_its_ack_is_no_accepted_ack():
    """A Worker acks after its handler returns; a SIGKILL between the two leaves the job leased
    by a dead holder, and another process leases and acks it.  One accepted ack, not two."""
    w1 = ["j1", "0000000000000001", 1, "1", 1, 100.0]
    w2 = ["j1", "0000000000000001", 1, "2", 2, 100.0]
    events = [
        *_enqueued(w1),
        {"op": "handle", "phase": "start", "g": w1, "p": "w", "t": "worker", "s": 2.0, "e": 2.0},
        {"op": "handle", "phase": "end", "g": w1, "p": "w", "t": "worker", "s": 2.1, "e": 2.1},
        {"op": "kill", "p": "w", "t": "main", "s": 2.2, "e": 2.2},
        {"op": "lease", "jobs": [w2], "p": "b", "t": "t1", "s": 3.0, "e": 3.0},
        {"op": "ack", "g": w2, "ok": True, "p": "b", "t": "t1", "s": 3.1, "e": 3.2},
    ]
    run = _crafted(events, {"state": "done", "attempts": 2})
    assert run.violations == []
    # the same history with the worker alive: its handler's return is its ack, and two are one
    # too many
    alive = [e for e in events if e["op"] != "kill"]
    assert any("acks accepted" in v for v in _crafted(alive, {"state": "done", "attempts": 2}).violations)


def test_one_lease_handled_twice_in_one_process_is_a_violation():
    """Two handler runs of one Worker process with the same (seq, fencing token): one lease handed
    to two threads, whatever happened between."""
    w1 = ["j1", "0000000000000001", 1, "1", 1, 100.0]
    events = [
        *_enqueued(w1),
        {"op": "handle", "phase": "start", "g": w1, "p": "w", "t": "worker-0", "s": 2.0, "e": 2.0},
        {"op": "handle", "phase": "end", "g": w1, "p": "w", "t": "worker-0", "s": 2.1, "e": 2.1},
        {"op": "handle", "phase": "start", "g": w1, "p": "w", "t": "worker-1", "s": 2.2, "e": 2.2},
        {"op": "handle", "phase": "end", "g": w1, "p": "w", "t": "worker-1", "s": 2.3, "e": 2.3},
    ]
    run = _crafted(events, {"state": "done", "attempts": 1})
    assert any("handed out twice" in v for v in run.violations), run.violations


def test_a_release_cut_short_by_a_kill_may_have_taken_effect():
    """A nack that began before its process was killed and never logged its end may have gone in:
    another holder's grant of the job after it began, before the kill, is no second live lease.
    Without the nack's start in the history, the same grant is one."""
    w1 = ["j1", "0000000000000001", 1, "1", 1, 100.0]
    w2 = ["j1", "0000000000000001", 1, "2", 2, 100.0]
    events = [
        *_enqueued(w1),
        {"op": "lease", "jobs": [w1], "p": "w", "t": "t1", "s": 2.0, "e": 2.0},
        {"op": "invoke", "what": "release", "g": w1, "p": "w", "t": "t1", "s": 2.1},
        {"op": "lease", "jobs": [w2], "p": "b", "t": "t2", "s": 2.15, "e": 2.2},
        {"op": "kill", "p": "w", "t": "main", "s": 2.3, "e": 2.3},
        {"op": "ack", "g": w2, "ok": True, "p": "b", "t": "t2", "s": 2.4, "e": 2.5},
    ]
    assert _crafted(events, {"state": "done", "attempts": 2}).violations == []
    without = [x for x in events if x.get("what") != "release"]
    assert any("two live leases" in v for v in _crafted(without, {"state": "done", "attempts": 2}).violations)
