"""The in-flight board of ``Worker(processes=N)``: which job each handler thread of each child runs,
and until when, in shared memory the parent reads.

A child's handler thread writes its entry when it starts a job and clears it when the handler
returns; the parent reads every entry each pass of its loop.  It kills a child whose entry's
deadline passed (a hard timeout) or that is still alive after the grace period of a drain, and
then hands that child's jobs back itself (``nack``: the timed-out one with ``"timeout after N
s"``, the others for immediate redelivery), since a killed process cannot.

Each entry is a seqlock: the writer makes its generation odd, writes the fields, then makes it
even; a reader takes the fields only if it read the same even generation before and after them
(stores reach another process's view of a shared mapping in program order on the hosts ringq runs
on, and each field is one aligned 8-byte word).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Board", "Entry", "ID_CAP"]

ID_CAP = 512  # bytes of job id an entry holds; a longer id is left to its lease to end
_GEN, _DEADLINE, _TIMEOUT, _TOKEN, _ATTEMPTS, _IDLEN = range(6)
_WORDS = 6
_FIELDS = struct.Struct("5q")  # the words after the generation, _DEADLINE to _IDLEN, in order


@dataclass(frozen=True, slots=True)
class Entry:
    """One running job as the parent reads it: id (None if it did not fit), fencing token,
    attempts, the deadline in ms since the Unix epoch (0: no timeout) and the timeout in ms."""

    job_id: str | None
    token: int
    attempts: int
    deadline_ms: int
    timeout_ms: int


class Board:
    """Entries for ``children`` child slots of ``threads`` handler threads each, in memory shared
    by fork (``ctx`` a multiprocessing context)."""

    def __init__(self, ctx: Any, children: int, threads: int) -> None:
        self.children = children
        self.threads = threads
        self.words = ctx.Array("q", children * threads * _WORDS, lock=False)
        self.ids = ctx.Array("B", children * threads * ID_CAP, lock=False)
        # Views of the same shared memory: a memoryview's item and slice stores cost a third of
        # a ctypes array's, and a handler thread writes an entry for every job it runs.
        self._bytes = memoryview(self.words).cast("B")
        self._w = self._bytes.cast("q")
        self._ids = memoryview(self.ids).cast("B")

    def _base(self, child: int, thread: int) -> int:
        return (child * self.threads + thread) * _WORDS

    def start(
        self,
        child: int,
        thread: int,
        job_id: str,
        token: int,
        attempts: int,
        timeout_ms: int | None,
    ) -> None:
        """A handler thread starts ``job_id`` (leased with ``token``): its entry is written."""
        b, w = self._base(child, thread), self._w
        raw = job_id.encode("utf-8", "replace")
        w[b + _GEN] += 1  # odd: being written
        if len(raw) <= ID_CAP:
            at = (child * self.threads + thread) * ID_CAP
            self._ids[at : at + len(raw)] = raw
            idlen = len(raw)
        else:
            idlen = -1
        deadline = int(time.time() * 1000) + timeout_ms if timeout_ms else 0
        _FIELDS.pack_into(
            self._bytes, (b + _DEADLINE) * 8, deadline, timeout_ms or 0, token, attempts, idlen
        )
        w[b + _GEN] += 1  # even: complete

    def end(self, child: int, thread: int) -> None:
        """The handler returned: the entry is cleared (token 0)."""
        b, w = self._base(child, thread), self._w
        w[b + _GEN] += 1
        w[b + _TOKEN] = 0
        w[b + _DEADLINE] = 0
        w[b + _GEN] += 1

    def clear(self, child: int) -> None:
        """Every entry of ``child`` cleared (its replacement starts with none)."""
        for t in range(self.threads):
            self.end(child, t)

    def read(self, child: int) -> list[Entry]:
        """The running jobs of ``child`` (entries read consistently; one being written is skipped
        this pass)."""
        out = []
        w = self._w
        for t in range(self.threads):
            b = self._base(child, t)
            gen = w[b + _GEN]
            if gen & 1:
                continue
            token, attempts = w[b + _TOKEN], w[b + _ATTEMPTS]
            deadline, timeout, idlen = w[b + _DEADLINE], w[b + _TIMEOUT], w[b + _IDLEN]
            jid = None
            if 0 <= idlen <= ID_CAP:
                at = (child * self.threads + t) * ID_CAP
                jid = bytes(self._ids[at : at + idlen]).decode("utf-8", "replace")
            if w[b + _GEN] != gen or token == 0:
                continue
            out.append(Entry(jid, token, attempts, deadline, timeout))
        return out
