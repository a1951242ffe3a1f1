"""Salient-person detection: a model step, loaded once per actor, batched, on a GPU when present.

Backends (``detector.backend``):

- ``centernet_onnx``: the CenterNet COCO detector in ONNX form (``shared/assets/models``):
  input float32 [1, 512, 512, 3] RGB in 0..255 (image resized, not letterboxed), output
  ``tower_0/detections`` [1, 100, 6] = x1, y1, x2, y2 (input pixels), score, class (0 = person).
- ``ultralytics``: any YOLO ``.pt`` or exported ``.onnx`` file (or a folder holding one),
  loaded from a local path; class 0 = person (COCO).

Rule (Sapiens): keep an image with at least one person box scoring >= the detector's
threshold whose size is >= ``min_box_size`` pixels, the size being the box's height, long
side or short side (``box_size_measure``) in the normalised image's pixels. Every person box
at or above ``record_threshold`` is recorded with its score, not only the best one. Per image,
for samplers and audits: ``person_count``, the boxes scoring >= the threshold (the confident
ones), and ``person_max_area``, the largest confident box's area over the image's (0 when none).

The score threshold is a per-detector setting (``curation.filters.thresholds``): the CenterNet
asset's default was measured here (``PUBLISHED``); the Sapiens rule (> 0.9) was set for Sapiens'
own detector and measured for no YOLO model, so the ``ultralytics`` backend warns at start-up
unless ``calibration`` says what its threshold was measured on.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from PIL import Image

from curation import schema
from curation.filters.model import ModelStep, Placement, WeightsUnavailableError
from curation.filters.thresholds import Published
from curation.steps import Score

Box = tuple[float, float, float, float]

# Detector scores are calibrated differently: the Sapiens rule (> 0.9) was set for Sapiens' own
# detector (no source for any YOLO model: warned); the CenterNet asset's 0.3 is PUBLISHED below.
DEFAULT_SCORE_THRESHOLDS = {"ultralytics": 0.9, "centernet_onnx": 0.3}
DEFAULT_INPUT_SIZES = {"ultralytics": 640, "centernet_onnx": 512}
PUBLISHED = {
    "centernet_onnx": Published(
        (0.3,),
        "measured here: the CenterNet asset scores the people of 16 real photos 0.38-0.86 and finds "
        "none in 12 real photos without people (shared/assets/PROVENANCE.md)",
    ),
}


@dataclasses.dataclass(kw_only=True)
class DetectorConfig(Placement):
    """Salient-person detection (``detector``): keep an image with >= 1 person box scoring >=
    score_threshold whose size (measured as ``box_size_measure``) is >= ``min_box_size`` pixels."""

    backend: Literal["centernet_onnx", "ultralytics", "none"] = "centernet_onnx"
    weights: str = ""  # .onnx for centernet_onnx; .pt/.onnx file or a folder holding one for ultralytics
    score_threshold: float | None = None  # None: the backend's default (DEFAULT_SCORE_THRESHOLDS)
    min_box_size: int = 300
    box_size_measure: Literal["height", "long_side", "short_side"] = "height"
    record_threshold: float = 0.2  # every person box at or above this score goes into the metadata
    calibration: str = ""  # what score_threshold was measured on, where PUBLISHED has no source for it
    input_size: int | None = None  # None: the backend's default (DEFAULT_INPUT_SIZES)
    batch_size: int = 8
    intra_op_threads: int = 1  # ONNX Runtime threads per actor on CPU

    def __post_init__(self) -> None:
        if self.score_threshold is not None and not 0 <= self.score_threshold <= 1:
            raise ValueError(f"detector.score_threshold must be in [0, 1], got {self.score_threshold}")
        if not 0 <= self.record_threshold <= 1:
            raise ValueError("detector.record_threshold must be in [0, 1]")

    @property
    def threshold(self) -> float:
        return (
            self.score_threshold
            if self.score_threshold is not None
            else DEFAULT_SCORE_THRESHOLDS.get(self.backend, 0.5)
        )

    @property
    def size(self) -> int:
        return self.input_size or DEFAULT_INPUT_SIZES.get(self.backend, 640)


def box_size(box: Box, measure: str) -> float:
    w, h = box[2] - box[0], box[3] - box[1]
    if measure == "height":
        return h
    if measure == "long_side":
        return max(w, h)
    if measure == "short_side":
        return min(w, h)
    raise ValueError(f"detector.box_size_measure must be height, long_side or short_side, got {measure!r}")


def max_area(boxes: list[Box], scores: list[float], threshold: float, width: int, height: int) -> float:
    """The largest area of a box scoring >= ``threshold`` (clipped to the image) over the image's
    area, in [0, 1]; 0 when no box does."""
    if width <= 0 or height <= 0:
        return 0.0
    areas = [
        max(0.0, min(b[2], width) - max(b[0], 0.0)) * max(0.0, min(b[3], height) - max(b[1], 0.0))
        for b, s in zip(boxes, scores)
        if s >= threshold
    ]
    return max(areas, default=0.0) / (width * height)


def salient_counts(boxes: list[Box], scores: list[float], cfg: DetectorConfig) -> tuple[int, int]:
    """(person_count, salient_person_count) under the configured rule."""
    confident = [b for b, s in zip(boxes, scores) if s >= cfg.threshold]
    salient = [b for b in confident if box_size(b, cfg.box_size_measure) >= cfg.min_box_size]
    return len(confident), len(salient)


_DISABLE = "detector.backend=none to run without person detection"


def resolve_weights(path: str, suffixes: tuple[str, ...]) -> Path:
    """A weights file, or the first matching file in a model folder; a one-line error otherwise."""
    kinds = "/".join(suffixes)
    if not path:
        raise WeightsUnavailableError(
            f"detector.weights is not set: give a local model file ({kinds}), or set {_DISABLE}"
        )
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(f for f in p.iterdir() if f.suffix in suffixes)
        if not found:
            raise WeightsUnavailableError(f"detector.weights folder {str(p)!r} holds no {kinds} file")
        return found[0]
    if not p.is_file():
        raise WeightsUnavailableError(
            f"detector.weights {str(p)!r} does not exist: give a local model file "
            f"({kinds}); nothing is downloaded at run time. Or set {_DISABLE}"
        )
    if p.suffix not in suffixes:
        raise ValueError(f"detector.weights {str(p)!r} must be a {kinds} file")
    return p


class CenterNetOnnx:
    """The CenterNet person detector through ONNX Runtime (CUDA provider when present)."""

    suffixes = (".onnx",)

    def __init__(self, cfg: DetectorConfig) -> None:
        import onnxruntime as ort

        self.cfg = cfg
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = cfg.intra_op_threads
        opts.inter_op_num_threads = 1
        available = ort.get_available_providers()
        providers = ["CPUExecutionProvider"]
        if cfg.device in ("auto", "cuda") and "CUDAExecutionProvider" in available:
            providers.insert(0, "CUDAExecutionProvider")
        elif cfg.device == "cuda":
            raise RuntimeError("detector.device=cuda but ONNX Runtime has no CUDA provider (install onnxruntime-gpu)")
        self.session = ort.InferenceSession(str(resolve_weights(cfg.weights, self.suffixes)), opts, providers=providers)
        self.input_name = self.session.get_inputs()[0].name
        outputs = [o.name for o in self.session.get_outputs()]
        self.output_name = next((n for n in outputs if n.endswith("detections")), outputs[-1])

    def detect(self, images: list[Image.Image], sizes: list[tuple[int, int]]) -> list[tuple[list[Box], list[float]]]:
        s = self.cfg.size
        results = []
        for im, (w, h) in zip(images, sizes):  # the exported graph has a fixed batch of 1
            x = np.asarray(im.resize((s, s), Image.Resampling.BILINEAR), dtype=np.float32)[None]
            det = self.session.run([self.output_name], {self.input_name: x})[0][0]
            keep = (det[:, 5] == 0) & (det[:, 4] >= self.cfg.record_threshold)
            sx, sy = w / s, h / s
            boxes = [
                (
                    float(np.clip(d[0] * sx, 0, w)),
                    float(np.clip(d[1] * sy, 0, h)),
                    float(np.clip(d[2] * sx, 0, w)),
                    float(np.clip(d[3] * sy, 0, h)),
                )
                for d in det[keep]
            ]
            results.append((boxes, [float(v) for v in det[keep][:, 4]]))
        return results


def yolo_class() -> type:
    """ultralytics' ``YOLO``, with Pillow's own ``Image.open`` put back.

    Importing ultralytics replaces ``PIL.Image.open`` process-wide by a wrapper that, on any
    bytes Pillow cannot identify, imports (or tries to pip-install) pi-heif: a hostile
    input's ``UnidentifiedImageError`` would surface as ``ModuleNotFoundError`` in every
    decode that shares the worker. We decode with Pillow's plugins only.
    """
    from ultralytics import YOLO
    from ultralytics.utils import patches

    Image.open = getattr(patches, "_image_open", Image.open)
    return YOLO


class UltralyticsYolo:
    """Any ultralytics YOLO model from a local ``.pt``/``.onnx`` file; batched predict, class 0 only."""

    suffixes = (".pt", ".onnx")

    def __init__(self, cfg: DetectorConfig) -> None:
        YOLO = yolo_class()
        self.cfg = cfg
        weights = resolve_weights(cfg.weights, self.suffixes)
        self.model = YOLO(str(weights), task="detect")
        if cfg.device == "auto":
            import torch

            self.device = "cuda:0" if torch.cuda.is_available() else "cpu"
        else:
            self.device = "cuda:0" if cfg.device == "cuda" else "cpu"

    def detect(self, images: list[Image.Image], sizes: list[tuple[int, int]]) -> list[tuple[list[Box], list[float]]]:
        arrays = [np.asarray(im)[:, :, ::-1] for im in images]  # ultralytics takes numpy images as BGR
        preds = self.model.predict(
            arrays,
            imgsz=self.cfg.size,
            conf=self.cfg.record_threshold,
            classes=[0],
            device=self.device,
            verbose=False,
            batch=len(arrays),
        )
        results = []
        for pred, im, (w, h) in zip(preds, images, sizes):
            sx, sy = w / im.width, h / im.height
            xyxy = pred.boxes.xyxy.cpu().numpy() if len(pred.boxes) else np.zeros((0, 4))
            conf = pred.boxes.conf.cpu().numpy() if len(pred.boxes) else np.zeros((0,))
            boxes = [(float(b[0] * sx), float(b[1] * sy), float(b[2] * sx), float(b[3] * sy)) for b in xyxy]
            results.append((boxes, [float(c) for c in conf]))
        return results


BACKENDS = {"centernet_onnx": CenterNetOnnx, "ultralytics": UltralyticsYolo}


def check_detector_config(cfg: DetectorConfig) -> None:
    """Start-up check on the driver: a missing model is a clear error before any work starts."""
    if cfg.backend == "none":
        return
    if cfg.backend not in BACKENDS:
        raise ValueError(f"detector.backend must be one of {sorted(BACKENDS)} or none, got {cfg.backend!r}")
    resolve_weights(cfg.weights, BACKENDS[cfg.backend].suffixes)


class Detector(ModelStep):
    """Scores pending rows; rows without a salient person get reason ``no_salient_person``."""

    section = "detector"
    Config = DetectorConfig
    reasons = (schema.NO_SALIENT_PERSON,)
    reads = ("image", "width", "height")
    fields = schema.PERSON_FIELDS
    scores = (Score("person_score_max", "score_threshold", "best person score"),)
    threshold_setting = "score_threshold"

    @property
    def enabled(self) -> bool:
        return self.cfg.backend != "none"

    def not_applied(self) -> dict:
        return {"why": "detector.backend=none"}

    def check(self) -> None:
        check_detector_config(self.cfg)
        self.check_threshold()

    def threshold_value(self) -> float:
        return self.cfg.threshold

    def published_threshold(self) -> Published | None:
        return PUBLISHED.get(self.cfg.backend)

    def calibration_hint(self) -> str:
        return (
            "score labelled photos with and without people with this detector (a pilot run's manifest "
            "holds each image's best person score, person_score_max) and set detector.score_threshold "
            "where they separate, with detector.calibration saying what it was measured on"
        )

    def weight_files(self) -> dict[str, str]:
        return {"detector.weights": str(resolve_weights(self.cfg.weights, BACKENDS[self.cfg.backend].suffixes))}

    def setup(self) -> None:  # each backend picks its own device (ONNX Runtime providers, torch)
        self.load()

    def load(self) -> None:
        self.model = BACKENDS[self.cfg.backend](self.cfg)

    def decode_size(self) -> dict:
        return {"min_side": self.cfg.size}  # JPEG draft decoding down to about the model input

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict]:
        widths, heights = batch.column("width").to_pylist(), batch.column("height").to_pylist()
        sizes = [(widths[i], heights[i]) for i in rows]
        out = []
        for (boxes, scores), (w, h) in zip(self.model.detect(images, sizes), sizes, strict=True):
            order = sorted(range(len(scores)), key=lambda j: -scores[j])
            boxes, scores = [boxes[j] for j in order], [scores[j] for j in order]
            count, salient = salient_counts(boxes, scores, self.cfg)
            out.append(
                {
                    "person_boxes": [list(b) for b in boxes],
                    "person_scores": scores,
                    "person_count": count,
                    "salient_person_count": salient,
                    "person_score_max": scores[0] if scores else 0.0,
                    "person_max_area": max_area(boxes, scores, self.cfg.threshold, w, h),
                }
            )
        return out

    def reason(self, scores: dict) -> str | None:
        return schema.NO_SALIENT_PERSON if scores["salient_person_count"] == 0 else None

    def settings(self) -> dict:
        return {
            "backend": self.cfg.backend,
            "weights": self.cfg.weights,
            "score_threshold": self.cfg.threshold,
            "min_box_size": self.cfg.min_box_size,
            "box_size_measure": self.cfg.box_size_measure,
        }
