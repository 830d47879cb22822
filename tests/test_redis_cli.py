"""The command line on a Redis queue (--url) and ``ringq migrate`` between the two backends."""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from procs import child_env

import ringq
from ringq import JobState
from ringq.ids import migrated_id, source_tag


def cli(*args, rc=0):
    proc = subprocess.run(
        [sys.executable, "-m", "ringq", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == rc, proc.stdout + proc.stderr
    return proc


def test_commands_take_url_where_they_take_dir(redis_url):
    name = f"t{uuid.uuid4().hex[:12]}"
    common = ["--url", redis_url, "--queue", name, "--json"]
    [job] = json.loads(cli(*common, "enqueue", '{"to": "ada"}', "--priority", "3").stdout)
    [leased] = json.loads(cli("lease", *common).stdout)
    assert leased["id"] == job["id"] and leased["payload"] == {"to": "ada"}
    cli("ack", leased["id"], "--token", str(leased["lease_token"]), *common)
    assert json.loads(cli("stats", *common).stdout)["done"] == 1
    assert [j["state"] for j in json.loads(cli("list", *common).stdout)] == ["done"]
    err = cli("verify", *common, rc=2).stderr
    assert "does not apply to --url" in err and len(err.splitlines()) == 1


def make_local(path):
    q = ringq.Queue(path, max_attempts=2, backoff=ringq.BackoffPolicy(base=0, jitter=0))
    q.enqueue_many(["a", "b"], priority=4)
    q.enqueue("later", delay=600, job_id="later")
    q.enqueue("dies", job_id="dies")
    q.enqueue("keyed", job_id="order-1", priority=-2)
    for job in q.lease(10):
        q.nack(job, error=f"failed {job.payload}", delay=300 if job.payload == "a" else 0)
    q.nack(q.lease_one(), error="second failure")  # "b" again: dead after two attempts
    return q


def snapshot(q):
    """What a migration keeps.  A due time in the past is kept as "due" (it may become the time of
    the copy: still due, never later than a job enqueued after it)."""
    now = time.time()
    return {
        j.id: (
            j.payload,
            j.priority,
            j.attempts,
            j.max_attempts,
            j.state,
            j.last_error,
            None
            if j.state is JobState.DEAD
            else round(j.available_at, 2)
            if j.available_at > now
            else "due",
        )
        for j in q.list_jobs()
        if j.state in (JobState.READY, JobState.DEAD)
    }


def test_migrate_local_to_redis_and_back_keeps_jobs_and_reruns_add_nothing(redis_url, tmp_path):
    src = make_local(str(tmp_path / "src"))
    before = snapshot(src)
    assert any(s[4] is JobState.DEAD for s in before.values()) and len(before) == 5
    name = "default"
    url = (
        redis_url.rsplit("/", 1)[0] + "/3"
    )  # a database of its own: the CLI uses the default queue name
    dst = ringq.connect(url, name)
    dst.purge()
    tag = source_tag(src)  # jobs with automatic ids arrive as <tag>-<id>
    # as if a first run was killed midway
    dst.import_jobs(src.list_jobs(JobState.READY)[:2], source=tag)
    out = json.loads(cli("--json", "migrate", str(tmp_path / "src"), url).stdout)
    assert out == {"copied": 3, "present": 2, "leased_skipped": 0, "purged": 0}
    before = {migrated_id(tag, k): v for k, v in before.items()}
    assert snapshot(dst) == before
    assert dst.stats().enqueued_total == 5  # the jobs migrated in count as enqueued here
    assert json.loads(cli("--json", "migrate", str(tmp_path / "src"), url).stdout)["copied"] == 0
    assert dst.stats().enqueued_total == 5
    out = json.loads(cli("--json", "migrate", url, str(tmp_path / "back"), "--purge-source").stdout)
    assert out["copied"] == 5 and out["purged"] == 5 and len(dst) == 0
    back = ringq.Queue(str(tmp_path / "back"))
    assert snapshot(back) == before and back.stats().enqueued_total == 5
    assert (
        back.lease_one().id
        == [j for j in src.list_jobs(JobState.READY) if j.available_at <= time.time()][0].id
    )


def test_a_payload_larger_than_a_segment_migrates_only_into_a_queue_made_to_hold_it(
    redis_url, tmp_path
):
    # Redis stores a 5 MB payload; a directory of the default geometry holds records of 4 MiB.
    url = redis_url.rsplit("/", 1)[0] + "/4"
    src = ringq.connect(url)
    src.purge()
    src.enqueue_many(["small", b"x" * 5_000_000, "after"])
    err = cli("migrate", url, str(tmp_path / "dst"), "--purge-source", rc=1).stderr
    assert "record of 5000097 bytes" in err and "4194304 bytes" in err and len(err.splitlines()) == 1
    with ringq.Queue(tmp_path / "dst") as dst:
        assert dst.stats().total == 0  # all or nothing
    assert src.stats().ready == 3  # nothing purged
    ringq.Queue(tmp_path / "big", slot_size=1024, slot_count=8192).close()  # 8 MiB segments
    assert json.loads(cli("--json", "migrate", url, str(tmp_path / "big")).stdout)["copied"] == 3
    with ringq.Queue(tmp_path / "big") as dst:
        assert sorted(len(j.payload) for j in dst.lease(3)) == [5, 5, 5_000_000]
    src.purge()


def test_migrate_refuses_a_missing_source_in_one_line(tmp_path):
    err = cli("migrate", str(tmp_path / "nope"), str(tmp_path / "dst"), rc=2).stderr
    assert "no queue directory" in err and len(err.splitlines()) == 1


def _five_jobs(path):
    with ringq.Queue(path, "thumbnails") as q:
        q.enqueue_many([f"img{i}" for i in range(5)])


@pytest.mark.parametrize(
    "spell", [lambda d: d + "/", lambda d: d + "/../" + os.path.basename(d), "link"]
)
def test_migrate_refuses_the_same_directory_however_spelled_and_keeps_every_job(tmp_path, spell):
    src = str(tmp_path / "back2")
    _five_jobs(src)
    if spell == "link":
        os.symlink(src, tmp_path / "alias")
        dst = str(tmp_path / "alias")
    else:
        dst = spell(src)
    proc = cli("migrate", src, dst, "-q", "thumbnails", "--purge-source", rc=2)
    assert "same place" in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    with ringq.Queue(src, "thumbnails") as q:
        assert q.stats().ready == 5


def test_migrate_refuses_the_same_redis_queue_however_the_url_is_spelled(redis_server):
    name = f"t{uuid.uuid4().hex[:12]}"
    with ringq.connect(redis_server.url, name) as q:
        q.enqueue_many(["a", "b", "c", "d", "e"])
    port = redis_server.port
    for src, dst in [
        (redis_server.url, redis_server.url),
        (f"redis://127.0.0.1:{port}/0", f"redis://localhost:{port}"),
        (f"redis://127.0.0.1:{port}", f"redis://127.0.0.1:{port}/?db=0"),
    ]:
        proc = cli("migrate", src, dst, "-q", name, "--purge-source", rc=2)
        assert "same place" in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    # Spellings no URL rule can equate (another address of this host) are caught by asking the
    # server who it is, in migrate() itself.
    from ringq.cli.migrate import migrate

    with (
        ringq.connect(redis_server.url, name) as a,
        ringq.connect(f"redis://0.0.0.0:{port}/0", name) as b,
    ):
        with pytest.raises(ValueError, match="same queue"):
            migrate(a, b, purge_source=True)
        assert a.stats().ready == 5
    # Another database of the same server is another queue.
    out = json.loads(
        cli("migrate", redis_server.url, f"redis://127.0.0.1:{port}/3", "-q", name, "--json").stdout
    )
    assert out["copied"] == 5


def test_migrate_function_refuses_one_directory_opened_twice(tmp_path):
    from ringq.cli.migrate import migrate

    src = str(tmp_path / "q")
    _five_jobs(src)
    with ringq.Queue(src, "thumbnails") as a, ringq.Queue(src + "/", "thumbnails") as b:
        with pytest.raises(ValueError, match="same queue"):
            migrate(a, b, purge_source=True)
        assert a.stats().ready == 5


if __name__ == "__main__":
    pytest.main([__file__])


URL_REFUSED = {
    "inspect": [],
    "verify": [],
    "compact": [],
    "recover": [],
    "upgrade": ["."],
    "schedule": ["list"],
    "import-nobroker": ["."],
    "migrate": ["a", "b"],
    "metrics": [],
    "dashboard": [],
    "demo": [],
    "bench": [],
}


def _subcommands():
    """The commands `ringq --help` lists, so a command added later is covered or this fails."""
    text = cli("--help").stdout
    block = text.split("COMMAND\n", 2)[-1]
    return {
        line.split()[0]
        for line in block.splitlines()
        if line.startswith("    ") and not line.startswith("     ")
    }


def test_every_command_takes_url_or_refuses_it_in_one_line(redis_url, tmp_path, capsys):
    # In this process (main() as the ringq command runs it): one child per command took 13 s.
    from ringq.cli import main

    name = f"t{uuid.uuid4().hex[:12]}"
    common = ["--url", redis_url, "--queue", name, "--json"]
    works = {}

    def run(cmd, *args, rc=0):
        capsys.readouterr()
        got = main([*common, cmd, *args])
        proc = capsys.readouterr()
        assert got == rc, proc.out + proc.err
        assert "Traceback" not in proc.err, proc.err
        works[cmd] = True
        return subprocess.CompletedProcess([cmd, *args], got, proc.out, proc.err)

    run("enqueue", "a")
    [job] = json.loads(run("lease").stdout)
    run("ack", job["id"], "--token", str(job["lease_token"]))
    run("enqueue", "b")
    [job] = json.loads(run("lease").stdout)
    run("nack", job["id"], "--delay", "0")
    st = json.loads(run("stats").stdout)
    assert (st["enqueued_total"], st["acked_total"]) == (2, 1), st
    run("list")
    run("dlq")
    assert json.loads(run("top", "--once", "--interval", "0.05").stdout)["enqueued_total"] == 2
    run("work", "builtins:id", "--max-jobs", "1")
    run("enqueue", "c", "--id", "job-c")
    run("get", "job-c")
    run("cancel", "job-c")
    run("pause")
    run("resume")
    run("purge", "--yes")
    for command, args in URL_REFUSED.items():
        err = run(command, *args, rc=2).stderr
        assert "does not apply to --url" in err and len(err.splitlines()) == 1, err
    assert set(works) == _subcommands()
    # Both docs name each refusing command.
    root = os.path.join(os.path.dirname(__file__), "..", "docs")
    for doc in ("cli.md", "scale-out.md"):
        with open(os.path.join(root, doc)) as f:
            text = " ".join(f.read().split())
        for command in URL_REFUSED:
            assert f"`{command}`" in text.split("refuse")[1][:600], (doc, command)


def test_url_with_dir_is_a_usage_error(redis_url, tmp_path):
    for args in (
        ["--url", redis_url, "-d", str(tmp_path), "stats"],
        ["-d", str(tmp_path), "stats", "--url", redis_url],
    ):
        err = cli(*args, rc=2).stderr
        assert "either --dir or --url" in err and len(err.splitlines()) == 1


def test_a_redis_url_without_redis_py_is_one_typed_line():
    hide = "import sys; sys.modules['redis'] = None\n"
    code = (
        hide
        + "from ringq.cli import main; sys.exit(main(['--url', 'redis://127.0.0.1:1/1', 'stats']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "pip install 'ringq[redis]'" in proc.stderr and len(proc.stderr.splitlines()) == 1
    code = hide + (
        "import ringq\n"
        "try:\n    ringq.connect('redis://127.0.0.1:1/1')\n"
        "except ringq.MissingExtraError as e:\n    assert isinstance(e, ImportError); print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert "pip install 'ringq[redis]'" in out.stdout, out.stderr


def test_a_read_on_a_refused_connection_does_not_say_it_may_have_taken_effect():
    from redisserver import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    err = cli("--url", url, "stats", rc=1).stderr
    assert "connection failed" in err and "may or may not" not in err and len(err.splitlines()) == 1
