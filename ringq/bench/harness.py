"""The benchmark harness: durability strategies, the physical limit and peer queues, in one run.

``ringq bench`` (``main(argv)``) runs the short version; ``benchmarks/run.py`` the full one
(``--full``); ``--smoke`` runs tiny sizes in a few seconds (tests/test_bench_smoke.py).  Every run
prints a Markdown table, writes every figure and the environment to ``results.json`` in ``--out``
and, if matplotlib is installed, PNG plots next to it.

Methodology (also in docs/benchmarks.md): every scenario runs in this one process or in fresh
child processes, in one scratch directory on one file system (``--dir``); the physical limit (a
raw ``pwrite`` of a small record into a preallocated file + ``fdatasync``) is measured at the
start and again at the end of the run, and every durable throughput is also given as a ratio to
its mean.  Latencies are per call, ``time.perf_counter_ns`` around the call.  Peers are driven
through their own public APIs with the same payloads; a peer that is not installed is skipped
with a line saying so.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as md
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Row", "Sizes", "SIZES", "FLOOR", "MMAP_STORE"]

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGIES = ("none", "msync", "fdatasync", "group", "interval")
DURABLE = {"msync", "fdatasync", "group"}  # an enqueue that returned survives power loss
BATCH = 1000
ACK_BATCH = 100  # jobs per lease(n) + ack_many call


def payload(i: int) -> dict[str, Any]:
    """The job every queue gets: a small JSON object (about 80 bytes encoded)."""
    return {"n": i, "kind": "resize", "path": f"/srv/images/{i:08d}.jpg", "w": 640}


@dataclass
class Sizes:
    ops: int  # enqueue calls / lease+ack round trips per measurement
    batches: int  # enqueue_many calls of BATCH jobs per measurement
    fanout: int  # wake-ups measured per fan-out system
    cold: int  # pending jobs for the cold-open / stats / memory scenarios
    floor: int  # iterations of the raw fdatasync loop at the start and at the end
    rounds: int  # interleaved rounds the ops/batches are split into
    producers: int = 4


SIZES = {
    "smoke": Sizes(ops=8, batches=1, fanout=10, cold=2_000, floor=8, rounds=1),
    "short": Sizes(ops=1_000, batches=8, fanout=300, cold=100_000, floor=500, rounds=4),
    "full": Sizes(ops=4_000, batches=32, fanout=2_000, cold=1_000_000, floor=1_000, rounds=16),
}


@dataclass
class Row:
    """One measured figure.  ``ops_per_s`` counts jobs (not calls); latencies are per call, in µs."""

    scenario: str
    system: str
    variant: str
    durable: bool
    producers: int = 1
    jobs: int = 0
    seconds: float = 0.0
    ops_per_s: float = 0.0
    p50_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    cdf_us: list[float] | None = None  # latency quantiles 0..1 in 200 steps, for the plots

    def ratio(self, base: float | None) -> float | None:
        return self.ops_per_s / base if base else None


def _lat_row(
    scenario: str,
    system: str,
    variant: str,
    durable: bool,
    lat_ns: Sequence[int],
    jobs: int,
    seconds: float,
    producers: int = 1,
    **extra: Any,
) -> Row:
    a = np.asarray(lat_ns, dtype=np.float64) / 1000.0
    row = Row(
        scenario,
        system,
        variant,
        durable,
        producers,
        jobs,
        seconds,
        jobs / seconds if seconds else 0.0,
        extra=extra,
    )
    if len(a):
        row.p50_us, row.p99_us, row.p999_us = (float(x) for x in np.percentile(a, [50, 99, 99.9]))
        row.cdf_us = [round(float(x), 2) for x in np.quantile(a, np.linspace(0, 1, 201))]
    return row


def _timed(fn: Callable[[int], Any], n: int) -> tuple[list[int], float]:
    lat = [0] * n
    clock = time.perf_counter_ns
    t0 = clock()
    for i in range(n):
        t = clock()
        fn(i)
        lat[i] = clock() - t
    return lat, (clock() - t0) / 1e9


# -- environment ---------------------------------------------------------------------------------


def loadavg() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def environment(scratch: str) -> dict[str, Any]:
    from ringq.engine.ring import fs_type

    cpu = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), ""
            )
    versions: dict[str, str | None] = {}
    for pkg in (
        "ringq",
        "numpy",
        "cffi",
        "nobroker",
        "persist-queue",
        "litequeue",
        "redis",
        "faster-fifo",
        "matplotlib",
        "orjson",
    ):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    if versions["ringq"] is None:  # run from a source checkout
        from ringq import __version__

        versions["ringq"] = f"{__version__} (source)"
    import sqlite3

    versions["sqlite"] = sqlite3.sqlite_version
    redis_bin = shutil.which("redis-server")
    if redis_bin:
        with contextlib.suppress(Exception):
            versions["redis-server"] = (
                subprocess.run([redis_bin, "--version"], capture_output=True, text=True, timeout=10)
                .stdout.split()[2]
                .removeprefix("v=")
            )
    mounts = ""
    with contextlib.suppress(OSError):
        real = os.path.realpath(scratch)
        best = ""
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            for line in fh:
                p = line.split()
                if (
                    len(p) >= 4
                    and (real == p[1] or real.startswith(p[1].rstrip("/") + "/"))
                    and len(p[1]) >= len(best)
                ):
                    best, mounts = p[1], f"{p[0]} on {p[1]} type {p[2]} ({p[3]})"
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "loadavg_at_start": loadavg(),
        "scratch_dir": scratch,
        "file_system": fs_type(scratch),
        "mount": mounts,
        "versions": versions,
    }


# -- 1. the physical limit -----------------------------------------------------------------------


FLOOR = "raw pwrite+fdatasync"
#: Not a floor: the write path of format 1 (records stored through a writable shared mapping),
#: shown for contrast.  Format 2 writes records with ``pwrite`` into a file mapped read-only, and
#: ringq's own ``msync`` row runs faster than this loop where the page cache holds the file in
#: large folios (ext4, xfs: docs/benchmarks.md).
MMAP_STORE = "raw mmap store+msync"


def raw_floor(scratch: str, n: int, label: str, kind: str = FLOOR) -> Row:
    """A raw loop over a preallocated, zero-filled file: write 128 bytes at the next offset, sync.

    ``FLOOR``: ``pwrite`` + ``fdatasync`` (the physical limit of one small durable write).
    ``MMAP_STORE``: a store through a MAP_SHARED mapping + ``msync(MS_SYNC)`` of its page (format
    1's way of writing a record, for contrast; not a limit of format 2, which does not write
    through a mapping).
    """
    import mmap

    path = os.path.join(scratch, f"floor-{label}.dat")
    size = max(n * 128, 1 << 20)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    mm = None
    try:
        os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, bytes(size), 0)
        os.fsync(fd)
        rec = b"r" * 128
        if kind == FLOOR:

            def op(i: int) -> None:
                os.pwrite(fd, rec, i * 128)
                os.fdatasync(fd)
        else:
            mm = mmap.mmap(fd, size)

            def op(i: int) -> None:
                off = i * 128
                mm[off : off + 128] = rec
                mm.flush(off & ~4095, 4096)

        lat, secs = _timed(op, n)
    finally:
        if mm is not None:
            mm.close()
        os.close(fd)
        os.unlink(path)
    return _lat_row("floor", kind, label, True, lat, n, secs)


class _FloorAdapter:
    """A floor loop as a contestant: each ``enqueue`` writes 128 bytes at the next offset and syncs."""

    enqueue_many = None

    def __init__(self, path: str, kind: str, n: int) -> None:
        import mmap

        self.kind = kind
        size = max(n * 128, 1 << 20)
        self.path = os.path.join(path, "floor.dat")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.posix_fallocate(self.fd, 0, size)
        os.pwrite(self.fd, bytes(size), 0)
        os.fsync(self.fd)
        self.mm = mmap.mmap(self.fd, size) if kind == MMAP_STORE else None
        self.off = 0
        self.rec = b"r" * 128

    def enqueue(self, _p: Any) -> None:
        off = self.off
        self.off += 128
        if self.mm is None:
            os.pwrite(self.fd, self.rec, off)
            os.fdatasync(self.fd)
        else:
            self.mm[off : off + 128] = self.rec
            self.mm.flush(off & ~4095, 4096)

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
        os.close(self.fd)


FORMAT1 = "format 1 write path (mapping store+msync)"


class _Format1Adapter:
    """Format 1's append (ringq/engine/format1.py), a contestant that shows what format 2 saves."""

    enqueue_many = None

    def __init__(self, path: str, n: int) -> None:
        from ringq.engine.format1 import Format1Writer

        self.w = Format1Writer(path, n)
        self.enqueue = self.w.append

    def close(self) -> None:
        self.w.close()


