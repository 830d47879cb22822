"""Rescheduling and dependents on the Redis backend: that part of :class:`ringq.RedisQueue`'s
API, as ringq/local/workflows.py is for the local Queue.  Dependencies themselves are the
enqueue script's and each finishing script's (ringq/redis/lua.py: ``place`` and ``fire``);
docs/workflows.md describes the behaviour.
"""

from __future__ import annotations

from ringq.backend import check_job_ref
from ringq.errors import JobNotWaitingError
from ringq.job import Job

from .scripts import Scripts, job_from_reply, refuse

__all__ = ["RedisWorkflows"]


class RedisWorkflows:
    """Rescheduling and dependents of one Redis queue (the API is :class:`RedisQueue`'s)."""

    def __init__(self, scripts: Scripts, name: str) -> None:
        self.scripts = scripts
        self.name = name

    def reschedule(self, job: Job | str, priority: int | None, delay: float | None) -> Job:
        """As :meth:`RedisQueue.reschedule` (arguments already checked)."""
        self.scripts.live()
        check_job_ref(job)
        jid = job.id if isinstance(job, Job) else job
        args = [
            jid,
            "" if priority is None else priority,
            "" if delay is None else int(round(delay * 1000)),
        ]
        out = self.scripts.run("reschedule", args, write=True)
        status = out[0].decode()
        if status == "leased":
            raise JobNotWaitingError(f"cannot reschedule job {jid!r}: it is leased")
        if status.startswith("fin:"):
            raise JobNotWaitingError(
                f"cannot reschedule job {jid!r}: it is {status[4:]}, not waiting"
            )
        refuse(self.name, status, jid, "reschedule")
        return job_from_reply(out[1], out[2])

    def dependents(self, job: Job | str) -> list[str]:
        """As :meth:`RedisQueue.dependents`."""
        self.scripts.live()
        check_job_ref(job)
        jid = job.id if isinstance(job, Job) else job
        out = self.scripts.run("dependents", [jid])
        pairs = [(float(out[i + 1]), out[i].decode()) for i in range(0, len(out), 2)]
        return [c for _, c in sorted(pairs)]
