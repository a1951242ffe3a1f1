"""Each task's pre- and post-processing around its model, as released (``models.sapiens_processing``),
and the columns it writes.

A ``Predictor`` turns one decoded sample into model inputs (``inputs``: one per image, or one
per person crop for pose), runs them (``infer``: the model, or pose's flip test), and turns a
sample's outputs back into its annotation (``finish``: one value per column of ``fields``,
binary columns already encoded). Binary columns are also the sample's members of the
annotation tar (``members``: column -> WebDataset extension); the other columns go into its
``<key>.json``.

Processing per task (released Sapiens2 models and fine-tune exports; Sapiens v1 released
heads where their code differs):

- pose: the sample's person boxes chosen as released (score above a threshold, non-maximum
  suppression, the whole image when none is left), top-down crops (padding 1.25, aspect 0.75,
  UDP warp), flip test (one forward of the crops and their mirrors), UDP decode, keypoints in
  image pixels; a degenerate box (no width or height), which the released warp would divide
  by, is dropped first;
- seg: plain resize to the input; logits resized to the image, argmax (v1: resized to the
  input size first, as mmseg does); a PNG of class ids (mode L) at the image's size;
- normal: aspect-keeping resize with centred padding (fine-tune exports, trained on resized
  images: a plain resize); L2-normalised, padding cropped, resized to the image (v1: plain
  resize, resized back, normalised after); (H, W, 3) float32 as released (``map_dtype``);
- pointmap: as normal; metric XYZ (canonical XYZ / scale, smoothed when enlarged) as float16
  (H, W, 3), the released depth's precision (``map_dtype``), and the scale (released
  convention: metric = canonical / scale; fine-tune exports, whose heads give metric =
  xyz * s, are recorded with scale 1 / s);
- depth (v1 and fine-tune exports): plain resize; relative depth resized to the image, float16 (H, W);
- albedo: as normal; clamped to [0, 1], an RGB PNG at the image's size (x 255 truncated, as released).

Shapes: B batch, K keypoints, P people, C classes.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from evaluation.annotate.config import MAP_DTYPES, PoseSettings, TaskSettings
from evaluation.annotate.models import PLATFORM, ModelInfo, Runner


@dataclasses.dataclass
class Sample:
    """One decoded sample: RGB pixels and the person boxes curation recorded for it."""

    key: str
    image: np.ndarray  # (H, W, 3) uint8 RGB
    boxes: list[list[float]]  # x1, y1, x2, y2 in image pixels, best score first
    box_scores: list[float]

    @property
    def hw(self) -> tuple[int, int]:
        return self.image.shape[0], self.image.shape[1]


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(array), allow_pickle=False)
    return out.getvalue()


def png_bytes(array: np.ndarray) -> bytes:
    """A lossless PNG of a uint8 (H, W) or RGB (H, W, 3) array (zlib level 1: masks compress well anyway)."""
    import cv2

    pixels = array[..., ::-1] if array.ndim == 3 else array  # cv2 writes BGR
    ok, data = cv2.imencode(".png", np.ascontiguousarray(pixels), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return data.tobytes()


def to_hw3(map_13HW, dtype: str = "float16") -> np.ndarray:
    """A (1, 3, H, W) tensor -> an (H, W, 3) array of ``dtype``."""
    import torch

    return map_13HW[0].permute(1, 2, 0).to(getattr(torch, dtype)).cpu().numpy()


class Predictor:
    """One task's processing around its model (see the module docstring)."""

    task: ClassVar[str]
    fields: ClassVar[list[pa.Field]]
    members: ClassVar[dict[str, str]] = {}  # binary column -> tar member extension

    def __init__(self, info: ModelInfo, settings: TaskSettings) -> None:
        self.info, self.settings = info, settings
        self.v1 = info.family == "sapiens1" and info.layout != PLATFORM  # released v1 heads' own code
        self.map_dtype = settings.map_dtype or MAP_DTYPES.get(self.task, "")

    def inputs(self, s: Sample) -> list[tuple[Any, Any]]:
        """(model input (3, h, w), context for ``finish``) per input of the sample."""
        raise NotImplementedError

    def infer(self, run: Runner, x_BCHW) -> tuple:
        return run(x_BCHW)

    def finish(self, s: Sample, outs: list[tuple], contexts: list) -> dict[str, Any]:
        """The sample's column values from its inputs' outputs (each a tuple of (1, ...) tensors)."""
        raise NotImplementedError


def _normalized(image_HW3: np.ndarray):
    from models.sapiens_processing import normalize_image

    return normalize_image(image_HW3, bgr=False)


