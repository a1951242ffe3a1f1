"""Watermark filter: a LAION-style image classifier and/or a linear head on the CLIP embedding.

The classifier is a timm backbone whose classifier is replaced by a small MLP with two outputs,
on a 256x256 squashed, ImageNet-normalised input; P(watermark) = softmax[:, watermark_class].
With the defaults (``efficientnet_b3``, hidden (625, 256), class 0) it has exactly the layout
of LAION's ``watermark_model_v1.pt``, which loads as is. The CLIP head is a ``LinearHead`` file
giving P(watermark) from ``clip_embedding``. With both, ``watermark_score`` is the larger.
Rows scoring >= ``threshold`` get the reason ``watermark``. The shipped 0.8 is LAION's own cut-off
with its classifier (``PUBLISHED``); with a CLIP head, or at another value, the threshold needs
its ``calibration`` record (``pipelines/calibrate.py watermark``), or the step warns at start-up
(``curation.filters.thresholds``).

Shapes: N images, D embedding width.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import pyarrow as pa

from curation.filters.model import (
    EMBEDDING_COLUMN,
    LinearHead,
    ModelStep,
    Placement,
    autocast,
    embeddings_of,
    load_state_file,
    resolve_device,
)
from curation.filters.thresholds import Published
from curation.steps import Score

WATERMARK = "watermark"

PUBLISHED = Published(
    (0.8,),
    "LAION's cut-off with its classifier (watermark_model_v1): LAION-Aesthetics kept LAION-5B rows with "
    "pwatermark < 0.8 (github.com/rom1504/laion-prepro, laion5B/aesthetic/aesthetic_join.py)",
)

WATERMARK_FIELDS = [pa.field("watermark_score", pa.float32())]  # P(watermark)

_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)


@dataclasses.dataclass(kw_only=True)
class ContentWatermarkConfig(Placement):
    """Settings of the watermark filter (``content.watermark``)."""

    enabled: bool = True
    threshold: float = 0.8  # drop when P(watermark) >= threshold (0.8: LAION's, see PUBLISHED)
    calibration: str = ""  # what another threshold was measured on (pipelines/calibrate.py writes it)
    weights: str = ""  # classifier state dict (.pt/.safetensors), e.g. LAION's watermark_model_v1.pt
    backbone: str = "efficientnet_b3"  # timm architecture (LAION named it efficientnet_b3a: same layout)
    head_hidden: tuple[int, ...] = (625, 256)  # MLP widths replacing the backbone's classifier
    watermark_class: int = 0  # output index of "watermark" (0 in LAION's model)
    input_size: int = 256
    clip_head_weights: str = ""  # optional LinearHead file on clip_embedding giving P(watermark)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 autocast on GPU
    batch_size: int = 32


def build_classifier(backbone: str, head_hidden: tuple[int, ...], num_classes: int = 2):
    """The timm backbone with its classifier replaced by the MLP head (random weights)."""
    import timm
    from torch import nn

    model = timm.create_model(backbone, pretrained=False)
    layers: list = []
    width = getattr(model, "head_hidden_size", None) or model.num_features  # input of the classifier
    for i, hidden in enumerate(head_hidden):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if i == 0:
            layers.append(nn.Dropout(p=0.3))  # LAION's layout: keeps the state-dict indices
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    parent, _, attr = model.pretrained_cfg["classifier"].rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, nn.Sequential(*layers))
    return model


class WatermarkClassifier:
    """The classifier loaded from its weights file, batched P(watermark) for PIL RGB images."""

    def __init__(self, cfg: ContentWatermarkConfig, where: str = "content.watermark") -> None:

        self.cfg = cfg
        self.device = resolve_device(cfg.device, where)
        model = build_classifier(cfg.backbone, cfg.head_hidden)
        try:
            model.load_state_dict(load_state_file(cfg.weights), strict=True)
        except RuntimeError as err:
            raise ValueError(
                f"{where}.weights={cfg.weights!r} does not fit {where}.backbone={cfg.backbone!r} "
                f"with {where}.head_hidden={list(cfg.head_hidden)}: {err}"
            ) from None
        self.model = model.eval().to(self.device)

    def predict(self, images: list) -> np.ndarray:
        import torch
        from PIL import Image

        size = (self.cfg.input_size, self.cfg.input_size)
        x = np.stack([np.asarray(im.resize(size, Image.Resampling.BILINEAR), np.float32) for im in images])
        x = torch.from_numpy(((x / 255.0 - _MEAN) / _STD).transpose(0, 3, 1, 2).copy()).to(self.device)
        with torch.inference_mode(), autocast(self.cfg.precision, self.device):
            probs = torch.softmax(self.model(x).float(), dim=1)[:, self.cfg.watermark_class]
        return probs.cpu().numpy().astype(np.float32)


class ContentWatermark(ModelStep):
    """Adds ``watermark_score`` to pending rows; sets ``watermark`` where it is >= threshold."""

    section = "content.watermark"
    Config = ContentWatermarkConfig
    reasons = (WATERMARK,)
    fields = WATERMARK_FIELDS
    scores = (Score("watermark_score", "threshold", "P(watermark)"),)
    threshold_setting = "threshold"

    def __init__(self, cfg: ContentWatermarkConfig) -> None:
        super().__init__(cfg)
        self.classifier: WatermarkClassifier | None = None
        self.clip_head: LinearHead | None = None

    @property
    def needs_images(self) -> bool:
        return bool(self.cfg.weights)

    def columns_read(self) -> tuple[str, ...]:
        return (("image",) if self.cfg.weights else ()) + ((EMBEDDING_COLUMN,) if self.cfg.clip_head_weights else ())

    def check_settings(self) -> None:
        if not 0.0 <= self.cfg.threshold <= 1.0:
            raise ValueError(f"{self.section}.threshold={self.cfg.threshold}: a probability in [0, 1]")
        if self.cfg.watermark_class not in (0, 1):
            raise ValueError(f"{self.section}.watermark_class must be 0 or 1 (the classifier has two outputs)")

    def published_threshold(self) -> Published | None:
        return None if self.cfg.clip_head_weights else PUBLISHED  # LAION's value is its classifier's

    def required_files(self) -> dict[str, tuple[str, str]]:
        c, files = self.cfg, {}
        if c.clip_head_weights:
            files["clip_head_weights"] = (c.clip_head_weights, "the CLIP watermark head")
        if c.weights or not c.clip_head_weights:
            files["weights"] = (
                c.weights,
                f"the watermark classifier ({c.backbone} + MLP {list(c.head_hidden)}, e.g. "
                f"LAION's watermark_model_v1.pt), or a CLIP head in "
                f"{self.section}.clip_head_weights",
            )
        return files

    def setup(self) -> None:  # the classifier resolves its device itself
        self.load()

    def load(self) -> None:
        if self.cfg.weights:
            self.classifier = WatermarkClassifier(self.cfg, self.section)
        if self.cfg.clip_head_weights:
            self.clip_head = LinearHead.load(self.cfg.clip_head_weights)

    def decode_size(self) -> dict:
        return {"min_side": self.cfg.input_size}

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict | None]:
        scores: dict[int, float] = {}
        if self.classifier is not None:
            scores = {i: float(p) for i, p in zip(rows, self.classifier.predict(images), strict=True)}
        if self.clip_head is not None:
            mask = [False] * batch.num_rows
            for i in rows:
                mask[i] = True
            have, emb_ND = embeddings_of(batch, mask, self.name)
            for i, p in zip(have, self.clip_head.predict(emb_ND) if have else [], strict=True):
                scores[i] = max(scores.get(i, float(p)), float(p))
        return [{"watermark_score": scores[i]} if i in scores else None for i in rows]

    def reason(self, scores: dict) -> str | None:
        return WATERMARK if scores["watermark_score"] >= self.cfg.threshold else None

    def settings(self) -> dict:
        c = self.cfg
        return {
            "threshold": c.threshold,
            "classifier": {
                "weights": c.weights,
                "backbone": c.backbone,
                "head_hidden": list(c.head_hidden),
                "input_size": c.input_size,
            }
            if c.weights
            else None,
            "clip_head_weights": c.clip_head_weights or None,
        }

    def not_applied(self) -> dict:
        return {**super().not_applied(), "note": "images were not checked for watermarks by the classifier"}
