"""The C helper under AddressSanitizer + UndefinedBehaviorSanitizer (tests/native/ringq_selftest.c).

Invariant: every entry point of the C helper (csrc/*.c), fed random geometries, random bytes and random
arguments over buffers of exactly the mapping's length, returns its documented codes and never
reads or writes outside the mapping nor hits undefined behaviour.

The program is compiled with gcc into a temporary directory.  If the toolchain has no ASan
runtime the test falls back to UBSan alone, and skips if neither links.  Iterations:
``RINGQ_SELFTEST_ITERATIONS`` (default 10000, about a second).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [
    os.path.join(ROOT, "tests", "native", "ringq_selftest.c"),
    *sorted(str(p) for p in pathlib.Path(ROOT, "csrc").glob("*.c")),
]
FLAVOURS = [["-fsanitize=address,undefined"], ["-fsanitize=undefined"]]


def _runtime_works(tmp_path, flags):
    """True if this toolchain can build and run a trivial program with ``flags``."""
    src = tmp_path / "probe.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = str(tmp_path / "probe")
    if subprocess.run(["gcc", *flags, str(src), "-o", exe], capture_output=True).returncode:
        return False
    return subprocess.run([exe], capture_output=True).returncode == 0  # ptrace limits can stop ASan


@pytest.fixture(scope="module")
def selftest(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    tmp = tmp_path_factory.mktemp("native")
    flags = next((f for f in FLAVOURS if _runtime_works(tmp, f)), None)
    if flags is None:
        pytest.skip("no sanitizer runtime usable with this gcc")
    exe = str(tmp / "selftest")
    cmd = [
        "gcc",
        "-std=gnu11",
        "-g",
        "-O1",
        "-Wall",
        "-Wextra",
        "-fno-omit-frame-pointer",
        "-fno-sanitize-recover=all",
        *flags,
        "-I",
        os.path.join(ROOT, "csrc"),
        *SOURCES,
        "-o",
        exe,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # the toolchain works: a build failure is ours
    return exe


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_c_helper_under_sanitizers(selftest, seed):
    n = os.environ.get("RINGQ_SELFTEST_ITERATIONS", "10000")
    env = dict(
        os.environ,
        ASAN_OPTIONS="abort_on_error=0:detect_leaks=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )
    out = subprocess.run(
        [selftest, n, str(seed)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.strip().endswith("0 failed")
    # The append fuzz reached the write, publish, reserve and whole-append paths, not only refusals.
    m = re.search(
        r"appends: (\d+) runs written, (\d+) published, (\d+) reserves granted, (\d+) whole appends",
        out.stdout,
    )
    assert m and all(int(x) > 0 for x in m.groups()), out.stdout


def test_selftest_really_catches_an_overflow(tmp_path):
    """The harness is worth something only if ASan fires on a read past a mapping."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    src = tmp_path / "oob.c"
    src.write_text(
        "#include <stdlib.h>\nint main(void){volatile char *p = malloc(8); return p[8];}\n"
    )
    exe = str(tmp_path / "oob")
    if subprocess.run(
        ["gcc", "-fsanitize=address", str(src), "-o", exe], capture_output=True
    ).returncode:
        pytest.skip("no ASan runtime")
    out = subprocess.run([exe], capture_output=True, text=True)
    assert out.returncode != 0 and "heap-buffer-overflow" in out.stderr
