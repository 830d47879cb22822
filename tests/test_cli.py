"""The ``ringq`` command line, run as a real process (``python -m ringq``) on real queue directories.

Every subcommand, its ``--json`` output parsed back, and the error paths: each user mistake is one
line on stderr, exit status 2, never a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import shellsession
from procs import ROOT, child_env

from ringq import Queue

HAS_BENCH = importlib.util.find_spec("ringq.bench") is not None


def ringq(qdir, *args: str, rc: int | None = 0, stdin: str | None = None, cwd=None, timeout: float = 60,
          env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m ringq --dir QDIR ARGS`` (no ``--dir`` if QDIR is None); check the exit status
    unless ``rc`` is None."""
    where = [] if qdir is None else ["--dir", str(qdir)]
    proc = subprocess.run([sys.executable, "-m", "ringq", *where, *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=child_env() if env is None else env)
    if rc is not None:
        assert proc.returncode == rc, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc


def as_json(qdir, *args: str, **kw) -> object:
    return json.loads(ringq(qdir, "--json", *args, **kw).stdout)


def one_line_error(proc: subprocess.CompletedProcess, rc: int = 2) -> str:
    assert proc.returncode == rc, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.strip()


# -- enqueue ---------------------------------------------------------------------------------------


def test_enqueue_text_json_and_options(tmp_path):
    q = tmp_path / "q"
    ids = ringq(q, "enqueue", "hello world").stdout.split()
    assert len(ids) == 1
    [obj] = as_json(q, "enqueue", '{"to": "ada", "n": [1, 2]}', "--priority", "7")
    assert obj["payload"] == {"to": "ada", "n": [1, 2]} and obj["priority"] == 7 and obj["state"] == "ready"
    [delayed] = as_json(q, "enqueue", "later", "--delay", "60", "--max-attempts", "2")
    assert delayed["available_at"] > time.time() + 50 and delayed["max_attempts"] == 2
    three = as_json(q, "enqueue", "42", "--count", "3")
    assert [j["payload"] for j in three] == [42, 42, 42]
    [as_text] = as_json(q, "enqueue", "42", "--text")
    assert as_text["payload"] == "42"
    from_stdin = as_json(q, "enqueue", "-", stdin='{"line": 1}\n\nplain line\n')
    assert [j["payload"] for j in from_stdin] == [{"line": 1}, "plain line"]
    with Queue(q) as queue:
        assert queue.get(ids[0]).payload == "hello world"
        assert queue.stats().total == 9
        assert queue.stats().delayed == 1


def test_enqueue_job_id_is_idempotent(tmp_path):
    q = tmp_path / "q"
    [first] = as_json(q, "enqueue", '{"order": 42}', "--job-id", "order-42")
    [again] = as_json(q, "enqueue", '{"order": 43}', "--job-id", "order-42")
    assert first["id"] == again["id"] == "order-42"
    assert again["payload"] == {"order": 42}  # the existing job, nothing written
    assert as_json(q, "stats")["total"] == 1


def test_global_options_go_before_or_after_the_command(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "x", "--queue", "emails")
    before = json.loads(subprocess.run([sys.executable, "-m", "ringq", "--json", "--queue", "emails", "--dir",
                                        str(q), "stats"], capture_output=True, text=True, check=True).stdout)
    after = json.loads(subprocess.run([sys.executable, "-m", "ringq", "stats", "--dir", str(q), "--queue", "emails",
                                       "--json"], capture_output=True, text=True, check=True).stdout)
    assert before == after and before["total"] == 1
    other = ringq(q, "stats", "--queue", "other")  # a separate queue: not there, so empty
    assert "total=0" in other.stdout and "no queue 'other'" in other.stderr


def test_malformed_json_payload_is_a_one_line_error(tmp_path):
    q = tmp_path / "q"
    err = one_line_error(ringq(q, "enqueue", '{"a": 1', rc=None))
    assert err.startswith("ringq enqueue: payload looks like JSON but does not parse")
    err = one_line_error(ringq(q, "enqueue", "-", stdin='"ok"\n[1, 2\n', rc=None))
    assert "stdin line 2" in err
    assert not os.path.exists(q / "default.ctl") or as_json(q, "stats")["total"] == 0  # nothing written
    [j] = as_json(q, "enqueue", '{"a": 1', "--text")
    assert j["payload"] == '{"a": 1'


# -- lease / ack / nack ------------------------------------------------------------------------------


def test_lease_then_ack_from_another_process(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "a")
    ringq(q, "enqueue", "b")
    leased = as_json(q, "lease", "--count", "5", "--visibility-timeout", "60")
    assert [j["payload"] for j in leased] == ["a", "b"]
    assert all(j["state"] == "leased" and j["lease_token"] == "1" and j["lease_deadline"] for j in leased)
    # The leasing process has exited, yet its leases hold (detached) until acked or expired.
    assert as_json(q, "stats")["leased"] == 2
    assert as_json(q, "lease") == []
    text = ringq(q, "lease").stdout
    assert text == "no eligible jobs\n"  # nobroker's words
    out = as_json(q, "ack", leased[0]["id"], "--token", "1")
    assert out == {"acked": leased[0]["id"]}  # one id: a string, as nobroker prints it
    assert ringq(q, "ack", leased[1]["id"]).stdout.strip() == f"acked {leased[1]['id']}"
    ringq(q, "ack", leased[1]["id"])  # acking twice is harmless
    assert as_json(q, "stats")["done"] == 2


def test_lease_text_output_shows_the_token(tmp_path):
    q = tmp_path / "q"
    [j] = as_json(q, "enqueue", '{"x": 1}')
    line = ringq(q, "lease").stdout.strip()
    assert line.startswith(j["id"]) and "token=1" in line and "leased" in line and '{"x": 1}' in line


def test_lease_wait_blocks_until_a_job_arrives(tmp_path):
    q = tmp_path / "q"
    with Queue(q):
        pass  # the queue exists, empty
    waiter = subprocess.Popen([sys.executable, "-m", "ringq", "--dir", str(q), "--json", "lease", "--wait", "30"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    time.sleep(0.5)
    assert waiter.poll() is None  # still blocked
    ringq(q, "enqueue", "wake up")
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert [j["payload"] for j in json.loads(out)] == ["wake up"]


def test_nack_retries_then_dead_letters(tmp_path):
    q = tmp_path / "q"
    [j] = as_json(q, "enqueue", "flaky", "--max-attempts", "2")
    ringq(q, "lease")
    text = ringq(q, "nack", j["id"], "--error", "ConnectionError: refused", "--delay", "0").stdout
    assert text.startswith(f"{j['id']} ready again") and "attempts 1/2" in text
    [again] = as_json(q, "lease")
    assert again["last_error"] == "ConnectionError: refused" and again["attempts"] == 2
    dead = as_json(q, "nack", j["id"], "--error", "still refused")
    assert dead["state"] == "dead"
    [listed] = as_json(q, "dlq")
    assert listed["id"] == j["id"] and listed["attempts"] == 2 and listed["last_error"] == "still refused"


def test_stale_token_and_not_leased_are_one_line_errors(tmp_path):
    q = tmp_path / "q"
    [j] = as_json(q, "enqueue", "x")
    err = one_line_error(ringq(q, "ack", j["id"], rc=None), rc=1)
    assert "not leased" in err
    ringq(q, "lease", "--visibility-timeout", "0.2")
    time.sleep(0.3)
    [again] = as_json(q, "lease")
    assert again["lease_token"] == "2"
    err = one_line_error(ringq(q, "nack", j["id"], "--token", "1", rc=None), rc=1)
    assert "stale" in err
    ringq(q, "ack", j["id"], "--token", "2")


def test_unknown_job_id_is_a_one_line_error(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "x")
    for cmd in (["ack", "no-such-job"], ["nack", "no-such-job"], ["dlq", "--requeue", "no-such-job"]):
        err = one_line_error(ringq(q, *cmd, rc=None), rc=1)
        assert "no-such-job" in err and err.startswith(f"ringq {cmd[0]}:")
    proc = ringq(q, "--json", "ack", "no-such-job", rc=1)
    assert json.loads(proc.stderr)["error"].startswith("no job 'no-such-job'")


def test_enqueue_depends_on_and_get_shows_parents_and_dependents(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "a", "--job-id", "a")
    ringq(q, "enqueue", "b", "--job-id", "b")
    ringq(q, "enqueue", "c", "--job-id", "c", "--depends-on", "a", "--depends-on", "b",
          "--allow-failure")
    assert [j["id"] for j in as_json(q, "list", "--state", "deferred")] == ["c"]
    got = as_json(q, "get", "c")
    assert (got["state"], got["depends_on"], got["dependents"]) == ("deferred", ["a", "b"], [])
    lines = ringq(q, "get", "c").stdout.splitlines()
    assert lines[0].startswith("c  deferred") and lines[1:] == ["parents: a b"]
    assert ringq(q, "get", "a").stdout.splitlines()[1:] == ["dependents: c"]
    err = one_line_error(ringq(q, "enqueue", "x", "--depends-on", "nope", rc=None), rc=1)
    assert "'nope'" in err
    st = as_json(q, "stats")
    assert (st["deferred"], st["total"]) == (1, 3)


# -- stats / list / dlq / purge ------------------------------------------------------------------------


def test_stats_and_list(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "a", "--count", "3")
    ringq(q, "enqueue", "later", "--delay", "600")
    ringq(q, "lease")
    st = as_json(q, "stats")
    assert st == {"ready": 2, "delayed": 1, "leased": 1, "done": 0, "dead": 0, "total": 4, "corrupt": 0,
                  "enqueued_total": 4, "acked_total": 0, "dead_lettered_total": 0,
                  "cancelled": 0, "expired": 0, "deferred": 0}
    assert ringq(q, "stats").stdout.split() == [f"{k}={v}" for k, v in st.items()]
    everything = as_json(q, "list")
    assert [j["state"] for j in everything] == ["leased", "ready", "ready", "ready"]
    assert [j["seq"] for j in everything] == sorted(j["seq"] for j in everything)
    assert len(as_json(q, "list", "--state", "ready")) == 3
    assert len(as_json(q, "list", "--limit", "2")) == 2
    table = ringq(q, "list").stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "STATE", "ATTEMPTS"]
    assert "delayed" in table[-1] and "due in" in table[-1]
    bad = ringq(q, "list", "--state", "sleeping", rc=2)
    assert "invalid choice" in bad.stderr


def test_dlq_list_and_requeue(tmp_path):
    q = tmp_path / "q"
    with Queue(q, max_attempts=1) as queue:
        jobs = queue.enqueue_many(["p1", "p2", "p3"])
        for _ in jobs:
            queue.nack(queue.lease_one(), error="ValueError: bad")
    dead = as_json(q, "dlq")
    assert [j["payload"] for j in dead] == ["p1", "p2", "p3"]
    assert all(j["last_error"] == "ValueError: bad" for j in dead)
    assert "ValueError: bad" in ringq(q, "dlq").stdout
    assert as_json(q, "dlq", "--requeue", jobs[0].id) == {"requeued": 1}
    err = one_line_error(ringq(q, "dlq", "--requeue", jobs[0].id, rc=None), rc=1)
    assert "not in the dead-letter queue" in err
    assert ringq(q, "dlq", "--requeue").stdout.strip() == "requeued 2 job(s)"
    assert ringq(q, "dlq").stdout.strip() == "(dead-letter queue is empty)"
    st = as_json(q, "stats")
    assert (st["ready"], st["dead"]) == (3, 0)
    assert {j["attempts"] for j in as_json(q, "list")} == {0}


def test_purge_refuses_without_yes(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "x", "--count", "4")
    err = one_line_error(ringq(q, "purge", rc=None))
    assert "--yes" in err and "4 job(s)" in err
    assert as_json(q, "stats")["total"] == 4
    assert as_json(q, "purge", "--yes") == {"purged": 4}
    assert as_json(q, "stats")["total"] == 0


def test_read_only_commands_do_not_create_a_missing_queue(tmp_path):
    missing = tmp_path / "nowhere"
    # nobroker's commands answer as for an empty queue, exit 0, and warn on stderr (docs/cli.md)
    empty = {"stats": None, "list": "(no jobs)", "lease": "no eligible jobs",
             "dlq": "(dead-letter queue is empty)", "purge --yes": "purged 0 job(s)",
             "dlq --requeue": "requeued 0 job(s)", "compact": "compacted 0 -> 0 bytes"}
    for cmd, text in empty.items():
        proc = ringq(missing, *cmd.split())
        assert proc.stderr.count("\n") == 1 and "warning: no queue 'default' in" in proc.stderr, proc.stderr
        assert "nowhere" in proc.stderr and "check --dir and --queue" in proc.stderr
        assert text is None or proc.stdout.startswith(text), (cmd, proc.stdout)
        assert not missing.exists()
    assert as_json(missing, "stats")["total"] == 0
    assert as_json(missing, "lease") == [] and as_json(missing, "list") == []
    # the others refuse in one line, exit 1
    for cmd in (["inspect"], ["verify"], ["top", "--once"], ["ack", "x"], ["get", "x"], ["cancel", "x"]):
        err = one_line_error(ringq(missing, *cmd, rc=None), rc=1)
        assert "nowhere" in err, err
        assert not missing.exists()
    ringq(tmp_path / "q", "enqueue", "x")
    err = one_line_error(ringq(tmp_path / "q", "--queue", "other", "get", "x", rc=None), rc=1)
    assert "no queue 'other'" in err
    proc = ringq(tmp_path / "q", "--queue", "other", "stats")
    assert "no queue 'other'" in proc.stderr and "total=0" in proc.stdout
    assert not (tmp_path / "q" / "other.ctl").exists()


def test_lease_wait_on_a_missing_queue_creates_it_and_waits(tmp_path):
    q = tmp_path / "q"
    proc = ringq(q, "--json", "lease", "--wait", "0.1")
    assert json.loads(proc.stdout) == [] and "creating it to wait for jobs" in proc.stderr
    assert (q / "default.ctl").exists()
    assert ringq(q, "lease", "--wait", "0.1").stderr == ""  # it exists now: no warning


# -- inspect / verify --------------------------------------------------------------------------------


def _filled(q) -> list[dict]:
    ringq(q, "enqueue", '{"n": 1}')
    ringq(q, "enqueue", "second record, the one we damage", "--job-id", "victim")
    ringq(q, "enqueue", "x" * 700)  # spans several slots
    ringq(q, "lease")
    return as_json(q, "inspect")["segments"][0]["records"]


def test_inspect_shows_segments_and_slots(tmp_path):
    q = tmp_path / "q"
    records = _filled(q)
    rep = as_json(q, "inspect")
    assert rep["ok"] and rep["control"]["slot_size"] == 256 and rep["control"]["next_seq"] == 4
    names = {f["name"] for f in rep["files"]}
    assert {"default.ctl", "default.lock", "default.0000000000000001.seg"} <= names
    seg = rep["segments"][0]
    assert seg["header"]["tail"] == 1 + 1 + 3 and seg["header"]["records"] == 3
    assert [r["slot"] for r in records] == [0, 1, 2]
    assert [r["span"] for r in records] == [1, 1, 3]
    assert [r["state"] for r in records] == ["leased", "ready", "ready"]
    assert records[0]["attempts"] == 1 and records[0]["owner"] == 0  # a CLI lease is detached
    assert records[1]["id"] == "victim" and records[1]["crc_ok"]
    assert records[1]["offset"] == seg["header"]["data_off"] + 256
    text = ringq(q, "inspect").stdout
    for needle in ("segment default.0000000000000001.seg", "tail=5", "SLOT", "OFFSET", "CRC", "victim",
                   '"second record, the one we damage"', "(detached)"):
        assert needle in text, needle
    assert "more record(s)" in ringq(q, "inspect", "--limit", "1").stdout


def test_inspect_limit_0_shows_every_record_and_n_shows_n(tmp_path):
    q = tmp_path / "q"
    # More than the default 20, one per stdin line.
    ringq(q, "enqueue", "-", stdin="".join(f'{{"n": {i}}}\n' for i in range(25)))
    count = lambda *extra: len(as_json(q, "inspect", *extra)["segments"][0]["records"])  # noqa: E731
    assert (count(), count("--limit", "0"), count("--limit", "2")) == (20, 25, 2)
    text = ringq(q, "inspect", "--limit", "0").stdout
    assert '{"n":24}' in text and "more record(s)" not in text


@pytest.mark.parametrize("suffix", [".seg", ".state"])
def test_verify_fails_a_file_in_a_format_version_this_ringq_cannot_open(tmp_path, suffix):
    import struct

    from ringq import FormatVersionError, Queue

    q = tmp_path / "q"
    _filled(q)
    [path] = [p for p in q.iterdir() if p.name.endswith(suffix)]
    with open(path, "r+b") as fh:
        fh.seek(8)  # the u32 format version of the file header (docs/format.md)
        fh.write(struct.pack("<I", 3))
    with pytest.raises(FormatVersionError):
        Queue(str(q))
    proc = ringq(q, "verify", rc=1)
    assert "format version 3" in proc.stdout and "cannot open" in proc.stdout


def test_verify_passes_a_clean_queue(tmp_path):
    q = tmp_path / "q"
    _filled(q)
    proc = ringq(q, "verify")
    assert proc.stdout.strip().startswith("ok:") and "3 record(s) checked" in proc.stdout
    rep = as_json(q, "verify")
    assert rep["ok"] and rep["damage"] == [] and rep["records"] == 3


def test_verify_reports_a_damaged_record_and_exits_nonzero(tmp_path):
    q = tmp_path / "q"
    records = _filled(q)
    victim = records[1]
    seg_path = q / "default.0000000000000001.seg"
    with open(seg_path, "r+b") as fh:  # flip one payload byte of a committed record
        pos = victim["offset"] + 64 + len("victim") + 3
        fh.seek(pos)
        byte = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([byte[0] ^ 0x20]))
    proc = ringq(q, "verify", rc=1)
    assert "DAMAGE" in proc.stdout and "slot 1" in proc.stdout and "CRC" in proc.stdout
    rep = as_json(q, "verify", rc=1)
    assert rep["ok"] is False and len(rep["damage"]) == 1 and "slot 1" in rep["damage"][0]
    assert rep["records"] == 3  # the record after the damaged one is still found
    assert [r["crc_ok"] for r in as_json(q, "inspect")["segments"][0]["records"]] == [True, False, True]
    assert "BAD" in ringq(q, "inspect").stdout
    # Ordinary commands keep working and quarantine the record instead of serving it.
    assert as_json(q, "stats")["corrupt"] == 1
    assert "victim" not in [j["id"] for j in as_json(q, "list")]
    ringq(q, "verify", rc=1)  # still damage: quarantined, not repaired


def test_verify_names_a_damaged_state_file_once(tmp_path):
    q = tmp_path / "q"
    _filled(q)
    state = q / "default.0000000000000001.state"
    with open(state, "r+b") as fh:
        fh.write(b"garbage!")  # its magic
    [line] = as_json(q, "verify", rc=1)["damage"]
    assert "its state file default.0000000000000001.state: not a ringq state file" in line
    assert line.count(".state") == 1, line


def test_verify_reports_a_damaged_segment_header_without_touching_it(tmp_path):
    q = tmp_path / "q"
    _filled(q)
    seg_path = q / "default.0000000000000001.seg"
    with open(seg_path, "r+b") as fh:
        fh.seek(40)  # inside the CRC-covered static header
        fh.write(b"\xff")
    rep = as_json(q, "verify", rc=1)
    assert any("header CRC" in d for d in rep["damage"]), rep["damage"]
    assert seg_path.exists()  # verify is read-only: no quarantine rename
    ringq(q, "stats")  # an ordinary open quarantines the segment ...
    assert not seg_path.exists()
    rep = as_json(q, "verify", rc=1)  # ... and verify keeps reporting it
    assert any("quarantined" in d for d in rep["damage"]), rep["damage"]


def test_output_into_a_closed_pipe_is_quiet(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "x" * 40, "--count", "3000")
    proc = subprocess.run(["bash", "-c", f"{sys.executable} -m ringq --dir {q} list | head -n 1; "
                           "exit ${PIPESTATUS[0]}"], capture_output=True, text=True, env=child_env(), timeout=60)
    assert proc.stdout.startswith("ID") and proc.stderr == ""
    assert proc.returncode == 141


# -- work ---------------------------------------------------------------------------------------------

HANDLERS = textwrap.dedent("""
    import os

    def record(job):
        with open(os.environ["LEDGER"], "a") as fh:
            fh.write(f"{os.getpid()} {job.id}\\n")

    def fail(job):
        raise KeyError(job.payload)

    not_callable = 42
""")


@pytest.fixture
def handler_dir(tmp_path):
    (tmp_path / "cli_handlers.py").write_text(HANDLERS)
    return tmp_path


@pytest.mark.parametrize("mode", [[], ["--processes", "2", "--concurrency", "2"]], ids=["threads", "processes"])
def test_work_runs_a_handler_until_idle(handler_dir, mode):
    q = handler_dir / "q"
    ledger = handler_dir / "ledger.txt"
    ids = [j["id"] for j in as_json(q, "enqueue", "job", "--count", "20")]
    env = dict(child_env(), LEDGER=str(ledger))
    proc = ringq(q, "--json", "work", "cli_handlers:record", "--idle-timeout", "0.5", *mode, cwd=handler_dir, env=env)
    stats = json.loads(proc.stdout)
    assert stats["succeeded"] == 20 and stats["failed"] == 0
    assert sorted(line.split()[1] for line in ledger.read_text().splitlines()) == sorted(ids)
    assert as_json(q, "stats")["done"] == 20


def test_work_max_jobs_and_failures_reach_the_dlq(handler_dir):
    q = handler_dir / "q"
    as_json(q, "enqueue", '"k"', "--count", "3", "--max-attempts", "1")
    proc = ringq(q, "work", "cli_handlers:fail", "--max-jobs", "2", cwd=handler_dir)
    assert "leased=2" in proc.stdout and "dead=2" in proc.stdout
    assert "KeyError" in proc.stderr  # failures are logged
    dead = as_json(q, "dlq")
    assert len(dead) == 2 and all(j["last_error"] == "KeyError: 'k'" for j in dead)
    assert as_json(q, "stats")["ready"] == 1


@pytest.mark.parametrize("spec, needle", [
    ("no_such_module_xyz:run", "no module named 'no_such_module_xyz'"),
    ("cli_handlers:missing", "has no attribute 'missing'"),
    ("cli_handlers", "module:function"),
    ("cli_handlers:not_callable", "not a callable"),
])
def test_work_bad_handler_path_is_a_one_line_error(handler_dir, spec, needle):
    q = handler_dir / "q"
    ringq(q, "enqueue", "x")
    # exit 1, as nobroker's work exits for a handler it cannot load
    err = one_line_error(ringq(q, "work", spec, "--idle-timeout", "0.2", cwd=handler_dir, rc=None), rc=1)
    assert needle in err and err.startswith("ringq work:")
    assert as_json(q, "stats")["ready"] == 1


# -- top ----------------------------------------------------------------------------------------------


def test_top_once_prints_counts_and_rates(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "x", "--count", "3")
    s = as_json(q, "top", "--once", "--interval", "0.1")
    assert (s["ready"], s["total"], s["enqueued_total"]) == (3, 3, 3)
    assert s["enqueue_rate"] == 0.0 and s["finish_rate"] == 0.0
    line = ringq(q, "top", "--once", "--interval", "0.1").stdout
    assert "ready=3" in line and "enq/s=" in line and "fin/s=" in line


def test_top_counters_do_not_fall_when_segments_retire(tmp_path):
    q = tmp_path / "q"
    with Queue(str(q), slot_size=128, slot_count=8) as queue:
        queue.enqueue_many(list(range(20)))
        while job := queue.lease_one():
            if job.payload % 5:
                queue.ack(job)
            else:
                queue.nack(job, delay=0) if job.attempts < 2 else queue.ack(job)
        bad = queue.enqueue("x", max_attempts=1)
        queue.nack(queue.lease_one(), error="boom")
        assert queue.get(bad.id).state.value == "dead"
    s = as_json(q, "top", "--once", "--interval", "0.1")
    assert s["done"] < 20  # finished segments retired: done and total fell
    assert (s["enqueued_total"], s["acked_total"], s["dead_lettered_total"], s["finished_total"]) == (21, 20, 1, 21)
    line = ringq(q, "top", "--once", "--interval", "0.1").stdout
    assert "enqueued=21 acked=20 dead-lettered=1" in line


def test_top_without_a_tty_prints_lines_until_ctrl_c(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "x")
    proc = subprocess.Popen([sys.executable, "-m", "ringq", "--dir", str(q), "top", "--interval", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    lines = [proc.stdout.readline() for _ in range(3)]
    assert all("ready=1" in line for line in lines), lines
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "Traceback" not in err


def test_top_on_a_terminal_quits_on_q(tmp_path):
    q = tmp_path / "q"
    ringq(q, "enqueue", "x", "--count", "2")
    env = dict(child_env(), TERM="xterm", COLUMNS="100", LINES="30")
    pid, fd = pty.fork()
    if pid == 0:  # the child: ringq top on a real pseudo-terminal
        os.execve(sys.executable, [sys.executable, "-m", "ringq", "--dir", str(q), "top", "--interval", "0.1"], env)
    screen = b""
    try:
        end = time.monotonic() + 30
        while b"ringq top" not in screen or b"ready" not in screen:
            assert time.monotonic() < end, screen
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    screen += os.read(fd, 65536)
                except OSError:
                    break
        os.write(fd, b"q")
        end = time.monotonic() + 20
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < end, "top did not quit on q"
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    os.read(fd, 65536)
                except OSError:
                    pass
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


# -- demo / bench ------------------------------------------------------------------------------------


def test_demo_runs_on_a_small_tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"f{i}.txt").write_text("ringq " * (i + 1))
    proc = ringq(None, "demo", "--source", str(src), "--workers", "2", "--threads", "1",
                 "--no-kill", timeout=120)
    assert "OK: every file's job is done exactly once" in proc.stdout


def test_demo_reports_the_leases_its_killed_worker_held_as_they_are_redelivered(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(600):
        (src / f"f{i}.txt").write_text("ringq " * (50 + i))
    proc = ringq(None, "demo", "--source", str(src), "--workers", "2", "--threads", "2", timeout=180)
    assert "OK: every file's job is done exactly once" in proc.stdout
    killed = re.search(r"killed worker +pid \d+ holding (\d+) lease\(s\), reclaimed within (\d+) ms", proc.stdout)
    if killed is None:  # no worker held a lease when the demo looked: it says so
        assert "killed worker    none" in proc.stdout
        return
    redelivered = re.search(r"redeliveries +(\d+) ", proc.stdout)
    assert int(killed.group(1)) >= 1 and int(killed.group(2)) < 10_000
    assert redelivered is not None and int(redelivered.group(1)) == int(killed.group(1))


@pytest.mark.parametrize("given,named", [(["--dir", "x"], "-d/--dir"), (["-q", "mine"], "-q/--queue"),
                                         (["--json"], "--json")])
def test_demo_refuses_the_global_options_it_cannot_honour(tmp_path, given, named):
    # It runs on a queue of its own and prints a report: a --dir, a queue name or --json that it
    # would ignore is refused in one line, before anything runs.
    proc = ringq(None, *given, "demo", "--limit", "5", rc=None, cwd=tmp_path)
    err = one_line_error(proc)
    assert "demo does not take " + named in err and "--keep" in err
    assert not (tmp_path / "x").exists()


def test_demo_whose_output_is_closed_ends_with_its_workers(tmp_path):
    # `ringq demo | head -1`: the reader leaves after one line; the demo must end (exit 141, the
    # broken pipe), and take its worker processes with it rather than wait for them forever.
    src = tmp_path / "src"
    src.mkdir()
    for i in range(400):
        (src / f"f{i}.txt").write_text("ringq " * (i + 1))
    proc = subprocess.Popen([sys.executable, "-m", "ringq", "demo", "--source", str(src), "--workers", "2",
                             "--no-kill"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env(),
                            start_new_session=True)
    assert proc.stdout.readline().startswith(b"ringq demo:")
    proc.stdout.close()
    try:
        assert proc.wait(timeout=30) == 141
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)  # any of its children left?
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("a demo worker outlived the demo")


def _slow_demo(tmp_path) -> tuple[subprocess.Popen, str]:
    """A demo whose jobs take about a second each (large sparse files, nothing on disk), started in
    a session of its own with TMPDIR under tmp_path; returns it once its jobs are enqueued, with
    the queue directory it named."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        with open(src / f"sparse{i}", "wb") as fh:
            fh.truncate(256 << 20)
    (tmp_path / "tmp").mkdir()
    env = dict(child_env(), TMPDIR=str(tmp_path / "tmp"))
    proc = subprocess.Popen([sys.executable, "-m", "ringq", "demo", "--source", str(src), "--workers", "2",
                             "--threads", "1", "--no-kill"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    lines = [proc.stdout.readline().decode() for _ in range(3)]
    assert lines[2].startswith("enqueued 8 durable jobs"), lines
    qdir = lines[1].split()[1]
    assert qdir.startswith(str(tmp_path / "tmp")) and os.path.isdir(qdir), lines
    return proc, qdir


def _no_process_left_in(pgid: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError("a demo worker outlived the demo")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_demo_ended_by_a_signal_stops_its_workers_and_removes_its_directory(tmp_path, signum):
    # `kill PID` or a closed terminal ends the demo as Ctrl-C does: workers stopped, its temporary
    # queue directory removed, the exit status 128 + the signal's number.
    proc, qdir = _slow_demo(tmp_path)
    try:
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 128 + signum
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    _no_process_left_in(proc.pid)
    assert not os.path.exists(qdir)


def test_demo_workers_end_when_the_demo_is_sigkilled(tmp_path):
    # Nothing of the demo's runs after SIGKILL, but its workers must not go on hashing for nobody.
    proc, _ = _slow_demo(tmp_path)
    try:
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    _no_process_left_in(proc.pid)


@pytest.mark.parametrize("closed", [">&-", "2>&-", "<&- >&- 2>&-"])
def test_commands_run_with_a_standard_stream_closed(tmp_path, closed):
    # `ringq ... >&-`: what would be printed goes nowhere, the command still does its work and exits
    # with its usual status; a queue file never takes descriptor 1 or 2 and receives the output.
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"f{i}.txt").write_text("ringq " * (i + 1))
    qdir = tmp_path / "q"

    def closed_run(*args: str) -> int:
        cmd = " ".join([sys.executable, "-m", "ringq", *args, closed])
        return subprocess.run(["sh", "-c", cmd], env=child_env(), timeout=120).returncode

    assert closed_run("--dir", str(qdir), "enqueue", "hello") == 0
    assert closed_run("--dir", str(qdir), "list") == 0
    assert closed_run("--dir", str(qdir), "--json", "stats") == 0
    assert closed_run("--dir", str(qdir), "stats", "--no-such-option") == 2
    assert closed_run("demo", "--source", str(src), "--workers", "2", "--threads", "1", "--no-kill") == 0
    assert [j.payload for j in Queue(qdir).list_jobs()] == ["hello"]
    assert ringq(qdir, "verify").returncode == 0


@pytest.mark.skipif(HAS_BENCH, reason="ringq.bench exists in this tree")
def test_bench_without_the_harness_is_a_one_line_error(tmp_path):
    err = one_line_error(ringq(tmp_path, "bench", "--anything", rc=None))
    assert "ringq.bench" in err


@pytest.mark.skipif(HAS_BENCH, reason="ringq.bench exists in this tree")
def test_bench_passes_its_arguments_to_ringq_bench_main(tmp_path):
    (tmp_path / "bench.py").write_text("def main(argv):\n    print('bench got', argv)\n    return 3\n")
    code = ("import sys, ringq; ringq.__path__.append(sys.argv[1]); from ringq.cli import main; "
            "sys.exit(main(['bench', '--rows', '10', 'x']))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert proc.returncode == 3 and proc.stdout.strip() == "bench got ['--rows', '10', 'x']"


@pytest.mark.skipif(not HAS_BENCH, reason="ringq.bench is not in this tree")
def test_bench_subcommand_reaches_the_harness(tmp_path):
    proc = ringq(tmp_path, "bench", "--help")
    assert "--smoke" in proc.stdout and "fdatasync" in proc.stdout


BAD_NUMBERS = [
    ("lease", "--wait", "-1"), ("lease", "--wait", "nan"), ("lease", "-n", "0"), ("lease", "--timeout", "0"),
    ("lease", "--visibility-timeout", "-3"), ("enqueue x", "--count", "0"), ("enqueue x", "--delay", "inf"),
    ("ack 1", "--token", "0"), ("nack 1", "--token", "-2"), ("nack 1", "--delay", "-1"),
    ("list", "--limit", "-1"), ("dlq", "--limit", "-1"), ("inspect", "--limit", "-1"),
    ("work m:f", "--idle-timeout", "-1"), ("work m:f", "--max-jobs", "0"), ("work m:f", "-c", "0"),
    ("work m:f", "--processes", "-1"), ("work m:f", "--visibility-timeout", "0"), ("work m:f", "--poll-interval", "0"),
    ("work m:f", "--metrics-port", "65536"), ("metrics", "--port", "-1"), ("dashboard", "--port", "70000"),
    ("top", "--interval", "0"), ("demo", "--workers", "0"), ("schedule add s x", "--every", "0"),
    ("lease", "--wait", "soon"),
]


@pytest.mark.parametrize("command,option,value", BAD_NUMBERS)
def test_every_numeric_option_out_of_range_is_a_usage_error(tmp_path, capsys, command, option, value):
    from ringq.cli import main

    assert main(["-d", str(tmp_path / "q"), *command.split(), option, value]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "must be" in err and value in err, err
    assert not (tmp_path / "q").exists()  # refused before anything ran


@pytest.mark.parametrize(
    "args",
    [
        ("dashboard", "--port", "99999"),
        ("dashboard", "--port", "-1"),
        ("dashboard", "--port", "http"),
        ("metrics", "--port", "99999"),
        ("metrics", "--port", "65536"),
        ("work", "json:loads", "--metrics-port", "70000"),
    ],
)
def test_a_port_out_of_range_is_a_one_line_error(tmp_path, args):
    err = one_line_error(ringq(tmp_path / "q", *args, rc=None))
    assert "invalid port" in err and "65535" in err


def test_worker_and_servers_refuse_a_port_out_of_range(tmp_path):
    from ringq import Worker

    with Queue(str(tmp_path / "q")) as q:
        for bad in (-1, 65536, 99999, True, 1.5, "8080"):
            with pytest.raises(ValueError, match="0..65535"):
                Worker(q, print, metrics_port=bad)
            for module in ("ringq.web.dashboard", "ringq.web.metrics"):
                try:
                    serve = importlib.import_module(module).serve
                except ImportError:
                    continue  # the extra is not installed
                with pytest.raises(ValueError, match="0..65535"):
                    serve(q, bad) if module == "ringq.web.dashboard" else serve(None, bad)


def _shape(line: str) -> str:
    """What of a line does not depend on the time of the run: times as `ringq` prints them (`in
    29.9s`, `3.1s ago`, `top`'s clock, `inspect`'s `epoch=`) become <t>; blanks are collapsed."""
    line = re.sub(r"\bin \d+\.\ds\b|\b\d+\.\ds ago\b", "<t>", line)
    line = re.sub(r"^\d\d:\d\d:\d\d\b", "<t>", line)
    line = re.sub(r"\bepoch=\S+", "epoch=<t>", line)
    return " ".join(line.split())


def _shows(shown: str, got: str) -> bool:
    """True if the page's line ``shown`` is ``got``, up to times; ``...`` in it stands for anything."""
    parts = _shape(shown).split("...")
    return re.fullmatch(".*".join(re.escape(p) for p in parts), _shape(got)) is not None


def _docs_cli_md() -> str:
    with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as fh:
        return fh.read()


def test_the_examples_of_docs_cli_md_are_one_session_that_prints_what_they_show(tmp_path):
    """docs/cli.md's examples, pasted in order into a shell in an empty directory, print what the
    page shows under each command, and exit 0 unless the page's next command is `echo $?` (which
    then shows the status)."""
    steps = shellsession.parse(_docs_cli_md())
    assert len(steps) > 40, len(steps)
    results = shellsession.run(str(tmp_path), [s.command for s in steps], child_env(), timeout=240)
    for n, (step, (status, output)) in enumerate(zip(steps, results)):
        where = f"docs/cli.md line {step.line}: $ {step.command}"
        got = output.splitlines()
        assert len(got) == len(step.shown) and all(map(_shows, step.shown, got)), (
            f"{where}\nthe page shows:\n" + "\n".join(step.shown) + "\nit printed:\n" + output
        )
        checked = n + 1 < len(steps) and steps[n + 1].command.strip() == "echo $?"
        assert checked or status == 0, f"{where}\nexit status {status}, and the page shows no `echo $?`"


def test_the_metrics_example_of_docs_cli_md_is_what_metrics_prints(tmp_path):
    """The `metrics` example, outside the session (it serves until stopped): the line it prints,
    the port aside; SIGTERM stops it, exit 0."""
    doc = _docs_cli_md()
    shown = doc[doc.index("$ ringq metrics --port 0 --json\n") :].splitlines()[1]
    ringq(tmp_path / "q", "enqueue", "x")
    proc = subprocess.Popen([sys.executable, "-m", "ringq", "--dir", str(tmp_path / "q"), "metrics", "--port", "0",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", line.strip()) == re.sub(
        r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", shown
    ), (line, shown)
    assert proc.returncode == 0 and out == "" and err == "", (proc.returncode, out, err)


def test_enqueue_timeout_is_stored_with_the_job_and_a_bad_one_writes_nothing(tmp_path):
    q = tmp_path / "q"
    (job,) = as_json(q, "enqueue", "x", "--timeout", "2.5")
    assert job["timeout"] == 2.5 and as_json(q, "get", job["id"])["timeout"] == 2.5
    bad = ringq(q, "enqueue", "y", "--timeout", "0", rc=2)
    assert "timeout must be" in bad.stderr
    assert as_json(q, "stats")["total"] == 1
