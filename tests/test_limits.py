"""Concurrency caps, rate limits and unique windows across real processes (ringq/local/limits.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
from conftest import SEED
from procs import spawn

import ringq
from ringq import DuplicateJobError, LimitError, LimitsFileError, NotLeasedError, Queue

# A consumer that measures concurrency itself: the number of handlers of the key running at once
# lives in a shared file, changed under flock, and the largest value seen is kept beside it.
CONSUMER = r"""
import fcntl, json, os, sys, time
from ringq import Queue

qdir, counter, until = sys.argv[1], sys.argv[2], float(sys.argv[3])

def bump(delta):
    with open(counter, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        now, peak = json.loads(f.read() or "[0, 0]")
        now += delta
        peak = max(peak, now)
        f.seek(0); f.truncate(); f.write(json.dumps([now, peak])); f.flush()

q = Queue(qdir)
done = 0
while time.time() < until:
    job = q.lease_one(wait=0.2)
    if job is None:
        if not q.stats().ready:
            break
        continue
    if job.key == "tenant-7":
        bump(+1)
        time.sleep(0.03)
        bump(-1)
    q.ack(job)
    done += 1
print(done)
"""


def test_cap_of_three_holds_across_eight_consumers(qdir, tmp_path):
    q = Queue(qdir)
    q.limit("tenant-7", concurrency=3)
    for i in range(60):
        q.enqueue({"n": i}, key="tenant-7")
    q.enqueue_many([{"other": i} for i in range(20)])  # unkeyed work flows past the cap
    counter = tmp_path / "counter.json"
    counter.write_text("[0, 0]")
    until = time.time() + 60
    procs = [
        spawn(CONSUMER, qdir, str(counter), str(until), stdout=-1, text=True) for _ in range(8)
    ]
    done = sum(int(p.communicate(timeout=90)[0]) for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert done == 80
    now, peak = json.loads(counter.read_text())
    assert now == 0
    assert peak == 3, f"observed at most {peak} tenant-7 handlers at once, cap 3"
    assert q.limits()[0].running == 0


HOLDER = r"""
import sys, time
from ringq import Queue
q = Queue(sys.argv[1])
job = q.lease_one(wait=10)
assert job is not None and job.key == "k"
print(job.id, flush=True)
time.sleep(600)
"""


def test_sigkilled_holder_frees_its_slot_at_once(qdir):
    q = Queue(qdir, visibility_timeout=300)
    q.limit("k", concurrency=1)
    a = q.enqueue("a", key="k")
    b = q.enqueue("b", key="k")
    holder = spawn(HOLDER, qdir, stdout=-1, text=True)
    try:
        held = holder.stdout.readline().strip()
        assert held == a.id
        assert q.lease_one() is None  # "b" is READY but its key is at its cap
        assert q.get(b.id).state is ringq.JobState.READY
        assert q.limits()[0].running == 1
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        t0 = time.monotonic()
        job = q.lease_one(wait=5)
        elapsed = time.monotonic() - t0
    finally:
        if holder.poll() is None:
            holder.kill()
    assert job is not None and job.key == "k"
    assert elapsed < 1.0, f"the slot came back after {elapsed:.2f} s (visibility timeout is 300 s)"
    assert q.limits()[0].running == 1
    q.ack(job)
    assert q.limits()[0].running == 0


RATED = r"""
import json, sys, time
from ringq import Queue
q = Queue(sys.argv[1])
q.stats(), q.limits()  # map the segments and the limits file now, not in the window
print("ready", flush=True)
start, end = map(float, sys.stdin.readline().split())
while time.time() < start:
    time.sleep(0.005)
stamps = []
while time.time() < end:
    job = q.lease_one(wait=max(0.001, end - time.time()))
    if job is not None:
        stamps.append(time.time())
        q.ack(job)
print(json.dumps(stamps))
"""


def test_rate_of_50_per_second_admits_250_in_5_seconds(qdir):
    q = Queue(qdir)
    q.limit("api", rate=(50, 1.0))
    q.enqueue_many([{"n": i} for i in range(400)], key="api")
    procs = [spawn(RATED, qdir, stdin=-1, stdout=-1, text=True) for _ in range(8)]
    for p in procs:  # every consumer is up and waiting before the window opens
        assert p.stdout.readline().strip() == "ready"
    start = time.time() + 0.2
    end = start + 5.0
    for p in procs:
        p.stdin.write(f"{start!r} {end!r}\n")
        p.stdin.flush()
    stamps = [t for p in procs for t in json.loads(p.communicate(timeout=60)[0])]
    assert all(p.returncode == 0 for p in procs)
    admitted = sum(start <= t < end for t in stamps)
    assert 245 <= admitted <= 255, admitted  # 250 +- 2%
    assert q.limits()[0].burst == 3  # the default: the tokens of 50 ms, at least 2


def test_rate_blocked_lease_sleeps_until_the_next_token(qdir):
    q = Queue(qdir)
    q.limit("slow", rate=(1, 0.5), burst=1)
    q.enqueue_many(["a", "b"], key="slow")
    assert q.lease_one().payload == "a"
    t0 = time.monotonic()
    job = q.lease_one(wait=5)
    waited = time.monotonic() - t0
    assert job is not None and job.payload == "b"
    assert 0.35 < waited < 1.0
    assert q.stats().ready == 0


def test_limit_on_the_queue_name_caps_every_job(qdir):
    q = Queue(qdir, name="emails")
    q.limit("emails", concurrency=2)
    q.enqueue_many(list(range(5)))
    q.enqueue(5, key="x")
    assert len(q.lease(10)) == 2
    assert [i.to_dict()["running"] for i in q.limits()] == [2]


def test_key_survives_reopen_and_relocation_paths(qdir):
    q = Queue(qdir)
    job = q.enqueue(b"\x00raw", key="tenant-ü")
    assert job.key == "tenant-ü"
    q.close()
    q = Queue(qdir)
    again = q.get(job.id)
    assert (again.key, again.payload) == ("tenant-ü", b"\x00raw")
    assert again.to_dict()["key"] == "tenant-ü"
    assert "key" not in q.enqueue("plain").to_dict()
    leased = q.lease_one()
    assert leased.key == "tenant-ü"
    q.nack(leased, error="boom", delay=0)
    again = {j.payload: j for j in q.lease(5)}
    assert again[b"\x00raw"].key == "tenant-ü" and again[b"\x00raw"].last_error == "boom"


def test_unique_window(qdir):
    q = Queue(qdir)
    first = q.enqueue({"v": 1}, key="report-42", unique_for=0.5)
    dup = q.enqueue({"v": 2}, key="report-42", unique_for=0.5)
    assert dup.id == first.id and dup.payload == {"v": 1}
    assert q.stats().ready == 1
    other = q.enqueue({"v": 3}, key="report-43", unique_for=0.5)
    assert other.id != first.id
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        later = q.enqueue({"v": 4}, key="report-42", unique_for=0.5)
        if later.id != first.id:
            break
        time.sleep(0.05)
    assert later.id != first.id and later.payload == {"v": 4}


UNIQUE_RACE = r"""
import sys
from ringq import Queue
q = Queue(sys.argv[1])
print(q.enqueue({"pid": sys.argv[2]}, key="once", unique_for=60).id)
"""


def test_unique_window_across_processes(qdir):
    Queue(qdir).close()
    procs = [spawn(UNIQUE_RACE, qdir, str(i), stdout=-1, text=True) for i in range(6)]
    ids = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(ids) == 1
    assert Queue(qdir).stats().ready == 1


def test_unique_window_whose_job_retired(qdir):
    q = Queue(qdir, slot_count=4)
    first = q.enqueue("x", key="u", unique_for=60)
    q.ack(q.lease_one())
    for i in range(8):  # rotate the segment out and retire it
        q.ack(q.enqueue(i) and q.lease_one())
    with pytest.raises(DuplicateJobError) as info:
        q.enqueue("y", key="u", unique_for=60)
    assert info.value.job_id == first.id


@pytest.mark.parametrize(
    "kw",
    [
        {"concurrency": 0},
        {"concurrency": 5000},
        {"concurrency": True},
        {"rate": (0, 1.0)},
        {"rate": (5, 0)},
        {"rate": (5, float("nan"))},
        {"rate": (1.5, 1.0)},
        {"rate": "fast"},
        {"rate": (1, 2, 3)},
        {"rate": (1,)},
        {"rate": (True, 1)},
        {"rate": (1, True)},
        {"rate": (1, "2")},
        {"rate": (1, float("inf"))},
        {"rate": {1: 2}},
        {"rate": (5, 1.0), "burst": True},
        {"burst": 3},
    ],
)
def test_bad_limits_are_refused(qdir, kw):
    q = Queue(qdir)
    with pytest.raises(LimitError):
        q.limit("k", **kw)
    assert q.limits() == []


def test_bad_keys_and_windows_are_refused(qdir):
    q = Queue(qdir)
    for key in ("", "a\x00b", "x" * 200, 7):
        with pytest.raises(ValueError):
            q.enqueue(1, key=key)
    with pytest.raises(LimitError):
        q.enqueue(1, unique_for=5)
    with pytest.raises(LimitError):
        q.enqueue(1, key="k", unique_for=-1)
    for too_long in (1e30, float("inf"), ringq.local.limits.MAX_UNIQUE_FOR):
        with pytest.raises(LimitError, match=f"below {ringq.local.limits.MAX_UNIQUE_FOR} "):
            q.enqueue(1, key="k", unique_for=too_long)
    q.enqueue(1, key="k", unique_for=ringq.local.limits.MAX_UNIQUE_FOR - 1)
    assert q.stats().ready == 1


def test_limit_table_full_and_removal(qdir):
    q = Queue(qdir)
    for i in range(64):
        q.limit(f"k{i}", concurrency=1)
    with pytest.raises(LimitError, match="64 limits"):
        q.limit("one-more", concurrency=1)
    q.limit("k3")  # neither cap nor rate: removed
    q.limit("one-more", rate=(10, 1.0), burst=5)
    names = {i.name: i for i in q.limits()}
    assert (
        "k3" not in names and names["one-more"].rate == (10, 1.0) and names["one-more"].burst == 5
    )


def test_damaged_limits_file_is_a_typed_error(qdir):
    q = Queue(qdir)
    q.limit("k", concurrency=2)
    q.enqueue("kept", key="k")
    q.close()
    path = os.path.join(qdir, "default.limits")
    with open(path, "r+b") as f:
        f.seek(4096 + 64)  # entry 0's name: its CRC no longer matches
        f.write(b"#")
    q = Queue(qdir)
    with pytest.raises(LimitsFileError, match="entry 0.*remove the file"):
        q.limits()
    with open(path, "r+b") as f:
        f.truncate(100)
    q2 = Queue(qdir)
    with pytest.raises(LimitsFileError, match="100 bytes") as info:
        q2.limit("k", concurrency=1)
    assert "Jobs are not affected" in str(info.value) and "remove the file" in str(info.value)
    q2.close()
    q.close()
    os.unlink(path)  # as the message says: the limits go, every job stays
    q3 = Queue(qdir)
    assert q3.limits() == [] and q3.lease_one().payload == "kept"
    q3.limit("k", concurrency=1)
    assert [(lim.name, lim.concurrency) for lim in q3.limits()] == [("k", 1)]


def test_writer_killed_mid_change_is_repaired_by_the_next_reader(qdir):
    q = Queue(qdir)
    q.limit("a", concurrency=1)
    q.close()
    path = os.path.join(qdir, "default.limits")
    with open(path, "r+b") as f:  # what a writer killed between its two generation stores leaves
        f.seek(64)
        f.write((7).to_bytes(8, "little"))
        f.seek(4096 + 64)
        f.write(b"zz")  # and a torn entry
    q = Queue(qdir)
    assert q.limits() == []
    q.limit("a", concurrency=1)
    assert [i.name for i in q.limits()] == ["a"]


def test_nack_and_an_ended_lease_free_the_slot(qdir):
    q = Queue(qdir)
    q.limit("k", concurrency=1)
    q.enqueue_many(["a", "b"], key="k")
    first = q.lease_one(visibility_timeout=0.2)
    assert q.lease_one() is None
    q.nack(first, delay=60)
    second = q.lease_one(visibility_timeout=0.3)
    assert second is not None and second.payload == "b"
    assert q.lease_one() is None  # at the cap
    time.sleep(0.4)
    # the lease expired without ack or nack: this process's next lease frees its slot (and the
    # expired job is leased again)
    again = q.lease_one(wait=5)
    assert again is not None and again.id == second.id and again.attempts == 2


def test_an_ack_wakes_a_lease_waiting_for_the_slot(qdir):
    import threading

    q = Queue(qdir)
    q.limit("k", concurrency=1)
    q.enqueue_many(["a", "b"], key="k")
    held = q.lease_one()
    other = Queue(
        qdir
    )  # another open file description: another holder, as another process would be
    got = []

    def wait_for_slot():
        t0 = time.monotonic()
        got.append((other.lease_one(wait=10), time.monotonic() - t0))

    t = threading.Thread(target=wait_for_slot)
    t.start()
    time.sleep(0.3)
    assert not got  # at the cap: waiting
    q.ack(held)
    acked = time.monotonic()
    t.join(10)
    job, _waited = got[0]
    assert job is not None and job.payload == "b"
    assert time.monotonic() - acked < 0.2


def test_docs_example_runs_verbatim(tmp_path):
    import re
    import subprocess
    import sys

    from procs import ROOT, child_env

    text = open(os.path.join(ROOT, "docs", "limits.md")).read()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "LimitInfo(name='tenant-7', concurrency=3" in res.stdout
    q = Queue(str(tmp_path / "jobs"))
    assert [i.name for i in q.limits()] == ["api", "jobs-queue-name"]
    assert q.stats().ready == 2


@pytest.mark.parametrize("word", [2**63, 2**64 - 1, None])
def test_a_bucket_word_beyond_its_possible_maximum_is_repaired_on_read(qdir, word):
    q = Queue(qdir)
    q.limit("r", rate=(2, 1.0), burst=2)
    q.close()
    path = os.path.join(qdir, "default.limits")
    if word is None:  # one hour ahead of now: no run of takes gets past now + burst * per / n
        word = time.time_ns() + 3600 * 10**9
    with open(path, "r+b") as f:  # limit entry 0's bucket word (docs/limits.md has the layout)
        f.seek(4096 + 32)
        f.write(word.to_bytes(8, "little"))
    q = Queue(qdir)
    (info,) = q.limits()
    assert 0 <= info.next_token_in <= 1.0 + 0.01  # at most one token's time away, an empty bucket
    q.enqueue_many([1, 2], key="r")
    deadline = time.monotonic() + 30
    got = []
    while len(got) < 2 and time.monotonic() < deadline:
        got += q.lease(2, wait=1)
    assert sorted(j.payload for j in got) == [1, 2]


def test_a_limit_without_a_rate_has_no_burst(qdir):
    q = Queue(qdir)
    q.limit("c", concurrency=2)
    q.limit("r", rate=(10, 1.0))
    info = {i.name: i for i in q.limits()}
    assert info["c"].burst is None and info["c"].to_dict()["burst"] is None
    assert info["r"].burst == 2


@pytest.mark.parametrize("op", ["ack", "nack"])
def test_a_stale_holders_refused_ack_or_nack_keeps_the_current_leases_cap_slot(qdir, op):
    # The job's first lease expires and this process leases it again (token 2), holding the cap's
    # only slot; the first snapshot's ack or nack is refused -- and must not free that slot.
    q = Queue(qdir, visibility_timeout=0.2)
    q.limit("k", concurrency=1)
    q.enqueue(1, key="k", priority=5)
    q.enqueue(2, key="k")
    old = q.lease_one()
    time.sleep(0.3)
    cur = q.lease_one(visibility_timeout=30)
    assert cur.id == old.id and cur.lease_token == "2"
    assert q.lease(5) == []
    with pytest.raises(NotLeasedError):
        q.ack(old) if op == "ack" else q.nack(old, delay=0)
    assert q.lease(5) == []  # the cap of 1 still holds
    assert [i.running for i in q.limits()] == [1]
    q.ack(cur)  # the current lease's end frees it
    assert [j.payload for j in q.lease(5)] == [2]


def test_numpy_integers_are_taken_for_caps_bursts_geometry_and_schedules(tmp_path):
    import numpy as np

    with Queue(tmp_path / "q", slot_size=np.int64(256), slot_count=np.int32(1024)) as q:
        q.limit(
            "k", concurrency=np.int64(2), rate=(np.int64(10), np.float64(1.0)), burst=np.int8(3)
        )
        [info] = q.limits()
        assert (info.concurrency, info.rate, info.burst) == (2, (10, 1.0), 3)
        q.schedule("tick", {"t": 1}, every=np.int64(60))
        assert [s.name for s in q.schedules()] == ["tick"]
        first = q.enqueue("u", key="u", unique_for=np.int64(60))
        assert q.enqueue("u again", key="u", unique_for=np.float32(60)).id == first.id


def _admits_during(call):
    """How many times a limits gate decided on a job during ``call()`` (LimitGate.admit)."""
    from ringq.local.limits import LimitGate

    count = 0

    def profile(frame, event, _arg):
        nonlocal count
        if event == "call" and frame.f_code is LimitGate.admit.__code__:
            count += 1

    import sys

    sys.setprofile(profile)
    try:
        return call(), count
    finally:
        sys.setprofile(None)


def test_jobs_a_cap_holds_back_wait_as_one_lane_not_one_by_one(qdir):
    # 2,000 jobs of a key at its cap: a lease (also the first of a new queue object) decides on
    # a bounded few of them, not on each: a lane of one key waits whole.
    q = Queue(qdir)
    q.limit("k", concurrency=1)
    q.enqueue_many(list(range(2000)), key="k")
    q.enqueue_many(["free-1", "free-2", "free-3"])
    assert q.lease_one().payload == 0  # takes the key's one slot
    for q2 in (q, Queue(qdir)):
        job, admits = _admits_during(q2.lease_one)
        assert job.payload.startswith("free-") and admits <= 2 * 8 + 2, admits
    # The held-back jobs are all still there, in order, once the slot frees.
    first = q.lease_one()
    assert first.payload.startswith("free-")


def test_keys_whose_lane_ids_collide_never_hold_each_other_back(qdir):
    # Lanes are keyed by a 31-bit hash of the key: these two keys share one.  One at its cap must
    # not hold back the other's jobs queued behind it in the shared lane.
    from ringq.engine.views import key_id

    a, b = "tenant-1371838", "tenant-2000402"
    assert key_id(a) == key_id(b)
    q = Queue(qdir)
    q.limit(a, concurrency=1)
    q.enqueue_many(["a1", "a2", "a3"], key=a)
    q.enqueue_many(["b1", "b2"], key=b)
    got = [q.lease_one().payload for _ in range(3)]
    assert got == ["a1", "b1", "b2"]
    assert q.lease_one() is None  # a2 and a3 wait for a's slot


@pytest.mark.parametrize(
    "kw", [{}, {"timeout": 5}, {"expires_in": 3600}], ids=["plain", "metadata", "expiry"]
)
def test_a_fresh_reader_puts_each_keyed_record_in_its_key_lane_whatever_its_kind(qdir, kw):
    # A record with an expiry or a metadata block holds its key behind them: read in bulk by a
    # fresh queue object, its job must still wait in its key's lane, not hold back others.
    q = Queue(qdir)
    q.limit("K", concurrency=1)
    for i in range(20):
        q.enqueue(f"K{i}", key="K", **kw)
    q.enqueue_many(["free-1", "free-2", "free-3"])
    q.close()
    fresh = Queue(qdir)
    assert [fresh.lease_one().payload for _ in range(4)] == ["K0", "free-1", "free-2", "free-3"]
    assert fresh.lease_one() is None


def test_a_numpy_timedelta_is_no_count_or_number_of_seconds_for_a_limit(qdir):
    import numpy as np

    from ringq.errors import LimitError

    td = np.timedelta64(2, "s")
    q = Queue(qdir)
    for kw in (
        dict(concurrency=td),
        dict(rate=(td, 1.0)),
        dict(rate=(2, td)),
        dict(rate=(2, 1.0), burst=td),
    ):
        with pytest.raises(LimitError):
            q.limit("k", **kw)
    with pytest.raises(LimitError, match="unique_for"):
        q.enqueue(1, key="k", unique_for=td)
    with pytest.raises(ValueError, match="every"):
        q.schedule("tick", 1, every=td)
    with pytest.raises(ValueError, match="flush_interval"):
        Queue(qdir, state_flush_interval=td)


def test_jobs_a_cap_held_back_across_many_leases_come_out_fifo_within_their_key(qdir):
    # 20 leases of another key while "a" sits at its cap of 1: more of a's jobs wait in the
    # limit than are offered again per lease, and its key's turn moves on meanwhile.  Each slot
    # freed goes to a's oldest waiting job.
    q = Queue(qdir)
    q.limit("a", concurrency=1)
    for i in range(1, 31):
        q.enqueue(f"a{i}", key="a")
        q.enqueue(f"b{i}", key="b")
    held = q.lease_one()
    assert held.payload == "a1"
    assert [q.lease_one().payload for _ in range(20)] == [f"b{i}" for i in range(1, 21)]
    a_order = []
    while len(a_order) < 29:
        q.ack(held)
        while (job := q.lease_one()).key != "a":
            q.ack(job)
        a_order.append(job.payload)
        held = job
    assert a_order == [f"a{i}" for i in range(2, 31)]


_FIFO_RNG = random.Random(SEED)
FIFO_SEEDS = [_FIFO_RNG.randrange(2**32) for _ in range(24)]


@pytest.mark.parametrize("seed", FIFO_SEEDS)
def test_first_leases_are_fifo_within_each_key_and_priority_under_any_caps(tmp_path, seed):
    # A random history (its seed in the test's id) of enqueues (one and several), leases (one,
    # several, a stream), acks and nacks under caps on some keys and on the whole queue, small
    # caps and caps above the number of held-back jobs offered again per lease, keys of their
    # own or sharing a lane id: every job's first lease comes after the first lease of each job
    # enqueued before it with the same key and priority.
    rnd = random.Random(seed)
    q = Queue(tmp_path / "q", durability="none")
    keys = rnd.choice(
        [["k0", "k1", "k2", "k3", None], ["tenant-1371838", "tenant-2000402", "k2", None]]
    )
    most = rnd.choice([3, 12])
    for key in keys[:3]:
        if rnd.random() < 0.8:
            q.limit(key, concurrency=rnd.randint(1, most))
    if rnd.random() < 0.3:
        q.limit("q", concurrency=rnd.randint(1, most))  # named like the queue: every job
    prios = rnd.choice([[0], [0, 1]])
    rank: dict[str, tuple[str | None, int, int]] = {}
    enqueued: dict[tuple[str | None, int], int] = {}
    last: dict[tuple[str | None, int], int] = {}
    held: list[ringq.Job] = []
    for _ in range(400):
        op = rnd.random()
        if op < 0.45:
            key, prio = rnd.choice(keys), rnd.choice(prios)
            ns = []
            for _ in range(rnd.choice([1, 1, 3])):
                ns.append(enqueued.get((key, prio), 0) + 1)
                enqueued[key, prio] = ns[-1]
            jobs = q.enqueue_many(ns, key=key, priority=prio)
            rank.update((job.id, (key, prio, n)) for job, n in zip(jobs, ns))
        elif op < 0.8:
            how = rnd.random()
            if how < 0.4:
                got = [q.lease_one()]
            elif how < 0.8:
                got = q.lease(rnd.randint(1, most))
            else:
                got = list(q.consume(count=rnd.randint(1, most)))
            for job in got:
                if job is None:
                    continue
                held.append(job)
                key, prio, n = rank.pop(job.id, (None, 0, 0))
                if n:  # its first lease
                    assert n == last.get((key, prio), 0) + 1, (key, prio, n)
                    last[key, prio] = n
        elif held:
            for _ in range(rnd.randint(1, len(held))):
                job = held.pop(rnd.randrange(len(held)))
                (q.ack if rnd.random() < 0.8 else q.nack)(job)
    q.close()


@pytest.mark.parametrize("how", ["lease", "lease_one"])
def test_a_freed_cap_goes_to_the_oldest_jobs_of_its_key_after_many_leases_held_them_back(qdir, how):
    # A cap of 10, full, while 12 leases found nothing: more leases than the limit offers
    # held-back jobs again in one.  Once the slots free, jobs 10..19 come next, in order.
    q = Queue(qdir, durability="none")
    q.limit("a", concurrency=10)
    q.enqueue_many(list(range(60)), key="a")
    held = q.lease(10)
    for _ in range(12):
        assert q.lease_one() is None
    q.ack_many(held)
    got = q.lease(10) if how == "lease" else [q.lease_one() for _ in range(10)]
    assert [job.payload for job in got] == list(range(10, 20))


def test_a_queue_wide_cap_keeps_each_keys_jobs_in_order(qdir):
    # A cap on the whole queue holds back the first job of "a" behind many of "b"; a second job
    # of "a" enqueued meanwhile must not go before it once the slot frees.
    q = Queue(qdir, durability="none")
    q.limit(q.name, concurrency=1)
    q.enqueue_many([f"b{i}" for i in range(1, 11)], key="b")
    q.enqueue("a1", key="a")
    held = q.lease_one()
    for _ in range(12):
        assert q.lease_one() is None
    q.enqueue("a2", key="a")
    q.ack(held)
    order = []
    while (job := q.lease_one()) is not None:
        order.append(job.payload)
        q.ack(job)
    assert [p for p in order if p.startswith("a")] == ["a1", "a2"]
    assert [p for p in order if p.startswith("b")] == [f"b{i}" for i in range(2, 11)]


@pytest.mark.parametrize("prio", [-(2**31), -1, 0, 1, 2**31 - 1])
@pytest.mark.parametrize("kid", [0, 1, 0x2468ACE, 2**31 - 1])
def test_a_lane_key_gives_back_its_priority_and_key_id(prio, kid):
    import numpy as np

    from ringq.engine.views import lane_key, lane_keys, lane_kid, lane_prio

    lk = lane_key(prio, kid)
    assert (lane_prio(lk), lane_kid(lk)) == (prio, kid)
    assert lane_keys(np.array([prio], np.int64), np.array([kid], np.int64)).tolist() == [lk]


# Leases after a cap that held a job back is removed, run in a child process (a lease that never
# returns fails the test on its timeout instead of stalling the run).  {scope} is the key of the
# cap ("k") or the queue's name (a cap on the whole queue); {take} leases the next job.
AFTER_UNLIMIT = r"""
import sys
from ringq import Queue

q = Queue(sys.argv[1], durability="none")
scope = q.name if sys.argv[2] == "queue" else "k"
q.limit(scope, concurrency=1)
q.enqueue_many([1, 2, 3], key="k")
first = q.lease_one()
assert q.lease_one() is None  # held back by the cap
q.limit(scope)  # the cap removed while job 2 waits in the gate
got = []
while True:
    jobs = q.lease(int(sys.argv[3]))
    if not jobs:
        break
    got += [j.payload for j in jobs]
print(first.payload, got)
"""


@pytest.mark.parametrize("scope", ["key", "queue"])
@pytest.mark.parametrize("n", [1, 2, 100])
def test_a_job_held_back_by_a_removed_cap_is_leased_in_order(qdir, scope, n):
    # The job the cap held back is offered again beside its lane, whose head it is: the lease
    # must take it once, in order, and return (it had spun on the job as its own bound).
    from procs import run_py

    res = run_py(AFTER_UNLIMIT, str(qdir), scope, str(n), timeout=30)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[0] == "1 [2, 3]"


@pytest.mark.parametrize("change", ["removed", "raised"])
def test_a_job_a_rate_held_back_is_leased_at_once_after_the_rate_is_removed_or_raised(qdir, change):
    # A rate of one job an hour holds back a retried job; once the rate is removed (or raised
    # well past what was taken), the token time noted under the old rate no longer holds it back.
    q = Queue(qdir, durability="none", backoff=ringq.BackoffPolicy(base=0, jitter=0))
    a = q.enqueue("a", key="k")
    q.enqueue("b", key="k")
    q.limit("k", rate=(1, 3600.0), burst=1)
    q.nack(q.lease_one(), delay=0)
    assert q.lease_one() is None  # held back: the next token in an hour
    if change == "removed":
        q.limit("k")
    else:
        q.limit("k", rate=(1000, 1.0))
    assert sorted(j.payload for j in q.lease(10)) == ["a", "b"]
    assert q.get(a.id).state.name == "LEASED"
    q.close()


def test_every_job_a_removed_cap_held_back_comes_back_in_one_lease(qdir):
    # A queue-wide cap holds back the heads of 15 lanes (small segments) and a delayed job that
    # came due meanwhile, which waits in the gate alone; removing the cap lets one lease take all.
    q = Queue(qdir, slot_size=128, slot_count=4, durability="none")
    q.limit(q.name, concurrency=1)
    q.enqueue("first")
    first = q.lease_one()
    late = q.enqueue("late", delay=0.2)
    q.enqueue_many(list(range(60)))
    time.sleep(0.3)
    assert q.lease(1000) == []
    q.ack(first)
    q.limit(q.name)
    got = q.lease(1000)
    assert len(got) == 61 and late.id in {j.id for j in got}
    q.close()
