"""The annotation job on the session's curated demo version (real photos, real CenterNet boxes),
tiny task models, on the session's local Ray: every kept sample annotated once, shards that pair
with the source shards, the version id, resume and refusal, the MLflow record; a version with a
corrupt and a missing sample over and within ``max_error_share``; and a model whose outputs the
post-processing cannot take."""

from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from evaluation.annotate import TooManyErrors, layout, run_annotation
from evaluation.annotate.annotator import AnnotationFailed
from evaluation.annotate.models import file_sha256
from models.sapiens_processing import select_people, whole_image_box
from pipelines.annotate import main
from tests.evaluation.annotate.conftest import annotate_config, npy, sample, write_version

pytestmark = pytest.mark.slow  # the session's curation and actor pools on a local Ray


def _tables(out: Path) -> dict[str, list[dict]]:
    return {p.stem: pq.read_table(p).to_pylist() for p in sorted((out / layout.ANNOTATIONS).glob("*.parquet"))}


def test_every_kept_sample_is_annotated_once_in_the_shard_it_came_from(annotated):
    cfg, result, curated = annotated
    out = Path(cfg.output_dir)
    kept = {}
    for side in sorted((curated / "shards").glob("*.parquet")):
        kept[side.stem] = pq.read_table(side, columns=["key"]).column("key").to_pylist()
    tables = _tables(out)
    assert {s: [r["key"] for r in rows] for s, rows in tables.items()} == kept  # same shards, keys and order
    rows = [r for rs in tables.values() for r in rs]
    assert {r["status"] for r in rows} == {"ok"} and result.stats["samples"] == len(rows) == sum(
        map(len, kept.values())
    )
    assert result.stats["ok"] == len(rows) and result.stats["shards"] == len(kept)
    done = json.loads((out / "_SUCCESS").read_text())
    assert done["annotation_version_id"] == result.version_id and done["dataset_id"] == result.dataset_id
    assert done["models"]["seg"]["checkpoint_sha256"] == file_sha256(cfg.tasks.seg.checkpoint)
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]


def test_pose_runs_on_the_recorded_boxes_and_maps_come_at_the_image_size(annotated):
    cfg, _, curated = annotated
    side = {r["key"]: r for p in (curated / "shards").glob("*.parquet") for r in pq.read_table(p).to_pylist()}
    for rows in _tables(Path(cfg.output_dir)).values():
        for r in rows:
            src = side[r["key"]]
            found = np.float32(src["person_boxes"]).reshape(-1, 4)
            kept = [src["person_boxes"][i] for i in select_people(found, src["person_scores"])]  # released rules
            boxes = kept[:3] or [whole_image_box((src["height"], src["width"])).tolist()]
            assert np.allclose(r["pose_boxes"], boxes) and np.asarray(r["pose_keypoints"]).shape == (len(boxes), 308, 2)
            assert (r["width"], r["height"]) == (src["width"], src["height"])
            assert npy(r["normal_npy"]).shape == npy(r["pointmap_npy"]).shape == (src["height"], src["width"], 3)
            assert r["pointmap_scale"] > 0


def test_annotation_shards_pair_with_the_source_shards_in_webdataset(annotated):
    import webdataset as wds

    cfg, _, curated = annotated
    sources = sorted(str(p) for p in (curated / "shards").glob("*.tar"))
    labels = sorted(str(p) for p in (Path(cfg.output_dir) / layout.ANNOTATIONS).glob("*.tar"))
    assert [Path(p).stem for p in sources] == [Path(p).stem for p in labels]
    pairs = list(
        zip(
            wds.WebDataset(sources, shardshuffle=False).decode("pil"),
            wds.WebDataset(labels, shardshuffle=False).decode("pil"),
        )
    )
    assert pairs and all(a["__key__"] == b["__key__"] for a, b in pairs)
    for image, ann in pairs:
        assert {"json", "seg.png", "normal.npy", "pointmap.npy"} <= set(ann)
        assert ann["seg.png"].size == image["jpg"].size and ann["normal.npy"].dtype == np.float32
        assert ann["json"]["status"] == "ok" and len(ann["json"]["pose_keypoints"]) == len(ann["json"]["pose_boxes"])


