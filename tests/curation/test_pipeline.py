"""End to end on the demo corpus with the real CenterNet detector, on a local Ray cluster."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import yaml

from curation.config import InputConfig
from curation.filters.geometry import GeometryConfig
from curation.filters.person import DetectorConfig
from curation.job import job_digest
from curation.pipeline import run_curation
from curation.recipe import CurationConfig, weightless_content_filters
from infra.tracking import TrackingConfig


def demo_config(raw: Path, out: Path, centernet: Path, **overrides) -> CurationConfig:
    return CurationConfig(
        input=InputConfig(uri=str(raw), images_per_partition=8),
        output_dir=str(out),
        geometry=GeometryConfig(min_short_side=256),
        detector=DetectorConfig(
            backend="centernet_onnx",
            weights=str(centernet),
            score_threshold=0.3,
            min_box_size=200,
            batch_size=4,
            num_cpus=0.5,
        ),
        content=weightless_content_filters(),
        tracking=TrackingConfig(uri=f"sqlite:///{out.parent / 'mlflow.db'}", experiment="test-curation"),
        **overrides,
    )


def read_manifest(out: Path):
    return pads.dataset(sorted(str(p) for p in (out / "manifest").glob("*.parquet"))).to_table()


@pytest.fixture(scope="module")
def curated(demo_curated):
    """The session's curated demo (tests/conftest.py)."""
    return demo_curated


def test_every_input_gets_its_expected_status_and_reason(curated):
    root, expected, _, _ = curated
    manifest = read_manifest(root / "curated")
    by_source = {Path(r["source"]).relative_to(root / "raw").as_posix(): r for r in manifest.to_pylist()}
    assert set(by_source) == set(expected)  # one manifest row per input file, no more, no less
    for rel, (status, reason) in expected.items():
        row = by_source[rel]
        assert row["status"] == status, (rel, row["status"], row["reason"])
        if status != "kept":
            assert row["reason"] == reason, (rel, row["reason"])
        elif reason is not None:
            assert reason in row["notes"], (rel, row["notes"])
    bus = by_source["people/bus.jpg"]["key"]
    for rel in ("reposts/bus_repost.jpg", "reposts/bus_small.jpg", "reposts/bus_mirror_small.jpg"):
        assert by_source[rel]["duplicate_of"] == bus, rel  # exact copy, resized copy, mirrored copy
    assert (
        by_source["reposts/bus_small.jpg"]["duplicate_group"]
        == by_source["reposts/bus_mirror_small.jpg"]["duplicate_group"]
    )
    # dedup runs before the models: a family is decided by its representative, here the captioned meme
    hopper, meme = by_source["people/grace_hopper.jpg"], by_source["web/hopper_meme.jpg"]
    assert hopper["duplicate_of"] == meme["key"] and meme["reason"] == "text"
    assert hopper["person_count"] is None  # never scored: the detector saw only the representative


def test_real_detector_keeps_people_and_drops_scenes(curated):
    root, _, _, _ = curated
    rows = {Path(r["source"]).name: r for r in read_manifest(root / "curated").to_pylist()}
    for name in ("zidane.jpg", "astronaut.jpg", "bus.jpg"):
        assert rows[name]["status"] == "kept" and rows[name]["salient_person_count"] >= 1
        assert len(rows[name]["person_boxes"]) == len(rows[name]["person_scores"]) >= 1
    for name in ("coffee.jpg", "rocket.jpg", "chelsea.jpg"):
        assert rows[name]["reason"] == "no_salient_person"
    # every person box is recorded, not only the best: bus.jpg shows several people
    assert rows["bus.jpg"]["person_count"] >= 3 and len(rows["bus.jpg"]["person_boxes"]) >= 3


def test_accounting_reconciles_with_the_shards(curated):
    root, expected, _, result = curated
    stats = json.loads((root / "curated" / "stats.json").read_text())
    manifest = read_manifest(root / "curated")
    statuses = manifest.column("status").to_pylist()
    assert stats["inputs"] == len(expected) == manifest.num_rows
    assert stats["kept"] + stats["dropped"] + stats["errors"] == stats["inputs"]
    assert stats["kept"] == statuses.count("kept") and stats["errors"] == statuses.count("error")
    in_tars = []
    for tar_path in sorted((root / "curated" / "shards").glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            names = tar.getnames()
        assert len(names) == 2 * len({n.split(".")[0] for n in names})  # jpg + json per sample
        in_tars += [n[:-4] for n in names if n.endswith(".jpg")]
    kept_keys = sorted(r["key"] for r in manifest.to_pylist() if r["status"] == "kept")
    assert sorted(in_tars) == kept_keys and stats["samples_in_shards"] == len(in_tars)
    assert stats["reconciled"] is True
    assert (root / "curated" / "_SUCCESS").is_file() and not (root / "curated" / "_staging").exists()
    assert not [p for p in (root / "curated").rglob("*") if ".tmp-" in p.name]


def test_shards_stream_with_the_webdataset_library(curated):
    import webdataset as wds

    root, _, _, _ = curated
    urls = [str(p) for p in sorted((root / "curated" / "shards").glob("*.tar"))]
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode("pil"))
    manifest = {r["key"]: r for r in read_manifest(root / "curated").to_pylist()}
    assert len(samples) == sum(1 for r in manifest.values() if r["status"] == "kept")
    for s in samples:
        meta, img = s["json"], s["jpg"]
        row = manifest[s["__key__"]]
        assert img.size == (row["width"], row["height"]) == (meta["width"], meta["height"])
        assert meta["person_boxes"] and len(meta["person_boxes"]) == len(meta["person_scores"])
        assert meta["sha256"] == row["sha256"] and meta["source"] == row["source"]


