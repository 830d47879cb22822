"""The Redis backend against real redis-server processes: many processes, SIGKILLed workers and
servers, replicas, a three-master cluster, and connections dropped mid-operation."""

import os
import signal
import subprocess
import threading
import time
import uuid

import pytest
from procs import spawn
from redisserver import free_port, require_redis, start_cluster

import ringq
from ringq import ConnectionLostError, JobState, ReplicationTimeoutError, Worker


def wait_for(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def fresh_name():
    return f"t{uuid.uuid4().hex[:12]}"


PRODUCER = """
import sys, ringq
url, name, who, n, ledger = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
q = ringq.connect(url, name)
with open(ledger, "a") as out:
    for start in range(0, n, 25):
        ids = [f"{who}-{i}" for i in range(start, min(n, start + 25))]
        q.enqueue_many(ids, job_ids=ids)
        out.write("".join(i + "\\n" for i in ids))
        out.flush()
"""

CONSUMER = """
import sys, ringq
url, name, ledger = sys.argv[1], sys.argv[2], sys.argv[3]
q = ringq.connect(url, name, visibility_timeout=60)
with open(ledger, "a") as out:
    def handle(job):
        out.write(job.payload + "\\n")
        out.flush()
    ringq.Worker(q, handle, concurrency=2, idle_timeout=1.0, handle_signals=False).run()
"""


def test_many_producer_and_consumer_processes_lose_and_duplicate_nothing(redis_url, tmp_path):
    name = fresh_name()
    produced, consumed = tmp_path / "produced", tmp_path / "consumed"
    producers = [spawn(PRODUCER, redis_url, name, f"p{k}", "300", str(produced)) for k in range(3)]
    consumers = [spawn(CONSUMER, redis_url, name, str(consumed)) for _ in range(3)]
    for p in producers + consumers:
        assert p.wait(120) == 0
    made = produced.read_text().split()
    done = consumed.read_text().split()
    assert len(made) == 900 and sorted(done) == sorted(made)
    st = ringq.connect(redis_url, name).stats()
    assert (st.done, st.total) == (900, 900)


SLOW_WORKER = """
import sys, time, ringq
url, name, mark = sys.argv[1], sys.argv[2], sys.argv[3]
q = ringq.connect(url, name, visibility_timeout=1.0)
def handle(job):
    open(mark, "w").close()
    time.sleep(3600)
ringq.Worker(q, handle, handle_signals=False).run()
"""


def test_a_sigkilled_workers_job_is_redelivered_after_the_visibility_timeout(redis_url, tmp_path):
    name = fresh_name()
    q = ringq.connect(redis_url, name, visibility_timeout=1.0)
    job = q.enqueue("work")
    mark = tmp_path / "started"
    proc = spawn(SLOW_WORKER, redis_url, name, str(mark))
    try:
        wait_for(mark.exists, "the worker to start the handler")
        time.sleep(1.5)  # longer than the timeout: only the heartbeats keep the lease alive
        assert q.lease_one() is None and q.get(job.id).state is JobState.LEASED
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.time()
        again = q.lease_one(wait=10)
    finally:
        proc.kill()
        proc.wait()
    assert (
        again.id == job.id and again.attempts == 2 and again.last_error.startswith("lease expired")
    )
    assert time.time() - killed <= 5
    q.ack(again)


KEYED_PRODUCER = """
import sys, ringq
url, name = sys.argv[1], sys.argv[2]
q = ringq.connect(url, name)
i = 0
try:
    while True:
        q.enqueue({"i": i}, job_id=f"j{i}")
        print(i, flush=True)
        i += 1
except ringq.ConnectionLostError:
    sys.exit(0)
"""


def test_redis_killed_with_sigkill_under_appendfsync_always_loses_nothing_acknowledged(spawn_redis):
    server = spawn_redis("--appendonly", "yes", "--appendfsync", "always")
    name = fresh_name()
    q = ringq.connect(server.url, name)
    acked = []
    for _ in q.enqueue_many(list(range(20))):
        leased = q.lease_one()
        q.ack(leased)
        acked.append(leased.id)
    proc = spawn(KEYED_PRODUCER, server.url, name, stdout=subprocess.PIPE, text=True)
    returned = []
    for line in proc.stdout:
        returned.append(int(line))
        if len(returned) >= 300:
            break
    server.kill(signal.SIGKILL)
    returned += [int(line) for line in proc.stdout]  # acknowledged before the kill landed
    assert proc.wait(30) == 0
    server.start()
    q2 = ringq.connect(server.url, name)
    for i in returned:
        assert q2.get(f"j{i}").payload == {"i": i}
    assert all(q2.get(jid).state is JobState.DONE for jid in acked)
    q.close()


def test_min_replicas_waits_for_a_replica_and_fails_clearly_without_one(spawn_redis):
    primary = spawn_redis("--repl-diskless-sync-delay", "0")
    replica = spawn_redis()
    replica.cli("REPLICAOF", "127.0.0.1", str(primary.port))
    wait_for(
        lambda: "master_link_status:up" in replica.cli("INFO", "replication"), "the replica to sync"
    )
    name = fresh_name()
    q = ringq.connect(primary.url, name, min_replicas=1, replica_timeout=1.0)
    for i in range(20):
        job = q.enqueue(i)
        # WAIT returned: the replica already holds the job when enqueue returns
        assert replica.cli("HEXISTS", f"{{ringq:{name}}}:meta", job.id) == "1"
    replica.kill()
    t = time.monotonic()
    with pytest.raises(ReplicationTimeoutError, match="0 of 1 replicas"):
        q.enqueue("unreplicated")
    assert time.monotonic() - t < 10


def test_a_three_master_cluster_serves_queues_in_every_slot(spawn_redis):
    nodes = start_cluster(spawn_redis, 3)
    names = [f"c{i}" for i in range(6)]
    owners = {nodes[0].cli("CLUSTER", "KEYSLOT", f"{{ringq:{n}}}:meta") for n in names}
    assert len(owners) == 6
    for name in names:
        q = ringq.connect(nodes[0].url, name, max_attempts=1, visibility_timeout=5)
        assert q.cluster
        jobs = q.enqueue_many([1, 2, 3], job_ids=["a", "b", "c"])
        a, b = q.lease(2)
        q.ack(a)
        q.nack(b, error="no")
        assert [j.id for j in q.dlq()] == ["b"] and q.requeue_dead() == 1
        got = sorted(j.id for j in q.lease(5))
        assert got == ["b", "c"] and len(q) == 3 and q.get(jobs[0].id).state is JobState.DONE
        q.enqueue("later", delay=0.2)
        assert q.lease_one(wait=5).payload == "later"
        assert q.purge() == 4
        q.close()


def test_a_connection_killed_mid_operation_loses_and_duplicates_no_acknowledged_job(redis_server):
    name = fresh_name()
    q = ringq.connect(redis_server.url, name, visibility_timeout=1.0)
    stop = threading.Event()
    acknowledged, acked, errors = [], set(), []

    def produce():
        for i in range(400):
            while True:
                try:
                    q.enqueue(i, job_id=f"k{i}")  # keyed: repeating after a lost reply is safe
                    break
                except ConnectionLostError:
                    errors.append("enqueue")
            acknowledged.append(f"k{i}")

    def consume():
        while not stop.is_set() or q.stats().ready:
            try:
                job = q.lease_one(wait=0.2)
            except ConnectionLostError:
                errors.append("lease")  # leased jobs come back after the visibility timeout
                continue
            if job is None:
                continue
            while True:
                try:
                    q.ack(job)  # repeating an ack is harmless
                    acked.add(job.id)
                    break
                except ConnectionLostError:
                    errors.append("ack")

    def killer():
        while not stop.is_set():
            redis_server.cli("CLIENT", "KILL", "TYPE", "normal", check=False)
            time.sleep(0.01)

    threads = [threading.Thread(target=f) for f in (consume, consume)]
    kt = threading.Thread(target=killer)
    for t in threads + [kt]:
        t.start()
    produce()
    wait_for(lambda: len(acked) == 400, "every job to be acked", timeout=60)
    stop.set()
    for t in threads + [kt]:
        t.join(30)
    assert errors, "the killer never hit an operation"
    assert sorted(j.id for j in q.list_jobs()) == sorted(acknowledged)
    assert q.stats().done == 400 and len(q) == 400


def test_a_dead_server_is_a_clear_error(spawn_redis):
    server = spawn_redis()
    q = ringq.connect(server.url, fresh_name())
    q.enqueue(1)
    server.kill()
    with pytest.raises(ConnectionLostError, match="may or may not"):
        q.enqueue(2)
    with pytest.raises(ConnectionLostError):
        ringq.connect(f"redis://127.0.0.1:{free_port()}/0")


def test_unknown_url_schemes_and_options_are_refused(redis_url):
    with pytest.raises(ValueError, match="unsupported queue URL"):
        ringq.connect("http://example.com/q")
    with pytest.raises(TypeError, match="no_such"):
        ringq.connect(redis_url, no_such=1)
    assert ringq.connect(redis_url, durability="group").durability == "redis"


def test_worker_processes_run_on_redis(redis_url):
    name = fresh_name()
    q = ringq.connect(redis_url, name)
    q.enqueue_many(list(range(30)))
    stats = Worker(q, lambda job: None, processes=2, idle_timeout=0.5, handle_signals=False).run()
    assert stats.succeeded == 30 and q.stats().done == 30
    assert os.getpid()


def test_done_jobs_and_their_ids_are_kept_for_retain_done_seconds(redis_url):
    q = ringq.connect(redis_url, fresh_name(), retain_done=0.2)
    q.enqueue("first", job_id="k")
    q.ack(q.lease_one())
    assert q.enqueue("again", job_id="k").payload == "first" and q.stats().done == 1
    time.sleep(0.3)
    q.enqueue("other")
    q.ack(q.lease_one())  # a later ack drops what outlived the retention
    with pytest.raises(ringq.JobNotFoundError):
        q.get("k")
    assert q.enqueue("new", job_id="k").payload == "new"


def test_a_missing_redis_server_skips_locally_but_fails_under_ci(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on it
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install redis-server"):
        require_redis()
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI must not skip"):
        require_redis()
