"""Text filter: OCR text detection (rapidocr, bundled PP-OCRv4 ONNX models, works offline).

Each pending image is shrunk to ``max_side``, text boxes are detected, and each box is read by
the recogniser: a box counts as text only when the recogniser is confident
(``min_confidence``), which removes the detector's false positives on textures such as flag
stars (measured on the real photos in the tests). From the confident boxes:

- ``text_coverage``: fraction of the image area inside text boxes (their union);
- ``text_box_count``: number of boxes;
- ``text_watermark``: a box looks like a watermark: long tilted (diagonal) text, or small short
  text in the band along the top or bottom edge (corners included; vertical text along the
  left/right edge).

Reasons, in this order: ``watermark_text`` for diagonal text (a diagonal watermark is large,
yet it is a watermark); ``text`` when the image is dominated by text (coverage or box count at
or above its threshold) or carries an overlaid caption (one horizontal line across most of the
width); ``watermark_text`` for small edge/corner text. Scene text in a photo (signs, jerseys)
is small, scattered and off the edges, and passes.

Shapes: B boxes, each [4, 2] corner points (x, y) in pixels of the OCR input, clockwise from
top-left.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from curation.filters.model import ModelStep, Placement
from curation.steps import Score

TEXT = "text"
WATERMARK_TEXT = "watermark_text"

TEXT_FIELDS = [
    pa.field("text_coverage", pa.float32()),  # fraction of the image area in text boxes
    pa.field("text_box_count", pa.int32()),
    pa.field("text_watermark", pa.bool_()),  # a watermark-like text box was found
]


@dataclasses.dataclass(kw_only=True)
class ContentTextConfig(Placement):
    """Settings of the OCR text filter (``content.text``). The thresholds were set on the labelled
    cases of ``tests/curation/filters/test_content_text.py`` (real photos with and without overlaid
    text, rendered captions and watermarks), which they separate; docs/results/content_filters.md."""

    enabled: bool = True
    max_side: int = 960  # images are shrunk to this longer side before OCR (smaller: faster, less small text)
    min_confidence: float = 0.7  # recogniser score a detected box needs to count as text
    coverage_threshold: float = 0.05  # "text" when text boxes cover >= this fraction of the image
    box_count_threshold: int = 20  # "text" when at least this many boxes
    caption_min_length: float = 0.6  # "text" when one horizontal line spans >= this fraction of the width
    drop_watermark_text: bool = True  # "watermark_text" for watermark-like text (else only recorded)
    edge_margin: float = 0.12  # band along an edge, as a fraction of the image side across it
    watermark_max_height: float = 0.06  # edge watermarks are small: box height / shorter image side
    watermark_max_length: float = 0.5  # ... and short: box length / image side along it
    diagonal_min_angle: float = 20.0  # diagonal text: tilted at least this (degrees) from both axes
    diagonal_min_length: float = 0.25  # ... and long: box length / shorter image side
    # device: GPU only with onnxruntime-gpu and num_gpus > 0; num_cpus is also the ONNX Runtime thread count


def check_text_config(cfg: ContentTextConfig, where: str = "content.text") -> None:
    import importlib.util

    for name in (
        "min_confidence",
        "coverage_threshold",
        "caption_min_length",
        "edge_margin",
        "watermark_max_height",
        "watermark_max_length",
        "diagonal_min_length",
    ):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"{where}.{name}={getattr(cfg, name)}: a fraction in [0, 1]")
    if not 0.0 < cfg.diagonal_min_angle < 45.0:
        raise ValueError(f"{where}.diagonal_min_angle must be in (0, 45) degrees")
    if cfg.max_side < 64 or cfg.box_count_threshold < 1:
        raise ValueError(f"{where}: max_side must be >= 64 and box_count_threshold >= 1")
    if importlib.util.find_spec("rapidocr_onnxruntime") is None:
        raise ValueError(
            f"{where}: the text filter needs rapidocr-onnxruntime "
            f"(pip install rapidocr-onnxruntime==1.4.4), or set {where}.enabled=false"
        )


@dataclasses.dataclass(frozen=True)
class TextMeasures:
    """What the confident text boxes of one image say."""

    coverage: float = 0.0
    box_count: int = 0
    caption: bool = False  # a horizontal line across most of the width (an overlaid caption)
    diagonal: bool = False  # long tilted text (a diagonal watermark)
    edge_mark: bool = False  # small text in an edge band or corner (a corner watermark, a credit)

    @property
    def watermark(self) -> bool:
        return self.diagonal or self.edge_mark


def _geometry(box_42: np.ndarray) -> tuple[float, float, float]:
    """Length along the text, height across it, and tilt of the text line in [0, 90] degrees."""
    e1, e2 = box_42[1] - box_42[0], box_42[3] - box_42[0]
    n1, n2 = float(np.hypot(*e1)), float(np.hypot(*e2))
    along = e1 if n1 >= n2 else e2
    angle = abs(np.degrees(np.arctan2(along[1], along[0]))) % 180.0
    return max(n1, n2), min(n1, n2), float(min(angle, 180.0 - angle))


def classify_box(box_42: np.ndarray, width: int, height: int, cfg: ContentTextConfig) -> str | None:
    """``diagonal``, ``caption``, ``edge_mark`` or None for one text box."""
    length, thickness, tilt = _geometry(box_42)
    short_side = min(width, height)
    if cfg.diagonal_min_angle <= tilt <= 90.0 - cfg.diagonal_min_angle:
        return "diagonal" if length >= cfg.diagonal_min_length * short_side else None
    horizontal = tilt < 45.0
    along, across = (width, height) if horizontal else (height, width)
    if horizontal and length >= cfg.caption_min_length * width:
        return "caption"
    if thickness > cfg.watermark_max_height * short_side or length > cfg.watermark_max_length * along:
        return None
    # horizontal text along the top/bottom edge (corners included), vertical text along the sides
    lo, hi = (box_42[:, 1].min(), box_42[:, 1].max()) if horizontal else (box_42[:, 0].min(), box_42[:, 0].max())
    band = cfg.edge_margin * across
    return "edge_mark" if hi <= band or lo >= across - band else None


def measure_text(boxes: list[np.ndarray], width: int, height: int, cfg: ContentTextConfig) -> TextMeasures:
    """Coverage, count and box kinds from confident text boxes in a ``width`` x ``height`` image."""
    import cv2

    if not boxes:
        return TextMeasures()
    mask = np.zeros((height, width), np.uint8)
    for b in boxes:  # one call per box: a single fillPoly over several polygons XORs their overlaps
        cv2.fillPoly(mask, [np.round(b).astype(np.int32)], 1)
    kinds = {classify_box(b, width, height, cfg) for b in boxes}
    return TextMeasures(
        coverage=float(mask.mean()),
        box_count=len(boxes),
        caption="caption" in kinds,
        diagonal="diagonal" in kinds,
        edge_mark="edge_mark" in kinds,
    )


def text_reason(m: TextMeasures, cfg: ContentTextConfig) -> str | None:
    """Diagonal text is a watermark even when large; else text-dominated; else an edge watermark."""
    if m.diagonal and cfg.drop_watermark_text:
        return WATERMARK_TEXT
    if m.coverage >= cfg.coverage_threshold or m.box_count >= cfg.box_count_threshold or m.caption:
        return TEXT
    if m.edge_mark and cfg.drop_watermark_text:
        return WATERMARK_TEXT
    return None


class OcrEngine:
    """rapidocr's detector and recogniser (no angle classifier), on RGB arrays."""

    def __init__(self, cfg: ContentTextConfig, where: str = "content.text") -> None:
        import onnxruntime
        from rapidocr_onnxruntime import RapidOCR

        cuda_ep = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
        if cfg.device == "cuda" and not cuda_ep:
            raise RuntimeError(
                f"{where}.device=cuda but onnxruntime has no CUDA provider: install "
                f"onnxruntime-gpu or set {where}.device=cpu"
            )
        use_cuda = cuda_ep and cfg.device != "cpu" and cfg.num_gpus > 0
        self.engine = RapidOCR(
            det_limit_type="max",
            det_limit_side_len=cfg.max_side,
            intra_op_num_threads=max(1, int(cfg.num_cpus)),
            inter_op_num_threads=1,
            det_use_cuda=use_cuda,
            rec_use_cuda=use_cuda,
            print_verbose=False,
        )

    def read(self, rgb_HW3: np.ndarray) -> list[tuple[np.ndarray, str, float]]:
        """(box [4, 2], text, confidence) for every detected box."""
        bgr = np.ascontiguousarray(rgb_HW3[:, :, ::-1])  # the PP-OCR models take BGR
        boxes, _ = self.engine.text_det(bgr)
        if boxes is None or len(boxes) == 0:
            return []
        boxes = [np.asarray(b, np.float32) for b in boxes]
        crops = self.engine.get_crop_img_list(bgr, [b.copy() for b in boxes])
        results, _ = self.engine.text_rec(crops)
        return [(b, r[0], float(r[1])) for b, r in zip(boxes, results, strict=True)]


