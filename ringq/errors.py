"""The ringq exception hierarchy, and the one place C return codes become exceptions.

Every error ringq raises on purpose is a :class:`RingqError`, so ``except RingqError`` means "the
queue went wrong" without swallowing bugs in a handler.  Messages name the job, file or limit
involved.  :func:`check` turns the negative return codes of the C helper (``csrc/ringq.h``:
``-errno`` or ``RINGQ_E*``) into these types; no other module interprets a return code.
"""

from __future__ import annotations

__all__ = [
    "RingqError",
    "LimitError",
    "LimitsFileError",
    "DuplicateJobError",
    "QueueClosedError",
    "NotLeasedError",
    "JobNotFoundError",
    "SerializationError",
    "RecordTooLargeError",
    "LockTimeoutError",
    "CorruptionError",
    "FormatVersionError",
    "QueueFullError",
    "UnsupportedFilesystemError",
    "QueuePathError",
    "ReadOnlyQueueError",
    "BackendError",
    "ConnectionLostError",
    "ReplicationTimeoutError",
    "CompactionError",
    "JobFinishedError",
    "JobNotWaitingError",
    "ForeignQueueError",
    "NobrokerError",
    "CorruptLogError",
]


class RingqError(Exception):
    """Base class of every error ringq raises on purpose."""


class QueueClosedError(RingqError):
    """An operation was attempted on a closed :class:`~ringq.Queue`."""


class NotLeasedError(RingqError):
    """ack/nack/extend on a job that is not leased, or with a stale fencing token.

    The usual cause is a lease that outlived its visibility timeout (or whose holder was declared
    dead) and was delivered again; under at-least-once delivery this is a normal event.
    """


class JobNotFoundError(RingqError, KeyError):
    """No job with that id is retained in the queue."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class SerializationError(RingqError, ValueError):
    """A payload cannot be encoded (or a stored payload decoded).  Nothing was written."""


class RecordTooLargeError(SerializationError):
    """A record is larger than the largest record a segment can hold; the message gives the limit in bytes."""


class LockTimeoutError(RingqError):
    """The queue's writer lock (flock on ``<name>.lock``) was not acquired within ``lock_timeout`` seconds."""


class CorruptionError(RingqError):
    """A file of the queue is damaged or foreign in a way that recovery cannot repair."""


class FormatVersionError(CorruptionError):
    """A file was written in a format version this ringq does not understand (probably a newer one).

    ``upgradable`` is True for an older format that ``ringq upgrade`` converts in place."""

    upgradable = False


class QueueFullError(RingqError, OSError):
    """A new segment could not be allocated (disk full, quota, RLIMIT_FSIZE).

    Committed jobs are untouched; enqueue works again once space is freed.
    """


class UnsupportedFilesystemError(RingqError):
    """The queue directory is on a network file system (NFS, SMB/CIFS) where flock and shared mappings do not work across hosts."""


class QueuePathError(RingqError, OSError):
    """The queue's path cannot be a queue directory: a file is there, or above it.  ``errno`` and
    ``filename`` are those of the failed call; nothing was created."""


class ReadOnlyQueueError(RingqError, OSError):
    """The queue directory cannot be written by this process: it is on a read-only file system
    (``EROFS``), or the directory denies this user write permission.  A :class:`~ringq.Queue`
    writes its lock and state files even to read, so it cannot open there; ``ringq verify`` and
    ``ringq inspect`` read such a queue without writing anything."""


class BackendError(RingqError):
    """The Redis server refused an operation (out of memory, read-only replica, cluster down, ...)."""


class ConnectionLostError(BackendError, ConnectionError):
    """The connection to the Redis server failed or timed out.

    The operation may or may not have taken effect: ack and a keyed enqueue (``job_id``) are safe
    to repeat; an enqueue without an id repeated after this error may store the job twice.
    """


class ReplicationTimeoutError(BackendError):
    """Fewer replicas than ``min_replicas`` acknowledged a write in time (Redis ``WAIT``).

    The write is on the primary; it may be lost if the primary fails before a replica has it.
    """


class JobFinishedError(RingqError):
    """The job already finished (done, cancelled, expired or dead-lettered): it cannot be cancelled."""


class JobNotWaitingError(RingqError):
    """The job is not waiting (ready, delayed or deferred): it is leased, or it finished, so it
    cannot be rescheduled.  The message says which."""


class MissingExtraError(RingqError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the
    ``pip install 'ringq[extra]'`` command that adds it."""


class CompactionError(RingqError):
    """:meth:`ringq.Queue.compact` could not finish; every job is where it was (nobroker's name)."""


class ForeignQueueError(RingqError):
    """The path holds another queue library's files (a nobroker log, an errand SQLite database).

    ringq does not open them as an empty queue of its own; the message says how to bring the jobs
    over (``ringq import-nobroker DIR``) or where to put the ringq queue instead.
    """


class LimitError(RingqError, ValueError):
    """A limit could not be set: a bad name, cap or rate, or the limits table is full
    (ringq/local/limits.py; 64 limits and 1024 live unique windows per queue)."""


class LimitsFileError(CorruptionError):
    """``<name>.limits`` failed validation when opened (bad size, magic, version or CRC).

    Jobs are not affected: the file holds only limit settings and shared counters.  Removing
    it while no process has the queue open drops every limit and unique window.
    """


class DuplicateJobError(RingqError):
    """``enqueue(..., unique_for=...)`` found a live unique window for the key, and the job that
    opened it is no longer retained (its segment retired).  ``job_id`` names that job."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


#: ``nobroker``'s name for the base error, so ``except NobrokerError`` keeps working after the
#: import is switched.
NobrokerError = RingqError

#: ``nobroker``'s name for "a file is damaged beyond repair".
CorruptLogError = CorruptionError
