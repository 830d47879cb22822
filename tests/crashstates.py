"""Trace-driven power-loss enumeration: every crash state the recorded system calls allow.

For each workload of tests/crashworkloads.py:

1. **record**: run it in a child process with the LD_PRELOAD recorder (tests/native/crashrec.c,
   tests/crashrec.py): every call that changes a file of the queue directory or its durability, in
   order, with the bytes written and the pages of the writable shared mappings as they changed;
2. **generate**: replay the trace into the persistence model of tests/crashmodel.py and, after each
   recorded call (a *crash point*), list the disk states the model allows: all of them where there
   are at most ``limit`` (exhaustive), else the oldest, the newest and ``limit - 2`` drawn with the
   run's seed (a sample; the report says which);
3. **check** each state, as a real directory opened after a simulated restart (the control file's
   boot id is not this boot's), in worker processes: :func:`check_state`.

The checks on every state: the queue opens, or raises a typed error whose message names the
repair, which is then done (``ringq upgrade DIR``, removing a damaged control file) before it
opens; every enqueue that returned under a durable strategy before the crash point is there exactly
once (or finished and retired); no job is invented, altered, listed twice or delivered twice; every
due job can be leased; no seq or job id of a durable enqueue is handed out again; under
``sync_acks=True`` every returned ack stays done; ``ringq verify`` before the open finds damage
exactly when recovery reports some, and after it finds nothing recovery did not report.

Run: ``python tests/crashstates.py [--full] [--seed N] [--limit K] [--workload NAME] [--keep DIR]``
(``--full``: 64 states per crash point).  tests/test_crash_states.py runs the short form in CI.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import collections
import concurrent.futures
import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import re
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import crashmodel  # noqa: E402
import crashrec  # noqa: E402
import crashworkloads as wl  # noqa: E402

CI_LIMIT = 3  # states per crash point in the CI run
FULL_LIMIT = 64  # and in the full run
OFF_BOOT = 104  # control file: the boot id of the last recovery, 16 bytes (docs/format.md)

Image = dict[str, bytes]


@dataclass
class Recording:
    spec: wl.Spec
    events: list
    initial: dict[str, tuple[int, bytes]]
    root_ino: int
    root: str
    facts: dict[str, Any]


@dataclass
class State:
    workload: str
    point: int  # index of the crash point (the call after which the power went)
    call: str  # that call
    notes: list[dict]
    image: Image
    exhaustive: bool

    @property
    def label(self) -> str:
        return f"{self.workload} crash point {self.point} (after {self.call})"


@dataclass
class Report:
    seed: int
    limit: int
    states: int = 0
    points: int = 0
    exhaustive_points: int = 0
    per_workload: dict[str, dict[str, int]] = field(default_factory=dict)
    violations: list[tuple[State, list[str]]] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [
            f"crash states: seed {self.seed}, at most {self.limit} per crash point: {self.states} states "
            f"at {self.points} crash points ({self.exhaustive_points} enumerated exhaustively), "
            f"{len(self.violations)} violating, {self.seconds:.1f} s"
        ]
        for name, c in self.per_workload.items():
            lines.append(
                f"  {name}: {c['calls']} calls, {c['points']} crash points ({c['exhaustive']} exhaustive), "
                f"{c['states']} states, {c['space']} in the model's space"
            )
        for state, problems in self.violations[:20]:
            lines.append(f"VIOLATION {state.label}: " + "; ".join(problems))
        return "\n".join(lines)


# -- recording ------------------------------------------------------------------------------------


def record(spec: wl.Spec, workdir: str) -> Recording:
    root = os.path.realpath(os.path.join(workdir, spec.name))
    os.makedirs(root)
    facts = spec.setup(root) if spec.setup else {}
    os.sync()  # the set-up is the durable starting point
    initial = {}
    for entry in os.scandir(root):
        with open(entry.path, "rb") as fh:
            initial[entry.name] = (entry.inode(), fh.read())
    trace = os.path.join(workdir, spec.name + ".trace")
    crashrec.record(spec.fn, root, trace, spec.params)
    return Recording(spec, crashrec.read_trace(trace), initial, os.stat(root).st_ino, root, facts)


# -- generation -----------------------------------------------------------------------------------


def generate(rec: Recording, limit: int, rng: random.Random, counts: dict[str, int]):
    """Yield the distinct states of every crash point of ``rec``."""
    model = crashmodel.Model(rec.root, rec.root_ino, rec.initial)
    notes: list[dict] = []
    seen: set[tuple[bytes, int]] = set()
    point = 0
    for ev in rec.events:
        if ev.type == crashrec.NOTE:
            notes.append(json.loads(ev.data))
            continue
        if not model.apply(ev):
            continue
        counts["calls"] += 1
        units = model.space()
        point += 1
        counts["points"] += 1
        counts["space"] += crashmodel.count(units)
        choices, exhaustive = crashmodel.states(units, limit, rng)
        counts["exhaustive"] += exhaustive
        for choice in choices:
            image = model.build(choice)
            key = (_digest(image), len(notes))
            if key in seen:
                continue
            seen.add(key)
            counts["states"] += 1
            yield State(rec.spec.name, point, ev.describe(), list(notes), image, exhaustive)


def _digest(image: Image) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(image):
        h.update(name.encode() + b"\0" + len(image[name]).to_bytes(8, "little") + image[name])
    return h.digest()


# -- states as directories and as text ------------------------------------------------------------


def materialize(image: Image, path: str) -> str:
    """Write ``image`` as directory ``path`` as the machine finds it after the restart: the
    control file's boot id (this boot's, as the recorded process stored it) becomes another one,
    its complement."""
    os.makedirs(path, mode=0o700)
    for name, data in sorted(image.items()):
        full = os.path.join(path, name)
        if name.endswith("/"):
            os.makedirs(full, mode=0o700, exist_ok=True)
            continue
        boot = data[OFF_BOOT : OFF_BOOT + 16]
        if name.endswith(".ctl") and boot.strip(b"\0"):
            data = data[:OFF_BOOT] + bytes(b ^ 0xFF for b in boot) + data[OFF_BOOT + 16 :]
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return path


def dumps_state(state: State, problems: list[str], spec_facts: dict[str, Any]) -> str:
    """A state as JSON text (files zlib-compressed, base64): what a regression test holds."""
    return json.dumps(
        {
            "workload": state.workload,
            "point": state.point,
            "call": state.call,
            "problems": problems,
            "facts": spec_facts,
            "notes": state.notes,
            "files": {
                n: base64.b64encode(zlib.compress(d, 9)).decode()
                for n, d in sorted(state.image.items())
            },
        },
        indent=1,
    )


def loads_state(text: str) -> tuple[State, dict[str, Any]]:
    d = json.loads(text)
    image = {n: zlib.decompress(base64.b64decode(b)) for n, b in d["files"].items()}
    return State(d["workload"], d["point"], d["call"], d["notes"], image, True), d["facts"]


# -- checking -------------------------------------------------------------------------------------


def _key(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True)


def _verify(path: str) -> dict[str, Any]:
    code, out, err = wl.cli("--dir", path, "--queue", wl.NAME, "--json", "verify")
    try:
        rep = json.loads(out)
    except ValueError:
        rep = {"ok": False, "damage": [f"verify failed: {err.strip() or out.strip()}"], "notes": []}
    rep["code"] = code
    return rep


def _open(
    path: str,
    spec: wl.Spec,
    problems: list[str],
    repairs: list[str],
    name: str = wl.NAME,
    **kw: Any,
):
    """Open the queue, doing the repair a typed error names (at most twice)."""
    from ringq import CorruptionError, FormatVersionError, Queue, RingqError

    for _ in range(3):
        try:
            opts = {"visibility_timeout": 600, **wl.GEOMETRY, **spec.open_opts, **kw}
            return Queue(path, name, **opts)
        except FormatVersionError as exc:
            if "ringq upgrade" not in str(exc) or "upgrade" in repairs:
                problems.append(f"open raised FormatVersionError: {exc}")
                return None
            code, out, err = wl.cli("upgrade", path)
            repairs.append("upgrade")
            if code != 0:
                problems.append(f"ringq upgrade, as the error said, failed: {out} {err}")
                return None
        except CorruptionError as exc:
            ctl = os.path.join(path, f"{name}.ctl")
            if f"remove {ctl}" not in str(exc) or "remove-ctl" in repairs:
                problems.append(f"open raised {type(exc).__name__}: {exc}")
                return None
            os.unlink(ctl)
            repairs.append("remove-ctl")
        except RingqError as exc:
            problems.append(f"open raised {type(exc).__name__}: {exc}")
            return None
        except Exception as exc:  # noqa: BLE001 -- any other exception is itself the finding
            problems.append(f"open raised an untyped {type(exc).__name__}: {exc}")
            return None
    problems.append("open did not succeed after the repairs its errors named")
    return None


@dataclass
class Expect:
    """What the notes up to a crash point promise."""

    attempted: set[str] = field(default_factory=set)  # payload keys that may exist
    ids_of: dict[str, str] = field(default_factory=dict)  # payload key -> id it returned with
    durable: dict[str, str] = field(default_factory=dict)  # id -> payload key, must survive
    seqs: dict[str, int] = field(default_factory=dict)  # durable id -> seq
    finished: set[str] = field(default_factory=set)  # ended: may be retired (absent)
    journaled: set[str] = field(default_factory=set)  # acked under sync_acks: must stay done
    marks: dict[str, list[dict]] = field(default_factory=dict)  # other notes by op


def expectations(notes: list[dict], facts: dict[str, Any]) -> Expect:
    e = Expect()
    for job in facts.get("jobs", ()):
        k = _key(job["payload"])
        e.attempted.add(k)
        e.ids_of[k] = job["id"]
        e.durable[job["id"]] = k
    unflushed: list[dict] = []
    for n in notes:
        op = n["op"]
        if op == "attempt":
            e.attempted.add(_key(n["payload"]))
        elif op == "enqueued":
            k = _key(n["payload"])
            e.ids_of[k] = n["id"]
            if n["durable"]:
                e.durable[n["id"]] = k
                e.seqs[n["id"]] = n["seq"]
            else:
                unflushed.append(n)
        elif op == "flushed":
            for u in unflushed:
                e.durable[u["id"]] = _key(u["payload"])
                e.seqs[u["id"]] = u["seq"]
            unflushed = []
        elif op in ("acked", "finished"):
            e.finished.add(n["id"])
            if n.get("journaled"):
                e.journaled.add(n["id"])
        e.marks.setdefault(op, []).append(n)
    return e


def check_state(state: State, facts: dict[str, Any], root: str) -> list[str]:
    """Every check on one state (module docstring); the problems found, [] if none."""
    spec = next(s for s in wl.SPECS if s.name == state.workload)
    path = materialize(state.image, os.path.join(root, "q"))
    try:
        return _check(path, spec, expectations(state.notes, facts))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _check(path: str, spec: wl.Spec, e: Expect) -> list[str]:
    from ringq import JobState

    problems: list[str] = []
    repairs: list[str] = []
    before = _verify(path)
    if before["code"] == 1 and "no queue" in " ".join(before["damage"]):
        before = None  # nothing of the queue reached the disk: the open creates it
    q = _open(path, spec, problems, repairs)
    if q is None:
        return problems
    reports = [q.recovery]
    if "schedule" in spec.checks:
        q = _schedules_repaired(q, path, spec, e, problems, repairs)
        if q is None:
            return problems
        reports.append(q.recovery)
    try:
        if "schedule" in spec.checks and "scheduled" in e.marks:
            e.attempted.add(_key({"n": 100}))
            for n in e.marks.get("fired", ()):
                e.durable[n["id"]] = _key({"n": 100})
        jobs = q.list_jobs()
        _check_listing(jobs, e, problems)
        for check in spec.checks:
            globals()[f"_check_{check}"](q, e, jobs, problems)
        _drain(q, e, problems)
        left = [j for j in q.list_jobs(JobState.READY) if j.available_at <= time.time()]
        if left:
            problems.append(f"due jobs that no lease hands out: {[j.id for j in left]}")
        probe = q.enqueue({"probe": True})
        top = max([*e.seqs.values(), *(j.seq for j in jobs)], default=0)
        if probe.seq <= top:
            problems.append(
                f"a new enqueue got seq {probe.seq}, not above {top} already handed out"
            )
        if probe.id in e.durable:
            problems.append(f"a new enqueue got job id {probe.id} of a job enqueued before")
    finally:
        q.close()
    after = _verify(path)
    _check_verify(before, after, reports, repairs, problems)
    return problems


def _check_listing(jobs: list, e: Expect, problems: list[str]) -> None:
    ids = collections.Counter(j.id for j in jobs)
    seqs = collections.Counter(j.seq for j in jobs)
    for jid, n in ids.items():
        if n > 1:
            problems.append(f"job {jid} listed {n} times")
    for seq, n in seqs.items():
        if n > 1:
            problems.append(f"seq {seq} listed {n} times")
    for j in jobs:
        _check_job(j, e, problems, "listed")
    for jid in e.durable:
        if not ids[jid] and jid not in e.finished:
            problems.append(f"durable job {jid} ({e.durable[jid]}) is lost")
    by_id = {j.id: j for j in jobs}
    for jid in e.journaled:
        j = by_id.get(jid)
        if j is not None and j.state.value != "done":
            problems.append(f"job {jid}, acked under sync_acks, came back {j.state.value}")


def _check_job(j, e: Expect, problems: list[str], how: str) -> None:
    k = _key(j.payload)
    if k not in e.attempted:
        problems.append(f"{how} job {j.id} with a payload never enqueued: {k[:80]}")
    elif k in e.ids_of and e.ids_of[k] != j.id:
        problems.append(f"{how} job {j.id} has the payload of job {e.ids_of[k]}")


def _drain(q, e: Expect, problems: list[str]) -> None:
    seen: set[str] = set()
    for _ in range(100):
        batch = q.lease(50)
        if not batch:
            return
        for job in batch:
            if job.id in seen:
                problems.append(f"job {job.id} delivered twice")
            seen.add(job.id)
            _check_job(job, e, problems, "delivered")
            if job.id in e.journaled:
                problems.append(f"job {job.id}, acked under sync_acks, delivered again")
        q.ack_many(batch)
    problems.append("the drain did not end")


def _check_verify(before, after, reports: list, repairs: list[str], problems: list[str]) -> None:
    """``ringq verify`` agrees with what recovery did (``reports``: of each open)."""
    found = any(r.quarantined or r.corrupt_records or r.repairs for r in reports)
    if before is not None and "remove-ctl" not in repairs and "upgrade" not in repairs:
        if before["damage"] and not found:
            problems.append(
                f"verify saw damage that recovery did not report: {before['damage'][:2]}"
            )
        if found and not before["damage"]:
            problems.append(
                f"recovery reported damage that verify did not see: {reports[0].describe()}"
            )
    kept = any(
        r.quarantined or r.corrupt_records or any(".quarantined" in w for _p, w in r.repairs)
        for r in reports
    )
    if after["damage"] and not kept:
        problems.append(f"verify after recovery finds damage: {after['damage'][:2]}")


def _check_upgrade(q, e: Expect, jobs: list, problems: list[str]) -> None:
    pass  # the set-up's jobs are durable facts: the listing checks them


def _schedules_repaired(q, path: str, spec: wl.Spec, e: Expect, problems, repairs):
    """Read the schedules; a damaged schedule file or ticks table raises a typed error naming its
    repair (remove both files: their schedules are lost, jobs are not), which is done, and the
    queue is opened again.  Returns the queue to go on with (None if it did not open)."""
    from ringq import CorruptionError

    try:
        q.schedules()
        return q
    except CorruptionError as exc:
        named = re.findall(r"remove (\S+) and the \.(sched|ticks) file", str(exc))
        if not named:
            raise
    first, other = named[0]
    for victim in (first, first.rsplit(".", 1)[0] + "." + other):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(victim)
    repairs.append("schedules-reset")
    e.marks.pop("scheduled", None)
    q.close()
    return _open(path, spec, problems, repairs)


def _check_schedule(q, e: Expect, jobs: list, problems: list[str]) -> None:
    defined = q.schedules()
    if "scheduled" in e.marks and not any(s.name == "tick" for s in defined):
        problems.append("the schedule defined before the crash is gone")
    fired = q.run_schedules()
    ids = collections.Counter(j.id for j in q.list_jobs())
    for job in fired:
        if ids[job.id] > 1:
            problems.append(f"schedule tick {job.id} fired twice")


def _check_limit(q, e: Expect, jobs: list, problems: list[str]) -> None:
    if "limited" in e.marks and not any(li.name == "k" for li in q.limits()):
        problems.append("the limit set before the crash is gone")


def _check_results(q, e: Expect, jobs: list, problems: list[str]) -> None:
    from ringq import ResultNotFoundError

    # The results are a companion queue ``q-results`` (docs/format.md): opened first, with the
    # repairs its errors name.
    companion = _open(
        q.dir, wl.Spec("results", ""), problems, [], name=f"{wl.NAME}-results", auto_ids=False
    )
    if companion is None:
        return
    companion.close()
    by_id = {j.id: j for j in jobs}
    for n in e.marks.get("result", ()):
        j = by_id.get(n["id"])
        if j is None or j.state.value != "done":
            continue  # the ack was lost (a redelivery): no result is owed
        try:
            got = q.result(n["id"])
        except ResultNotFoundError:
            problems.append(f"job {n['id']} is done but its result is lost")
            continue
        if got != n["result"]:
            problems.append(f"job {n['id']} has result {got!r}, not {n['result']!r}")


# -- the run --------------------------------------------------------------------------------------

_worker_root: str | None = None


def scratch_dir(prefix: str) -> str:
    """A temporary directory, on tmpfs where there is one: the states are checked by the hundred,
    and a sync there costs nothing (the model, not the device, decides what survives)."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def _init_worker() -> None:
    global _worker_root
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    _worker_root = scratch_dir("crashstates-")
    atexit.register(shutil.rmtree, _worker_root, True)


