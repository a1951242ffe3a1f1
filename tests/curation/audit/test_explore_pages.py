"""The explorer (``pipelines/explore.py``) serving a real curated demo version, in headless Chromium.

Version C of the audit tests (the demo corpus with ``geometry.min_short_side`` raised, conftest)
is served against version A by the real script in a process of its own, with three images per
page so the demo's reasons span pages. What the pages show is compared with C's and A's
manifests read here with pyarrow, independently of the explorer's queries.
"""

from __future__ import annotations

import html
import math
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from curation import schema
from tests.browser import Loaded

pytestmark = pytest.mark.slow  # real curation runs, a server process and headless Chromium

REPO = Path(__file__).resolve().parents[3]
PAGE = 3


def manifest(output: str) -> list[dict]:
    """The manifest in its own order (parts by path, rows as written)."""
    parts = sorted(str(p) for p in (Path(output) / "manifest").glob("*.parquet"))
    return [r for p in parts for r in pads.dataset(p).to_table().to_pylist()]


def start_explorer(*args: str, log: Path, timeout: float = 300) -> tuple[subprocess.Popen, str]:
    """``pipelines/explore.py *args --port 0`` in a session of its own: (process, base URL)."""
    cmd = [sys.executable, str(REPO / "pipelines" / "explore.py"), *args, "--port", "0"]
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    deadline, seen = time.time() + timeout, []
    while time.time() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            line = proc.stdout.readline()
            seen.append(line)
            if line.startswith("explorer: "):
                return proc, line.split()[1].rstrip("/")
    end(proc)
    pytest.fail(f"the explorer did not start: {''.join(seen)}\n{log.read_text()[-3000:]}")


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def served(runs_abc, tmp_path_factory):
    """C explored against A: (A, C, base URL, server process)."""
    a, _, c = runs_abc
    tmp = tmp_path_factory.mktemp("explore")
    args = (c.output, "--against", a.output, "--page-size", str(PAGE), "--cache-dir", str(tmp / "cache"))
    proc, url = start_explorer(*args, log=tmp / "server.log")
    yield a, c, url, proc
    end(proc)


@pytest.fixture
def browse(chromium):
    """``browse(url)`` -> ``Loaded``: a page opened over HTTP with its errors and requests recorded."""
    pages = []

    def _open(url: str) -> Loaded:
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        pages.append(page)
        loaded = Loaded(page, [], [])
        page.on("console", lambda m: loaded.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: loaded.errors.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: loaded.errors.append(f"failed: {r.url[:120]} {r.failure}"))
        page.on("request", lambda r: loaded.requests.append(r.url))
        page.goto(url, wait_until="networkidle")
        return loaded

    yield _open
    for page in pages:
        page.close()


def settle(loaded: Loaded) -> None:
    loaded.page.wait_for_load_state("networkidle")
    images = loaded.images()
    assert images["bad"] == [], images


def shown(loaded: Loaded) -> list[dict]:
    return loaded.rows("#gallery figure.tile")


def test_the_funnel_links_each_reason_to_all_its_images_page_by_page(served, browse):
    _, c, url, _ = served
    rows = manifest(c.output)
    by_key = {r["key"]: r for r in rows}
    status = Counter(r["status"] for r in rows)
    loaded = browse(url + "/")
    totals = {x["name"]: int(x["value"]) for x in loaded.rows("#totals .card")}
    assert totals == {
        "inputs": len(rows),
        "kept": status["kept"],
        "dropped": status["dropped"],
        "errors": status["error"],
    }
    expected = [r["key"] for r in rows if r["reason"] == "too_small"]
    assert len(expected) > 2 * PAGE  # C's raised threshold drops more than two pages of the demo

    loaded.page.click('#funnel-table a.reason[data-reason="too_small"]')
    settle(loaded)
    assert int(loaded.page.get_attribute("#total", "data-total")) == len(expected)
    pages, keys = 0, []
    while True:
        tiles = shown(loaded)
        assert len(tiles) == min(PAGE, len(expected) - len(keys)) and {t["reason"] for t in tiles} == {"too_small"}
        keys += [t["key"] for t in tiles]
        pages += 1
        settle(loaded)
        if not loaded.page.query_selector("#next-page"):
            break
        loaded.page.click("#next-page")
        settle(loaded)
    assert keys == expected and pages == math.ceil(len(expected) / PAGE)  # every image once, in manifest order

    folder = Path(by_key[shown(loaded)[0]["key"]]["source"]).parent
    loaded.page.click("#gallery figure.tile a.source")  # the first tile's: the images from its input folder
    settle(loaded)
    same = [r["key"] for r in rows if Path(r["source"]).parent == folder]
    assert int(loaded.page.get_attribute("#total", "data-total")) == len(same)
    assert [t["key"] for t in shown(loaded)] == same[:PAGE]
    assert loaded.errors == []
    assert all(u.startswith(url) for u in loaded.requests)  # nothing from outside the server


