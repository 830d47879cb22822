"""The ``ringq`` command line.  ``ringq --help`` lists the subcommands; docs/cli.md shows each one.

Global options (``-d/--dir``, default ``./.ringq``; ``-q/--queue``, default ``default``; ``--json``;
``-v/--verbose``) may be given before or after the subcommand.  The options and subcommands of
``nobroker``'s command line work unchanged (docs/migration.md).  With ``--json`` every command prints one JSON document on
stdout (``top`` prints one per refresh) and errors are a one-line JSON object on stderr.

Which commands create a queue: only ``enqueue``, ``work`` and ``lease --wait`` (a consumer may
start before its producers).  On a queue that does not exist, the commands nobroker has that read
one (``lease``, ``stats``, ``list``, ``dlq``, ``purge --yes``, ``compact``, ``recover``) answer as
for an empty queue and exit 0, as nobroker does, with a warning on stderr that names the missing
queue (the guard against a mistyped ``--dir`` or ``--queue``); every other command refuses in one
line, exit 1.  None of them creates anything; ``inspect`` and ``verify`` never write to the
queue's files at all.

Exit status (as nobroker's): 0 success; 1 the command failed (unknown job id, a job that is not
leased, a handler that cannot be loaded, an I/O error, a nobroker directory to import, ...) or
``verify`` found damage; 2 a usage mistake (bad arguments or option values, malformed JSON; no
command prints the usage); 130 interrupted (a second Ctrl-C while ``work`` drains).  Errors are one
line on stderr, never a traceback (set ``RINGQ_DEBUG=1`` to see one).  :func:`main` returns the
status rather than exiting, so it can be called in-process.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any, NoReturn

from ringq.backend import check_port
from ringq.errors import RingqError
from ringq.job import Job, JobState

__all__ = ["main"]

ALL = object()  # ``dlq --requeue`` without an id


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit status ``status`` (2: usage)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


# -- output helpers ------------------------------------------------------------------------------------


def _emit(args: argparse.Namespace, obj: Any, text: str | None) -> None:
    """Print ``obj`` as JSON with --json, else ``text`` (nothing if None)."""
    if args.json:
        print(json.dumps(obj))
    elif text is not None:  # no control character reaches the terminal raw
        print("\n".join(_printable(line) for line in text.split("\n")))


def _ago(ts: float | None, now: float | None = None) -> str:
    """A wall-clock time (seconds since the epoch) relative to now, as a person reads it."""
    if ts is None:
        return "-"
    d = ts - (time.time() if now is None else now)
    if abs(d) < 0.0005:
        return "now"
    return f"in {d:.1f}s" if d > 0 else f"{-d:.1f}s ago"


def _printable(text: str) -> str:
    """``text`` as a line of output shows it: control characters (a newline, a terminal escape
    sequence that a producer put in a job id or a handler in its error) escaped as in a Python
    string literal, never written raw."""
    return text if text.isprintable() else repr(text)[1:-1]


def _say(text: str) -> None:
    """One line on stderr (a warning), with what it quotes -- a path given with ``--dir``, a
    reason read from a damaged file -- escaped (:func:`_printable`)."""
    print(_printable(text), file=sys.stderr)


def _warn(args: argparse.Namespace, text: str) -> None:
    """A warning of command ``args.cmd`` on stderr: ``ringq CMD: warning: TEXT``, or under
    ``--json`` one JSON object ``{"warning": TEXT, "command": CMD}`` on a line, as errors are."""
    if getattr(args, "json", False):
        print(json.dumps({"warning": text, "command": args.cmd}), file=sys.stderr)
    else:
        _say(f"ringq {args.cmd}: warning: {text}")


def _short(value: Any, width: int = 50) -> str:
    text = _printable(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    return text if len(text) <= width else text[: width - 3] + "..."


def _job_line(job: Job) -> str:
    d = job.to_dict()
    parts = [
        _printable(job.id),
        job.state.value,
        f"attempts={job.attempts}/{job.max_attempts}",
        f"priority={job.priority}",
    ]
    if job.state is JobState.LEASED:
        parts += [f"token={job.lease_token}", f"deadline={_ago(job.lease_deadline)}"]
    elif job.state is JobState.READY and job.available_at > time.time():
        parts.append(f"due={_ago(job.available_at)}")
    if job.cancel_requested:
        parts.append("cancel-requested")
    if job.progress is not None:
        parts.append(
            f"progress={job.progress:.0%}"
            + (f" {_short(job.progress_message, 40)}" if job.progress_message else "")
        )
    parts.append(f"payload={_short(d['payload'])}")
    if job.last_error:
        parts.append(f"error={_short(job.last_error, 80)}")
    return "  ".join(parts)


def _table(rows: list[list[str]], header: list[str], right: Collection[int] = frozenset()) -> str:
    cols = [header] + rows
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    lines = (
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        )
        for r in cols
    )
    return "\n".join(line.rstrip() for line in lines)


# -- opening a queue ------------------------------------------------------------------------------------


def _open(args: argparse.Namespace, *, create: bool = False, **kw: Any):
    """Open the queue of --dir/--queue; unless ``create``, refuse to conjure up a missing one."""
    from ringq.connect import connect
    from ringq.local.queue import Queue

    _check_name(args)
    if getattr(args, "url", None):  # a Redis queue: it exists as soon as anything names it
        return connect(args.url, args.queue, **kw)
    if not create and _absent(args):
        _refuse_foreign(args.dir)
        raise UserError(f"{_no_queue(args)}; check --dir and --queue", status=1)
    return _Reporting(Queue(args.dir, args.queue, **kw), args)


class _Reporting:
    """``with`` a local queue for one command: on the way out, what the queue's open and the
    command's reads found and did (the reader catches up on first use, after the open)."""

    def __init__(self, q: Any, args: argparse.Namespace) -> None:
        self.q = q
        self.args = args

    def __enter__(self) -> Any:
        return self.q

    def __exit__(self, *exc: object) -> None:
        try:
            _warn_damage(self.q.recovery, self.args)
        finally:
            self.q.close()


def _check_name(args: argparse.Namespace) -> None:
    from ringq.backend import QUEUE_NAME_RE

    if not QUEUE_NAME_RE.match(args.queue):
        raise UserError(f"queue name must match [A-Za-z0-9_-]{{1,64}}, got {args.queue!r}")


def _absent(args: argparse.Namespace) -> bool:
    """True if --dir/--queue names a queue directory holding no such queue (a Redis queue always exists)."""
    from ringq.engine.segments import queue_exists

    if getattr(args, "url", None):
        return False
    return not queue_exists(args.dir, args.queue)


def _no_queue(args: argparse.Namespace) -> str:
    if os.path.isdir(args.dir):
        where = "nothing was ever enqueued there"
    else:
        where = "not a directory" if os.path.exists(args.dir) else "no such directory"
    return f"no queue {args.queue!r} in {args.dir} ({where})"


