"""Job lifecycle: cancellation, expiry before start, pause and resume, progress (docs/lifecycle.md).

Real queues in real directories; the cross-process claims run real OS processes.  Waits are bounded
polls for a condition, never sleeps that a pass depends on.
"""

from __future__ import annotations

import functools
import os
import threading
import time

import pytest
from procs import run_py, spawn

from ringq import JobFinishedError, JobState, NotLeasedError, Queue
from ringq.worker import Worker


def _wait_for(cond, timeout: float = 20.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- cancellation -----------------------------------------------------------------------------------


def test_a_pending_or_delayed_job_is_cancelled_and_never_leased(tmp_path):
    with Queue(tmp_path) as q:
        a = q.enqueue("a")
        b = q.enqueue("b", delay=0.05)
        c = q.enqueue("c")
        assert q.cancel(a).state is JobState.CANCELLED
        assert q.cancel(b.id).state is JobState.CANCELLED
        assert q.cancel(a.id).state is JobState.CANCELLED  # again: harmless
        time.sleep(0.06)
        got = q.lease(10)
        assert [j.id for j in got] == [c.id]
        st = q.stats()
        assert (st.cancelled, st.done, st.ready, st.leased, st.total) == (2, 0, 0, 1, 3)
        assert [j.id for j in q.list_jobs("cancelled")] == [a.id, b.id]
        assert q.list_jobs("done") == []


def test_a_leased_job_is_cancel_requested_and_its_ack_recorded_as_cancelled(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue("x")
        job = q.lease_one()
        assert not job.cancel_requested
        marked = q.cancel(job.id)
        assert marked.state is JobState.LEASED and marked.cancel_requested
        ext = q.extend(job, 5)
        assert ext.cancel_requested and ext.lease_token == job.lease_token
        q.ack(job)
        assert q.get(job.id).state is JobState.CANCELLED
        assert q.stats().cancelled == 1 and q.stats().done == 0


def test_a_cancel_requested_job_is_not_retried_after_nack_or_lost_lease(tmp_path):
    with Queue(tmp_path, visibility_timeout=0.2) as q:
        q.enqueue("a")
        b = q.enqueue("b")
        ja, jb = q.lease(2)
        q.cancel(ja)
        q.cancel(jb)
        assert q.nack(ja, error="stopped").state is JobState.CANCELLED
        # jb's lease expires: reads show it as cancelled at once, and a reclaim makes it so
        _wait_for(
            lambda: q.get(b.id).state is JobState.CANCELLED, what="expired lease shown cancelled"
        )
        assert q.lease_one(wait=0.3) is None
        assert q.get(b.id).state is JobState.CANCELLED
        assert q.stats().cancelled == 2


def test_cancel_of_a_finished_job_is_a_typed_error(tmp_path):
    with Queue(tmp_path, max_attempts=1) as q:
        q.enqueue("d")
        q.enqueue("x")
        j = q.lease_one()
        q.ack(j)
        with pytest.raises(JobFinishedError, match="done"):
            q.cancel(j.id)
        k = q.lease_one()
        q.nack(k)
        with pytest.raises(JobFinishedError, match="dead"):
            q.cancel(k)


def test_a_stale_holder_cannot_ack_a_cancelled_job_as_done(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue("x")
        j = q.lease_one()
        q.cancel(j)
        q.ack(j)
        with pytest.raises(NotLeasedError, match="cancelled"):
            q.nack(j)


def _cancellable(marks: str, job) -> None:
    with open(marks, "a") as fh:
        fh.write(f"start {job.id}\n")
    end = time.monotonic() + 60
    while not job.cancelled.wait(0.01):
        if time.monotonic() > end:
            raise RuntimeError("never cancelled")
    with open(marks, "a") as fh:
        fh.write(f"cancelled {job.id}\n")


def test_a_running_handler_in_a_worker_child_is_cancelled_within_one_heartbeat(tmp_path):
    marks = tmp_path / "marks"
    marks.touch()
    qdir = tmp_path / "q"
    with Queue(qdir, visibility_timeout=30) as q:
        job = q.enqueue("long")
        w = Worker(
            q,
            functools.partial(_cancellable, str(marks)),
            processes=2,
            heartbeat=0.2,
            idle_timeout=1.0,
            handle_signals=False,
        )
        runner = threading.Thread(target=w.run)
        runner.start()
        _wait_for(lambda: f"start {job.id}" in marks.read_text(), what="the handler to start")
        t0 = time.monotonic()
        q.cancel(job.id)
        _wait_for(
            lambda: f"cancelled {job.id}" in marks.read_text(), what="the handler to see the cancel"
        )
        # one heartbeat (0.2 s) plus scheduling slack on a loaded machine
        assert time.monotonic() - t0 < 10
        runner.join(60)
        assert not runner.is_alive()
        assert q.get(job.id).state is JobState.CANCELLED


def test_cancel_from_another_process(tmp_path):
    with Queue(tmp_path) as q:
        job = q.enqueue("x")
        r = run_py(
            """
            import sys, ringq
            with ringq.Queue(sys.argv[1]) as q:
                print(q.cancel(sys.argv[2]).state.value)
            """,
            str(tmp_path),
            job.id,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "cancelled"
        assert q.get(job.id).state is JobState.CANCELLED
        assert q.lease_one() is None


# -- ringq.aio: cancel, pause, progress -------------------------------------------------------------


def test_aio_cancel_cancels_the_running_handler_task_and_records_it(tmp_path):
    import asyncio

    from ringq.aio import Queue as AioQueue
    from ringq.aio import Status

    queue = AioQueue(tmp_path, visibility_timeout=0.6)
    seen = {}

    @queue.handler("slow")
    async def slow(job):
        seen["started"] = True
        queue.progress(job, 0.25, "warming up")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise

    async def main():
        async with queue:
            jid = queue.submit("slow", {})
            pending = queue.submit("slow", {}, delay=30)
            while "started" not in seen:
                await asyncio.sleep(0.01)
            assert queue.get(jid).progress == 0.25
            assert queue.cancel(pending) and queue.get(pending).status is Status.FAILED
            assert queue.cancel(jid)
            t0 = time.monotonic()
            while queue.get(jid).status is Status.RUNNING:
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.02)
            job = queue.get(jid)
            assert (
                seen.get("cancelled")
                and job.status is Status.FAILED
                and job.error.startswith("Cancelled")
            )
            assert not queue.cancel(jid)  # finished

    asyncio.run(asyncio.wait_for(main(), 30))


def test_aio_progress_refuses_a_bad_report_before_it_looks_for_the_job(tmp_path):
    import asyncio
    import math

    from ringq.aio import Queue as AioQueue
    from ringq.aio import Status

    queue = AioQueue(tmp_path)
    bad = [((math.nan,), ValueError), (("0.5",), ValueError), ((True,), ValueError)]
    bad.append(((0.5, 123), TypeError))
    refused = []

    @queue.handler("work")
    async def work(job):
        queue.progress(job, 0.25, "a quarter")
        for args, error in bad:
            with pytest.raises(error):
                queue.progress(job, *args)
            refused.append(error)
        assert queue.get(job.id).progress == 0.25

    async def main():
        async with queue:
            jid = queue.submit("work", {})
            t0 = time.monotonic()
            while queue.get(jid).status is Status.RUNNING:
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.01)
            assert queue.get(jid).status is Status.DONE
            for args, error in bad:  # refused as such, though no job of that id runs here
                with pytest.raises(error):
                    queue.progress(queue.get(jid), *args)

    asyncio.run(asyncio.wait_for(main(), 30))
    assert refused == [error for _, error in bad]


def test_aio_pause_of_a_kind_stops_starting_its_jobs_until_resumed(tmp_path):
    import asyncio

    from ringq.aio import Queue as AioQueue
    from ringq.aio import Status

    queue = AioQueue(tmp_path)

    @queue.handler("k")
    async def k(job):
        return job.payload

    async def main():
        async with queue:
            queue.pause("k")
            jid = queue.submit("k", 7)
            await asyncio.sleep(0.3)
            assert queue.get(jid).status is Status.RUNNING  # queued, not started
            queue.resume("k")
            t0 = time.monotonic()
            while queue.get(jid).status is not Status.DONE:
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.02)
            assert queue.get(jid).result == 7

    asyncio.run(asyncio.wait_for(main(), 30))


# -- pause and resume -------------------------------------------------------------------------------

_LEASER = """
import sys, time, ringq
with ringq.Queue(sys.argv[1]) as q:
    print("ready", flush=True)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        job = q.lease_one(wait=1.0)
        if job is not None:
            q.ack(job)
            print("got", job.payload, time.time(), flush=True)
            break
"""


def test_a_paused_queue_leases_nothing_in_any_process_until_resumed(tmp_path):
    import subprocess

    with Queue(tmp_path) as q:
        q.enqueue("running")
        running = q.lease_one()
        q.pause()
        q.ack(running)  # jobs leased before the pause run on and are acked as usual
        procs = [spawn(_LEASER, str(tmp_path), stdout=subprocess.PIPE, text=True) for _ in range(3)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        q.enqueue_many([1, 2, 3])
        time.sleep(0.5)  # the claim under test is that nothing happens meanwhile
        assert q.stats().ready == 3 and q.stats().leased == 0 and q.stats().done == 1
        assert q.lease_one() is None
        resumed = time.time()
        q.resume()
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs)
        got = sorted(int(o.split()[1]) for o in outs if o.split()[1:])
        assert got == [1, 2, 3]
        assert all(float(o.split()[2]) >= resumed for o in outs)
        assert q.stats().done == 4


def test_pause_is_durable_across_reopen_and_seen_by_other_processes(tmp_path):
    with Queue(tmp_path) as q:
        q.enqueue("x")
        q.pause()
        assert q.paused() == {"queue": True, "keys": []}
    with Queue(tmp_path) as q:
        assert q.paused()["queue"] and q.lease_one() is None
    r = run_py(
        "import sys, ringq\nq = ringq.Queue(sys.argv[1]); q.resume(); q.close()", str(tmp_path)
    )
    assert r.returncode == 0, r.stderr
    with Queue(tmp_path) as q:
        assert not q.paused()["queue"]
        assert q.lease_one().payload == "x"


def test_paused_keys_are_kept_and_bounded(tmp_path):
    with Queue(tmp_path) as q:
        q.pause(key="emails")
        q.pause(key="emails")
        q.pause(key="pdf")
        assert q.paused() == {"queue": False, "keys": ["emails", "pdf"]}
        q.resume(key="emails")
        assert q.paused()["keys"] == ["pdf"]
        with pytest.raises(ValueError):
            q.pause(key="x" * 57)
        for i in range(62):
            q.pause(key=f"k{i}")
        with pytest.raises(ValueError, match="at most 63"):
            q.pause(key="one-too-many")
        # jobs carry no key on this format: a paused key holds back nothing here
        q.enqueue("free")
        assert q.lease_one().payload == "free"


def test_a_damaged_pause_file_is_set_aside_and_the_queue_runs(tmp_path):
    with Queue(tmp_path, "p") as q:
        q.pause()
        q.enqueue("x")
    path = tmp_path / "p.pause"
    data = bytearray(path.read_bytes())
    data[3] ^= 0x40  # a flipped bit in the magic
    path.write_bytes(bytes(data))
    with Queue(tmp_path, "p") as q:
        assert any("pause file damaged" in why for _p, why in q.recovery.repairs)
        assert (tmp_path / "p.pause.quarantined").exists()
        assert not q.paused()["queue"] and q.lease_one().payload == "x"
    from ringq.engine.verify import examine

    assert examine(str(tmp_path), "p").damage == [
        f"{tmp_path}/p.pause.quarantined: quarantined earlier: a pause file that failed validation "
        "at an open, which made a fresh, unpaused one (pauses set before then were dropped)"
    ]
    path.write_bytes(b"short")
    with Queue(tmp_path, "p") as q:
        assert q.paused() == {"queue": False, "keys": []}


def test_a_damaged_paused_key_entry_is_ignored(tmp_path):
    with Queue(tmp_path, "p") as q:
        q.pause(key="alpha")
        q.pause(key="beta")
    path = tmp_path / "p.pause"
    data = bytearray(path.read_bytes())
    data[64 + 8] ^= 0x01  # a bit of the first entry's key bytes: its CRC no longer matches
    path.write_bytes(bytes(data))
    with Queue(tmp_path, "p") as q:
        assert q.paused()["keys"] == ["beta"]


# -- expiry before start ----------------------------------------------------------------------------


def test_a_job_not_leased_before_it_expires_never_runs(tmp_path):
    with Queue(tmp_path) as q:
        soon = q.enqueue({"a": 1}, expires_in=0.05)
        later = q.enqueue([1, 2], expires_at=time.time() + 600)
        plain = q.enqueue(b"raw")
        assert soon.expires_at == pytest.approx(time.time() + 0.05, abs=1)
        time.sleep(0.1)
        got = q.lease(10)
        assert [j.id for j in got] == [later.id, plain.id]
        assert got[0].payload == [1, 2] and got[0].expires_at == pytest.approx(later.expires_at)
        assert got[1].payload == b"raw" and got[1].expires_at is None
        assert q.get(soon.id).state is JobState.EXPIRED and q.get(soon.id).payload == {"a": 1}
        st = q.stats()
        assert (st.expired, st.cancelled, st.leased, st.done) == (1, 0, 2, 0)
        assert [j.id for j in q.list_jobs("expired")] == [soon.id]
        with pytest.raises(JobFinishedError, match="expired"):
            q.cancel(soon.id)


def test_expiry_arguments_are_checked(tmp_path):
    with Queue(tmp_path) as q:
        with pytest.raises(ValueError):
            q.enqueue(1, expires_in=1, expires_at=time.time())
        with pytest.raises(ValueError):
            q.enqueue(1, expires_in=-1)
        assert q.stats().total == 0


def test_a_leased_job_does_not_expire_and_an_expired_one_stays_out_across_processes(tmp_path):
    with Queue(tmp_path) as q:
        keep = q.enqueue("keep", expires_in=0.3)
        gone = q.enqueue("gone", expires_in=0.05)
        job = q.lease_one()
        assert job.id == keep.id
        time.sleep(0.4)
        q.nack(job, delay=0)  # leased in time: a retry is not an expiry
        r = run_py(
            """
            import sys, ringq
            with ringq.Queue(sys.argv[1]) as q:
                print(",".join(str(j.payload) for j in q.lease(10)))
            """,
            str(tmp_path),
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "keep"
        assert q.get(gone.id).state is JobState.EXPIRED


def test_an_expiring_job_keeps_its_expiry_when_relocated(tmp_path):
    with Queue(tmp_path, slot_size=128, slot_count=16) as q:
        j = q.enqueue("late", delay=8, expires_at=time.time() + 3600, job_id="late")
        q.enqueue_many(list(range(40)))
        for job in q.lease(40):
            q.ack(job)
        q.compact()
        moved = q.get("late")
        assert moved.record_position != j.record_position  # relocated to the tail as a superseding copy
        assert moved.payload == "late" and moved.expires_at == pytest.approx(j.expires_at)


# -- progress ---------------------------------------------------------------------------------------


def test_progress_is_fenced_and_shown_by_get_and_list(tmp_path):
    with Queue(tmp_path, visibility_timeout=0.2) as q:
        q.enqueue("p")
        job = q.lease_one()
        q.progress(job, 0.5, "half way")
        got = q.get(job.id)
        assert (got.progress, got.progress_message) == (0.5, "half way")
        assert q.list_jobs("leased")[0].progress == 0.5
        with pytest.raises(ValueError):
            q.progress(job, 1.5)
        # the lease expires and another holder takes it: the stale holder is refused
        time.sleep(0.25)
        again = q.lease_one(wait=2)
        assert again.id == job.id and again.progress is None  # a new lease starts without progress
        with pytest.raises(NotLeasedError):
            q.progress(job, 0.9)
        q.progress(again, 0.1)
        assert q.get(job.id).progress == 0.1


def test_progress_reported_in_one_process_is_read_in_another(tmp_path):
    with Queue(tmp_path) as q:
        job = q.enqueue("p")
    r = run_py(
        """
        import sys, ringq
        with ringq.Queue(sys.argv[1]) as q:
            job = q.lease_one(detach=True)
            q.progress(job, 0.75, "three quarters")
        """,
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    with Queue(tmp_path) as q:
        got = q.get(job.id)
        assert (got.progress, got.progress_message) == (0.75, "three quarters")


def test_damaged_progress_frames_are_ignored(tmp_path):
    with Queue(tmp_path, "p") as q:
        q.enqueue("x")
        job = q.lease_one()
        q.progress(job, 0.25, "first")
        q.progress(job, 0.5, "second")
        seg = next(tmp_path.glob("p.*.prog"))
        data = bytearray(seg.read_bytes())
        data[-1] ^= 0x20  # the newest frame's text: its CRC fails
        seg.write_bytes(bytes(data))
        assert q.get(job.id).progress == 0.25
        seg.write_bytes(b"\xff" * 7)
        assert q.get(job.id).progress is None
        q.ack(job)


# -- verify -----------------------------------------------------------------------------------------


def test_verify_counts_cancelled_and_expired_and_flags_a_damaged_pause_file(tmp_path):
    from ringq.engine.verify import examine

    with Queue(tmp_path, "v") as q:
        q.cancel(q.enqueue("c"))
        e = q.enqueue({"exp": 1}, expires_at=time.time() - 1)
        q.enqueue("plain")
        assert q.lease_one().payload == "plain"
        assert q.get(e.id).state is JobState.EXPIRED
        q.pause()
    rep = examine(str(tmp_path), "v")
    counts = {}
    for seg in rep.segments:
        for k, v in seg.counts.items():
            counts[k] = counts.get(k, 0) + v
    assert counts == {"cancelled": 1, "expired": 1, "leased": 1}
    assert not rep.damaged
    previews = [r.preview for seg in rep.segments for r in seg.records]
    assert '{"exp":1}' in previews  # the expiry field is not shown as payload
    path = tmp_path / "v.pause"
    path.write_bytes(b"\0" * 4096)
    assert any("damaged pause file" in d for d in examine(str(tmp_path), "v").damaged)


def test_bit_flips_in_the_pause_and_progress_files_never_crash_a_reader(tmp_path):
    import random
    import shutil

    base = tmp_path / "base"
    with Queue(base, "b") as q:
        q.enqueue_many(["a", "b"])
        job = q.lease_one(detach=True)
        q.progress(job, 0.5, "half")
        q.pause(key="k")
        q.pause()
    files = [base / "b.pause", *base.glob("b.*.prog")]
    assert len(files) == 2
    rng = random.Random(7)
    for f in files:
        size = f.stat().st_size
        for off in sorted(rng.sample(range(size), 24)) + [0, size - 1]:
            work = tmp_path / f"w-{f.name}-{off}"
            shutil.copytree(base, work)
            target = work / f.name
            data = bytearray(target.read_bytes())
            data[off] ^= 1 << rng.randrange(8)
            target.write_bytes(bytes(data))
            with Queue(work, "b") as q:
                state = q.paused()
                assert isinstance(state["queue"], bool)
                got = q.get(job.id)
                assert got.progress in (None, 0.5) or 0 <= got.progress <= 1
                assert q.stats().total == 2
                q.resume()
                q.lease(2)
            shutil.rmtree(work)


# -- results ----------------------------------------------------------------------------------------


def test_ack_with_a_result_keeps_it_for_result(tmp_path):
    import numpy as np

    from ringq import ResultNotFoundError

    with Queue(tmp_path, "r") as q:
        q.enqueue_many(["a", "b", "c", "d"])
        a, b, c, d = q.lease(4)
        with pytest.raises(ResultNotFoundError):
            q.result(a.id)
        q.ack(a, result={"sum": 3})
        q.ack(b, result=np.arange(6, dtype=">i2").reshape(2, 3))
        q.ack(c, result=None)  # JSON null is a result
        q.ack(d)
        assert q.result(a.id) == {"sum": 3}
        arr = q.result(b)
        assert arr.dtype == np.dtype(">i2") and arr.tolist() == [[0, 1, 2], [3, 4, 5]]
        assert q.result(c.id) is None
        with pytest.raises(ResultNotFoundError, match="without a result"):
            q.result(d.id, wait=30)  # finished without one: no wait
        assert q.get(a.id).state is JobState.DONE
        assert (tmp_path / "r-results.ctl").exists()


def test_a_stale_holder_stores_no_result_and_a_bad_result_acks_nothing(tmp_path):
    from ringq import ResultNotFoundError, SerializationError

    with Queue(tmp_path, "r", visibility_timeout=0.2) as q:
        q.enqueue("x")
        job = q.lease_one()
        with pytest.raises(SerializationError):
            q.ack(job, result=object())
        assert q.get(job.id).state is JobState.LEASED
        time.sleep(0.25)
        again = q.lease_one(wait=2)
        with pytest.raises(NotLeasedError):
            q.ack(job, result="stale")
        with pytest.raises(ResultNotFoundError):
            q.result(job.id)
        q.ack(again, result="fresh")
        q.ack(again, result="other")  # a repeated ack: harmless, stores nothing
        assert q.result(job.id) == "fresh"


@pytest.mark.parametrize("fresh", ["fresh", None])
def test_a_result_stored_while_its_lease_ran_out_is_never_the_jobs(tmp_path, fresh):
    # The holder checks its lease, then its result's store waits for the results queue's writer
    # lock (another holder of it); meanwhile the lease runs out and the job is leased again.  The
    # stale result is written, its ack refused: the job's result is the next holder's (or none),
    # while the job is retained and after its segment retired.
    import fcntl

    from ringq import JobNotFoundError, ResultNotFoundError

    with Queue(tmp_path, "r", slot_size=128, slot_count=16) as q:
        first = q.enqueue("x")
        with pytest.raises(ResultNotFoundError):
            q.result(first.id)  # opens the results queue: its lock file exists
        job = q.lease_one(visibility_timeout=0.3)
        fd = os.open(tmp_path / "r-results.lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        refused: list[Exception] = []

        def stale_ack() -> None:
            try:
                q.ack(job, result="stale")
            except NotLeasedError as exc:
                refused.append(exc)

        holder = threading.Thread(target=stale_ack)
        holder.start()
        time.sleep(0.4)
        again = q.lease_one(wait=2)
        assert again is not None and again.lease_token == "2"
        os.close(fd)
        holder.join(30)
        assert refused, "the stale holder's ack went in"
        with Queue(tmp_path, "r-results") as results:  # the race was run: the stale one is stored
            assert results.get(f"~{job.seq}.1~{job.id}").payload == "stale"
        if fresh is None:
            q.ack(again)
        else:
            q.ack(again, result=fresh)

        def check() -> None:
            if fresh is None:
                with pytest.raises(ResultNotFoundError, match="without a result"):
                    q.result(job.id)
            else:
                assert q.result(job.id) == fresh

        check()
        q.enqueue_many(list(range(40)))  # rotate past the job's segment, and finish it all
        for j in q.lease(40):
            q.ack(j)
        with pytest.raises(JobNotFoundError):
            q.get(job.id)  # retired: the record naming the accepted lease answers
        if fresh is not None:
            check()
        else:
            with pytest.raises(ResultNotFoundError):
                q.result(job.id)


def test_the_result_of_a_rerun_is_its_own_once_the_job_retired(tmp_path):
    from ringq import JobNotFoundError

    with Queue(tmp_path, "r", slot_size=128, slot_count=16) as q:
        q.enqueue("first", job_id="r")
        q.ack(q.lease_one(), result="one")
        q.enqueue("second", job_id="r", replace=True)
        q.ack(q.lease_one(), result="two")
        q.enqueue_many(list(range(40)))  # rotate past both runs' segment, and finish it all
        for j in q.lease(40):
            q.ack(j)
        with pytest.raises(JobNotFoundError):
            q.get("r")
        assert q.result("r") == "two"


def test_a_result_expires_after_its_ttl(tmp_path):

    with Queue(tmp_path, "r") as q:
        q.enqueue("x")
        job = q.lease_one()
        q.ack(job, result=1, result_ttl=0.2)
        assert q.result(job.id) == 1
        _wait_for(lambda: _no_result(q, job.id), what="the result to expire")
        with pytest.raises(ValueError):
            q.enqueue("y")
            q.ack(q.lease_one(), result=1, result_ttl=0)


def _no_result(q, job_id):
    from ringq import ResultNotFoundError

    try:
        q.result(job_id)
    except ResultNotFoundError:
        return True
    return False


def test_result_wait_is_woken_by_an_ack_in_another_process(tmp_path):
    import subprocess

    from ringq import ResultNotFoundError

    with Queue(tmp_path, "r") as q:
        job = q.enqueue({"n": 20})
        with pytest.raises(ResultNotFoundError, match="within"):
            q.result(job.id, wait=0.05)
        worker = spawn(
            """
            import sys, time, ringq
            with ringq.Queue(sys.argv[1], "r") as q:
                print("ready", flush=True)
                sys.stdin.readline()
                job = q.lease_one(wait=30)
                q.ack(job, result=job.payload["n"] * 2)
                print(time.time(), flush=True)
            """,
            str(tmp_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert worker.stdout.readline().strip() == "ready"
        got = {}
        waiter = threading.Thread(target=lambda: got.setdefault("r", q.result(job.id, wait=60)))
        waiter.start()
        time.sleep(0.2)
        assert waiter.is_alive()  # blocked, not returned early
        worker.stdin.write("go\n")
        worker.stdin.flush()
        acked_at = float(worker.stdout.readline())
        waiter.join(60)
        woke_at = time.time()
        assert got["r"] == 40
        assert worker.wait(60) == 0
        assert woke_at - acked_at < 30  # woken by the ack, far before the 60 s wait ran out


def test_result_of_a_cancelled_or_dead_job_raises_at_once(tmp_path):
    from ringq import ResultNotFoundError

    with Queue(tmp_path, "r", max_attempts=1) as q:
        c = q.enqueue("c")
        q.cancel(c)
        t0 = time.monotonic()
        with pytest.raises(ResultNotFoundError, match="cancelled"):
            q.result(c.id, wait=30)
        q.enqueue("d")
        q.nack(q.lease_one())
        with pytest.raises(ResultNotFoundError, match="dead"):
            q.result(q.dlq()[0].id, wait=30)
        assert time.monotonic() - t0 < 20


def test_progress_files_go_with_their_segment(tmp_path):
    with Queue(tmp_path, "s", slot_size=128, slot_count=8) as q:
        q.enqueue_many(list(range(8)))
        for job in q.lease(8):
            q.progress(job, 1.0)
            q.ack(job)
        q.enqueue_many(list(range(8)))  # rotates: the first segment is sealed, finished, retired
        q.compact()
        first = sorted(tmp_path.glob("s.*.prog"))
        assert all(p.name != "s.0000000000000001.prog" for p in first)


def test_cli_cancel_pause_resume_get_and_expiry(tmp_path):
    import json
    import subprocess
    import sys

    from procs import child_env

    def cli(*args):
        p = subprocess.run(
            [sys.executable, "-m", "ringq", "--dir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout

    a = cli("enqueue", "a").strip()
    cli("enqueue", "b", "--expires-in", "0.01")
    assert cli("pause").strip() == "queue paused"
    assert cli("lease").strip() == "no eligible jobs"
    assert json.loads(cli("--json", "pause", "--key", "pdf")) == {"queue": True, "keys": ["pdf"]}
    cli("resume", "--key", "pdf")
    assert cli("resume").strip() == "queue resumed"
    time.sleep(0.02)
    leased = cli("lease")
    assert leased.startswith(a) and "leased" in leased
    assert cli("lease").strip() == "no eligible jobs"  # b expired before anyone leased it
    with Queue(tmp_path) as q:
        q.progress(q.get(a), 0.5, "half")  # the snapshot carries the current token
    assert "progress=50% half" in cli("get", a)
    assert "50% half" in cli("list")
    assert cli("cancel", a).strip() == f"{a} cancel requested (its holder is told)"
    assert "cancel requested" in cli("list")
    cli("ack", a)
    assert json.loads(cli("--json", "get", a))["state"] == "cancelled"
    assert [j["id"] for j in json.loads(cli("--json", "list", "--state", "cancelled"))] == [a]
    stats = json.loads(cli("--json", "stats"))
    assert (stats["cancelled"], stats["expired"]) == (1, 1)


def test_a_long_queue_name_opens_and_refuses_only_results(tmp_path):
    name = "n" * 64
    with Queue(tmp_path, name) as q:
        q.enqueue("x")
        job = q.lease_one()
        with pytest.raises(ValueError, match="56 characters"):
            q.ack(job, result=1)
        q.ack(job)


def test_a_paused_key_is_passed_over_and_leased_after_resume(tmp_path, monkeypatch):
    # Records carry no key in this format; give every job a key from its slot's parity through
    # the one function that reads keys, to check how leases treat paused keys.
    from ringq.engine import lifecycle

    monkeypatch.setattr(lifecycle, "key_of", lambda seg, slot: "odd" if slot % 2 else "even")
    with Queue(tmp_path) as q:
        jobs = q.enqueue_many(list(range(10)))
        q.enqueue("late", delay=0.05)  # slot 10: an individually ordered (delayed) job, key even
        q.pause(key="even")
        got = q.lease(20, wait=0.2)
        assert sorted(j.payload for j in got) == [1, 3, 5, 7, 9]
        assert q.lease_one() is None  # the paused ones stay ready, and the call returns
        assert q.stats().ready + q.stats().delayed == 6
        q.resume(key="even")
        time.sleep(0.06)
        rest = q.lease(20)
        assert sorted(map(str, (j.payload for j in rest))) == ["0", "2", "4", "6", "8", "late"]
        assert len(jobs) == 10


_AIO_SERVER = """
import asyncio, sys
from ringq.aio import Queue

queue = Queue(sys.argv[1], visibility_timeout=0.6)

@queue.handler("slow")
async def slow(job):
    print("started", job.id, flush=True)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        print("cancelled", job.id, flush=True)
        raise

async def main():
    async with queue:
        jid = queue.submit("slow", {})
        while queue.get(jid).error is None:
            await asyncio.sleep(0.02)

asyncio.run(asyncio.wait_for(main(), 60))
"""


def test_aio_cancel_from_another_process_cancels_the_running_task(tmp_path):
    import asyncio
    import subprocess

    from ringq.aio import Queue as AioQueue
    from ringq.aio import Status

    server = spawn(_AIO_SERVER, str(tmp_path), stdout=subprocess.PIPE, text=True)
    first = server.stdout.readline().split()
    assert first[0] == "started", first
    jid = first[1]

    async def main():
        async with AioQueue(tmp_path) as queue:
            assert queue.cancel(jid)
            t0 = time.monotonic()
            while queue.get(jid).status is Status.RUNNING:
                assert time.monotonic() - t0 < 20
                await asyncio.sleep(0.02)
            assert queue.get(jid).error.startswith("Cancelled")

    asyncio.run(asyncio.wait_for(main(), 30))
    out, _ = server.communicate(timeout=60)
    assert server.returncode == 0
    assert f"cancelled {jid}" in out
