"""Helpers for tests that run real OS processes."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env() -> dict:
    """Environment for child interpreters: they import the same ringq as this test run."""
    import ringq

    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(ringq.__file__)))
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn(code: str, *args: str, **kw) -> subprocess.Popen:
    """Start ``python -c code args...`` as a real OS process."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=child_env(), **kw)


def run_py(code: str, *args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=child_env(), timeout=timeout,
                          capture_output=True, text=True, **kw)


