"""ringq.aio's storage seam (ringq/aio/store.py) on both backends, and what only Redis can do to
a serving process: refuse connections, drop them, restart.  Real redis-server processes."""

import asyncio
import signal
import time

import pytest
from redisserver import free_port, require_redis, start_cluster

from ringq import ConnectionLostError
from ringq.aio import Queue, Status
from ringq.aio.store import REDIS_RETAIN_DONE, store_for


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def until(pred, timeout=20.0, step=0.01):
    t = time.monotonic()
    while not pred():
        if time.monotonic() - t > timeout:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(step)


def test_a_store_lists_queues_another_store_opened_and_only_this_aio_queues(target):
    a, b, other = store_for(target, "app"), store_for(target, "app"), store_for(target, "app2")
    for s in (a, b, other):
        s.start()
    try:
        queues = [a.open("app-j-mail"), b.open("app-jh-0123"), other.open("app2-j-mail")]
        for q in queues:
            q.enqueue("x")
        assert sorted(a.queue_names(("app-j-", "app-jh-"))) == ["app-j-mail", "app-jh-0123"]
        assert sorted(b.queue_names(("app-j-", "app-jh-"))) == ["app-j-mail", "app-jh-0123"]
        for q in queues:
            q.close()
    finally:
        for s in (a, b, other):
            s.close()


def test_the_sweep_lock_admits_one_holder_at_a_time(target):
    a, b = store_for(target, "app"), store_for(target, "app")
    for s in (a, b):
        s.start()
        s.open("app-r").close()  # a directory exists once a queue is made in it
    try:
        la, lb = a.sweep_lock(), b.sweep_lock()
        assert la.acquire()
        assert not lb.acquire()
        assert la.renew()
        la.release()
        assert lb.acquire()
        assert not la.acquire()
        lb.release()
    finally:
        for s in (a, b):
            s.close()


def test_a_redis_sweep_lock_that_expired_neither_renews_nor_frees_the_next_holders(
    aio_redis_server,
):
    url = f"redis://127.0.0.1:{aio_redis_server.port}/4000"
    a, b = store_for(url, "app"), store_for(url, "app")
    for s in (a, b):
        s.start()
    try:
        la, lb = a.sweep_lock(), b.sweep_lock()
        assert la.acquire()
        # As if a's holder stalled past the lock's lifetime: the key goes, and b takes the lock.
        aio_redis_server.cli("-n", "4000", "DEL", "{ringq-aio:app}:sweep")
        assert lb.acquire()
        assert not la.renew()  # a learns it lost the lock, and stops sweeping
        la.release()  # compare-and-delete: b's lock stays
        assert aio_redis_server.cli("-n", "4000", "EXISTS", "{ringq-aio:app}:sweep") == "1"
        lb.release()
        assert aio_redis_server.cli("-n", "4000", "EXISTS", "{ringq-aio:app}:sweep") == "0"
    finally:
        for s in (a, b):
            s.close()


def test_aio_queues_on_redis_drop_finished_records_after_a_minute(aio_redis_server):
    store = store_for(f"redis://127.0.0.1:{aio_redis_server.port}/4001", "app")
    store.start()
    try:
        q = store.open("app-r")
        assert q.retain_done == REDIS_RETAIN_DONE == 60.0  # docs/aio.md, On Redis: "a minute later"
        q.close()
    finally:
        store.close()


def test_a_kind_submitted_by_another_process_is_seen_without_a_handler(target):
    web, viewer = Queue(target), Queue(target)

    async def main():
        async with viewer:  # opened first: the kind does not exist yet
            async with web:
                job_id = web.submit("later", {"n": 1})
            job = viewer.get(job_id)
            assert job is not None and job.status is Status.RUNNING and job.kind == "later"
            assert [j.id for j in viewer.running()] == [job_id]

    run(main())


def test_an_unknown_scheme_is_refused_and_an_unreachable_server_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported queue URL"):
        Queue("http://127.0.0.1/0")
    require_redis()
    queue = Queue(f"redis://127.0.0.1:{free_port()}/0")

    async def main():
        with pytest.raises(ConnectionLostError, match="connection failed"):
            await queue.open()
        assert not queue.is_open

    run(main())


def test_a_serving_process_survives_a_redis_restart_and_serves_again(spawn_redis):
    server = spawn_redis("--appendonly", "yes", "--appendfsync", "always")
    queue = Queue(server.url, visibility_timeout=1.0)

    @queue.handler("echo")
    async def echo(job):
        return job.payload

    async def main():
        async with queue:
            first = queue.submit("echo", 1)
            await until(lambda: queue.get(first).status is Status.DONE)
            server.kill(signal.SIGKILL)
            await asyncio.sleep(1.2)  # waiter threads and heartbeats meet the dropped connections
            with pytest.raises(ConnectionLostError):
                queue.submit("echo", 2)
            server.start()
            # The first command on each pooled connection that died may fail once; then it is back.
            deadline = time.monotonic() + 20
            while True:
                try:
                    second = queue.submit("echo", 3, id="after-restart")
                    break
                except ConnectionLostError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            await until(lambda: queue.get(second).status is Status.DONE)
            assert queue.get(second).result == 3
            assert queue.get(first).result == 1  # appendfsync always: the result outlived the kill

    run(main())


def test_an_aio_queue_runs_on_a_three_master_cluster(spawn_redis):
    nodes = start_cluster(spawn_redis)
    queue = Queue(nodes[0].url, keep_jobs=5, keep_seconds=None, sweep_interval=3600)
    kinds = [f"k{i}" for i in range(6)]  # their queues hash to slots on different masters
    for kind in kinds:

        @queue.handler(kind, concurrency=2)
        async def handle(job):
            return job.payload * 2

    async def main():
        async with queue:
            ids = [queue.submit(k, i) for i in range(5) for k in kinds]
            waiting = queue.submit("unserved", 0)
            await until(lambda: [j.id for j in queue.running()] == [waiting])
            assert [queue.get(i).result for i in ids] == [i * 2 for i in range(5) for _ in kinds]
            assert queue.prune() == len(ids) - 5
            kept = [i for i in ids if queue.get(i) is not None]
            assert len(kept) == 5  # the five that finished last (finish order spans the kinds)

        async with Queue(nodes[1].url) as other:  # any node: the client follows the slots
            assert (
                other.get(waiting).status is Status.RUNNING
                and other.get(kept[0]).status is Status.DONE
            )

    run(main())
