"""Retry delays: capped exponential backoff with jitter.

The delay before retry n (n = attempts so far, >= 1) is ``min(base * factor**(n-1), max_delay)``;
a fraction ``jitter`` of it is drawn uniformly at random so that a burst of failures does not retry
in lock-step ("equal jitter" at 0.5, "full jitter" at 1.0: M. Brooker, *Exponential Backoff And
Jitter*, AWS Architecture Blog, 2015).  The delay is drawn once, when the job is nacked, and stored
as an absolute time in the job's state word: reopening a queue never re-draws it (docs/design.md,
Invariants, 6).  Field names and defaults match ``nobroker.BackoffPolicy``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["BackoffPolicy"]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How long a failed job waits before it may be leased again.

    Attributes:
        base: delay after the first failure, seconds (>= 0).
        factor: growth per further failure (>= 1).
        max_delay: ceiling on the delay, seconds.
        jitter: fraction of the delay drawn at random, in [0, 1]; 0 is deterministic.

    Raises:
        ValueError: a field is out of range.
    """

    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not self.base >= 0:
            raise ValueError(f"backoff base must be >= 0 seconds, got {self.base!r}")
        if not self.factor >= 1:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor!r}")
        if not self.max_delay >= 0:
            raise ValueError(f"backoff max_delay must be >= 0 seconds, got {self.max_delay!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"backoff jitter must be in [0, 1], got {self.jitter!r}")

    def delay_for(self, attempts: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before the next attempt of a job that has failed ``attempts`` times (0 for 0)."""
        if attempts <= 0:
            return 0.0
        try:
            raw = min(self.base * self.factor ** (attempts - 1), self.max_delay)
        except OverflowError:
            raw = self.max_delay
        if self.jitter == 0.0:
            return raw
        return raw * (1.0 - self.jitter) + (rng or random).uniform(0.0, raw * self.jitter)