class ContentText(ModelStep):
    """Adds ``text_coverage``, ``text_box_count``, ``text_watermark``; sets ``text``/``watermark_text``."""

    section = "content.text"
    Config = ContentTextConfig
    reasons = (TEXT, WATERMARK_TEXT)
    reads = ("image",)
    fields = TEXT_FIELDS
    scores = (
        Score("text_coverage", "coverage_threshold", "fraction of the image in text boxes"),
        Score("text_box_count", "box_count_threshold", "text boxes", integer=True),
    )

    def check_settings(self) -> None:
        check_text_config(self.cfg, self.section)

    def setup(self) -> None:  # ONNX Runtime picks its providers from cfg.device itself
        self.load()

    def load(self) -> None:
        self.ocr = OcrEngine(self.cfg)

    def measure(self, rgb_HW3: np.ndarray) -> TextMeasures:
        boxes = [b for b, _, conf in self.ocr.read(rgb_HW3) if conf >= self.cfg.min_confidence]
        return measure_text(boxes, rgb_HW3.shape[1], rgb_HW3.shape[0], self.cfg)

    def decode_size(self) -> dict:
        return {"max_side": self.cfg.max_side}

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict]:
        out = []
        for img in images:
            m = self.measure(np.asarray(img))
            out.append(
                {
                    "text_coverage": m.coverage,
                    "text_box_count": m.box_count,
                    "text_watermark": m.watermark,
                    "_measures": m,
                }
            )
        return out

    def reason(self, scores: dict) -> str | None:
        return text_reason(scores["_measures"], self.cfg)

    def settings(self) -> dict:
        c = self.cfg
        return {
            "engine": "rapidocr-onnxruntime PP-OCRv4 det+rec",
            **{
                k: getattr(c, k)
                for k in (
                    "max_side",
                    "min_confidence",
                    "coverage_threshold",
                    "box_count_threshold",
                    "caption_min_length",
                    "drop_watermark_text",
                    "edge_margin",
                    "watermark_max_height",
                    "watermark_max_length",
                    "diagonal_min_angle",
                    "diagonal_min_length",
                )
            },
        }

    def not_applied(self) -> dict:
        return {**super().not_applied(), "note": "images were not checked for text or text watermarks"}
