"""The README's thirty-second example runs as written."""

import os
import re
import subprocess
import sys

from procs import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_example_runs_verbatim(tmp_path):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        blocks = re.findall(r"```python\n(.*?)```", fh.read(), re.S)
    assert blocks, "README.md has no python example"
    for code in blocks:
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=child_env(), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "ada@example.com" in proc.stdout


def test_readme_names_every_command_of_the_cli(capsys):
    from ringq.cli import main

    assert main(["no-such-command"]) == 2
    listed = re.search(r"choose from (.*?)\)", capsys.readouterr().err).group(1)
    commands = re.findall(r"'([a-z-]+)'", listed)
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    line = re.search(r"`docs/cli.md`: the `ringq` command line \((.*?)\)\.", readme, re.S).group(1)
    assert re.findall(r"`([a-z-]+)`", line) == commands


def test_the_shell_forms_readme_gives_take_the_directory_before_the_command(tmp_path, capsys):
    from ringq import Queue
    from ringq.cli import main

    jobs = str(tmp_path / "jobs")
    with Queue(jobs) as q:
        q.enqueue({"email": "ada@example.com"})
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert "`ringq -d ./jobs stats`, `ringq -d ./jobs list`" in readme
    assert main(["-d", jobs, "stats"]) == 0 and "ready" in capsys.readouterr().out
    assert main(["-d", jobs, "list"]) == 0 and "ada@example.com" in capsys.readouterr().out
