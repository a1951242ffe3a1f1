"""Parity of the Sapiens2 pre- and post-processing (``models.sapiens_processing``) with the
official demo code, on every case of its reference vectors
(``shared/reference/sapiens2_processing_parity.safetensors``, described in
``sapiens2_processing_reference.md``): box selection, top-down crop and warp, resize and pad,
normalisation, flip test, UDP heatmap decode, seg resize and argmax, normal normalisation,
pointmap scale and smoothing, albedo clamp and uint8.

The cases are parametrised from the file's own keys, and each case's test asserts that it read
every tensor stored under its prefix, so no case or tensor can be skipped silently.

Tolerances (the task's, or the reference page's where it suggests one): keypoints 1e-3 px;
seg labels, uint8 images, padding sizes, boxes and warp flags identical; normals, pointmaps
and albedo 1e-4; the normalised inputs and logit samples 1e-6; the warp matrix, box centres
and sizes identical (float32 arithmetic as released); ``_sum`` checksums relative 1e-6 (float32
rounding over the whole map, see each check). Figures are printed (``-s``).

OpenCV: ``cv2.warpAffine`` changed in 5.0, so the pose crop's pixels depend on OpenCV's major
version. Under OpenCV 5 (the project pins opencv-python 5.0) the crops are compared with the
primary tensors; under 4.x with the stored ``crop_bgr_u8_opencv4_{rowsum,colsum}``; any other
major version has no reference and fails. Torch runs on one thread here, as the vectors were
made: ``F.interpolate``'s CPU kernel rounds differently with more threads (ulp level).
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from models import sapiens_processing as sp
from tests.models.processing_reference import CASES, Reference, geometry_hw, geometry_of

KEYPOINT_ATOL = 1e-3  # px
MAP_ATOL = 1e-4  # normals, pointmaps, albedo
INPUT_ATOL = 1e-6  # normalised inputs, resized logits
SUM_RTOL = 1e-6
OPENCV_MAJOR = int(cv2.__version__.split(".")[0])


@pytest.fixture(scope="module")
def loaded() -> Reference:
    return Reference.load()


@pytest.fixture
def ref(loaded) -> Reference:
    return loaded.fresh()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _assert_u8_image(ref: Reference, got: np.ndarray, key: str) -> None:
    """``got`` equals the stored uint8 image: in full, or by its grid and exact row/column sums."""
    if key in ref:
        assert np.array_equal(got, ref[key]), key
        return
    assert np.array_equal(got[4::8, 4::8], ref[f"{key}_grid"]), key
    assert np.array_equal(got.sum(axis=1, dtype=np.int64), ref[f"{key}_rowsum"]), key
    assert np.array_equal(got.sum(axis=0, dtype=np.int64), ref[f"{key}_colsum"]), key


def _assert_input(ref: Reference, x: torch.Tensor, prefix: str, *, grid: bool = True) -> None:
    """The normalised (3, H, W) input against its stored grid and per-channel sums."""
    x = x.numpy()
    if grid:
        s, t = {1024: (8, 32), 256: (4, 8), 128: (2, 4)}[x.shape[1]]
        assert np.abs(x[:, s::t, s::t] - ref[f"{prefix}/input_rgb_f32_grid"]).max() <= INPUT_ATOL
    np.testing.assert_allclose(x.sum(axis=(1, 2), dtype=np.float64), ref[f"{prefix}/input_rgb_f32_sum"], rtol=1e-9)


def _assert_all_read(ref: Reference, prefix: str, not_applicable: tuple[str, ...] = ()) -> None:
    unread = [k for k in ref.unread(prefix) if not k.endswith(not_applicable)]
    assert not unread, f"tensors of the case left unchecked: {unread}"


# ---- pose --------------------------------------------------------------------------------------


def _pose_boxes(ref: Reference, case: str, image_hw: tuple[int, int]) -> np.ndarray:
    prefix = f"pose/{case}"
    if f"{prefix}/det_bboxes" not in ref:  # no detection at all
        return sp.whole_image_box(image_hw)[None]
    boxes = ref[f"{prefix}/det_bboxes"]
    kept = sp.select_people(boxes, ref[f"{prefix}/det_scores"], ref[f"{prefix}/det_labels"])
    return boxes[kept] if kept else sp.whole_image_box(image_hw)[None]


def _assert_crop(ref: Reference, crop: np.ndarray, prefix: str) -> tuple[str, ...]:
    """The crop against the reference of the installed OpenCV's major version; returns the
    suffixes of the other version's tensors (not applicable here)."""
    if OPENCV_MAJOR == 5:
        _assert_u8_image(ref, crop, f"{prefix}/crop_bgr_u8")
        return ("_opencv4_rowsum", "_opencv4_colsum")
    if OPENCV_MAJOR == 4:
        assert np.array_equal(crop.sum(axis=1, dtype=np.int64), ref[f"{prefix}/crop_bgr_u8_opencv4_rowsum"])
        assert np.array_equal(crop.sum(axis=0, dtype=np.int64), ref[f"{prefix}/crop_bgr_u8_opencv4_colsum"])
        return ("crop_bgr_u8", "crop_bgr_u8_grid", "crop_bgr_u8_rowsum", "crop_bgr_u8_colsum")
    pytest.fail(f"the reference holds pose crops for OpenCV 5 and 4 only, this is OpenCV {cv2.__version__}")


