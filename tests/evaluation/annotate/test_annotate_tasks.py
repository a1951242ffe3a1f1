"""Each task's processing around its model against the released functions it must equal
(``models.sapiens_processing``), on real photos and tiny models, in this process; and the
annotator's failures: what is wrong with a sample is its row's status and reason, anything else
raises ``AnnotationFailed``."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from evaluation.annotate.annotator import (
    BAD_METADATA,
    DECODE_FAILED,
    ERROR,
    MISSING,
    OK,
    SIZE_MISMATCH,
    AnnotationFailed,
    Annotator,
    decode,
)
from evaluation.annotate.config import ActorSettings, PoseSettings, TasksConfig, TaskSettings
from evaluation.annotate.models import PLATFORM, TorchRunner, describe
from evaluation.annotate.shards import MISSING_IMAGE, Record
from evaluation.annotate.tasks import PREDICTORS, Sample, labels_at
from models import sapiens_processing as sp
from models.vocab import keypoint_vocab
from tests.evaluation.annotate.conftest import npy, photo


@pytest.fixture(scope="module")
def image():
    from PIL import Image

    data, w, h = photo("messi5.jpg", 0.6)
    return np.asarray(Image.open(__import__("io").BytesIO(data)).convert("RGB"))


def _predictor(task, tiny_models, **settings):
    cls = PoseSettings if task == "pose" else TaskSettings
    s = cls(checkpoint=str(tiny_models[task]), **settings)
    info = describe(task, s)
    return PREDICTORS[task](info, s), TorchRunner(info, "cpu", "fp32")


def _run(p, run, s: Sample) -> dict:
    items = p.inputs(s)
    outs = []
    if items:
        batch = p.infer(run, torch.stack([x for x, _ in items]))
        outs = [tuple(o[j : j + 1] for o in batch) for j in range(len(items))]
    return p.finish(s, outs, [c for _, c in items])


def test_pose_is_the_released_top_down_flip_test_and_udp_decode_in_image_pixels(tiny_models, image):
    p, run = _predictor("pose", tiny_models, min_box_score=0.3, max_people=2)
    h, w = image.shape[:2]
    boxes = [[0.1 * w, 0.2 * h, 0.5 * w, 0.9 * h], [0.5 * w, 0.1 * h, 0.9 * w, 0.8 * h], [0, 0, w, h], [5, 5, 5, 50]]
    s = Sample("k", image, boxes, [0.9, 0.8, 0.7, 0.95])
    items = p.inputs(s)
    assert [c[0] for _, c in items] == boxes[:2]  # the best 2 scoring >= 0.3; no empty box
    flip = keypoint_vocab("goliath_308").flip_indices
    crops = [sp.crop_person(image, b, input_hw=(64, 48)) for b in boxes[:2]]
    x = torch.stack([sp.normalize_image(c.image, bgr=False) for c in crops])
    assert torch.equal(x, torch.stack([x_ for x_, _ in items]))
    with torch.no_grad():
        released = sp.flip_test(lambda y: run.model(y), x, flip)
    (heatmaps,) = p.infer(run, x)  # crops and mirrors in one forward: the same up to rounding
    assert torch.allclose(heatmaps, released, atol=1e-5)
    got = p.finish(s, [(released[i : i + 1],) for i in range(2)], [c for _, c in items])
    assert got["pose_boxes"] == boxes[:2] and np.allclose(got["pose_box_scores"], [0.9, 0.8])
    for i, crop in enumerate(crops):
        kp, scores = sp.udp_decode(released[i].numpy(), (48, 64))
        want = sp.keypoints_to_image(kp, crop.center, crop.scale, (48, 64))[0]
        assert np.asarray(got["pose_keypoints"][i]).shape == (308, 2)
        assert np.array_equal(np.asarray(got["pose_keypoints"][i]), want)
        assert np.array_equal(np.asarray(got["pose_keypoint_scores"][i], np.float32), scores[0])


def test_pose_boxes_are_chosen_as_the_released_demo_chooses_them(tiny_models, image):
    """Scores above ``min_box_score`` (0.3 by default, strictly), greedy NMS at IoU 0.3 best first,
    the whole image (score 0) when nothing is left; each rule has its setting."""
    h, w = image.shape[:2]
    a, a_shifted, b = [10, 10, 110, 210], [20, 15, 120, 215], [150, 20, 250, 220]  # IoU(a, a_shifted) > 0.3
    s = Sample("k", image, [a, a_shifted, b, [5, 5, 60, 60]], [0.6, 0.9, 0.5, 0.3])
    p, _ = _predictor("pose", tiny_models)
    assert p.people(s) == [(a_shifted, 0.9), (b, 0.5)]  # a: suppressed by the better a_shifted; 0.3: not above
    p, _ = _predictor("pose", tiny_models, nms_iou=1.0, min_box_score=0.0)
    assert p.people(s) == [(a_shifted, 0.9), (a, 0.6), (b, 0.5), ([5, 5, 60, 60], 0.3)]
    nobody = Sample("k", image, [a], [0.2])
    p, _ = _predictor("pose", tiny_models)
    assert p.people(nobody) == [([0.0, 0.0, w - 1.0, h - 1.0], 0.0)]
    p, _ = _predictor("pose", tiny_models, whole_image=False)
    assert p.people(nobody) == []


def test_seg_labels_are_the_released_argmax_of_resized_logits_as_a_png_at_the_image_size(tiny_models, image):
    import cv2

    logits = torch.randn(2, 29, 16, 12)
    assert torch.equal(labels_at(logits, (97, 61)), sp.seg_labels(logits, (97, 61)))
    p, run = _predictor("seg", tiny_models)
    got = _run(p, run, Sample("k", image, [], []))
    mask = cv2.imdecode(np.frombuffer(got["seg_png"], np.uint8), cv2.IMREAD_UNCHANGED)
    x = sp.normalize_image(sp.resize_plain(image, (64, 48)), bgr=False)[None]
    with torch.no_grad():
        want = sp.seg_labels(run.model(x), image.shape[:2])[0].numpy()
    assert mask.dtype == np.uint8 and mask.shape == image.shape[:2] and np.array_equal(mask, want)


def test_normal_and_pointmap_are_float32_and_float16_maps_at_the_image_size(tiny_models, image):
    """As the released demos save them by default (normals float32, depth float16); ``map_dtype``
    chooses."""
    s = Sample("k", image, [], [])
    p, run = _predictor("normal", tiny_models)
    normal = npy(_run(p, run, s)["normal_npy"])
    resized, pad = sp.resize_pad(image, (64, 48))
    with torch.no_grad():
        want = sp.normals_to_image(run.model(sp.normalize_image(resized, bgr=False)[None]), image.shape[:2], pad)
    assert normal.dtype == np.float32 and normal.shape == (*image.shape[:2], 3)
    assert np.array_equal(normal, want[0].permute(1, 2, 0).numpy())
    p, run = _predictor("normal", tiny_models, map_dtype="float16")
    normal = npy(_run(p, run, s)["normal_npy"])
    assert normal.dtype == np.float16 and np.allclose(normal.astype(np.float32), want[0].permute(1, 2, 0), atol=1e-3)
    p, run = _predictor("pointmap", tiny_models)
    got = _run(p, run, s)
    resized, pad = sp.resize_pad(image, (256, 192))
    with torch.no_grad():
        points, scale = run.model(sp.normalize_image(resized, bgr=False)[None])
    want = sp.pointmap_to_image(points, scale, image.shape[:2], pad)[0].permute(1, 2, 0).numpy()
    assert np.allclose(npy(got["pointmap_npy"]).astype(np.float32), want, rtol=2e-3, atol=2e-3)
    assert got["pointmap_scale"] == pytest.approx(float(scale), rel=1e-6)


def test_a_fine_tune_exports_pointmap_is_recorded_in_the_released_scale_convention(tiny_models, image):
    """Platform heads give metric XYZ = xyz * s; recorded as canonical xyz with scale 1 / s."""
    p, _ = _predictor("pointmap", tiny_models)
    p.info = dataclasses.replace(p.info, layout=PLATFORM)
    xyz, s = torch.randn(1, 3, 64, 48), torch.tensor([[2.0]])
    got = p.finish(Sample("k", image[:64, :48], [], []), [(xyz, s)], [None])
    assert got["pointmap_scale"] == pytest.approx(0.5)
    want = sp.pointmap_to_image(xyz * 2.0, torch.ones(1, 1), (64, 48))[0].permute(1, 2, 0).numpy()
    assert np.allclose(npy(got["pointmap_npy"]).astype(np.float32), want, atol=2e-2)


def test_albedo_is_an_rgb_png_and_v1_depth_a_float16_map(tiny_models, image):
    import cv2

    s = Sample("k", image, [], [])
    albedo = cv2.imdecode(np.frombuffer(_run(*_predictor("albedo", tiny_models), s)["albedo_png"], np.uint8), 1)
    assert albedo.shape == image.shape
    p, run = _predictor("depth", tiny_models)
    assert p.v1 and p.info.family == "sapiens1"
    depth = npy(_run(p, run, s)["depth_npy"])
    assert depth.dtype == np.float16 and depth.shape == image.shape[:2]


def _pose_seg_annotator(tiny_models, batch_size: int = 2) -> Annotator:
    tasks = TasksConfig(
        pose=PoseSettings(checkpoint=str(tiny_models["pose"])), seg=TaskSettings(checkpoint=str(tiny_models["seg"]))
    )
    infos = {t: describe(t, tasks.of(t)) for t in tasks.enabled()}
    return Annotator(infos, tasks, ActorSettings(batch_size=batch_size), "cpu")


def test_what_is_wrong_with_a_sample_is_its_status_and_reason(tiny_models):
    data, w, h = photo("obama.jpg", 0.3)
    meta = {"width": w, "height": h, "person_boxes": [[0, 0, w / 2, h]], "person_scores": [0.9]}
    records = [
        Record("a", data, meta),
        Record("b", data[: len(data) // 3], meta),  # truncated JPEG
        Record("c", data, {**meta, "width": w + 1}),  # not the size curation recorded
        Record("d", None, None, "no image of sample 'd' in x.tar", MISSING_IMAGE),
        Record("e", data, {**meta, "person_boxes": [[0, 0, float("nan"), h]]}),  # a box pose cannot crop
        Record("f", data, {**meta, "person_scores": []}),  # boxes without their scores
        Record("g", b"\x89PNG\r\n\x1a\n not a png", meta),
    ]
    rows = _pose_seg_annotator(tiny_models).annotate(records)
    assert [(r["status"], r["reason"]) for r in rows] == [
        (OK, None),
        (ERROR, DECODE_FAILED),
        (ERROR, SIZE_MISMATCH),
        (MISSING, MISSING_IMAGE),
        (ERROR, BAD_METADATA),
        (ERROR, BAD_METADATA),
        (ERROR, DECODE_FAILED),
    ]
    assert rows[0]["error"] is None and len(rows[0]["pose_keypoints"]) == 1 and rows[0]["seg_png"]
    assert rows[1]["error"].startswith("OSError: ") and rows[1]["seg_png"] is None
    assert "curation recorded" in rows[2]["error"] and rows[3]["error"].startswith("no image")
    assert "not four finite numbers" in rows[4]["error"] and "do not pair up" in rows[5]["error"]
    assert rows[6]["error"] == "UnidentifiedImageError: cannot identify image file <sample 'g'>"  # no address
    assert decode(records[0]).shape == (h, w, 3)


def test_a_seg_only_job_does_not_read_the_person_boxes(tiny_models):
    data, w, h = photo("obama.jpg", 0.3)
    tasks = TasksConfig(seg=TaskSettings(checkpoint=str(tiny_models["seg"])))
    annotator = Annotator({"seg": describe("seg", tasks.seg)}, tasks, ActorSettings(batch_size=2), "cpu")
    (row,) = annotator.annotate([Record("a", data, {"width": w, "height": h, "person_boxes": [[0, 0, 1]]})])
    assert row["status"] == OK and row["seg_png"]


def test_a_failure_in_post_processing_fails_the_annotation_naming_sample_task_and_step(tiny_models, monkeypatch):
    data, w, h = photo("obama.jpg", 0.3)
    meta = {"width": w, "height": h, "person_boxes": [[0, 0, w / 2, h]], "person_scores": [0.9]}

    def broken(self, s, outs, contexts):
        raise TypeError("unsupported operand type(s) for *: 'Tensor' and 'NoneType'")

    monkeypatch.setattr(PREDICTORS["seg"], "finish", broken)
    annotator = _pose_seg_annotator(tiny_models)
    with pytest.raises(AnnotationFailed) as failed:
        annotator.annotate([Record("a", data, meta), Record("b", data, meta)])
    assert str(failed.value) == (
        "sample 'a', seg post-processing: TypeError: unsupported operand type(s) for *: 'Tensor' and 'NoneType'"
    )
    assert isinstance(failed.value.__cause__, TypeError)


def test_a_memory_error_while_decoding_is_not_a_corrupt_image(tiny_models, monkeypatch):
    from PIL import Image

    data, w, h = photo("obama.jpg", 0.3)

    def out_of_memory(self, mode=None, *args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(Image.Image, "convert", out_of_memory)
    annotator = _pose_seg_annotator(tiny_models)
    with pytest.raises(AnnotationFailed, match=r"^sample 'a', decode: MemoryError$"):
        annotator.annotate([Record("a", data, {"width": w, "height": h, "person_boxes": [], "person_scores": []})])


def test_a_shards_own_faults_are_reasons_and_a_storage_error_is_raised(tmp_path):
    from curation.output import shard_path, sidecar_path
    from evaluation.annotate.shards import BAD_METADATA, UNREADABLE_TAR, SourceShard, read_shard
    from tests.evaluation.annotate.conftest import sample, write_version

    samples = [sample(f"k{i}", "obama.jpg", [(0.1, 0.1, 0.6, 0.95)], [0.9], scale=0.2) for i in range(3)]
    root = write_version(tmp_path / "curated", [samples])
    shard = SourceShard("000000", shard_path(root, "000000"), sidecar_path(root, "000000"))
    assert [(r.key, r.reason) for r in read_shard(shard)] == [("k0", None), ("k1", None), ("k2", None)]
    tar = Path(shard.tar)
    whole = tar.read_bytes()
    tar.write_bytes(whole[: whole.index(b"k1.jpg") + 1024])  # cut inside k1's image
    records = read_shard(shard)
    assert [(r.key, r.reason) for r in records] == [("k0", None), ("k1", UNREADABLE_TAR), ("k2", UNREADABLE_TAR)]
    assert records[1].error.startswith("shard tar unreadable after ") and "ReadError" in records[1].error
    tar.unlink()  # a version that lists a tar it does not have
    assert {r.reason for r in read_shard(shard)} == {UNREADABLE_TAR}
    tar.mkdir()  # a path the storage cannot read as a file: not the samples' fault
    with pytest.raises(OSError) as raised:
        read_shard(shard)
    assert not isinstance(raised.value, FileNotFoundError)
    tar.rmdir()
    tar.write_bytes(whole)
    with tarfile.open(tar, "a") as t:  # one more sample, whose json is not JSON
        for name, data in (("k3.jpg", samples[0]["image"]), ("k3.json", b"{not json")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    records = {r.key: r for r in read_shard(shard)}
    assert records["k3"].reason == BAD_METADATA and "k3.json of the shard is not JSON" in records["k3"].error
    assert [records[k].reason for k in ("k0", "k1", "k2")] == [None, None, None]
