"""Every crash state the recorded system calls allow (tests/crashstates.py, tests/crashmodel.py).

The short run checks a few thousand states of every workload in CI (seeded by the run's seed,
printed in pytest's header); ``RINGQ_CRASH_STATES=full`` makes it the full run (64 states per
crash point), as does ``python tests/crashstates.py --full``.  Below it: the recorder and the model
on small known cases, and one regression test per violation the enumeration found, each holding
the exact state that showed it (tests/crash_states/*.json) or replaying the recorded trace.
"""

from __future__ import annotations

import json
import os
import random

import crashmodel
import crashrec as cr
import crashstates as cs
import pytest
from conftest import SEED

STATES = os.path.join(os.path.dirname(__file__), "crash_states")


def spec(name: str):
    return next(s for s in cs.wl.SPECS if s.name == name)


def test_every_crash_state_of_every_workload(capsys) -> None:
    full = os.environ.get("RINGQ_CRASH_STATES") == "full"
    limit = cs.FULL_LIMIT if full else cs.CI_LIMIT
    report = cs.run(SEED, limit, log=lambda _msg: None)
    with capsys.disabled():
        print(f"\n{report.summary()}")
    assert not report.violations, report.summary()
    assert len(report.per_workload) == len(cs.wl.SPECS)
    if not full:
        assert report.states >= 750


# -- the recorder and the model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def msync_trace(tmp_path_factory) -> cs.Recording:
    return cs.record(spec("enqueue-msync"), str(tmp_path_factory.mktemp("rec")))


def test_the_recorder_sees_python_and_the_c_helper(msync_trace: cs.Recording) -> None:
    ev = msync_trace.events
    names = {os.path.basename(e.path) for e in ev if e.type == cr.OPEN}
    assert {"q.ctl.tmp", "q.0000000000000001.state.tmp", "q.0000000000000001.seg.tmp"} <= names
    seg_ino = next(e.ino for e in ev if e.type == cr.OPEN and e.path.endswith(".seg.tmp"))
    # The records: written by the C helper's pwrite at slot 0, 1, 2, each msynced before its note.
    writes = [e for e in ev if e.type == cr.WRITE and e.ino == seg_ino and e.a >= 4096]
    assert [w.a for w in writes[-3:]] == [4096, 4224, 4352]
    assert all(w.data[:4] == b"QRC1" for w in writes[-3:])
    enqueued = [e for e in ev if e.type == cr.NOTE and b'"enqueued"' in e.data]
    order = [e.type for e in ev if e.type == cr.MSYNC or e in writes[-3:] or e in enqueued]
    assert order[-9:] == [cr.WRITE, cr.MSYNC, cr.NOTE] * 3
    # The state words are published by stores into the mapping: seen as pages.
    state_ino = next(e.ino for e in ev if e.type == cr.OPEN and e.path.endswith(".state.tmp"))
    assert any(e.type == cr.PAGE and e.ino == state_ino and e.a == 4096 for e in ev)
    notes = [json.loads(e.data) for e in ev if e.type == cr.NOTE]
    assert [n["op"] for n in notes] == ["attempt", "enqueued"] * 3 + ["closed"]


def _model(tmp_path) -> crashmodel.Model:
    return crashmodel.Model(str(tmp_path), 1, {})


def _ev(t: int, **kw) -> cr.Event:
    base = {"ino": 0, "a": 0, "b": 0, "c": 0, "mode": 0, "path": "", "path2": "", "data": b""}
    return cr.Event(t, **{**base, **kw})


