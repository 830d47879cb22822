"""ringq.aio in one process: errand's API and scenarios, and the features beyond errand.

Each test drives its own event loop with asyncio.run (no pytest plugin needed), and runs on both
backends: ``target`` is a fresh directory or a fresh database of a real redis-server.
"""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC

import pytest
from procs import child_env

import ringq
from ringq import BackoffPolicy, QueueClosedError
from ringq.aio import Job, Queue, Status

SMALL = dict(slot_size=128, slot_count=256)  # small segments: fast to create, rotate and retire


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def until(pred, timeout=10.0, step=0.01):
    t = time.monotonic()
    while not pred():
        if time.monotonic() - t > timeout:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(step)


# -- errand's scenarios, unchanged but for the import ----------------------------------------------


def test_submit_then_sleep0_shows_done_with_result(target):
    queue = Queue(target, **SMALL)

    @queue.handler("double")
    async def double(job: Job):
        return job.payload["x"] * 2

    async def main():
        async with queue:
            job_id = queue.submit("double", {"x": 21})
            await asyncio.sleep(0)
            job = queue.get(job_id)
            assert job.status is Status.DONE and job.result == 42
            assert (
                job.id == job_id
                and job.kind == "double"
                and job.payload == {"x": 21}
                and job.error is None
            )
            assert job.created_at.tzinfo is UTC and job.finished_at.tzinfo is UTC
            assert job.created_at <= job.finished_at
            assert queue.running() == []

    run(main())


def test_failing_handler_shows_failed_with_error_text(target):
    queue = Queue(target, **SMALL)

    @queue.handler("divide")
    async def divide(job):
        return job.payload["a"] / job.payload["b"]

    async def main():
        async with queue:
            job_id = queue.submit("divide", {"a": 1, "b": 0})
            await asyncio.sleep(0)
            job = queue.get(job_id)
            assert job.status is Status.FAILED
            assert job.error == "ZeroDivisionError: division by zero"
            assert job.result is None and job.finished_at is not None and job.attempts == 1

    run(main())


def test_handler_that_catches_its_error_returns_a_fallback(target):
    queue = Queue(target, **SMALL)

    @queue.handler("fetch")
    async def fetch(job):
        try:
            raise ConnectionError("upstream down")
        except ConnectionError:
            return {"cached": True}

    async def main():
        async with queue:
            job_id = queue.submit("fetch", "https://example.invalid")
            await asyncio.sleep(0)
            assert queue.get(job_id).status is Status.DONE
            assert queue.get(job_id).result == {"cached": True}

    run(main())


def test_service_reuses_an_unfinished_identical_job_through_running(target):
    queue = Queue(target, **SMALL)
    release = None

    @queue.handler("report")
    async def report(job):
        await release.wait()
        return f"report for {job.payload['user']}"

    def request_report(user):
        for job in queue.running():
            if job.kind == "report" and job.payload == {"user": user}:
                return job.id
        return queue.submit("report", {"user": user})

    async def main():
        nonlocal release
        release = asyncio.Event()
        async with queue:
            a = request_report("ann")
            await asyncio.sleep(0)
            b = request_report("ann")
            c = request_report("bob")
            assert a == b and a != c
            assert [j.id for j in queue.running()] == [a, c]
            assert all(j.status is Status.RUNNING for j in queue.running())
            release.set()
            await until(lambda: queue.get(c).status is Status.DONE)
            assert queue.get(a).result == "report for ann"
            assert request_report("ann") not in (a, c)  # finished: a new job

    run(main())


NEXT_PROCESS = """
import asyncio, sys
from ringq.aio import Queue, Status
queue = Queue(sys.argv[1], slot_size=128, slot_count=256)
runs = []

@queue.handler("slow")
async def slow(job):
    runs.append(job.id)
    return "finished by the next process"

async def main():
    async with queue:
        while queue.get(sys.argv[2]).status is Status.RUNNING:
            await asyncio.sleep(0.01)
        print(queue.get(sys.argv[2]).result, runs)

asyncio.run(main())
"""


