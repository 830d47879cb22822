"""Reads and whole-queue operations on the Redis backend: that part of :class:`ringq.RedisQueue`'s
API (get, list_jobs, dlq, stats, requeue_dead, purge, import_jobs, server_identity), as
ringq/local/admin.py's Admin is for the local Queue.  Each is one script of ringq/redis/lua.py,
so a read sees one consistent instant.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ringq import codec
from ringq.backend import (
    QueueStats,
    SearchPage,
    ascii_contains,
    check_job_ref,
    check_limit,
    timeout_ms,
)
from ringq.errors import JobNotFoundError, NotLeasedError, SerializationError
from ringq.ids import check_caller_id, renamed
from ringq.job import Job, JobState
from ringq.tracing import clean

from .scripts import Scripts, refuse
from .scripts import job_from_reply as _job

__all__ = ["RedisAdmin"]


class RedisAdmin:
    """Reads and whole-queue operations of one Redis queue (the API is :class:`RedisQueue`'s),
    through its scripts."""

    def __init__(self, scripts: Scripts, name: str, cluster: bool, retain_done: float) -> None:
        self.scripts = scripts
        self.name = name
        self.cluster = cluster
        self.retain_done = retain_done

    def get(self, job_id: str) -> Job:
        """As :meth:`RedisQueue.get`."""
        check_job_ref(job_id)
        out = self.scripts.run("get", [job_id])
        if not out:
            refuse(self.name, "nf", job_id, "get")
        return _job(out[0], out[1])

    def list_jobs(
        self, state: JobState | str | None = None, *, limit: int | None = None, decode: bool = True
    ) -> list[Job]:
        """As :meth:`RedisQueue.list_jobs`."""
        want = "" if state is None else JobState(state).value
        limit = check_limit(limit)
        out = self.scripts.run("list", [want, -1 if limit is None else limit])
        jobs = []
        for i in range(0, len(out), 2):
            try:
                jobs.append(_job(out[i], out[i + 1], decode=decode))
            except SerializationError:
                continue
        return jobs

    def search(
        self,
        state: str | None,
        key: str | None,
        priority: int | None,
        job_id: str | None,
        error: str | None,
        after: str | None,
        limit: int | None,
    ) -> SearchPage:
        """As :meth:`RedisQueue.search`: one read of the queue's jobs (the list script), filtered
        here; the cursor is the seq of the page's last job."""
        limit = check_limit(limit)
        try:
            past = -1 if after is None else int(after)
        except ValueError:
            raise ValueError(f"not a search cursor: {after!r} (pass a page's next)") from None
        if job_id is not None:
            try:
                found = [self.get(job_id)]
            except JobNotFoundError:
                found = []
        else:
            found = self.list_jobs("ready" if state == "delayed" else state)
        now = time.time()
        hits = [
            j
            for j in found
            if (
                state is None
                or j.state.value == state
                or (state == "delayed" and j.state is JobState.READY and j.available_at > now)
            )
            and (state != "delayed" or j.available_at > now)
            and (priority is None or j.priority == priority)
            and (key is None or j.key == key)
            and (error is None or ascii_contains(j.last_error or "", error))
        ]
        rest = [j for j in hits if j.seq > past]
        page = rest if limit is None else rest[:limit]
        more = limit is not None and len(rest) > limit
        return SearchPage(page, len(hits), str(page[-1].seq) if more and page else None)

    def dlq(self, *, limit: int | None = None) -> list[Job]:
        """As :meth:`RedisQueue.dlq`."""
        return self.list_jobs(JobState.DEAD, limit=limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """As :meth:`RedisQueue.requeue_dead`."""
        out = self.scripts.run("requeue", ["" if job_id is None else job_id], write=True)
        if out == b"nf":
            refuse(self.name, "nf", str(job_id), "requeue")
        if out == b"notdead":
            raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")
        return int(out)

    def purge(self) -> int:
        """As :meth:`RedisQueue.purge`."""
        return int(self.scripts.run("purge", [], write=True))

    def stats(self) -> QueueStats:
        """As :meth:`RedisQueue.stats`."""
        out = self.scripts.run("stats", [int(self.retain_done * 1000)])
        ready, delayed, leased, done, dead, cancelled, expired, enq, acked, dl, deferred = out
        total = ready + delayed + leased + done + dead + cancelled + expired + deferred
        return QueueStats(
            ready,
            delayed,
            leased,
            done,
            dead,
            total,
            0,
            enq,
            acked,
            dl,
            cancelled=cancelled,
            expired=expired,
            deferred=deferred,
        )

    def import_jobs(self, jobs: Sequence[Job], *, source: str | None = None) -> int:
        """As :meth:`RedisQueue.import_jobs`."""
        jobs = renamed(jobs, source)
        for j in jobs:
            check_caller_id(j.id)
        args: list[Any] = [len(jobs)]
        for j in jobs:
            kind, data = codec.encode(j.payload)
            args += [
                j.id,
                bytes([kind]) + data,
                j.priority,
                j.attempts,
                j.max_attempts,
                int(j.available_at * 1000),
                int(j.enqueued_at * 1000),
                "dead" if j.state is JobState.DEAD else "ready",
                j.last_error or "",
                timeout_ms(j.timeout) or 0,
                *(t or "" for t in clean(j.trace_context)),
            ]
        return int(self.scripts.run("import", args, write=True)) if jobs else 0

    def server_identity(self) -> str:
        """As :meth:`RedisQueue.server_identity`."""

        def ask() -> str:
            client = self.scripts.client
            if self.cluster:
                node = client.get_node_from_key(self.scripts.keys[0])
                info = client.info("server", target_nodes=node)
                if "run_id" not in info:  # keyed by node name when the client asked several
                    info = next(iter(info.values()))
                return f"{info['run_id']}/0"
            db = client.connection_pool.connection_kwargs.get("db", 0)
            return f"{client.info('server')['run_id']}/{db}"

        return self.scripts.call(ask, changes=False)
