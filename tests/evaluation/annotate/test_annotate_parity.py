"""The annotate job's processing at its default settings against the official demo's, on every
case of the Sapiens2 processing reference vectors (``tests/models/processing_reference.py``):
each task's ``Predictor`` takes the case's image (as the job decodes it: RGB) and its person
boxes, a stand-in runner returns the vectors' fixed network outputs, and the columns the job
writes are compared with what the official demo saves. Tolerances as in
``tests/models/test_sapiens2_processing_parity.py`` (keypoints 1e-3 px, labels identical,
normals 1e-4), with the job's encodings: the pointmap float16 (the precision of the depth the
demo saves; one float16 step), the labels and the albedo PNGs.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from evaluation.annotate.config import PoseSettings, TaskSettings
from evaluation.annotate.models import RELEASED, ModelInfo
from evaluation.annotate.tasks import PREDICTORS, Sample
from models.task_models import TASK_OUTPUTS
from tests.evaluation.annotate.conftest import npy
from tests.models.processing_reference import CASES, Reference, geometry_hw, geometry_of


@pytest.fixture(scope="module")
def loaded() -> Reference:
    return Reference.load()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the vectors were made (F.interpolate rounds per thread split)
    yield
    torch.set_num_threads(threads)


def _predictor(task: str, input_hw: tuple[int, int], settings: TaskSettings | None = None):
    info = ModelInfo(
        task=task,
        name=f"reference {task}",
        layout=RELEASED,
        family="sapiens2",
        input_hw=input_hw,
        outputs=TASK_OUTPUTS[task],
        vocab="",
        checkpoint="",
        sha256="",
    )
    return PREDICTORS[task](info, settings or TaskSettings(checkpoint="unused"))


def _sample(ref: Reference, task: str, case: str, boxes=(), scores=()) -> Sample:
    bgr = ref.image(task, case)
    return Sample(case, np.ascontiguousarray(bgr[..., ::-1]), [list(map(float, b)) for b in boxes], list(scores))


@pytest.mark.parametrize("case", CASES["pose"])
def test_pose_columns_are_the_official_keypoints(loaded, case):
    ref, prefix, (H, W) = loaded.fresh(), f"pose/{case}", geometry_hw(case)
    boxes, scores = [], []
    if f"{prefix}/det_bboxes" in ref:  # curation records people only: the detector's person boxes
        people = ref[f"{prefix}/det_labels"] == 0
        boxes, scores = ref[f"{prefix}/det_bboxes"][people], ref[f"{prefix}/det_scores"][people]
    p = _predictor("pose", (H, W), PoseSettings(checkpoint="unused", flip_test=False))
    p.flip_indices = ref.meta["pose"]["flip_indices"]  # the vectors' toy 6-keypoint set has no vocabulary
    items = p.inputs(_sample(ref, "pose", case, boxes, scores))
    want_boxes = ref[f"{prefix}/bboxes"]
    assert np.array_equal(np.float32([c[0] for _, c in items]), want_boxes)
    x = torch.stack([x for x, _ in items])
    for i, x_i in enumerate(x):
        sums = x_i.numpy().sum(axis=(1, 2), dtype=np.float64)
        np.testing.assert_allclose(sums, ref[f"{prefix}/inst{i}/input_rgb_f32_sum"], rtol=1e-9)
    passes = [
        torch.stack([ref.heatmaps(f"{prefix}/inst{i}", q, (H // 4, W // 4)) for i in range(len(x))]) for q in (0, 1)
    ]

    def runner(batch):  # the stand-in network: crops, then their mirrors, in one forward
        assert torch.equal(batch, torch.cat([x, x.flip(-1)]))
        return (torch.cat(passes),)

    (heatmaps,) = p.infer(runner, x)
    got = p.finish(_sample(ref, "pose", case), [(heatmaps[i : i + 1],) for i in range(len(x))], [c for _, c in items])
    for i in range(len(x)):
        err = np.abs(np.asarray(got["pose_keypoints"][i]) - ref[f"{prefix}/inst{i}/keypoints"]).max()
        print(f"{prefix}/inst{i}: keypoints max error {err:.3g} px")
        assert err <= 1e-3
        assert np.array_equal(np.float32(got["pose_keypoint_scores"][i]), ref[f"{prefix}/inst{i}/scores"])


def test_a_degenerate_box_is_dropped_before_the_official_box_stage(loaded):
    """Deviation: a box without width or height would make the released warp divide by zero;
    the job drops it first, so a sample with only such boxes gets the whole-image box."""
    ref = loaded.fresh()
    case = next(c for c in CASES["pose"] if c.startswith("tall_nodet") and c.endswith("256x192"))
    p = _predictor("pose", geometry_hw(case), PoseSettings(checkpoint="unused", flip_test=False))
    s = _sample(ref, "pose", case, [[10, 10, 10, 60], [5, 20, 40, 20]], [0.9, 0.8])
    assert p.people(s) == [(ref[f"pose/{case}/bboxes"][0].tolist(), 0.0)]  # (0, 0, W - 1, H - 1), no detector score
    off = _predictor("pose", geometry_hw(case), PoseSettings(checkpoint="unused", flip_test=False, whole_image=False))
    assert off.people(s) == [] and off.inputs(s) == []


@pytest.mark.parametrize("case", CASES["seg"])
def test_seg_png_holds_the_official_labels(loaded, case):
    ref, prefix = loaded.fresh(), f"seg/{case}"
    p = _predictor("seg", geometry_hw(case))
    ((x, context),) = p.inputs(_sample(ref, "seg", case))
    np.testing.assert_allclose(
        x.numpy().sum(axis=(1, 2), dtype=np.float64), ref[f"{prefix}/input_rgb_f32_sum"], rtol=1e-9
    )
    got = p.finish(_sample(ref, "seg", case), [(ref.dense_output("seg", geometry_of(case)),)], [context])
    labels = cv2.imdecode(np.frombuffer(got["seg_png"], np.uint8), cv2.IMREAD_UNCHANGED)
    assert np.array_equal(labels, ref[f"{prefix}/labels_u8"])


@pytest.mark.parametrize("case", CASES["normal"])
def test_normal_npy_holds_the_official_float32_normals(loaded, case):
    ref, prefix = loaded.fresh(), f"normal/{case}"
    p = _predictor("normal", geometry_hw(case))
    ((x, padding),) = p.inputs(_sample(ref, "normal", case))
    np.testing.assert_allclose(
        x.numpy().sum(axis=(1, 2), dtype=np.float64), ref[f"{prefix}/input_rgb_f32_sum"], rtol=1e-9
    )
    got = npy(
        p.finish(_sample(ref, "normal", case), [(ref.dense_output("normal", geometry_of(case)),)], [padding])[
            "normal_npy"
        ]
    )
    assert got.dtype == np.float32  # the released demo's .npy, the default map_dtype
    err = np.abs(got[2::5, 2::5] - ref[f"{prefix}/normal_grid"]).max()
    print(f"{prefix}: normals max error {err:.3g}")
    assert err <= 1e-4


@pytest.mark.parametrize("case", CASES["pointmap"])
def test_pointmap_npy_holds_the_official_depth_at_its_float16_precision(loaded, case):
    ref, prefix, geometry = loaded.fresh(), f"pointmap/{case}", geometry_of(case)
    p = _predictor("pointmap", geometry_hw(case))
    ((_, padding),) = p.inputs(_sample(ref, "pointmap", case))
    outs = (ref.dense_output("pointmap", geometry), torch.from_numpy(ref[f"pointmap/model_output_{geometry}/scale"]))
    got = p.finish(_sample(ref, "pointmap", case), [outs], [padding])
    xyz = npy(got["pointmap_npy"])
    assert xyz.dtype == np.float16 and got["pointmap_scale"] == float(outs[1][0, 0])
    depth, want = xyz[2::5, 2::5, 2], ref[f"{prefix}/depth_f16_grid"]
    assert np.all(np.abs(depth.astype(np.float32) - want.astype(np.float32)) <= np.spacing(np.abs(want)))
    grid = ref[f"{prefix}/pointmap_grid"]
    assert np.all(np.abs(xyz[2::5, 2::5].astype(np.float32) - grid) <= np.spacing(np.abs(grid).astype(np.float16)))


@pytest.mark.parametrize("case", CASES["albedo"])
def test_albedo_png_holds_the_official_truncated_uint8(loaded, case):
    ref, prefix = loaded.fresh(), f"albedo/{case}"
    p = _predictor("albedo", geometry_hw(case))
    ((_, padding),) = p.inputs(_sample(ref, "albedo", case))
    got = p.finish(_sample(ref, "albedo", case), [(ref.dense_output("albedo", geometry_of(case)),)], [padding])
    rgb = cv2.imdecode(np.frombuffer(got["albedo_png"], np.uint8), cv2.IMREAD_COLOR)[..., ::-1]
    diff = np.abs(rgb[2::5, 2::5].astype(int) - ref[f"{prefix}/albedo_u8_rgb_grid"])
    print(f"{prefix}: {int((diff > 0).sum())} uint8 grid values differ")
    assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3  # as the processing test: truncation of float32 roundings
