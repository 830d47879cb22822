"""Cancel, pause, progress and results on the Redis backend: that part of
:class:`ringq.RedisQueue`'s API, as ringq/local/lifecycle.py's Lifecycle is for the local Queue.
docs/lifecycle.md describes the behaviour; each transition is one script of ringq/redis/lua.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ringq.backend import check_job_ref, check_progress
from ringq.errors import JobFinishedError
from ringq.job import Job
from ringq.results import Results, finished_without

from .scripts import PAUSE, Scripts, job_from_reply, refuse

__all__ = ["RedisLifecycle"]

_NO_KEY_PAUSE = "pausing one key is not available on the Redis backend; pause the queue"


class RedisLifecycle:
    """Cancel, pause, progress and results of one Redis queue (the API is :class:`RedisQueue`'s);
    ``find(id)`` is the queue's ``get``."""

    def __init__(
        self, scripts: Scripts, results: Results, name: str, find: Callable[[str], Job]
    ) -> None:
        self.scripts = scripts
        self.results = results
        self.name = name
        self.find = find

    def cancel(self, job: Job | str) -> Job:
        """As :meth:`RedisQueue.cancel`."""
        self.scripts.live()
        check_job_ref(job)
        jid = job.id if isinstance(job, Job) else job
        out = self.scripts.run("cancel", [jid], write=True)
        status = out[0].decode() if isinstance(out[0], bytes) else out[0]
        if status.startswith("fin:"):
            raise JobFinishedError(f"cannot cancel job {jid!r}: it is already {status[4:]}")
        refuse(self.name, status, jid, "cancel")
        return job_from_reply(out[1], out[2])

    def pause(self, key: str | None = None) -> None:
        """As :meth:`RedisQueue.pause`."""
        self.scripts.live()
        if key is not None:
            raise ValueError(_NO_KEY_PAUSE)
        self.scripts.run("pause", ["1"], write=True)

    def resume(self, key: str | None = None) -> None:
        """As :meth:`RedisQueue.resume`."""
        self.scripts.live()
        if key is not None:
            raise ValueError(_NO_KEY_PAUSE)
        self.scripts.run("pause", ["0"], write=True)

    def paused(self) -> dict[str, Any]:
        """As :meth:`RedisQueue.paused`."""
        s = self.scripts
        s.live()
        return {"queue": s.call(lambda: s.client.get(s.keys[PAUSE])) == b"1", "keys": []}

    def progress(self, job: Job | str, fraction: float, message: str | None = None) -> None:
        """As :meth:`RedisQueue.progress`."""
        self.scripts.live()
        f, message = check_progress(fraction, message)
        jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
        text = "" if message is None else message.encode("utf-8", "replace").decode()
        status = self.scripts.run("progress", [jid, tok, repr(f), text, int(message is not None)])
        refuse(self.name, status, jid, "report progress of")

    def trace_first_attempt(self, job: Job | str, traceparent: str) -> None:
        """As :meth:`RedisQueue.trace_first_attempt`."""
        jid = job.id if isinstance(job, Job) else job
        self.scripts.run("trace_note", [jid, traceparent])

    def first_attempt_trace(self, job: Job | str) -> str | None:
        """As :meth:`RedisQueue.first_attempt_trace`."""
        jid = job.id if isinstance(job, Job) else job
        out = self.scripts.run("get", [jid])
        if not out:
            return None
        fa = json.loads(out[0]).get("fa")
        return fa if isinstance(fa, str) else None

    def result(self, job_id: str | Job, *, wait: float | None = None) -> Any:
        """As :meth:`RedisQueue.result`."""
        self.scripts.live()
        jid = job_id.id if isinstance(job_id, Job) else job_id
        return self.results.wait(jid, wait, lambda: finished_without(self.find, self.results, jid))
