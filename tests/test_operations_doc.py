"""docs/operations.md, checked: its systemd unit passes ``systemd-analyze verify``, its commands run
as the page shows (a drain of a handler that ignores SIGTERM exits 0 and hands the job back),
``ringq work`` drains the same way as PID 1 of a PID namespace of its own (as in a container), and
the page's tracing handler module prints the handler's span."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from procs import ROOT, child_env

DOC = os.path.join(ROOT, "docs", "operations.md")


def block(lang: str) -> str:
    text = open(DOC, encoding="utf-8").read()
    found = re.findall(rf"```{lang}\n(.*?)```", text, re.S)
    assert len(found) == 1, f"docs/operations.md should have one {lang} block"
    return found[0]


def ringq_exe() -> str:
    return os.path.join(os.path.dirname(sys.executable), "ringq")


def test_the_unit_file_verifies(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is missing (apt-get install systemd); CI must not skip")
        pytest.skip("systemd-analyze is not installed")
    unit = block("ini")
    assert "ExecStart=/opt/ringq/venv/bin/ringq " in unit
    # The same unit, pointing at this checkout's ringq and an existing working directory.
    unit = unit.replace("/opt/ringq/venv/bin/ringq", ringq_exe())
    unit = unit.replace("WorkingDirectory=/srv/app", f"WorkingDirectory={tmp_path}")
    path = tmp_path / "ringq-emails.service"
    path.write_text(unit)
    out = subprocess.run([tool, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    timeout = int(re.search(r"TimeoutStopSec=(\d+)", unit).group(1))
    grace = float(re.search(r"--grace (\S+)", unit).group(1))
    assert timeout >= grace + 10


def test_the_commands_run_as_shown(tmp_path):
    (tmp_path / "slow.py").write_text("import time\n\n\ndef run(job):\n    time.sleep(60)\n")
    lines = [ln[2:] for ln in block("console").splitlines() if ln.startswith("$ ")]
    assert lines[0].startswith("ringq --dir ./q --queue emails enqueue")
    bindir = os.path.dirname(sys.executable)
    script = "set -m\n" + "\n".join(
        ln
        if not ln.startswith("ringq --dir ./q --queue emails list --state leased")
        else "for i in $(seq 100); do " + ln + " | grep -q '\"leased\"' && break; sleep 0.05; done"
        for ln in lines
    )
    env = {
        **child_env(),
        "PATH": bindir + os.pathsep + os.environ["PATH"],
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{child_env()['PYTHONPATH']}",
    }
    t0 = time.monotonic()
    out = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "exit 0" in out.stdout.splitlines()
    assert time.monotonic() - t0 < 30
    handed = json.loads(out.stdout.strip().splitlines()[-1])
    assert (
        len(handed) == 1
        and handed[0]["state"] == "ready"
        and handed[0]["payload"] == {"to": "ada@example.com"}
    )
    assert "grace period; handed back" in handed[0]["last_error"]


def test_work_drains_as_pid_1_of_its_own_namespace(tmp_path):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a PID namespace")
    (tmp_path / "slow.py").write_text("import time\n\n\ndef run(job):\n    time.sleep(60)\n")
    q = str(tmp_path / "q")
    env = {**child_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{child_env()['PYTHONPATH']}"}
    subprocess.run(
        [ringq_exe(), "--dir", q, "enqueue", "1"], env=env, check=True, capture_output=True
    )
    proc = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            ringq_exe(),
            "--dir",
            q,
            "work",
            "slow:run",
            "--grace",
            "0.5",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    from ringq import Queue

    with Queue(q) as queue:
        deadline = time.monotonic() + 20
        while queue.stats().leased == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert queue.stats().leased == 1
        child = int(
            subprocess.run(
                ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
            ).stdout.split()[0]
        )
        with open(f"/proc/{child}/status") as fh:
            assert any(
                ln.split() == ["NSpid:", str(child), "1"] for ln in fh if ln.startswith("NSpid:")
            )
        os.kill(child, signal.SIGTERM)
        _out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        job = queue.list_jobs()[0]
        assert job.state.value == "ready" and "handed back" in job.last_error


def test_the_tracing_handler_module_prints_its_span(tmp_path):
    pytest.importorskip("opentelemetry.sdk")
    (tmp_path / "handlers.py").write_text(block("python"))
    q = str(tmp_path / "q")
    env = {**child_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{child_env()['PYTHONPATH']}"}
    subprocess.run(
        [ringq_exe(), "--dir", q, "--queue", "emails", "enqueue", '{"to": "ada@example.com"}'],
        env=env,
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [
            ringq_exe(),
            "--dir",
            q,
            "--queue",
            "emails",
            "work",
            "handlers:send",
            "--idle-timeout",
            "0.3",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "sending to ada@example.com" in out.stdout
    assert '"name": "process emails"' in out.stdout and '"messaging.system": "ringq"' in out.stdout
