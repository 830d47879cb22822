"""What each durability strategy promises, in the words of docs/durability.md, kept in one place.

``ringq bench --here`` prints these next to what each strategy costs, and the file-system matrix
(``--fs``) labels its rows with them.  The fields of :data:`PROMISES` are the cells of the
strategies table of docs/durability.md ("an enqueue returns after", "process crash", "kernel crash
/ power loss") without Markdown; ``tests/test_bench_here.py`` checks that the two agree, so a
change of wording in one place fails until the other follows.

:data:`GOALS` are the promises a user chooses by (the "you need" column of the docs' "Choosing"
table, shortened): for each, the strategies that keep it, so that a run can name the cheapest.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Promise", "PROMISES", "GOALS", "Goal", "promise_line"]


@dataclass(frozen=True)
class Promise:
    """One strategy's promise.  ``label`` names the measured row (``system`` of a bench ``Row``)."""

    strategy: str  # the durability= value, or "sync_acks" for Queue(sync_acks=True)
    label: str  # bench row system label of the operation that measures it
    variant: str  # bench row variant measured: "enqueue x1" or "lease_one+ack"
    returns_after: str
    process_crash: str
    power_loss: str

    @property
    def line(self) -> str:
        """The one-line promise: what a call waits for, and what it survives."""
        what = "an ack" if self.strategy == "sync_acks" else "an enqueue"
        return (
            f"{what} returns after {self.returns_after}; process crash: {self.process_crash}; "
            f"kernel crash / power loss: {self.power_loss}"
        )


PROMISES: tuple[Promise, ...] = (
    Promise(
        "none",
        "ringq none",
        "enqueue x1",
        "publish",
        "survives",
        "not durable: any enqueue not yet written back by the kernel may be lost",
    ),
    Promise(
        "msync",
        "ringq msync",
        "enqueue x1",
        "msync(MS_SYNC) of the slots it wrote, through the record file's read-only mapping",
        "survives",
        "survives",
    ),
    Promise(
        "fdatasync",
        "ringq fdatasync",
        "enqueue x1",
        "fdatasync of each record file it wrote to",
        "survives",
        "survives",
    ),
    Promise(
        "group",
        "ringq group",
        "enqueue x1",
        "a completed sync that covers its record — its own or another producer's",
        "survives",
        "survives",
    ),
    Promise(
        "interval",
        "ringq interval",
        "enqueue x1",
        "publish; a flusher thread syncs every flush_interval s",
        "survives",
        "may lose the last flush_interval s (plus one sync's duration) of this process's enqueues",
    ),
    # From the sync_acks paragraph of docs/durability.md (acks have no row in the strategies table).
    Promise(
        "sync_acks",
        "ringq msync, sync_acks",
        "lease_one+ack",
        "its ack journal entry is written with pwrite and fdatasynced",
        "survives",
        "a power loss redelivers no job whose ack returned",
    ),
)


@dataclass(frozen=True)
class Goal:
    """A promise a user chooses by, and the strategies (``Promise.strategy``) that keep it."""

    name: str
    strategies: tuple[str, ...]


GOALS: tuple[Goal, ...] = (
    Goal("an enqueue that returned survives power loss", ("msync", "fdatasync", "group")),
    Goal(
        "a power loss loses at most the last flush_interval of enqueues",
        ("msync", "fdatasync", "group", "interval"),
    ),
    Goal(
        "an enqueue that returned survives a process crash",
        ("none", "msync", "fdatasync", "group", "interval"),
    ),
    Goal("an acked job is not redelivered after power loss", ("sync_acks",)),
)


def promise_line(strategy: str) -> str:
    """The one-line promise of ``strategy`` (a ``durability=`` value or ``"sync_acks"``).

    Raises:
        KeyError: ``strategy`` is not one of :data:`PROMISES`.
    """
    for p in PROMISES:
        if p.strategy == strategy:
            return p.line
    raise KeyError(strategy)
