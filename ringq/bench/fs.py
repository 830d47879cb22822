"""The strategy x file-system matrix: ``--fs ext4,xfs,btrfs,tmpfs`` (docs/benchmarks.md).

Each file system but tmpfs is made on a loop device backed by a sparse file in a scratch directory
(``--dir``, default a temporary directory), with the distribution's ``mkfs`` at its defaults, and
mounted next to it; tmpfs is mounted directly.  On every mounted file system the harness runs the
one-producer set of ``single_producer``: the two raw floors and every durability strategy, each
kind of operation interleaved in rounds, exactly as a one-file-system run does.  The whole set is
repeated ``--repeats`` times, visiting the file systems in a rotating order, so that the drift of
a shared disk spreads over all of them.

Every figure is also given as a ratio to *that file system's* raw ``pwrite`` + ``fdatasync``
floor measured in the same interleaved set: a loop device adds its backing file's own syncs on the
host file system to every flush, so absolute figures here are lower than on a real device of the
same type, while the ratio to the floor measured through the same stack is what carries over.

Cleanup is unconditional: every mount is unmounted and every loop device detached on the way out,
also on an error, ``KeyboardInterrupt`` (SIGINT) or SIGTERM (turned into ``SystemExit(143)``).
Signals are held while a device is attached or mounted and its cleanup registered, and during
cleanup, so that an interrupt never leaves one behind.  Needs root; without it, or without a
loop device, the matrix is skipped with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .harness import FLOOR, MMAP_STORE, Sizes, environment, single_producer

__all__ = [
    "FILE_SYSTEMS",
    "FsSpec",
    "add_arguments",
    "why_not",
    "mounted",
    "run",
    "matrix",
    "markdown",
    "plot",
]

SBIN = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin"])


@dataclass(frozen=True)
class FsSpec:
    """How to make one file system: its ``mkfs`` and the Debian package that ships it."""

    name: str
    mkfs: tuple[str, ...]  # the command without the device; empty for tmpfs
    package: str | None


FILE_SYSTEMS = {
    # Inode tables and the journal are initialised by mkfs, not lazily after mount: the kernel's
    # lazy initialisation would write in the background during the measurement.
    "ext4": FsSpec(
        "ext4",
        ("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"),
        "e2fsprogs",
    ),
    "xfs": FsSpec("xfs", ("mkfs.xfs", "-q", "-f"), "xfsprogs"),
    "btrfs": FsSpec("btrfs", ("mkfs.btrfs", "-q", "-f"), "btrfs-progs"),
    "tmpfs": FsSpec("tmpfs", (), None),
}
IMAGE_MIB = 2048  # sparse: costs only what is written; above btrfs' mixed-block-group threshold
REPEATS = {"smoke": 1, "short": 2, "full": 3}


class FsSetupError(Exception):
    """A file system could not be made or mounted (its column is skipped with this message)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--fs LIST [--repeats N] [--fs-image-mib N]`` on the harness's parser."""
    p.add_argument(
        "--fs",
        metavar="LIST",
        help=f"strategy x file-system matrix on loop devices, e.g. "
        f"{','.join(FILE_SYSTEMS)} (needs root)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        help="with --fs: times the whole set is repeated, in rotating "
        f"file-system order (default: {REPEATS['short']}, --full {REPEATS['full']})",
    )
    p.add_argument(
        "--fs-image-mib",
        type=int,
        default=IMAGE_MIB,
        help="with --fs: size of each sparse image and of the tmpfs, MiB",
    )


# -- making and removing file systems ---------------------------------------------------------------


def _tool(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + SBIN)


def why_not(name: str, specs: dict[str, FsSpec] = FILE_SYSTEMS) -> str | None:
    """Why file system ``name`` (a key of ``specs``) cannot be measured here (one line), or None."""
    spec = specs[name]
    if os.geteuid() != 0:
        return "needs root (loop devices and mount)"
    for tool in ("mount", "umount") + (("losetup",) if spec.mkfs else ()):
        if _tool(tool) is None:
            return f"{tool} is not installed (apt-get install mount)"
    if spec.mkfs:
        if not os.path.exists("/dev/loop-control"):
            return "no loop devices (/dev/loop-control is missing)"
        if _tool(spec.mkfs[0]) is None:
            return f"{spec.mkfs[0]} is not installed (apt-get install {spec.package})"
    return None


