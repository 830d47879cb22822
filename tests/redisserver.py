"""Real redis-server processes for the tests: started on free loopback ports in temp dirs.

No configuration file is read (every setting is on the command line): ``--bind 127.0.0.1``,
protected mode, no RDB snapshots, and no AOF unless a test asks for it.  When the binary is
missing the tests skip with one line, except under CI (env ``CI`` set), where they fail: CI must
never pass by skipping them.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import time

import pytest


def require_redis() -> None:
    """Skip (locally) or fail (CI) unless redis-server, redis-cli and redis-py are available."""
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    try:
        import redis  # noqa: F401
    except ImportError:
        missing.append("redis-py (pip install 'ringq[redis]')")
    if missing:
        msg = f"Redis tests need {', '.join(missing)} (apt-get install redis-server redis-tools)"
        if os.environ.get("CI"):
            pytest.fail(msg + "; CI must not skip them", pytrace=False)
        pytest.skip(msg)


def free_port(cluster: bool = False) -> int:
    """A loopback port nobody listens on; for a cluster node also its bus port (port + 10000)."""
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 45000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of loopback ports for a cluster node")


class RedisServer:
    """One redis-server process; ``url`` to reach it, ``stop``/``kill``/``start`` to cycle it."""

    def __init__(self, workdir: str, *args: str, port: int | None = None) -> None:
        self.dir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.port = port or free_port(cluster="--cluster-enabled" in args)
        self.args = list(args)
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        opts = {"--appendonly": "no", "--save": ""}
        extra = dict(zip(self.args[::2], self.args[1::2]))
        opts.update(extra)
        cmd = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "yes",
            "--dir",
            self.dir,
            "--logfile",
            os.path.join(self.dir, "redis.log"),
        ]
        for k, v in opts.items():
            cmd += [k, v]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log()[-2000:]}")
            if self.cli("PING", check=False) == "PONG":
                loading = self.cli("INFO", "persistence", check=False)
                if "loading:0" in loading:
                    return self
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer: {self.log()[-2000:]}")

    def cli(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if check and r.returncode:
            raise RuntimeError(f"redis-cli {args}: {r.stderr}")
        return r.stdout.strip()

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(20)
        self.proc = None

    stop = kill


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A redis-server shared by the tests of a session; each test uses its own queue names."""
    require_redis()
    server = RedisServer(str(tmp_path_factory.mktemp("redis"))).start()
    yield server
    server.kill(signal.SIGTERM)


@pytest.fixture
def redis_url(redis_server):
    return redis_server.url


@pytest.fixture
def spawn_redis(tmp_path):
    """Start extra servers for one test: ``spawn_redis(*args)``; all are killed at teardown."""
    require_redis()
    servers: list[RedisServer] = []

    def spawn(*args: str, port: int | None = None, name: str | None = None) -> RedisServer:
        s = RedisServer(str(tmp_path / (name or f"redis{len(servers)}")), *args, port=port)
        servers.append(s)
        return s.start()

    yield spawn
    for s in servers:
        s.kill()


def start_cluster(spawn_redis, masters: int = 3) -> list[RedisServer]:
    """A Redis Cluster of ``masters`` nodes on loopback ports, every slot served: its nodes."""
    require_redis()
    nodes = [
        spawn_redis(
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        )
        for _ in range(masters)
    ]
    out = subprocess.run(
        [
            "redis-cli",
            "--cluster",
            "create",
            *[f"127.0.0.1:{n.port}" for n in nodes],
            "--cluster-yes",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode:
        raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
    deadline = time.monotonic() + 30
    while not all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in nodes):
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not reach cluster_state:ok")
        time.sleep(0.05)
    return nodes


AIO_DATABASES = 4096  # one Redis database per ringq.aio test: each sees a fresh, empty server
_aio_db = itertools.count(1)


@pytest.fixture(scope="session")
def aio_redis_server(tmp_path_factory):
    """A redis-server with many databases, for tests whose queue names are fixed (ringq.aio)."""
    require_redis()
    server = RedisServer(
        str(tmp_path_factory.mktemp("redis-aio")), "--databases", str(AIO_DATABASES)
    ).start()
    yield server
    server.kill(signal.SIGTERM)


@pytest.fixture(params=["local", "redis"])
def target(request, tmp_path):
    """Where a ringq.aio test keeps its queue: a fresh directory, or a fresh Redis database."""
    if request.param == "local":
        return str(tmp_path / "q")
    server = request.getfixturevalue("aio_redis_server")
    return f"redis://127.0.0.1:{server.port}/{next(_aio_db) % AIO_DATABASES}"
