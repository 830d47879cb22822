"""QueueBackend.preload(): what leasing needs is imported ahead (a Worker's parent does it before
forking its children), and nothing is built."""

from __future__ import annotations

import subprocess
import sys

from ringq.redis.queue import RedisQueue

CHECK = """
import sys
from ringq.local.queue import Queue
q = Queue(sys.argv[1])
q.enqueue(b"x")
assert "numpy" not in sys.modules, "enqueue alone loads no reader"
q.preload()
assert "numpy" in sys.modules and "ringq.engine.index" in sys.modules
assert "ringq.local.schedule" in sys.modules
assert q.stats().ready == 1
print("ok")
"""


def test_local_preload_imports_the_reader_without_building_one(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "q")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_redis_preload_is_harmless(redis_url: str) -> None:
    with RedisQueue(redis_url, "preload") as q:
        q.preload()
        q.enqueue(b"x")
        assert q.lease_one() is not None
