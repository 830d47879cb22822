"""The dashboard in a real headless chromium, served by ``ringq dashboard`` in its own process.

Screenshots go to a temporary directory; with ``RINGQ_UPDATE_SCREENSHOTS=1`` they replace the
ones under docs/ that docs/dashboard.md shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from browser import browser  # noqa: F401  (fixture)
from procs import ROOT, run_py, spawn

from ringq import Queue

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def start_dashboard(qdir: str, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = spawn(
        "from ringq.cli import main; raise SystemExit(main())",
        "--dir",
        qdir,
        "dashboard",
        "--port",
        "0",
        "--json",
        *extra,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line, f"dashboard exited with {proc.wait(10)}"
    return proc, json.loads(line)["url"]


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def shots(tmp_path):
    """Where screenshots go: docs/ with RINGQ_UPDATE_SCREENSHOTS=1, else a temporary directory."""
    if os.environ.get("RINGQ_UPDATE_SCREENSHOTS") == "1":
        return os.path.join(ROOT, "docs", "images")
    return str(tmp_path)


def fill(qdir: str) -> dict:
    """A queue with ready, delayed, leased (held by a detached lease), dead and keyed jobs."""
    q = Queue(qdir, visibility_timeout=120)
    q.limit("tenant-7", concurrency=3)
    q.limit("api", rate=(50, 1.0))
    q.enqueue_many([{"email": f"user{i}@example.com"} for i in range(12)], priority=1)
    q.enqueue_many([{"report": i} for i in range(3)], key="tenant-7")
    q.enqueue({"digest": "weekly"}, delay=3600)
    for i in range(3):
        job = q.enqueue({"resize": f"/srv/img/{i}.jpg"}, max_attempts=1, priority=10)
        q.nack(q.lease_one(), error="OSError: disk full" if i < 2 else "ValueError: bad header")
        assert q.get(job.id).state.value == "dead"
    held = q.lease(2, detach=True)
    q.progress(held[0], 0.25, "resizing")
    return {"dead": [j.id for j in q.dlq()], "held": [j.id for j in held]}


BUSY = r"""
import sys, time
from ringq import Queue
q = Queue(sys.argv[1])
end = time.time() + 3
while time.time() < end:
    q.enqueue_many([{"tick": i} for i in range(6)], priority=50)
    for job in q.lease(6):
        if job.payload["tick"] == 0:
            q.nack(job, error="TimeoutError: upstream", delay=0)
        else:
            q.ack(job)
    time.sleep(0.1)
"""


HOLDER = r"""
import sys, time
from ringq import Queue
q = Queue(sys.argv[1])
print(q.lease_one().id, flush=True)
time.sleep(120)
"""


def live(page) -> None:
    """Wait until the page's header shows the event stream delivering (before a screenshot)."""
    page.wait_for_function("document.getElementById('live').textContent.startsWith('live ')")


