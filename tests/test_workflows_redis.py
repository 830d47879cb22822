"""Workflows on the Redis backend only: data an older ringq wrote, and a random DAG run by real
consumer processes while one of them is SIGKILLed again and again (docs/workflows.md).

The DAG has 500 jobs (``RINGQ_DAG_N=N`` changes it); ``RINGQ_SEED=N`` replays one.
"""

import json
import os
import random
import signal
import time
import uuid

import pytest
from conftest import SEED
from procs import spawn

import ringq
from ringq import JobState, codec

pytestmark = pytest.mark.usefixtures("redis_server")


def test_ready_members_an_older_ringq_wrote_keep_their_place_at_their_priority(redis_url):
    """An older ringq wrote ``ready`` members without a turn; they stay leasable, in priority
    order with the new ones, and first among equals (they were enqueued before).  Every member
    has the job id at byte 42, where an older ringq's scripts read it."""
    import redis

    name = f"old{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_url)
    k = f"{{ringq:{name}}}:"
    now = int(time.time() * 1000) - 1000
    for seq, (jid, prio) in enumerate([("old0", 0), ("old-low", -1)], start=1):
        member = f"{2147483647 - prio:010d}{now:015d}{seq:016d}{jid}"
        meta = {"id": jid, "p": prio, "s": seq, "st": "ready", "a": 0, "m": 3, "av": now}
        meta.update(enq=now, t=0, rk=member)
        kind, data = codec.encode(jid)
        r.hset(k + "meta", jid, json.dumps(meta))
        r.hset(k + "payload", jid, bytes([kind]) + data)
        r.zadd(k + "all", {jid: seq})
        r.zadd(k + "ready", {member: 0})
        r.incr(k + "seq")
    q = ringq.connect(redis_url, name)
    q.enqueue("new-low", priority=-1)
    q.enqueue("new0")
    high = q.enqueue("high", priority=5)
    assert q.stats().ready == 5
    ids = {m[41:].decode() for m in r.zrange(k + "ready", 0, -1)}
    assert ids == {"old0", "old-low", high.id, *(j.id for j in q.list_jobs("ready"))}
    assert len(ids) == 5
    order = []
    while job := q.lease_one():
        order.append(job.payload)
        q.ack(job)
    assert order == ["high", "old0", "new0", "old-low", "new-low"]
    q.close()
    r.close()


CONSUMER = """
import json, os, sys, time
import redis
import ringq
from ringq import JobState

url, name, log = sys.argv[1:4]
q = ringq.connect(url, name, visibility_timeout=1.0)
r = redis.Redis.from_url(url)
FINISHED = {JobState.DONE, JobState.DEAD, JobState.CANCELLED, JobState.EXPIRED}
while True:
    job = q.lease_one(wait=0.5)
    if job is None:
        continue
    states = [q.get(p).state for p in job.depends_on or ()]
    ok = FINISHED if job.payload["af"] else {JobState.DONE}
    early = [p for p, s in zip(job.depends_on or (), states) if s not in ok]
    r.rpush(log, json.dumps(["lease", job.id, int(job.lease_token), os.getpid(), early]))
    time.sleep(0.01)
    try:
        if job.payload["fail"]:
            q.nack(job, error="planned failure")
        else:
            q.ack(job)
    except ringq.NotLeasedError:  # the lease ran out meanwhile: another process has the job
        continue
    r.rpush(log, json.dumps(["end", job.id, int(job.lease_token), os.getpid(), []]))
"""


def random_dag(rng, n):
    """``[(id, parents, fail, allow_failure)]`` in an order where parents come first."""
    jobs = []
    for i in range(n):
        parents = rng.sample(range(max(0, i - 20), i), min(i, rng.choice([0, 1, 1, 2, 3])))
        fail = rng.random() < 0.04
        af = bool(parents) and rng.random() < 0.2
        jobs.append((f"j{i:03d}", [f"j{p:03d}" for p in parents], fail, af))
    return jobs


