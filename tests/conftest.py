"""Test-suite wide settings and fixtures.

Tests marked ``slow`` (the long SIGKILL torture and other manual runs) are skipped unless asked
for: ``pytest -m slow`` (or any ``-m`` expression naming ``slow``) or ``RINGQ_SLOW=1``.  CI runs
the plain ``pytest`` and so never the slow ones.

Randomised tests draw from one seed per run, printed in the header (``ringq seed: N``):
hypothesis's (as ``--hypothesis-seed`` would set it) and the history checker's
(tests/test_processes_history.py).  ``RINGQ_SEED=N pytest ...`` replays a run's choices.
Hypothesis keeps no example database (profile ``ringq``), so a failure found once is reported
with its seed and blob rather than replayed by surprise in every later run on the checkout;
``HYPOTHESIS_PROFILE=default`` brings the database back for debugging.
"""

from __future__ import annotations

import os
import random
import signal
import sys

import pytest
from hypothesis import core, settings

sys.path.insert(0, os.path.dirname(__file__))  # the shared helpers (crashkit, procs) import by name

# Hundreds of tests start a child interpreter that imports ringq (`python -m ringq ...`).  Where
# the environment says never to write bytecode, each of them compiled every module of the
# checkout again (about 0.3 s a child on this 2-core machine); the first child writes the caches
# (__pycache__, ignored by git) and the others read them.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# A shell without job control starts a background job with SIGINT ignored, and an ignored signal
# stays ignored across exec: the tests that stop a child with Ctrl-C need it delivered.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SEED = int(os.environ.get("RINGQ_SEED") or random.SystemRandom().randrange(2**32))
settings.register_profile("ringq", database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ringq"))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("hypothesis_seed", None) is None:
        core.global_force_seed = SEED


def pytest_report_header(config: pytest.Config) -> str:
    return f"ringq seed: {SEED} (replay: RINGQ_SEED={SEED} pytest ...)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("-m") or "") or os.environ.get("RINGQ_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or RINGQ_SLOW=1")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture
def qdir(tmp_path):
    """A fresh queue directory path (not yet created)."""
    return str(tmp_path / "q")


from redisserver import aio_redis_server, redis_server, redis_url, spawn_redis, target  # noqa: E402, F401  (fixtures)


@pytest.fixture(params=["local", "redis"])
def queue_factory(request, tmp_path):
    """``make(name=None, **options)`` opens the test's queue through ``ringq.connect``, on a
    local directory and on Redis (the same queue on every call, as reopening a directory would);
    ``make.backend`` says which.  Every queue it opened is closed at teardown."""
    import uuid

    from redisserver import require_redis

    import ringq

    if request.param == "local":
        where = str(tmp_path / "q")
    else:
        require_redis()
        where = request.getfixturevalue("redis_url")
    base = f"t{uuid.uuid4().hex[:12]}"
    opened = []

    def make(name=None, **options):
        q = ringq.connect(where, base if name is None else f"{base}-{name}", **options)
        opened.append(q)
        return q

    make.backend = request.param
    yield make
    for q in opened:
        q.close()
