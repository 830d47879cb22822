"""SIGKILL torture (tests/torture.py): producers, consumers and workers killed at random.

Invariant: every enqueue that returned is processed, nothing is lost or invented, a job is
handled again only after a process that handled it was killed, and verify is clean at the end.
The short run is part of CI; the long one is manual:

    RINGQ_TORTURE_SECONDS=600 python -m pytest -m slow tests/test_processes_torture.py
    python tests/torture.py --seconds 600 --seed 7       # the same, without pytest
"""

from __future__ import annotations

import os

import pytest
import torture


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_torture_short(tmp_path, seed):
    res = torture.run(float(os.environ.get("RINGQ_TORTURE_SHORT", "4")), seed, str(tmp_path))
    assert res.problems == []
    assert res.kills >= 5 and len(res.returned) > 50


@pytest.mark.slow
def test_sigkill_torture_long(tmp_path):
    seconds = float(os.environ.get("RINGQ_TORTURE_SECONDS", "600"))
    seed = int(os.environ.get("RINGQ_TORTURE_SEED", "7"))
    res = torture.run(seconds, seed, str(tmp_path), producers=3, consumers=3, workers=2)
    assert res.problems == []