def test_a_rerun_is_recognised_and_another_configuration_is_refused(annotated):
    cfg, result, _ = annotated
    again = run_annotation(dataclasses.replace(cfg, actors=dataclasses.replace(cfg.actors, num_actors=1)))
    assert again.skipped and again.version_id == result.version_id  # resources are not the version
    other = dataclasses.replace(
        cfg, tasks=dataclasses.replace(cfg.tasks, pose=dataclasses.replace(cfg.tasks.pose, max_people=2))
    )
    with pytest.raises(ValueError, match="holds annotations of another job"):
        run_annotation(other)


def test_mlflow_records_lineage_params_the_input_version_and_small_artifacts(annotated):
    from mlflow import MlflowClient

    cfg, result, curated = annotated
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(result.mlflow_run_id)
    tags, params = run.data.tags, run.data.params
    assert tags["humanvision.stage"] == "annotate" and tags["annotate.version_id"] == result.version_id
    assert tags["lineage.dataset_id"] == result.dataset_id
    for task in ("pose", "seg", "normal", "pointmap"):
        assert tags[f"annotate.{task}.checkpoint_sha256"] == file_sha256(cfg.tasks.of(task).checkpoint)
    assert params["tasks.pose.min_box_score"] == "0.3" and run.data.metrics["samples"] == result.stats["samples"]
    assert [i.dataset.digest for i in run.inputs.dataset_inputs] == [result.dataset_id]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "annotate_stats.json", "gallery"} <= artifacts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "gallery")] == ["gallery/gallery.html"]


NAMES = ("obama.jpg", "messi5.jpg")


def _mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted((out / layout.ANNOTATIONS).glob("*"))}