def test_job_interrupted_by_closing_mid_handler_is_finished_by_the_next_process(target):
    queue = Queue(target, **SMALL)
    started = None

    @queue.handler("slow")
    async def slow(job):
        started.set()
        await asyncio.sleep(3600)

    async def first():
        nonlocal started
        started = asyncio.Event()
        async with queue:
            job_id = queue.submit("slow", None)
            await started.wait()
        return job_id  # closed mid-handler

    job_id = run(first())
    out = subprocess.run(
        [sys.executable, "-c", NEXT_PROCESS, target, job_id],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"finished by the next process ['{job_id}']"

    async def check():
        async with Queue(target) as q:
            job = q.get(job_id)
            assert job.status is Status.DONE and job.attempts == 2

    run(check())


# -- the API's edges -------------------------------------------------------------------------------


def test_results_survive_reopen(target):
    queue = Queue(target, **SMALL)

    @queue.handler("sq")
    async def sq(job):
        return job.payload * job.payload

    @queue.handler("bad")
    async def bad(job):
        raise ValueError(f"no {job.payload}")

    async def first():
        async with queue:
            ids = [queue.submit("sq", i) for i in range(20)]
            bad_id = queue.submit("bad", "way")
            await until(lambda: not queue.running())
            return ids, bad_id

    ids, bad_id = run(first())

    async def second():
        async with Queue(target) as q:  # no handlers at all
            assert [q.get(i).result for i in ids] == [i * i for i in range(20)]
            assert q.get(bad_id).error == "ValueError: no way"
            assert q.get("never-submitted") is None

    run(second())


def test_submit_get_running_need_an_open_queue(target):
    queue = Queue(target)
    with pytest.raises(QueueClosedError):
        queue.submit("k", 1)
    with pytest.raises(QueueClosedError):
        queue.get("x")
    with pytest.raises(ValueError):
        Queue(target, name="bad name")
    with pytest.raises(ValueError):
        queue.handler("k", concurrency=0)


@pytest.mark.parametrize(
    "kw",
    [
        dict(visibility_timeout=10**400),
        dict(visibility_timeout=float("nan")),
        dict(keep_seconds=10**400),
        dict(keep_seconds=__import__("numpy").float16("inf")),
        dict(sweep_interval=float("nan")),
        dict(sweep_interval=0),
    ],
    ids=repr,
)
def test_a_queue_option_out_of_range_is_a_value_error(target, kw):
    with pytest.raises(ValueError, match="must be"):
        Queue(target, **kw)


@pytest.mark.parametrize("timeout", [10**400, float("inf"), float("nan"), 0, -1], ids=repr)
def test_a_handler_timeout_out_of_range_is_a_value_error(target, timeout):
    # A timeout asyncio cannot arm is refused when the handler is registered, not when it runs.
    queue = Queue(target)
    with pytest.raises(ValueError, match="timeout must be"):
        queue.handler("k", timeout=timeout)


def test_numpy_integers_are_taken_for_counts(target):
    import numpy as np

    queue = Queue(target, keep_jobs=np.int64(10), max_attempts=np.int32(3), **SMALL)
    assert (queue.keep_jobs, queue.max_attempts) == (10, 3)
    assert type(queue.keep_jobs) is int and type(queue.max_attempts) is int

    @queue.handler("k", concurrency=np.int64(2), retries=np.int8(1))
    async def k(job):
        return job.payload

    async def main():
        async with queue as q:
            jid = q.submit("k", 7)
            await until(lambda: q.get(jid).status is Status.DONE)
            assert q.get(jid).result == 7

    run(main())


def test_non_json_result_fails_the_job_and_non_json_payload_is_refused(target):
    queue = Queue(target, **SMALL)

    @queue.handler("obj")
    async def obj(job):
        return object()

    async def main():
        async with queue:
            with pytest.raises(ringq.SerializationError, match=r"^[^\[]*payload is of type set"):
                queue.submit("obj", {1, 2})  # the caller's payload, not the record it is kept in
            with pytest.raises(ringq.SerializationError, match=r"payload\['a'\]\[0\] is of type set"):
                queue.submit("obj", {"a": [{3}]})
            job_id = queue.submit("obj", None)
            await asyncio.sleep(0)
            job = queue.get(job_id)
            assert job.status is Status.FAILED and "not JSON" in job.error

    run(main())


def test_payloads_nest_255_deep_one_level_below_the_record(target):
    queue = Queue(target, **SMALL)

    def nested(depth):
        value = "leaf"
        for _ in range(depth):
            value = [value]
        return value

    @queue.handler("echo")
    async def echo(job):
        return job.payload

    async def main():
        async with queue:
            with pytest.raises(ringq.SerializationError, match="deep"):
                queue.submit("echo", nested(256))
            job_id = queue.submit("echo", nested(255))
            await until(lambda: queue.get(job_id).status is Status.DONE)
            assert queue.get(job_id).result == nested(255)

    run(main())


def test_sync_handlers_run_in_a_thread(target):
    queue = Queue(target, **SMALL)
    loop_thread = threading.get_ident()

    @queue.handler("blocking")
    def blocking(job):
        time.sleep(0.05)
        return threading.get_ident() != loop_thread

    async def main():
        async with queue:
            job_id = queue.submit("blocking", None)
            await until(lambda: queue.get(job_id).status is Status.DONE)
            assert queue.get(job_id).result is True

    run(main())


def test_a_kind_without_handler_waits_until_one_is_registered(target):
    queue = Queue(target, **SMALL)

    async def main():
        async with queue:
            job_id = queue.submit("later", 5)
            await asyncio.sleep(0.1)
            assert queue.get(job_id).status is Status.RUNNING

            @queue.handler("later")
            async def later(job):
                return job.payload + 1

            await until(lambda: queue.get(job_id).status is Status.DONE)
            assert queue.get(job_id).result == 6

    run(main())


def test_odd_kind_names_get_their_own_hashed_queue(target):
    queue = Queue(target, **SMALL)
    kind = "emails/send welcome ✉"

    @queue.handler(kind)
    async def send(job):
        return job.kind

    async def main():
        async with queue:
            job_id = queue.submit(kind, None)
            await asyncio.sleep(0)
            assert queue.get(job_id).result == kind
            assert queue.queue_name(kind).startswith("default-jh-")
            assert queue.queue_name("plain_kind") == "default-j-plain_kind"

    run(main())


# -- concurrency -----------------------------------------------------------------------------------


def test_concurrency_limit_holds_under_a_burst_of_1000_and_the_rest_wait_in_order(target):
    # durability="none": 2,000 msyncs would make this a disk benchmark; what is tested is the limit
    queue = Queue(target, durability="none", slot_size=128, slot_count=512)
    active, peak, order = 0, 0, []

    @queue.handler("limited", concurrency=3)
    async def limited(job):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        order.append(job.payload)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        active -= 1
        return job.payload

    @queue.handler("free")
    async def free(job):
        return None

    async def main():
        async with queue:
            ids = [queue.submit("limited", i) for i in range(1000)]
            assert active <= 3
            other = queue.submit("free", None)
            await asyncio.sleep(0)
            assert queue.get(other).status is Status.DONE  # a limited kind never blocks another
            await until(lambda: len(order) == 1000 and active == 0, timeout=60)
            await until(lambda: queue.get(ids[-1]).status is Status.DONE)
        assert peak == 3
        assert order == list(range(1000))

    run(main())


def test_a_kind_at_capacity_with_a_due_job_waiting_does_not_spin(target):
    queue = Queue(target, **SMALL)
    gate = None

    @queue.handler("busy", concurrency=2)
    async def busy(job):
        await gate.wait()

    async def main():
        nonlocal gate
        gate = asyncio.Event()
        async with queue:
            pumps = 0
            pump = queue._pump

            def counting(kind):
                nonlocal pumps
                pumps += 1
                pump(kind)

            queue._pump = counting
            queue.submit("busy", 0, delay=0.05)  # seen by a lease, scheduled
            queue.submit("busy", 1)
            queue.submit("busy", 2)  # capacity full
            await asyncio.sleep(0.2)  # the delayed job is due now, but there is no room for it
            pumps = 0
            await asyncio.sleep(1.0)
            assert pumps <= 10  # about one per WAIT_CAP; a spinning waiter made hundreds
            gate.set()
            await until(lambda: not queue.running())

    run(main())


def test_submission_from_other_threads(target):
    queue = Queue(target, **SMALL)
    seen = []

    @queue.handler("t")
    async def t(job):
        seen.append(job.payload)
        return job.payload

    async def main():
        async with queue:
            ids = []

            def producer(n):
                for i in range(25):
                    ids.append(queue.submit("t", n * 100 + i))

            threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
            for th in threads:
                th.start()
            await asyncio.to_thread(lambda: [th.join() for th in threads])
            await until(lambda: len(seen) == 100)
            await until(lambda: all(queue.get(i).status is Status.DONE for i in ids))
            assert sorted(seen) == sorted(n * 100 + i for n in range(4) for i in range(25))

    run(main())


# -- beyond errand ----------------------------------------------------------------------------------


def test_retries_with_backoff_then_success(target):
    queue = Queue(target, **SMALL)
    times = []

    @queue.handler("flaky", retries=3, backoff=BackoffPolicy(base=0.1, factor=2, jitter=0))
    async def flaky(job):
        times.append(time.monotonic())
        if len(times) < 3:
            raise RuntimeError(f"try {len(times)}")
        return "ok"

    async def main():
        async with queue:
            job_id = queue.submit("flaky", None)
            await asyncio.sleep(0)
            assert queue.get(job_id).status is Status.RUNNING  # failed once, waiting to retry
            await until(lambda: queue.get(job_id).status is Status.DONE)
            job = queue.get(job_id)
            assert job.result == "ok" and job.attempts == 3

    run(main())
    assert times[1] - times[0] >= 0.09 and times[2] - times[1] >= 0.19


def test_retries_exhausted_fail_with_the_last_error(target):
    queue = Queue(target, **SMALL)
    calls = 0

    @queue.handler("hopeless", retries=2, backoff=BackoffPolicy(base=0.01, jitter=0))
    async def hopeless(job):
        nonlocal calls
        calls += 1
        raise KeyError(f"attempt {calls}")

    @queue.handler("once")
    async def once(job):
        raise KeyError("no retries by default")

    async def main():
        async with queue:
            a = queue.submit("hopeless", None)
            b = queue.submit("once", None)
            await until(lambda: queue.get(a).status is Status.FAILED)
            assert queue.get(a).error == "KeyError: 'attempt 3'" and queue.get(a).attempts == 3
            assert queue.get(b).status is Status.FAILED and queue.get(b).attempts == 1

    run(main())
    assert calls == 3


def test_timeout_fails_the_job_with_a_clear_error(target):
    queue = Queue(target, **SMALL)

    @queue.handler("sleepy", timeout=0.1)
    async def sleepy(job):
        await asyncio.sleep(job.payload)
        return "woke"

    async def main():
        async with queue:
            slow = queue.submit("sleepy", 30)
            fast = queue.submit("sleepy", 0.01)
            t = time.monotonic()
            await until(lambda: queue.get(slow).status is Status.FAILED)
            assert time.monotonic() - t < 2
            assert (
                queue.get(slow).error
                == "TimeoutError: handler for 'sleepy' did not finish within 0.1 s"
            )
            await until(lambda: queue.get(fast).status is Status.DONE)

    run(main())


def test_idempotent_ids_return_the_existing_job(target):
    queue = Queue(target, **SMALL)
    runs = []

    @queue.handler("charge")
    async def charge(job):
        runs.append(job.payload)
        return job.payload["amount"]

    async def main():
        async with queue:
            assert queue.submit("charge", {"amount": 5}, id="order-17") == "order-17"
            assert queue.submit("charge", {"amount": 9}, id="order-17") == "order-17"
            await asyncio.sleep(0)
            # finished: still it
            assert queue.submit("charge", {"amount": 9}, id="order-17") == "order-17"
            assert queue.get("order-17").result == 5

        async with queue:  # across reopen
            assert queue.submit("charge", {"amount": 9}, id="order-17") == "order-17"
            await asyncio.sleep(0.05)

    run(main())
    assert runs == [{"amount": 5}]


def test_delayed_jobs_start_after_their_delay(target):
    queue = Queue(target, **SMALL)
    started = {}

    @queue.handler("later")
    async def later(job):
        started[job.payload] = time.monotonic()

    async def main():
        async with queue:
            t = time.monotonic()
            slow = queue.submit("later", "slow", delay=0.3)
            queue.submit("later", "now")
            await asyncio.sleep(0.05)
            assert queue.get(slow).status is Status.RUNNING and "slow" not in started
            assert "now" in started
            await until(lambda: queue.get(slow).status is Status.DONE)
            assert started["slow"] - t >= 0.29

    run(main())


def test_retention_by_count_prunes_the_oldest_and_keeps_disk_bounded(target):
    queue = Queue(
        target,
        keep_jobs=10,
        keep_seconds=None,
        durability="none",
        slot_size=128,
        slot_count=64,
        sweep_interval=3600,
    )

    @queue.handler("n", concurrency=8)
    async def n(job):
        return job.payload

    def seg_files():
        if "://" in target:
            return []  # Redis: memory is bounded by the same pruning (RedisQueue's retain_done)
        return [f for f in os.listdir(target) if f.endswith(".seg")]

    async def main():
        async with queue:
            peak = 0
            for rnd in range(6):
                ids = [queue.submit("n", rnd * 100 + i) for i in range(100)]
                last = ids[-1]
                await until(lambda last=last: queue.get(last).status is Status.DONE)
                assert queue.prune() > 0
                peak = max(peak, len(seg_files()))
            kept = [queue.get(i) for i in ids]
            assert [j is not None for j in kept] == [False] * 90 + [True] * 10
            assert [j.result for j in kept[90:]] == list(range(590, 600))
            # without pruning: 30 segments (600 jobs, a job record and a result each)
            assert peak <= 5

    run(main())


def test_retention_by_age(target):
    queue = Queue(target, keep_seconds=0.2, keep_jobs=None, sweep_interval=0.05, **SMALL)

    @queue.handler("e")
    async def e(job):
        return 1

    async def main():
        async with queue:
            old = queue.submit("e", None)
            await asyncio.sleep(0)
            assert queue.get(old).status is Status.DONE
            await until(lambda: queue.get(old) is None, timeout=5)

    run(main())


def test_a_job_started_max_attempts_times_without_finishing_gives_up(target):
    started = None

    def serving(queue):
        @queue.handler("crashy")
        async def crashy(job):
            started.set()
            await asyncio.sleep(3600)

    async def main():
        nonlocal started
        queue = Queue(target, max_attempts=2, **SMALL)
        serving(queue)
        async with queue:
            job_id = queue.submit("crashy", None)
            for _ in range(2):  # interrupted twice, as by two crashes
                started = asyncio.Event()
                await started.wait()
                await queue.aclose()
                await queue.open()
            await until(lambda: queue.get(job_id).status is Status.FAILED)
            job = queue.get(job_id)
            assert job.attempts == 3 and job.error.startswith(
                "GaveUp: started 2 times without finishing"
            )
            assert "Interrupted" in job.error

    run(main())


def test_an_id_is_one_job_across_kinds(target):
    queue = Queue(target, **SMALL)

    async def main():
        async with queue:
            assert queue.submit("a", 1, id="x") == "x"
            assert queue.submit("b", 2, id="x") == "x"
            assert [(j.kind, j.payload) for j in queue.running()] == [("a", 1)]

    run(main())


# -- storage details and interop -------------------------------------------------------------------


def test_a_result_stored_before_a_crash_lost_the_ack_is_not_run_again(target):
    # The state a crash between "append result" and "ack" leaves behind, made by hand.
    with ringq.connect(target, "default-j-pay") as jq, ringq.connect(target, "default-r") as rq:
        jq.enqueue({"kind": "pay", "payload": 1}, job_id="p1")
        rq.enqueue(
            {
                "id": "p1",
                "kind": "pay",
                "payload": 1,
                "status": "done",
                "result": "paid",
                "error": None,
                "created_at": time.time(),
                "finished_at": time.time(),
                "attempts": 1,
            },
            job_id="p1",
        )
    queue = Queue(target)
    runs = []

    @queue.handler("pay")
    async def pay(job):
        runs.append(job.id)

    async def main():
        async with queue:
            assert queue.get("p1").result == "paid"
            assert queue.running() == []
            await asyncio.sleep(0.2)

    run(main())
    assert runs == []
    with ringq.connect(target, "default-j-pay") as jq:
        assert jq.stats().done == 1 and jq.stats().ready == 0


def test_jobs_are_visible_to_the_ringq_cli_and_the_cli_can_feed_handlers(target):
    queue = Queue(target, **SMALL)

    async def first():
        async with queue:
            for i in range(3):
                queue.submit("mail", {"to": i})

    run(first())

    def cli(*args):
        where = ["--url" if "://" in target else "--dir", target]
        out = subprocess.run(
            [sys.executable, "-m", "ringq", *where, *args],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    stats = json.loads(cli("--queue", queue.queue_name("mail"), "--json", "stats"))
    assert stats["ready"] == 3 and stats["total"] == 3
    cli("--queue", queue.queue_name("mail"), "enqueue", '{"to": "from the cli"}')
    with ringq.connect(target, queue.queue_name("mail")) as q:  # what `ringq list` shows
        listed = q.list_jobs()
        assert [j.payload for j in listed][:3] == [
            {"kind": "mail", "payload": {"to": i}} for i in range(3)
        ]
    out = cli("--queue", queue.queue_name("mail"), "list")
    assert all(j.id in out for j in listed)
    if "://" not in target:  # inspect reads a directory's files
        cli("--queue", queue.queue_name("mail"), "inspect")

    got = []

    @queue.handler("mail")
    async def mail(job):
        got.append(job.payload)
        return "sent"

    async def second():
        async with queue:
            await until(lambda: len(got) == 4 and not queue.running())

    run(second())
    assert got == [{"to": 0}, {"to": 1}, {"to": 2}, {"to": "from the cli"}]
    assert json.loads(cli("--queue", queue.results_queue_name, "--json", "stats"))["ready"] == 4


def test_fastapi_app_opens_the_queue_in_its_lifespan(target):
    fastapi = pytest.importorskip("fastapi")
    testclient = pytest.importorskip("fastapi.testclient")
    from contextlib import asynccontextmanager

    queue = Queue(target, **SMALL)

    @queue.handler("greet")
    async def greet(job):
        return f"hello {job.payload['name']}"

    @asynccontextmanager
    async def lifespan(app):
        async with queue:
            yield

    app = fastapi.FastAPI(lifespan=lifespan)

    @app.post("/greet/{name}")
    async def submit(name: str):
        return {"id": queue.submit("greet", {"name": name})}

    @app.get("/jobs/{job_id}")
    async def status(job_id: str):
        job = queue.get(job_id)
        if job is None:
            raise fastapi.HTTPException(404)
        return {"status": job.status.value, "result": job.result}

    with testclient.TestClient(app) as client:
        job_id = client.post("/greet/ann").json()["id"]
        t = time.monotonic()
        while client.get(f"/jobs/{job_id}").json()["status"] != "done":
            assert time.monotonic() - t < 10
            time.sleep(0.01)
        assert client.get(f"/jobs/{job_id}").json()["result"] == "hello ann"
        assert client.get("/jobs/nope").status_code == 404


def test_record_size_limit_is_the_same_on_both_backends_and_results_do_not_repeat_the_payload(target):
    queue = Queue(target)  # the default geometry: records up to 4 MiB
    assert queue.max_record_bytes == 4 * 1024 * 1024

    @queue.handler("echo")
    async def echo(job):
        return job.payload

    @queue.handler("grow")
    async def grow(job):
        return "y" * (5 * 1024 * 1024)

    async def main():
        async with queue:
            big = "x" * (3 * 1024 * 1024)
            job_id = queue.submit("echo", big)
            await until(lambda: queue.get(job_id).status is not Status.RUNNING)
            job = queue.get(job_id)
            assert job.status is Status.DONE and job.error is None
            assert job.result == big and job.payload == big  # the payload read from the job record
            small = queue.submit("echo", {"n": 1})
            await until(lambda: queue.get(small).status is Status.DONE)
            with ringq.connect(target, queue.results_queue_name) as results:
                assert "payload" not in results.get(job_id).payload  # not repeated: 3 MiB
                assert results.get(small).payload["payload"] == {"n": 1}  # kept with the result
            with pytest.raises(ringq.RecordTooLargeError, match="exceeds the largest record"):
                queue.submit("echo", "x" * (5 * 1024 * 1024), id="too-big")
            assert queue.get("too-big") is None  # nothing stored
            near = "z" * (queue.max_record_bytes - 512)  # the job and its result record fit
            with pytest.raises(ringq.RecordTooLargeError):
                queue.submit("echo", near + "z" * 512)
            queue.submit("echo", near, id="near")  # accepted on both, and so is its result
            await until(lambda: queue.get("near").status is not Status.RUNNING)
            assert queue.get("near").status is Status.DONE
            grown = queue.submit("grow", 1)
            await until(lambda: queue.get(grown).status is not Status.RUNNING)
            job = queue.get(grown)
            assert job.status is Status.FAILED and job.payload == 1
            assert job.error.startswith("RecordTooLargeError: handler result: record of")

    run(main())
