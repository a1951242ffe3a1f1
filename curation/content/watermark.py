"""Watermark filter: a LAION-style image classifier and/or a linear head on the CLIP embedding.

The classifier is a timm backbone whose classifier is replaced by a small MLP with two outputs,
on a 256x256 squashed, ImageNet-normalised input; P(watermark) = softmax[:, watermark_class].
With the defaults (``efficientnet_b3``, hidden (625, 256), class 0) it has exactly the layout
of LAION's ``watermark_model_v1.pt``, which loads as is. The CLIP head is a ``LinearHead`` file
giving P(watermark) from ``clip_embedding``. With both, ``watermark_score`` is the larger.
Rows scoring >= ``threshold`` get the reason ``watermark`` (LAION-Aesthetics kept P < 0.8).

Shapes: N images, D embedding width.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Literal

import numpy as np
import pyarrow as pa

from curation import schema
from curation.content.common import (LinearHead, check_placement, decode_pending, embeddings_of,
                                     load_state_file, mark_failed, require_file, resolve_device)
from curation.stages import Resources, Stage

WATERMARK = "watermark"

WATERMARK_FIELDS = [pa.field("watermark_score", pa.float32())]  # P(watermark)

_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)


@dataclasses.dataclass(kw_only=True)
class WatermarkFilterConfig:
    """Settings of the watermark filter (``content.watermark``)."""

    enabled: bool = True
    threshold: float = 0.8  # drop when P(watermark) >= threshold (LAION-Aesthetics kept < 0.8)
    weights: str = ""  # classifier state dict (.pt/.safetensors), e.g. LAION's watermark_model_v1.pt
    backbone: str = "efficientnet_b3"  # timm architecture (LAION named it efficientnet_b3a: same layout)
    head_hidden: tuple[int, ...] = (625, 256)  # MLP widths replacing the backbone's classifier
    watermark_class: int = 0  # output index of "watermark" (0 in LAION's model)
    input_size: int = 256
    clip_head_weights: str = ""  # optional LinearHead file on clip_embedding giving P(watermark)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 autocast on GPU
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    batch_size: int = 32
    num_actors: int = 1


def check_watermark_config(cfg: WatermarkFilterConfig, where: str = "content.watermark") -> None:
    check_placement(cfg.device, cfg.num_gpus, cfg.num_cpus, cfg.batch_size, cfg.num_actors, where)
    if not 0.0 <= cfg.threshold <= 1.0:
        raise ValueError(f"{where}.threshold={cfg.threshold}: a probability in [0, 1]")
    if cfg.watermark_class not in (0, 1):
        raise ValueError(f"{where}.watermark_class must be 0 or 1 (the classifier has two outputs)")
    if cfg.clip_head_weights:
        require_file(cfg.clip_head_weights, f"{where}.clip_head_weights", f"{where}.enabled",
                     "the CLIP watermark head")
        if cfg.weights:
            require_file(cfg.weights, f"{where}.weights", f"{where}.enabled", "the watermark classifier")
        return
    require_file(cfg.weights, f"{where}.weights", f"{where}.enabled",
                 f"the watermark classifier ({cfg.backbone} + MLP {list(cfg.head_hidden)}, e.g. LAION's "
                 f"watermark_model_v1.pt), or a CLIP head in {where}.clip_head_weights")


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

    def __init__(self, cfg: WatermarkFilterConfig, where: str = "content.watermark") -> None:
        import torch

        self.cfg = cfg
        self.device = resolve_device(cfg.device, where)
        model = build_classifier(cfg.backbone, cfg.head_hidden)
        try:
            model.load_state_dict(load_state_file(cfg.weights), strict=True)
        except RuntimeError as err:
            raise ValueError(f"{where}.weights={cfg.weights!r} does not fit {where}.backbone={cfg.backbone!r} "
                             f"with {where}.head_hidden={list(cfg.head_hidden)}: {err}") from None
        self.model = model.eval().to(self.device)
        precision = cfg.precision if cfg.precision != "auto" else ("bf16" if self.device == "cuda" else "fp32")
        self.autocast_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]

    def predict(self, images: list) -> np.ndarray:
        import torch
        from PIL import Image

        size = (self.cfg.input_size, self.cfg.input_size)
        x = np.stack([np.asarray(im.resize(size, Image.Resampling.BILINEAR), np.float32) for im in images])
        x = torch.from_numpy(((x / 255.0 - _MEAN) / _STD).transpose(0, 3, 1, 2).copy()).to(self.device)
        autocast = (torch.autocast(device_type=self.device, dtype=self.autocast_dtype)
                    if self.autocast_dtype is not None else contextlib.nullcontext())
        with torch.inference_mode(), autocast:
            probs = torch.softmax(self.model(x).float(), dim=1)[:, self.cfg.watermark_class]
        return probs.cpu().numpy().astype(np.float32)


class WatermarkFilterStage(Stage):
    """Adds ``watermark_score`` to pending rows; sets ``watermark`` where it is >= threshold."""

    name = "watermark_filter"
    reasons = (WATERMARK,)
    uses_model = True

    def __init__(self, cfg: WatermarkFilterConfig) -> None:
        self.cfg = cfg
        self.classifier: WatermarkClassifier | None = None
        self.clip_head: LinearHead | None = None

    def resources(self) -> Resources:
        c = self.cfg
        return Resources(num_cpus=c.num_cpus, num_gpus=c.num_gpus, batch_size=c.batch_size,
                         num_actors=c.num_actors)

    def setup(self) -> None:
        if self.cfg.weights:
            self.classifier = WatermarkClassifier(self.cfg)
        if self.cfg.clip_head_weights:
            self.clip_head = LinearHead.load(self.cfg.clip_head_weights)

    def process(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        mask = schema.pending_mask(batch)
        scores: list = [None] * n
        errors: dict[int, str] = {}
        if self.classifier is not None:
            images, errors = decode_pending(batch, mask, min_side=self.cfg.input_size)
            rows = sorted(images)
            for start in range(0, len(rows), self.cfg.batch_size):
                chunk = rows[start:start + self.cfg.batch_size]
                for i, p in zip(chunk, self.classifier.predict([images[i] for i in chunk]), strict=True):
                    scores[i] = float(p)
        if self.clip_head is not None:
            rows, emb_ND = embeddings_of(batch, mask, self.name)
            if rows:
                for i, p in zip(rows, self.clip_head.predict(emb_ND), strict=True):
                    scores[i] = float(p) if scores[i] is None else max(scores[i], float(p))
        batch = schema.typed_columns(batch, WATERMARK_FIELDS, {"watermark_score": scores})
        batch = schema.set_reasons(batch, [WATERMARK if s is not None and s >= self.cfg.threshold else None
                                           for s in scores])
        return mark_failed(batch, errors, self.name)

    def describe(self) -> dict:
        c = self.cfg
        return {"name": self.name, "applied": True, "threshold": c.threshold,
                "classifier": {"weights": c.weights, "backbone": c.backbone, "head_hidden": list(c.head_hidden),
                               "input_size": c.input_size} if c.weights else None,
                "clip_head_weights": c.clip_head_weights or None}
