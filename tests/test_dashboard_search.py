"""The dashboard's search page in a real headless chromium (as tests/test_dashboard.py's pages):
find jobs by error text, state, key and id, page through the results, follow a job's link; the
API gives what ``ringq list`` with the same filters prints."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest
from browser import browser  # noqa: F401  (fixture)
from test_dashboard import shots, start_dashboard, stop, watch  # noqa: F401  (shots: fixture)

from ringq import Queue

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def fill(qdir: str) -> None:
    with Queue(qdir, max_attempts=1) as q:
        q.enqueue_many([{"n": i} for i in range(60)], key="tenant-7")
        q.enqueue_many([{"m": i} for i in range(5)], priority=3)
        for i in range(5):
            job = q.lease_one()
            q.nack(job, error="OSError: disk full" if i % 2 else "ValueError: bad header")


def api(url: str, query: str) -> dict:
    with urllib.request.urlopen(url + "api/search?" + query, timeout=10) as r:
        return json.load(r)


def test_search_page_finds_pages_and_links(browser, qdir, shots):  # noqa: F811
    fill(qdir)
    proc, url = start_dashboard(qdir)
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 700})
        errors = watch(page)
        page.goto(url + "page/search")
        page.wait_for_selector("#q-summary:has-text('matching')")
        assert page.text_content("#q-summary").startswith("65 matching jobs, showing 50")
        page.fill("#q-error", "DISK")
        page.click("#q-go")
        page.wait_for_function("document.getElementById('q-summary').textContent.startsWith('2 ')")
        rows = page.query_selector_all("#results tr")[1:]
        assert len(rows) == 2 and all("OSError: disk full" in r.text_content() for r in rows)
        page.screenshot(path=os.path.join(shots, "dashboard-search.png"))
        # state and key together, paged: 60 waiting tenant-7 jobs (the failed ones had
        # priority 3 and went first), 50 then 10
        page.fill("#q-error", "")
        page.select_option("#q-state", "ready")
        page.fill("#q-key", "tenant-7")
        page.click("#q-go")
        page.wait_for_function("document.getElementById('q-summary').textContent.startsWith('60 ')")
        first = page.query_selector_all("#results tr")[1].text_content()
        page.click("#q-next")
        page.wait_for_function("document.querySelectorAll('#results tr').length === 11")
        assert page.is_hidden("#q-next") and page.is_visible("#q-first")
        assert first not in [r.text_content() for r in page.query_selector_all("#results tr")]
        # by id: one job; its link opens the job page
        jid = api(url, "priority=3")["jobs"][0]["id"]
        page.fill("#q-key", "")
        page.select_option("#q-state", "")
        page.fill("#q-id", jid)
        page.click("#q-go")
        page.wait_for_function("document.getElementById('q-summary').textContent.startsWith('1 ')")
        page.click(f"#results a[href='/job/{jid}']")
        page.wait_for_selector("#job h3")
        assert jid in page.text_content("#job h3")
        assert errors == []
        # the API answers what the CLI's filters select, and refuses bad input
        assert api(url, "state=dead&error=header")["total"] == 3
        with pytest.raises(urllib.error.HTTPError) as bad:
            api(url, "state=sleeping")
        assert bad.value.code == 400
    finally:
        stop(proc)
