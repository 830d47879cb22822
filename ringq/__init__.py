"""ringq: a durable, crash-safe job queue for one host, with no broker.

Producers and consumers are ordinary processes; the queue is a directory of memory-mapped segment
files.  Writers append under flock with msync durability; readers lease lock-free by CAS on shared
state words; a dead process's leases come back at once.  Delivery is at-least-once.

    from ringq import Queue
    q = Queue("./jobs")
    q.enqueue({"greet": "world"})
    job = q.lease_one()
    q.ack(job)

The API keeps the names of the ``nobroker`` package; ``ringq.aio`` offers an asyncio API.
"""

from typing import TYPE_CHECKING, Any

from .backend import CompactionResult, QueueStats
from .backoff import BackoffPolicy
from .connect import connect
from .errors import (
    BackendError,
    CompactionError,
    ConnectionLostError,
    CorruptionError,
    CorruptLogError,
    DuplicateJobError,
    ForeignQueueError,
    FormatVersionError,
    JobFinishedError,
    JobNotFoundError,
    JobNotWaitingError,
    LimitError,
    LimitsFileError,
    LockTimeoutError,
    MissingExtraError,
    NobrokerError,
    NotLeasedError,
    QueueClosedError,
    QueueFullError,
    QueuePathError,
    ReadOnlyQueueError,
    RecordTooLargeError,
    ReplicationTimeoutError,
    RingqError,
    SerializationError,
    UnsupportedFilesystemError,
)
from .job import Job, JobState
from .results import ResultNotFoundError

if TYPE_CHECKING:  # the names below load the storage engine (and numpy): on first use, not here
    from .engine.recovery import RecoveryReport
    from .local.limits import LimitInfo
    from .local.options import QueueOptions
    from .local.queue import Queue
    from .local.schedule import Schedule
    from .redis.queue import RedisQueue
    from .worker.worker import Worker, WorkerStats

__version__ = "0.1.0"

_LAZY = {
    "Queue": ("ringq.local.queue", "Queue"),
    "QueueOptions": ("ringq.local.options", "QueueOptions"),
    "LimitInfo": ("ringq.local.limits", "LimitInfo"),
    "Schedule": ("ringq.local.schedule", "Schedule"),
    "RedisQueue": ("ringq.redis.queue", "RedisQueue"),
    "RecoveryReport": ("ringq.engine.recovery", "RecoveryReport"),
    "Worker": ("ringq.worker.worker", "Worker"),
    "WorkerStats": ("ringq.worker.worker", "WorkerStats"),
}


def __getattr__(name: str) -> Any:
    """``ringq.Queue`` and the other names of _LAZY, imported when first used."""
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ringq' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


__all__ = [
    "BackendError",
    "BackoffPolicy",
    "ConnectionLostError",
    "CompactionError",
    "CompactionResult",
    "CorruptLogError",
    "CorruptionError",
    "DuplicateJobError",
    "ForeignQueueError",
    "FormatVersionError",
    "Job",
    "JobFinishedError",
    "JobNotWaitingError",
    "JobNotFoundError",
    "JobState",
    "LimitInfo",
    "LimitError",
    "LimitsFileError",
    "LockTimeoutError",
    "MissingExtraError",
    "NobrokerError",
    "NotLeasedError",
    "Queue",
    "QueueClosedError",
    "QueueOptions",
    "QueueFullError",
    "QueuePathError",
    "QueueStats",
    "ReadOnlyQueueError",
    "RecordTooLargeError",
    "RecoveryReport",
    "RedisQueue",
    "ResultNotFoundError",
    "ReplicationTimeoutError",
    "RingqError",
    "Schedule",
    "SerializationError",
    "UnsupportedFilesystemError",
    "Worker",
    "WorkerStats",
    "__version__",
    "connect",
]
