"""docs/scale-out.md: its program runs as written, on a directory and on a real Redis server."""

import os
import re
import subprocess
import sys

from procs import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_same_program_runs_on_a_directory_and_on_redis(tmp_path, spawn_redis):
    with open(os.path.join(ROOT, "docs", "scale-out.md"), encoding="utf-8") as fh:
        [program] = re.findall(r"```python\n(.*?)```", fh.read(), re.S)
    prog = tmp_path / "thumbnails.py"
    prog.write_text(program)
    server = spawn_redis("--appendonly", "yes", "--appendfsync", "always")
    outputs = []
    for target in (str(tmp_path / "jobs"), server.url):
        for _run in range(2):  # a rerun adds the 100 images again but not the keyed job
            proc = subprocess.run(
                [sys.executable, str(prog), target],
                capture_output=True,
                text=True,
                env=child_env(),
                timeout=120,
                cwd=tmp_path,
            )
            assert proc.returncode == 0, proc.stderr
            outputs.append(proc.stdout.strip())
    expected = [
        "done=100 dead=1 dlq=[{'image': 13}]",
        "done=199 dead=2 dlq=[{'image': 13}, {'image': 13}]",
    ]
    assert outputs == expected * 2