def _cmd(argv: list[str], timeout: float = 120) -> str:
    argv = [_tool(argv[0]) or argv[0], *argv[1:]]
    res = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if res.returncode != 0:
        raise FsSetupError(f"{' '.join(argv)}: {(res.stderr or res.stdout).strip()[-300:]}")
    return res.stdout


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends (they are delivered then, not lost)."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM raises ``SystemExit(143)`` so that ``finally`` blocks (the cleanup) run."""

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _mount_line(path: str) -> str:
    """``"DEV on PATH type FS (OPTIONS)"`` for the mount at ``path``, or "" if none."""
    real = os.path.realpath(path)
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            # /proc/self/mounts writes a space, tab, newline or backslash in a path as \ooo.
            p = [
                re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f) for f in line.split()
            ]
            if len(p) >= 4 and p[1] == real:
                return f"{p[0]} on {p[1]} type {p[2]} ({p[3]})"
    return ""


def _is_mounted(path: str) -> bool:
    return _mount_line(path) != ""


def _unmount(mnt: str, log: Callable[[str], None]) -> bool:
    """Unmount ``mnt``; a busy mount (a file still open) is retried for up to 10 s, then detached
    lazily (the kernel finishes when the last file closes).  True when nothing is left mounted."""
    deadline = time.monotonic() + 10
    while True:
        try:
            _cmd(["umount", mnt], timeout=60)
            return True
        except (FsSetupError, subprocess.TimeoutExpired) as exc:
            if not _is_mounted(mnt):
                return True
            if time.monotonic() > deadline:
                log(f"  {mnt} stays busy ({exc}); detaching it lazily")
                break
            time.sleep(0.05)
    try:
        _cmd(["umount", "-l", mnt])
        return True
    except FsSetupError as exc:
        log(f"  COULD NOT UNMOUNT {mnt}: {exc}")
        return False


@contextlib.contextmanager
def mounted(
    name: str, scratch: str, image_mib: int, log: Callable[[str], None]
) -> Iterator[dict[str, Any]]:
    """Make and mount file system ``name`` in ``scratch``; yield its description (``path`` is the
    mount point).  On the way out, whatever happened: unmount, detach, remove the image.

    Raises:
        FsSetupError: a tool failed (its stderr is in the message); nothing is left behind.
    """
    spec = FILE_SYSTEMS[name]
    mnt = os.path.join(scratch, f"mnt-{name}")
    img = os.path.join(scratch, f"{name}.img")
    os.mkdir(mnt, 0o700)
    dev = None
    is_mounted = False
    try:
        if not spec.mkfs:
            with _signals_held():
                _cmd(
                    [
                        "mount",
                        "-t",
                        "tmpfs",
                        "-o",
                        f"size={image_mib}m,mode=0700",
                        "ringq-bench",
                        mnt,
                    ]
                )
                is_mounted = True
        else:
            with open(img, "wb") as fh:
                fh.truncate(image_mib << 20)  # sparse
            with _signals_held():
                dev = _cmd(["losetup", "--find", "--show", img]).strip()
            _cmd([*spec.mkfs, dev], timeout=300)
            with _signals_held():
                _cmd(["mount", dev, mnt])
                is_mounted = True
        os.chmod(mnt, 0o700)
        info = {
            "path": mnt,
            "device": dev,
            "image": img if dev else None,
            "image_mib": image_mib,
            "mkfs": " ".join(spec.mkfs) or None,
            "mount": _mount_line(mnt),
        }
        log(
            f"mounted {name}: {info['mount']}"
            + (f" (loop over {img}, sparse {image_mib} MiB)" if dev else "")
        )
        yield info
    finally:
        with _signals_held():
            if is_mounted:
                is_mounted = not _unmount(mnt, log)
            if dev is not None:
                try:
                    _cmd(["losetup", "-d", dev])
                except FsSetupError as exc:
                    log(f"  COULD NOT DETACH {dev}: {exc}")
            if not is_mounted:
                with contextlib.suppress(OSError):
                    os.rmdir(mnt)  # never rmtree: it would descend into a mount still there
            with contextlib.suppress(FileNotFoundError):
                os.unlink(img)


# -- the matrix ----------------------------------------------------------------------------------------


