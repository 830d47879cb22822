"""The Worker: runs a handler over a queue's jobs in threads or child processes."""

from .worker import Worker, WorkerStats

__all__ = ["Worker", "WorkerStats"]
