"""Dataset version digests, the version diff (API, terminal and page in Chromium) and the MLflow record.

Runs A and B curate the demo corpus with one configuration into two folders; C raises
``geometry.min_short_side`` from 256 to 500 (conftest).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from PIL import Image

from curation.audit import diff_summary, diff_versions, load_version

pytestmark = pytest.mark.slow  # three real curation runs (~1 minute on 2 cores)


def kept_too_small_for_c(a, c) -> set[str]:
    """Keys A kept whose short side is below C's min_short_side: what C must remove (counted here)."""
    files = sorted(str(p) for p in (Path(a.output) / "manifest").glob("*.parquet"))
    rows = pads.dataset(files).to_table(columns=["key", "status", "width", "height"]).to_pylist()
    limit = c.cfg.geometry.min_short_side
    return {r["key"] for r in rows if r["status"] == "kept" and min(r["width"], r["height"]) < limit}


def test_identical_runs_give_identical_digests(runs_abc):
    a, b, _ = runs_abc
    assert a.output != b.output and a.result.dataset_id == b.result.dataset_id
    d = diff_versions(load_version(a.output), load_version(b.output))
    assert d.added == [] and d.removed == [] and d.kept_in_both == a.result.stats["kept"]
    assert [(c.key, c.bookkeeping) for c in d.config_changes] == [("output_dir", True), ("tracking.uri", True)]


def test_each_run_registers_the_version_with_name_digest_source_schema_and_profile(runs_abc):
    import mlflow

    for r in runs_abc:
        run = mlflow.MlflowClient(r.cfg.tracking.uri).get_run(r.result.mlflow_run_id)
        assert run.data.tags["dataset.id"] == r.result.dataset_id and run.data.tags["dataset.uri"] == r.output
        (record,) = run.inputs.dataset_inputs
        ds = record.dataset
        assert (ds.name, ds.digest) == (run.data.tags["dataset.name"], r.result.dataset_id)
        # A run's input names a folder holding its version (MLflow keeps one dataset record per
        # name and digest in a store); the run's own dataset.uri tag names its own folder.
        holders = {x.output for x in runs_abc if x.result.dataset_id == r.result.dataset_id}
        assert json.loads(ds.source)["uri"] in holders
        assert {"key", "status", "reason", "sha256"} <= {c["name"] for c in json.loads(ds.schema)["mlflow_colspec"]}
        assert json.loads(ds.profile)["kept"] == r.result.stats["kept"]


def test_a_threshold_change_changes_the_digest_and_the_diff_explains_it(runs_abc):
    a, _, c = runs_abc
    assert c.result.dataset_id != a.result.dataset_id
    expected = kept_too_small_for_c(a, c)
    assert expected  # the demo corpus has kept people photos between 256 and 500 px
    d = diff_versions(load_version(a.output), load_version(c.output))
    assert d.added == [] and {x.key for x in d.removed} == expected
    for x in d.removed:
        assert (x.other_status, x.other_reason, x.explained_by) == (
            "dropped",
            "too_small",
            ("geometry.min_short_side",),
        )
    content = [(ch.key, ch.old, ch.new) for ch in d.config_changes if not ch.bookkeeping]
    old, new = a.cfg.geometry.min_short_side, c.cfg.geometry.min_short_side
    assert content == [("geometry.min_short_side", old, new)]
    text = diff_summary(d)
    assert f"geometry.min_short_side: {old} -> {new}" in text and all(k in text for k in expected)
    # Backwards, the same images are added, with the reason C did not keep them.
    back = diff_versions(load_version(c.output), load_version(a.output))
    assert back.removed == [] and {x.key for x in back.added} == expected
    assert {(x.other_reason, x.explained_by) for x in back.added} == {("too_small", ("geometry.min_short_side",))}


def test_diff_page_renders_in_chromium_and_names_the_change(runs_abc, open_html, tmp_path):
    import mlflow

    from pipelines.audit import main

    a, _, c = runs_abc
    assert main(["--diff", a.output, c.output]) == 0
    html = Path(c.output) / "audit" / f"diff-{a.result.dataset_id}.html"
    loaded = open_html(html)
    assert loaded.errors == [] and loaded.requests == [] and loaded.outside_references() == []
    images = loaded.images()
    assert images["bad"] == [] and images["loaded"] == images["total"] >= 2

    expected = kept_too_small_for_c(a, c)
    removed = {r["key"]: r for r in loaded.rows("#removed-table tbody tr")}
    assert set(removed) == expected
    assert {(r["reason"], r["explainedBy"]) for r in removed.values()} == {("too_small", "geometry.min_short_side")}
    changes = {r["key"]: r for r in loaded.rows("#config-changes tbody tr")}
    assert (changes["geometry.min_short_side"]["old"], changes["geometry.min_short_side"]["new"]) == (
        str(a.cfg.geometry.min_short_side),
        str(c.cfg.geometry.min_short_side),
    )
    assert (
        changes["geometry.min_short_side"]["bookkeeping"] == "false" and changes["output_dir"]["bookkeeping"] == "true"
    )
    tiles = loaded.rows("#removed figure.tile")
    assert {t["key"] for t in tiles} == expected and not any("placeholder" in t for t in tiles)
    assert loaded.rows("#diff-totals .card[data-name=added]")[0]["value"] == "0"

    shot = tmp_path / "diff.png"
    loaded.page.screenshot(path=str(shot), full_page=True)
    with Image.open(shot) as im:
        assert im.format == "PNG" and im.height > 1000
    client = mlflow.MlflowClient(c.cfg.tracking.uri)
    artifacts = [x.path for x in client.list_artifacts(c.result.mlflow_run_id, "audit")]
    assert f"audit/diff-{a.result.dataset_id}.html" in artifacts


def test_a_training_run_finds_the_shards_by_version_id_alone(runs_abc):
    import mlflow

    from curation.audit.record import runs_of_version
    from curation.output import resolve_dataset
    from infra.tracking import get_experiment_id, make_dataset

    _, _, c = runs_abc
    uri = c.cfg.tracking.uri
    version = resolve_dataset(c.result.dataset_id, tracking_uri=uri)
    assert list(version.shards) == sorted(c.result.shards) and version.run_id == c.result.mlflow_run_id
    with_samples = 0
    for shard in version.shards:
        with tarfile.open(shard) as tar:
            with_samples += sum(n.endswith(".jpg") for n in tar.getnames())
    assert with_samples == version.num_samples == c.result.stats["kept"]

    # A training run records the version it read (as an input and a tag); the version still
    # resolves to the curation run's shards, and the audit lists the training run as a user.
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(
        experiment_id=get_experiment_id("test-audit-training", uri),
        tags={"humanvision.stage": "pretrain", "dataset.id": version.id},
    ) as run:
        mlflow.log_input(make_dataset(version.name, version.id, version.uri), context="training")
    again = resolve_dataset(c.result.dataset_id, tracking_uri=uri)
    assert again.shards == version.shards and again.run_id == c.result.mlflow_run_id
    produced, used = runs_of_version(uri, version.id)
    assert [(r.run_id, r.stage) for r in produced] == [(c.result.mlflow_run_id, "curate")]
    assert [(r.run_id, r.stage) for r in used] == [(run.info.run_id, "pretrain")]
