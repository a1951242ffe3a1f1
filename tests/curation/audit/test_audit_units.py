"""The audit's pieces on tiny handmade inputs (no Ray, no browser)."""

from __future__ import annotations

import copy
import io
import random
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from curation.audit import counts, images, settings
from curation.config import InputConfig
from curation.partitions import plan_partitions
from curation.readers import read_partition


def jpeg(colour: str, size=(64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="JPEG")
    return buf.getvalue()


def read_all(uri: str) -> dict[str, tuple[str, bytes]]:
    """key -> (source, raw bytes) exactly as the curation readers produce them."""
    cfg = InputConfig(uri=uri)
    rows = [r for p in plan_partitions(cfg) for t in read_partition(p, cfg, 1 << 30) for r in t.to_pylist()]
    return {r["key"]: (r["source"], r["raw"]) for r in rows}


def test_fetch_returns_the_bytes_the_readers_read_from_files_tars_and_parquet(tmp_path):
    (tmp_path / "folder" / "sub").mkdir(parents=True)
    (tmp_path / "folder" / "sub" / "a.jpg").write_bytes(jpeg("red"))
    with tarfile.open(tmp_path / "shard.tar", "w") as tar:
        for name, data in (("dir/x.JPG", jpeg("green")), ("y.jpg", jpeg("blue")), ("y.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    table = pa.table({"key": ["p0", "p1", "p2"], "image": [jpeg("white"), jpeg("black"), jpeg("gray")]})
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=1)

    for uri in (tmp_path / "folder", tmp_path / "shard.tar", tmp_path / "rows.parquet"):
        read = read_all(str(uri))
        assert len(read) in (1, 2, 3)
        got = images.fetch({k: source for k, (source, _) in read.items()}, InputConfig(), 1 << 30)
        assert got == {k: raw for k, (_, raw) in read.items()}, uri
    missing = images.fetch(
        {"gone": str(tmp_path / "nope.jpg"), "gone-member": f"{tmp_path / 'shard.tar'}#zz.jpg"}, InputConfig(), 1 << 30
    )
    assert missing["gone"].startswith("source unavailable") and "not found" in missing["gone-member"]


def test_tiles_never_show_a_broken_image(tmp_path):
    (tmp_path / "good.jpg").write_bytes(jpeg("red", (640, 480)))
    (tmp_path / "junk.jpg").write_bytes(b"not an image at all" * 10)
    rows = [
        {
            "key": "good",
            "status": "dropped",
            "reason": "no_salient_person",
            "source": str(tmp_path / "good.jpg"),
            "person_boxes": [[10.0, 10.0, 200.0, 400.0]],
            "person_scores": [0.9],
        },
        {"key": "junk", "status": "dropped", "reason": "too_small", "source": str(tmp_path / "junk.jpg")},
        {
            "key": "err",
            "status": "error",
            "reason": "truncated",
            "error_message": "image file is truncated",
            "source": str(tmp_path / "good.jpg"),
        },
        {"key": "moved", "status": "dropped", "reason": "text", "source": str(tmp_path / "moved.jpg")},
    ]
    stats = {
        "steps": [
            {
                "name": "detector",
                "applied": True,
                "score_threshold": 0.5,
                "min_box_size": 300,
                "box_size_measure": "height",
            }
        ]
    }
    tiles = {t.key: t for t in images.tiles(rows, lambda r: [r["reason"]], config={}, stats=stats)}
    with Image.open(io.BytesIO(tiles["good"].jpeg)) as im:
        assert max(im.size) == images.THUMB_SIDE and im.format == "JPEG"
    assert tiles["junk"].jpeg is None and tiles["junk"].placeholder.startswith("not_an_image")
    assert tiles["err"].jpeg is None and tiles["err"].placeholder == "truncated: image file is truncated"
    assert tiles["moved"].jpeg is None and tiles["moved"].placeholder.startswith("source unavailable")


def test_samples_are_deterministic_whatever_the_row_order():
    rows = [{"key": f"k{i}"} for i in range(200)]
    first = images.sample(rows, 12)
    for seed in range(3):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        assert images.sample(shuffled, 12) == first
    assert len({r["key"] for r in first}) == 12 and images.sample(rows[:5], 12) == images.sample(rows[:5], 5)


def test_sources_are_grouped_by_folder_tar_or_parquet_file():
    assert counts.split_source("/in/a.tar#dir/k.jpg") == ("/in/a.tar", "dir/k.jpg")
    assert counts.split_source("/in/p.parquet#row=12") == ("/in/p.parquet", "row=12")
    assert counts.split_source("/in/x#y.jpg") == ("/in/x#y.jpg", None)
    group = counts.source_group
    assert group("/data/raw/people/a.jpg", "/data/raw") == "people"
    assert group("/data/raw/a.jpg", "/data/raw/") == "(top level)"
    assert group("/data/raw/shards/000.tar#sub/x.jpg", "/data/raw") == "shards/000.tar"
    assert group("s3://b/in/p.parquet#row=3", "s3://b/in") == "p.parquet"
    assert group("/elsewhere/x.jpg", "/data/raw") == "/elsewhere"


def test_config_changes_name_the_settings_that_explain_each_reason():
    old = {
        "name": "x",
        "output_dir": "/a",
        "geometry": {"min_short_side": 256, "max_aspect_ratio": 3.0},
        "detector": {"score_threshold": 0.3, "weights": "/m.onnx"},
        "content": {"text": {"enabled": True}},
        "tracking": {"uri": "sqlite:///a.db"},
    }
    new = copy.deepcopy(old)
    new["output_dir"], new["geometry"]["min_short_side"], new["detector"]["score_threshold"] = "/b", 500, 0.5
    new["tracking"]["uri"] = "sqlite:///b.db"
    new["dedup"] = {"exact": False}
    changes = settings.config_changes(old, new)
    assert [str(c) for c in changes] == [
        "dedup.exact: <absent> -> false",
        "detector.score_threshold: 0.3 -> 0.5",
        "geometry.min_short_side: 256 -> 500",
        'output_dir: "/a" -> "/b"',
        'tracking.uri: "sqlite:///a.db" -> "sqlite:///b.db"',
    ]
    assert [c.key for c in changes if c.bookkeeping] == ["output_dir", "tracking.uri"]
    assert settings.explaining("too_small", changes) == ["geometry.min_short_side"]
    assert settings.explaining("aspect_ratio", changes) == []
    assert settings.explaining("no_salient_person", changes) == ["detector.score_threshold"]
    assert settings.explaining("exact_duplicate", changes) == ["dedup.exact"]
    assert settings.explaining("near_duplicate", changes) == ["dedup.exact"]  # a dedup reason this code never saw
    steps = ["input", "decode", "geometry", "detector", "content.text", "dedup.exact"]
    assert settings.explain("text", "content.text", steps, changes) == [
        "upstream detector.score_threshold",
        "upstream geometry.min_short_side",
    ]
    assert settings.explain("aspect_ratio", "geometry", steps, changes) == ["upstream geometry.min_short_side"]


def test_runs_tagged_with_the_old_stage_name_still_count_as_producers(tmp_path):
    """Runs recorded before the tag became ``curate`` say ``curation``: read as producers until the
    next release; any other stage that logged the version is a user."""
    import mlflow

    from curation.audit.record import runs_of_version

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("stages", artifact_location=(tmp_path / "artifacts").as_uri())
    runs = {}
    for stage in ("curation", "curate", "pretrain"):
        run = client.create_run(experiment, tags={"humanvision.stage": stage, "dataset.id": "v1"})
        client.set_terminated(run.info.run_id)
        runs[stage] = run.info.run_id
    client.create_run(experiment, tags={"humanvision.stage": "curate", "dataset.id": "v2"})
    produced, used = runs_of_version(uri, "v1")
    assert sorted((r.stage, r.run_id) for r in produced) == [("curate", runs["curate"]), ("curation", runs["curation"])]
    assert [(r.stage, r.run_id) for r in used] == [("pretrain", runs["pretrain"])]
