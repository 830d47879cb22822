"""One live lease per job across the threads of one process, as README's Worker example runs them.

The forms are the ones users run: several threads of one process each looping
``lease_one(wait=1.0)`` then ``ack`` while a producer (another process, or a thread of the same
one) enqueues with short pauses, so that the consumers are asleep in the wait together when a
job arrives; and ``Worker(concurrency=4)``.  Each job must be delivered exactly once (nothing
expires here), with its first fencing token, and every ack accepted.  The whole-history checks
across processes, kills and expiries are tests/test_processes_history.py.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time

from procs import spawn

from ringq import NotLeasedError, Queue, Worker

N = 4000
PRODUCE = """
import sys, time, ringq
q = ringq.Queue(sys.argv[1])
for i in range(int(sys.argv[2])):
    q.enqueue({"i": i})
    if i % 50 == 0:
        time.sleep(0.003)
q.close()
"""


def _consume(q: Queue, threads: int) -> tuple[list[tuple[str, str | None]], list[str], list[threading.Thread]]:
    seen: list[tuple[str, str | None]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def loop() -> None:
        while True:
            job = q.lease_one(wait=1.0)
            if job is None:
                return
            try:
                q.ack(job)
            except Exception as exc:  # the history keeps every refusal
                errors.append(repr(exc))
            with lock:
                seen.append((job.id, job.lease_token))

    ts = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts:
        t.start()
    return seen, errors, ts


def _check(q: Queue, seen, errors) -> None:
    counts = collections.Counter(job_id for job_id, _ in seen)
    twice = {job_id: n for job_id, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} jobs delivered to more than one thread: {list(twice.items())[:5]}"
    assert len(counts) == N and not errors, errors[:3]
    assert {token for _, token in seen} == {"1"}
    st = q.stats()
    assert (st.done, st.dead, st.ready, st.leased) == (N, 0, 0, 0)


def test_four_waiting_threads_and_a_producer_process(tmp_path):
    with Queue(tmp_path) as q:
        producer = spawn(PRODUCE, str(tmp_path), str(N))
        seen, errors, ts = _consume(q, 4)
        for t in ts:
            t.join()
        assert producer.wait(60) == 0
        _check(q, seen, errors)


def test_four_waiting_threads_and_a_producer_thread_of_the_same_process(tmp_path):
    with Queue(tmp_path) as q:

        def produce() -> None:
            for i in range(N):
                q.enqueue({"i": i})
                if i % 50 == 0:
                    time.sleep(0.003)

        seen, errors, ts = _consume(q, 4)
        p = threading.Thread(target=produce)
        p.start()
        for t in [p, *ts]:
            t.join()
        _check(q, seen, errors)


def test_worker_with_four_threads_runs_each_handler_once(tmp_path):
    with Queue(tmp_path) as q:
        producer = spawn(PRODUCE, str(tmp_path), str(N))
        runs = collections.Counter()
        lock = threading.Lock()

        def handler(job) -> None:
            with lock:
                runs[job.id] += 1

        Worker(q, handler, concurrency=4, max_jobs=N, idle_timeout=30, handle_signals=False).run()
        assert producer.wait(60) == 0
        twice = [job_id for job_id, n in runs.items() if n > 1]
        assert not twice and len(runs) == N
        st = q.stats()
        assert (st.done, st.dead) == (N, 0)


def test_lease_with_wait_returns_as_soon_as_jobs_are_due(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue_many(list(range(30)))
        t = time.monotonic()
        got = q.lease(100, wait=1.0)
        assert len(got) == 30 and time.monotonic() - t < 0.5


def test_lease_with_wait_returns_with_what_one_wake_up_brought(tmp_path):
    with Queue(tmp_path) as q, Queue(tmp_path) as producer:
        threading.Timer(0.2, lambda: producer.enqueue_many(list(range(30)))).start()
        t = time.monotonic()
        got = q.lease(100, wait=5.0)
        waited = time.monotonic() - t
        assert 0.15 < waited < 2.0 and 1 <= len(got) <= 30
        assert len(got) + len(q.lease(100)) == 30


def test_a_lease_that_waited_for_the_queue_lock_is_handed_out_in_time(tmp_path):
    """A waiting lease takes its job in C before it takes the queue lock; when another thread
    holds the lock long (a list_jobs over many jobs), the lease must not reach the caller expired
    -- possibly reclaimed and finished by another process meanwhile -- but extended from the
    moment it is handed out, or not at all."""
    vt = 0.05
    with Queue(tmp_path, visibility_timeout=vt) as q:
        q.enqueue_many([{"pad": i} for i in range(40000)], delay=3600)
        producer = spawn(
            "import sys, time, ringq\nq = ringq.Queue(sys.argv[1])\n"
            "for k in range(30):\n    q.enqueue({'k': k}); time.sleep(0.05)\n", str(tmp_path))
        stop = threading.Event()
        late: list[tuple[str, float]] = []
        got: list[str] = []

        def waiter() -> None:
            while not stop.is_set():
                job = q.lease_one(wait=0.5)
                if job is None:
                    continue
                now = time.time()
                if job.lease_deadline < now:
                    late.append((job.id, job.lease_deadline - now))
                got.append(job.id)
                with contextlib.suppress(NotLeasedError):  # the ack too may wait past the 50 ms
                    q.ack(job)

        def busy() -> None:
            while not stop.is_set():
                q.list_jobs()

        ts = [threading.Thread(target=waiter) for _ in range(4)] + [threading.Thread(target=busy)]
        for t in ts:
            t.start()
        assert producer.wait(60) == 0
        deadline = time.monotonic() + 30
        while len(set(got)) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for t in ts:
            t.join()
        assert not late, late[:5]
        assert len(set(got)) == 30


def test_threads_reading_one_jobs_payload_at_once_all_get_it(tmp_path):
    """A leased job's payload is decoded on its first read; threads that share the job (a pool,
    a logging thread) and read it at the same moment must each get the payload, never an error
    from catching the decode half done.  The interpreter switches threads every microsecond
    here, so that reads interleave."""
    errors: collections.Counter[str] = collections.Counter()
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with Queue(tmp_path) as q:
            for _ in range(4):
                q.enqueue_many([{"n": i, "pad": list(range(20))} for i in range(2000)])
                jobs = q.lease(2000)

                def read(jobs: list = jobs) -> None:
                    for job in jobs:
                        try:
                            if job.payload["pad"][19] != 19:
                                errors["wrong payload"] += 1
                        except Exception as exc:  # noqa: BLE001  (counted, asserted below)
                            errors[type(exc).__name__] += 1

                threads = [threading.Thread(target=read) for _ in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                q.ack_many(jobs)
    finally:
        sys.setswitchinterval(before)
    assert not errors, dict(errors)


def test_every_waiting_thread_is_registered_as_claiming_however_the_threads_interleave(tmp_path):
    """Threads that wait in the C call register as claiming (so that their own reaper leaves a
    lease it took alone until it is recorded) and settle without the queue lock.  With a thread
    switch after nearly every bytecode, every waiting thread is registered while it waits, and
    none is left registered once they all returned."""
    import sys
    import threading

    n = 8
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with Queue(tmp_path, durability="none") as q:
            assert q.lease(1) == []
            for _ in range(30):
                start = threading.Barrier(n)

                def wait(start: threading.Barrier = start) -> None:
                    start.wait()  # all at once: their registrations contend
                    q.lease_one(wait=0.3)

                threads = [threading.Thread(target=wait) for _ in range(n)]
                for t in threads:
                    t.start()
                deadline = time.monotonic() + 5
                while q.introspect()["claiming"] < n and time.monotonic() < deadline:
                    time.sleep(0.005)
                assert q.introspect()["claiming"] == n  # all of them, while they wait
                for t in threads:
                    t.join(10)
                assert q.introspect()["claiming"] == 0
    finally:
        sys.setswitchinterval(old)
