"""The audit report of a real curation of the demo corpus, checked in headless Chromium.

Counts are read back from the rendered page's DOM and compared with the manifest counted
here, independently of the audit code.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from PIL import Image

from curation.output import CuratedOutput

pytestmark = pytest.mark.slow  # a real curation run (~40 s on 2 cores) and headless Chromium

PER_REASON, KEPT_SAMPLES = 12, 24


def manifest_rows(output: str) -> list[dict]:
    files = sorted(str(p) for p in (Path(output) / "manifest").glob("*.parquet"))
    return pads.dataset(files).to_table(columns=["key", "status", "reason", "source"]).to_pylist()


def audit_main(*argv: str) -> int:
    from pipelines.audit import main

    return main(list(argv))


def test_report_renders_in_chromium_and_its_counts_equal_the_manifest(run_a, open_html, tmp_path):
    assert audit_main(run_a.output) == 0
    html = Path(run_a.output) / "audit" / "report.html"
    loaded = open_html(html)
    page = loaded.page
    assert loaded.errors == [] and loaded.requests == [] and loaded.outside_references() == []
    images = loaded.images()
    assert images["bad"] == [] and images["loaded"] == images["total"] >= 8 + 10  # charts + thumbnails

    rows = manifest_rows(run_a.output)
    status = Counter(r["status"] for r in rows)
    reasons = Counter((r["status"], r["reason"]) for r in rows if r["status"] != "kept")
    totals = {c["name"]: int(c["value"]) for c in loaded.rows("#totals .card")}
    assert totals["inputs"] == len(rows)
    assert (totals["kept"], totals["dropped"], totals["errors"]) == (status["kept"], status["dropped"], status["error"])

    funnel = loaded.rows("#funnel-table tbody tr")
    assert int(funnel[0]["in"]) == len(rows) and int(funnel[-1]["out"]) == status["kept"]
    by_reason = Counter(r["reason"] for r in rows if r["reason"])
    seen = set()
    for before, step in zip([None] + funnel[:-1], funnel):
        removed = json.loads(step["reasons"])
        assert removed == {r: by_reason[r] for r in removed}, step["step"]
        assert int(step["in"]) - int(step["out"]) == int(step["removed"]) == sum(removed.values())
        assert before is None or before["out"] == step["in"]
        seen |= set(removed)
    assert seen == set(by_reason)  # every reason in the manifest is accounted to one stage

    table = {(r["status"], r["reason"]): int(r["count"]) for r in loaded.rows("#reasons-table tbody tr")}
    assert table == dict(reasons)
    sources = loaded.rows("#sources-table tbody tr")
    assert sum(int(s["inputs"]) for s in sources) == len(rows)
    people = next(s for s in sources if s["group"] == "people")
    assert int(people["inputs"]) == sum("/people/" in r["source"] for r in rows)

    # Real charts: one per applied filter score, with the threshold marked, plus people charts.
    charts = {c["score"]: c for c in loaded.rows("img.chart[data-score]")}
    assert {"short_side", "aspect_ratio", "person_score_max", "text_coverage", "person_count", "box_size"} <= set(
        charts
    )
    assert float(charts["short_side"]["threshold"]) == run_a.cfg.geometry.min_short_side
    assert float(charts["person_score_max"]["threshold"]) == run_a.cfg.detector.threshold

    # Galleries: one per removal reason; dropped images show pixels read from their sources,
    # inputs that were errors show a placeholder with their reason, never a broken image.
    galleries = {g["reason"]: int(g["total"]) for g in loaded.rows("#removed-gallery .gallery")}
    assert galleries == {reason: n for (_, reason), n in reasons.items()}
    removed_tiles = loaded.rows("#removed-gallery figure.tile")
    assert Counter(t["reason"] for t in removed_tiles) == {r: min(n, PER_REASON) for r, n in galleries.items()}
    for tile in removed_tiles:
        assert (tile.get("placeholder") == "true") == (tile["status"] == "error"), tile
    placeholder_imgs = page.eval_on_selector_all("figure.tile[data-placeholder] img", "els => els.length")
    assert placeholder_imgs == 0
    kept_tiles = loaded.rows("#kept-gallery figure.tile")
    assert len(kept_tiles) == min(KEPT_SAMPLES, status["kept"])
    assert all(t["status"] == "kept" and "placeholder" not in t for t in kept_tiles)

    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    with Image.open(shot) as im:
        assert im.format == "PNG" and im.width == 1400 and im.height > 3000


def test_report_is_logged_to_the_curation_run(run_a):
    import mlflow

    if not (Path(run_a.output) / "audit" / "report.html").is_file():
        assert audit_main(run_a.output) == 0
    client = mlflow.MlflowClient(run_a.cfg.tracking.uri)
    run = client.get_run(run_a.result.mlflow_run_id)
    assert run.data.tags["audit.report"] == "audit/report.html"
    assert "audit/report.html" in [a.path for a in client.list_artifacts(run.info.run_id, "audit")]


def test_terminal_summary_gives_counts_by_stage_and_reason(run_a, capsys):
    assert audit_main(run_a.output, "--summary") == 0
    out = capsys.readouterr().out
    rows = manifest_rows(run_a.output)
    for (status, reason), n in Counter((r["status"], r["reason"]) for r in rows if r["status"] != "kept").items():
        assert re.search(rf"^\s+{status}\s+{reason}\s+{n}\s", out, re.M), (status, reason, n)
    kept = sum(r["status"] == "kept" for r in rows)
    last = CuratedOutput.at(run_a.output).stats()["funnel"][-1]["step"]  # steps disabled in the run are left out
    assert re.search(rf"^{last}\s+\d+\s+{kept}\s", out, re.M)
    assert f"inputs={len(rows)} kept={kept}" in out and "WARNING" not in out


def test_a_version_id_alone_finds_the_output(run_a, capsys, tmp_path):
    out = tmp_path / "by-id.html"
    assert (
        audit_main(
            run_a.result.dataset_id,
            "--tracking-uri",
            run_a.cfg.tracking.uri,
            "--out",
            str(out),
            "--no-mlflow",
            "--samples",
            "2",
            "--kept-samples",
            "2",
        )
        == 0
    )
    assert f"dataset version {run_a.result.dataset_id}" in capsys.readouterr().out and out.stat().st_size > 10_000
    assert audit_main("0000000000000000", "--tracking-uri", run_a.cfg.tracking.uri, "--summary") == 2
    assert "dataset version with id or name '0000000000000000'" in capsys.readouterr().err


def test_the_browser_check_catches_broken_pages(open_html, tmp_path):
    """The checks above are not vacuous: a broken image, a console error and an outside URL are all caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
        '<img alt="broken" src="data:image/png;base64,AAAA"><img alt="remote" src="http://127.0.0.1:9/x.png">'
        '<script>console.error("boom")</script></body></html>'
    )
    loaded = open_html(bad)
    assert set(loaded.images()["bad"]) == {"broken", "remote"}
    assert any("boom" in e for e in loaded.errors) and any("127.0.0.1:9" in e for e in loaded.errors)
    assert loaded.outside_references() == ["http://127.0.0.1:9/x.png"] and loaded.requests