def matrix(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per measured row (variant, system), with per-file-system medians over the repeats.

    ``runs``: ``[{"fs": name, "repeat": r, "rows": [Row as dict, ...]}, ...]``.  For every file
    system and row: ``ops_per_s``, ``p50_us``, ``p99_us`` (medians over the repeats), ``x_floor``
    and ``x_mmap_store`` (median of the per-repeat ratios to the floor and to the raw mmap
    store+msync loop of the same interleaved set, i.e. the same file system and repeat), ``x_floor_min``/``x_floor_max`` and ``repeats``.
    """
    keys: list[tuple[str, str]] = []
    durable: dict[tuple[str, str], bool] = {}
    per: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        rows = run["rows"]
        fl = next(
            (r["ops_per_s"] for r in rows if r["system"] == FLOOR and r["variant"] == "enqueue x1"),
            None,
        )
        mfl = next(
            (
                r["ops_per_s"]
                for r in rows
                if r["system"] == MMAP_STORE and r["variant"] == "enqueue x1"
            ),
            None,
        )
        for r in rows:
            k = (r["variant"], r["system"])
            if k not in per:
                keys.append(k)
                per[k] = {}
                durable[k] = r["durable"]
            per[k].setdefault(run["fs"], []).append(
                {
                    **r,
                    "x_floor": r["ops_per_s"] / fl if fl else None,
                    "x_mmap_store": r["ops_per_s"] / mfl if mfl else None,
                }
            )
    out = []
    for k in keys:
        cells = {}
        for fsname, got in per[k].items():

            def med(key: str, got=got) -> float | None:
                xs = [g[key] for g in got if g[key] is not None]
                return statistics.median(xs) if xs else None

            ratios = [g["x_floor"] for g in got if g["x_floor"] is not None]
            cells[fsname] = {
                "ops_per_s": med("ops_per_s"),
                "p50_us": med("p50_us"),
                "p99_us": med("p99_us"),
                "x_floor": med("x_floor"),
                "x_mmap_store": med("x_mmap_store"),
                "x_floor_min": min(ratios, default=None),
                "x_floor_max": max(ratios, default=None),
                "repeats": len(got),
            }
        out.append({"variant": k[0], "system": k[1], "durable": durable[k], "fs": cells})
    return out


def _f(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def markdown(mat: list[dict[str, Any]], names: list[str]) -> str:
    """Two tables: jobs/s with the ratio to the file system's own fdatasync floor, and p50/p99 µs."""
    out = [
        "| operation | system | durable | "
        + " | ".join(f"{n} jobs/s (× floor)" for n in names)
        + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for m in mat:
        cells = []
        for n in names:
            c = m["fs"].get(n)
            if not c:
                cells.append("–")
                continue
            spread = ""
            if c["repeats"] > 1 and c["x_floor_min"] is not None:
                spread = f" [{_f(c['x_floor_min'])}–{_f(c['x_floor_max'])}]"
            cells.append(f"{_f(c['ops_per_s'])} ({_f(c['x_floor'])}{spread})")
        out.append(
            f"| {m['variant']} | {m['system']} | {'yes' if m['durable'] else 'no'} | "
            + " | ".join(cells)
            + " |"
        )
    out += [
        "",
        "| operation | system | " + " | ".join(f"{n} p50 / p99 µs" for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for m in mat:
        cells = [
            f"{_f(c['p50_us'])} / {_f(c['p99_us'])}" if (c := m["fs"].get(n)) else "–"
            for n in names
        ]
        out.append(f"| {m['variant']} | {m['system']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(
    mat: list[dict[str, Any]], names: list[str], path: str, log: Callable[[str], None]
) -> str | None:
    """Grouped bars per row, one bar per file system: ratio to its own floor, and p50 (log scales)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no plot: matplotlib is not installed (pip install 'ringq[bench]')")
        return None
    sel = [
        m
        for m in mat
        if m["variant"] in ("enqueue x1", "lease_one+ack")
        or m["variant"].startswith("enqueue_many")
    ]
    labels = [f"{m['system'].removeprefix('ringq ')}\n{m['variant']}" for m in sel]
    fig, axes = plt.subplots(2, 1, figsize=(max(10, len(sel) * 0.9), 8), sharex=True)
    width = 0.8 / max(1, len(names))
    x = np.arange(len(sel))
    for k, n in enumerate(names):
        ratio = [(m["fs"].get(n) or {}).get("x_floor") or 0 for m in sel]
        p50 = [(m["fs"].get(n) or {}).get("p50_us") or 0 for m in sel]
        axes[0].bar(x + k * width, ratio, width, label=n)
        axes[1].bar(x + k * width, p50, width, label=n)
    axes[0].axhline(1, color="k", ls="--", lw=1)
    axes[0].set_ylabel("× own pwrite+fdatasync floor (log)")
    axes[1].set_ylabel("p50 µs per call (log)")
    for ax in axes:
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(
        "ringq durability strategies by file system (loop devices; medians over repeats)"
    )
    axes[1].set_xticks(
        x + width * (len(names) - 1) / 2, labels, rotation=60, ha="right", fontsize=7
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- driver ----------------------------------------------------------------------------------------------


def _loadavg() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _measure_child(path: str, sz: Sizes, log: Callable[[str], None], out) -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # forked while held
    work = tempfile.mkdtemp(prefix="work-", dir=path)
    try:
        rows = single_producer(work, sz, log, with_peers=False)
        out.send([asdict(r) | {"cdf_us": None} for r in rows])
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        out.send(f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure_in_child(path: str, sz: Sizes, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """``single_producer`` in ``path``, run in a forked child process.

    An interrupt can come at any instruction, e.g. between an ``open`` and the registration of its
    ``close``; a file left open would keep the mount busy.  The child's death releases all of its
    files and mappings, so the parent, which kills and reaps it on the way out, can unmount.

    Raises:
        RuntimeError: the measurement failed (the child's error is in the message).
    """
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_measure_child, args=(path, sz, log, send), daemon=True)
    try:
        # Held across the fork: an interrupt inside start() would either be lost in an at-fork
        # hook ("Exception ignored") or leave a child running that this frame does not reap.
        with _signals_held():
            child.start()
        send.close()
        got = recv.recv()
    except EOFError:
        child.join(10)
        got = f"the measuring process died (exit status {child.exitcode})"
    finally:
        if child.pid is not None:
            if child.is_alive():
                child.kill()
            child.join()
        recv.close()
    if isinstance(got, str):
        raise RuntimeError(f"measuring in {path}: {got}")
    return got


def run(args: argparse.Namespace, mode: str, sz: Sizes) -> int:
    """The ``--fs`` run: returns 0 (also when every column was skipped, each said in one line),
    2 for an unknown file system; SIGINT raises KeyboardInterrupt and SIGTERM SystemExit(143)
    after everything was unmounted and detached."""
    names = [n.strip() for n in args.fs.split(",") if n.strip()]
    bad = [n for n in names if n not in FILE_SYSTEMS]
    if bad or not names:
        print(
            f"ringq bench: unknown file system(s) {bad}; choose from {','.join(FILE_SYSTEMS)}",
            file=sys.stderr,
        )
        return 2
    repeats = args.repeats if args.repeats else REPEATS[mode]
    if repeats < 1 or args.fs_image_mib < 64:
        print(
            "ringq bench: --repeats must be at least 1 and --fs-image-mib at least 64",
            file=sys.stderr,
        )
        return 2
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    if os.geteuid() != 0:
        log(
            f"skipped the file-system matrix ({','.join(names)}): needs root (loop devices and mount)"
        )
        return 0
    os.makedirs(args.out, exist_ok=True)
    skipped: dict[str, str] = {}
    for n in names:
        why = why_not(n)
        if why:
            skipped[n] = why
            log(f"skipped {n}: {why}")
    parent = os.path.abspath(args.dir) if args.dir else None
    if parent:
        os.makedirs(parent, exist_ok=True)
    runs: list[dict[str, Any]] = []
    info: dict[str, dict[str, Any]] = {}
    with _sigterm_exits():
        scratch = tempfile.mkdtemp(prefix="ringq-fs-", dir=parent)
        try:
            env = environment(scratch)
            log(
                f"ringq bench --fs ({mode}, {repeats} repeat(s)) in {scratch} [host: {env['mount']}]"
            )
            with contextlib.ExitStack() as stack:
                for n in names:
                    if n in skipped:
                        continue
                    try:
                        # Held so that no interrupt falls between the mount and the
                        # registration of its cleanup (mkfs waits for it, too).
                        with _signals_held():
                            info[n] = stack.enter_context(
                                mounted(n, scratch, args.fs_image_mib, log)
                            )
                    except (FsSetupError, subprocess.TimeoutExpired) as exc:
                        skipped[n] = str(exc)
                        log(f"skipped {n}: {exc}")
                live = [n for n in names if n in info]
                for rep in range(repeats):
                    for n in live[rep % max(1, len(live)) :] + live[: rep % max(1, len(live))]:
                        log(f"[{n}, repeat {rep + 1}/{repeats}]")
                        rows = _measure_in_child(info[n]["path"], sz, log)
                        runs.append({"fs": n, "repeat": rep, "loadavg": _loadavg(), "rows": rows})
        except KeyboardInterrupt:
            # The ExitStack above has unmounted and detached by now; say so instead of a traceback.
            log("interrupted: the file systems were unmounted and their loop devices detached")
            return 130
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(scratch)  # empty once every mount point and image is gone
    live = [n for n in names if n in info]
    mat = matrix(runs)
    table = markdown(mat, live) if live else "(no file system could be measured)"
    print(table)
    env["loadavg_at_end"] = _loadavg()
    result = {
        "mode": mode,
        "sizes": asdict(sz),
        "repeats": repeats,
        "env": env,
        "file_systems": info,
        "skipped": skipped,
        "matrix": mat,
        "runs": runs,
    }
    with open(os.path.join(args.out, "fs-matrix.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    with open(os.path.join(args.out, "fs-matrix.md"), "w", encoding="utf-8") as fh:
        fh.write(table + "\n")
    if live and not args.no_plots:
        p = plot(mat, live, os.path.join(args.out, "fs-matrix.png"), log)
        if p:
            log(f"plot: {p}")
    log(f"raw figures and environment: {os.path.join(args.out, 'fs-matrix.json')}")
    return 0
