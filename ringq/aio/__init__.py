"""ringq.aio: an asyncio task queue with errand's API, on ringq's engine (docs/aio.md)."""

from .queue import Job, Queue, Status

__all__ = ["Job", "Queue", "Status"]
