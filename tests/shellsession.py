"""A page's shell session, run: the ``$`` commands of its ```console blocks, in order, in one
directory, as a user pasting them would, and what each printed.

A ``ringq`` command (also at the end of a pipe, ``printf ... | ringq enqueue -``) runs in a process
of its own, forked from one interpreter that imported ringq once -- ``ringq.cli.main`` with the
command's arguments, standard output and error line-buffered into one file as on a terminal, then
a normal interpreter exit -- so a session of dozens of commands takes seconds.  ``echo $?`` prints
the previous command's exit status; every other command runs in bash.  A command line ending in a
here-document (``<<'EOF'``) takes the lines up to its terminator.

``python shellsession.py DIR`` reads the commands (a JSON list of strings) on stdin and prints a
JSON list of ``[exit status, output]``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field


@dataclass
class Step:
    command: str  # as on the page, a here-document's lines included
    shown: list[str] = field(default_factory=list)  # the lines the page shows under it
    line: int = 0  # where the command is on the page (1-based)


def parse(text: str) -> list[Step]:
    """The ``$`` commands of every ```console block of ``text``, with the output shown under each."""
    steps: list[Step] = []
    lines = text.splitlines()
    inside = False
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not inside:
            inside = line.strip() == "```console"
            continue
        if line.startswith("```"):
            inside = False
        elif line.startswith("$ "):
            step = Step(line[2:], line=i)
            heredoc = re.search(r"<<'(\w+)'", line)
            if heredoc:
                end = lines.index(heredoc.group(1), i)
                step.command = "\n".join([step.command, *lines[i : end + 1]])
                i = end + 1
            steps.append(step)
        else:
            assert steps, f"line {i}: output before any command: {line!r}"
            steps[-1].shown.append(line)
    return steps


def run(directory: str, commands: list[str], env: dict[str, str], timeout: float) -> list[tuple[int, str]]:
    """Run ``commands`` in ``directory`` (see the module docstring): ``[(exit status, output)]``."""
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), directory],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr
    return [(rc, out) for rc, out in json.loads(proc.stdout)]


def _ringq(argv: list[str], stdin: bytes | None, directory: str, scratch: str) -> tuple[int, str]:
    """``ringq ARGV`` in a forked process: (exit status, what it wrote to stdout and stderr)."""
    out_path = os.path.join(scratch, "out")
    in_path = os.path.join(scratch, "in")
    with open(in_path, "wb") as fh:
        fh.write(stdin or b"")
    pid = os.fork()
    if pid == 0:  # the command's process: nothing of the driver's is on the stack to unwind
        os.chdir(directory)
        out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        src = os.open(in_path if stdin is not None else os.devnull, os.O_RDONLY)
        os.dup2(src, 0)
        os.close(src)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)
        from ringq.cli import main

        sys.exit(main(argv))
    _, status = os.waitpid(pid, 0)
    with open(out_path, encoding="utf-8") as fh:
        return os.waitstatus_to_exitcode(status), fh.read()


def _driver(directory: str) -> None:
    commands = json.load(sys.stdin)
    # What the commands import when they run, imported once here.
    import importlib
    import pkgutil

    import ringq

    for package in ("cli", "engine", "local", "worker"):
        for mod in pkgutil.walk_packages([os.path.join(ringq.__path__[0], package)], f"ringq.{package}."):
            importlib.import_module(mod.name)
    for name in ("ringq.connect", "numpy", "cronsim", "zoneinfo"):
        importlib.import_module(name)

    scratch = tempfile.mkdtemp()
    results: list[tuple[int, str]] = []
    status = 0
    for command in commands:
        if command.strip() == "echo $?":
            result = (0, f"{status}\n")
        elif command.startswith("ringq ") or " | ringq " in command:
            feed, _, rest = command.partition(" | ringq ") if " | ringq " in command else ("", "", command[6:])
            stdin = None
            if feed:
                stdin = subprocess.run(["bash", "-c", feed], cwd=directory, capture_output=True, check=True).stdout
            result = _ringq(shlex.split(rest, comments=True), stdin, directory, scratch)
        else:
            sh = subprocess.run(
                ["bash", "-c", command], cwd=directory, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            result = (sh.returncode, sh.stdout)
        status = result[0]
        results.append(result)
    shutil.rmtree(scratch)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    _driver(sys.argv[1])
