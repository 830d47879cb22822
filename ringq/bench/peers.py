"""Peer queues for ringq.bench, driven through their own public APIs with the same workload.

Each peer says why it is missing (``missing()``), or yields configurations: a label, whether an
enqueue that returned survives power loss, and how to open one fresh queue.  A queue adapter
offers ``enqueue``, ``enqueue_many`` (None when the peer has no batch API) and ``lease_ack``.
Every import is optional; nothing here is a dependency of ringq.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any


class Adapter:
    enqueue_many: Callable[[list[dict[str, Any]]], Any] | None = None

    def enqueue(self, p: dict[str, Any]) -> None:
        raise NotImplementedError

    def lease_ack(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


# A configuration of a peer: its label, whether an enqueue that returned survives power loss,
# and how to open one fresh queue in a directory.
Config = tuple[str, bool, Callable[[str], Adapter]]


# -- nobroker --------------------------------------------------------------------------------------


class _Nobroker(Adapter):
    def __init__(self, path: str, fsync: bool) -> None:
        self.q = importlib.import_module("nobroker").Queue(path, fsync=fsync)
        self.enqueue_many = self.q.enqueue_many

    def enqueue(self, p: dict[str, Any]) -> None:
        self.q.enqueue(p)

    def lease_ack(self) -> None:
        self.q.ack(self.q.lease_one())

    def close(self) -> None:
        self.q.close()


# -- persist-queue -----------------------------------------------------------------------------------


class _PersistQueue(Adapter):
    def __init__(self, path: str) -> None:
        pq = importlib.import_module("persistqueue")
        self.q = pq.SQLiteAckQueue(path, auto_commit=True)

    def enqueue(self, p: dict[str, Any]) -> None:
        self.q.put(p)

    def lease_ack(self) -> None:
        item = self.q.get(block=False)
        self.q.ack(item)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.q._getter.close()  # no public close in 1.x


# -- litequeue ---------------------------------------------------------------------------------------


class _LiteQueue(Adapter):
    def __init__(self, path: str) -> None:
        self.q = importlib.import_module("litequeue").LiteQueue(os.path.join(path, "q.sqlite3"))

    def enqueue(self, p: dict[str, Any]) -> None:
        self.q.put(json.dumps(p))

    def lease_ack(self) -> None:
        m = self.q.pop()
        self.q.done(m.message_id)

    def close(self) -> None:
        self.q.close()


# -- a plain SQLite WAL queue (standard library) ---------------------------------------------------------


class _SqliteWal(Adapter):
    """The queue one writes by hand: a WAL table, lease by ``UPDATE ... RETURNING``, ack by UPDATE."""

    def __init__(self, path: str, synchronous: str) -> None:
        self.db = sqlite3.connect(os.path.join(path, "q.sqlite3"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, payload TEXT NOT NULL, "
            "state INTEGER NOT NULL DEFAULT 0, lease_until REAL)"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS jobs_ready ON jobs(state, id)")

    def enqueue(self, p: dict[str, Any]) -> None:
        self.db.execute("INSERT INTO jobs(payload) VALUES (?)", (json.dumps(p),))

    def enqueue_many(self, ps: list[dict[str, Any]]) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany("INSERT INTO jobs(payload) VALUES (?)", [(json.dumps(p),) for p in ps])
        self.db.execute("COMMIT")

    def lease_ack(self) -> None:
        row = self.db.execute(
            "UPDATE jobs SET state=1, lease_until=? WHERE id=(SELECT id FROM jobs WHERE state=0 ORDER BY id LIMIT 1) "
            "RETURNING id, payload",
            (time.time() + 30,),
        ).fetchone()
        json.loads(row[1])
        self.db.execute("UPDATE jobs SET state=2 WHERE id=? AND state=1", (row[0],))

    def close(self) -> None:
        self.db.close()


# -- Redis (a real redis-server on loopback) ------------------------------------------------------------------


class _RedisServer:
    def __init__(self, scratch: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="redis-", dir=scratch)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                os.path.join(self.dir, "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        redis = importlib.import_module("redis")
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        end = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except Exception:
                if time.monotonic() > end or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Redis(Adapter):
    def __init__(self, server: _RedisServer, appendfsync: str, key: str) -> None:
        self.r = server.client
        self.r.config_set("appendfsync", appendfsync)
        self.key, self.pkey = key, key + ":processing"

    def enqueue(self, p: dict[str, Any]) -> None:
        self.r.rpush(self.key, json.dumps(p))

    def enqueue_many(self, ps: list[dict[str, Any]]) -> None:
        self.r.rpush(self.key, *[json.dumps(p) for p in ps])

    def lease_ack(self) -> None:
        v = self.r.lmove(self.key, self.pkey, "LEFT", "RIGHT")  # the reliable-queue pattern
        json.loads(v)
        self.r.lrem(self.pkey, 1, v)

    def close(self) -> None:
        self.r.delete(self.key, self.pkey)


class _RingqOnRedis(Adapter):
    """ringq's own Redis backend (ringq.connect) on the same server as the bare-Redis rows."""

    def __init__(self, server: _RedisServer, appendfsync: str, name: str) -> None:
        from ringq.connect import connect

        server.client.config_set("appendfsync", appendfsync)
        self.q = connect(f"redis://127.0.0.1:{server.port}/0", name)
        self.enqueue_many = self.q.enqueue_many

    def enqueue(self, p: dict[str, Any]) -> None:
        self.q.enqueue(p)

    def lease_ack(self) -> None:
        job = self.q.lease_one()
        if job is None:  # the harness enqueues every job it leases first
            raise RuntimeError(f"ringq-on-redis queue {self.q.name!r} has no job to lease")
        self.q.ack(job)

    def close(self) -> None:
        self.q.purge()
        self.q.close()