def watch(page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def test_pages_load_without_errors_and_counts_are_live(browser, qdir, shots):  # noqa: F811
    ids = fill(qdir)
    holder = spawn(HOLDER, qdir, stdout=subprocess.PIPE, text=True)
    held_by_pid = holder.stdout.readline().strip()
    proc, url = start_dashboard(qdir)
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 700})
        errors = watch(page)
        page.goto(url + "page/overview")
        page.wait_for_function(
            "document.getElementById('c-ready').textContent === '"
            + str(Queue(qdir).stats().ready)
            + "'"
        )
        before = int(page.text_content("#c-ready"))
        # another process enqueues: the count changes without a reload (server-sent events)
        out = run_py(
            "import sys; from ringq import Queue; Queue(sys.argv[1]).enqueue_many(list(range(4)))",
            qdir,
        )
        assert out.returncode == 0, out.stderr
        page.wait_for_function(
            f"document.getElementById('c-ready').textContent === '{before + 4}'", timeout=15000
        )
        # some throughput and errors for the chart, from yet another process
        busy = run_py(BUSY, qdir, timeout=60)
        assert busy.returncode == 0, busy.stderr
        page.wait_for_function(
            "points.length >= 4 && points.some((p) => p.dead > 0)", timeout=15000
        )
        page.wait_for_function(
            "document.querySelectorAll('#chart polyline').length === 3", timeout=15000
        )
        assert "tenant-7" in page.text_content("#limits")
        page.screenshot(path=os.path.join(shots, "dashboard-overview.png"))

        page.goto(url + "page/leases")
        page.wait_for_selector("#leases td a")
        live(page)
        text = page.text_content("#leases")
        assert all(i in text for i in ids["held"]) and "detached" in text
        assert f"pid {holder.pid}" in text and held_by_pid in text
        assert "25% resizing" in text
        page.screenshot(path=os.path.join(shots, "dashboard-leases.png"))

        page.goto(url + "page/dead")
        page.wait_for_selector("#groups td a")
        live(page)
        groups = page.text_content("#groups")
        assert "OSError: disk full" in groups and "ValueError: bad header" in groups
        page.screenshot(path=os.path.join(shots, "dashboard-dead.png"))

        page.goto(url + "job/" + ids["dead"][0])
        page.wait_for_selector("#job pre")
        assert "/srv/img/" in page.text_content("#job pre") and "disk full" in page.text_content(
            "#job"
        )
        assert page.query_selector("#cancel") is None  # a dead job cannot be cancelled

        page.goto(url + "page/waiting")
        page.wait_for_selector("#waiting td a")
        text = page.text_content("#waiting")
        assert "tenant-7" in text and "email" not in text  # keys shown; payloads are not
        assert " min" in text  # the job delayed by an hour shows its due time

        page.goto(url + "page/storage")
        page.click("#verify")
        page.wait_for_function(
            "document.getElementById('verdict').textContent.includes('last verify')", timeout=15000
        )
        assert "ok," in page.text_content("#verdict")
        live(page)
        page.screenshot(path=os.path.join(shots, "dashboard-storage.png"))
        assert errors == []
    finally:
        stop(proc)
        holder.kill()
        holder.wait()


def visible_buttons(page) -> list[str]:
    return page.evaluate(
        "[...document.querySelectorAll('button, input')].filter((b) => b.offsetParent !== null)"
        ".map((b) => b.id || b.className || b.tagName)"
    )


def test_a_read_only_dashboard_shows_no_action_and_refuses_them(browser, qdir):  # noqa: F811
    """A read-only dashboard showed the action buttons, which then answered 403."""
    ids = fill(qdir)
    ready = Queue(qdir).list_jobs("ready", limit=1)[0].id
    proc, url = start_dashboard(qdir)
    try:
        page = browser.new_page()
        errors = watch(page)
        # every page with something to act on: no action control is shown
        for path, data in (
            ("page/overview", "document.getElementById('paused').textContent === 'running'"),
            ("page/waiting", "document.querySelector('#waiting td a') !== null"),
            ("page/leases", "document.querySelector('#leases td a') !== null"),
            ("page/dead", "document.querySelector('#groups td a') !== null"),
            ("job/" + ready, "document.querySelector('#job pre') !== null"),
            ("job/" + ids["held"][0], "document.querySelector('#job pre') !== null"),
        ):
            page.goto(url + path)
            page.wait_for_function(data)
            assert visible_buttons(page) == [], (path, visible_buttons(page))
            assert page.text_content("#mode") == "read-only"
        page.goto(url + "page/storage")
        page.wait_for_selector("#files td")
        assert visible_buttons(page) == ["verify"]  # verify changes nothing
        # the page's own action call, made anyway, is refused and says so
        page.goto(url + "page/overview")
        page.wait_for_function("document.getElementById('paused').textContent === 'running'")
        assert page.evaluate("act('/api/actions/pause')") == 403
        assert "refused (403)" in page.text_content("#msg")
        q = Queue(qdir)
        actions = (
            "requeue",
            "discard?id=" + ids["dead"][0],
            "purge",
            "cancel?id=" + ready,
            "cancel?id=" + ids["held"][0],
            "pause",
            "pause?key=pdf",
            "resume",
        )
        for action in actions:
            req = urllib.request.Request(url + "api/actions/" + action, method="POST")
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(req, timeout=10)
            assert info.value.code == 403
        # nothing changed
        assert q.stats().dead == 3 and q.stats().cancelled == 0
        assert q.get(ready).state.value == "ready"
        assert not q.get(ids["held"][0]).cancel_requested
        assert q.paused() == {"queue": False, "keys": []}
        # the browser logs the refused request; nothing else may appear
        assert all("status of 403" in e for e in errors), errors
    finally:
        stop(proc)


