"""Test-suite wide settings and fixtures.

Tests marked ``slow`` (the long SIGKILL torture and other manual runs) are skipped unless asked
for: ``pytest -m slow`` (or any ``-m`` expression naming ``slow``) or ``RINGQ_SLOW=1``.  CI runs
the plain ``pytest`` and so never the slow ones.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the shared helpers (crashkit, procs) import by name


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
