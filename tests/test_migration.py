"""Another library's queue is never mistaken for an empty ringq queue; nobroker queues import.

The nobroker queues here are written by the nobroker package itself (a test extra), in real
processes, one of them SIGKILLed.  Also the CLI's messages and options that people moving over
meet first: what `ack --token` says, `list --limit 0`, `list_jobs("delayed")` and `work -v`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import ringq
from ringq import ForeignQueueError, NotLeasedError, Queue
from ringq.cli import main

nobroker = pytest.importorskip("nobroker", reason="nobroker==0.1.2 comes with the test extra")


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringq", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def nobroker_queue(path, name="default") -> dict:
    """A nobroker queue with one job in each state; returns {id: what nobroker says of it}."""
    q = nobroker.Queue(path, name, max_attempts=2, backoff=nobroker.BackoffPolicy(base=0, jitter=0))
    q.enqueue({"n": 1}, priority=7, job_id="ready-1")
    q.enqueue("later", delay=3600, job_id="delayed-1")
    q.enqueue("poison", job_id="dead-1", max_attempts=1)
    q.enqueue("retry", job_id="retried-1")
    q.enqueue("fine", job_id="done-1")
    for job in q.lease(5, visibility_timeout=60):
        if job.id == "dead-1":
            q.nack(job, error="ValueError: poison")
        elif job.id == "retried-1":
            q.nack(job, error="timeout", delay=0)
        elif job.id == "done-1":
            q.ack(job)
        else:
            q.nack(job, delay=0)
    out = {j.id: j for j in q.list_jobs()}
    q.close()
    return out


def test_opening_a_nobroker_directory_is_refused_in_one_line(tmp_path):
    d = str(tmp_path / "jobs")
    nobroker_queue(d)
    with pytest.raises(ForeignQueueError, match=r"ringq import-nobroker") as exc:
        Queue(d)
    assert "\n" not in str(exc.value) and "nobroker" in str(exc.value)
    assert not os.path.exists(os.path.join(d, "default.ctl"))  # nothing created beside the old jobs
    proc = cli("-d", d, "stats")
    assert proc.returncode == 1 and "ringq import-nobroker" in proc.stderr and proc.stderr.count("\n") == 1
    with pytest.raises(ForeignQueueError, match=r"ringq import-nobroker"):  # any name, not only the log's
        Queue(d, "other")
    assert cli("-d", d, "-q", "other", "enqueue", "x").returncode == 1
    assert not any(f.endswith(".ctl") for f in os.listdir(d))  # nothing created for either name


# What each command that takes a queue needs besides the queue; the commands that do not open
# one (import-nobroker reads it on purpose) are left out.
COMMAND_ARGS = {
    "enqueue": ["x"], "lease": [], "ack": ["abc"], "nack": ["abc"], "stats": [], "get": ["abc"],
    "cancel": ["abc"], "pause": [], "resume": [], "list": [], "dlq": [], "purge": ["--yes"],
    "inspect": [], "verify": [], "upgrade": ["{d}"], "compact": [], "recover": [],
    "work": ["json:dumps", "--idle-timeout", "1"], "metrics": ["--port", "0"],
    "dashboard": ["--port", "0"], "top": ["--once"], "migrate": ["{d}", "{d}2"],
    "schedule": ["list"],
}
NOT_A_QUEUE = {"import-nobroker", "demo", "bench"}


SERVES = {"work", "metrics", "dashboard", "top"}  # run in a child: if one did not refuse, it would serve


def test_every_command_refuses_a_nobroker_directory_and_creates_nothing(tmp_path, capsys):
    d = str(tmp_path / "jobs")
    nobroker_queue(d)
    before = sorted(os.listdir(d))
    assert main(["no-such-command"]) == 2
    listed = re.search(r"choose from (.*?)\)", capsys.readouterr().err).group(1)
    commands = set(re.findall(r"'([a-z-]+)'", listed))
    assert commands - NOT_A_QUEUE == set(COMMAND_ARGS)  # a new command gets an entry here
    for name, extra in COMMAND_ARGS.items():
        argv = ["-d", d, name, *(a.format(d=d) for a in extra)]
        if name in SERVES:
            proc = cli(*argv)
            rc, err = proc.returncode, proc.stderr
        else:
            rc, err = main(argv), capsys.readouterr().err
        assert rc == 1, (name, err)
        assert "ringq import-nobroker" in err and err.count("\n") == 1, name
    assert sorted(os.listdir(d)) == before and not os.path.exists(d + "2")


def test_after_an_import_in_place_python_aio_and_the_cli_all_open_the_directory(tmp_path):
    import asyncio

    import ringq.aio

    d = str(tmp_path / "jobs")
    nobroker_queue(d)
    with pytest.raises(ForeignQueueError):
        ringq.aio.Queue(d)
    assert cli("import-nobroker", d).returncode == 0
    stats = cli("-d", d, "--json", "stats")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["total"] == 4
    with Queue(d, "default") as q, Queue(d, "other") as other:
        assert q.stats().total == 4 and other.stats().total == 0
    assert cli("-d", d, "-q", "other", "stats").returncode == 0

    async def aio_opens():
        async with ringq.aio.Queue(d) as aq:
            assert aq.running() == []

    asyncio.run(aio_opens())
    again = json.loads(cli("--json", "import-nobroker", d).stdout)["queues"]["default"]
    assert again["imported"] == 0 and again["existing"] == 4


def test_import_keeps_ids_attempts_priorities_due_times_and_dead_jobs(tmp_path):
    d = str(tmp_path / "jobs")
    before = nobroker_queue(d)
    proc = cli("--json", "import-nobroker", d)
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)["queues"]["default"]
    assert counts == dict(imported=4, existing=0, ready=2, delayed=1, dead=1, leased=0, done=1)
    with Queue(d) as q:
        jobs = {j.id: j for j in q.list_jobs()}
        assert set(jobs) == {"ready-1", "delayed-1", "dead-1", "retried-1"}  # the finished job stays behind
        for jid, job in jobs.items():
            old = before[jid]
            assert (job.payload, job.priority, job.attempts, job.max_attempts) == (
                old.payload, old.priority, old.attempts, old.max_attempts), jid
        assert jobs["dead-1"].state is ringq.JobState.DEAD and jobs["dead-1"].last_error == "ValueError: poison"
        assert jobs["retried-1"].last_error == "timeout"
        assert abs(jobs["delayed-1"].available_at - before["delayed-1"].available_at) < 0.01
        assert [j.id for j in q.list_jobs("delayed")] == ["delayed-1"]
        first = q.lease_one()
        assert first.id == "ready-1" and first.attempts == before["ready-1"].attempts + 1  # priority 7 first
        q.ack(first)
        stats = q.stats()  # the imported jobs count as enqueued here, so acks never outnumber them
        assert (stats.enqueued_total, stats.acked_total) == (4, 1)


def test_import_rerun_after_a_kill_adds_nothing_twice(tmp_path):
    d = str(tmp_path / "jobs")
    into = str(tmp_path / "ringq")
    # A queue written by a nobroker producer process that was SIGKILLed mid-stream.
    code = ("import sys, nobroker\nq = nobroker.Queue(sys.argv[1])\ni = 0\n"
            "while True:\n    q.enqueue({'i': i}, job_id=f'job-{i}')\n    i += 1\n"
            "    if i == 50: print('50', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, d], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "50"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with nobroker.Queue(d) as nq:
        n = nq.stats().total
    # An import SIGKILLed at once, then a full one, then one more: every job exactly once.
    killed = subprocess.Popen([sys.executable, "-m", "ringq", "import-nobroker", d, "--into", into])
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    first = json.loads(cli("--json", "import-nobroker", d, "--into", into).stdout)["queues"]["default"]
    again = json.loads(cli("--json", "import-nobroker", d, "--into", into).stdout)["queues"]["default"]
    assert first["imported"] + first["existing"] == n and again == dict(first, imported=0, existing=n)
    with Queue(into) as q:
        ids = [j.id for j in q.list_jobs()]
    assert len(ids) == len(set(ids)) == n and ids[:3] == ["job-0", "job-1", "job-2"]


def test_import_a_named_queue_and_a_missing_one(tmp_path):
    d = str(tmp_path / "jobs")
    nobroker_queue(d, "emails")
    assert main(["import-nobroker", d, "--name", "nope"]) == 1
    assert main(["import-nobroker", str(tmp_path / "empty")]) == 2
    from ringq.local.nobroker import import_nobroker

    res = import_nobroker(d, names=["emails"])
    assert res.queues["emails"]["imported"] == 4
    with Queue(d, "emails") as q:
        assert q.stats().total == 4


def test_an_errand_sqlite_file_is_named_for_what_it_is(tmp_path):
    path = tmp_path / "jobs.db"
    con = sqlite3.connect(path)
    con.execute("create table jobs (id text primary key, status text)")
    con.commit()
    con.close()
    with pytest.raises(ForeignQueueError, match="SQLite database") as exc:
        Queue(path)
    assert "errand" in str(exc.value) and "\n" not in str(exc.value)
    from ringq.aio import Queue as AioQueue

    with pytest.raises(ForeignQueueError, match="SQLite database"):
        AioQueue(path)


# -- messages and limits --------------------------------------------------------------------------------


def test_a_token_never_issued_is_not_called_stale(tmp_path):
    d = str(tmp_path / "q")
    with Queue(d) as q:
        job = q.enqueue("x")
    assert cli("-d", d, "lease", "--timeout", "0.2").returncode == 0  # token 1
    proc = cli("-d", d, "ack", job.id, "--token", "7")
    assert proc.returncode == 1
    assert "token 7 was never issued" in proc.stderr and "stale" not in proc.stderr
    with Queue(d, visibility_timeout=0.1) as q:
        deadline = time.monotonic() + 10
        second = None
        while second is None and time.monotonic() < deadline:
            second = q.lease_one()
        stale = ringq.Job.from_dict(dict(second.to_dict(), lease_token="1"))
        with pytest.raises(NotLeasedError, match="token 1 is stale: the job was leased again"):
            q.ack(stale)
        q.ack(second)
        with pytest.raises(NotLeasedError, match="it is done, not leased \\(it was already acked\\)"):
            q.nack(second)
        with pytest.raises(NotLeasedError, match="was never issued"):
            q.ack(ringq.Job.from_dict(dict(second.to_dict(), lease_token="abc")))


def test_list_jobs_delayed_and_limit_zero_mean_the_same_everywhere(tmp_path):
    d = str(tmp_path / "q")
    with Queue(d) as q:
        q.enqueue_many(["a", "b"])
        q.enqueue("later", delay=3600)
        assert [j.payload for j in q.list_jobs("delayed")] == ["later"]
        assert [j.payload for j in q.list_jobs("ready")] == ["a", "b", "later"]
        with pytest.raises(ValueError, match="state must be one of"):
            q.list_jobs("sleeping")
    for args in (["list"], ["dlq"]):
        everything = cli("-d", d, "--json", *args)
        zero = cli("-d", d, "--json", *args, "--limit", "0")
        assert zero.returncode == 0 and json.loads(zero.stdout) == json.loads(everything.stdout)
    assert len(json.loads(cli("-d", d, "--json", "list", "--limit", "0").stdout)) == 3
    assert [j["payload"] for j in json.loads(cli("-d", d, "--json", "list", "--state", "delayed").stdout)] == ["later"]


def test_work_verbose_shows_the_handler_traceback(tmp_path):
    (tmp_path / "failing_handler.py").write_text(
        "def handle(job):\n    inner(job)\n\n\ndef inner(job):\n    raise KeyError('missing-field')\n")
    d = str(tmp_path / "q")
    assert cli("-d", d, "enqueue", "x", "--max-attempts", "1").returncode == 0
    quiet = cli("-d", d, "work", "failing_handler:handle", "--idle-timeout", "0.3", cwd=tmp_path)
    assert quiet.returncode == 0 and "Traceback" not in quiet.stderr and "missing-field" in quiet.stderr
    assert cli("-d", d, "dlq", "--requeue").returncode == 0
    loud = cli("-d", d, "work", "failing_handler:handle", "--idle-timeout", "0.3", "-v", cwd=tmp_path)
    assert loud.returncode == 0
    assert "Traceback (most recent call last)" in loud.stderr and "in inner" in loud.stderr


def test_a_leased_job_imported_counts_its_lease_as_an_attempt(tmp_path):
    d = str(tmp_path / "jobs")
    nq = nobroker.Queue(d, max_attempts=1)
    nq.enqueue("last", job_id="last-try")
    nq.enqueue("more", job_id="has-more", max_attempts=3)
    leased = {j.id: j for j in nq.lease(2, visibility_timeout=1)}
    assert leased["last-try"].attempts == 1 == leased["last-try"].max_attempts
    nq.close()
    proc = cli("--json", "import-nobroker", d)
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)["queues"]["default"]
    assert counts["leased"] == 2 and counts["dead"] == 1 and counts["imported"] == 2
    with Queue(d) as q:
        dead = q.get("last-try")
        assert dead.state is ringq.JobState.DEAD and dead.attempts == 1
        assert "lease" in dead.last_error and "import" in dead.last_error
        retry = q.get("has-more")
        assert retry.state is ringq.JobState.READY and retry.attempts == 1
        assert abs(retry.available_at - leased["has-more"].lease_deadline) < 0.01
        deadline = time.time() + 30
        got = []
        while time.time() < deadline and not got:  # due once the nobroker lease would have expired
            got = q.lease(5)
            if not got:
                time.sleep(0.05)
        assert [(j.id, j.attempts) for j in got] == [("has-more", 2)]
        assert q.lease_one() is None


def test_a_lease_from_before_requeue_dead_is_refused_as_requeued_and_tokens_restart(tmp_path):
    with Queue(str(tmp_path / "q"), max_attempts=1) as q:
        q.enqueue("x", job_id="a")
        old = q.lease_one()
        assert old.lease_token == "1"
        q.nack(old, error="boom")
        assert q.requeue_dead("a") == 1
        with pytest.raises(NotLeasedError, match="the job was requeued .* since this lease"):
            q.ack(old)  # a Job object is fenced across the requeue
        new = q.lease_one()
        assert new.lease_token == "1"  # a new life of the job: tokens start again
        assert cli("-d", str(tmp_path / "q"), "ack", "a", "--token", "1").returncode == 0  # a bare id is not
        q.enqueue("y", job_id="b")
        held = q.lease_one()
        q.purge()
        with pytest.raises(NotLeasedError, match="it was purged"):
            q.ack(held)


def test_on_redis_tokens_keep_growing_across_requeue_dead(redis_url):
    q = ringq.connect(redis_url, "requeue-tokens", max_attempts=1)
    try:
        q.enqueue("x", job_id="a")
        old = q.lease_one()
        q.nack(old, error="boom")
        assert q.requeue_dead("a") == 1
        with pytest.raises(NotLeasedError):
            q.ack(old)
        assert q.lease_one().lease_token == "2"
    finally:
        q.purge()
        q.close()