def test_too_many_bad_samples_fail_the_job_after_writing_and_a_higher_share_finishes_it(
    tiny_models, tmp_path, ray_local, capsys
):
    good = [sample(f"a{i}", n, [(0.1, 0.1, 0.6, 0.95)], [0.9]) for i, n in enumerate(("obama.jpg", "messi5.jpg"))]
    corrupt = {**sample("b0", "obama2.jpg", [(0.2, 0.1, 0.8, 0.9)], [0.8]), "image": b"\xff\xd8\xff not a jpeg"}
    gone = sample("b1", "franz_kafka.jpg", [(0.2, 0.1, 0.8, 0.9)], [0.8])
    dataset = write_version(tmp_path / "curated", [[good[0], corrupt], [gone, good[1]]], in_tar=lambda k: k != "b1")
    out = tmp_path / "out"
    cfg = annotate_config(dataset, out, tiny_models, tasks=("pose", "seg"), **{"actors.num_actors": 1})
    with pytest.raises(TooManyErrors) as failed:
        run_annotation(cfg)
    assert str(failed.value).startswith(
        "2 of 4 samples (50.0%) were not annotated, over max_error_share=0.05: decode_failed 1, missing_image 1; "
    )
    rows = {r["key"]: r for rs in _tables(out).values() for r in rs}  # written all the same
    assert {k: (r["status"], r["reason"]) for k, r in rows.items()} == {
        "a0": ("ok", None),
        "b0": ("error", "decode_failed"),
        "b1": ("missing", "missing_image"),
        "a1": ("ok", None),
    }
    assert rows["b0"]["error"] == "UnidentifiedImageError: cannot identify image file <sample 'b0'>"
    assert "no image of sample 'b1'" in rows["b1"]["error"]
    assert rows["b0"]["seg_png"] is None and rows["a1"]["seg_png"]
    for shard in ("000000", "000001"):  # the annotation tar holds the source tar's keys: they pair up
        names = [tarfile.open(tmp_path / d / f"{shard}.tar").getnames() for d in ("curated/shards", "out/annotations")]
        assert [n.split(".")[0] for n in names[0] if n.endswith(".jpg")] == [
            n[:-5] for n in names[1] if n.endswith(".json")
        ]
    counts = json.loads((out / "_FAILED").read_text())
    assert not (out / "_SUCCESS").exists() and counts["failure"] == str(failed.value)
    assert (counts["samples"], counts["ok"], counts["errors"], counts["missing"]) == (4, 2, 1, 1)
    assert counts["reasons"] == {"decode_failed": 1, "missing_image": 1} and counts["error_share"] == 0.5
    written = _mtimes(out)

    # the same job from the command line: exit 1 and the reasons on stderr, no shard redone
    capsys.readouterr()
    assert main(["--config", str(out / "config.yaml")]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {failed.value}"
    # a share the job is within: it finishes from the shards written, with the counts
    assert main(["--config", str(out / "config.yaml"), "max_error_share=0.5"]) == 0
    summary = capsys.readouterr().out
    assert (
        "2 ok, 1 error, 1 missing" in summary
        and "not annotated, by reason: decode_failed 1, missing_image 1" in summary
    )
    done = json.loads((out / "_SUCCESS").read_text())
    assert (done["samples"], done["ok"], done["reasons"], done["max_error_share"]) == (4, 2, counts["reasons"], 0.5)
    assert not (out / "_FAILED").exists() and _mtimes(out) == written
    with pytest.raises(TooManyErrors, match=r"over max_error_share=0.25: .* counts are in .*_SUCCESS$"):
        run_annotation(dataclasses.replace(cfg, max_error_share=0.25))  # a finished version, checked


def test_a_shard_redone_after_a_kill_gives_the_same_bytes_error_rows_included(tiny_models, tmp_path, ray_local):
    shards = [[sample(f"s{i}{j}", n, [(0.1, 0.1, 0.6, 0.95)], [0.9]) for j, n in enumerate(NAMES)] for i in range(3)]
    shards[1][0] = {**shards[1][0], "image": b"\xff\xd8\xff not a jpeg"}
    dataset = write_version(tmp_path / "curated", shards)
    out = tmp_path / "out"
    cfg = annotate_config(dataset, out, tiny_models, tasks=("seg",), **{"actors.num_actors": 1, "max_error_share": 0.5})
    first = run_annotation(cfg)
    files = {p.name: p.read_bytes() for p in sorted((out / layout.ANNOTATIONS).glob("*"))}
    (out / "_SUCCESS").unlink()  # as a kill before shard 000001's table (its commit marker) was written
    (out / layout.ANNOTATIONS / "000001.parquet").unlink()
    again = run_annotation(cfg)
    assert (first.stats["session_shards"], again.stats["session_shards"]) == (3, 1)
    assert {p.name: p.read_bytes() for p in sorted((out / layout.ANNOTATIONS).glob("*"))} == files
    assert (again.stats["samples"], again.stats["ok"], again.stats["reasons"]) == (6, 5, {"decode_failed": 1})


def _wrong_shape_seg_graph(path: Path, hw: tuple[int, int]) -> None:
    """A graph the seg setting accepts (input ``image`` (B, 3, H, W), output ``logits``) whose logits
    lack their width axis: (B, 3, H)."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("ReduceMean", ["image"], ["logits"], axes=[3], keepdims=0)
    graph = helper.make_graph(
        [node],
        "seg-without-width",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, *hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3, hw[0]])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_a_model_whose_outputs_post_processing_cannot_take_fails_the_job_with_that_error(
    tiny_models, tmp_path, ray_local
):
    import torch

    from evaluation.annotate.models import describe
    from evaluation.annotate.tasks import PREDICTORS, Sample

    samples = [sample(f"a{i}", n, [(0.1, 0.1, 0.6, 0.95)], [0.9]) for i, n in enumerate(("obama.jpg", "messi5.jpg"))]
    dataset = write_version(tmp_path / "curated", [[samples[0]], [samples[1]]])
    graph, out = tmp_path / "seg.onnx", tmp_path / "out"
    _wrong_shape_seg_graph(graph, (64, 48))
    cfg = annotate_config(
        dataset, out, tiny_models, tasks=("seg",), **{"tasks.seg.onnx": str(graph), "actors.num_actors": 1}
    )
    predictor = PREDICTORS["seg"](describe("seg", cfg.tasks.seg), cfg.tasks.seg)
    raised = {}
    for s in samples:  # what the seg post-processing raises on each sample's (1, 3, 64) output
        with pytest.raises(Exception) as direct:
            predictor.finish(
                Sample(s["key"], np.zeros((s["height"], s["width"], 3), np.uint8), [], []),
                [(torch.zeros(1, 3, 64),)],
                [None],
            )
        raised[s["key"]] = f"{type(direct.value).__name__}: {' '.join(str(direct.value).split())}"
    with pytest.raises(AnnotationFailed) as failed:
        run_annotation(cfg)
    assert str(failed.value) in {
        f"shard {shard}: sample '{key}', seg post-processing: {error}"
        for shard, (key, error) in zip(("000000", "000001"), raised.items())
    }, str(failed.value)
    assert not list((out / layout.ANNOTATIONS).glob("*.parquet"))  # no shard committed with made-up errors
    assert not (out / "_SUCCESS").exists() and not (out / "_FAILED").exists()