def test_an_image_page_shows_its_row_and_its_duplicate_family(served, browse):
    _, c, url, _ = served
    rows = manifest(c.output)
    by_key = {r["key"]: r for r in rows}
    loaded = browse(url + "/images?reason=near_duplicate")
    first = shown(loaded)[0]
    loaded.page.click(f'#gallery figure.tile[data-key="{first["key"]}"] a')
    settle(loaded)
    row = by_key[first["key"]]
    cells = {x["column"]: x for x in loaded.rows("#row-table tr")}
    assert set(cells) == {k for k in row if k not in schema.EMBEDDING_COLUMNS}
    assert loaded.page.inner_text('#row-table tr[data-column="source"] code') == row["source"]
    rep = row["duplicate_of"]
    info = loaded.rows("#family-info")[0]
    assert info["representative"] == rep and info["kept"] == str(by_key[rep]["status"] == "kept").lower()
    family = loaded.rows("#family-table tbody tr")
    members = sorted(r["key"] for r in rows if r["duplicate_of"] == rep)
    assert [(f["key"], f["role"]) for f in family] == [(rep, "representative")] + [(k, "member") for k in members]
    assert {f["key"]: f["status"] for f in family} == {k: by_key[k]["status"] for k in [rep, *members]}
    assert loaded.errors == [] and loaded.images()["loaded"] == loaded.images()["total"] >= 2


def test_an_image_pages_neighbours_are_the_nearest_by_the_versions_embedding(served, browse):
    """The demo embeds every survivor with the backbone (no CLIP weights here): a kept image's
    neighbours are the other embedded rows by cosine, as numpy ranks them over C's manifest."""
    import numpy as np

    _, c, url, _ = served
    rows = manifest(c.output)
    column = next(col for col in schema.EMBEDDING_COLUMNS if any(r.get(col) is not None for r in rows))
    embedded = [r for r in rows if r.get(column) is not None]
    assert len(embedded) >= 3, column
    me = embedded[0]
    others = [r for r in embedded if r["key"] != me["key"]]
    cos = np.asarray([r[column] for r in others]) @ np.asarray(me[column])
    expected = [
        others[i]["key"] for i in sorted(range(len(others)), key=lambda i: (-round(cos[i], 5), others[i]["key"]))
    ]
    loaded = browse(url + "/image?" + urllib.parse.urlencode({"key": me["key"]}))
    shown_keys = [n["key"] for n in loaded.rows("#neighbours-table tbody tr")]
    assert shown_keys and len(shown_keys) == min(12, len(others))
    assert set(shown_keys) == set(expected[: len(shown_keys)]), (shown_keys, expected)
    cosines = [
        float(t)
        for t in loaded.page.eval_on_selector_all("#neighbours-table td.num", "els => els.map(e => e.textContent)")
    ]
    assert cosines == sorted(cosines, reverse=True) and cosines[0] <= 1.0001
    assert column not in {x["column"] for x in loaded.rows("#row-table tr")}  # the vector itself is not a row cell
    assert loaded.errors == []


def test_a_score_range_applied_in_the_form(served, browse):
    _, c, url, _ = served
    rows = manifest(c.output)
    values = sorted({r["sharpness"] for r in rows if r["sharpness"] is not None})
    lo, hi = values[3], values[12]
    expected = [r["key"] for r in rows if r["sharpness"] is not None and lo <= r["sharpness"] <= hi]
    loaded = browse(url + "/images")
    loaded.page.click("#range-inputs summary")
    loaded.page.fill('input[name="min.sharpness"]', repr(lo))
    loaded.page.fill('input[name="max.sharpness"]', repr(hi))
    loaded.page.click("#apply")
    settle(loaded)
    query = urllib.parse.parse_qs(urllib.parse.urlparse(loaded.page.url).query)
    assert (float(query["min.sharpness"][0]), float(query["max.sharpness"][0])) == (lo, hi)
    assert loaded.page.get_attribute("#total", "data-exact") == "true"
    assert int(loaded.page.get_attribute("#total", "data-total")) == len(expected) > PAGE
    assert [t["key"] for t in shown(loaded)] == expected[:PAGE]
    assert loaded.errors == []