def _as_empty(args: argparse.Namespace, then: str = "answering as for an empty queue") -> bool:
    """For the commands nobroker has that read a queue (lease, stats, list, dlq, purge, compact,
    recover): True if the queue does not exist, after saying so on stderr.  The command then
    answers as for an empty queue and exits 0, as nobroker does (it creates the queue on any
    command); ringq creates nothing, and the warning is the guard against a mistyped --dir or
    --queue.  A nobroker directory is refused (ForeignQueueError), not read as empty."""
    _check_name(args)
    if not _absent(args):
        return False
    _refuse_foreign(args.dir)
    _warn(args, f"{_no_queue(args)}: {then}; check --dir and --queue")
    return True


def _warn_damage(report: Any, args: argparse.Namespace) -> None:
    """What this command's open of the queue found and did, on stderr: each file it quarantined,
    each record it marked BAD, each repair.  Said once, by the command whose open did it: later
    commands say nothing of it (their open found nothing new); ``ringq verify`` reports the
    quarantined files and BAD records as damage (exit 1), ``ringq recover`` counts the quarantined
    files and ``stats`` the BAD records (docs/cli.md)."""
    said = []
    for path, reason in report.quarantined:
        _warn(args, f"quarantined {path}: {reason}")
        said.append(reason)
    for path, slot, reason in report.corrupt_records:
        _warn(args, f"{path} slot {slot}: {reason}; the record is quarantined (BAD)")
    for path, what in report.repairs:
        if not any(what in reason for reason in said):  # a salvage the quarantine line told
            _warn(args, f"repaired {path}: {what}")


def _payload(text: str, force_text: bool, where: str = "payload") -> Any:
    """JSON if it parses; text otherwise.  Text that starts like a JSON object/array must parse."""
    if force_text:
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith(("{", "[")):
            raise UserError(
                f"{where} looks like JSON but does not parse: {exc} (use --text to send it as a string)"
            ) from None
        return text


def _refuse_foreign(path: str) -> None:
    """Raise ForeignQueueError if ``path`` holds another library's queue instead of a ringq one."""
    from ringq.local.foreign import check_not_foreign

    check_not_foreign(path)


def _with_token(q: Any, job_id: str, token: int | None) -> Job | str:
    """The bare id (no fencing check) or, with --token, a Job carrying the token to check."""
    if token is None:
        return job_id
    job = q.get(job_id)
    job.lease_token = str(token)
    return job


# -- commands ---------------------------------------------------------------------------------------