@pytest.mark.parametrize("case", CASES["pose"])
def test_pose_case_reproduces_boxes_crops_inputs_and_keypoints(ref, case):
    prefix, (H, W) = f"pose/{case}", geometry_hw(case)
    image, flip = ref.image("pose", case), ref.meta["pose"]["flip_indices"]
    boxes = _pose_boxes(ref, case, image.shape[:2])
    assert np.array_equal(boxes, ref[f"{prefix}/bboxes"])
    skipped: tuple[str, ...] = ()
    for i, box in enumerate(boxes):
        inst = f"{prefix}/inst{i}"
        crop = sp.crop_person(image, box, input_hw=(H, W))
        assert np.array_equal(crop.center, ref[f"{inst}/bbox_center"][0])
        assert np.array_equal(crop.scale, ref[f"{inst}/bbox_scale"][0])
        matrix = sp.udp_warp_matrix(crop.center, crop.scale, (W, H))
        assert np.array_equal(matrix, ref[f"{inst}/warp_mat"])
        assert sp.warp_interpolation(matrix) == int(ref[f"{inst}/warp_flag"][0])
        skipped = _assert_crop(ref, crop.image, inst)
        x = sp.normalize_image(crop.image)
        _assert_input(ref, x, inst)

        passes = [ref.heatmaps(inst, p, (H // 4, W // 4))[None] for p in (0, 1)]

        def network(batch, x=x[None], passes=passes):  # the stand-in: the stored output of each pass
            assert torch.equal(batch, x) or torch.equal(batch, x.flip(-1))
            return passes[0] if torch.equal(batch, x) else passes[1]

        heatmaps = sp.flip_test(network, x[None], flip)[0].numpy()
        sums = heatmaps.sum(axis=(1, 2), dtype=np.float64)
        np.testing.assert_allclose(sums, ref[f"{inst}/heatmaps_avg_sum"], rtol=1e-9)
        kp_crop, scores = sp.udp_decode(heatmaps, (W, H))
        kp = sp.keypoints_to_image(kp_crop, crop.center, crop.scale, (W, H))[0]
        err_crop = np.abs(kp_crop - ref[f"{inst}/keypoints_crop"]).max()
        err = np.abs(kp - ref[f"{inst}/keypoints"]).max()
        print(f"{inst}: keypoints max error {err:.3g} px (in the crop {err_crop:.3g} px)")
        assert err_crop <= KEYPOINT_ATOL and err <= KEYPOINT_ATOL
        assert np.array_equal(scores[0], ref[f"{inst}/scores"])
    for suffix in ("det_bboxes", "det_scores", "det_labels"):  # read by the box stage when present
        ref.read.add(f"{prefix}/{suffix}")
    _assert_all_read(ref, f"{prefix}/", skipped)


def test_pose_box_stage_keeps_what_the_reference_says(ref):
    """Score, label and NMS decisions of ``odd_dets`` one by one (§2 of the reference page)."""
    case = next(c for c in CASES["pose"] if c.startswith("odd_dets"))
    boxes, scores = ref[f"pose/{case}/det_bboxes"], ref[f"pose/{case}/det_scores"]
    labels = ref[f"pose/{case}/det_labels"]
    assert sp.select_people(boxes, scores, labels) == ref.meta["pose"]["cases"][case]["kept_detection_indices"]
    assert sp.select_people(boxes, scores) == [0, 4, 2]  # without labels, the label-1 box #4 (0.9) is a person
    assert sp.select_people(boxes, scores, labels, iou_threshold=1.0) == [0, 1, 2]  # no NMS: #1 stays
    assert sp.select_people(boxes, scores, labels, score_threshold=0.6) == [0]  # strictly above: #2 (0.6) goes


# ---- dense tasks -------------------------------------------------------------------------------


def _assert_map(ref: Reference, got_HWC: np.ndarray, key: str, atol: float = MAP_ATOL) -> float:
    """An (H, W, C) map at the image size against its (2, 5) grid and per-channel sums; returns
    the grid's max error. The sum's tolerance: SUM_RTOL of the sum of magnitudes (float32
    rounding of each value adds up over the map)."""
    err = float(np.abs(got_HWC[2::5, 2::5] - ref[f"{key}_grid"]).max())
    assert err <= atol, f"{key}: {err}"
    axes = tuple(range(got_HWC.ndim - 1)) if got_HWC.ndim == 3 else None
    sums = got_HWC.astype(np.float64).sum(axis=axes)
    scale = np.abs(got_HWC.astype(np.float64)).sum(axis=axes)
    assert np.all(np.abs(sums - ref[f"{key}_sum"]) <= SUM_RTOL * scale), key
    return err


@pytest.mark.parametrize("case", CASES["seg"])
def test_seg_case_reproduces_the_resize_input_and_labels(ref, case):
    prefix, hw = f"seg/{case}", geometry_hw(case)
    image = ref.image("seg", case)
    resized = sp.resize_plain(image, hw)
    _assert_u8_image(ref, resized, f"{prefix}/resized_bgr_u8")
    _assert_input(ref, sp.normalize_image(resized), prefix, grid=False)
    logits = ref.dense_output("seg", geometry_of(case))
    labels = sp.seg_labels(logits, image.shape[:2])[0].numpy()
    differing = int((labels != ref[f"{prefix}/labels_u8"]).sum())
    yx = ref[f"{prefix}/sample_yx"]
    resized_logits = sp.resize_map(logits, image.shape[:2])[0, :, yx[:, 0], yx[:, 1]].T.numpy()
    err = float(np.abs(resized_logits - ref[f"{prefix}/logits_resized_samples"]).max())
    print(f"{prefix}: {differing} labels differ, resized logits max error {err:.3g}")
    assert differing == 0 and err <= INPUT_ATOL
    _assert_all_read(ref, f"{prefix}/")


def _letterbox(ref: Reference, task: str, case: str):
    """The letterboxed image (stored under normal/: pointmap's and albedo's are the same) and padding."""
    hw = geometry_hw(case)
    padded, padding = sp.resize_pad(ref.image(task, case), hw)
    assert [padding.left, padding.right, padding.top, padding.bottom] == ref[f"{task}/{case}/padding_size"].tolist()
    return padded, padding


@pytest.mark.parametrize("case", CASES["normal"])
def test_normal_case_reproduces_the_letterbox_input_and_unit_normals(ref, case):
    prefix = f"normal/{case}"
    padded, padding = _letterbox(ref, "normal", case)
    _assert_u8_image(ref, padded, f"{prefix}/padded_bgr_u8")
    _assert_input(ref, sp.normalize_image(padded), prefix)
    raw = ref.dense_output("normal", geometry_of(case))
    image_hw = ref.image("normal", case).shape[:2]
    normal = sp.normals_to_image(raw, image_hw, padding)[0].permute(1, 2, 0).numpy()
    print(f"{prefix}: normals max error {_assert_map(ref, normal, f'{prefix}/normal'):.3g}")
    _assert_all_read(ref, f"{prefix}/")


@pytest.mark.parametrize("case", CASES["pointmap"])
def test_pointmap_case_reproduces_metric_xyz_smoothing_and_depth(ref, case, monkeypatch):
    import torchvision.transforms.functional as TVF

    prefix, geometry = f"pointmap/{case}", geometry_of(case)
    _, padding = _letterbox(ref, "pointmap", case)
    calls = []
    blur = TVF.gaussian_blur
    monkeypatch.setattr(TVF, "gaussian_blur", lambda *a, **k: calls.append(1) or blur(*a, **k))
    scale = torch.from_numpy(ref[f"pointmap/model_output_{geometry}/scale"])
    raw = ref.dense_output("pointmap", geometry)
    image_hw = ref.image("pointmap", case).shape[:2]
    xyz = sp.pointmap_to_image(raw, scale, image_hw, padding)[0].permute(1, 2, 0).numpy()
    assert len(calls) == int(ref[f"{prefix}/smoothing_blur_calls"][0])
    err = _assert_map(ref, xyz, f"{prefix}/pointmap")
    depth = xyz[..., 2].astype(np.float16)  # what the demo saves
    want = ref[f"{prefix}/depth_f16_grid"]
    f16_ulp = np.spacing(np.abs(want)).astype(np.float32)  # a 1e-4 difference may cross one float16 rounding
    assert np.all(np.abs(depth[2::5, 2::5].astype(np.float32) - want.astype(np.float32)) <= f16_ulp)
    depth_off = depth.astype(np.float64).sum() - ref[f"{prefix}/depth_f16_sum"][0]
    assert abs(depth_off) <= np.spacing(np.abs(depth)).astype(np.float64).sum()
    print(f"{prefix}: pointmap max error {err:.3g}, {len(calls)} blur calls, depth sum off by {depth_off:.3g}")
    _assert_all_read(ref, f"{prefix}/")


@pytest.mark.parametrize("case", CASES["albedo"])
def test_albedo_case_reproduces_the_clamped_map_and_its_uint8(ref, case):
    prefix = f"albedo/{case}"
    _, padding = _letterbox(ref, "albedo", case)
    raw = ref.dense_output("albedo", geometry_of(case))
    image_hw = ref.image("albedo", case).shape[:2]
    albedo = sp.albedo_to_image(raw, image_hw, padding)[0].permute(1, 2, 0)
    err = _assert_map(ref, albedo.numpy(), f"{prefix}/albedo")
    u8 = sp.albedo_to_uint8(albedo).numpy()
    # Truncation turns a float32 rounding at a multiple of 1/255 into a whole level: one level
    # is allowed on 0.1% of the values (identical here, one thread, the released NCHW layout).
    grid_diff = np.abs(u8[2::5, 2::5].astype(int) - ref[f"{prefix}/albedo_u8_rgb_grid"])
    sum_diff = np.abs(u8.sum(axis=(0, 1), dtype=np.int64) - ref[f"{prefix}/albedo_u8_rgb_sum"])
    print(f"{prefix}: albedo max error {err:.3g}, uint8 grid values off {int((grid_diff > 0).sum())}, sums {sum_diff}")
    assert grid_diff.max() <= 1 and (grid_diff > 0).mean() <= 1e-3 and np.all(sum_diff <= 1e-3 * u8[..., 0].size)
    _assert_all_read(ref, f"{prefix}/")


def test_every_tensor_of_the_file_belongs_to_a_checked_case(loaded):
    """Images, dense model outputs and the cases above: nothing in the file is outside them."""
    tensors = loaded.tensors
    cases = {f"{task}/{case}/" for task, names in CASES.items() for case in names}
    shared = ("input/", *(f"{t}/model_output_" for t in ("seg", "normal", "pointmap", "albedo")))
    stray = [k for k in tensors if not k.startswith(shared) and not any(k.startswith(c) for c in cases)]
    assert not stray and len(tensors) == 351
    assert {len(v) for v in CASES.values()} == {6}  # 3 scenarios or images x 2 geometries per task


# ---- named deviations: where these functions deliberately differ from the released code -------


def test_deviation_a_heatmap_channel_with_no_positive_value_is_not_refined():
    """The released decode refines every channel from its integer maximum, (-1, -1) for a channel
    with no positive value; its flat-index arithmetic then reads the *previous* channel's padded
    log-map (surprise 10 of the reference page). That reads memory of another keypoint, so the
    location stays (-1, -1), unrefined. Here channel 0 peaks at the bottom-right corner, where
    channel 1's reads land, and the released step (emulated from its documented indexing) moves."""
    H, W = 64, 48
    ys, xs = np.mgrid[0:H, 0:W]
    peak = np.exp(-((xs - (W - 1)) ** 2 + (ys - (H - 1)) ** 2) / 8.0).astype(np.float32)
    heatmaps = np.stack([peak, np.full((H, W), -0.01, np.float32)])
    keypoints, scores = sp.udp_decode(heatmaps, (192, 256))
    assert scores[0, 1] == np.float32(-0.01)
    assert keypoints[0, 1].tolist() == [-1 / (W - 1) * 192, -1 / (H - 1) * 256]  # (-1, -1), unrefined

    log = np.log(np.clip(sp.blur_heatmaps(heatmaps), 1e-3, 50.0))
    flat = np.pad(log, ((0, 0), (1, 1), (1, 1)), mode="edge").ravel()
    i, row = (W + 2) * (H + 2), W + 2  # channel 1's (-1, -1): the first element of its padded map
    c, right, left, d, u = flat[i], flat[i + 1], flat[i - 1], flat[i + row], flat[i - row]
    dx, dy, dxx, dyy = 0.5 * (right - left), 0.5 * (d - u), right - 2 * c + left, d - 2 * c + u
    dxy = 0.5 * (flat[i + row + 1] - right - d + 2 * c - left - u + flat[i - row - 1])
    hessian = np.array([[dxx, dxy], [dxy, dyy]], np.float64) + np.finfo(np.float32).eps * np.eye(2)
    released = np.float32([-1, -1]) - np.linalg.inv(hessian) @ np.array([dx, dy])
    assert np.abs(released - [-1, -1]).max() > 0.01  # the released location is somewhere else


def test_deviation_each_pointmap_sample_is_divided_by_its_own_scale():
    """The released demo divides the (B, 3, H, W) pointmap by the (B, 1) scale, which broadcasts
    as intended only for B = 1 (the reference's cases, reproduced above); for B > 1 it fails or
    mixes samples. ``metric_pointmap`` divides each sample by its own scale."""
    pointmap, scale = torch.ones(2, 3, 4, 6), torch.tensor([[2.0], [4.0]])
    with pytest.raises(RuntimeError):
        pointmap / scale  # the released expression
    metric = sp.metric_pointmap(pointmap, scale)
    assert metric[0].unique().tolist() == [0.5] and metric[1].unique().tolist() == [0.25]
    one = torch.full((1, 3, 4, 6), 3.0)
    assert torch.equal(sp.metric_pointmap(one, torch.tensor([[1.5]])), one / torch.tensor([[1.5]]))  # B = 1: the same
