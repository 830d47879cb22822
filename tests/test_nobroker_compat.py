"""Switching from nobroker is a change of import: the same program runs on nobroker 0.1.2 and ringq.

Every test here takes the library as a parameter (``lib`` is the ``nobroker`` or the ``ringq``
module) and runs the same code on both, so a difference shows up as a failure on one side only.
Calls whose results legitimately differ (text of messages, id format) are not compared.
docs/migration.md lists every public name and CLI form of nobroker and where ringq stands.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

nobroker = pytest.importorskip("nobroker", reason="nobroker==0.1.2 comes with the test extra")

LIBS = ["nobroker", "ringq"]

NOBROKER_ALL = [
    "BackoffPolicy", "CompactionError", "CompactionResult", "CorruptLogError", "Job", "JobNotFoundError",
    "JobState", "LockTimeoutError", "NobrokerError", "NotLeasedError", "Queue", "QueueClosedError",
    "QueueStats", "RecoveryReport", "SerializationError", "Worker", "WorkerStats", "__version__",
]


@pytest.fixture(params=LIBS)
def lib(request):
    return importlib.import_module(request.param)


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def test_nobroker_public_names_all_exist(lib):
    assert sorted(nobroker.__all__) == sorted(NOBROKER_ALL)
    for name in NOBROKER_ALL:
        assert hasattr(lib, name), name
    for err in ("CompactionError", "CorruptLogError", "JobNotFoundError", "LockTimeoutError", "NotLeasedError",
                "QueueClosedError", "SerializationError"):
        assert issubclass(getattr(lib, err), lib.NobrokerError)
    assert isinstance(lib.__version__, str)
    # nobroker's four states, in its order; ringq adds two terminal ones after them (docs/lifecycle.md)
    # and the state of a job waiting for its parents (docs/workflows.md)
    extra = ["cancelled", "expired", "deferred"] if lib.__name__ == "ringq" else []
    assert [s.value for s in lib.JobState] == ["ready", "leased", "done", "dead", *extra]


def test_nobroker_error_is_ringq_base_error():
    import ringq

    assert ringq.NobrokerError is ringq.RingqError
    assert ringq.CorruptLogError is ringq.CorruptionError


def test_queue_open_enqueue_get_and_types(lib, tmp_path):
    q = lib.Queue(tmp_path / "jobs", "emails", fsync=True, visibility_timeout=30.0, max_attempts=3,
                  backoff=lib.BackoffPolicy(base=0.01, factor=2.0, max_delay=1.0, jitter=0.0), lock_timeout=5.0)
    with q:
        assert isinstance(q.path, pathlib.Path)
        assert isinstance(q.recovery, lib.RecoveryReport)
        assert q.recovery.repaired is False
        assert q.recovery.describe().startswith("clean")
        job = q.enqueue({"to": "ada"}, priority=2, delay=0.0, max_attempts=4, job_id="mail-1")
        assert isinstance(job, lib.Job)
        assert (job.id, job.payload, job.priority, job.max_attempts, job.state) == (
            "mail-1", {"to": "ada"}, 2, 4, lib.JobState.READY)
        assert job.attempts == 0 and job.lease_token is None and job.lease_deadline is None
        again = q.enqueue({"to": "someone else"}, job_id="mail-1")  # idempotent id: the existing job
        assert again.payload == {"to": "ada"}
        got = q.get("mail-1")
        assert got.id == "mail-1" and got.enqueued_at <= time.time()
        with pytest.raises(lib.JobNotFoundError):
            q.get("no-such-job")
        with pytest.raises(lib.SerializationError):
            q.enqueue(object())
        many = q.enqueue_many(["a", "b"], priority=1, delay=60.0, max_attempts=2, job_ids=["m-a", "m-b"])
        assert [j.id for j in many] == ["m-a", "m-b"] and all(j.available_at > time.time() + 50 for j in many)
        with pytest.raises(ValueError):
            q.enqueue_many(["a"], job_ids=["x", "y"])
        assert len(q) == 3
        st = q.stats()
        assert isinstance(st, lib.QueueStats)
        assert (st.ready, st.delayed, st.leased, st.done, st.dead, st.total) == (1, 2, 0, 0, 0, 3)
        assert {"ready", "delayed", "leased", "done", "dead", "total"} <= set(st.to_dict())
        assert [j.id for j in q.list_jobs()] == ["mail-1", "m-a", "m-b"]
        assert [j.id for j in q.list_jobs("ready", limit=2)] == ["mail-1", "m-a"]
        assert [j.id for j in q.list_jobs(lib.JobState.READY)] == ["mail-1", "m-a", "m-b"]
        assert q.list_jobs(lib.JobState.DONE) == []
    with pytest.raises(lib.QueueClosedError):
        q.enqueue("late")
    q.close()  # idempotent


def test_job_methods(lib, tmp_path):
    with lib.Queue(tmp_path / "jobs") as q:
        q.enqueue({"n": 1}, priority=5)
        job = q.lease_one(visibility_timeout=30)
        assert isinstance(job.lease_token, str) and isinstance(job.version, int)
        copy = job.snapshot()
        assert copy is not job and copy.to_dict() == job.to_dict()
        assert not job.is_eligible(time.time())  # leased
        d = job.to_dict()
        assert {"id", "payload", "priority", "state", "attempts", "max_attempts", "available_at", "enqueued_at",
                "lease_deadline", "lease_token", "last_error", "seq"} <= set(d)
        json.dumps(d)
        back = lib.Job.from_dict(d)
        assert back.to_dict() == d and back.state is lib.JobState.LEASED
        q.ack(back)  # a job rebuilt from its dict still carries its fencing token
        assert q.get(job.id).state is lib.JobState.DONE
        ready = lib.Job.from_dict({"id": "x", "payload": None, "state": "ready", "available_at": 10.0})
        assert ready.is_eligible(10.0) and not ready.is_eligible(9.0)
        assert q.get(job.id).version != job.version  # the ack changed the state


def test_lease_ack_nack_extend_dead_letter(lib, tmp_path):
    backoff = lib.BackoffPolicy(base=0.0, factor=1.0, max_delay=0.0, jitter=0.0)
    with lib.Queue(tmp_path / "jobs", max_attempts=2, backoff=backoff) as q:
        with pytest.raises(ValueError):
            q.lease(0)
        a, b = q.enqueue("a"), q.enqueue("b", priority=9)
        jobs = q.lease(5, visibility_timeout=30)
        assert [j.payload for j in jobs] == ["b", "a"]  # higher priority first
        assert all(j.state is lib.JobState.LEASED and j.attempts == 1 for j in jobs)
        assert q.lease_one() is None
        jb, ja = jobs
        before = jb.lease_deadline
        extended = q.extend(jb, 60)
        assert extended.lease_deadline > before and extended.state is lib.JobState.LEASED
        q.ack(jb)
        q.ack(jb)  # acking twice with the same lease is not an error
        q.ack(jb.id)  # nor by bare id
        again = q.nack(ja, error="boom", delay=0.0)
        assert again.state is lib.JobState.READY and again.last_error == "boom" and again.attempts == 1
        with pytest.raises(lib.NotLeasedError):
            q.nack(ja)  # not leased any more
        ja2 = q.lease_one()
        assert ja2.id == a.id and ja2.attempts == 2 and ja2.lease_token != ja.lease_token
        with pytest.raises(lib.NotLeasedError):
            q.ack(ja)  # the first holder's token is stale
        dead = q.nack(ja2.id, error="again")  # attempts used up: dead-lettered (by bare id)
        assert dead.state is lib.JobState.DEAD
        assert [j.id for j in q.dlq()] == [a.id] and q.dlq(limit=0) == []
        assert q.stats().dead == 1
        with pytest.raises(lib.NotLeasedError):
            q.requeue_dead(b.id)  # not dead
        assert q.requeue_dead(a.id) == 1
        revived = q.get(a.id)
        assert revived.state is lib.JobState.READY and revived.attempts == 0
        assert q.requeue_dead() == 0
        assert q.purge() >= 1
        assert q.stats().total == 0


def test_repeated_ack_by_the_holder_is_fine_and_a_stale_holders_ack_is_refused(lib, tmp_path):
    with lib.Queue(tmp_path / "jobs", visibility_timeout=0.2) as q:
        q.enqueue("x")
        first = q.lease_one()
        second = wait_for(lambda: q.lease_one(visibility_timeout=30))  # after the first lease expired
        assert second.id == first.id
        with pytest.raises(lib.NotLeasedError):
            q.ack(first)  # stale: the job is leased by someone else now
        q.ack(second)
        q.ack(second)  # the holder's own repeated ack is fine
        if lib.__name__ == "ringq":
            # nobroker accepts any ack of a finished job; ringq still refuses the stale holder's,
            # whose handler may have done its work after someone else's (docs/migration.md).
            with pytest.raises(lib.NotLeasedError, match="stale"):
                q.ack(first)


def test_compact_reports_a_compaction_result(lib, tmp_path):
    with lib.Queue(tmp_path / "jobs") as q:
        q.enqueue("keep")
        res = q.compact()
        assert isinstance(res, lib.CompactionResult)
        assert res.jobs_kept == 1 and res.jobs_dropped == 0
        assert res.bytes_reclaimed == res.bytes_before - res.bytes_after
        assert res.describe().startswith("compacted ")
        assert q.lease_one().payload == "keep"


def test_worker_positional_arguments_and_stats(lib, tmp_path):
    with lib.Queue(tmp_path / "jobs") as q:
        q.enqueue_many(list(range(6)))
        seen = []

        def handler(job):
            if job.payload == 3:
                raise ValueError("three")
            seen.append(job.payload)

        w = lib.Worker(q, handler, 2, 0.01, None, 0.3, False)  # nobroker's dataclass field order
        assert w.concurrency == 2 and w.max_jobs is None and w.idle_timeout == 0.3
        stats = w.run()
        assert isinstance(stats, lib.WorkerStats)
        assert (stats.leased, stats.succeeded, stats.failed, stats.dead, stats.lost_leases) == (6, 5, 1, 0, 0)
        assert set(stats.to_dict()) == {"leased", "succeeded", "failed", "dead", "lost_leases"}
        assert sorted(seen) == [0, 1, 2, 4, 5]
        w2 = lib.Worker(q, handler, max_jobs=1, handle_signals=False)
        w2.stop()
        w2.run()


def test_worker_logs_one_error_line_when_a_job_moves_to_the_dlq(lib, tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO)
    with lib.Queue(tmp_path / "jobs", backoff=lib.BackoffPolicy(base=0, jitter=0)) as q:
        job = q.enqueue("poison", max_attempts=2)

        def handler(j):
            raise RuntimeError("cannot digest")

        stats = lib.Worker(q, handler, idle_timeout=0.3, handle_signals=False).run()
        assert stats.dead == 1
    lines = [r for r in caplog.records if "moved to the DLQ" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (logging.ERROR, f"job {job.id} exhausted 2 attempts and moved to the DLQ")
    ]


def test_backoff_policy(lib):
    p = lib.BackoffPolicy(base=1.0, factor=2.0, max_delay=5.0, jitter=0.0)
    assert [p.delay_for(n) for n in range(5)] == [0.0, 1.0, 2.0, 4.0, 5.0]
    with pytest.raises(ValueError):
        lib.BackoffPolicy(jitter=2.0)


def test_fsync_false_still_works(lib, tmp_path):
    with lib.Queue(tmp_path / "jobs", fsync=False) as q:
        q.enqueue("fast")
    with lib.Queue(tmp_path / "jobs") as q:
        assert q.lease_one().payload == "fast"


# -- the command line -----------------------------------------------------------------------------------


def run_cli(lib, capsys, *argv):
    cli = importlib.import_module(f"{lib.__name__}.cli")
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_forms(lib, tmp_path, capsys):
    d = str(tmp_path / "cliq")
    rc, out, _ = run_cli(lib, capsys)
    assert rc == 2 and "usage" in out.lower()
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "enqueue", '{"a": 1}', "--priority", "3",
                         "--id", "k1", "--max-attempts", "4", "--delay", "0")
    assert rc == 0 and json.loads(out)[0]["id"] == "k1"
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "enqueue", "plain text", "--count", "2")
    assert rc == 0 and len(out.split()) == 2
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "lease", "-n", "2", "--timeout", "60")
    leased = json.loads(out)
    assert rc == 0 and [j["id"] for j in leased][0] == "k1" and len(leased) == 2
    assert all(isinstance(j["lease_token"], str) for j in leased)
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "ack", "k1")
    assert rc == 0 and json.loads(out) == {"acked": "k1"}
    rc, _, err = run_cli(lib, capsys, "-d", d, "-q", "jobs", "ack", "no-such-job")
    assert rc == 1 and "no-such-job" in err
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "nack", leased[1]["id"], "--error", "e",
                         "--delay", "0")
    assert rc == 0 and json.loads(out)["last_error"] == "e"
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "stats")
    assert rc == 0 and json.loads(out)["done"] == 1
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "list", "--state", "ready", "--limit", "5")
    assert rc == 0 and len(json.loads(out)) == 2
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "dlq")
    assert rc == 0 and json.loads(out) == []
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "dlq", "--requeue")
    assert rc == 0 and json.loads(out) == {"requeued": 0}
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "compact")
    assert rc == 0 and {"bytes_before", "bytes_after", "jobs_kept", "jobs_dropped"} <= set(json.loads(out))
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "recover")
    rep = json.loads(out)
    assert rc == 0 and rep["repaired"] is False and rep["ready"] == 2
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "recover")
    assert rc == 0 and out.startswith("clean")
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "-v", "inspect", "--limit", "2")
    assert rc == 0 and out
    rc, out, _ = run_cli(lib, capsys, "-d", d, "-q", "jobs", "--json", "purge", "--yes")
    # nobroker's compact dropped the acked job; ringq keeps it until its segment retires
    assert rc == 0 and json.loads(out) == {"purged": 2 if lib.__name__ == "nobroker" else 3}


def test_cli_work(lib, tmp_path, capsys, monkeypatch):
    (tmp_path / "compat_handlers.py").write_text("def handle(job):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    d = str(tmp_path / "cliq")
    run_cli(lib, capsys, "-d", d, "enqueue", "x", "--count", "3")
    rc, out, _ = run_cli(lib, capsys, "-d", d, "--json", "work", "compat_handlers:handle", "-c", "2",
                         "--max-jobs", "3", "--idle-timeout", "0.5", "--poll-interval", "0.05")
    assert rc == 0 and json.loads(out)["succeeded"] == 3


def test_the_listed_differences_hold(tmp_path):
    """docs/migration.md's list of differences, each checked against nobroker 0.1.2 itself."""
    import math
    import re
    import subprocess
    import sys

    import ringq

    with nobroker.Queue(tmp_path / "nb") as nq, ringq.Queue(tmp_path / "rq") as rq:
        assert nq.enqueue("x", priority=2**40).priority == 2**40
        with pytest.raises(ValueError, match="32-bit"):
            rq.enqueue("x", priority=2**40)
        for n in (0, 70000):
            assert nq.enqueue("x", max_attempts=n).max_attempts == n
            with pytest.raises(ValueError, match="65535"):
                rq.enqueue("x", max_attempts=n)
        for bad in (math.nan, math.inf):
            nq.enqueue(bad)
            with pytest.raises(ringq.SerializationError):
                rq.enqueue(bad)
        assert re.fullmatch(r"[0-9a-f]{32}", nq.enqueue("x").id)
        assert re.fullmatch(r"[0-9a-f]{16}", rq.enqueue("x").id)
        assert nq.enqueue("x", job_id="0123456789abcdef").id == "0123456789abcdef"
        with pytest.raises(ValueError):
            rq.enqueue("x", job_id="0123456789abcdef")
        with pytest.raises(ringq.RecordTooLargeError):
            rq.enqueue("y" * (4 * 1024 * 1024))
        nq.enqueue("y" * (4 * 1024 * 1024))

    def stats(mod, d):
        code = f"import sys, {mod}.cli as c; sys.exit(c.main(sys.argv[1:]))"
        out = subprocess.run([sys.executable, "-c", code, "-d", str(d), "stats"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert stats("nobroker", tmp_path / "nb").splitlines()[0].strip() == "ready: 8"
    assert stats("ringq", tmp_path / "rq").startswith("ready=1  delayed=0  leased=0")


# nobroker's own CLI tests (its tests/test_cli.py, each on a fresh directory), form by form: the
# argv after ``--dir DIR``, what it must print and the exit status.  ringq adds a warning on stderr
# where the queue does not exist (the typo guard), never a different status.
def _nobroker_forms(run):
    """``run(*argv)`` -> (status, stdout, stderr), each call on a fresh directory unless the argv
    starts with "same" (nobroker's test of named queues runs three commands on one)."""
    rc, out, _ = run("lease")
    assert (rc, "no eligible jobs" in out) == (0, True), out
    rc, out, _ = run("dlq")
    assert (rc, "empty" in out) == (0, True), out
    rc, _, _ = run("--queue", "emails", "enqueue", "send")
    assert rc == 0
    rc, out, _ = run("same", "--json", "stats")
    assert rc == 0 and json.loads(out)["total"] == 0, out
    rc, out, _ = run("same", "--json", "--queue", "emails", "stats")
    assert rc == 0 and json.loads(out)["total"] == 1, out
    rc, _, _ = run("work", "not-a-path")
    assert rc == 1
    rc, _, _ = run("work", "compat_handlers:no_such_function")
    assert rc == 1


@pytest.fixture
def handlers_cwd(tmp_path, monkeypatch):
    (tmp_path / "compat_handlers.py").write_text("def handle(job):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _fresh_dirs(root):
    """argv -> (a directory: a new one unless argv starts with "same", the rest of argv)."""
    dirs = iter(range(100))
    current = []

    def where(argv):
        if argv[0] == "same":
            return current[0], argv[1:]
        current[:] = [str(root / f"fresh{next(dirs)}")]
        return current[0], argv

    return where


def test_nobroker_cli_forms_in_process(lib, handlers_cwd, capsys):
    where = _fresh_dirs(handlers_cwd)

    def run(*argv):
        d, argv = where(argv)
        rc, out, err = run_cli(lib, capsys, "--dir", d, *argv)
        if lib.__name__ == "ringq" and argv[-1] in ("lease", "dlq"):
            assert "warning: no queue 'default'" in err and "check --dir and --queue" in err, err
            assert not os.path.exists(d)  # the guard creates nothing
        return rc, out, err

    _nobroker_forms(run)


def test_nobroker_cli_forms_as_processes(lib, handlers_cwd):
    entry = ["-m", "nobroker.cli"] if lib.__name__ == "nobroker" else ["-m", "ringq"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(handlers_cwd), *sys.path]))
    where = _fresh_dirs(handlers_cwd)

    def run(*argv):
        d, argv = where(argv)
        p = subprocess.run([sys.executable, *entry, "--dir", d, *argv], capture_output=True,
                           text=True, timeout=60, env=env, cwd=handlers_cwd)
        assert "Traceback" not in p.stderr, p.stderr
        return p.returncode, p.stdout, p.stderr

    _nobroker_forms(run)


def test_nobroker_bench_form_in_process(lib, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ringq's bench writes benchmarks/out under the working directory
    rc, out, _ = run_cli(lib, capsys, "--dir", str(tmp_path / "q"), "--json", "bench", "--jobs", "20")
    results = json.loads(out)
    assert rc == 0 and results and all("ops_per_sec" in row for row in results)


def test_nobroker_bench_form_as_a_process(tmp_path):
    # Every scenario runs in the in-process test above; here the command as a process, on one.
    p = subprocess.run([sys.executable, "-m", "ringq", "--dir", str(tmp_path / "q"), "--json", "bench", "--jobs",
                        "20", "--only", "single"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    results = json.loads(p.stdout)
    assert results and all("ops_per_sec" in row for row in results)
    enqueues = [r for r in results if r["variant"] == "enqueue x1"]
    assert enqueues and all(r["ops_per_sec"] > 0 and r["usec_per_op"] > 0 for r in enqueues)


def test_bench_takes_nobrokers_markdown_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import ringq

    rc, out, _ = run_cli(ringq, capsys, "bench", "--jobs", "5", "--only", "floor", "--markdown")
    assert rc == 0 and out.startswith("| scenario | system |"), out
