"""The C helper under AddressSanitizer + UndefinedBehaviorSanitizer (tests/native/ringq_selftest.c).

Invariant: every entry point of csrc/ringq.c, fed random geometries, random bytes and random
arguments over buffers of exactly the mapping's length, returns its documented codes and never
reads or writes outside the mapping nor hits undefined behaviour.

The program is compiled with gcc into a temporary directory.  If the toolchain has no ASan
runtime the test falls back to UBSan alone, and skips if neither links.  Iterations:
``RINGQ_SELFTEST_ITERATIONS`` (default 10000, about a second).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [os.path.join(ROOT, "tests", "native", "ringq_selftest.c"), os.path.join(ROOT, "csrc", "ringq.c")]
FLAVOURS = [["-fsanitize=address,undefined"], ["-fsanitize=undefined"]]


def _build(tmp_path, flags):
    exe = str(tmp_path / "selftest")
    cmd = ["gcc", "-std=gnu11", "-g", "-O1", "-Wall", "-Wextra", "-Werror", "-fno-omit-frame-pointer",
           "-fno-sanitize-recover=all", *flags, "-I", os.path.join(ROOT, "csrc"), *SOURCES, "-o", exe]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr
    probe = subprocess.run([exe, "0"], capture_output=True, text=True)  # known answers only
    if probe.returncode != 0 and "selftest:" not in probe.stdout:
        return None, probe.stderr  # the sanitizer runtime cannot run here (ptrace limits, ...)
    return exe, ""


@pytest.fixture(scope="module")
def selftest(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    errors = []
    for flags in FLAVOURS:
        exe, err = _build(tmp_path_factory.mktemp("native"), flags)
        if exe:
            return exe
        errors.append(f"{flags}: {err[-500:]}")
    pytest.skip("no sanitizer runtime usable here: " + " | ".join(errors))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_c_helper_under_sanitizers(selftest, seed):
    n = os.environ.get("RINGQ_SELFTEST_ITERATIONS", "10000")
    env = dict(os.environ, ASAN_OPTIONS="abort_on_error=0:detect_leaks=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    out = subprocess.run([selftest, n, str(seed)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.strip().endswith("0 failed")


def test_selftest_really_catches_an_overflow(tmp_path):
    """The harness is worth something only if ASan fires on a read past a mapping."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    src = tmp_path / "oob.c"
    src.write_text('#include <stdlib.h>\nint main(void){volatile char *p = malloc(8); return p[8];}\n')
    exe = str(tmp_path / "oob")
    if subprocess.run(["gcc", "-fsanitize=address", str(src), "-o", exe], capture_output=True).returncode:
        pytest.skip("no ASan runtime")
    out = subprocess.run([exe], capture_output=True, text=True)
    assert out.returncode != 0 and "heap-buffer-overflow" in out.stderr
