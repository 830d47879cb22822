"""The ``ringq`` command line.  ``ringq --help`` lists the subcommands.

User mistakes (bad JSON, unknown job id, unusable directory) print one line on stderr and exit
with status 2; nothing prints a traceback unless ``RINGQ_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .errors import RingqError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringq", description="ringq: a durable job queue for one host, no broker.")
    p.add_argument("--dir", default="./.ringq", help="queue directory (default ./.ringq)")
    p.add_argument("--queue", default="default", help="queue name (default 'default')")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="fan real files out to worker processes, SIGKILL one, lose nothing")
    d.add_argument("--source", help="directory tree to process (default: this Python's standard library)")
    d.add_argument("--limit", type=int, help="process at most N files")
    d.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    d.add_argument("--threads", type=int, default=2, help="handler threads per worker process (default 2)")
    d.add_argument("--no-kill", action="store_true", help="do not SIGKILL a worker midway")
    d.add_argument("--keep", metavar="DIR", help="keep the queue directory at DIR for inspection")

    s = sub.add_parser("stats", help="counts of jobs by state")
    s.set_defaults()

    e = sub.add_parser("enqueue", help="add a job (payload parsed as JSON, else taken as text)")
    e.add_argument("payload")
    e.add_argument("--priority", type=int, default=0)
    e.add_argument("--delay", type=float, default=0.0, help="seconds")
    e.add_argument("--count", type=int, default=1)
    e.add_argument("--job-id")
    return p


def _emit(args: argparse.Namespace, obj: Any, text: str) -> None:
    print(json.dumps(obj) if args.json else text)


def _open(args: argparse.Namespace):
    from .queue import Queue

    return Queue(args.dir, args.queue)


def _payload(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "demo":
            from . import demo

            return demo.run(source=args.source, limit=args.limit, workers=args.workers, qdir=args.keep,
                            kill=not args.no_kill, threads=args.threads)
        if args.cmd == "stats":
            with _open(args) as q:
                st = q.stats()
            _emit(args, st.to_dict(), "  ".join(f"{k}={v}" for k, v in st.to_dict().items()))
            return 0
        if args.cmd == "enqueue":
            if args.count > 1 and args.job_id:
                raise ValueError("--job-id names one job; it cannot be used with --count > 1")
            with _open(args) as q:
                payload = _payload(args.payload)
                if args.count == 1:
                    jobs = [q.enqueue(payload, priority=args.priority, delay=args.delay, job_id=args.job_id)]
                else:
                    jobs = q.enqueue_many([payload] * args.count, priority=args.priority, delay=args.delay)
            _emit(args, [j.to_dict() for j in jobs], "\n".join(j.id for j in jobs))
            return 0
    except (RingqError, ValueError, OSError) as exc:
        if os.environ.get("RINGQ_DEBUG"):
            raise
        print(f"ringq {args.cmd}: {exc}", file=sys.stderr)
        return 2
    return 2
