"""``ringq demo``: real files, real worker processes, a real SIGKILL, nothing lost.

Enqueues one durable job per regular file under a source tree (default: this Python's standard
library, without ``site-packages``), fans them out to worker processes that SHA-256 each file and
measure its zlib-compressed size, SIGKILLs one worker while it holds leases midway and starts a
replacement, then checks the queue's accounting: every job DONE exactly once, every file hashed,
redeliveries counted.  Exits 1 if a single job is missing.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import sysconfig
import tempfile
import threading
import time
import zlib
from multiprocessing.process import BaseProcess

import numpy as np

from ringq.engine.verify import examine
from ringq.job import JobState
from ringq.local.queue import Queue
from ringq.worker.worker import Worker

QUEUE = "files"


def collect(source: str, limit: int | None) -> list[tuple[str, int]]:
    """Regular files under ``source`` (no symlinks; ``site-packages`` skipped), sorted, at most ``limit``."""
    out = []
    for d, dirs, files in os.walk(source):
        dirs[:] = sorted(x for x in dirs if x != "site-packages")
        for f in sorted(files):
            p = os.path.join(d, f)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if os.path.isfile(p) and not os.path.islink(p):
                out.append((p, st.st_size))
            if limit is not None and len(out) >= limit:
                return out
    return out


def _handle(job, ledger) -> None:
    start = time.time()
    h = hashlib.sha256()
    comp = zlib.compressobj(6)
    zsize = 0
    with open(job.payload["path"], "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            zsize += len(comp.compress(chunk))
    zsize += len(comp.flush())
    ledger.write(
        json.dumps(
            {
                "id": job.id,
                "sha256": h.hexdigest(),
                "zsize": zsize,
                "attempt": job.attempts,
                "latency": start - job.enqueued_at,
                "pid": os.getpid(),
            }
        )
        + "\n"
    )
    ledger.flush()


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies


def _follow_parent(parent: int) -> None:
    """Have the kernel SIGTERM this process when ``parent`` dies (a SIGKILLed demo leaves no
    worker behind); exit at once if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl: the parent's stop on its way out still ends this process
    if os.getppid() != parent:
        os._exit(0)


