"""Salient-person detection: a model stage, loaded once per actor, batched, on a GPU when present.

Backends (``detector.backend``):

- ``centernet_onnx``: the CenterNet COCO detector in ONNX form (``shared/assets/models``):
  input float32 [1, 512, 512, 3] RGB in 0..255 (image resized, not letterboxed), output
  ``tower_0/detections`` [1, 100, 6] = x1, y1, x2, y2 (input pixels), score, class (0 = person).
- ``ultralytics``: any YOLO ``.pt`` or exported ``.onnx`` file (or a folder holding one),
  loaded from a local path; class 0 = person (COCO).

Rule (Sapiens): keep an image with at least one person box scoring >= the detector's
threshold whose size is >= ``min_box_size`` pixels, the size being the box's height, long
side or short side (``box_size_measure``) in the normalised image's pixels. Every person box
at or above ``record_threshold`` is recorded with its score, not only the best one.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

from curation import schema
from curation.config import DetectorConfig
from curation.stages import Resources, Stage

Box = tuple[float, float, float, float]


def box_size(box: Box, measure: str) -> float:
    w, h = box[2] - box[0], box[3] - box[1]
    if measure == "height":
        return h
    if measure == "long_side":
        return max(w, h)
    if measure == "short_side":
        return min(w, h)
    raise ValueError(f"detector.box_size_measure must be height, long_side or short_side, got {measure!r}")


def salient_counts(boxes: list[Box], scores: list[float], cfg: DetectorConfig) -> tuple[int, int]:
    """(person_count, salient_person_count) under the configured rule."""
    confident = [b for b, s in zip(boxes, scores) if s >= cfg.threshold]
    salient = [b for b in confident if box_size(b, cfg.box_size_measure) >= cfg.min_box_size]
    return len(confident), len(salient)


def load_for_detection(jpeg: bytes, size: int) -> Image.Image:
    """Decode at reduced scale (JPEG draft mode) when the image is much larger than the model input."""
    im = Image.open(io.BytesIO(jpeg))
    im.draft("RGB", (size, size))
    return im.convert("RGB")


def resolve_weights(path: str, suffixes: tuple[str, ...]) -> Path:
    """A weights file, or the single matching file in a model folder; a clear error otherwise."""
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(f for f in p.iterdir() if f.suffix in suffixes)
        if not found:
            raise FileNotFoundError(f"detector.weights folder {str(p)!r} holds no {'/'.join(suffixes)} file")
        return found[0]
    if not p.is_file():
        raise FileNotFoundError(f"detector.weights {str(p)!r} does not exist: give a local model file "
                                f"({'/'.join(suffixes)}); nothing is downloaded at run time")
    if p.suffix not in suffixes:
        raise ValueError(f"detector.weights {str(p)!r} must be a {'/'.join(suffixes)} file")
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
            boxes = [(float(np.clip(d[0] * sx, 0, w)), float(np.clip(d[1] * sy, 0, h)),
                      float(np.clip(d[2] * sx, 0, w)), float(np.clip(d[3] * sy, 0, h))) for d in det[keep]]
            results.append((boxes, [float(v) for v in det[keep][:, 4]]))
        return results


class UltralyticsYolo:
    """Any ultralytics YOLO model from a local ``.pt``/``.onnx`` file; batched predict, class 0 only."""

    suffixes = (".pt", ".onnx")

    def __init__(self, cfg: DetectorConfig) -> None:
        from ultralytics import YOLO

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
        preds = self.model.predict(arrays, imgsz=self.cfg.size, conf=self.cfg.record_threshold, classes=[0],
                                   device=self.device, verbose=False, batch=len(arrays))
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


class PersonDetectionStage(Stage):
    """Scores pending rows; rows without a salient person get reason ``no_salient_person``."""

    name = "person_detection"
    reasons = (schema.NO_SALIENT_PERSON,)
    uses_model = True

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self.model = None

    def resources(self) -> Resources:
        return Resources(num_cpus=self.cfg.num_cpus, num_gpus=self.cfg.num_gpus,
                         batch_size=self.cfg.batch_size, num_actors=self.cfg.num_actors)

    def setup(self) -> None:
        self.model = BACKENDS[self.cfg.backend](self.cfg)

    def process(self, batch: pa.Table) -> pa.Table:
        pending = schema.pending_mask(batch)
        n = batch.num_rows
        cols: dict[str, list] = {f.name: [None] * n for f in schema.PERSON_FIELDS}
        idx = [i for i in range(n) if pending[i]]
        reasons: list[str | None] = [None] * n
        if idx:
            images = batch.column("image").to_pylist()
            widths, heights = batch.column("width").to_pylist(), batch.column("height").to_pylist()
            loaded = [load_for_detection(images[i], self.cfg.size) for i in idx]
            sizes = [(widths[i], heights[i]) for i in idx]
            for i, (boxes, scores) in zip(idx, self.model.detect(loaded, sizes)):
                order = sorted(range(len(scores)), key=lambda j: -scores[j])
                boxes, scores = [boxes[j] for j in order], [scores[j] for j in order]
                count, salient = salient_counts(boxes, scores, self.cfg)
                cols["person_boxes"][i] = [list(b) for b in boxes]
                cols["person_scores"][i] = scores
                cols["person_count"][i] = count
                cols["salient_person_count"][i] = salient
                cols["person_score_max"][i] = scores[0] if scores else 0.0
                if salient == 0:
                    reasons[i] = schema.NO_SALIENT_PERSON
        batch = schema.typed_columns(batch, schema.PERSON_FIELDS, cols)
        return schema.set_reasons(batch, reasons)

    def describe(self) -> dict:
        return {"name": self.name, "applied": True, "backend": self.cfg.backend, "weights": self.cfg.weights,
                "score_threshold": self.cfg.threshold, "min_box_size": self.cfg.min_box_size,
                "box_size_measure": self.cfg.box_size_measure}
