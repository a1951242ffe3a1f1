"""Dedup before the models, measured against the single pass it replaced. On 8 real photos + 2
byte-identical reposts (20% duplicates) the same recipe runs twice: as shipped (two passes: dedup,
then the models on the survivors) and as a single pass (the models on every row, dedup after
them). A counting step placed just before the detector in both writes the keys of every row it
scores to files (its actors run in other processes): measured, 8 rows in two passes, 10 in one;
the detector's own column agrees (8 against 10 rows scored) and the kept set is the same."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from curation.pipeline import run_curation
from curation.recipe import HUMANS1B
from curation.steps import Recipe
from pipelines.demo_corpus import _ultralytics_asset
from tests.conftest import IMAGES
from tests.curation.counting_step import COUNTED, CountingConfig, chunks, counted_config
from tests.curation.test_pipeline import demo_config

pytestmark = pytest.mark.slow


def single_pass_recipe() -> Recipe:
    """The order the two-pass change replaced: geometry, the models, then exact and near dedup.
    ``Recipe`` refuses it (a model step before the first dedup step scores every duplicate), so the
    order is set after that check; the pipeline still runs model steps in pass 1 (a Ray Data
    stream through their actor pools, ``score_partitions``)."""
    dedup = [s for s in COUNTED.steps if s.name in ("dedup.exact", "dedup.near")]
    rest = [s for s in COUNTED.steps if s not in dedup]
    at = [s.name for s in rest].index("dedup.semantic")
    recipe = Recipe(list(COUNTED.steps), job=HUMANS1B.job)
    recipe.steps = (*rest[:at], *dedup, *rest[at:])
    return recipe


def corpus(folder: Path, copies: int) -> Path:
    """Eight real photos (the shared ones and two of Ultralytics'), and ``copies`` byte-identical reposts."""
    folder.mkdir(parents=True)
    photos = sorted(IMAGES.iterdir()) + [_ultralytics_asset(n) for n in ("bus.jpg", "zidane.jpg")]
    for src in photos:
        shutil.copyfile(src, folder / src.name)
    for src in photos[:copies]:
        (folder / "reposts").mkdir(exist_ok=True)
        shutil.copyfile(src, folder / "reposts" / src.name)
    return folder


def manifest(out: Path) -> list[dict]:
    return pads.dataset(sorted(str(p) for p in (out / "manifest").glob("*.parquet"))).to_table().to_pylist()


def scored(rows: list[dict], column: str) -> int:
    """Rows a model step scored: it writes its column on every row it scores, and only there."""
    return sum(r[column] is not None for r in rows)


def run(recipe: Recipe, raw: Path, out: Path, centernet: Path) -> tuple[list[dict], list[str], int]:
    """(manifest rows, keys the counting step was given (one entry per row scored), passes)."""
    counts = out.parent / f"{out.name}-counts"
    counts.mkdir()
    cfg = counted_config(recipe, demo_config(raw, out, centernet, name=out.name), CountingConfig(folder=str(counts)))
    passes = len(recipe.build(cfg).passes())
    result = run_curation(cfg, recipe=recipe)
    assert result.stats["reconciled"]
    done = [c for c in chunks(counts) if c.done]
    assert len(done) == len(chunks(counts))  # no fault here: every chunk started also finished
    return manifest(out), [k for c in done for k in c.keys], passes


def test_models_see_no_duplicate_and_the_kept_set_is_unchanged(tmp_path, ray_local, centernet_path):
    raw = corpus(tmp_path / "raw", 2)
    two_rows, two_counted, two_passes = run(COUNTED, raw, tmp_path / "two", centernet_path)
    one_rows, one_counted, one_passes = run(single_pass_recipe(), raw, tmp_path / "one", centernet_path)
    assert (two_passes, one_passes) == (2, 1)
    assert len(two_rows) == len(one_rows) == 10  # 2 of 10 inputs are duplicates: 20%
    exact = {r["key"] for r in two_rows if r["reason"] == "exact_duplicate"}
    assert len(exact) == 2 and {r["key"] for r in one_rows if r["reason"] == "exact_duplicate"} == exact
    # Model calls, counted where they happen: the single pass scores every row, two passes the survivors.
    assert len(one_counted) == 10 and sorted(one_counted) == sorted(r["key"] for r in one_rows)
    assert len(two_counted) == 8 and set(two_counted) == {r["key"] for r in two_rows} - exact
    assert scored(one_rows, "person_count") == 10 and scored(two_rows, "person_count") == 8
    assert all(r["person_count"] is None and r["text_coverage"] is None for r in two_rows if r["key"] in exact)
    assert scored(two_rows, "text_coverage") > 0
    kept = {r["key"] for r in two_rows if r["status"] == "kept"}
    assert kept and kept == {r["key"] for r in one_rows if r["status"] == "kept"}
    # of identical bytes, the smallest key is the one kept
    smallest = {}
    for r in sorted(two_rows, key=lambda r: r["key"]):
        smallest.setdefault(r["sha256"], r["key"])
    assert all(smallest[r["sha256"]] == r["key"] for r in two_rows if r["status"] == "kept")
