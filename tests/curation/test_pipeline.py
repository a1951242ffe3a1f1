"""End to end on the demo corpus with the real CenterNet detector, on a local Ray cluster."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
import yaml

from curation.config import InputConfig
from curation.filters.geometry import GeometryConfig
from curation.filters.person import DetectorConfig
from curation.job import job_digest
from curation.pipeline import run_curation
from curation.recipe import CurationConfig, weightless_content_filters
from infra.config import load_config
from infra.tracking import TrackingConfig
from pipelines.curate import provide_model_code
from tests.conftest import REPO, TINY_REFERENCE

DEMO_YAML = REPO / "configs" / "curate_demo.yaml"


def demo_config(raw: Path, out: Path, centernet: Path, attributes: bool = False, **overrides) -> CurationConfig:
    """The curation tests' settings; ``attributes``: with configs/curate_demo.yaml's per-sample
    attributes (the backbone embedding on the shared reference weights, cluster ids)."""
    cfg = CurationConfig(
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
    if attributes:
        provide_model_code()
        shipped = load_config(
            CurationConfig, DEMO_YAML, ["input.uri=x", "output_dir=y", f"backbone_embedding.weights={TINY_REFERENCE}"]
        )
        cfg.backbone_embedding, cfg.clusters, cfg.input.num_cpus = (
            shipped.backbone_embedding,
            shipped.clusters,
            shipped.input.num_cpus,  # a third model pool beside the detector's and OCR's on 2 CPUs
        )
    return cfg


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


def test_attributes_stream_from_the_sidecars_and_agree_with_clusters_json(curated):
    """The per-sample attributes the pretraining loader samples by (issue 48's contract): person
    count and largest box in every sidecar and the manifest, cluster ids at each level nesting
    as clusters.json says, its counts those of the sidecars."""
    import hashlib

    import numpy as np
    import pyarrow.parquet as pq

    root, _, cfg, result = curated
    out = root / "curated"
    doc = json.loads((out / "clusters.json").read_text())
    wanted = ["key", "person_count", "person_max_area", "cluster_l0", "cluster_l1"]
    ids = []
    for sidecar in sorted((out / "shards").glob("*.parquet")):
        part = pq.read_table(sidecar, columns=wanted)  # one shard's attributes, nothing else read
        assert [part.schema.field(c).type for c in wanted[1:]] == [pa.int32(), pa.float32(), pa.int32(), pa.int32()]
        assert all(part.column(c).null_count == 0 for c in wanted)
        with tarfile.open(sidecar.with_suffix(".tar")) as tar:
            assert part.column("key").to_pylist() == [n[:-4] for n in tar.getnames() if n.endswith(".jpg")]
        ids.append(part)
    ids = pa.concat_tables(ids)
    assert ids.num_rows == result.stats["kept"] == sum(doc["levels"][0]["counts"].values())
    for level, spec in enumerate(doc["levels"]):
        column = ids.column(f"cluster_l{level}").to_numpy()
        assert 0 <= column.min() and column.max() < spec["k"] <= cfg.clusters.levels[level]
        assert spec["counts"] == {str(c): int(n) for c, n in zip(*np.unique(column, return_counts=True))}
    parent = {int(c): p for c, p in doc["parents"][1].items()}
    assert doc["parents"][0] is None and sorted(parent) == list(range(doc["levels"][1]["k"]))
    assert all(
        parent[f] == c for f, c in zip(ids.column("cluster_l1").to_pylist(), ids.column("cluster_l0").to_pylist())
    )
    assert doc["levels"][1]["k"] == result.stats["kept"] < cfg.clusters.levels[1]  # 14 kept: one per finest cluster
    sha = hashlib.sha256(TINY_REFERENCE.read_bytes()).hexdigest()
    assert doc["embedding"] == f"sapiens2_tiny:{sha} mean-pooled patch tokens at 128x96"

    manifest = read_manifest(out)
    for row in manifest.to_pylist():
        if row["status"] != "kept":
            assert row["cluster_l0"] is None and row["cluster_l1"] is None
            continue
        confident = [(b, s) for b, s in zip(row["person_boxes"], row["person_scores"]) if s >= 0.3]
        assert row["person_count"] == len(confident) >= 1
        area = max((b[2] - b[0]) * (b[3] - b[1]) for b, _ in confident) / (row["width"] * row["height"])
        assert row["person_max_area"] == pytest.approx(area, rel=1e-5) and 0 < area <= 1
        assert len(row["backbone_embedding"]) == 64
    steps = {s["name"]: s for s in result.stats["steps"]}
    assert steps["clusters"]["applied"] and steps["clusters"]["levels"] == [8, 32]
    assert steps["backbone_embedding"]["applied"] and steps["backbone_embedding"]["model"] == "sapiens2_tiny"
    import mlflow

    client = mlflow.MlflowClient(cfg.tracking.uri)
    logged = client.download_artifacts(result.mlflow_run_id, "clusters.json", str(root / "logged"))
    assert json.loads(Path(logged).read_text()) == doc


def test_the_attribute_settings_are_part_of_the_job(curated, tmp_path):
    root, _, cfg, _ = curated
    other_seed = demo_config(root / "raw", root / "curated", Path(cfg.detector.weights), attributes=True)
    other_seed.clusters.seed = 1
    assert job_digest(other_seed) != job_digest(cfg)
    copy = tmp_path / "tiny.safetensors"  # the checkpoint enters by content, not by path
    copy.write_bytes(TINY_REFERENCE.read_bytes())
    moved = demo_config(root / "raw", root / "curated", Path(cfg.detector.weights), attributes=True)
    moved.backbone_embedding.weights = str(copy)
    assert job_digest(moved) == job_digest(cfg)


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
    wider = demo_config(root / "raw", root / "curated", Path(cfg.detector.weights), attributes=True)
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
        moved = demo_config(root / "raw", root / "curated", elsewhere, attributes=True)
        assert job_digest(moved) == job_digest(cfg)
        assert run_curation(moved).skipped
    written = yaml.safe_load((root / "curated" / "config.yaml").read_text())  # the config it ran, paths as given
    assert written["detector"]["weights"] == str(cfg.detector.weights)
    altered = root / "altered.onnx"
    altered.write_bytes(copy.read_bytes() + b"\0")  # other bytes, other job
    assert job_digest(demo_config(root / "raw", root / "curated", altered, attributes=True)) != job_digest(cfg)
    changed = demo_config(root / "raw", root / "curated", Path(cfg.detector.weights), attributes=True)
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