def test_the_header_says_how_fresh_the_shown_data_is(browser, qdir):  # noqa: F811
    """The In-flight page showed its leases under a header stuck on "connecting..." until the
    event stream's first message; with that stream held back, the header must still date them."""
    fill(qdir)
    proc, url = start_dashboard(qdir)
    try:
        page = browser.new_page()
        errors = watch(page)
        page.route("**/events", lambda route: None)  # never answered: the stream does not open
        for path, data in (("page/leases", "#leases td a"), ("page/waiting", "#waiting td a"),
                           ("page/dead", "#groups td a"), ("page/storage", "#files td")):
            page.goto(url + path)
            page.wait_for_selector(data)
            assert page.text_content("#live").startswith("updated "), (path, page.text_content("#live"))
        page.unroute("**/events")
        page.goto(url + "page/leases")
        page.wait_for_function("document.getElementById('live').textContent.startsWith('live ')")
        assert errors == []
    finally:
        stop(proc)


def test_actions_with_allow_actions(browser, qdir):  # noqa: F811
    fill(qdir)
    proc, url = start_dashboard(qdir, "--allow-actions")
    try:
        page = browser.new_page()
        errors = watch(page)
        page.goto(url + "page/dead")
        assert page.text_content("#mode") == "actions allowed"
        page.wait_for_selector("button.discard")
        # the largest group first: "disk full" (2 jobs) is discarded, "bad header" requeued
        page.click("button.discard >> nth=0")
        page.wait_for_function("document.getElementById('msg').textContent.includes('discarded')")
        page.wait_for_function("document.querySelectorAll('button.requeue').length === 1")
        page.click("button.requeue")
        page.wait_for_function("document.getElementById('msg').textContent.includes('requeued')")
        st = Queue(qdir).stats()
        assert st.dead == 0 and st.ready == 10 + 3 + 1  # two emails stay leased
        # cancel from the in-flight page: the lease stays, marked cancel requested
        page.goto(url + "page/leases")
        page.wait_for_selector("#leases button.cancel")
        held = page.get_attribute("#leases button.cancel >> nth=0", "data-id")
        page.click("#leases button.cancel >> nth=0")
        page.wait_for_function(
            "document.getElementById('leases').textContent.includes('cancel requested')"
        )
        job = Queue(qdir).get(held)
        assert job.cancel_requested and job.state.value == "leased"
        assert errors == []
    finally:
        stop(proc)


REPORTER = r"""
import sys, time
from ringq import Queue
q = Queue(sys.argv[1])
job = q.lease_one()
q.progress(job, 0.4, "page 40 of 100")
print(job.id, flush=True)
sys.stdin.readline()
q.progress(job, 0.7, "page 70 of 100")
end = time.time() + 60
while not job.cancel_requested and time.time() < end:
    time.sleep(0.05)
    job = q.extend(job, 30)  # the heartbeat that tells a holder of a cancel request
print("cancel seen" if job.cancel_requested else "no cancel", flush=True)
sys.stdin.readline()
q.ack(job)
"""


