"""Headless Debian chromium through playwright (never a downloaded browser), one for the session:
``chromium`` and ``open_html`` (registered in tests/conftest.py), used by the audit, gallery and
MLflow UI tests."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(scope="session")
def chromium():
    """Headless Debian chromium through playwright; fails (never skips) when it is not installed."""
    if not CHROMIUM.is_file() or not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: the audit report is tested in a real browser. Install Debian's "
            "chromium first: apt-get update && apt-get install -y chromium"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@dataclasses.dataclass
class Loaded:
    """A page opened in the browser, with what went wrong while loading it."""

    page: object
    errors: list[str]  # console errors, page errors, failed loads
    requests: list[str]  # every URL the page asked for, other than the page itself and data: URIs

    def images(self) -> dict:
        """How many <img> the page has, how many loaded (complete, naturalWidth > 0), which did not."""
        return self.page.evaluate("""() => {
            const imgs = Array.from(document.images);
            const bad = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt);
            return {total: imgs.length, loaded: imgs.length - bad.length, bad: bad};
        }""")

    def outside_references(self) -> list[str]:
        """Every src/href in the page that is not an inline data URI."""
        return self.page.evaluate("""() => Array.from(document.querySelectorAll('[src],[href]'))
            .map(e => e.getAttribute('src') || e.getAttribute('href')).filter(u => !u.startsWith('data:'))""")

    def rows(self, selector: str) -> list[dict]:
        """The data-* attributes of each element matching ``selector``."""
        return self.page.eval_on_selector_all(selector, "els => els.map(e => Object.assign({}, e.dataset))")


@pytest.fixture
def open_html(chromium):
    """``open_html(path)`` -> ``Loaded``: a local HTML file opened from its file:// URL, fully loaded."""
    pages = []

    def _open(path: Path) -> Loaded:
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        pages.append(page)
        loaded = Loaded(page, [], [])
        page.on("console", lambda m: loaded.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: loaded.errors.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: loaded.errors.append(f"failed: {r.url[:120]} {r.failure}"))
        page.on(
            "request",
            lambda r: (
                loaded.requests.append(r.url[:120])
                if r.url != path.as_uri() and not r.url.startswith("data:")
                else None
            ),
        )
        page.goto(path.as_uri(), wait_until="load")
        return loaded

    yield _open
    for page in pages:
        page.close()