class PosePredictor(Predictor):
    task = "pose"
    fields = [
        pa.field("pose_boxes", pa.list_(pa.list_(pa.float32(), 4))),  # P x (x1, y1, x2, y2) the crops came from
        pa.field("pose_box_scores", pa.list_(pa.float32())),  # P detector scores
        pa.field("pose_keypoints", pa.list_(pa.list_(pa.list_(pa.float32(), 2)))),  # P x K x (x, y), image pixels
        pa.field("pose_keypoint_scores", pa.list_(pa.list_(pa.float32()))),  # P x K heatmap maxima
    ]

    def __init__(self, info: ModelInfo, settings: PoseSettings) -> None:
        super().__init__(info, settings)
        self.flip_indices = None
        if settings.flip_test:
            from models.vocab import keypoint_vocab

            if not info.vocab:
                raise ValueError(
                    f"tasks.pose: {info.name} names no keypoint vocabulary, which the flip test needs "
                    "(its flip pairs): set tasks.pose.flip_test=false"
                )
            self.flip_indices = list(keypoint_vocab(info.vocab).flip_indices)

    def people(self, s: Sample) -> list[tuple[list[float], float]]:
        """(box, score) of each person the sample is annotated for, best first; the whole image
        (score 0: no detector scored it) when no box is kept and ``whole_image`` is on."""
        from models.sapiens_processing import select_people, whole_image_box

        cfg: PoseSettings = self.settings
        found = [(b, sc) for b, sc in zip(s.boxes, s.box_scores) if b[2] > b[0] and b[3] > b[1]]
        kept = select_people(
            np.asarray([b for b, _ in found], np.float32).reshape(-1, 4),
            [sc for _, sc in found],
            score_threshold=cfg.min_box_score,
            iou_threshold=cfg.nms_iou,
        )
        people = [found[i] for i in kept]
        if not people and cfg.whole_image:
            people = [(whole_image_box(s.hw).tolist(), 0.0)]
        return people[: cfg.max_people] if cfg.max_people else people

    def inputs(self, s: Sample) -> list[tuple[Any, Any]]:
        from models.sapiens_processing import crop_person

        out = []
        for box, score in self.people(s):
            crop = crop_person(s.image, box, input_hw=self.info.input_hw)
            out.append((_normalized(crop.image), (box, score, crop)))
        return out

    def infer(self, run: Runner, x_BCHW) -> tuple:
        """The heatmaps; with the flip test, the mean with the mirrored crops' flipped back
        (both in one forward)."""
        import torch

        from models.sapiens_processing import flip_back

        if self.flip_indices is None:
            return run(x_BCHW)[:1]
        both = run(torch.cat([x_BCHW, x_BCHW.flip(-1)]))[0]
        plain, mirrored = both.split(x_BCHW.shape[0])
        return ((plain + flip_back(mirrored, self.flip_indices)) / 2,)

    def finish(self, s: Sample, outs: list[tuple], contexts: list) -> dict[str, Any]:
        from models.sapiens_processing import keypoints_to_image, udp_decode

        h, w = self.info.input_hw
        keypoints, scores = [], []
        for (heatmaps,), (_, _, crop) in zip(outs, contexts):
            crop_kp, kp_scores = udp_decode(heatmaps[0].float().cpu().numpy(), (w, h))
            keypoints.append(keypoints_to_image(crop_kp, crop.center, crop.scale, (w, h))[0].tolist())
            scores.append(kp_scores[0].tolist())
        return {
            "pose_boxes": [list(map(float, box)) for box, _, _ in contexts],
            "pose_box_scores": [float(sc) for _, sc, _ in contexts],
            "pose_keypoints": keypoints,
            "pose_keypoint_scores": scores,
        }


def labels_at(logits_BCHW, image_hw: tuple[int, int]):
    """``sapiens_processing.seg_labels`` (logits resized bilinearly, then argmax), computed
    channels-last: the same labels, at a fraction of the time (an argmax over the contiguous
    class axis, first maximum on ties as ``argmax``)."""
    from models.sapiens_processing import resize_map_hwc

    return resize_map_hwc(logits_BCHW, image_hw).max(dim=1).indices