def test_job_page_shows_progress_and_cancels(browser, qdir, shots):  # noqa: F811
    q = Queue(qdir, visibility_timeout=60)
    done = q.enqueue({"render": "cover.png"}, priority=9)
    q.ack(q.lease_one(), result={"pages": 100, "bytes": 81234})
    report = q.enqueue(
        {"pdf": "reports/2024.pdf", "pages": 100}, key="reports", expires_in=3600, priority=5
    )
    first = q.enqueue({"email": "a@example.com"})
    second = q.enqueue({"email": "b@example.com"}, expires_in=3600)
    notify = q.enqueue({"notify": "a@example.com"}, depends_on=[first])
    holder = spawn(REPORTER, qdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == report.id
    proc, url = start_dashboard(qdir, "--allow-actions")
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 640})
        errors = watch(page)
        page.goto(url + "job/" + report.id)
        page.wait_for_function(
            "(document.getElementById('progress') || {}).textContent === '40% page 40 of 100'"
        )
        text = page.text_content("#job")
        assert "reports" in text and "expires at" in text and "cancel requestedno" in text
        # progress reported later by the holder shows without a reload
        holder.stdin.write("go\n")
        holder.stdin.flush()
        page.wait_for_function(
            "document.getElementById('progress').textContent === '70% page 70 of 100'",
            timeout=15000,
        )
        page.screenshot(path=os.path.join(shots, "dashboard-job.png"))

        # a leased job: cancel requested, its holder learns it at its next extend
        page.click("#cancel")
        page.wait_for_function("document.getElementById('job').textContent.includes('yes:')")
        assert q.get(report.id).cancel_requested and q.get(report.id).state.value == "leased"
        assert holder.stdout.readline().strip() == "cancel seen"
        holder.stdin.write("ack\n")
        holder.stdin.flush()
        assert holder.wait(30) == 0  # its ack ends the job cancelled, not done
        assert q.get(report.id).state.value == "cancelled"
        page.wait_for_function("document.getElementById('job').textContent.includes('cancelled')")

        # a ready job from its page, another from the Waiting page: cancelled, never run
        page.goto(url + "job/" + first.id)
        page.click("#cancel")
        page.wait_for_function("document.getElementById('msg').textContent.includes('cancelled')")
        assert q.get(first.id).state.value == "cancelled"
        page.goto(url + "page/waiting")
        page.wait_for_selector("#waiting button.cancel")
        assert " min" in page.text_content("#waiting")  # when the second one expires
        page.click(f"#waiting button.cancel[data-id='{second.id}']")
        page.wait_for_function(
            "document.getElementById('waiting').textContent.includes('no job is waiting')"
        )
        assert q.get(second.id).state.value == "cancelled"

        # a stored result is previewed as the payload is; a job without one has none
        page.goto(url + "job/" + done.id)
        page.wait_for_selector("#result")
        assert '"pages": 100' in page.text_content("#result")
        assert page.query_selector("#cancel") is None
        page.goto(url + "job/" + first.id)
        page.wait_for_selector("#payload")
        assert page.query_selector("#result") is None

        # a job's page links its parents and its dependents
        page.click(f"#dependents a[href='/job/{notify.id}']")
        page.wait_for_function(
            f"(document.getElementById('parents') || {{}}).textContent === '{first.id}'"
        )
        assert "cancelled" in page.text_content("#job")  # its parent was cancelled
        assert errors == []
    finally:
        stop(proc)
        holder.kill()
        holder.wait()


CONSUMER = r"""
import sys, time
from ringq import Queue
q = Queue(sys.argv[1])
end = time.time() + 60
while time.time() < end:
    started = time.time()
    job = q.lease_one(wait=0.1)
    print(started, job.id if job else "-", flush=True)
    if job is not None:
        q.ack(job)
"""


def test_pause_and_resume_from_the_overview(browser, qdir, shots):  # noqa: F811
    q = Queue(qdir)
    consumer = spawn(CONSUMER, qdir, stdout=subprocess.PIPE, text=True)
    proc, url = start_dashboard(qdir, "--allow-actions")

    def lines_until(pred):
        while True:
            line = consumer.stdout.readline()
            assert line, "the consumer exited"
            started, what = line.split()
            if pred(float(started), what):
                return

    try:
        page = browser.new_page(viewport={"width": 1100, "height": 700})
        errors = watch(page)
        page.goto(url + "page/overview")
        paused = "document.getElementById('paused').textContent === '{}'"
        page.wait_for_function(paused.format("running"))
        page.click("#pause")
        page.wait_for_function(paused.format("paused"))
        assert q.paused() == {"queue": True, "keys": []}
        job = q.enqueue({"after": "pause"})
        t0 = time.time()
        # two whole lease calls of the other process began after the enqueue and got nothing
        seen = []
        lines_until(
            lambda t, what: what == "-" and t > t0 and seen.append(t) is None and len(seen) == 2
        )
        assert q.get(job.id).state.value == "ready"

        page.fill("#pause-key", "pdf")
        page.click("#pause-key-btn")
        page.wait_for_selector("button.resume-key[data-key='pdf']")
        assert q.paused() == {"queue": True, "keys": ["pdf"]}
        page.screenshot(path=os.path.join(shots, "dashboard-paused.png"))

        page.click("#resume")
        page.wait_for_function(paused.format("running"))
        lines_until(lambda _t, what: what == job.id)  # leased at once by the other process
        page.click("button.resume-key[data-key='pdf']")
        page.wait_for_function("document.getElementById('paused-keys').textContent === ''")
        assert q.paused() == {"queue": False, "keys": []}
        assert errors == []
    finally:
        stop(proc)
        consumer.kill()
        consumer.wait()


