"""CLIP image embeddings (open_clip), computed once per image and kept as a manifest column.

``clip_embedding`` (list<float32>, L2-normalised) feeds the artistic and watermark heads and
semantic dedup, and is written to the manifest/Parquet output. The model comes from
configuration: an open_clip architecture name plus a local checkpoint file (or an open_clip
pretrained tag where the machine can download), or an ``hf-hub:``/``local-dir:`` source.

Shapes: N images, P prompts, D embedding width.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa

from curation.filters.model import (
    EMBEDDING_COLUMN,
    ModelStep,
    Placement,
    WeightsUnavailableError,
    autocast,
    require_file,
    resolve_device,
)

EMBEDDING_FIELDS = [pa.field(EMBEDDING_COLUMN, pa.list_(pa.float32()))]

_SCHEMAS = ("hf-hub:", "local-dir:")


@dataclasses.dataclass(kw_only=True)
class ContentEmbeddingConfig(Placement):
    """Settings of the CLIP embedding step (``content.embedding``)."""

    enabled: bool = True
    # open_clip architecture (``ViT-L-14``, ``ViT-B-32``, ...) or ``local-dir:/folder`` holding
    # open_clip_config.json + weights, or ``hf-hub:org/repo`` where the machine can download.
    model: str = "ViT-L-14"
    # Checkpoint file (.pt/.bin/.safetensors) for a named architecture, or an open_clip pretrained
    # tag (e.g. ``openai``) where downloads work. Unused with ``local-dir:``/``hf-hub:`` models.
    weights: str = ""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 autocast on GPU, fp32 on CPU
    batch_size: int = 64


def check_clip_config(cfg: ContentEmbeddingConfig, where: str = "content.embedding") -> None:
    """Start-up validation: the model and its weights are available (raises with what to fix)."""
    enabled = f"{where}.enabled"
    if cfg.model.startswith("local-dir:"):
        folder = Path(cfg.model[len("local-dir:") :]).expanduser()
        if not (folder / "open_clip_config.json").is_file():
            raise WeightsUnavailableError(
                f"{where}.model={cfg.model!r}: no open_clip_config.json in {folder}. Fix {where}.model, "
                f"or disable the filter with {enabled}=false"
            )
        if not any(folder.glob(p) for p in ("*.safetensors", "*.bin", "*.pth")):
            raise WeightsUnavailableError(
                f"{where}.model={cfg.model!r}: no weights (*.safetensors, *.bin, *.pth) in {folder}. "
                f"Fix {where}.model, or disable the filter with {enabled}=false"
            )
        return
    if cfg.model.startswith("hf-hub:"):
        return  # downloaded by the worker; only possible where the hub is reachable
    import open_clip

    if cfg.model not in open_clip.list_models():
        raise ValueError(
            f"{where}.model={cfg.model!r} is not an open_clip architecture; use one of "
            f"open_clip.list_models() or a local-dir:/hf-hub: source"
        )
    if cfg.weights and not Path(cfg.weights).expanduser().is_file():
        if cfg.weights in open_clip.list_pretrained_tags_by_model(cfg.model):
            return  # a pretrained tag, downloaded by each worker (needs network)
    require_file(
        cfg.weights,
        f"{where}.weights",
        f"CLIP weights for {cfg.model} (a checkpoint file, or an open_clip pretrained tag "
        f"such as {open_clip.list_pretrained_tags_by_model(cfg.model)[:3]} where downloads work)",
        f"{enabled}=false",
    )


def embedding_width(cfg: ContentEmbeddingConfig) -> int | None:
    """The width D of the configured model's embeddings, from its config, without building it
    (None where only a worker can tell: an ``hf-hub:`` model, an unknown architecture). Heads on the
    embedding check their input width against it at start-up."""
    if cfg.model.startswith("hf-hub:"):
        return None
    if cfg.model.startswith("local-dir:"):
        path = Path(cfg.model[len("local-dir:") :]).expanduser() / "open_clip_config.json"
        return json.loads(path.read_text()).get("model_cfg", {}).get("embed_dim") if path.is_file() else None
    import open_clip

    model_cfg = open_clip.get_model_config(cfg.model)
    return model_cfg.get("embed_dim") if model_cfg else None


class ClipModel:
    """An open_clip model ready for inference, with its image transform and tokenizer."""

    def __init__(self, cfg: ContentEmbeddingConfig, where: str = "content.embedding") -> None:
        import open_clip

        self.device = resolve_device(cfg.device, where)
        named = not cfg.model.startswith(_SCHEMAS)
        model, _, preprocess = open_clip.create_model_and_transforms(
            cfg.model, pretrained=(cfg.weights or None) if named else None, device=self.device, require_pretrained=True
        )
        self.model = model.eval()
        self.preprocess = preprocess
        self.tokenizer = open_clip.get_tokenizer(cfg.model)
        size = self.model.visual.image_size
        self.input_side = int(max(size) if isinstance(size, (tuple, list)) else size)
        self.precision = cfg.precision

    def _autocast(self):
        return autocast(self.precision, self.device)

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


def encode_prompts(cfg: ContentEmbeddingConfig, prompts: list[str]) -> np.ndarray:
    """Text embeddings [P, D] of ``prompts`` with the configured CLIP model (loads it, then lets it go)."""
    return ClipModel(cfg).encode_texts(prompts)


def _weight_files(cfg: ContentEmbeddingConfig) -> dict[str, str]:
    if cfg.model.startswith("local-dir:"):
        return {"model": cfg.model[len("local-dir:") :]}
    return {"weights": cfg.weights} if cfg.weights and Path(cfg.weights).expanduser().is_file() else {}


class ContentEmbedding(ModelStep):
    """Adds ``clip_embedding`` to every pending row (null elsewhere)."""

    section = "content.embedding"
    Config = ContentEmbeddingConfig
    reads = ("image",)
    fields = EMBEDDING_FIELDS

    def check_settings(self) -> None:
        check_clip_config(self.cfg, self.section)

    def weight_files(self) -> dict[str, str]:
        return {f"{self.section}.{k}": v for k, v in _weight_files(self.cfg).items()}

    def setup(self) -> None:  # ClipModel resolves the device itself
        self.load()

    def load(self) -> None:
        self.clip = ClipModel(self.cfg, self.section)

    def decode_size(self) -> dict:
        return {"min_side": self.clip.input_side}

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict]:
        return [{EMBEDDING_COLUMN: e.tolist()} for e in self.clip.encode_images(images)]

    def settings(self) -> dict:
        return {"model": self.cfg.model, "weights": self.cfg.weights, "precision": self.cfg.precision}

    def source(self, digests: dict[str, str]) -> str:
        """What embeds the images, for ``clusters.json``: CLIP, its weights' digest (or its source), the model."""
        found = list(digests.values())
        return f"clip:{found[0] if found else self.cfg.weights or self.cfg.model} ({self.cfg.model})"

    def not_applied(self) -> dict:
        return {
            **super().not_applied(),
            "note": "no CLIP embeddings were computed (no clip_embedding column for semantic dedup)",
        }
