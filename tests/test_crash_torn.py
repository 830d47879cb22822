"""Crash points, enumerated: every byte of a record, every step of an append, a rotation and a retirement.

Invariant: an image left by a crash at any point, reopened, delivers every record published
before the crash exactly once and in order, never a torn or unpublished record, reports damage
only where the bytes really are damaged, and accepts new work.

Two kinds of image.  *Recorded* images (``Recorder``) are the directory after each file-changing
step of a real operation: what a SIGKILL there leaves.  *Edited* images mix the bytes of a real
segment before and after a write, as a power loss that kept some sectors and not others does; the
expected outcome of each mix is computed from which parts it kept.
"""

from __future__ import annotations

import struct

import pytest
from crashkit import (
    NAME,
    SLOT,
    Recorder,
    drain,
    geometry,
    open_queue,
    payload_key,
    reopen_and_drain,
    restore,
    seg_file,
    snapshot,
    state_file,
)

from ringq.engine.control import OFF_NEXT_SEQ, OFF_TAIL_SEG
from ringq.engine.segment import OFF_LAST_SEQ, OFF_NRECORDS, OFF_TAIL

BIG = "x" * 150  # a JSON payload whose record spans two 128-byte slots


def _record_images(tmp_path):
    """Real segment bytes before and after appending a two-slot record at slot 2."""
    live = str(tmp_path / "live")
    with open_queue(live) as q:
        q.enqueue(0)
        q.enqueue(1)
        before = snapshot(live)
        q.enqueue(BIG)
        after = snapshot(live)
    return before, after


def _mix(before, after, *, data, state, header):
    """An image of segment 1 holding: record bytes ``data`` (indexes copied from ``after``) in
    the record file, the record's state words per ``state`` ("none", "cont", "all") and the state
    file's header page if ``header``.  The control file is always the later one (seqs are reserved
    before any record byte is written).
    """
    state_off, data_off, _ = geometry()
    seg = bytearray(before[seg_file(1)])
    new = after[seg_file(1)]
    st = bytearray(before[state_file(1)])
    new_st = after[state_file(1)]
    rec_off = data_off + 2 * SLOT
    for i in data:
        seg[rec_off + i] = new[rec_off + i]
    if state in ("cont", "all"):
        st[state_off + 3 * 16 : state_off + 4 * 16] = new_st[
            state_off + 3 * 16 : state_off + 4 * 16
        ]
    if state == "all":
        st[state_off + 2 * 16 : state_off + 3 * 16] = new_st[
            state_off + 2 * 16 : state_off + 3 * 16
        ]
    if header:
        st[:4096] = new_st[:4096]
    image = dict(after)
    image[seg_file(1)] = bytes(seg)
    image[state_file(1)] = bytes(st)
    return image


def _rec_len(after):
    _, data_off, _ = geometry()
    return struct.unpack_from("<I", after[seg_file(1)], data_off + 2 * SLOT + 8)[0]


def _check_mix(tmp_path, image, complete, state, header):
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    # Format 2: the record file is the commit point.  A complete record is delivered whatever its
    # state word and the tail say (a power loss may keep the record file and lose the state file);
    # an incomplete one never is.
    expected = [0, 1, BIG] if complete else [0, 1]
    assert out.delivered == expected
    assert out.after == ["probe"]
    damaged = header and not complete  # the tail covers a record that fails its CRC
    if damaged:
        slots = [slot for _p, slot, _r in out.corrupt]
        assert 2 in slots, out.corrupt
        assert out.stats_corrupt >= 1
    else:
        assert out.corrupt == [] and out.stats_corrupt == 0, out.corrupt


@pytest.mark.parametrize("header", [False, True], ids=["tail-stale", "tail-advanced"])
@pytest.mark.parametrize(
    "state", ["none", "cont", "all"], ids=["unpublished", "cont-only", "published"]
)
def test_torn_prefix_at_every_byte(tmp_path, state, header):
    """Bytes 0..k of the record reached the file, for every k (memcpy order, or sectors in order)."""
    before, after = _record_images(tmp_path)
    n = _rec_len(after)
    assert n > SLOT  # the record really spans two slots
    for k in range(n + 1):
        image = _mix(before, after, data=range(k), state=state, header=header)
        _check_mix(tmp_path, image, k == n, state, header)


