"""Cancel, pause, progress and results of a local queue: the part of :class:`ringq.Queue`'s API
that ends jobs early, holds them back or reports on them.  What they store is
ringq/engine/lifecycle.py's (the expiry in the record, the pause file, the progress side file)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ringq.backend import check_progress
from ringq.engine.lifecycle import read_first_attempt, report_progress, write_first_attempt
from ringq.job import Job
from ringq.results import Results, finished_without

from .cancel import cancel

if TYPE_CHECKING:  # pragma: no cover
    from .context import QueueContext

__all__ = ["Lifecycle"]


class Lifecycle:
    """Cancel, pause, progress and results of one local queue (the API is :class:`ringq.Queue`'s).
    ``find(id)`` is the queue's ``get``: what a wait for a result asks about the job."""

    def __init__(self, ctx: QueueContext, results: Results, find: Callable[[str], Job]) -> None:
        self.ctx = ctx
        self.results = results
        self.find = find

    def cancel(self, job: Job | str) -> Job:
        """As :meth:`ringq.Queue.cancel`."""
        self.ctx.live()
        with self.ctx.live_lock:
            self.ctx.refresh()
            return cancel(self.ctx.leases, job, self.ctx.name)

    def pause(self, key: str | None = None) -> None:
        """As :meth:`ringq.Queue.pause`."""
        with self.ctx.live_lock:
            if key is None:
                self.ctx.pause.set_queue(True)
            else:
                self.ctx.pause.set_key(_key(key), True)

    def resume(self, key: str | None = None) -> None:
        """As :meth:`ringq.Queue.resume`."""
        with self.ctx.live_lock:
            if key is None:
                self.ctx.pause.set_queue(False)
            else:
                self.ctx.pause.set_key(_key(key), False)
            self.ctx.ring.ctl.wake()

    def paused(self) -> dict[str, Any]:
        """As :meth:`ringq.Queue.paused`."""
        with self.ctx.live_lock:
            return {
                "queue": self.ctx.pause.queue_paused(),
                "keys": sorted(self.ctx.pause.paused_keys()),
            }

    def progress(self, job: Job | str, fraction: float, message: str | None = None) -> None:
        """As :meth:`ringq.Queue.progress`."""
        self.ctx.live()
        fraction, message = check_progress(fraction, message)
        with self.ctx.live_lock:
            view, slot, w, job_id, token = self.ctx.leases.word_for(
                job, self.ctx.name, "report progress of"
            )
            report_progress(self.ctx.ring, view.seg, slot, w, job_id, token, fraction, message)

    def trace_first_attempt(self, job: Job | str, traceparent: str) -> None:
        """As :meth:`ringq.Queue.trace_first_attempt`."""
        self.ctx.live()
        with self.ctx.live_lock:
            view, slot, _id = self.ctx.leases.locate(job, self.ctx.name)
            write_first_attempt(self.ctx.ring, view.seg, slot, traceparent)

    def first_attempt_trace(self, job: Job | str) -> str | None:
        """As :meth:`ringq.Queue.first_attempt_trace`."""
        self.ctx.live()
        with self.ctx.live_lock:
            view, slot, _id = self.ctx.leases.locate(job, self.ctx.name)
            return read_first_attempt(self.ctx.ring, view.seg, slot)

    def result(self, job_id: str | Job, *, wait: float | None = None) -> Any:
        """As :meth:`ringq.Queue.result`."""
        self.ctx.live()
        jid = job_id.id if isinstance(job_id, Job) else job_id
        return self.results.wait(jid, wait, lambda: finished_without(self.find, self.results, jid))


def _key(key: object) -> str:
    """A pause's key: a str, as ``enqueue(..., key=)`` takes (``5`` or ``b"pdf"`` would pause a
    key no job has)."""
    if not isinstance(key, str):
        raise TypeError(f"a key is a str, got {type(key).__name__} {key!r}")
    return key