class SegPredictor(Predictor):
    task = "seg"
    fields = [pa.field("seg_png", pa.binary())]  # class ids (mode L PNG) at the image's size
    members = {"seg_png": "seg.png"}

    def inputs(self, s: Sample) -> list[tuple[Any, Any]]:
        from models.sapiens_processing import resize_plain

        return [(_normalized(resize_plain(s.image, self.info.input_hw)), None)]

    def finish(self, s: Sample, outs: list[tuple], contexts: list) -> dict[str, Any]:
        import torch

        from models.sapiens_processing import resize_map

        logits = outs[0][0]
        if self.v1:  # mmseg resizes to the input size first, then to the image
            logits = resize_map(logits, self.info.input_hw)
        return {"seg_png": png_bytes(labels_at(logits, s.hw)[0].to(torch.uint8).cpu().numpy())}


class _PaddedDense(Predictor):
    """Sapiens2's dense input: aspect-keeping resize, centred padding (v1 and fine-tune exports,
    whose training images were resized to the input size: a plain resize)."""

    def inputs(self, s: Sample) -> list[tuple[Any, Any]]:
        from models.sapiens_processing import resize_pad, resize_plain

        if self.v1 or self.info.layout == PLATFORM:
            return [(_normalized(resize_plain(s.image, self.info.input_hw)), None)]
        resized, padding = resize_pad(s.image, self.info.input_hw)
        return [(_normalized(resized), padding)]


class NormalPredictor(_PaddedDense):
    task = "normal"
    fields = [pa.field("normal_npy", pa.binary())]  # .npy (H, W, 3) unit normals, map_dtype
    members = {"normal_npy": "normal.npy"}

    def finish(self, s: Sample, outs: list[tuple], contexts: list) -> dict[str, Any]:
        from models.sapiens_processing import normals_to_image, resize_map, resize_map_hwc

        normal = outs[0][0]
        if self.v1:  # resized to the input size, then the image, normalised after
            normal = resize_map_hwc(resize_map(normal, self.info.input_hw), s.hw)
            normal = normal / (normal.norm(dim=1, keepdim=True) + 1e-5)
        else:
            normal = normals_to_image(normal, s.hw, contexts[0])
        return {"normal_npy": npy_bytes(to_hw3(normal, self.map_dtype))}


class PointmapPredictor(_PaddedDense):
    task = "pointmap"
    fields = [
        pa.field("pointmap_npy", pa.binary()),  # .npy (H, W, 3) metric XYZ, map_dtype
        pa.field("pointmap_scale", pa.float32()),  # metric = canonical / scale
    ]
    members = {"pointmap_npy": "pointmap.npy"}

    def finish(self, s: Sample, outs: list[tuple], contexts: list) -> dict[str, Any]:
        from models.sapiens_processing import pointmap_to_image

        points, scale = outs[0]
        if self.info.layout == PLATFORM:  # the platform head's metric XYZ is xyz * s
            scale = 1.0 / scale
        xyz = pointmap_to_image(points, scale, s.hw, contexts[0])
        return {"pointmap_npy": npy_bytes(to_hw3(xyz, self.map_dtype)), "pointmap_scale": float(scale.reshape(-1)[0])}


class AlbedoPredictor(_PaddedDense):
    task = "albedo"
    fields = [pa.field("albedo_png", pa.binary())]  # RGB PNG at the image's size
    members = {"albedo_png": "albedo.png"}

    def finish(self, s: Sample, outs: list[tuple], contexts: list) -> dict[str, Any]:
        from models.sapiens_processing import albedo_to_image, albedo_to_uint8

        rgb = albedo_to_image(outs[0][0], s.hw, contexts[0])[0].permute(1, 2, 0)
        return {"albedo_png": png_bytes(albedo_to_uint8(rgb).cpu().numpy())}


class DepthPredictor(Predictor):
    task = "depth"
    fields = [pa.field("depth_npy", pa.binary())]  # .npy (H, W) relative depth, map_dtype
    members = {"depth_npy": "depth.npy"}

    def inputs(self, s: Sample) -> list[tuple[Any, Any]]:
        from models.sapiens_processing import resize_plain

        return [(_normalized(resize_plain(s.image, self.info.input_hw)), None)]

    def finish(self, s: Sample, outs: list[tuple], contexts: list) -> dict[str, Any]:
        import torch

        from models.sapiens_processing import resize_map

        depth = resize_map(resize_map(outs[0][0], self.info.input_hw), s.hw)[0, 0]
        return {"depth_npy": npy_bytes(depth.to(getattr(torch, self.map_dtype)).cpu().numpy())}


PREDICTORS: dict[str, type[Predictor]] = {
    p.task: p
    for p in (PosePredictor, SegPredictor, NormalPredictor, PointmapPredictor, DepthPredictor, AlbedoPredictor)
}
