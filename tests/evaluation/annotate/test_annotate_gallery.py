"""The gallery page of the session's annotation of the curated demo, in a real browser (Debian's
chromium): every image loads, nothing is fetched from outside, no console error; one panel per
task beside each sample's image, the seg legend; logged to and linked from the MLflow run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # needs the session's curation and annotation


def test_the_gallery_is_self_contained_and_shows_every_task(annotated, open_html):
    cfg, result, _ = annotated
    page = Path(result.gallery)
    assert page.parent == Path(cfg.output_dir) and page.is_file()
    loaded = open_html(page)
    images = loaded.images()
    assert images["total"] > 0 and images["loaded"] == images["total"], images["bad"]
    assert loaded.errors == [] and loaded.requests == [] and loaded.outside_references() == []
    samples = loaded.rows(".sample")
    assert len(samples) == min(cfg.gallery.samples, result.stats["ok"])
    panels = loaded.page.eval_on_selector_all(
        ".sample", "els => els.map(e => Array.from(e.querySelectorAll('figure')).map(f => f.dataset.panel))"
    )
    assert all(p == ["image", "pose", "seg", "normal", "pointmap depth"] for p in panels), panels
    legend = loaded.rows(".legend [data-class]")
    assert legend and all(int(x["class"]) < 29 for x in legend)


def test_the_gallery_is_an_artifact_of_the_run_and_linked_from_it(annotated):
    from mlflow import MlflowClient

    cfg, result, _ = annotated
    tags = MlflowClient(cfg.tracking.uri).get_run(result.mlflow_run_id).data.tags
    assert tags["annotate.gallery"] == "gallery/gallery.html"
    assert tags["annotate.gallery_uri"].endswith("/gallery/gallery.html")
    assert f"]({tags['annotate.gallery_uri']})" in tags["mlflow.note.content"]
