"""Reads and whole-queue operations on the Redis backend: that part of :class:`ringq.RedisQueue`'s
API (get, list_jobs, dlq, stats, requeue_dead, purge, import_jobs, server_identity), as
ringq/admin.py's AdminMethods is for the local Queue.  Each is one script of ringq/_redis_lua.py,
so a read sees one consistent instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ringq import codec
from ringq.backend import QueueStats
from ringq.errors import NotLeasedError, SerializationError
from ringq.ids import check_caller_id, renamed
from ringq.job import Job, JobState

from .scripts import Scripts, refuse
from .scripts import job_from_reply as _job

__all__ = ["RedisAdminMethods"]


class RedisAdminMethods:
    """A mixin: ``RedisQueue`` owns ``_scripts`` (ringq/redis_scripts.py), ``name``, ``cluster``
    and ``retain_done``."""

    name: str
    cluster: bool
    retain_done: float
    _scripts: Scripts

    def get(self, job_id: str) -> Job:
        """The job with this id (a snapshot).  Raises JobNotFoundError if it is not retained."""
        out = self._scripts.run("get", [job_id])
        if not out:
            refuse(self.name, "nf", job_id, "get")
        return _job(out[0], out[1])

    def list_jobs(
        self, state: JobState | str | None = None, *, limit: int | None = None, decode: bool = True
    ) -> list[Job]:
        """Retained jobs in enqueue order, optionally only those in ``state``, at most ``limit``."""
        want = "" if state is None else JobState(state).value
        out = self._scripts.run("list", [want, -1 if limit is None else limit])
        jobs = []
        for i in range(0, len(out), 2):
            try:
                jobs.append(_job(out[i], out[i + 1], decode=decode))
            except SerializationError:
                continue
        return jobs

    def dlq(self, *, limit: int | None = None) -> list[Job]:
        """Dead-lettered jobs, oldest first."""
        return self.list_jobs(JobState.DEAD, limit=limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """Move dead-lettered jobs (one, or all) back to READY with attempts reset; returns how many.
        Raises JobNotFoundError, or NotLeasedError if ``job_id`` is not dead."""
        out = self._scripts.run("requeue", ["" if job_id is None else job_id], write=True)
        if out == b"nf":
            refuse(self.name, "nf", str(job_id), "requeue")
        if out == b"notdead":
            raise NotLeasedError(f"job {job_id!r} is not in the dead-letter queue")
        return int(out)

    def purge(self) -> int:
        """Remove every retained job (ready, delayed, leased, done, dead); returns how many."""
        return int(self._scripts.run("purge", [], write=True))

    def stats(self) -> QueueStats:
        """Counts by state and the cumulative counters (one script, so one consistent instant).
        Cancelled and expired jobs are kept ``retain_done`` seconds, like done ones.

        ``enqueued_total``, ``acked_total`` and ``dead_lettered_total`` count, since the queue's
        first use, new jobs stored by enqueue, acks, and moves to the dead-letter queue (by nack
        or lease expiry, the latter counted when a lease call reclaims it); purge keeps them."""
        ready, delayed, leased, done, dead, cancelled, expired, enq, acked, dl = self._scripts.run(
            "stats", [int(self.retain_done * 1000)]
        )
        total = ready + delayed + leased + done + dead + cancelled + expired
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
        )

    def __len__(self) -> int:
        """Number of retained jobs (``stats().total``)."""
        return self.stats().total

    def import_jobs(self, jobs: Sequence[Job], *, source: str | None = None) -> int:
        """Store copies of ``jobs`` (READY, delayed or DEAD) keeping id, payload, priority, attempts,
        max attempts, available-at, enqueue time and last error; a job whose id is retained is
        skipped, so importing twice adds nothing.  Returns how many were added (for migrate).
        ``source``: as :meth:`ringq.Queue.import_jobs` (an automatic-form id becomes
        ``<source>-<id>``; without ``source`` it is refused with ValueError, nothing written)."""
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
            ]
        return int(self._scripts.run("import", args, write=True)) if jobs else 0

    def server_identity(self) -> str:
        """Which server and database hold this queue, however the URL spells them:
        ``"<run_id>/<db>"`` (Redis' ``INFO server`` run_id is unique per server process; on a
        cluster, that of the node serving the queue's hash slot).  Raises ConnectionLostError."""

        def ask() -> str:
            client = self._scripts.client
            if self.cluster:
                node = client.get_node_from_key(self._scripts.keys[0])
                info = client.info("server", target_nodes=node)
                if "run_id" not in info:  # keyed by node name when the client asked several
                    info = next(iter(info.values()))
                return f"{info['run_id']}/0"
            db = client.connection_pool.connection_kwargs.get("db", 0)
            return f"{client.info('server')['run_id']}/{db}"

        return self._scripts.call(ask, changes=False)