# -- the peers -------------------------------------------------------------------------------------------------


def _need(module: str, pip: str) -> str | None:
    try:
        importlib.import_module(module)
        return None
    except ImportError:
        return f"{module} is not installed (pip install {pip})"


class Peer:
    name = ""

    def missing(self) -> str | None:
        return None

    @contextlib.contextmanager
    def configs(self, scratch: str) -> Iterator[list[Config]]:
        yield []


class NobrokerPeer(Peer):
    name = "nobroker"

    def missing(self) -> str | None:
        return _need("nobroker", "nobroker==0.1.2")

    @contextlib.contextmanager
    def configs(self, scratch: str) -> Iterator[list[Config]]:
        yield [
            ("nobroker fsync=True", True, lambda p: _Nobroker(p, True)),
            ("nobroker fsync=False", False, lambda p: _Nobroker(p, False)),
        ]


class PersistQueuePeer(Peer):
    name = "persist-queue"

    def missing(self) -> str | None:
        return _need("persistqueue", "persist-queue")

    @contextlib.contextmanager
    def configs(self, scratch: str) -> Iterator[list[Config]]:
        # SQLite's compiled-in default synchronous=FULL, WAL, one commit per put: durable.
        yield [("persist-queue SQLiteAckQueue", True, _PersistQueue)]


class LiteQueuePeer(Peer):
    name = "litequeue"

    def missing(self) -> str | None:
        return _need("litequeue", "litequeue")

    @contextlib.contextmanager
    def configs(self, scratch: str) -> Iterator[list[Config]]:
        # litequeue sets WAL + synchronous=NORMAL: a power loss may roll back the last commits.
        yield [("litequeue (WAL, synchronous=NORMAL)", False, _LiteQueue)]


class SqlitePeer(Peer):
    name = "sqlite3 WAL"

    @contextlib.contextmanager
    def configs(self, scratch: str) -> Iterator[list[Config]]:
        yield [
            ("sqlite3 WAL synchronous=FULL", True, lambda p: _SqliteWal(p, "FULL")),
            ("sqlite3 WAL synchronous=NORMAL", False, lambda p: _SqliteWal(p, "NORMAL")),
        ]


class RedisPeer(Peer):
    name = "redis"

    def missing(self) -> str | None:
        why = _need("redis", "redis")
        if why:
            return why
        if not shutil.which("redis-server"):
            return "redis-server is not installed (apt-get install -y redis-server)"
        return None

    @contextlib.contextmanager
    def configs(self, scratch: str) -> Iterator[list[Config]]:
        # One server per setting: appendfsync is server-wide and the contestants run interleaved.
        always = _RedisServer(scratch)
        try:
            everysec = _RedisServer(scratch)
        except BaseException:
            always.stop()
            raise
        try:
            n = iter(range(1 << 30))
            yield [
                (
                    "redis appendfsync=always",
                    True,
                    lambda p: _Redis(always, "always", f"q{next(n)}"),
                ),
                (
                    "redis appendfsync=everysec",
                    False,
                    lambda p: _Redis(everysec, "everysec", f"q{next(n)}"),
                ),
                (
                    "ringq-on-redis appendfsync=always",
                    True,
                    lambda p: _RingqOnRedis(always, "always", f"r{next(n)}"),
                ),
                (
                    "ringq-on-redis appendfsync=everysec",
                    False,
                    lambda p: _RingqOnRedis(everysec, "everysec", f"r{next(n)}"),
                ),
            ]
        finally:
            everysec.stop()
            always.stop()


PEERS = [NobrokerPeer(), PersistQueuePeer(), LiteQueuePeer(), SqlitePeer(), RedisPeer()]