@pytest.mark.parametrize("header", [False, True], ids=["tail-stale", "tail-advanced"])
def test_published_with_one_byte_missing(tmp_path, header):
    """The state word (and maybe the tail) reached the disk but byte k of the record did not."""
    before, after = _record_images(tmp_path)
    n = _rec_len(after)
    for k in range(n):
        if (
            before[seg_file(1)][geometry()[1] + 2 * SLOT + k]
            == after[seg_file(1)][geometry()[1] + 2 * SLOT + k]
        ):
            continue  # this byte is the same before and after: losing it changes nothing
        image = _mix(
            before, after, data=[i for i in range(n) if i != k], state="all", header=header
        )
        _check_mix(tmp_path, image, False, "all", header)


# -- recorded operations: every step of append, rotation and retirement ---------------------------------


def _replay(tmp_path, rec, base):
    """Reopen every recorded step; check it against the records published by then."""
    assert len(rec.steps) > 3
    for i, step in enumerate(rec.steps):
        out = reopen_and_drain(restore(step.image, str(tmp_path / "img")))
        expected = sorted(set(base) | set(step.published))
        assert out.delivered == expected, f"step {i}: {step.what}"
        assert out.after == ["probe"], f"step {i}: {step.what}"
        assert out.corrupt == [] and out.quarantined == [] and out.stats_corrupt == 0, (
            f"step {i}: {step.what}"
        )
    return rec.steps


@pytest.mark.parametrize(
    "nbase,nbatch", [(8, 1), (6, 3), (6, 14)], ids=["single", "fill-and-rotate", "two-rotations"]
)
def test_every_step_of_append_and_rotation(tmp_path, nbase, nbatch):
    live = str(tmp_path / "live")
    base = list(range(nbase))
    with open_queue(live) as q:
        for i in base:
            q.enqueue(i)
        rec = Recorder(live, payload_key)
        with rec.recording():
            q.enqueue_many(list(range(nbase, nbase + nbatch)))
    steps = _replay(tmp_path, rec, base)
    whats = " | ".join(s.what for s in steps)
    # The recording really went through every step of a rotation.
    for part in (
        "create q.0000000000000002.state.tmp",
        "rename q.0000000000000002.state.tmp",
        "create q.0000000000000002.seg.tmp",
        "fallocate",
        "rename q.0000000000000002.seg.tmp",
        f"store32 {NAME}.0000000000000001.seg @132",
        f"store64 {NAME}.ctl @{OFF_TAIL_SEG}",
    ):
        assert part in whats


def test_retirement_steps_never_resurrect_or_lose(tmp_path):
    """Each retirement step, reopened: job 7 is done iff its ack CAS happened; segment 1 goes away."""
    live = str(tmp_path / "live")
    with open_queue(live) as q:
        q.enqueue_many(list(range(10)))
        jobs = q.lease(8)
        for j in jobs[:-1]:
            q.ack(j)
        rec = Recorder(live, payload_key)
        with rec.recording():
            q.ack(jobs[-1])
    acked_at = next(
        i
        for i, s in enumerate(rec.steps)
        if s.what.startswith("cas64") and "0000000000000001" in s.what
    )
    for i, step in enumerate(rec.steps):
        out = reopen_and_drain(restore(step.image, str(tmp_path / "img")))
        expected = [8, 9] if i >= acked_at else [7, 8, 9]
        assert sorted(out.delivered) == expected, f"step {i}: {step.what}"
        assert out.corrupt == [] and out.quarantined == []
        assert "unlink q.0000000000000001.seg" in " | ".join(s.what for s in rec.steps)
        assert seg_file(1) not in out.files, f"step {i}: {step.what}: finished segment not retired"
        assert state_file(1) not in out.files, (
            f"step {i}: {step.what}: state file outlived its segment"
        )


