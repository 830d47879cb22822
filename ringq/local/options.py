"""The settings a :class:`ringq.Queue` was opened with, frozen, so they can be handed on whole."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ringq.backend import DEFAULT_VISIBILITY_TIMEOUT
from ringq.backoff import BackoffPolicy
from ringq.engine.ring import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE

__all__ = ["QueueOptions"]


@dataclass(frozen=True)
class QueueOptions:
    """Every setting of an open queue (``Queue.options``); the meaning of each is the Queue
    argument of the same name.  ``state_flush_interval`` is the resolved value (None: off).

    ``Queue(path, name, **opts.to_kwargs())`` opens the same queue with the same settings; this is
    how ``Worker(processes=N)`` configures its children.
    """

    durability: str = "msync"
    flush_interval: float = 0.05
    sync_acks: bool = False
    state_flush_interval: float | None = 1.0
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT
    max_attempts: int = 5
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    lock_timeout: float = 10.0
    slot_size: int = DEFAULT_SLOT_SIZE
    slot_count: int = DEFAULT_SLOT_COUNT
    mode: int = 0o600
    allow_network_fs: bool = False
    allow_foreign: bool = False
    auto_ids: bool = True
    spin: float = 0.0

    @classmethod
    def of_queue(
        cls,
        queue: Any,
        ring: Any,
        flush_interval: float,
        sync_acks: bool,
        lock_timeout: float,
        mode: int,
        allow_network_fs: bool,
        allow_foreign: bool,
        auto_ids: bool = True,
        spin: float = 0.0,
    ) -> QueueOptions:
        """The options of a queue just opened: the resolved strategy settings and the geometry the
        queue really has (an existing queue keeps its own, whatever was asked)."""
        return cls(
            durability=queue.durability,
            flush_interval=float(flush_interval),
            sync_acks=bool(sync_acks),
            state_flush_interval=ring.dur.state_flush_interval,
            visibility_timeout=queue.visibility_timeout,
            max_attempts=queue.max_attempts,
            backoff=queue.backoff,
            lock_timeout=lock_timeout,
            slot_size=ring.ctl.slot_size,
            slot_count=ring.ctl.slot_count,
            mode=mode,
            allow_network_fs=allow_network_fs,
            allow_foreign=allow_foreign,
            auto_ids=bool(auto_ids),
            spin=float(spin),
        )

    def to_kwargs(self) -> dict[str, Any]:
        """The settings as Queue keyword arguments."""
        out = asdict(self)
        out["backoff"] = self.backoff  # the policy object itself, not a dict of its fields
        return out
