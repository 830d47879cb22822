"""Durable acks through the ack journal (sync_acks=True): one small write and one fdatasync per
ack, one for a whole ack_many, and recovery applies journaled outcomes whose state words were lost.

A power loss is played with directory images (tests/crashkit.py): the segment as it was before the
acks (its state page never reached the disk) next to the journal as it was after them.
"""

from __future__ import annotations

import os

from crashkit import NAME, drain, open_queue, restore, snapshot

from ringq import JobState
from ringq.engine.ackjournal import ENTRY, encode


def _seg_name(img):
    return next(n for n in img if n.endswith(".state"))


def test_ack_many_of_a_hundred_is_one_sync(tmp_path):
    with open_queue(str(tmp_path), sync_acks=True, slot_count=256) as q:
        q.enqueue_many(list(range(100)))
        jobs = q.lease(100)
        before = q.sync_counters()["state_syncs"]
        q.ack_many(jobs)
        assert q.sync_counters()["state_syncs"] == before + 1
        assert q.stats().done == 100
        for _job in q.enqueue_many([1, 2]):
            q.ack(q.lease_one())
        assert q.sync_counters()["state_syncs"] == before + 3  # one per ack


def test_journaled_outcomes_survive_the_loss_of_the_state_page(tmp_path):
    src = str(tmp_path / "src")
    with open_queue(src, sync_acks=True, max_attempts=1) as q:
        q.enqueue_many(["a", "b", "c"])
        q.enqueue("d", max_attempts=3)
        a, b, c, d = q.lease(4)
        leased = snapshot(src)  # the state page as the disk last had it: four leases
        q.ack_many([a, b])
        q.nack(c, error="boom")  # attempts used up: dead-lettered
        after = snapshot(src)
    image = dict(after)
    seg = _seg_name(image)
    image[seg] = leased[seg]  # the acks' state words never reached the disk; the journal did
    assert any(n.endswith(".acks") for n in image)
    path = restore(image, str(tmp_path / "lost"))
    with open_queue(path) as q:
        assert sum(n for _p, n in q.recovery.replayed) == 3
        assert q.recovery.clean  # replaying is recovery doing its job, not damage
        assert q.get(a.id).state is JobState.DONE and q.get(b.id).state is JobState.DONE
        assert q.get(c.id).state is JobState.DEAD
        # d's lease died with its holder: it comes back; a, b, c never do.
        assert drain(q) == ["d"]


def test_a_hole_and_a_torn_entry_do_not_hide_later_entries(tmp_path):
    src = str(tmp_path / "src")
    with open_queue(src, sync_acks=True) as q:
        q.enqueue_many(["a", "b"])
        a, b = q.lease(2)
        leased = snapshot(src)
        q.ack(a)
        q.ack(b)
        after = snapshot(src)
    image = dict(after)
    seg = _seg_name(image)
    image[seg] = leased[seg]
    jname = next(n for n in image if n.endswith(".acks"))
    journal = bytearray(image[jname])
    entries = [bytes(journal[i : i + ENTRY.size]) for i in range(0, 2 * ENTRY.size, ENTRY.size)]
    # A writer killed between reserving its place and writing (zeros), and a torn write (half an
    # entry), both before the two real entries.
    torn = bytearray(encode(1, 0, 3))
    torn[12:] = bytes(len(torn) - 12)
    journal[: 4 * ENTRY.size] = bytes(ENTRY.size) + bytes(torn) + entries[0] + entries[1]
    image[jname] = bytes(journal)
    path = restore(image, str(tmp_path / "lost"))
    with open_queue(path) as q:
        assert sum(n for _p, n in q.recovery.replayed) == 2
        assert drain(q) == []
        # New acks go after every valid entry, never over one.
        q.enqueue("e")
        q.ack(q.lease_one())
    with open_queue(path) as q:
        assert q.stats().done >= 1 and drain(q) == []


def test_an_outcome_older_than_the_state_word_is_not_applied(tmp_path):
    src = str(tmp_path / "src")
    with open_queue(src, sync_acks=True, visibility_timeout=600) as q:
        q.enqueue("a")
        first = q.lease_one()
        q.nack(first, delay=0)  # journaled: READY again after lease 1
        second = q.lease_one()  # lease 2 (not journaled: leases never are)
        q.ack(second)
        final = snapshot(src)
    path = restore(final, str(tmp_path / "again"))
    with open_queue(path) as q:
        assert q.get(second.id).state is JobState.DONE  # the nack of lease 1 does not undo the ack


def test_a_journal_left_by_a_retired_segment_is_removed(tmp_path):
    path = str(tmp_path)
    with open_queue(path) as q:
        q.enqueue("x")
    stray = os.path.join(path, f"{NAME}.{7:016x}.acks")
    with open(stray, "wb") as fh:
        fh.write(encode(7, 0, 3))
    with open_queue(path) as q:
        assert drain(q) == ["x"]
    assert not os.path.exists(stray)
