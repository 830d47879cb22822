"""job.cancelled (ringq/worker/cancelled.py): a threading.Event whose condition is made on first
use behaves as the standard one, with threads racing its first set and wait."""

from __future__ import annotations

import threading
import time

from ringq.worker.cancelled import CancelEvent


def test_is_an_event_and_starts_unset() -> None:
    ev = CancelEvent()
    assert isinstance(ev, threading.Event)
    assert not ev.is_set()
    assert "unset" in repr(ev)
    assert ev.wait(0.01) is False


def test_set_clear_wait() -> None:
    ev = CancelEvent()
    ev.set()
    assert ev.is_set() and ev.wait() is True and ev.wait(0) is True
    assert "set" in repr(ev)
    ev.clear()
    assert not ev.is_set()
    assert ev.wait(0.01) is False


def test_set_from_another_thread_wakes_every_waiter() -> None:
    for _ in range(50):  # the first set and the first waits race to make the condition
        ev = CancelEvent()
        woke: list[bool] = []
        go = threading.Barrier(5)

        def waiter(ev: CancelEvent, go: threading.Barrier, woke: list[bool]) -> None:
            go.wait()
            woke.append(ev.wait(10))

        threads = [threading.Thread(target=waiter, args=(ev, go, woke)) for _ in range(4)]
        for t in threads:
            t.start()
        go.wait()
        ev.set()
        for t in threads:
            t.join(10)
        assert woke == [True] * 4


def test_wait_blocks_until_set() -> None:
    ev = CancelEvent()
    t = threading.Timer(0.05, ev.set)
    started = time.monotonic()
    t.start()
    assert ev.wait(10) is True
    assert time.monotonic() - started >= 0.04
    t.join()
