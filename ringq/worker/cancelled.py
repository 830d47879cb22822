"""The event a Worker puts on each job it hands to a handler (``job.cancelled``).

A ``threading.Event`` makes a lock and a condition when it is created: about 3 microseconds,
a sixth of what the Worker spends on a no-op job.  Almost every job finishes without its event
ever being set or waited on, so :class:`CancelEvent` makes its condition only when ``set``,
``clear`` or ``wait`` first needs it; ``is_set`` (what a handler polls) reads a plain flag.
"""

from __future__ import annotations

import threading

__all__ = ["CancelEvent"]

# Guards the first creation of an event's condition (two threads may need it at once: the heartbeat
# setting the event while the handler starts waiting on it).  Held for a few instructions, once per
# event that is ever set or waited on.
_MAKING = threading.Lock()


class CancelEvent(threading.Event):
    """A ``threading.Event`` (every method and its meaning the same) whose condition is made on
    first use.  Flag reads and writes happen under that condition, as in the standard one."""

    def __init__(self) -> None:  # no super().__init__(): that would make the condition now
        self._is = False
        self._made: threading.Condition | None = None

    def _cond_now(self) -> threading.Condition:
        made = self._made
        if made is None:
            with _MAKING:
                made = self._made
                if made is None:
                    made = self._made = threading.Condition(threading.Lock())
        return made

    def __repr__(self) -> str:
        cls = type(self)
        return f"<{cls.__module__}.{cls.__qualname__} at {id(self):#x}: {'set' if self._is else 'unset'}>"

    def _at_fork_reinit(self) -> None:
        if self._made is not None:
            self._made._at_fork_reinit()  # type: ignore[attr-defined]

    def is_set(self) -> bool:
        """True if and only if the flag is set."""
        return self._is

    def isSet(self) -> bool:  # noqa: N802 (the standard class's deprecated alias)
        return self.is_set()

    def set(self) -> None:
        """Set the flag and wake every thread waiting for it."""
        cond = self._cond_now()
        with cond:
            self._is = True
            cond.notify_all()

    def clear(self) -> None:
        """Reset the flag: later ``wait`` calls block until ``set``."""
        with self._cond_now():
            self._is = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set or ``timeout`` seconds pass (None: no limit); returns the
        flag (False only on a timeout)."""
        cond = self._cond_now()
        with cond:
            signaled = self._is
            if not signaled:
                signaled = cond.wait(timeout)
            return signaled