def test_against_lists_the_images_whose_fate_changed_and_why(served, browse):
    a, c, url, _ = served
    fates: dict[str, list] = {}  # key -> [fate in A, fate in C]; a key one side never saw is absent there
    for side, output in enumerate((a.output, c.output)):
        for r in manifest(output):
            fates.setdefault(r["key"], [("absent", None), ("absent", None)])[side] = (r["status"], r["reason"])
    expected = sorted(k for k, (fa, fc) in fates.items() if fa == ("kept", None) and fc == ("dropped", "too_small"))
    assert expected  # the demo corpus has kept people photos between 256 and 500 px
    loaded = browse(url + "/changes")
    groups = {(g["from"], g["to"]): g for g in loaded.rows("#groups-table tbody tr")}
    group = groups[("kept", "dropped: too_small")]
    assert int(group["count"]) == len(expected) and group["explainedBy"] == "geometry.min_short_side"
    changed = sum(fa != fc for fa, fc in fates.values())
    assert int(loaded.page.get_attribute("#changed-total", "data-total")) == changed
    loaded.page.click('#groups-table tr[data-from="kept"][data-to="dropped: too_small"] a')
    settle(loaded)
    assert [t["key"] for t in loaded.rows("#changed-gallery figure.tile")] == expected[:PAGE]
    loaded.page.click("#changed-gallery figure.tile a")
    settle(loaded)
    fate = loaded.rows("#fate")[0]
    assert (fate["aStatus"], fate["bStatus"], fate["bReason"]) == ("kept", "dropped", "too_small")
    assert loaded.errors == []


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, html.unescape(r.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as err:
        return err.code, html.unescape(err.read().decode("utf-8", "replace"))


def test_bad_requests_are_a_4xx_with_the_reason_never_a_500(served, tmp_path):
    _, c, url, proc = served
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret-content")
    key = manifest(c.output)[0]["key"]
    cases = [
        ("/images", {"reason": "no_such_reason"}, 400, "is not a reason of this version"),
        ("/images", {"step": "no_such_step"}, 400, "is not a step of this version"),
        ("/images", {"status": "lost"}, 400, "is not a status"),
        ("/images", {"min.sharpness": "x"}, 400, "is not a number"),
        ("/images", {"min.sharpness": "3", "max.sharpness": "1"}, 400, "an empty range"),
        ("/images", {"max.no_column": "1"}, 400, "is not a score or numeric column"),
        ("/images", {"page": "two"}, 400, "is not a whole number"),
        ("/images", {"page_size": "-3"}, 400, "is not a whole number"),
        ("/images", {"sort": "sideways"}, 400, "is neither"),
        ("/images", {"source": "../../../etc"}, 400, "a path outside the version"),
        ("/images", {"source": str(secret)}, 400, "a path outside the version"),
        ("/images", {"reason": "../x"}, 400, "a path outside the version"),
        ("/images", {"page": "../1"}, 400, "a path outside the version"),
        ("/images", {"../x": "1"}, 400, "a path outside the version"),
        ("/image", {"key": str(secret)}, 400, "a path outside the version"),
        ("/image", {"key": "../../" + key}, 400, "a path outside the version"),
        ("/image", {"key": "no-such-key"}, 404, "is not an image of version"),
        ("/image", {"key": key, "of": "../a"}, 400, "a path outside the version"),
        ("/image", {"key": key, "of": "other"}, 400, "is not a version of this session"),
        ("/thumb", {"key": f"file://{secret}"}, 400, "a path outside the version"),
        ("/thumb", {"key": "no-such-key"}, 404, "is not an image of version"),
        ("/thumb", {"key": key, "side": "99"}, 400, "side: 99 is not one of"),
        ("/changes", {"a_status": "kept", "b_status": "lost"}, 400, "b_status: 'lost' is not"),
        ("/changes", {"a_status": "kept", "b_status": "dropped", "b_reason": "nope"}, 400, "is not a reason"),
        ("/changes", {"b_reason": "/etc/passwd"}, 400, "a path outside the version"),
        ("/", {"anything": "1"}, 400, "unknown parameter"),
    ]
    for path, params, code, reason in cases:
        status, body = get(f"{url}{path}?{urllib.parse.urlencode(params)}")
        assert (status, reason in body) == (code, True), (path, params, status, body[-600:])
        assert "the-secret-content" not in body
    assert proc.poll() is None  # the server is still up


def test_the_server_binds_loopback_only_unless_told_and_then_warns(served, tmp_path):
    import psutil

    _, c, url, proc = served
    assert urllib.parse.urlparse(url).hostname == "127.0.0.1"
    listening = [x.laddr for x in psutil.Process(proc.pid).net_connections() if x.status == psutil.CONN_LISTEN]
    assert [addr.ip for addr in listening] == ["127.0.0.1"]
    # An address of the documentation range (RFC 5737) warns, then cannot be bound here: nothing is exposed.
    run = subprocess.run(
        [sys.executable, str(REPO / "pipelines" / "explore.py"), c.output, "--host", "192.0.2.1", "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "WARNING: serving on 192.0.2.1, not 127.0.0.1" in run.stderr
    assert "error: " in run.stderr and "explorer: http" not in run.stdout


def test_the_static_audit_and_the_curation_run_name_the_explorer(run_a, tmp_path):
    import mlflow

    from curation.audit.record import EXPLORE_TAG, explore_command
    from pipelines.audit import main

    assert main([run_a.output, "--samples", "1", "--kept-samples", "1", "--out", str(tmp_path / "report.html")]) == 0
    html = (tmp_path / "report.html").read_text()
    assert explore_command(run_a.output) in html
    run = mlflow.MlflowClient(run_a.cfg.tracking.uri).get_run(run_a.result.mlflow_run_id)
    assert run.data.tags[EXPLORE_TAG] == explore_command(run_a.output) == f"python pipelines/explore.py {run_a.output}"
