"""purge(): every job that stats() counts is removed, whatever reads and relocations came before.

The seeded sequences mix enqueues (some delayed an hour, some already expired, priorities -1 to 1),
leases, acks and nacks over 8-slot segments, with ``stats()`` between the steps, so segments
rotate, seal, relocate their stragglers and retire all the time.  Seed 814 is the sequence that
left two relocated jobs behind a purge (a reaper pass had relocated them without the index
reading the copies in, and purge went by the index).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from ringq import BackoffPolicy, Queue

HOUR = 3600.0


def _mixed(q: Queue, seed: int, with_stats: bool) -> None:
    r = random.Random(seed)
    held = []
    for _ in range(r.randint(3, 25)):
        op = r.choice(["enq", "enq", "enq", "lease", "ack", "nack"])
        if op == "enq":
            kw = dict(priority=r.choice([-1, 0, 1]), delay=r.choice([0, 0, HOUR]))
            if r.random() < 0.15:
                kw["expires_at"] = time.time() - 1
            q.enqueue(len(held), **kw)
        elif op == "lease":
            held += q.lease(r.randint(1, 3))
        elif op == "ack" and held:
            q.ack(held.pop(r.randrange(len(held))))
        elif op == "nack" and held:
            q.nack(held.pop(r.randrange(len(held))), delay=r.choice([0, HOUR]))
        if with_stats:
            q.stats()


@pytest.mark.parametrize("with_stats", [True, False])
@pytest.mark.parametrize("seed", [814, *range(0, 120)])
def test_purge_removes_every_job_that_stats_counts(tmp_path, seed, with_stats):
    q = Queue(tmp_path, "m", visibility_timeout=HOUR, max_attempts=3, slot_size=128, slot_count=8,
              backoff=BackoffPolicy(base=HOUR, factor=1, jitter=0))
    try:
        _mixed(q, seed, with_stats)
        total, listed = q.stats().total, len(q.list_jobs())
        assert listed == total
        assert q.purge() == total
        assert (q.stats().total, q.list_jobs(), q.lease(10)) == (0, [], [])
        assert q.purge() == 0
    finally:
        q.close()



def test_purge_of_a_job_leased_while_its_consumer_waits_for_the_lock(tmp_path):
    """Threads asleep in lease(wait=...) lease the job that fills a segment in the C call that
    wakes them; a purge in another thread of the same queue object, holding the lock they need
    next, removes it and retires (unmaps) the segment.  Each round puts the job in the last slot
    (15 or 14 fillers, purged while the queue is paused), so the next enqueue seals the segment.
    Those threads must find the job gone, not read the unmapped segment; purge leaves nothing."""
    q = Queue(str(tmp_path), slot_size=128, slot_count=16, visibility_timeout=30)
    producer = Queue(str(tmp_path), slot_size=128, slot_count=16, visibility_timeout=30)
    errors: list[BaseException] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            try:
                q.lease(1, wait=0.2)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(40):
            q.pause()
            producer.enqueue_many([{"filler": k} for k in range(15 if i == 0 else 14)])
            q.purge()
            q.resume()
            time.sleep(0.003)  # the consumers go back to sleep in the C wait
            producer.enqueue_many([{"last": i}, {"next": i}])
            q.purge()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, repr(errors[0])
    assert q.stats().total == 0
    q.close()
    producer.close()