class _RingqAdapter:
    def __init__(self, path: str, durability: str, **kw: Any) -> None:
        self.q = _open_ringq(path, durability, **kw)
        self.enqueue = self.q.enqueue
        self.enqueue_many = self.q.enqueue_many

    def lease_ack(self) -> None:
        q = self.q
        q.ack(q.lease_one())

    def lease_ack_many(self) -> None:
        q = self.q
        q.ack_many(q.lease(ACK_BATCH))

    def close(self) -> None:
        self.q.close()


def _open_ringq(path: str, durability: str, **kw: Any):
    from ringq.local.queue import Queue

    return Queue(path, durability=durability, **kw)


# -- 2./3. one producer: ringq's strategies, the floors and the peers, interleaved ------------------
#
# The disk's speed drifts by several times over minutes on a shared or virtual machine, and the CPU
# is shared too.  So every contestant of one kind of operation is opened first, then all of them
# run in rounds of equal chunks, in a rotating order; a figure is the sum over its chunks.


def _contestants(
    kind: str,
    scratch: str,
    sz: Sizes,
    stack: contextlib.ExitStack,
    with_peers: bool,
    log: Callable[[str], None],
) -> list[tuple[str, bool, Callable[[str], Any]]]:
    out: list[tuple[str, bool, Callable[[str], Any]]] = []
    if kind == "one":
        out += [
            (FLOOR, True, lambda p: _FloorAdapter(p, FLOOR, sz.ops)),
            (MMAP_STORE, True, lambda p: _FloorAdapter(p, MMAP_STORE, sz.ops)),
            (FORMAT1, True, lambda p: _Format1Adapter(p, sz.ops)),
        ]
    if kind == "leasemany":
        return [
            ("ringq msync (default)", True, lambda p: _RingqAdapter(p, "msync")),
            ("ringq msync, sync_acks", True, lambda p: _RingqAdapter(p, "msync", sync_acks=True)),
        ]
    if kind == "lease":
        out += [
            ("ringq none", False, lambda p: _RingqAdapter(p, "none")),
            ("ringq msync (default)", True, lambda p: _RingqAdapter(p, "msync")),
            ("ringq msync, sync_acks", True, lambda p: _RingqAdapter(p, "msync", sync_acks=True)),
        ]
    else:
        out += [
            (f"ringq {d}", d in DURABLE, (lambda d: lambda p: _RingqAdapter(p, d))(d))  # noqa: B023
            for d in STRATEGIES
        ]
    if with_peers:
        from . import peers as bp

        for peer in bp.PEERS:
            why = peer.missing()
            if why:
                if kind == "one":
                    log(f"  skipped {peer.name}: {why}")
                continue
            try:
                out += stack.enter_context(peer.configs(scratch))
            except Exception as exc:  # noqa: BLE001 - a broken peer must not sink the run
                log(f"  skipped {peer.name}: {type(exc).__name__}: {exc}")
    return out


