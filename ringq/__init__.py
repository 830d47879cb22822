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

from ringq.engine.recovery import RecoveryReport
from ringq.local.queue import CompactionResult, Queue, QueueStats
from ringq.worker.worker import Worker, WorkerStats

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
    LimitError,
    LimitsFileError,
    LockTimeoutError,
    MissingExtraError,
    NobrokerError,
    NotLeasedError,
    QueueClosedError,
    QueueFullError,
    RecordTooLargeError,
    ReplicationTimeoutError,
    RingqError,
    SerializationError,
    UnsupportedFilesystemError,
)
from .job import Job, JobState
from .results import ResultNotFoundError

__version__ = "0.1.0"

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
    "JobNotFoundError",
    "JobState",
    "LimitError",
    "LimitsFileError",
    "LockTimeoutError",
    "MissingExtraError",
    "NobrokerError",
    "NotLeasedError",
    "Queue",
    "QueueClosedError",
    "QueueFullError",
    "QueueStats",
    "RecordTooLargeError",
    "RecoveryReport",
    "ResultNotFoundError",
    "ReplicationTimeoutError",
    "RingqError",
    "SerializationError",
    "UnsupportedFilesystemError",
    "Worker",
    "WorkerStats",
    "__version__",
    "connect",
]