def test_action_json_matches_the_cli(qdir):
    import re

    q = Queue(qdir)
    a, b = q.enqueue_many(["a", "b"])
    proc, url = start_dashboard(qdir, "--allow-actions")
    own = url.split("/")[2]
    try:
        status, page = _http(url, "/page/overview", headers={"Host": own})
        token = re.search(r'CSRF_TOKEN = "([^"]+)"', page).group(1)
        post = {"Host": own, "Origin": f"http://{own}", "X-Ringq-CSRF": token}

        def cli(*argv: str):
            out = run_py(
                "from ringq.cli import main; raise SystemExit(main())",
                "--dir",
                qdir,
                "--json",
                *argv,
            )
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        # pausing twice, cancelling twice, resuming twice is harmless: both answers must agree
        for action, argv in (
            ("pause?key=pdf", ["pause", "--key", "pdf"]),
            ("pause", ["pause"]),
            (f"cancel?id={a.id}&id={b.id}", ["cancel", a.id, b.id]),
            ("resume", ["resume"]),
            ("resume?key=pdf", ["resume", "--key", "pdf"]),
        ):
            status, body = _http(url, "/api/actions/" + action, "POST", post)
            assert status == 200, (action, body)
            assert json.loads(body) == cli(*argv), action
        # errors are typed: a finished job cannot be cancelled, an unknown one is not found
        assert _http(url, f"/api/actions/cancel?id={a.id}", "POST", post)[0] == 200
        q.ack(q.enqueue("c", job_id="c") and q.lease_one())
        assert _http(url, "/api/actions/cancel?id=c", "POST", post)[0] == 409
        assert _http(url, "/api/actions/cancel?id=nope", "POST", post)[0] == 404
        assert _http(url, "/api/actions/pause?key=" + "k" * 57, "POST", post)[0] == 400
        assert q.paused() == {"queue": False, "keys": []}
    finally:
        stop(proc)


def test_json_endpoints_match_the_cli(qdir):
    fill(qdir)
    proc, url = start_dashboard(qdir)
    try:
        for endpoint, argv in (
            ("api/stats", ["stats"]),
            ("api/list?state=dead", ["list", "--state", "dead"]),
            ("api/list", ["list"]),
            ("api/dlq", ["dlq"]),
            ("api/verify", ["verify"]),
            ("api/list?state=cancelled", ["list", "--state", "cancelled"]),
        ):
            with urllib.request.urlopen(url + endpoint, timeout=10) as resp:
                served = json.loads(resp.read())
            cli = run_py(
                "from ringq.cli import main; raise SystemExit(main())",
                "--dir",
                qdir,
                "--json",
                *argv,
            )
            assert cli.returncode == 0, cli.stderr
            assert served == json.loads(cli.stdout), endpoint
        # one job: `ringq get --json` plus the previews the job page shows
        job_id = Queue(qdir).list_jobs("leased")[0].id
        with urllib.request.urlopen(url + "api/jobs/" + job_id, timeout=10) as resp:
            served = json.loads(resp.read())
        cli = run_py(
            "from ringq.cli import main; raise SystemExit(main())",
            "--dir",
            qdir,
            "--json",
            "get",
            job_id,
        )
        assert cli.returncode == 0, cli.stderr
        previews = {k: served.pop(k) for k in ("payload_preview", "result_preview")}
        assert served == json.loads(cli.stdout)
        assert previews["result_preview"] is None and "email" in previews["payload_preview"]
    finally:
        stop(proc)


