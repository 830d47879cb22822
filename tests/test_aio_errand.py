"""ringq.aio keeps errand's documented timing and reports every job, however it was created.

The ``errand`` on PyPI (0.2.x, "pythonic excellerator interface") is an unrelated project, and
``errand-jobs`` has another API (``Errand().task``/``enqueue``), so these tests follow the
behaviour errand's documentation gives for ``@queue.handler``/``submit``/``get``/``running``:
an interrupted job reruns on enter, and one ``await asyncio.sleep(0)`` lets a handler that does
not await finish.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import ringq
from ringq.aio import Queue, Status


def test_recovery_example_needs_one_loop_iteration(target):
    started = asyncio.Event()
    first = Queue(target)

    @first.handler("render")
    async def render_slowly(job):
        started.set()
        await asyncio.sleep(3600)

    second = Queue(target)

    @second.handler("render")
    async def render(job):
        return f"rendered {job.payload}"

    async def main():
        async with first:
            job_id = first.submit("render", "page-1")
            await started.wait()
        async with second:
            await asyncio.sleep(0)  # once, as in errand's recovery example
            job = second.get(job_id)
            assert (
                job.status is Status.DONE and job.result == "rendered page-1" and job.attempts == 2
            )

    asyncio.run(main())


def test_a_job_left_by_a_killed_process_reruns_within_one_iteration(qdir):
    # A directory only: on Redis the killed process's lease comes back after the visibility
    # timeout (test_aio_processes.py), not at the next open.
    code = (
        "import asyncio, sys\nfrom ringq.aio import Queue\nq = Queue(sys.argv[1])\n"
        "@q.handler('render')\nasync def h(job):\n    print('started', flush=True)\n    await asyncio.sleep(3600)\n"
        "async def main():\n    async with q:\n        q.submit('render', 'p', id='job-1')\n"
        "        await asyncio.sleep(3600)\nasyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, qdir], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
    finally:
        proc.kill()
        proc.wait()
    q = Queue(qdir)

    @q.handler("render")
    async def render(job):
        return "done"

    async def main():
        async with q:
            await asyncio.sleep(0)
            assert q.get("job-1").status is Status.DONE

    asyncio.run(main())


def test_a_job_created_outside_aio_that_the_engine_dead_letters_is_failed_not_gone(target):
    q = Queue(target)
    kind_queue = q.queue_name("resize")
    # As docs/aio.md's command-line example did: a record with the CLI's default 5 attempts.
    where = ["--url" if "://" in target else "--dir", target]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ringq",
            *where,
            "--queue",
            kind_queue,
            "enqueue",
            "--job-id",
            "r-64",
            '{"kind": "resize", "payload": {"w": 64}}',
        ],
        check=True,
    )
    with ringq.connect(target, kind_queue, visibility_timeout=0.05) as engine:
        deadline = time.monotonic() + 20
        while (
            engine.get("r-64").state is not ringq.JobState.DEAD
        ):  # five runs lost, one after another
            assert time.monotonic() < deadline
            engine.lease_one()
            time.sleep(0.06)

    async def main():
        async with q:
            job = q.get("r-64")
            assert job is not None and job.status is Status.FAILED and job.kind == "resize"
            assert job.error.startswith("GaveUp: started 5 times") and "max_attempts=5" in job.error
            assert all(j.id != "r-64" for j in q.running())

    asyncio.run(main())