def test_every_lease_step_reopens_with_each_job_delivered_once(tmp_path):
    """A single lease and a run of leases, each one step of the recorder (one C call each): every
    image reopens with each job delivered once -- a lease whose holder is gone comes back."""
    live = str(tmp_path / "live")
    with open_queue(live) as q:
        q.enqueue_many(list(range(5)))
        rec = Recorder(live, payload_key)
        with rec.recording():
            one = q.lease_one()
            two = q.lease(2)
        assert (one.payload, [j.payload for j in two]) == (0, [1, 2])
    leases = [s.what for s in rec.steps if s.what.endswith("(ringq_take_run)")]
    assert [w.split("slots ")[1] for w in leases] == ["0 (ringq_take_run)", "1, 2 (ringq_take_run)"]
    for i, step in enumerate(rec.steps):
        out = reopen_and_drain(restore(step.image, str(tmp_path / "img")))
        assert sorted(out.delivered) == list(range(5)), f"step {i}: {step.what}"
        assert out.corrupt == [] and out.quarantined == []


# -- power-loss images: header and pages disagree --------------------------------------------------------


def _two_segment_power_loss(tmp_path):
    """Segment 1 full of returned enqueues whose header tail never reached the disk, then a crash
    right after segment 2 was created and linked by name (but before segment 1's header was synced)."""
    live = str(tmp_path / "live")
    with open_queue(live) as q:
        q.enqueue_many([0, 1])
        early = snapshot(live)  # header page as last written back: tail 2
        for i in range(2, 8):
            q.enqueue(i)  # each returned: state words and record bytes msynced, header not
        rec = Recorder(live, payload_key)
        with rec.recording():
            q.enqueue(8)
    created = next(s for s in rec.steps if s.what.startswith("rename q.0000000000000002.seg.tmp"))
    image = dict(created.image)
    st1 = bytearray(image[state_file(1)])
    st1[:4096] = early[state_file(1)][:4096]  # stale header: tail 2, nrecords 2
    image[state_file(1)] = bytes(st1)
    image[f"{NAME}.ctl"] = early[f"{NAME}.ctl"]  # stale control page: next seq 3, tail segment 1
    return image


def test_power_loss_stale_tail_then_new_segment_loses_nothing(tmp_path):
    """Invariant 1: records whose enqueue returned survive even when the tail that covers them was
    lost and a newer segment exists (recovery used to repair only the newest segment's tail)."""
    image = _two_segment_power_loss(tmp_path)
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    assert out.delivered == list(range(8))
    assert out.corrupt == []


def test_power_loss_stale_next_seq_never_reuses_a_seq(tmp_path):
    """After the repair above, a new job must not get the seq (the auto id) of a recovered one."""
    image = _two_segment_power_loss(tmp_path)
    path = restore(image, str(tmp_path / "img"))
    with open_queue(path) as q:
        new = q.enqueue("new")
        ids = [j.id for j in q.lease(64)]
        assert len(ids) == len(set(ids)) == 9
        assert new.seq > 8


def _two_batches(tmp_path):
    """Segment images after enqueue_many([0, 1]) and after a second enqueue_many([2, 3])."""
    live = str(tmp_path / "live")
    with open_queue(live) as q:
        q.enqueue_many([0, 1])
        before = snapshot(live)
        q.enqueue_many([2, 3])
        return before, snapshot(live)


def test_power_loss_tail_advanced_over_zero_pages(tmp_path):
    """The header page (tail) reached the disk, the state and data pages of the last records did not."""
    before, after = _two_batches(tmp_path)
    image = dict(after)
    st = bytearray(before[state_file(1)])
    st[:4096] = after[state_file(1)][:4096]
    image[state_file(1)] = bytes(st)
    image[seg_file(1)] = before[seg_file(1)]
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    assert out.delivered == [0, 1]
    assert sorted(slot for _p, slot, _r in out.corrupt) == [2, 3]
    assert out.stats_corrupt == 2
    assert out.after == ["probe"]


