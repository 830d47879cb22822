"""ringq.aio dependencies (``submit(..., depends_on=, allow_failure=)``, ringq/aio/gates.py) on a
directory and on Redis: parents of other kinds, failures that cancel, callbacks that allow them."""

import asyncio

import pytest
from test_aio_redis import run, until

from ringq import JobNotFoundError
from ringq.aio import Queue, Status


def finished(queue, *ids):
    return all(queue.get(i).status is not Status.RUNNING for i in ids)


def test_a_pipeline_across_kinds_runs_each_stage_after_its_parents(target):
    queue = Queue(target, "wf")
    order = []
    gate = asyncio.Event()

    @queue.handler("fetch")
    async def fetch(job):
        await gate.wait()
        order.append(job.id)
        return job.payload * 2

    @queue.handler("join")
    async def join(job):
        order.append(job.id)
        return "joined"

    async def main():
        async with queue:
            a = queue.submit("fetch", 1, id="a")
            b = queue.submit("fetch", 2, id="b")
            c = queue.submit("join", None, id="c", depends_on=[a, queue.get(b)])
            assert queue.get(c).status is Status.RUNNING and queue.get(c).depends_on == ["a", "b"]
            queue.submit("join", None, id="c2", depends_on=["a"])  # shares a's gate with c
            assert [j.id for j in queue.running()] == ["a", "b", "c", "c2"]
            await asyncio.sleep(0.1)
            assert order == []
            gate.set()
            await until(lambda: finished(queue, "c", "c2"))
            assert order.index("c") > max(order.index("a"), order.index("b"))
            assert order.index("c2") > order.index("a") and len(order) == 4
            done = queue.get("c")
            assert done.status is Status.DONE and done.depends_on == ["a", "b"]
            # a parent already done counts as done
            queue.submit("join", None, id="d", depends_on=["a"])
            await until(lambda: finished(queue, "d"))
            assert queue.get("d").status is Status.DONE
            with pytest.raises(JobNotFoundError):
                queue.submit("join", None, depends_on=["nobody"])
            with pytest.raises(ValueError, match="reserved"):
                queue.submit("join", None, id="~after:x")

    run(main())


def test_a_failed_parent_fails_its_dependents_unless_they_allow_failure(target):
    queue = Queue(target, "wf")

    @queue.handler("work")
    @queue.handler("other")
    async def work(job):
        if job.payload == "boom":
            raise RuntimeError("boom")
        return job.payload

    async def main():
        async with queue:
            bad = queue.submit("work", "boom", id="bad")
            child = queue.submit("work", "child", id="child", depends_on=[bad])
            grandchild = queue.submit("other", "gc", id="gc", depends_on=[child])
            callback = queue.submit("work", "cb", id="cb", depends_on=[bad], allow_failure=True)
            await until(lambda: finished(queue, bad, child, grandchild, callback))
            assert queue.get(bad).status is Status.FAILED
            got = queue.get(child)
            assert got.status is Status.FAILED and got.error == "Cancelled: parent job 'bad' failed"
            gc = queue.get(grandchild)
            assert gc.status is Status.FAILED and "'child'" in gc.error
            assert queue.get(callback).status is Status.DONE

    run(main())


def test_cancelling_a_waiting_parent_fails_its_dependents(target):
    queue = Queue(target, "wf")

    @queue.handler("work")
    async def work(job):
        return job.payload

    async def main():
        async with queue:
            p = queue.submit("work", "p", id="p", delay=30)
            c = queue.submit("work", "c", id="c", depends_on=[p])
            assert queue.cancel(p)
            await until(lambda: finished(queue, c))
            assert queue.get(c).status is Status.FAILED

    run(main())


def test_debounce_runs_a_burst_once_with_the_last_payload(target):
    queue = Queue(target, "wf")
    runs = []

    @queue.handler("save")
    async def save(job):
        runs.append(job.payload)
        return job.payload

    async def main():
        async with queue:
            for i in range(5):
                assert queue.submit("save", i, id="doc", debounce=0.2) == "doc"
            await until(lambda: finished(queue, "doc"))
            assert runs == [4] and queue.get("doc").result == 4
            queue.submit("save", 5, id="doc", debounce=0)  # finished: nothing stored
            await asyncio.sleep(0.1)
            assert runs == [4]
            with pytest.raises(ValueError, match="id"):
                queue.submit("save", 1, debounce=1)
            queue.submit("save", 1, id="later", delay=30)
            with pytest.raises(ValueError, match="kind"):
                queue.submit("other", 2, id="later", replace=True)
            queue.submit("save", 2, id="later", replace=True)
            await until(lambda: finished(queue, "later"))
            assert runs == [4, 2]

    run(main())
