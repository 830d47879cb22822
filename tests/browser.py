"""A real headless browser for the dashboard tests: Debian's chromium driven by playwright.

Playwright's own browser download is never used (``playwright install`` is not run): the
system's ``/usr/bin/chromium`` is launched directly.  When chromium or playwright is missing the
tests skip with one line, except under CI (env ``CI`` set), where they fail: CI must never pass
by skipping them.
"""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = os.environ.get("RINGQ_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def require_browser() -> None:
    """Skip (locally) or fail (CI) unless chromium and playwright are available."""
    missing = []
    if (
        not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK))
        and shutil.which("chromium") is None
    ):
        missing.append(f"chromium ({CHROMIUM}; apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install -e '.[test]')")
    if missing:
        msg = f"dashboard browser tests need {', '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(msg + "; CI must not skip them", pytrace=False)
        pytest.skip(msg)


@pytest.fixture(scope="module")
def browser():
    require_browser()
    from playwright.sync_api import sync_playwright

    exe = CHROMIUM if os.path.isfile(CHROMIUM) else shutil.which("chromium")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()