def test_interrupt_ends_open_event_streams(qdir):
    """Ctrl-C stops the dashboard promptly while a page holds its event stream open."""
    fill(qdir)
    proc, url = start_dashboard(qdir)
    try:
        with urllib.request.urlopen(url + "events", timeout=10) as stream:
            assert stream.readline().startswith(b"event: overview")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(10) != 0  # well before the 10 s: the stream ends within 0.1 s
            assert b"[DONE]" not in stream.read()  # the server ended the response
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _http(url: str, path: str, method: str = "GET", headers: dict | None = None) -> tuple[int, str]:
    """One request over a real socket with exactly these headers (Host included)."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        headers = dict(headers or {})
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders(b"" if method == "POST" else None)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_dns_rebinding_and_cross_site_requests_are_refused(qdir):
    import re
    from urllib.parse import urlsplit

    fill(qdir)
    proc, url = start_dashboard(qdir, "--allow-actions")
    port = urlsplit(url).port
    own = f"127.0.0.1:{port}"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    try:
        # Host check on every request: a rebound name, with or without the port, gets nothing
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1", f"127.0.0.1:{port + 1}"):
            status, body = _http(url, "/api/stats", headers={"Host": host})
            assert status == 403, host
            assert "ready" not in body
        for host in (own, f"localhost:{port}", f"[::1]:{port}"):
            assert _http(url, "/api/stats", headers={"Host": host})[0] == 200, host
        status, page = _http(url, "/page/dead", headers={"Host": own})
        assert status == 200
        token = re.search(r'CSRF_TOKEN = "([^"]+)"', page).group(1)
        tok = {"X-Ringq-CSRF": token}

        refused = [
            # a form post from another site (a "simple" request, no preflight)
            {"Host": own, "Origin": "http://evil.example", **form},
            # DNS rebinding: the browser sends the attacker's name as Host and Origin
            {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}", **form},
            {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}", **tok},
            # same origin but no token (or a wrong one), as a plain HTML form would send
            {"Host": own, "Origin": f"http://{own}", **form},
            {"Host": own, "Origin": f"http://{own}", "X-Ringq-CSRF": token[:-1] + "x"},
            # the token alone, with neither Origin nor Referer
            {"Host": own, **tok},
            {"Host": own, "Referer": "http://evil.example/", **tok},
            {"Host": own, "Referer": f"http://{own}.evil.example/", **tok},
            {"Host": own, "Origin": "null", **tok},
        ]
        q = Queue(qdir)
        held = q.list_jobs("leased", limit=1)[0].id
        for action in ("requeue", "purge", f"cancel?id={held}", "pause", "resume"):
            for headers in refused:
                status, body = _http(url, "/api/actions/" + action, "POST", headers)
                assert status == 403, (action, headers)
                assert "error" in json.loads(body)
        assert q.stats().dead == 3  # nothing changed
        assert not q.get(held).cancel_requested and q.paused()["queue"] is False

        # the dashboard's own page: same origin (Origin, or Referer alone) and the token
        ok = {"Host": own, "Referer": f"http://{own}/page/dead", **tok}
        status, body = _http(url, "/api/actions/requeue", "POST", ok)
        assert status == 200 and json.loads(body) == {"requeued": 3}
        ok = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}", **tok}
        status, body = _http(url, "/api/actions/purge", "POST", ok)
        assert status == 200 and json.loads(body)["purged"] > 0
        assert Queue(qdir).stats().ready == 0
    finally:
        stop(proc)


def test_the_screenshot_script_of_docs_dashboard_md(browser, qdir, tmp_path):  # noqa: F811
    """docs/dashboard.md's screenshot script, as written there, run as this (root in CI) user: it
    failed as root without --no-sandbox and captured "connecting..." without a wait."""
    import re

    with open(os.path.join(ROOT, "docs", "dashboard.md"), encoding="utf-8") as fh:
        doc = fh.read()
    section = doc[doc.index("\n## Screenshots\n") :]
    script = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    fill(qdir)
    proc, url = start_dashboard(qdir)
    try:
        out = tmp_path / "leases.png"
        res = run_py(script, url + "page/leases", str(out), timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        assert out.read_bytes().startswith(b"\x89PNG")
    finally:
        stop(proc)


def test_a_sigterm_sent_on_the_ready_line_stops_it_as_ctrl_c_does(qdir):
    """A supervisor that stops the dashboard as soon as it says it serves: the signal asks the
    server to stop (exit 130, "interrupted"), it does not kill the process with the queue open."""
    fill(qdir)
    for _ in range(3):
        proc, _url = start_dashboard(qdir)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 130
