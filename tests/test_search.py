"""Job search (``search()``, ``ringq list --key --error``): the pages together are exactly the jobs
``list_jobs`` shows that match every filter, in the same order, on both backends; the CLI gives
the same answer; a cursor pages through."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from procs import child_env

from ringq import BackoffPolicy, JobState, Queue
from ringq.backend import ascii_contains

ERRORS = [
    "OSError: disk full",
    "ValueError: bad header",
    "TimeoutError: upstream slow",
    "ünïcode fail",
]


def fill(q, keyed: bool, n: int = 120, seed: int = 7) -> None:
    rng = random.Random(seed)
    for i in range(n):
        kw = {"priority": rng.choice([0, 0, 1, 5])}
        if keyed and rng.random() < 0.5:
            kw["key"] = rng.choice(["tenant-1", "tenant-2", "t"])
        if rng.random() < 0.2:
            kw["timeout"] = 9  # a metadata block in front of the key
        if rng.random() < 0.1:
            kw["delay"] = 3600
        q.enqueue({"i": i}, max_attempts=rng.choice([1, 2]), **kw)
    for _ in range(60):
        job = q.lease_one()
        if job is None:
            break
        r = rng.random()
        if r < 0.3:
            q.ack(job)
        elif r < 0.8:
            q.nack(job, error=rng.choice(ERRORS) + f" #{job.id[-3:]}", delay=0)
        # else: stays leased
    for job in q.list_jobs("ready")[:5]:
        q.cancel(job)


def expected(q, state=None, key=None, priority=None, job_id=None, error=None):
    out = []
    for j in q.list_jobs("ready" if state == "delayed" else state):
        if state == "delayed" and not j.available_at > __import__("time").time():
            continue
        if key is not None and j.key != key:
            continue
        if priority is not None and j.priority != priority:
            continue
        if job_id is not None and j.id != job_id:
            continue
        if error is not None and not ascii_contains(j.last_error or "", error):
            continue
        out.append(j.id)
    return out


def all_pages(q, size, **filters):
    ids, after, totals = [], None, set()
    while True:
        page = q.search(**filters, after=after, limit=size)
        totals.add(page.total)
        ids += [j.id for j in page.jobs]
        if page.next is None:
            break
        assert len(page.jobs) == size
        after = page.next
    assert len(totals) == 1 and totals.pop() == len(ids)
    return ids


QUERIES = [
    {},
    {"state": "dead"},
    {"state": "ready"},
    {"state": "delayed"},
    {"state": "leased"},
    {"state": "cancelled"},
    {"priority": 5},
    {"error": "disk"},
    {"error": "DISK FULL"},
    {"error": "ünïcode"},
    {"error": "lease"},
    {"state": "dead", "error": "header", "priority": 0},
]


def test_search_pages_equal_list_jobs_filtered(queue_factory):
    q = queue_factory(backoff=BackoffPolicy(base=0, jitter=0))
    keyed = queue_factory.backend == "local"
    fill(q, keyed)
    queries = QUERIES + ([{"key": "tenant-1"}, {"key": "t", "state": "ready"}] if keyed else [])
    for filters in queries:
        want = expected(q, **filters)
        assert all_pages(q, 7, **filters) == want, filters
        assert [j.id for j in q.search(**filters, limit=None).jobs] == want
    some = q.list_jobs()[3]
    assert [j.id for j in q.search(job_id=some.id).jobs] == [some.id]
    assert q.search(job_id="no-such-job").total == 0
    assert (
        q.search(
            job_id=some.id, state="expired" if some.state is not JobState.DONE else "dead"
        ).total
        == 0
    )
    with pytest.raises(ValueError):
        q.search(state="sleeping")
    with pytest.raises(ValueError):
        q.search(after="not a cursor")


def test_a_key_behind_an_expiry_or_a_block_is_found(qdir):
    with Queue(qdir) as q:
        a = q.enqueue(1, key="k1")
        b = q.enqueue(2, key="k1", expires_in=600)
        c = q.enqueue(3, key="k1", timeout=5, expires_in=600)
        q.enqueue(4, key="k12")
        q.enqueue(5, key="k")
        q.enqueue(6)
        assert [j.id for j in q.search(key="k1").jobs] == [a.id, b.id, c.id]
        assert [j.payload for j in q.search(key="k").jobs] == [5]


def test_error_of_a_later_attempt_is_the_one_matched(qdir):
    with Queue(qdir, backoff=BackoffPolicy(base=0, jitter=0)) as q:
        job = q.enqueue("x", max_attempts=3)
        q.nack(q.lease_one(), error="first: alpha", delay=0)
        assert [j.id for j in q.search(error="alpha").jobs] == [job.id]
        q.nack(q.lease_one(), error="second: beta", delay=0)
        assert q.search(error="alpha").total == 0  # last_error is beta now
        assert q.search(error="beta").total == 1
        q.lease_one()  # leased again: its last error is still beta
        assert q.search(error="beta", state="leased").total == 1


def test_ringq_list_filters_give_the_same_jobs(qdir):
    with Queue(qdir, backoff=BackoffPolicy(base=0, jitter=0)) as q:
        fill(q, True, n=60)
        want = expected(q, state="dead", error="disk")
        want_key = expected(q, key="tenant-2", priority=0)

    def cli(*args):
        out = subprocess.run(
            [sys.executable, "-m", "ringq", "--dir", qdir, "--json", "list", *args],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return [j["id"] for j in json.loads(out.stdout)]

    assert cli("--state", "dead", "--error", "disk") == want
    assert cli("--key", "tenant-2", "--priority", "0") == want_key
    assert cli("--state", "dead", "--error", "disk", "--limit", "2") == want[:2]
    # nobroker's form still works
    assert len(cli("--state", "ready", "--limit", "5")) <= 5