def _worker_main(qdir: str, ledger_dir: str, threads: int, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _follow_parent(parent)
    with (
        Queue(qdir, QUEUE) as q,
        open(os.path.join(ledger_dir, f"ledger-{os.getpid()}.jsonl"), "a") as ledger,
    ):
        w = Worker(
            q,
            lambda job: _handle(job, ledger),
            concurrency=threads,
            handle_signals=False,
            poll_interval=0.2,
        )
        for signum in _ENDING:
            signal.signal(signum, lambda *_: w.stop())
        w.run()


# Signals that end the demo as Ctrl-C does: it stops its workers and removes its directory.
_ENDING = (signal.SIGTERM, signal.SIGHUP)


class _Ended(Exception):
    """Raised in the demo's main thread by a signal of ``_ENDING``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_ended(signum: int, _frame: object) -> None:
    for other in _ENDING:  # once is enough: the clean-up that follows runs to its end
        signal.signal(other, signal.SIG_IGN)
    raise _Ended(signum)


def _leases_of(q: Queue, pid: int) -> int:
    """Leases currently recorded under process ``pid`` (owner word, for display and the kill)."""
    files = examine(str(q.path), q.name)
    return sum(
        1
        for seg in files.segments
        for rec in seg.records
        if rec.state == "leased" and rec.owner_pid == pid
    )


def run(
    source: str | None = None,
    limit: int | None = None,
    workers: int | None = None,
    qdir: str | None = None,
    kill: bool = True,
    threads: int = 2,
    out=print,
) -> int:
    """Run the demo; returns the process exit status (0 when nothing is missing; 128 + the
    signal's number when SIGTERM or SIGHUP ended it, its workers stopped and its temporary
    directory removed)."""
    if threading.current_thread() is not threading.main_thread():
        return _run(source, limit, workers, qdir, kill, threads, out)
    previous = {signum: signal.signal(signum, _raise_ended) for signum in _ENDING}
    try:
        return _run(source, limit, workers, qdir, kill, threads, out)
    except _Ended as ended:
        return 128 + ended.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run(
    source: str | None,
    limit: int | None,
    workers: int | None,
    qdir: str | None,
    kill: bool,
    threads: int,
    out,
) -> int:
    source = source or sysconfig.get_paths()["stdlib"]
    workers = workers or os.cpu_count() or 2
    files = collect(source, limit)
    if not files:
        out(f"ringq demo: no regular files under {source}")
        return 2
    tmp = None
    if qdir is None:
        tmp = tempfile.mkdtemp(prefix="ringq-demo-")
        qdir = tmp
    ledger_dir = os.path.join(qdir, "ledger")
    os.makedirs(ledger_dir, exist_ok=True)
    # One segment large enough for every job, so the final accounting can read every job back.
    slot_count = max(16384, 1 << (2 * len(files) - 1).bit_length())
    ctx = multiprocessing.get_context("fork")
    worker_args = (qdir, ledger_dir, threads, os.getpid())
    procs: list[BaseProcess] = []
    try:
        with Queue(qdir, QUEUE, slot_count=slot_count, visibility_timeout=30.0) as q:
            out(
                f"ringq demo: {len(files)} files ({sum(s for _, s in files) / 1e6:.1f} MB) from {source}"
            )
            out(
                f"queue: {qdir} (queue {QUEUE!r}, durability {q.durability}); {workers} worker processes x {threads} threads"
            )
            for _ in range(workers):
                procs.append(ctx.Process(target=_worker_main, args=worker_args))
                procs[-1].start()
            t0 = time.monotonic()
            ids = []
            for i in range(0, len(files), 64):
                batch = files[i : i + 64]
                ids += [j.id for j in q.enqueue_many([{"path": p, "size": s} for p, s in batch])]
            t_enq = time.monotonic() - t0
            out(f"enqueued {len(ids)} durable jobs in {t_enq:.2f} s")
            killed = None
            while True:
                st = q.stats()
                if kill and killed is None and st.done >= len(ids) * 0.4:
                    for victim in procs:
                        assert victim.pid is not None  # every process of procs was started
                        # Stopped first, its leases are counted as it will die with them: it
                        # acks nothing more, and nobody reclaims from a live owner.
                        os.kill(victim.pid, signal.SIGSTOP)
                        held = _leases_of(q, victim.pid)
                        if not held:
                            os.kill(victim.pid, signal.SIGCONT)
                        else:
                            os.kill(victim.pid, signal.SIGKILL)
                            t_kill = time.monotonic()
                            victim.join()
                            # Its owner word stays on its leases until another process reclaims them.
                            while _leases_of(q, victim.pid) and time.monotonic() - t_kill < 10:
                                time.sleep(0.002)
                            left = _leases_of(q, victim.pid)
                            back_ms = (time.monotonic() - t_kill) * 1000
                            back = (
                                f"reclaimed within {back_ms:.0f} ms"
                                if not left
                                else f"{left} still not reclaimed after {back_ms / 1000:.0f} s"
                            )
                            killed = (victim.pid, held, back)
                            out(
                                f"SIGKILLed worker {victim.pid} holding {held} lease(s), at {st.done} done; "
                                f"{back} by the other workers; starting a replacement"
                            )
                            procs.remove(victim)
                            rep = ctx.Process(target=_worker_main, args=worker_args)
                            rep.start()
                            procs.append(rep)
                            break
                if st.done >= len(ids):
                    break
                if not any(p.is_alive() for p in procs):
                    out("all workers exited early")
                    break
                time.sleep(0.005 if killed is None and kill else 0.05)
            wall = time.monotonic() - t0
            _stop(procs)
            return _report(q, files, ids, ledger_dir, wall, killed, kill, out)
    finally:
        # Whatever ended the run (an error, Ctrl-C, stdout closed by `| head`): no worker may
        # outlive it, working on a directory about to be removed.
        _stop(procs, grace=2.0)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _stop(procs: list[BaseProcess], grace: float | None = None) -> None:
    """SIGTERM the live workers and wait for them; with ``grace``, SIGKILL any still running
    after that many seconds."""
    for p in procs:
        if p.is_alive() and p.pid is not None:  # alive: started, so it has a pid
            os.kill(p.pid, signal.SIGTERM)
    for p in procs:
        p.join(grace)
        if p.is_alive() and p.pid is not None:
            os.kill(p.pid, signal.SIGKILL)
            p.join()


def _report(q: Queue, files, ids, ledger_dir, wall, killed, kill, out) -> int:
    jobs = {j.id: j for j in q.list_jobs()}
    runs: dict[str, list[dict]] = {}
    for name in os.listdir(ledger_dir):
        with open(os.path.join(ledger_dir, name)) as fh:
            for line in fh:
                if line.endswith("\n"):
                    rec = json.loads(line)
                    runs.setdefault(rec["id"], []).append(rec)
    missing = [i for i in ids if i not in jobs or jobs[i].state is not JobState.DONE]
    unhashed = [i for i in ids if i not in runs]
    redeliveries = sum(jobs[i].attempts - 1 for i in ids if i in jobs)
    extra_runs = sum(len(runs.get(i, [])) - 1 for i in ids)
    lat = np.array([min(r["latency"] for r in runs[i]) for i in ids if i in runs]) * 1000
    total_bytes = sum(s for _, s in files)
    zbytes = sum(runs[i][0]["zsize"] for i in ids if i in runs)
    st = q.stats()
    out("")
    out("== ringq demo summary ==")
    out(f"files            {len(files)}")
    out(f"bytes            {total_bytes:,} (zlib: {zbytes:,}, {zbytes / max(total_bytes, 1):.1%})")
    out(f"wall time        {wall:.2f} s")
    out(f"jobs/s           {len(ids) / wall:,.0f}")
    if killed:
        out(f"killed worker    pid {killed[0]} holding {killed[1]} lease(s), {killed[2]}")
    elif kill:
        out("killed worker    none (no worker held a lease when checked)")
    out(f"redeliveries     {redeliveries} (handler runs beyond one per job: {extra_runs})")
    if len(lat):
        out(
            f"enqueue->start   p50 {np.percentile(lat, 50):.2f} ms, p99 {np.percentile(lat, 99):.2f} ms"
        )
    out(f"queue stats      {st.to_dict()}")
    out(f"missing jobs     {len(missing)}")
    if missing or unhashed:
        out(f"FAILED: {len(missing)} job(s) not done, {len(unhashed)} file(s) never hashed")
        return 1
    out("OK: every file's job is done exactly once in the queue; nothing lost")
    return 0