def test_power_loss_state_present_data_zero(tmp_path):
    """State words reached the disk, record pages did not, tail stale: an unfinished append, silently reused."""
    before, after = _two_batches(tmp_path)
    state_off, _, _ = geometry()
    st = bytearray(before[state_file(1)])
    st[state_off : state_off + 4096] = after[state_file(1)][state_off : state_off + 4096]
    image = dict(after)
    image[state_file(1)] = bytes(st)
    image[seg_file(1)] = before[seg_file(1)]
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    assert out.delivered == [0, 1]
    assert out.corrupt == [] and out.stats_corrupt == 0
    assert out.after == ["probe"]


def test_power_loss_data_present_state_stale(tmp_path):
    """Record pages and tail reached the disk, the state page did not: the tail vouches, republished."""
    before, after = _two_batches(tmp_path)
    state_off, _, state_size = geometry()
    st = bytearray(after[state_file(1)])
    st[state_off:state_size] = before[state_file(1)][state_off:state_size]
    image = dict(after)
    image[state_file(1)] = bytes(st)
    out = reopen_and_drain(restore(image, str(tmp_path / "img")))
    assert out.delivered == [0, 1, 2, 3]
    assert out.corrupt == []


def test_power_loss_ctl_older_than_segments(tmp_path):
    """The control page is the oldest one on disk (fresh queue, never synced since): nothing lost, no seq reused."""
    live = str(tmp_path / "live")
    with open_queue(live) as q:
        first = snapshot(live)
        q.enqueue_many(list(range(12)))  # rotates once
    image = snapshot(live)
    image[f"{NAME}.ctl"] = first[f"{NAME}.ctl"]
    path = restore(image, str(tmp_path / "img"))
    with open_queue(path) as q:
        new = q.enqueue("new")
        got = drain(q)
    assert got == list(range(12)) + ["new"]
    assert new.seq == 13
    assert struct.unpack_from("<Q", snapshot(path)[f"{NAME}.ctl"], OFF_NEXT_SEQ)[0] >= 14


def test_offsets_used_by_the_images():
    # The edited images above rely on these header words living in the first page.
    assert max(OFF_TAIL, OFF_NRECORDS, OFF_LAST_SEQ) < 4096


def test_every_step_of_requeue_dead(tmp_path):
    """requeue_dead appends a record that supersedes the dead one, then marks the dead one GONE.
    At every step the job is either still dead (nothing published yet) or delivered exactly once."""
    live = str(tmp_path / "live")
    with open_queue(live, max_attempts=1) as q:
        q.enqueue_many([0, 1, 2])
        q.nack(q.lease_one())  # job 0: dead
        rec = Recorder(live, payload_key)
        with rec.recording():
            assert q.requeue_dead() == 1
    assert len(rec.steps) > 3
    for i, step in enumerate(rec.steps):
        path = restore(step.image, str(tmp_path / "img"))
        with open_queue(path) as q:
            delivered = drain(q)
            dead = [j.payload for j in q.dlq()]
            assert q.recovery.clean
        if step.published:
            assert sorted(delivered) == [0, 1, 2] and dead == [], f"step {i}: {step.what}"
        else:
            assert delivered == [1, 2] and dead == [0], f"step {i}: {step.what}"


@pytest.mark.parametrize("durability", ["none", "fdatasync", "group", "interval"])
def test_every_step_of_rotation_under_each_durability_strategy(tmp_path, durability):
    """A SIGKILL leaves the page cache as it was: every strategy recovers the same records."""
    live = str(tmp_path / "live")
    with open_queue(live, durability=durability) as q:
        for i in range(6):
            q.enqueue(i)
        rec = Recorder(live, payload_key)
        with rec.recording():
            q.enqueue_many(list(range(6, 20)))
    _replay(tmp_path, rec, list(range(6)))