def test_shards_read_with_ray_data(curated):
    import ray.data

    root, _, _, result = curated
    # The shard URIs a dataset version resolves to (sidecar .parquet files sit beside the tars).
    ds = ray.data.read_webdataset(result.shards, decoder=None)
    rows = ds.take_all()
    assert len(rows) == result.stats["kept"]
    assert all(isinstance(r["jpg"], bytes) and r["jpg"][:2] == b"\xff\xd8" for r in rows)


def test_mlflow_records_config_counts_stats_and_dataset(curated):
    import mlflow

    root, _, cfg, result = curated
    mlflow.set_tracking_uri(cfg.tracking.uri)
    run = mlflow.get_run(result.mlflow_run_id)
    assert run.data.params["detector.backend"] == "centernet_onnx"
    assert run.data.params["geometry.min_short_side"] == "256"
    assert run.data.metrics["kept"] == result.stats["kept"]
    assert run.data.metrics["dropped.exact_duplicate"] == 1
    inputs = run.inputs.dataset_inputs
    assert len(inputs) == 1 and inputs[0].dataset.digest == result.dataset_id
    assert json.loads(inputs[0].dataset.profile)["kept"] == result.stats["kept"]
    client = mlflow.MlflowClient(cfg.tracking.uri)
    stats = json.loads(Path(client.download_artifacts(run.info.run_id, "stats.json", str(root))).read_text())
    assert stats["inputs"] == result.stats["inputs"]
    assert (root / "curated" / "config.yaml").read_text().count("centernet_onnx") == 1
    # the UI opens our experiments on runs, metrics and datasets, not on its GenAI view
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_rerun_reuses_and_other_config_is_refused(curated):
    root, _, cfg, result = curated
    again = run_curation(cfg)
    assert again.skipped and again.dataset_id == result.dataset_id
    # other resources (a different cluster shape) are the same job: recognised, not refused
    wider = demo_config(root / "raw", root / "curated", Path(cfg.detector.weights))
    wider.decode.num_cpus, wider.detector.num_actors, wider.detector.num_gpus = 0.5, 4, 0.25
    wider.content.text.num_cpus = 2.0
    assert job_digest(wider) == job_digest(cfg)
    again = run_curation(wider)
    assert again.skipped and again.dataset_id == result.dataset_id
    # the weights enter by content: the same file through a symlink, or a copy elsewhere, is the same job
    link = root / "linked" / "detector.onnx"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(Path(cfg.detector.weights))
    copy = root / "copied.onnx"
    copy.write_bytes(Path(cfg.detector.weights).read_bytes())
    for elsewhere in (link, copy):
        moved = demo_config(root / "raw", root / "curated", elsewhere)
        assert job_digest(moved) == job_digest(cfg)
        assert run_curation(moved).skipped
    written = yaml.safe_load((root / "curated" / "config.yaml").read_text())  # the config it ran, paths as given
    assert written["detector"]["weights"] == str(cfg.detector.weights)
    altered = root / "altered.onnx"
    altered.write_bytes(copy.read_bytes() + b"\0")  # other bytes, other job
    assert job_digest(demo_config(root / "raw", root / "curated", altered)) != job_digest(cfg)
    changed = demo_config(root / "raw", root / "curated", Path(cfg.detector.weights))
    changed.geometry.min_short_side = 100
    with pytest.raises(ValueError, match="different configuration"):
        run_curation(changed)


def test_an_earlier_version_enters_the_job_by_its_id_not_its_location(curated, tmp_path):
    import dataclasses
    import shutil

    root, _, cfg, result = curated
    copied = tmp_path / "elsewhere" / "v1"
    shutil.copytree(root / "curated", copied)  # the same version (same _SUCCESS id) at another path

    def incremental(against: Path, locations: tuple[str, ...] = ()):
        c = demo_config(root / "raw", tmp_path / "v2", Path(cfg.detector.weights))
        c.dedup.against = str(against)
        c.dedup.near = dataclasses.replace(c.dedup.near, index_locations=locations)
        return c

    here = job_digest(incremental(root / "curated"))
    assert job_digest(incremental(copied)) == here
    assert job_digest(incremental(root / "curated", (str(copied),))) == here  # where parts lie: not identity
    assert here != job_digest(demo_config(root / "raw", tmp_path / "v2", Path(cfg.detector.weights)))
    (copied / "_SUCCESS").unlink()
    with pytest.raises(ValueError, match="not a finished curation output"):
        job_digest(incremental(copied))


def test_a_training_run_finds_the_shards_by_version_id_alone(curated):
    from curation.output import resolve_dataset

    root, _, cfg, result = curated
    by_id = resolve_dataset(result.dataset_id, tracking_uri=cfg.tracking.uri)
    assert list(by_id.shards) == sorted(result.shards) and by_id.run_id == result.mlflow_run_id
    assert by_id.num_samples == result.stats["kept"]
    by_folder = resolve_dataset(str(root / "curated"))
    assert by_folder.id == result.dataset_id and by_folder.shards == by_id.shards
    with pytest.raises(ValueError, match="no curated dataset version"):
        resolve_dataset("0000000000000000", tracking_uri=cfg.tracking.uri)