def _task(state: State, facts: dict[str, Any]) -> list[str]:
    try:
        return check_state(state, facts, _worker_root)
    except Exception as exc:  # noqa: BLE001 -- a check that crashed is a finding, with its state
        return [f"the check raised {type(exc).__name__}: {exc}"]


def run(
    seed: int,
    limit: int,
    names: list[str] | None = None,
    workers: int = 2,
    keep: str | None = None,
    log=print,
) -> Report:
    t0 = time.monotonic()
    report = Report(seed, limit)
    rng = random.Random(seed)
    specs = [s for s in wl.SPECS if names is None or s.name in names]
    workdir = scratch_dir("crashrec-")
    ctx = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker
        ) as pool:
            # Recording is a child process each: two at a time while the parent waits.
            with concurrent.futures.ThreadPoolExecutor(workers) as recorders:
                recs = list(recorders.map(lambda spec: record(spec, workdir), specs))
            for spec, rec in zip(specs, recs):
                counts = dict.fromkeys(("calls", "points", "exhaustive", "states", "space"), 0)
                inflight: collections.deque = collections.deque()
                for state in generate(rec, limit, rng, counts):
                    inflight.append((state, pool.submit(_task, state, rec.facts)))
                    while len(inflight) > 4 * workers:
                        _collect(inflight.popleft(), rec, report, keep, log)
                while inflight:
                    _collect(inflight.popleft(), rec, report, keep, log)
                report.per_workload[spec.name] = counts
                report.states += counts["states"]
                report.points += counts["points"]
                report.exhaustive_points += counts["exhaustive"]
                log(f"{spec.name}: {counts}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report.seconds = time.monotonic() - t0
    return report


def _collect(item, rec: Recording, report: Report, keep: str | None, log) -> None:
    state, fut = item
    problems = fut.result()
    if not problems:
        return
    report.violations.append((state, problems))
    log(f"VIOLATION {state.label}: {problems}")
    if keep:
        os.makedirs(keep, exist_ok=True)
        name = f"{state.workload}-p{state.point}-{len(report.violations)}.json"
        with open(os.path.join(keep, name), "w") as fh:
            fh.write(dumps_state(state, problems, rec.facts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help=f"{FULL_LIMIT} states per crash point")
    ap.add_argument("--limit", type=int, help="states per crash point")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workload", action="append", help="only this workload (repeatable)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", help="write each violating state here as JSON")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    limit = args.limit or (FULL_LIMIT if args.full else CI_LIMIT)
    report = run(seed, limit, args.workload, args.workers, args.keep)
    print(report.summary())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
