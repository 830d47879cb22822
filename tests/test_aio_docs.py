"""Every example in docs/aio.md runs: plain ```python blocks as scripts, the FastAPI one with TestClient."""

import os
import re
import subprocess
import sys
import time

import pytest
from procs import ROOT, child_env

DOC = os.path.join(ROOT, "docs", "aio.md")


def blocks(info):
    with open(DOC, encoding="utf-8") as fh:
        text = fh.read()
    return re.findall(r"^```" + re.escape(info) + r"\n(.*?)^```$", text, flags=re.S | re.M)


SCRIPTS = blocks("python")


def test_the_doc_has_examples():
    assert len(SCRIPTS) >= 4 and len(blocks("python fastapi")) == 1


@pytest.mark.parametrize("n", range(len(SCRIPTS)))
def test_example_runs(n, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPTS[n]],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_fastapi_example(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    testclient = pytest.importorskip("fastapi.testclient")
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(blocks("python fastapi")[0], "docs/aio.md", "exec"), ns)
    with testclient.TestClient(ns["app"]) as client:
        job_id = client.post("/thumbnails/cat").json()["id"]
        assert job_id == "thumb-cat"
        assert client.post("/thumbnails/cat").json()["id"] == job_id
        t = time.monotonic()
        while (body := client.get(f"/jobs/{job_id}").json())["status"] == "running":
            assert time.monotonic() - t < 10
            time.sleep(0.01)
        assert body["status"] == "done" and body["result"] == {"url": "/thumbs/cat.png"}
        assert client.get("/jobs/nope").status_code == 404


def test_the_redis_example_prints_the_same_on_a_directory_and_on_redis(tmp_path, spawn_redis):
    [program] = blocks("python redis")
    server = spawn_redis("--appendonly", "yes", "--appendfsync", "always")
    outputs = []
    for target in (str(tmp_path / "jobs"), server.url):
        for _run in range(2):  # the second run finds every id retained and stores nothing
            out = subprocess.run(
                [sys.executable, "-c", program, target],
                cwd=tmp_path,
                env=child_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert out.returncode == 0, out.stderr
            outputs.append(out.stdout.strip())
    assert outputs == ["['done'] {'thumb': 'img0-64.png'} 1"] * 4
    assert server.cli("SCARD", "{ringq-aio:default}:queues") == "2"  # default-j-resize, default-r
    assert server.cli("HLEN", "{ringq:default-r}:meta") == "20"  # 20 results from two runs