def cmd_enqueue(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise UserError(f"--count must be >= 1, got {args.count}")
    if args.job_id is not None and not args.job_id:
        raise UserError("--job-id must not be empty")
    if args.payload == "-":
        if args.count > 1 or args.job_id:
            raise UserError(
                "--count and --job-id cannot be used with a payload read from stdin ('-')"
            )
        payloads = [
            _payload(line.rstrip("\n"), args.text, f"stdin line {n}")
            for n, line in enumerate(sys.stdin, 1)
            if line.strip()
        ]
    else:
        if args.count > 1 and args.job_id:
            raise UserError("--job-id names one job; it cannot be used with --count > 1")
        payloads = [_payload(args.payload, args.text)] * args.count
    with _open(args, create=True) as q:
        kw = dict(priority=args.priority, delay=args.delay, max_attempts=args.max_attempts)
        if args.expires_in is not None:
            kw["expires_in"] = args.expires_in
        if args.timeout is not None:
            kw["timeout"] = args.timeout
        if args.depends_on:
            kw["depends_on"] = args.depends_on
        if args.allow_failure:
            kw["allow_failure"] = True
        if args.job_id is not None:
            jobs = [q.enqueue(payloads[0], job_id=args.job_id, **kw)]
        elif kw.keys() & {"depends_on", "allow_failure"}:  # enqueue_many takes no parents
            jobs = [q.enqueue(p, **kw) for p in payloads]
        else:
            jobs = q.enqueue_many(payloads, **kw)
    _emit(
        args,
        [j.to_dict() for j in jobs],
        "\n".join(_printable(j.id) for j in jobs) if jobs else None,
    )
    return 0


def cmd_lease(args: argparse.Namespace) -> int:
    jobs: list[Job] = []
    # With --wait a missing queue is created: a waiting consumer may start before its producers.
    wait = bool(args.wait)
    if not _as_empty(args, "creating it to wait for jobs" if wait else "no eligible jobs") or wait:
        with _open(args, create=wait) as q:
            # Detached: this process exits at once; the lease must outlive it (until ack/nack or VT).
            jobs = q.lease(
                args.count, visibility_timeout=args.visibility_timeout, wait=args.wait, detach=True
            )
    _emit(
        args,
        [j.to_dict() for j in jobs],
        "\n".join(_job_line(j) for j in jobs) if jobs else "no eligible jobs",
    )
    return 0


def cmd_ack(args: argparse.Namespace) -> int:
    with _open(args) as q:
        for job_id in args.ids:
            q.ack(_with_token(q, job_id, args.token))
    # One id prints {"acked": id}, as nobroker does; several print the list.
    _emit(
        args,
        {"acked": args.ids[0] if len(args.ids) == 1 else args.ids},
        "\n".join(f"acked {_printable(i)}" for i in args.ids),
    )
    return 0


def cmd_nack(args: argparse.Namespace) -> int:
    with _open(args) as q:
        job = q.nack(_with_token(q, args.id, args.token), error=args.error, delay=args.delay)
    if job.state is JobState.DEAD:
        text = f"{_printable(job.id)} dead (attempts {job.attempts}/{job.max_attempts} used): moved to the dead-letter queue"
    else:
        text = f"{_printable(job.id)} ready again {_ago(job.available_at)} (attempts {job.attempts}/{job.max_attempts})"
    _emit(args, job.to_dict(), text)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with _open(args) as q:
        job = q.get(args.id)
        dependents = q.dependents(job.id)
    lines = [_job_line(job)]
    if job.depends_on:
        lines.append("parents: " + " ".join(job.depends_on))
    if dependents:
        lines.append("dependents: " + " ".join(dependents))
    _emit(args, {**job.to_dict(), "dependents": dependents}, "\n".join(lines))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _open(args) as q:
        jobs = [q.cancel(i) for i in args.ids]
    _emit(
        args,
        [j.to_dict() for j in jobs],
        "\n".join(
            f"{_printable(j.id)} cancel requested (its holder is told)"
            if j.cancel_requested
            else f"{_printable(j.id)} cancelled"
            for j in jobs
        ),
    )
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    with _open(args) as q:
        (q.pause if args.cmd == "pause" else q.resume)(args.key)
        state = q.paused()
    what = "queue" if args.key is None else f"key {args.key!r}"
    _emit(args, state, f"{what} {'paused' if args.cmd == 'pause' else 'resumed'}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    st = _stats(args)
    _emit(args, st, "  ".join(f"{k}={v}" for k, v in st.items()))
    return 0


def _stats(args: argparse.Namespace) -> dict[str, Any]:
    """``stats()`` of the queue as a dict; all zeros for a queue that does not exist."""
    from ringq.backend import QueueStats

    if _as_empty(args):
        return QueueStats().to_dict()
    with _open(args) as q:
        return q.stats().to_dict()


def _job_rows(jobs: list[Job]) -> str:
    now = time.time()
    rows = []
    for j in jobs:
        state = j.state.value
        if j.state is JobState.LEASED:
            when = f"deadline {_ago(j.lease_deadline, now)}"
            if j.cancel_requested:
                state = "leased (cancel requested)"
            if j.progress is not None:
                when += f", {j.progress:.0%}" + (
                    f" {_short(j.progress_message, 30)}" if j.progress_message else ""
                )
        elif j.state is JobState.READY:
            if j.available_at > now:
                state, when = "delayed", f"due {_ago(j.available_at, now)}"
            else:
                when = "due"
        else:
            when = ""
        rows.append(
            [
                _printable(j.id),
                state,
                f"{j.attempts}/{j.max_attempts}",
                str(j.priority),
                when,
                _short(j.to_dict()["payload"], 40),
                _short(j.last_error or "", 60),
            ]
        )
    return _table(
        rows, ["ID", "STATE", "ATTEMPTS", "PRIO", "WHEN", "PAYLOAD", "LAST ERROR"], right={2, 3}
    )


def _check_limit(args: argparse.Namespace) -> None:
    """--limit N: at most N; 0 or omitted: all (the same for list, dlq and inspect)."""
    if args.limit is not None and args.limit < 0:
        raise UserError(f"--limit must be >= 0 (0 or omitted: all), got {args.limit}")
    if args.limit == 0:
        args.limit = None


def cmd_list(args: argparse.Namespace) -> int:
    _check_limit(args)
    jobs: list[Job] = []
    if not _as_empty(args):
        with _open(args) as q:
            if (
                args.key is None
                and args.error is None
                and args.priority is None
                and args.id is None
            ):
                jobs = q.list_jobs(args.state, limit=args.limit)
            else:  # the dashboard's search (docs/dashboard.md)
                jobs = q.search(
                    state=args.state,
                    key=args.key,
                    priority=args.priority,
                    job_id=args.id,
                    error=args.error,
                    limit=args.limit,
                ).jobs
    _emit(args, [j.to_dict() for j in jobs], _job_rows(jobs) if jobs else "(no jobs)")
    return 0


def cmd_dlq(args: argparse.Namespace) -> int:
    _check_limit(args)
    empty = _as_empty(args)
    if args.requeue is not None:
        n = 0
        if not empty:
            with _open(args) as q:
                n = q.requeue_dead(None if args.requeue is ALL else args.requeue)
        _emit(args, {"requeued": n}, f"requeued {n} job(s)")
        return 0
    jobs: list[Job] = []
    if not empty:
        with _open(args) as q:
            jobs = q.dlq(limit=args.limit)
    _emit(
        args,
        [j.to_dict() for j in jobs],
        _job_rows(jobs) if jobs else "(dead-letter queue is empty)",
    )
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    if not args.yes:
        total = _stats(args)["total"]
        raise UserError(
            f"purge removes all {total} job(s) of queue {args.queue!r} in {args.dir}; "
            "pass --yes to confirm"
        )
    n = 0
    if not _as_empty(args):
        with _open(args) as q:
            n = q.purge()
    _emit(args, {"purged": n}, f"purged {n} job(s)")
    return 0


def _examine(args: argparse.Namespace, limit: int | None):
    from ringq.engine.verify import examine

    try:
        return examine(args.dir, args.queue, limit=limit)
    except FileNotFoundError as exc:
        _refuse_foreign(args.dir)
        raise UserError(str(exc), status=1) from None


def cmd_compact(args: argparse.Namespace) -> int:
    from ringq.backend import CompactionResult

    res = CompactionResult(0, 0, 0, 0)
    if not _as_empty(args):
        with _open(args) as q:
            res = q.compact()
    _emit(
        args,
        {
            "bytes_before": res.bytes_before,
            "bytes_after": res.bytes_after,
            "jobs_kept": res.jobs_kept,
            "jobs_dropped": res.jobs_dropped,
        },
        res.describe(),
    )
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from ringq.backend import QueueStats
    from ringq.engine.recovery import RecoveryReport

    rep, st = RecoveryReport(), QueueStats().to_dict()
    if not _as_empty(args):
        with _open(args) as q:
            rep = q.recovery
            st = q.stats().to_dict()
    data = {
        "repaired": rep.repaired,
        "describe": rep.describe(),
        "quarantined": rep.quarantined,
        "corrupt_records": rep.corrupt_records,
        "repairs": rep.repairs,
        "readopted": rep.readopted,
        "removed_temp": rep.removed_temp,
        "quarantined_earlier": rep.quarantined_earlier,
        **st,
    }
    _emit(args, data, f"{rep.describe()}\n" + "  ".join(f"{k}={v}" for k, v in st.items()))
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    from ringq.engine.upgrade import upgrade

    if not os.path.isdir(args.target):
        raise UserError(f"{args.target}: no such directory")
    _refuse_foreign(args.target)  # not "nothing to upgrade": its jobs come over by import-nobroker
    name = args.upgrade_queue
    if name is not None and not os.path.exists(os.path.join(args.target, f"{name}.ctl")):
        raise UserError(
            f"no queue {name!r} in {args.target} (no {name}.ctl); check --queue",
            status=1,
        )
    rep = upgrade(args.target, name)
    lines = [f"upgraded {_printable(p)}" for p in rep.upgraded] + [
        _printable(f"quarantined {p}: {why}") for p, why in rep.quarantined
    ]
    text = (
        "\n".join(lines)
        if lines
        else f"{_printable(str(args.target))}: nothing to upgrade (no format-1 segments)"
    )
    _emit(args, {"upgraded": rep.upgraded, "quarantined": rep.quarantined}, text)
    return 0


def cmd_import_nobroker(args: argparse.Namespace) -> int:
    from ringq.local.nobroker import import_nobroker

    if not os.path.isdir(args.source):
        raise UserError(f"{args.source}: no such directory")
    try:
        res = import_nobroker(args.source, args.into, names=args.name or None)
    except FileNotFoundError as exc:
        raise UserError(str(exc), status=1) from None
    data = res.to_dict()
    into = args.into or args.source
    lines = [
        f"{name}: {c['imported']} job(s) imported into ringq queue {name!r} in {_printable(str(into))}, {c['existing']} "
        f"already there (of them: {c['ready']} ready, {c['delayed']} delayed, {c['dead']} dead, "
        f"{c['leased']} leased by nobroker: the lost lease counted as an attempt, dead if it was the last, "
        f"else due when the lease expires); {c['done']} finished job(s) left out"
        for name, c in data["queues"].items()
    ]
    lines += [
        _printable(f"warning: reading {path} stopped early: {why}") for path, why in res.stopped
    ]
    _emit(args, data, "\n".join(lines) or f"no nobroker queue in {_printable(str(args.source))}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    _check_limit(args)
    rep = _examine(args, args.limit)
    if args.json:
        _emit(args, rep.to_dict(), None)
        return 0
    now = time.time()
    out = [f"queue {rep.name!r} in {_printable(str(rep.dir))}", "files:"]
    out += [f"  {_printable(name):<40} {size:>12,} bytes" for name, size in rep.files]
    if rep.control:
        out.append(
            f"control {rep.name}.ctl: " + " ".join(f"{k}={v}" for k, v in rep.control.items())
        )
    for seg in rep.segments:
        out.append("")
        out.append(f"segment {os.path.basename(seg.path)} ({seg.file_size:,} bytes)")
        if seg.header:
            h = dict(seg.header)
            h["epoch"] = datetime.fromtimestamp(h.pop("epoch_ms") / 1000).isoformat(
                timespec="milliseconds"
            )
            out.append("  header: " + " ".join(f"{k}={v}" for k, v in h.items()))
            out.append(
                f"  records: {seg.record_count}  "
                + " ".join(f"{k}={v}" for k, v in sorted(seg.counts.items()))
            )
        rows = []
        for r in seg.records:
            when = "" if r.time_ms is None else _ago(r.time_ms / 1000, now)
            if r.owner:
                when += f" (owner {r.owner}, pid {r.owner_pid})"
            elif r.owner == 0:
                when += " (detached)"
            rows.append(
                [
                    str(r.slot),
                    str(r.span),
                    str(r.offset),
                    r.state,
                    "-" if r.attempts is None else f"{r.attempts}/{r.max_attempts}",
                    "ok" if r.crc_ok else "BAD",
                    "-" if r.seq is None else str(r.seq),
                    "-" if r.priority is None else str(r.priority),
                    _printable(r.id) if r.id else "-",
                    when.strip(),
                    _printable(r.preview) if r.preview else "-",
                ]
            )
        if rows:
            table = _table(
                rows,
                [
                    "SLOT",
                    "SPAN",
                    "OFFSET",
                    "STATE",
                    "ATTEMPTS",
                    "CRC",
                    "SEQ",
                    "PRIO",
                    "ID",
                    "TIME",
                    "PAYLOAD",
                ],
                right={0, 1, 2, 4, 6, 7},
            )
            out += ["  " + line for line in table.splitlines()]
        if seg.record_count > len(seg.records):
            out.append(
                f"  ... {seg.record_count - len(seg.records)} more record(s); --limit 0 shows all"
            )
        out += [f"  DAMAGE: {d}" for d in seg.damage]
        out += [f"  note: {n}" for n in seg.notes]
    out += [f"DAMAGE: {d}" for d in rep.damage]
    out += [f"note: {n}" for n in rep.notes]
    print("\n".join(out))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    rep = _examine(args, 0)
    damage = rep.damaged
    nrec = sum(s.record_count for s in rep.segments)
    notes = rep.notes + [f"{s.path}: {n}" for s in rep.segments for n in s.notes]
    summary = {
        "ok": not damage,
        "dir": rep.dir,
        "queue": rep.name,
        "segments": len(rep.segments),
        "records": nrec,
        "damage": damage,
        "notes": notes,
    }
    lines = [f"DAMAGE: {d}" for d in damage] + [f"note: {n}" for n in notes]
    verdict = "ok" if not damage else f"{len(damage)} problem(s)"
    lines.append(
        f"{verdict}: queue {rep.name!r} in {_printable(str(rep.dir))}: {len(rep.segments)} segment(s), "
        f"{nrec} record(s) checked"
    )
    _emit(args, summary, "\n".join(lines))
    return 1 if damage else 0


def _port(text: str) -> int:
    """An argparse type: a TCP port number, 0 (a free one) to 65535."""
    try:
        return check_port(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid port {text!r}: must be an integer 0 (a free one) to 65535"
        ) from None


def _load_handler(spec: str) -> Callable[[Job], Any]:
    """Import ``module:function`` (dotted attributes allowed after the colon) from the cwd or sys.path.

    Every failure is a UserError of status 1, as nobroker's ``work`` exits for a bad handler."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise UserError(f"handler must be given as module:function, got {spec!r}", status=1)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(
            0, os.getcwd()
        )  # as `python -m` would: handlers usually live next to the caller
    try:
        obj: Any = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and (mod_name == exc.name or mod_name.startswith(exc.name + ".")):
            raise UserError(
                f"cannot import handler {spec!r}: no module named {exc.name!r}", status=1
            ) from None
        raise UserError(
            f"importing {mod_name!r} failed: {type(exc).__name__}: {exc}", status=1
        ) from None
    except Exception as exc:
        raise UserError(
            f"importing {mod_name!r} failed: {type(exc).__name__}: {exc}", status=1
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(
                f"cannot load handler {spec!r}: {mod_name!r} has no attribute {attr!r}", status=1
            ) from None
    if not callable(obj):
        raise UserError(f"handler {spec!r} is a {type(obj).__name__}, not a callable", status=1)
    return obj


class _PrintableLines(logging.Formatter):
    """One line per log record: control characters in its message (a job id, a handler's error
    text) escaped (:func:`_printable`), so that none can move the cursor or forge another line;
    a traceback (``-v``) follows line by line, escaped the same way."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = _printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802 (logging's name)
        return "\n".join(_printable(line) for line in super().formatException(ei).split("\n"))


def cmd_work(args: argparse.Namespace) -> int:
    from ringq.worker.worker import Worker

    handler = _load_handler(args.handler)
    # -v: every job's outcome and a failed handler's traceback (logged at DEBUG by the worker).
    lines = logging.StreamHandler(sys.stderr)
    lines.setFormatter(_PrintableLines("ringq work: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, handlers=[lines])
    if args.poll_interval is not None and not args.poll_interval > 0:
        raise UserError(f"--poll-interval must be > 0 seconds, got {args.poll_interval}")
    kw = {} if args.visibility_timeout is None else {"visibility_timeout": args.visibility_timeout}
    with _open(args, create=True, **kw) as q:
        w = Worker(
            q,
            handler,
            concurrency=args.concurrency,
            processes=args.processes,
            max_jobs=args.max_jobs,
            idle_timeout=args.idle_timeout,
            metrics_port=args.metrics_port,
            progress=False if args.json else None,
            timeout=args.timeout,
            grace=args.grace,
            **({} if args.poll_interval is None else {"poll_interval": args.poll_interval}),
        )
        stats = w.run()
    st = stats.to_dict()
    _emit(args, st, "  ".join(f"{k}={v}" for k, v in st.items()))
    return 0


# -- metrics and dashboard --------------------------------------------------------------------------


def _serving(args: argparse.Namespace, what: str, url: str) -> None:
    _emit(args, {"serving": what, "url": url}, f"serving {what} at {url} (Ctrl-C stops)")
    sys.stdout.flush()


def cmd_metrics(args: argparse.Namespace) -> int:
    try:
        from ringq.web.metrics import queue_registry, serve
    except ImportError as exc:
        raise UserError(str(exc), status=1) from None
    with _open(args) as q:
        server, port = serve(queue_registry(q), args.port)
        stop = threading.Event()
        # Before the line that says it serves: a SIGTERM sent on reading it stops it cleanly.
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            _serving(args, "Prometheus metrics", f"http://127.0.0.1:{port}/metrics")
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass  # Ctrl-C is how one stops the server
        finally:
            signal.signal(signal.SIGTERM, previous)
            server.shutdown()
            server.server_close()
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        from ringq.web.dashboard import serve
    except ImportError as exc:
        raise UserError(str(exc), status=1) from None
    with _open(args) as q:
        mode = "actions allowed" if args.allow_actions else "read-only"
        serve(
            q,
            args.port,
            allow_actions=args.allow_actions,
            ready=lambda port: _serving(
                args, f"the dashboard ({mode})", f"http://127.0.0.1:{port}/"
            ),
        )
    return 0


# -- top --------------------------------------------------------------------------------------------


class _Sampler:
    """Counts by state plus rates between two samples: enqueued/s and finished/s.

    Rates come from the queue's cumulative counters (``stats()``'s ``enqueued_total``,
    ``acked_total``, ``dead_lettered_total``), which segment retirement does not disturb;
    ``finished`` is acked plus dead-lettered.
    """

    def __init__(self, q: Any) -> None:
        self.q = q
        self.prev: tuple[float, int, int] | None = None

    def sample(self) -> dict[str, Any]:
        st = self.q.stats().to_dict()
        t = time.monotonic()
        enq = st["enqueued_total"]
        fin = st["acked_total"] + st["dead_lettered_total"]
        out: dict[str, Any] = {
            "time": time.time(),
            **st,
            "finished_total": fin,
            "enqueue_rate": None,
            "finish_rate": None,
        }
        if self.prev is not None and t > self.prev[0]:
            dt = t - self.prev[0]
            out["enqueue_rate"] = round((enq - self.prev[1]) / dt, 1)
            out["finish_rate"] = round((fin - self.prev[2]) / dt, 1)
        self.prev = (t, enq, fin)
        return out

    def close(self) -> None:
        pass


def _top_line(s: dict[str, Any]) -> str:
    rate = lambda v: "-" if v is None else f"{v:,.1f}"
    stamp = datetime.fromtimestamp(s["time"]).strftime("%H:%M:%S")
    return (
        f"{stamp}  ready={s['ready']} delayed={s['delayed']} leased={s['leased']} done={s['done']} "
        f"dead={s['dead']} total={s['total']}  enq/s={rate(s['enqueue_rate'])} fin/s={rate(s['finish_rate'])}  "
        f"since creation: enqueued={s['enqueued_total']} acked={s['acked_total']} "
        f"dead-lettered={s['dead_lettered_total']}"
    )


def _top_curses(args: argparse.Namespace, sampler: _Sampler) -> None:
    import curses

    def draw(scr: Any) -> None:
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        scr.timeout(max(1, int(args.interval * 1000)))
        s = sampler.sample()
        while True:
            scr.erase()
            h, w = scr.getmaxyx()
            rate = lambda v: "-" if v is None else f"{v:,.1f}/s"
            lines = [
                f"ringq top  queue {args.queue!r} in {_printable(str(args.dir))}   (q quits)",
                "",
            ]
            total = max(s["total"], 1)
            bar_w = max(10, min(40, w - 30))
            for k in ("ready", "delayed", "leased", "done", "dead"):
                bar = "#" * round(bar_w * s[k] / total)
                lines.append(f"{k:<8} {s[k]:>10,}  {bar}")
            lines += [
                f"{'total':<8} {s['total']:>10,}",
                f"{'corrupt':<8} {s['corrupt']:>10,}",
                "",
                f"enqueued {rate(s['enqueue_rate']):>12}   (since creation: {s['enqueued_total']:,})",
                f"finished {rate(s['finish_rate']):>12}   (since creation: {s['acked_total']:,} acked, "
                f"{s['dead_lettered_total']:,} dead-lettered)",
                "",
                datetime.fromtimestamp(s["time"]).strftime("updated %H:%M:%S"),
            ]
            for y, line in enumerate(lines[: h - 1]):
                scr.addnstr(y, 0, line, w - 1)
            scr.refresh()
            ch = scr.getch()
            if ch in (ord("q"), ord("Q"), 27):
                return
            if ch == -1 or ch == curses.KEY_RESIZE:
                s = sampler.sample()

    curses.wrapper(draw)


def cmd_top(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise UserError(f"--interval must be > 0 seconds, got {args.interval}")
    with _open(args) as q:
        sampler = _Sampler(q)
        try:
            if args.once:
                sampler.sample()
                time.sleep(args.interval)
                s = sampler.sample()
                _emit(args, s, _top_line(s))
            elif sys.stdout.isatty() and sys.stdin.isatty() and not args.json:
                _top_curses(args, sampler)
            else:
                while True:
                    s = sampler.sample()
                    _emit(args, s, _top_line(s))
                    sys.stdout.flush()
                    time.sleep(args.interval)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how one leaves top
        finally:
            sampler.close()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from . import demo

    for opt in ("limit", "workers", "threads"):
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise UserError(f"--{opt} must be at least 1, got {value}")
    if args.source is not None and not os.path.isdir(args.source):
        raise UserError(f"--source {args.source}: no such directory")
    keep = args.keep
    if keep is not None and os.path.exists(keep) and (not os.path.isdir(keep) or os.listdir(keep)):
        raise UserError(
            f"--keep {keep}: must be a new or empty directory (the demo checks its own accounting)"
        )
    return demo.run(
        source=args.source,
        limit=args.limit,
        workers=args.workers,
        qdir=keep,
        kill=not args.no_kill,
        threads=args.threads,
    )


def cmd_migrate(args: argparse.Namespace) -> int:
    from ringq.connect import connect, is_url

    from .migrate import migrate, refuse_same_queue

    if not is_url(args.src) and not os.path.isdir(args.src):
        raise UserError(f"no queue directory {args.src}")
    try:
        refuse_same_queue(args.src, args.dst, args.queue)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    with connect(args.src, args.queue) as src, connect(args.dst, args.queue) as dst:
        out = migrate(src, dst, purge_source=args.purge_source)
    _emit(args, out, "  ".join(f"{k}={v}" for k, v in out.items()))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("ringq.bench") is None:
        raise UserError(
            "the benchmark harness (module ringq.bench) is not part of this installation"
        )
    from ringq import bench

    # The global --json (``ringq --json bench ...``) is the harness's own --json.
    extra = ["--json"] if args.json and "--json" not in args.args else []
    return int(bench.main([*args.args, *extra]) or 0)


# -- the parser ---------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (a JSON object with --json), exit 2."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        # "argument --wait: --wait must be ..." says the option's name once
        message = re.sub(r"^argument [^:]+: (-\S+ must)", r"\1", message)
        text = " ".join(f"{message} (see '{self.prog} --help')".split())
        if _Parser.json_errors:  # JSON escapes control characters itself
            print(json.dumps({"error": text, "command": self.prog}), file=sys.stderr)
        else:
            print(f"{self.prog}: {_printable(text)}", file=sys.stderr)
        raise SystemExit(2)


def _ranged(
    option: str,
    kind: type = float,
    lo: float | None = None,
    hi: float | None = None,
    *,
    above: bool = False,
) -> Callable[[str], Any]:
    """An argparse ``type``: a finite ``kind`` (int or float) no less than ``lo`` (greater, when
    ``above``) and no more than ``hi``; anything else is a usage error naming ``option``."""
    if lo is None:
        desc = "a finite number"
    elif hi is not None:
        desc = f"in [{lo}, {hi}]"
    elif above:
        desc = f"> {lo:g}" + (" seconds" if kind is float else "")
    elif kind is int and lo == 1:
        desc = "at least 1"
    else:
        desc = f">= {lo:g}" + (" seconds" if kind is float else "")

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option} must be a{'n integer' if kind is int else ' number'}, got {text!r}"
            ) from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{option} must be a finite number, got {text!r}")
        if (
            lo is not None
            and (value <= lo if above else value < lo)
            or hi is not None
            and value > hi
        ):
            raise argparse.ArgumentTypeError(f"{option} must be {desc}, got {text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    # Global options live on the main parser and, with SUPPRESS defaults, on every subcommand too,
    # so that `ringq stats --json` and `ringq --json stats` both work.
    common = _Parser(add_help=False)  # only a parent: its arguments are copied to each subcommand
    common.add_argument(
        "-d", "--dir", default=argparse.SUPPRESS, help="queue directory (default ./.ringq)"
    )
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="a Redis queue instead: redis://, rediss://, unix://",
    )
    common.add_argument(
        "-q", "--queue", default=argparse.SUPPRESS, help="queue name (default 'default')"
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="more output (work: each job's outcome and handler tracebacks)",
    )

    p = _Parser(
        prog="ringq",
        description="ringq: a durable job queue for one host, no broker.",
        epilog="Examples for every command: docs/cli.md",
    )
    p.add_argument("-d", "--dir", default=None, help="queue directory (default ./.ringq)")
    p.add_argument(
        "--url", default=None, help="a Redis queue instead: redis://, rediss://, unix://"
    )
    p.add_argument("-q", "--queue", default="default", help="queue name (default 'default')")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="more output (work: each job's outcome and handler tracebacks)",
    )
    p.add_argument("--version", action="version", version=f"ringq {_version()}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def cmd(
        name: str, func: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, parents=[common], help=help, description=help)
        sp.set_defaults(func=func)
        return sp

    e = cmd(
        "enqueue",
        cmd_enqueue,
        "add a job: payload as JSON if it parses, else as text ('-': one per stdin line)",
    )
    e.add_argument("payload", help="JSON value or text; '-' reads one payload per line from stdin")
    e.add_argument(
        "--text", action="store_true", help="take the payload as a string, never as JSON"
    )
    e.add_argument("--priority", type=int, default=0, help="higher leases first (default 0)")
    e.add_argument(
        "--delay", type=_ranged("--delay"), default=0.0, help="seconds before the job may be leased"
    )
    e.add_argument(
        "--count", type=_ranged("--count", int, 1), default=1, help="enqueue N copies (default 1)"
    )
    e.add_argument(
        "--job-id",
        "--id",
        dest="job_id",
        help="idempotency key: an existing job with this id is returned, nothing written",
    )
    e.add_argument("--max-attempts", type=int, help="leases before dead-lettering (default: 5)")
    e.add_argument(
        "--expires-in",
        type=float,
        help="seconds: a job not leased by then becomes expired and never runs",
    )
    e.add_argument(
        "--timeout",
        type=float,
        help="seconds one attempt may run before a Worker stops it and nacks it (stored in the job)",
    )
    e.add_argument(
        "--depends-on",
        action="append",
        metavar="ID",
        help="wait (deferred) until the job ID is done; repeat for several parents",
    )
    e.add_argument(
        "--allow-failure",
        action="store_true",
        help="with --depends-on: run once every parent finished, even if one failed",
    )

    le = cmd(
        "lease",
        cmd_lease,
        "lease jobs; the lease outlives this command (until ack, nack or its timeout)",
    )
    le.add_argument(
        "-n",
        "--count",
        type=_ranged("--count", int, 1),
        default=1,
        help="most jobs to lease (default 1)",
    )
    le.add_argument(
        "--visibility-timeout",
        "--timeout",
        dest="visibility_timeout",
        type=_ranged("--visibility-timeout", float, 0, above=True),
        help="seconds the lease lasts (default 30)",
    )
    le.add_argument(
        "--wait", type=_ranged("--wait", float, 0), help="block up to this many seconds for a job"
    )

    a = cmd("ack", cmd_ack, "mark leased jobs done (by id: no fencing-token check unless --token)")
    a.add_argument("ids", nargs="+", metavar="ID")
    a.add_argument(
        "--token",
        type=_ranged("--token", int, 1),
        help="fencing token printed by lease; refused if stale",
    )

    n = cmd("nack", cmd_nack, "report a leased job failed: retry after backoff, or dead-letter it")
    n.add_argument("id", metavar="ID")
    n.add_argument("--error", help="text kept as the job's last_error")
    n.add_argument(
        "--delay",
        type=_ranged("--delay", float, 0),
        help="seconds before the retry (default: the backoff policy)",
    )
    n.add_argument(
        "--token",
        type=_ranged("--token", int, 1),
        help="fencing token printed by lease; refused if stale",
    )

    cmd("stats", cmd_stats, "counts of jobs by state")

    g = cmd("get", cmd_get, "one job: state, attempts, progress, payload")
    g.add_argument("id", metavar="ID")

    ca = cmd(
        "cancel",
        cmd_cancel,
        "cancel jobs: pending ones never run; a leased one's holder is told to stop",
    )
    ca.add_argument("ids", nargs="+", metavar="ID")

    for verb, text in (
        ("pause", "stop leases of the queue (or of one key) in every process until resumed"),
        ("resume", "let leases of the queue (or of one key) go on"),
    ):
        pz = cmd(verb, cmd_pause, text)
        pz.add_argument("--key", help="only jobs of this key (default: the whole queue)")

    li = cmd("list", cmd_list, "retained jobs in enqueue order")
    li.add_argument(
        "--state",
        choices=[*(s.value for s in JobState), "delayed"],
        help="only jobs in this state ('ready' includes delayed jobs; 'delayed' is only those not yet due)",
    )
    li.add_argument(
        "--limit", type=_ranged("--limit", int, 0), help="at most N jobs (0 or omitted: all)"
    )
    li.add_argument("--key", help="only jobs of this key")
    li.add_argument("--priority", type=int, help="only jobs of this priority")
    li.add_argument("--id", help="only the job with this id")
    li.add_argument(
        "--error",
        metavar="TEXT",
        help="only jobs whose last error contains TEXT (ASCII letters in any case)",
    )

    d = cmd("dlq", cmd_dlq, "list the dead-letter queue, or requeue from it")
    d.add_argument(
        "--requeue",
        nargs="?",
        const=ALL,
        metavar="ID",
        help="move dead jobs back to ready with attempts reset: all, or just ID",
    )
    d.add_argument(
        "--limit", type=_ranged("--limit", int, 0), help="list at most N jobs (0 or omitted: all)"
    )

    pu = cmd("purge", cmd_purge, "remove every job of the queue (needs --yes)")
    pu.add_argument("--yes", action="store_true", help="really remove them")

    i = cmd(
        "inspect",
        cmd_inspect,
        "segments and slots as stored: header fields, offsets, states, CRC, payloads",
    )
    i.add_argument(
        "--limit",
        type=_ranged("--limit", int, 0),
        default=20,
        help="records shown per segment (default 20; 0 = all)",
    )

    cmd("verify", cmd_verify, "check every published record and header; exit 1 on any damage")

    up = sub.add_parser(
        "upgrade",
        help="upgrade a directory's format-1 queues to format 2 in place (stop every "
        "process using them first)",
        description="upgrade a directory's format-1 queues to format 2 "
        "in place, crash-safely (rerun it after a crash); stop every process using them first",
    )
    up.set_defaults(func=cmd_upgrade)
    up.add_argument("target", metavar="DIR", help="the queue directory")
    up.add_argument(
        "-q",
        "--queue",
        dest="upgrade_queue",
        default=None,
        help="only this queue (default: every queue)",
    )
    up.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )

    cmd(
        "compact",
        cmd_compact,
        "give back disk space now: retire finished segments, relocate stragglers",
    )
    cmd(
        "recover",
        cmd_recover,
        "open the queue and report what recovery found and did, with the counts",
    )

    im = cmd(
        "import-nobroker",
        cmd_import_nobroker,
        "copy the unfinished (pending, delayed, dead) jobs of a nobroker queue directory into ringq "
        "queues of the same names (rerunnable)",
    )
    im.add_argument(
        "source", metavar="DIR", help="the nobroker queue directory (holds <name>.NNNNNN.log)"
    )
    im.add_argument(
        "--into",
        metavar="RINGQ_DIR",
        help="the ringq queue directory (default: DIR itself, so the program's path stays the same)",
    )
    im.add_argument(
        "--name",
        action="append",
        help="only this nobroker queue (repeatable; default: every queue in DIR, each into the "
        "ringq queue of the same name)",
    )

    w = cmd("work", cmd_work, "run a handler (module:function) on leased jobs until stopped")
    w.add_argument("handler", metavar="module:function")
    w.add_argument(
        "-c",
        "--concurrency",
        type=_ranged("--concurrency", int, 1),
        default=1,
        help="handler threads per process (default 1)",
    )
    w.add_argument(
        "--processes",
        type=_ranged("--processes", int, 0),
        default=0,
        help="worker processes (default 0: this process)",
    )
    w.add_argument(
        "--max-jobs", type=_ranged("--max-jobs", int, 1), help="stop after N jobs (per process)"
    )
    w.add_argument(
        "--idle-timeout",
        type=_ranged("--idle-timeout", float, 0),
        help="stop after this many seconds without work",
    )
    w.add_argument(
        "--visibility-timeout",
        type=_ranged("--visibility-timeout", float, 0, above=True),
        help="lease length in seconds (default 30; heartbeats renew it)",
    )
    w.add_argument(
        "--poll-interval",
        type=_ranged("--poll-interval", float, 0, above=True),
        help="seconds an idle thread sleeps before re-checking stop (default 0.1; new jobs wake it at once)",
    )

    w.add_argument(
        "--metrics-port",
        type=_port,
        help="serve Prometheus metrics on 127.0.0.1:PORT while working",
    )
    w.add_argument(
        "--timeout",
        type=_ranged("--timeout", float, 0, above=True),
        help="seconds one attempt may run before it is stopped and nacked (a job's own wins)",
    )
    w.add_argument(
        "--grace",
        type=_ranged("--grace", float, 0),
        default=30.0,
        help="seconds running handlers get to finish after SIGTERM/SIGINT before their jobs are "
        "handed back (default 30)",
    )

    me = cmd(
        "metrics",
        cmd_metrics,
        "serve Prometheus metrics of the queue on 127.0.0.1 (needs ringq[metrics])",
    )
    me.add_argument(
        "--port", type=_port, default=9464, help="TCP port (default 9464; 0: a free one)"
    )

    da = cmd(
        "dashboard",
        cmd_dashboard,
        "serve a local web dashboard on 127.0.0.1 (needs ringq[dashboard])",
    )
    da.add_argument(
        "--port", type=_port, default=8765, help="TCP port (default 8765; 0: a free one)"
    )
    da.add_argument(
        "--allow-actions",
        action="store_true",
        help="allow requeue, discard and purge from the browser (default: read-only)",
    )

    t = cmd("top", cmd_top, "live view of counts and rates (q or Ctrl-C quits)")
    t.add_argument(
        "--interval",
        type=_ranged("--interval", float, 0, above=True),
        default=1.0,
        help="seconds between refreshes (default 1)",
    )
    t.add_argument(
        "--once", action="store_true", help="print one sample (rates over one interval) and exit"
    )

    dm = cmd("demo", cmd_demo, "fan real files out to worker processes, SIGKILL one, lose nothing")
    dm.add_argument(
        "--source", help="directory tree to process (default: this Python's standard library)"
    )
    dm.add_argument("--limit", type=_ranged("--limit", int, 1), help="process at most N files")
    dm.add_argument(
        "--workers",
        type=_ranged("--workers", int, 1),
        help="worker processes (default: one per core)",
    )
    dm.add_argument(
        "--threads",
        type=_ranged("--threads", int, 1),
        default=2,
        help="handler threads per worker process (default 2)",
    )
    dm.add_argument("--no-kill", action="store_true", help="do not SIGKILL a worker midway")
    dm.add_argument("--keep", metavar="DIR", help="keep the queue directory at DIR for inspection")

    mg = cmd(
        "migrate",
        cmd_migrate,
        "copy pending, delayed and dead jobs from SRC to DST (dirs or Redis URLs)",
    )
    mg.add_argument("src", metavar="SRC")
    mg.add_argument("dst", metavar="DST")
    mg.add_argument(
        "--purge-source",
        action="store_true",
        help="then purge SRC (refused while it has leased jobs)",
    )

    sc = cmd("schedule", cmd_schedule, "periodic jobs: add, list or remove (fired by `ringq work`)")
    scs = sc.add_subparsers(dest="schedule_cmd", metavar="ACTION")
    sca = scs.add_parser("add", parents=[common], help="create or replace a periodic job")
    sca.add_argument("name", help="schedule name [A-Za-z0-9_.-]{1,64}")
    sca.add_argument("payload", help="JSON value or text (as for enqueue)")
    sca.add_argument(
        "--text", action="store_true", help="take the payload as a string, never as JSON"
    )
    when = sca.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--every", type=_ranged("--every", float, 0, above=True), help="seconds between ticks"
    )
    when.add_argument(
        "--cron", help="cron expression, e.g. '0 2 * * *' (5 fields, or 6 with seconds first)"
    )
    sca.add_argument("--tz", default="UTC", help="time zone of --cron (IANA name; default UTC)")
    sca.add_argument("--priority", type=int, default=0, help="priority of each job (default 0)")
    sca.add_argument(
        "--max-attempts", type=int, help="leases per job before dead-lettering (default: 5)"
    )
    scs.add_parser("list", parents=[common], help="periodic jobs with their next and last tick")
    scr = scs.add_parser(
        "rm", parents=[common], help="remove a periodic job (its enqueued jobs stay)"
    )
    scr.add_argument("name")

    # Everything after `bench` belongs to ringq.bench; main() splits it off before parsing.
    b = sub.add_parser(
        "bench",
        help="run the benchmark harness (arguments after 'bench' go to ringq.bench)",
        add_help=False,
    )
    b.set_defaults(func=cmd_bench, args=[])
    return p


def cmd_schedule(args: argparse.Namespace) -> int:
    action = getattr(args, "schedule_cmd", None)
    if action is None:
        raise UserError("say what to do: ringq schedule add|list|rm (ringq schedule --help)")
    if action == "add":
        payload = _payload(args.payload, args.text)
        with _open(args, create=True) as q:
            s = q.schedule(
                args.name,
                payload,
                every=args.every,
                cron=args.cron,
                tz=args.tz,
                priority=args.priority,
                max_attempts=args.max_attempts,
            )
        _emit(args, s.to_dict(), _schedule_line(s))
        return 0
    with _open(args) as q:
        if action == "rm":
            q.unschedule(args.name)
            _emit(args, {"removed": args.name}, None)
            return 0
        items = q.schedules()
    _emit(
        args,
        [s.to_dict() for s in items],
        "\n".join(_schedule_line(s) for s in items) if items else None,
    )
    return 0


def _schedule_line(s: Any) -> str:
    when = f"every {s.every:g}s" if s.every is not None else f"cron '{s.cron}' {s.tz}"

    def at(t: float | None) -> str:
        return (
            "-"
            if t is None
            else datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")
        )

    nxt = f"firing {at(s.firing_tick)}" if s.firing else f"next={at(s.next_fire)}"
    return f"{s.name}  {when}  {nxt}  last={at(s.last_fire)}  priority={s.priority}  payload={_short(s.to_dict()['payload'])}"


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(argv up to and including a 'bench' command, the rest)``; the rest is empty for other commands."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("--dir", "--queue", "--url", "-d", "-q"):
            i += 2
            continue
        if tok.startswith("-"):
            i += 1
            continue
        return (argv[: i + 1], argv[i + 1 :]) if tok == "bench" else (argv, [])
    return argv, []


def _version() -> str:
    from ringq import __version__

    return __version__


def _fill_closed_standard_fds() -> None:
    """Open a closed stdin, stdout or stderr (``ringq list >&-``) on /dev/null: what would be
    printed goes nowhere instead of failing, and no queue file opened later can take descriptor
    1 or 2 and receive it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: ``fd`` itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name in ("stdin", "stdout", "stderr"):
        if getattr(sys, name) is None:  # Python starts with None for a descriptor that was closed
            setattr(sys, name, open(os.devnull, "r" if name == "stdin" else "w"))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    _fill_closed_standard_fds()
    own, rest = _split_command(list(sys.argv[1:] if argv is None else argv))
    _Parser.json_errors = "--json" in own
    parser = _parser()
    try:
        args = parser.parse_args(own)
    except SystemExit as exc:  # a usage error (already printed), --help or --version
        return exc.code if isinstance(exc.code, int) else 2
    if args.cmd is None:
        parser.print_help()
        return 2
    if args.cmd == "bench":
        args.args = rest
    try:
        _check_target(args)
        rc = args.func(args)
        sys.stdout.flush()  # inside the try: a closed pipe is reported here, not at exit
        return rc
    except KeyboardInterrupt:
        _error(args, "interrupted")
        return 130
    except BrokenPipeError:  # `ringq list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (UserError, RingqError, ValueError, OSError) as exc:
        if os.environ.get("RINGQ_DEBUG"):
            raise
        _error(args, str(exc) or type(exc).__name__)
        if isinstance(exc, UserError):
            return exc.status
        # ValueError is a bad option value (usage); the queue's own errors and I/O errors are failures
        return 2 if isinstance(exc, ValueError) and not isinstance(exc, RingqError) else 1


# Commands that do not apply to a Redis queue, and why; every other command takes --url.
URL_REFUSED = {
    "inspect": "it reads a queue directory's files",
    "verify": "it reads a queue directory's files",
    "compact": "it gives back a queue directory's disk space (Redis frees memory as jobs expire)",
    "recover": "it reports the repairs made on opening a queue directory (a Redis queue has no files)",
    "schedule": "periodic jobs live in a local queue directory",
    "import-nobroker": "it imports into a queue directory (then `ringq migrate DIR URL`)",
    "migrate": "give the Redis URL as SRC or DST",
    "metrics": "its per-priority counts and holders are read from a queue directory's records "
    "(on Redis, scrape `ringq --url URL top --json` or the server's own exporter)",
    "dashboard": "its pages read a queue directory's records and storage (on Redis, use `top`)",
    "demo": "the demo runs on a temporary queue directory of its own",
    "bench": "the benchmarks take their own options",
    "upgrade": "it converts a queue directory's segment files",
}


def _check_target(args: argparse.Namespace) -> None:
    """--url or --dir, never both; a command that cannot use --url refuses it in one line."""
    url = getattr(args, "url", None)
    if url and args.dir is not None:
        raise UserError("give either --dir or --url, not both")
    if url and args.cmd in URL_REFUSED:
        raise UserError(f"{args.cmd} does not apply to --url: {URL_REFUSED[args.cmd]}")
    if args.cmd == "demo":
        given = [
            name
            for name, used in (
                ("-d/--dir", args.dir is not None),
                ("-q/--queue", args.queue != "default"),
                ("--json", args.json),
            )
            if used
        ]
        if given:
            raise UserError(
                f"demo does not take {', '.join(given)}: it runs on a queue of its own, in a "
                "temporary directory (--keep DIR to choose and keep it), and prints a report"
            )
    args.dir = url or args.dir or "./.ringq"  # with --url, messages name where the queue lives


def _error(args: argparse.Namespace, text: str) -> None:
    if args.json:  # one line whatever the text holds: JSON escapes it
        print(json.dumps({"error": text, "command": args.cmd}), file=sys.stderr)
    else:
        print(f"ringq {args.cmd}: {_printable(' '.join(text.split()))}", file=sys.stderr)