def expected_states(dag):
    out = {}
    for jid, parents, fail, af in dag:
        failed = [p for p in parents if out[p] is not JobState.DONE]
        if failed and not af:
            out[jid] = JobState.CANCELLED
        else:
            out[jid] = JobState.DEAD if fail else JobState.DONE
    return out


def test_a_random_dag_runs_in_order_while_a_consumer_is_sigkilled(redis_url):
    import redis

    rng = random.Random(SEED)
    dag = random_dag(rng, int(os.environ.get("RINGQ_DAG_N") or 500))
    print(f"random DAG of {len(dag)} jobs, seed {SEED}")
    name = f"dag{uuid.uuid4().hex[:8]}"
    log = f"{name}:log"
    r = redis.Redis.from_url(redis_url)
    q = ringq.connect(redis_url, name)
    # The victim runs alone until it was killed twice; then the other two join.
    procs = [spawn(CONSUMER, redis_url, name, log)]
    kills = 0
    try:
        seen = 0
        for i, (jid, parents, fail, af) in enumerate(dag):
            q.enqueue(
                {"fail": fail, "af": af},
                job_id=jid,
                depends_on=parents or None,
                allow_failure=af,
                max_attempts=1 if fail else 100,
            )
            if i % 10 == 0:
                time.sleep(0.02)
        deadline = time.monotonic() + 60 + len(dag) / 10
        while time.monotonic() < deadline:
            st = q.stats()
            if st.done + st.dead + st.cancelled == len(dag):
                break
            events = [json.loads(e) for e in r.lrange(log, seen, -1)]
            seen += len(events)
            if kills < 6 and any(e[0] == "lease" and e[3] == procs[0].pid for e in events):
                procs[0].send_signal(signal.SIGKILL)  # mid-job: its lease runs out in 1 s
                procs[0].wait(10)
                kills += 1
                procs[0] = spawn(CONSUMER, redis_url, name, log)
            if kills >= 2 and len(procs) == 1:
                procs += [spawn(CONSUMER, redis_url, name, log) for _ in range(2)]
            time.sleep(0.005)
        else:
            pytest.fail(f"the DAG did not finish: {q.stats()}")
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    print(f"{kills} SIGKILLs of a consumer holding a job")
    assert kills >= 2 and len(procs) == 3
    events = [json.loads(e) for e in r.lrange(log, 0, -1)]
    early = [e for e in events if e[0] == "lease" and e[4]]
    assert early == [], "jobs leased before their parents finished"
    ended = {}
    for kind, jid, tok, _pid, _ in events:
        if kind == "end":
            assert jid not in ended, f"{jid} ended twice: released more than once"
            ended[jid] = tok
    for kind, jid, tok, _pid, _ in events:
        if kind == "lease" and jid in ended:
            assert tok <= ended[jid], f"{jid} was leased again after it finished"
    want = expected_states(dag)
    got = {j.id: j.state for j in q.list_jobs()}
    assert got == want
    st = q.stats()
    assert (st.deferred, st.ready, st.leased) == (0, 0, 0)
    for jid, parents, _fail, _af in dag:
        for p in parents:
            assert jid in q.dependents(p)
    q.purge()
    q.close()
    r.close()


def test_a_snapshot_of_another_redis_queue_is_taken_for_this_queues_job_with_its_id(redis_url):
    """As docs/workflows.md says: a Job read from Redis carries no queue identity."""
    q = ringq.connect(redis_url, "snap-" + uuid.uuid4().hex[:8])
    other = ringq.connect(redis_url, "snap-" + uuid.uuid4().hex[:8])
    q.enqueue("mine", job_id="a")
    theirs = other.enqueue("theirs", job_id="a")
    assert q.reschedule(theirs, priority=3).payload == "mine"
    assert q.get("a").priority == 3 and other.get("a").priority == 0
    q.close()
    other.close()
