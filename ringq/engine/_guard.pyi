# The compiled module of csrc/ext/guard.c.
from typing import Any, Literal

class LiveLock:
    """The queue lock, taken only while the queue is open: entering takes ``ctx.lock`` and raises
    what ``ctx.live()`` raises (holding nothing) once ``ctx.closed``; exiting releases it."""

    def __init__(self, ctx: Any) -> None: ...
    def __enter__(self) -> None: ...
    def __exit__(self, *exc: object) -> Literal[False]: ...
