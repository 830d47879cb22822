"""Cancel, pause, progress and results on the Redis backend: that part of
:class:`ringq.RedisQueue`'s API, as ringq/lifecycle.py's LifecycleMethods is for the local Queue.
docs/lifecycle.md describes the behaviour; each transition is one script of ringq/_redis_lua.py.
"""

from __future__ import annotations

from typing import Any

from ringq.backend import check_fraction
from ringq.errors import JobFinishedError
from ringq.job import Job
from ringq.results import Results, finished_without

from .scripts import PAUSE, Scripts, job_from_reply, refuse

__all__ = ["RedisLifecycleMethods"]

_NO_KEY_PAUSE = "pausing one key is not available on the Redis backend; pause the queue"


class RedisLifecycleMethods:
    """A mixin: ``RedisQueue`` owns ``_scripts`` (ringq/redis_scripts.py), ``_results`` (the
    companion ``<name>-results`` queue) and ``name``."""

    name: str
    _scripts: Scripts
    _results: Results

    def cancel(self, job: Job | str) -> Job:
        """As :meth:`ringq.Queue.cancel`: CANCELLED if ready or delayed, cancel-requested if
        leased.  Raises JobFinishedError, JobNotFoundError."""
        self._scripts.live()
        jid = job.id if isinstance(job, Job) else job
        out = self._scripts.run("cancel", [jid], write=True)
        status = out[0].decode() if isinstance(out[0], bytes) else out[0]
        if status.startswith("fin:"):
            raise JobFinishedError(f"cannot cancel job {jid!r}: it is already {status[4:]}")
        refuse(self.name, status, jid, "cancel")
        return job_from_reply(out[1], out[2])

    def pause(self, key: str | None = None) -> None:
        """Stop leases of the whole queue on every host until :meth:`resume`.  Per-key pause is
        not available on Redis (ValueError)."""
        self._scripts.live()
        if key is not None:
            raise ValueError(_NO_KEY_PAUSE)
        self._scripts.run("pause", ["1"], write=True)

    def resume(self, key: str | None = None) -> None:
        """Undo :meth:`pause`; sleeping leases are woken."""
        self._scripts.live()
        if key is not None:
            raise ValueError(_NO_KEY_PAUSE)
        self._scripts.run("pause", ["0"], write=True)

    def paused(self) -> dict[str, Any]:
        """``{"queue": bool, "keys": []}``."""
        s = self._scripts
        s.live()
        return {"queue": s.call(lambda: s.client.get(s.keys[PAUSE])) == b"1", "keys": []}

    def progress(self, job: Job | str, fraction: float, message: str | None = None) -> None:
        """As :meth:`ringq.Queue.progress`: fenced like an ack; shown by get and list_jobs."""
        self._scripts.live()
        f = check_fraction(fraction)
        jid, tok = (job.id, int(job.lease_token or 0)) if isinstance(job, Job) else (job, -1)
        text = "" if message is None else str(message).encode("utf-8", "replace").decode()
        status = self._scripts.run("progress", [jid, tok, repr(f), text, int(message is not None)])
        refuse(self.name, status, jid, "report progress of")

    def result(self, job_id: str | Job, *, wait: float | None = None) -> Any:
        """As :meth:`ringq.Queue.result`.  A waiting call sleeps in BLPOP on the results queue's
        wake list (at most a second at a time)."""
        self._scripts.live()
        jid = job_id.id if isinstance(job_id, Job) else job_id
        return self._results.wait(jid, wait, lambda: finished_without(self.get, self._results, jid))
