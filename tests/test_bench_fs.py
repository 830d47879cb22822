"""The strategy x file-system matrix (``ringq bench --fs``) on real loop devices and a real tmpfs:
a tiny run produces a full matrix, and a run interrupted by SIGINT or SIGTERM in the middle leaves
no mount and no loop device behind.  Needs root and a free loop device; skipped in one line
otherwise.  Nothing here judges a figure."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SBIN = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop devices and mount)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool, path=SBIN) is None:
            return f"{tool} is not installed"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices"
    free = subprocess.run(
        [shutil.which("losetup", path=SBIN), "--find"], capture_output=True, text=True
    )
    if free.returncode != 0:
        return f"no free loop device: {free.stderr.strip()}"
    return None


needs_loop = pytest.mark.skipif(_why_not() is not None, reason=f"loop-device matrix: {_why_not()}")


def test_a_missing_mkfs_names_its_package():
    from ringq.bench.fs import FsSpec, why_not

    specs = {"zfs": FsSpec("zfs", ("mkfs.no-such-fs-here",), "zfsutils-linux")}
    why = why_not("zfs", specs)
    if os.geteuid() == 0 and os.path.exists("/dev/loop-control"):
        assert why == "mkfs.no-such-fs-here is not installed (apt-get install zfsutils-linux)"
    else:
        assert why in (
            "needs root (loop devices and mount)",
            "no loop devices (/dev/loop-control is missing)",
        )


NOT_ROOT = """
import os, sys
import ringq.bench, ringq.bench.fs, ringq.bench.here
os.seteuid(65534)
sys.exit(ringq.bench.main(sys.argv[1:]))
"""


@pytest.mark.skipif(
    os.geteuid() != 0, reason="drops root to show the non-root message; runs as root"
)
def test_without_root_the_matrix_is_skipped_in_one_line(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            NOT_ROOT,
            "--fs",
            "ext4,tmpfs",
            "--smoke",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert (
        res.stderr
        == "skipped the file-system matrix (ext4,tmpfs): needs root (loop devices and mount)\n"
    )
    assert res.stdout == "" and not (tmp_path / "out").exists()


def _leftovers(under) -> list[str]:
    """Mounts and loop devices whose mount point or backing file lies under ``under``."""
    under = os.path.realpath(under)
    found = []
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        found += [line.strip() for line in fh if line.split()[1].startswith(under)]
    losetup = subprocess.run(
        [shutil.which("losetup", path=SBIN), "-a"], capture_output=True, text=True
    )
    found += [line for line in losetup.stdout.splitlines() if under in line]
    return found


def _argv(tmp_path, *extra: str, plots: bool = False) -> list[str]:
    return [
        sys.executable, "-m", "ringq.bench", "--smoke", "--fs", "ext4,tmpfs", "--fs-image-mib", "256",
        "--dir", str(tmp_path / "scratch"), "--out", str(tmp_path / "out"),
        *([] if plots else ["--no-plots"]), *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


@needs_loop
def test_tiny_ext4_and_tmpfs_matrix_then_nothing_left_mounted(tmp_path):
    res = subprocess.run(
        _argv(tmp_path, plots=True),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "| operation | system | durable | ext4 jobs/s (× floor) | tmpfs jobs/s (× floor) |"
        in res.stdout
    )
    data = json.loads((tmp_path / "out" / "fs-matrix.json").read_text())
    assert data["skipped"] == {}
    assert data["file_systems"]["ext4"]["device"].startswith("/dev/loop")
    assert " type ext4 " in data["file_systems"]["ext4"]["mount"]
    assert " type tmpfs " in data["file_systems"]["tmpfs"]["mount"]
    cells = {(m["variant"], m["system"]): m["fs"] for m in data["matrix"]}
    for system in (
        "raw pwrite+fdatasync",
        "raw mmap store+msync",
        "ringq none",
        "ringq msync",
        "ringq fdatasync",
        "ringq group",
        "ringq interval",
    ):
        for fs in ("ext4", "tmpfs"):
            c = cells[("enqueue x1", system)][fs]
            assert c["ops_per_s"] > 0 and c["p50_us"] > 0 and c["x_floor"] > 0
    assert cells[("enqueue x1", "raw pwrite+fdatasync")]["ext4"]["x_floor"] == 1
    assert cells[("lease_one+ack", "ringq msync, sync_acks")]["tmpfs"]["ops_per_s"] > 0
    assert (tmp_path / "out" / "fs-matrix.md").read_text().startswith("| operation | system |")
    plotted = (tmp_path / "out" / "fs-matrix.png").exists()
    assert plotted or "no plot: matplotlib is not installed" in res.stderr
    assert _leftovers(tmp_path) == []
    assert list((tmp_path / "scratch").iterdir()) == []


@needs_loop
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_mid_run_unmounts_and_detaches(tmp_path, sig, status):
    # Many repeats: the run is still measuring when the signal comes.
    proc = subprocess.Popen(
        _argv(tmp_path, "--repeats", "1000"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    try:
        seen = []
        deadline = time.monotonic() + 60
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("[tmpfs, repeat 2/"):  # both mounted, measuring
                break
            assert time.monotonic() < deadline, "".join(seen)
        assert _leftovers(tmp_path), "the run should have mounts while measuring"
        proc.send_signal(sig)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:  # the test failed: still let the run clean up after itself
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == status, "".join(seen) + rest
    assert "Traceback" not in rest, rest
    assert _leftovers(tmp_path) == []
    assert list((tmp_path / "scratch").iterdir()) == []
