"""Fixtures of the audit tests: real curation runs of the demo corpus, and headless Chromium.

Three runs of the same corpus: A (the session's curated demo, tests/conftest.py), B (A's
configuration into another folder) and C (A with ``geometry.min_short_side`` raised), all logged
to A's MLflow store. The browser is Debian's
chromium driven by playwright (never a downloaded one).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from curation.recipe import CurationConfig

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
MIN_SHORT_SIDE_A, MIN_SHORT_SIDE_C = 256, 500


@dataclasses.dataclass
class Run:
    cfg: CurationConfig
    result: object  # curation.pipeline.CurationResult

    @property
    def output(self) -> str:
        return self.result.output_dir


@pytest.fixture(scope="session")
def audit_root(demo_curated) -> Path:
    """The session's curated demo's folder (tests/conftest.py): its corpus in ``raw``."""
    return demo_curated[0]


@pytest.fixture(scope="session")
def run_a(demo_curated) -> Run:
    """The session's curated demo: the curation tests' settings, geometry.min_short_side at A's."""
    _, _, cfg, result = demo_curated
    assert cfg.geometry.min_short_side == MIN_SHORT_SIDE_A
    return Run(cfg, result)


@pytest.fixture(scope="session")
def runs_abc(audit_root, run_a) -> tuple[Run, Run, Run]:
    """A; B = A's configuration into another folder; C = A with geometry.min_short_side raised."""
    from curation.pipeline import run_curation

    cfg_b = dataclasses.replace(run_a.cfg, output_dir=str(audit_root / "b"))
    geometry_c = dataclasses.replace(run_a.cfg.geometry, min_short_side=MIN_SHORT_SIDE_C)
    cfg_c = dataclasses.replace(run_a.cfg, output_dir=str(audit_root / "c"), geometry=geometry_c)
    return run_a, Run(cfg_b, run_curation(cfg_b)), Run(cfg_c, run_curation(cfg_c))


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
