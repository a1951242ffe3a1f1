"""CLIP image embeddings (open_clip), computed once per image and kept as a manifest column.

``clip_embedding`` (list<float32>, L2-normalised) feeds the artistic and watermark heads and
semantic dedup, and is written to the manifest/Parquet output. The model comes from
configuration: an open_clip architecture name plus a local checkpoint file (or an open_clip
pretrained tag where the machine can download), or an ``hf-hub:``/``local-dir:`` source.

Shapes: N images, P prompts, D embedding width.
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa

from curation import schema
from curation.content.common import (EMBEDDING_COLUMN, WeightsUnavailableError, check_placement,
                                     decode_pending, mark_failed, require_file, resolve_device, scatter)
from curation.stages import Resources, Stage

EMBEDDING_FIELDS = [pa.field(EMBEDDING_COLUMN, pa.list_(pa.float32()))]

_SCHEMAS = ("hf-hub:", "local-dir:")


@dataclasses.dataclass(kw_only=True)
class ClipEmbeddingConfig:
    """Settings of the CLIP embedding stage (``content.embedding``)."""

    enabled: bool = True
    # open_clip architecture (``ViT-L-14``, ``ViT-B-32``, ...) or ``local-dir:/folder`` holding
    # open_clip_config.json + weights, or ``hf-hub:org/repo`` where the machine can download.
    model: str = "ViT-L-14"
    # Checkpoint file (.pt/.bin/.safetensors) for a named architecture, or an open_clip pretrained
    # tag (e.g. ``openai``) where downloads work. Unused with ``local-dir:``/``hf-hub:`` models.
    weights: str = ""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 autocast on GPU, fp32 on CPU
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_gpus: float = 0.0  # per actor; fractional shares one GPU between actors
    num_cpus: float = 1.0
    batch_size: int = 64
    num_actors: int = 1


def check_clip_config(cfg: ClipEmbeddingConfig, where: str = "content.embedding") -> None:
    """Start-up validation: the model and its weights are available (raises with what to fix)."""
    check_placement(cfg.device, cfg.num_gpus, cfg.num_cpus, cfg.batch_size, cfg.num_actors, where)
    enabled = f"{where}.enabled"
    if cfg.model.startswith("local-dir:"):
        folder = Path(cfg.model[len("local-dir:"):]).expanduser()
        if not (folder / "open_clip_config.json").is_file():
            raise WeightsUnavailableError(
                f"{where}.model={cfg.model!r}: no open_clip_config.json in {folder}. Fix {where}.model, "
                f"or disable the filter with {enabled}=false")
        if not any(folder.glob(p) for p in ("*.safetensors", "*.bin", "*.pth")):
            raise WeightsUnavailableError(
                f"{where}.model={cfg.model!r}: no weights (*.safetensors, *.bin, *.pth) in {folder}. "
                f"Fix {where}.model, or disable the filter with {enabled}=false")
        return
    if cfg.model.startswith("hf-hub:"):
        return  # downloaded by the worker; only possible where the hub is reachable
    import open_clip

    if cfg.model not in open_clip.list_models():
        raise ValueError(f"{where}.model={cfg.model!r} is not an open_clip architecture; use one of "
                         f"open_clip.list_models() or a local-dir:/hf-hub: source")
    if cfg.weights and not Path(cfg.weights).expanduser().is_file():
        if cfg.weights in open_clip.list_pretrained_tags_by_model(cfg.model):
            return  # a pretrained tag, downloaded by each worker (needs network)
    require_file(cfg.weights, f"{where}.weights", enabled,
                 f"CLIP weights for {cfg.model} (a checkpoint file, or an open_clip pretrained tag "
                 f"such as {open_clip.list_pretrained_tags_by_model(cfg.model)[:3]} where downloads work)")


class ClipModel:
    """An open_clip model ready for inference, with its image transform and tokenizer."""

    def __init__(self, cfg: ClipEmbeddingConfig, where: str = "content.embedding") -> None:
        import open_clip
        import torch

        self.device = resolve_device(cfg.device, where)
        named = not cfg.model.startswith(_SCHEMAS)
        model, _, preprocess = open_clip.create_model_and_transforms(
            cfg.model, pretrained=(cfg.weights or None) if named else None, device=self.device,
            require_pretrained=True)
        self.model = model.eval()
        self.preprocess = preprocess
        self.tokenizer = open_clip.get_tokenizer(cfg.model)
        size = self.model.visual.image_size
        self.input_side = int(max(size) if isinstance(size, (tuple, list)) else size)
        precision = cfg.precision
        if precision == "auto":
            precision = "bf16" if self.device == "cuda" else "fp32"
        self.autocast_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]

    def _autocast(self):
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device, dtype=self.autocast_dtype)

    def encode_images(self, images: list) -> np.ndarray:
        """L2-normalised image embeddings, float32 [N, D], for PIL RGB images."""
        import torch

        x = torch.stack([self.preprocess(im) for im in images]).to(self.device)
        with torch.inference_mode(), self._autocast():
            emb_ND = self.model.encode_image(x)
        return _normalise(emb_ND.float().cpu().numpy())

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """L2-normalised text embeddings, float32 [P, D] (prompts of zero-shot heads)."""
        import torch

        tokens = self.tokenizer(list(texts)).to(self.device)
        with torch.inference_mode(), self._autocast():
            emb_PD = self.model.encode_text(tokens)
        return _normalise(emb_PD.float().cpu().numpy())


def _normalise(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def encode_prompts(cfg: ClipEmbeddingConfig, prompts: list[str]) -> np.ndarray:
    """Text embeddings [P, D] of ``prompts`` with the configured CLIP model (loads it, then lets it go)."""
    return ClipModel(cfg).encode_texts(prompts)


class ClipEmbeddingStage(Stage):
    """Adds ``clip_embedding`` to every pending row (null elsewhere)."""

    name = "clip_embedding"
    uses_model = True

    def __init__(self, cfg: ClipEmbeddingConfig) -> None:
        self.cfg = cfg
        self.clip: ClipModel | None = None

    def resources(self) -> Resources:
        c = self.cfg
        return Resources(num_cpus=c.num_cpus, num_gpus=c.num_gpus, batch_size=c.batch_size,
                         num_actors=c.num_actors)

    def setup(self) -> None:
        self.clip = ClipModel(self.cfg)

    def process(self, batch: pa.Table) -> pa.Table:
        mask = schema.pending_mask(batch)
        images, errors = decode_pending(batch, mask, min_side=self.clip.input_side)
        rows = sorted(images)
        embeddings: list = []
        for start in range(0, len(rows), self.cfg.batch_size):
            chunk = rows[start:start + self.cfg.batch_size]
            embeddings.extend(self.clip.encode_images([images[i] for i in chunk]))
        column = scatter(batch.num_rows, rows, [e.tolist() for e in embeddings])
        batch = schema.typed_columns(batch, EMBEDDING_FIELDS, {EMBEDDING_COLUMN: column})
        return mark_failed(batch, errors, self.name)

    def describe(self) -> dict:
        return {"name": self.name, "applied": True, "model": self.cfg.model, "weights": self.cfg.weights,
                "precision": self.cfg.precision}