def single_producer(
    scratch: str, sz: Sizes, log: Callable[[str], None], with_peers: bool
) -> list[Row]:
    rows = []
    for kind, variant in (
        ("one", "enqueue x1"),
        ("many", f"enqueue_many x{BATCH}"),
        ("lease", "lease_one+ack"),
        ("leasemany", f"lease({ACK_BATCH})+ack_many"),
    ):
        log(f"{variant} (one producer, {sz.rounds} interleaved rounds):")
        with contextlib.ExitStack() as stack:
            opened = []
            for label, durable, open_ in _contestants(kind, scratch, sz, stack, with_peers, log):
                path = tempfile.mkdtemp(prefix="single-", dir=scratch)
                try:
                    q = open_(path)
                except Exception as exc:  # noqa: BLE001
                    log(f"  skipped {label}: {type(exc).__name__}: {exc}")
                    continue
                stack.callback(shutil.rmtree, path, True)
                stack.callback(q.close)
                if kind == "many" and q.enqueue_many is None:
                    continue
                if kind == "leasemany":
                    for _ in range(-(-sz.batches * ACK_BATCH // BATCH)):
                        q.enqueue_many([payload(i) for i in range(BATCH)])
                if kind == "lease":
                    if q.enqueue_many is not None:
                        q.enqueue_many([payload(i) for i in range(sz.ops)])
                    else:
                        for i in range(sz.ops):
                            q.enqueue(payload(i))
                opened.append((label, durable, q))
            calls = sz.ops if kind in ("one", "lease") else sz.batches
            chunk = max(1, calls // sz.rounds)
            batch = [payload(i) for i in range(BATCH)]
            lat: dict[str, list[int]] = {label: [] for label, _d, _q in opened}
            secs: dict[str, float] = dict.fromkeys(lat, 0.0)
            for r in range(sz.rounds):
                k = r % max(1, len(opened))
                for label, _durable, q in opened[k:] + opened[:k]:
                    if kind == "one":
                        fn = lambda i, q=q: q.enqueue(payload(i))  # noqa: E731
                    elif kind == "many":
                        fn = lambda i, q=q: q.enqueue_many(batch)  # noqa: E731, B023
                    elif kind == "leasemany":
                        fn = lambda i, q=q: q.lease_ack_many()  # noqa: E731
                    else:
                        fn = lambda i, q=q: q.lease_ack()  # noqa: E731
                    got, t = _timed(fn, chunk)
                    lat[label] += got
                    secs[label] += t
            for label, durable, _q in opened:
                jobs = len(lat[label]) * {"many": BATCH, "leasemany": ACK_BATCH}.get(kind, 1)
                scenario = "floor" if label in (FLOOR, MMAP_STORE, FORMAT1) else "single"
                row = _lat_row(scenario, label, variant, durable, lat[label], jobs, secs[label])
                rows.append(row)
                log(f"  {label:38s} {row.ops_per_s:12,.0f} jobs/s  p50 {row.p50_us or 0:9.1f} µs")
    return rows


# -- 2. producer processes ---------------------------------------------------------------------------


def _producer_child(path: str, durability: str, mode: str, n: int, go, out) -> None:
    q = _open_ringq(path, durability)
    go.wait()
    if mode == "one":
        lat, secs = _timed(lambda i: q.enqueue(payload(i)), n)
    else:
        batch = [payload(i) for i in range(BATCH)]
        lat, secs = _timed(lambda i: q.enqueue_many(batch), n)
    t_end = time.monotonic()
    q.close()
    out.send((lat, secs, t_end))
    out.close()


def run_producers(
    path: str, durability: str, mode: str, calls: int, producers: int
) -> tuple[list[int], float]:
    """``producers`` fresh processes, each ``calls`` enqueue (or enqueue_many) calls, started together.

    Returns (every call's latency, wall seconds from the start signal to the last finish).
    """
    ctx = mp.get_context("fork")
    go = ctx.Event()
    pipes, procs = [], []
    for _ in range(producers):
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_producer_child, args=(path, durability, mode, calls, go, w))
        p.start()
        pipes.append(r)
        procs.append(p)
    time.sleep(0.1)  # let every child open the queue before the start signal
    t0 = time.monotonic()
    go.set()
    lat: list[int] = []
    t_end = t0
    for r in pipes:
        got, _secs, end = r.recv()
        lat.extend(got)
        t_end = max(t_end, end)
    for p in procs:
        p.join(60)
    return lat, t_end - t0


def producer_processes(scratch: str, sz: Sizes, log: Callable[[str], None]) -> list[Row]:
    """Every strategy x (enqueue, enqueue_many) x (1, N producer processes), in interleaved rounds.

    Both the 1- and the N-producer figures come from child processes started the same way, so
    their ratio (what group commit is for) is not skewed by the harness process.
    """
    rows = []
    n = sz.producers
    for mode, variant in (("one", "enqueue x1"), ("many", f"enqueue_many x{BATCH}")):
        log(f"{variant}, 1 and {n} producer processes ({sz.rounds} interleaved rounds):")
        keys = [(d, p) for d in STRATEGIES for p in (1, n)]
        paths = {k: tempfile.mkdtemp(prefix=f"procs-{k[0]}-{k[1]}-", dir=scratch) for k in keys}
        lat: dict[tuple[str, int], list[int]] = {k: [] for k in keys}
        secs = dict.fromkeys(keys, 0.0)
        total = sz.ops if mode == "one" else sz.batches
        for r in range(sz.rounds):
            for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
                per = max(1, total // sz.rounds // k[1])
                got, t = run_producers(paths[k], k[0], mode, per, k[1])
                lat[k] += got
                secs[k] += t
        for k in keys:
            q = _open_ringq(paths[k], "none")
            nsync = q.sync_counters()["queue_append_syncs"]
            q.close()
            jobs = len(lat[k]) * (BATCH if mode == "many" else 1)
            row = _lat_row(
                "processes",
                f"ringq {k[0]}",
                variant,
                k[0] in DURABLE,
                lat[k],
                jobs,
                secs[k],
                k[1],
                syncs=nsync,
            )
            rows.append(row)
            log(
                f"  ringq {k[0]:9s} x{k[1]}: {row.ops_per_s:12,.0f} jobs/s  ({nsync} syncs for {jobs} jobs)"
            )
            shutil.rmtree(paths[k], ignore_errors=True)
    return rows


# -- 4. fan-out latency --------------------------------------------------------------------------
#
# A producer process stamps CLOCK_MONOTONIC (shared by all processes) just before it sends; the
# consumer, blocked in its receive call, stamps again when its handler starts.  The producer
# waits ~1 ms between sends so the consumer is asleep again each time.


def _gap() -> None:
    time.sleep(0.0008 + (time.monotonic_ns() % 400) / 1e6)


def _ping(
    consumer: Callable,
    args: tuple,
    send: Callable[[], None],
    n: int,
    consumers: int = 1,
    stop: Callable[[], None] | None = None,
) -> list[int]:
    """Start ``consumers`` processes running ``consumer(*args, n, ready, pipe)``, send ``n``
    stamped messages with gaps (and FAN_WARM more per consumer first), then (``stop``) one stop
    message per consumer, and return the latencies they measured (ns), all together, without
    each consumer's first FAN_WARM: a process's first wake-ups run on cold caches and lazy
    imports, once per process, and would weigh on p99 as often as the rows restart them."""
    ctx = mp.get_context("fork")
    started = []
    for _ in range(consumers):
        ready = ctx.Event()
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=consumer, args=(*args, n + FAN_WARM * consumers, ready, w))
        p.start()
        started.append((p, ready, r))
    try:
        for _p, ready, _r in started:
            if not ready.wait(10):
                raise RuntimeError("consumer did not start")
        time.sleep(0.05)  # let them block
        for _ in range(n + FAN_WARM * consumers):  # the count each consumer was given
            _gap()
            send()
        if stop is not None:
            for _ in range(consumers):
                stop()
        lat: list[int] = []
        for _p, _ready, r in started:
            if not r.poll(30):
                raise RuntimeError("consumer did not report")
            lat += r.recv()[FAN_WARM:]
        return lat
    finally:
        for p, _ready, _r in started:
            p.join(10)
            if p.is_alive():
                p.kill()


FAN_SPIN = 0.002  # seconds: the spin row's Queue(spin=): longer than the ~1 ms between sends
FAN_CONSUMERS = 4  # consumer processes of the many-consumer rows
FAN_WARM = 3  # wake-ups per consumer process not counted (its first: see _ping)


def _fan_ringq_consumer(path: str, spin: float, n: int, ready, out) -> None:
    q = _open_ringq(path, "none", spin=spin)
    lat: list[int] = []
    ready.set()
    while True:
        job = q.lease_one(wait=5.0)
        if job is None:
            break
        t = job.payload["t"]
        if t is None:  # the stop message
            q.ack(job)
            break
        lat.append(time.monotonic_ns() - t)
        q.ack(job)
    out.send(lat)
    q.close()


def _fan_ringq(scratch: str, n: int, spin: float = 0.0, consumers: int = 1) -> list[int]:
    path = tempfile.mkdtemp(prefix="fan-", dir=scratch)
    q = _open_ringq(path, "none")
    try:
        return _ping(
            _fan_ringq_consumer,
            (path, spin),
            lambda: q.enqueue({"t": time.monotonic_ns()}),
            n,
            consumers,
            lambda: q.enqueue({"t": None}),
        )
    finally:
        q.close()
        shutil.rmtree(path, ignore_errors=True)


def _futex_page(path: str):
    """The futex floor's shared page: the u32 word the producer counts up (offset 0) and the
    send time in ns (offset 8)."""
    from ringq.engine.mapped import Mapped

    fd = os.open(path, os.O_RDWR)
    return Mapped(path, fd, 4096)


def _fan_futex_consumer(path: str, n: int, ready, out) -> None:
    page = _futex_page(path)
    lat = []
    seen = page.load32(0)
    ready.set()
    end = time.monotonic() + 60
    while seen < n and time.monotonic() < end:  # the producer counts the word up to n
        page.futex_wait(0, seen, 1.0)
        cur = page.load32(0)
        if cur == seen:
            continue
        # Two sends may land while this process is descheduled; the newest stamp is the one timed.
        seen = cur
        lat.append(time.monotonic_ns() - page.load64(8))
    out.send(lat)


def _fan_futex(scratch: str, n: int) -> list[int]:
    path = os.path.join(scratch, "futex.page")
    with open(path, "wb") as fh:
        fh.write(bytes(4096))
    page = _futex_page(path)

    def send() -> None:
        page.store64(8, time.monotonic_ns())
        page.add32(0)
        page.futex_wake(0, 1)

    try:
        return _ping(_fan_futex_consumer, (path,), send, n)
    finally:
        page.close()
        os.unlink(path)


def _fan_pyqueue_consumer(q, n: int, ready, out) -> None:
    lat = []
    ready.set()
    while True:
        t = q.get(timeout=5)
        if t is None:  # the stop message
            break
        lat.append(time.monotonic_ns() - t)
    out.send(lat)


def _fan_pyqueue(make: Callable[[], Any], n: int, consumers: int = 1) -> list[int]:
    q = make()
    return _ping(
        _fan_pyqueue_consumer,
        (q,),
        lambda: q.put(time.monotonic_ns()),
        n,
        consumers,
        lambda: q.put(None),
    )


def fanout(scratch: str, sz: Sizes, log: Callable[[str], None]) -> list[Row]:
    """The fan-out rows: ``sz.fanout`` wake-ups per system, measured in ``sz.rounds`` rounds
    (fewer for a small count) that each run every system for its share, in an order that rotates
    from round to round, so that a slow spell of the machine falls on every system alike."""
    systems: list[tuple[str, str, Callable[[int], list[int]]]] = [
        (
            "raw futex wake",
            "floor: FUTEX_WAKE through a shared file mapping",
            lambda n: _fan_futex(scratch, n),
        ),
        (
            "ringq",
            "lease_one(wait=...) woken by enqueue (none)",
            lambda n: _fan_ringq(scratch, n),
        ),
        (
            "ringq",
            f"lease_one(wait=...), Queue(spin={FAN_SPIN}): polls before it sleeps (none)",
            lambda n: _fan_ringq(scratch, n, FAN_SPIN),
        ),
        (
            "multiprocessing.Queue",
            "get() woken by put()",
            lambda n: _fan_pyqueue(lambda: mp.get_context("fork").Queue(), n),
        ),
        (
            "ringq",
            f"{FAN_CONSUMERS} consumer processes in lease_one(wait=...) (none)",
            lambda n: _fan_ringq(scratch, n, consumers=FAN_CONSUMERS),
        ),
        (
            "multiprocessing.Queue",
            f"{FAN_CONSUMERS} consumer processes in get()",
            lambda n: _fan_pyqueue(lambda: mp.get_context("fork").Queue(), n, FAN_CONSUMERS),
        ),
    ]
    try:
        import faster_fifo

        systems.append(
            (
                "faster-fifo",
                "get() woken by put()",
                lambda n: _fan_pyqueue(faster_fifo.Queue, n),
            )
        )
        systems.append(
            (
                "faster-fifo",
                f"{FAN_CONSUMERS} consumer processes in get()",
                lambda n: _fan_pyqueue(faster_fifo.Queue, n, FAN_CONSUMERS),
            )
        )
    except ImportError:
        log("  skipped faster-fifo fan-out: faster-fifo is not installed (pip install faster-fifo)")
    rounds = max(1, min(sz.rounds, sz.fanout // 50))
    lats: dict[int, list[int]] = {i: [] for i in range(len(systems))}
    for r in range(rounds):
        share = sz.fanout // rounds + (1 if r < sz.fanout % rounds else 0)
        for k in range(len(systems)):
            i = (k + r) % len(systems)
            if i not in lats:
                continue  # it failed in an earlier round
            system, variant, fn = systems[i]
            try:
                lats[i] += fn(share)
            except Exception as exc:  # noqa: BLE001 - a broken reference must not sink the run
                log(f"  skipped {system} fan-out: {type(exc).__name__}: {exc}")
                del lats[i]
    rows = []
    for i, lat in lats.items():
        system, variant, _fn = systems[i]
        row = _lat_row("fanout", system, variant, False, lat, len(lat), 0.0)
        row.ops_per_s = 0.0
        rows.append(row)
        log(f"  {system:22s} fan-out p50 {row.p50_us or 0:8.1f} µs  p99 {row.p99_us or 0:8.1f} µs")
    return rows


# -- 5./6. cold open, stats(), memory --------------------------------------------------------------


def _rss() -> dict[str, int]:
    """Current RssAnon / RssFile in bytes (from /proc/self/status)."""
    out = {"anon": 0, "file": 0}
    with contextlib.suppress(OSError):
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    out["anon"] = int(line.split()[1]) * 1024
                elif line.startswith("RssFile:"):
                    out["file"] = int(line.split()[1]) * 1024
    return out


def _child_cold(system: str, path: str) -> dict[str, Any]:
    """In a fresh process: open the queue, lease one job; time, peak RSS, RSS growth, stats()."""
    Q: Any
    if system != "nobroker":
        from ringq.local.queue import Queue as RingqQueue

        Q = RingqQueue
    else:
        Q = importlib.import_module("nobroker").Queue
    import gc

    gc.collect()
    before = _rss()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    q = Q(path) if system != "nobroker" else Q(path, fsync=False)
    job = q.lease_one()
    t_open = time.perf_counter() - t0
    after = _rss()
    res: dict[str, Any] = {
        "open_lease_s": t_open,
        "leased": job is not None,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_rss_before_open": peak_before,
        "anon_growth": after["anon"] - before["anon"],
        "file_growth": after["file"] - before["file"],
    }
    if system != "nobroker":
        times = []
        for _ in range(3):
            t = time.perf_counter()
            st = q.stats()
            times.append(time.perf_counter() - t)
        res["stats_s"] = times
        res["stats_total"] = st.total
    return res


KEYED_COLD = "ringq, keyed"  # the cold-open row whose jobs have keys (one capped)


def _fill(system: str, path: str, n: int) -> None:
    """``n`` pending jobs; for KEYED_COLD, each thousand under a key of its own, the first
    thousand's key capped at one running job (which holds back all of them)."""
    step = 1_000 if system == KEYED_COLD else 10_000
    if system == "nobroker":
        q = importlib.import_module("nobroker").Queue(path, fsync=False)
    else:
        q = _open_ringq(path, "none")
        if system == KEYED_COLD:
            q.limit("k0", concurrency=1)
            q.enqueue("running", key="k0")
            q.lease_one(detach=True)  # takes k0's one slot while this process lives
    done = 0
    while done < n:
        k = min(step, n - done)
        jobs = [payload(done + i) for i in range(k)]
        if system == KEYED_COLD:
            q.enqueue_many(jobs, key=f"k{done // step}")
        else:
            q.enqueue_many(jobs)
        done += k
    q.close()


def _run_child(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from ringq.bench.harness import child_main; child_main(sys.argv[1:])",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if res.returncode != 0:
        raise RuntimeError(f"child {args} failed: {res.stderr.strip()[-500:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def child_main(argv: list[str]) -> None:
    print(json.dumps(_child_cold(argv[1], argv[2]) if argv[0] == "cold" else {}))


def cold_open(
    scratch: str, sz: Sizes, log: Callable[[str], None], with_nobroker: bool
) -> list[Row]:
    rows = []
    systems = ["ringq", KEYED_COLD] + (["nobroker"] if with_nobroker else [])
    for system in systems:
        path = tempfile.mkdtemp(prefix=f"cold-{system}-", dir=scratch)
        t = time.perf_counter()
        _fill(system, path, sz.cold)
        fill_s = time.perf_counter() - t
        res = _run_child(["cold", system, path])
        row = Row(
            "cold-open",
            system,
            f"open + lease_one, {sz.cold:,} pending",
            False,
            jobs=sz.cold,
            seconds=res["open_lease_s"],
            extra={**res, "fill_s": fill_s},
        )
        row.extra["anon_bytes_per_job"] = res["anon_growth"] / sz.cold
        row.extra["rss_bytes_per_job"] = (res["anon_growth"] + res["file_growth"]) / sz.cold
        rows.append(row)
        msg = (
            f"  {system:9s} cold open+lease of {sz.cold:,}: {res['open_lease_s'] * 1000:9.1f} ms, peak RSS "
            f"{res['peak_rss'] / 2**20:7.1f} MiB, +{row.extra['anon_bytes_per_job']:.1f} B anon/job"
        )
        if "stats_s" in res:
            msg += f", stats() {min(res['stats_s']) * 1000:.2f} ms"
        log(msg)
        shutil.rmtree(path, ignore_errors=True)
    return rows


# -- reporting -------------------------------------------------------------------------------------


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:,.0f}{unit}"
    return f"{x:.3g}{unit}"


def markdown(rows: list[Row], floor: float | None) -> str:
    """The results as Markdown tables.  Durable rows carry ratios to the fdatasync floor measured
    right before them (else the run's mean) and to the run's mean raw mmap store+msync loop
    (format 1's write path, for contrast: not a floor)."""

    def interleaved(kind: str) -> float | None:
        return next(
            (r.ops_per_s for r in rows if r.system == kind and r.variant == "enqueue x1"), None
        )

    mfl = [r.ops_per_s for r in rows if r.scenario == "floor" and r.system == MMAP_STORE]
    fl_i, mfl_i = interleaved(FLOOR), interleaved(MMAP_STORE)
    mfloor = sum(mfl) / len(mfl) if mfl else None

    def nob(r: Row) -> float | None:
        key = (
            "one"
            if r.variant.startswith("enqueue x1")
            else "many"
            if "enqueue_many" in r.variant
            else "lease"
            if "lease" in r.variant
            else None
        )
        if key is None:
            return None
        want_durable = r.durable
        for o in rows:
            if (
                o.system.startswith("nobroker")
                and o.durable == want_durable
                and (
                    (key == "one" and o.variant.startswith("enqueue x1"))
                    or (key == "many" and "enqueue_many" in o.variant)
                    or (key == "lease" and "lease" in o.variant)
                )
            ):
                return o.ops_per_s
        return None

    out = []
    thr = [r for r in rows if r.scenario in ("floor", "single", "processes")]
    if thr:
        out.append(
            "| scenario | system | variant | durable | procs | jobs/s | × fdatasync floor | × mmap store | "
            "× nobroker | p50 µs | p99 µs | p99.9 µs |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in thr:
            nb = nob(r) if r.scenario == "single" else None  # ratios within one interleaved set
            single = r.scenario in ("single", "floor") and r.variant == "enqueue x1"
            ratio_floor = r.ratio((fl_i if single else None) or floor) if r.durable else None
            ratio_mfloor = r.ratio((mfl_i if single else None) or mfloor) if r.durable else None
            out.append(
                f"| {r.scenario} | {r.system} | {r.variant} | {'yes' if r.durable else 'NOT durable'} | {r.producers} | "
                f"{_fmt(r.ops_per_s)} | {_fmt(ratio_floor)} | {_fmt(ratio_mfloor)} | "
                f"{_fmt(r.ops_per_s / nb if nb else None)} | "
                f"{_fmt(r.p50_us)} | {_fmt(r.p99_us)} | {_fmt(r.p999_us)} |"
            )
    fan = [r for r in rows if r.scenario == "fanout"]
    if fan:
        base = next((r.p50_us for r in fan if r.system == "raw futex wake"), None)
        out += [
            "",
            "| fan-out (producer → blocked consumer → handler start) | p50 µs | p99 µs | p99.9 µs | p50 × floor |",
            "|---|---|---|---|---|",
        ]
        for r in fan:
            out.append(
                f"| {r.system}: {r.variant} | {_fmt(r.p50_us)} | {_fmt(r.p99_us)} | {_fmt(r.p999_us)} | "
                f"{_fmt(r.p50_us / base if base and r.p50_us else None)} |"
            )
    cons = [r for r in rows if r.scenario == "consume"]
    if cons:
        floor_us = next(
            (r.extra["us_per_job"] for r in cons if r.system == "interpreter floor"), None
        )
        out += [
            "",
            "| consume path (one process) | µs per job | × interpreter floor |",
            "|---|---|---|",
        ]
        for r in cons:
            us = r.extra.get("us_per_job")
            ratio = us / floor_us if floor_us and us else None
            out.append(f"| {r.system} | {_fmt(us)} | {_fmt(ratio)} |")
    drains = [r for r in rows if r.scenario == "drain"]
    if drains:
        base_d = next((r.ops_per_s for r in drains if "Pool" in r.system), None)
        out += ["", "| drain (2 processes, no-op) | jobs/s | × Pool(2) |", "|---|---|---|"]
        for r in drains:
            out.append(
                f"| {r.system}: {r.variant} | {_fmt(r.ops_per_s)} | "
                f"{_fmt(r.ops_per_s / base_d if base_d else None)} |"
            )
    cold = [r for r in rows if r.scenario == "cold-open"]
    if cold:
        out += [
            "",
            "| cold open | pending jobs | open + first lease ms | peak RSS MiB | anon RSS B/job | "
            "anon+file RSS B/job | stats() ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in cold:
            st = r.extra.get("stats_s")
            out.append(
                f"| {r.system} | {r.jobs:,} | {_fmt(r.seconds * 1000)} | {_fmt(r.extra['peak_rss'] / 2**20)} | "
                f"{_fmt(r.extra['anon_bytes_per_job'])} | {_fmt(r.extra['rss_bytes_per_job'])} | "
                f"{_fmt(min(st) * 1000) if st else '–'} |"
            )
    return "\n".join(out)


def plots(
    rows: list[Row], outdir: str, floor: float | None, log: Callable[[str], None]
) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no plots: matplotlib is not installed (pip install 'ringq[bench]')")
        return []
    made: list[str] = []
    strat = [r for r in rows if r.scenario == "processes"]
    if strat:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax, mode in zip(axes, ("enqueue x1", f"enqueue_many x{BATCH}")):
            sel = [r for r in strat if r.variant == mode]
            labels = sorted({r.system.removeprefix("ringq ") for r in sel}, key=STRATEGIES.index)
            procs = sorted({r.producers for r in sel})
            width = 0.8 / max(1, len(procs))
            for k, nproc in enumerate(procs):
                vals = [
                    next(
                        (
                            r.ops_per_s
                            for r in sel
                            if r.system == f"ringq {s}" and r.producers == nproc
                        ),
                        0,
                    )
                    for s in labels
                ]
                ax.bar(
                    np.arange(len(labels)) + k * width,
                    vals,
                    width,
                    label=f"{nproc} producer process(es)",
                )
            if floor:
                ax.axhline(
                    floor, color="k", ls="--", lw=1, label="raw pwrite+fdatasync floor (ops/s)"
                )
            ax.set_xticks(np.arange(len(labels)) + width * (len(procs) - 1) / 2, labels)
            ax.set_yscale("log")
            ax.set_ylabel("jobs/s (log)")
            ax.set_title(f"ringq {mode} by durability strategy")
            ax.legend(fontsize=8)
        fig.tight_layout()
        p = os.path.join(outdir, "throughput.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    for name, sel, title in (
        (
            "latency_enqueue.png",
            [
                r
                for r in rows
                if r.cdf_us and r.variant == "enqueue x1" and r.scenario in ("single", "floor")
            ],
            "enqueue latency (1 producer, one job per call, interleaved)",
        ),
        (
            "latency_fanout.png",
            [r for r in rows if r.cdf_us and r.scenario == "fanout"],
            "fan-out latency: producer -> blocked consumer -> handler start",
        ),
        (
            "latency_lease_ack.png",
            [r for r in rows if r.cdf_us and "lease" in r.variant],
            "lease+ack round trip",
        ),
        (
            "latency_enqueue_procs.png",
            [
                r
                for r in rows
                if r.cdf_us
                and r.scenario == "processes"
                and r.durable
                and r.variant == "enqueue x1"
            ],
            "durable enqueue latency, producer processes",
        ),
    ):
        if not sel:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5))
        q = np.linspace(0, 1, 201)
        for k, r in enumerate(sel):
            if r.cdf_us is None:  # (each selection above keeps only rows that have one)
                continue
            label = r.system + (f" x{r.producers}" if r.scenario == "processes" else "")
            ax.plot(
                r.cdf_us,
                q,
                ls=("-", "--", ":")[k // 10 % 3],
                label=label + ("" if r.durable or r.scenario == "fanout" else " (not durable)"),
            )
        ax.set_xscale("log")
        ax.set_xlabel("µs (log)")
        ax.set_ylabel("fraction of calls")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = os.path.join(outdir, name)
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    return made
