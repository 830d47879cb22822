"""Automatic job ids never collide: with a caller's id, nor with another queue's automatic ids."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from procs import child_env

import ringq
from ringq import JobState, Queue
from ringq.cli.migrate import migrate


def cli(*args: str, rc: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "ringq", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert proc.returncode == rc, proc.stdout + proc.stderr
    return proc


@pytest.fixture(params=["dir", "redis"])
def queue(request, tmp_path):
    if request.param == "dir":
        q = Queue(str(tmp_path / "q"))
    else:
        url = request.getfixturevalue("redis_url")
        q = ringq.connect(url, f"t{uuid.uuid4().hex[:12]}")
    yield q
    q.close()


@pytest.mark.parametrize("jid", ["0000000000000002", "00000000000000AB", "deadbeefdeadbeef"])
def test_a_caller_id_of_the_automatic_form_is_refused_on_both_backends(queue, jid):
    with pytest.raises(ValueError, match="16 hex digits are reserved for automatic ids"):
        queue.enqueue({"user": "explicit"}, job_id=jid)
    with pytest.raises(ValueError, match="16 hex digits are reserved for automatic ids"):
        queue.enqueue_many([1, 2], job_ids=["fine", jid])  # nothing of the batch is written
    assert len(queue) == 0
    queue.enqueue({"user": "auto-1"})
    queue.enqueue({"user": "auto-2"})
    ids = [j.id for j in queue.list_jobs()]
    assert len(set(ids)) == 2
    for job in queue.lease(2):
        queue.ack(job.id)
    assert queue.stats().done == 2 and queue.stats().leased == 0


def test_other_forms_and_idempotent_reenqueue_stay_allowed(queue):
    first = queue.enqueue("x", job_id="000000000000002")  # 15 digits
    again = queue.enqueue("y", job_id="000000000000002")
    assert again.id == first.id and again.payload == "x" and len(queue) == 1
    queue.enqueue("z", job_id="order-0000000000000002")
    assert len(queue) == 2


def test_the_cli_refuses_it_in_one_line(tmp_path):
    err = cli("--dir", str(tmp_path / "q"), "enqueue", "x", "--id", "0000000000000002", rc=2).stderr
    assert "16 hex digits are reserved for automatic ids" in err


def migrate_two_into_one(a_dir, b_dir, dst_target):
    a, b = Queue(a_dir), Queue(b_dir)
    a.enqueue_many(["a1", "a2"])
    b.enqueue_many(["b1", "b2"])  # the same automatic ids as a's
    b.enqueue("b-named", job_id="named")
    a.close()
    b.close()
    first = [json.loads(cli("--json", "migrate", d, dst_target).stdout) for d in (a_dir, b_dir)]
    assert [o["copied"] for o in first] == [2, 3]
    # a rerun adds nothing, and then the sources may go
    again = [
        json.loads(cli("--json", "migrate", d, dst_target, "--purge-source").stdout)
        for d in (a_dir, b_dir)
    ]
    assert [(o["copied"], o["present"], o["purged"]) for o in again] == [(0, 2, 2), (0, 3, 3)]


@pytest.mark.parametrize("backend", ["dir", "redis"])
def test_migrating_two_queues_into_one_loses_no_job_and_a_rerun_adds_nothing(
    tmp_path, backend, request
):
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
        target = url.rsplit("/", 1)[0] + "/4"  # the CLI uses the default queue name
        dst = ringq.connect(target, "default")
        dst.purge()
    else:
        target = str(tmp_path / "dst")
    a_dir, b_dir = str(tmp_path / "a"), str(tmp_path / "b")
    migrate_two_into_one(a_dir, b_dir, target)
    dst = ringq.connect(target, "default")
    payloads = sorted(j.payload for j in dst.list_jobs(JobState.READY))
    assert payloads == ["a1", "a2", "b-named", "b1", "b2"]
    ids = {j.payload: j.id for j in dst.list_jobs()}
    assert ids["b-named"] == "named"  # a caller's id is kept
    ta, tb = source_tag_of(a_dir), source_tag_of(b_dir)
    assert ids["a1"] == f"{ta}-0000000000000001" and ids["b1"] == f"{tb}-0000000000000001"
    dst.close()


def source_tag_of(qdir):
    with Queue(qdir) as q:
        return ringq.ids.source_tag(q)


def test_migrate_renames_deterministically_and_import_without_a_source_refuses(tmp_path):
    a, dst = Queue(str(tmp_path / "a")), Queue(str(tmp_path / "dst"))
    a.enqueue_many(["a1", "a2"])
    with pytest.raises(ValueError, match="16 hex digits are reserved"):
        dst.import_jobs(a.list_jobs())
    assert len(dst) == 0
    assert migrate(a, dst)["copied"] == 2
    assert migrate(a, dst) == {"copied": 0, "present": 2, "leased_skipped": 0, "purged": 0}
    tag = ringq.ids.source_tag(a)
    assert sorted(j.id for j in dst.list_jobs()) == [
        f"{tag}-0000000000000001",
        f"{tag}-0000000000000002",
    ]


def test_a_nobroker_id_of_sixteen_hex_digits_is_renamed_on_import(tmp_path):
    nobroker = pytest.importorskip("nobroker")
    from ringq.local.nobroker import import_nobroker

    src = str(tmp_path / "nb")
    nq = nobroker.Queue(src)
    nq.enqueue("mine", job_id="0000000000000001")
    auto = nq.enqueue("auto").id  # nobroker's own automatic id: 32 hex digits, kept
    nq.close()
    for _run in range(2):  # idempotent: the rename is the same each time
        import_nobroker(src, into=str(tmp_path / "q"))
    with Queue(str(tmp_path / "q")) as q:
        ids = {j.payload: j.id for j in q.list_jobs()}
        q.enqueue("ringq-auto")
        assert len(q) == 3
    assert ids["auto"] == auto
    assert ids["mine"].startswith("default-") and ids["mine"].endswith("-0000000000000001")


def test_a_job_with_an_automatic_id_can_store_a_result(tmp_path):
    # The results queue is keyed by the source queue's ids, automatic ones included.
    with Queue(tmp_path / "q") as q:
        job = q.enqueue("x")
        q.ack(q.lease_one(), result={"ok": 1})
        assert q.result(job.id) == {"ok": 1}


def test_a_queue_without_automatic_ids_needs_ids_and_takes_any_form(tmp_path):
    with Queue(tmp_path / "q", "companion", auto_ids=False) as q:
        with pytest.raises(ValueError, match="caller ids only"):
            q.enqueue("no id")
        assert q.enqueue("x", job_id="0000000000000001").id == "0000000000000001"
        assert q.options.auto_ids is False


@pytest.mark.parametrize("seq", [0, 1, 0xFF, 2**32 - 1, 2**32, 2**63, 2**64 - 1])
def test_the_automatic_ids_fast_spelling_is_the_documented_form(seq):
    # The lease and enqueue paths spell the automatic id as 8 big-endian bytes in hex.
    assert seq.to_bytes(8, "big").hex() == f"{seq:016x}"


def test_automatic_ids_from_enqueue_lease_and_get_agree(tmp_path):
    with Queue(tmp_path) as q:
        one = q.enqueue("a")
        many = q.enqueue_many(["b", "c"])
        leased = q.lease(3)
        ids = [one.id, *(j.id for j in many)]
        assert ids == [j.id for j in leased] == [q.get(i).id for i in ids]
        assert ids == [f"{j.seq:016x}" for j in leased]