def test_the_model_unsynced_writes_torn_sectors_and_names(tmp_path) -> None:
    m = _model(tmp_path)
    root = os.path.realpath(str(tmp_path))
    m.apply(_ev(cr.OPEN, ino=5, path=f"{root}/f", b=1, a=os.O_CREAT))
    units = m.space()
    assert [u.key[0] for u in units] == ["dir"]  # created, directory not synced: there or not
    m.apply(_ev(cr.FSYNC, ino=1))  # the directory
    m.apply(_ev(cr.WRITE, ino=5, a=0, data=b"a" * 1024))  # two sectors
    units = m.space()
    assert sorted(u.key[0] for u in units) == ["sector", "sector", "size"]
    images = {m.build(c)["f"] for c in crashmodel.states(units, 100, random.Random(0))[0]}
    # size 0 or 1024; each sector old (zeros) or new: torn writes included.
    assert images == {
        b"",
        bytes(1024),
        b"a" * 512 + bytes(512),
        bytes(512) + b"a" * 512,
        b"a" * 1024,
    }
    m.apply(_ev(cr.FSYNC, ino=5, a=1))
    assert m.space() == []
    page = crashmodel.PAGE
    m.apply(_ev(cr.PAGE, ino=5, a=0, data=b"b" * page))  # through a mapping: old, new or zeros
    m.apply(_ev(cr.MSYNC, ino=5, a=0, b=page, c=crashmodel.MS_ASYNC))  # promises nothing
    (unit,) = [u for u in m.space() if u.key[0] == "page"]
    assert unit.options == [b"a" * 1024 + bytes(page - 1024), b"b" * page, bytes(page)]
    m.apply(_ev(cr.FSYNC, ino=5, a=1))
    assert m.space() == []


def test_the_sample_of_a_large_space_is_seeded(msync_trace: cs.Recording) -> None:
    def states(seed: int) -> list[bytes]:
        counts = dict.fromkeys(("calls", "points", "exhaustive", "states", "space"), 0)
        return [
            cs._digest(s.image) for s in cs.generate(msync_trace, 4, random.Random(seed), counts)
        ]

    assert states(7) == states(7)
    assert states(7) != states(8)


# -- regressions: each holds the state (or the trace) that showed a violation -----------------------


def _check_saved(name: str, tmp_path) -> list[str]:
    with open(os.path.join(STATES, name)) as fh:
        state, facts = cs.loads_state(fh.read())
    return cs.check_state(state, facts, str(tmp_path))


def test_an_empty_pause_file_is_no_damage_to_verify(tmp_path) -> None:
    """Power lost after ``<name>.pause`` was created and before its page was written: the open
    writes it; ``ringq verify`` reported it as damage (recovery did not)."""
    assert _check_saved("pause-file-empty.json", tmp_path) == []


def test_a_copy_replaces_an_original_whose_word_is_an_older_lease(tmp_path) -> None:
    """Power lost after a dead job was relocated: the copy's record is on disk, the original's
    state page at a version from before its nack (LEASED, holder dead).  The reader skipped the
    supersede (a leased original is its holder's), the reaper then made the original DEAD, and the
    job was listed twice.  The supersede is now retried after the reaper pass."""
    assert _check_saved("copy-original-leased.json", tmp_path) == []


def test_an_ack_journal_is_named_on_disk_before_a_journaled_ack_returns(tmp_path) -> None:
    """The journal of ``sync_acks=True`` was created and fdatasynced, its directory never: at the
    crash points after the first ack returned, a state without the journal's name was allowed, and
    the acked job came back.  Replays the recorded trace: from the first journaled ack on, every
    state the model allows has the journal."""
    rec = cs.record(spec("lease-ack-nack-sync-acks"), str(tmp_path))
    model = crashmodel.Model(rec.root, rec.root_ino, rec.initial)
    acked, points = False, 0
    for ev in rec.events:
        if ev.type == cr.NOTE and json.loads(ev.data)["op"] == "acked":
            acked = True
        if not model.apply(ev) or not acked:
            continue
        points += 1
        names = [set(ns) for u in model.space() if u.key[0] == "dir" for ns in u.options]
        names = names or [set(model.root.durable)]
        assert all("q.0000000000000001.acks" in ns for ns in names), ev.describe()
    assert points > 5


def test_verify_reports_a_retired_flag_over_jobs_whose_acks_were_lost(tmp_path) -> None:
    """Power lost in a retirement: the header page with the retired flag on disk, the state
    table's page (the acks) at an older version, the unlink not.  Recovery clears the flag and
    reports it; ``ringq verify`` took it for a retirement about to finish (a note)."""
    assert _check_saved("retired-flag-acks-lost.json", tmp_path) == []


def test_a_retired_flag_over_records_whose_state_page_was_lost_keeps_them(tmp_path) -> None:
    """Power lost in a retirement: the header with the retired flag on disk, the state table's
    page from before the records were published (their words EMPTY), the unlink not.  Recovery
    took the segment for finished and unlinked it; ``ringq verify`` counted the records as
    unfinished.  Recovery now keeps them (republished, as after any lost state page) and reports
    clearing the flag."""
    assert _check_saved("retired-flag-state-page-lost.json", tmp_path) == []
