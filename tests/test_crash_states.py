"""Every crash state the recorded system calls allow (tests/crashstates.py, tests/crashmodel.py).

The short run checks a few thousand states of every workload in CI (seeded by the run's seed,
printed in pytest's header); ``RINGQ_CRASH_STATES=full`` makes it the full run (4096 states per
crash point), as does ``python tests/crashstates.py --full``.  Below it: the recorder and the model
on small known cases, and one regression test per violation the enumeration found, each holding
the exact state that showed it (tests/crash_states/*.json) or replaying the recorded trace.
"""

from __future__ import annotations

import json
import os
import random
import time

import crashmodel
import crashrec as cr
import crashstates as cs
import pytest
from conftest import SEED

STATES = os.path.join(os.path.dirname(__file__), "crash_states")


def spec(name: str):
    return next(s for s in cs.wl.SPECS if s.name == name)


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
