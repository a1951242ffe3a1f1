"""Image embeddings from a Sapiens backbone checkpoint: its mean-pooled patch tokens.

``backbone_embedding`` (list<float32>, L2-normalised) is the mean of the final (normalised)
patch tokens of a Sapiens backbone (either family of ``models``) run on the image resized to
``image_size`` (H, W: the aspect ratio is not kept, as in the official segmentation
preprocessing) and normalised with the backbone's pixel mean and std. It is an embedding for
clustering (``clusters.embedding_column``) and semantic dedup where no CLIP weights exist. Placed
last in pass 2, it embeds only the rows every filter kept.

Weights: an official-layout ``.safetensors`` or ``.pt`` file (``torch.load(weights_only=True)``):
the platform's own export (a pretraining run's ``export/*.safetensors``), a released checkpoint,
or one group of a file holding several (``weights_prefix``: the shared reference test vectors
keep ``sapiens2_tiny`` under ``plain/model/``; a task checkpoint its backbone under
``backbone.``). The file enters the job's identity by content, never by path.

The model code: ``curation`` and ``models`` share a floor and never import each other, so an
entry point passes the backbone code in once per process (``provide_backbone_code``;
``pipelines/curate.py`` and the DAG do). The step carries it to its actors (by reference: each
imports ``models`` itself) and each loads the weights once.

Shapes: N images, P patch tokens, D width.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from curation.filters.model import ModelStep, Placement, autocast

EMBEDDING_COLUMN = "backbone_embedding"


@dataclasses.dataclass(frozen=True)
class BackboneCode:
    """The backbone code the step runs, passed in by an entry point (``models``' own functions).

    ``build(name, *, weights, weights_prefix, device)``: the loaded backbone, whose output has
    ``patch_tokens`` (N, P, D). ``check(name, path, prefix)``: raises ``ValueError`` when the file
    does not fit the model (from its header alone). ``config(name)``: the registered
    configuration (``feature_stride``). ``normalize(image_HW3)``: an RGB uint8 array -> the
    model's (3, H, W) float input."""

    build: Callable[..., Any]
    check: Callable[..., None]
    config: Callable[[str], Any]
    normalize: Callable[[np.ndarray], Any]


_CODE: list[BackboneCode] = []  # the one this process was given


def provide_backbone_code(code: BackboneCode) -> None:
    """Give this process the backbone code (before a curation job is prepared)."""
    _CODE[:] = [code]


def provided_code() -> BackboneCode | None:
    return _CODE[0] if _CODE else None


@dataclasses.dataclass(kw_only=True)
class BackboneEmbeddingConfig(Placement):
    """Settings of the backbone embedding step (``backbone_embedding``)."""

    enabled: bool = False
    model: str = ""  # a registered backbone (models.list_models()), e.g. sapiens2_0.4b
    weights: str = ""  # official-layout .safetensors / .pt of that model
    weights_prefix: str = ""  # the keys' prefix before the official names (plain/model/, backbone.)
    image_size: list[int] = dataclasses.field(default_factory=lambda: [128, 96])  # H, W: small for CPUs
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 autocast on GPU, fp32 on CPU
    intra_op_threads: int = 1  # torch threads per actor on CPU (more than its CPUs thrash a shared machine)
    batch_size: int = 16

    def __post_init__(self) -> None:
        if len(self.image_size) != 2 or min(self.image_size) < 1:
            raise ValueError(f"backbone_embedding.image_size must be [height, width] > 0, got {self.image_size}")
        if self.intra_op_threads < 1:
            raise ValueError(f"backbone_embedding.intra_op_threads must be >= 1, got {self.intra_op_threads}")


def brief(err: Exception) -> str:
    """An error's first line, with the counts of a key mismatch (``models.StateDictMismatchError``)."""
    line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    missing, unexpected = getattr(err, "missing", None), getattr(err, "unexpected", None)
    if missing is not None and unexpected is not None:
        line += f" ({len(missing)} keys missing, {len(unexpected)} unexpected)"
    return line


class BackboneEmbedding(ModelStep):
    """Adds ``backbone_embedding`` to every pending row (null elsewhere)."""

    section = "backbone_embedding"
    Config = BackboneEmbeddingConfig
    reads = ("image",)
    fields = [pa.field(EMBEDDING_COLUMN, pa.list_(pa.float32()))]

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.code = provided_code()

    def required_files(self) -> dict[str, tuple[str, str]]:
        return {"weights": (self.cfg.weights, f"a {self.cfg.model or 'Sapiens'} backbone checkpoint")}

    def check_settings(self) -> None:
        where = self.section
        if self.code is None:
            raise ValueError(
                f"{where}: no backbone code in this process (curation does not import models): run through "
                "pipelines/curate.py or the DAG, or call pipelines.curate.provide_model_code() first"
            )
        if not self.cfg.model:
            raise ValueError(f"{where}.model is not set: name a registered backbone, e.g. {where}.model=sapiens2_0.4b")
        try:
            stride = self.code.config(self.cfg.model).feature_stride
        except ValueError as err:
            raise ValueError(f"{where}.model={self.cfg.model!r}: {brief(err)}") from None
        h, w = self.cfg.image_size
        if h % stride or w % stride:
            raise ValueError(f"{where}.image_size={[h, w]} must be multiples of {self.cfg.model}'s stride {stride}")

    def check(self) -> None:
        super().check()  # placement, settings, the file exists
        try:
            self.code.check(self.cfg.model, self.cfg.weights, self.cfg.weights_prefix)
        except ValueError as err:
            raise ValueError(
                f"{self.section}.weights={self.cfg.weights!r} does not fit {self.section}.model="
                f"{self.cfg.model!r} with {self.section}.weights_prefix={self.cfg.weights_prefix!r}: "
                f"{brief(err)} (a file holding several models or a task checkpoint needs the prefix "
                "before the official key names, e.g. plain/model/ or backbone.)"
            ) from None

    def load(self) -> None:
        import torch

        if self.device == "cpu":
            torch.set_num_threads(self.cfg.intra_op_threads)
        c = self.cfg
        model = self.code.build(c.model, weights=c.weights, weights_prefix=c.weights_prefix, device=self.device)
        self.model = model.eval().requires_grad_(False)

    def decode_size(self) -> dict:
        return {"min_side": max(self.cfg.image_size)}  # JPEG draft decoding down to about the input

    def embed(self, images: list) -> np.ndarray:
        """L2-normalised mean patch tokens, float32 [N, D], of PIL RGB images."""
        import torch
        from PIL import Image

        h, w = self.cfg.image_size
        x = torch.stack(
            [self.code.normalize(np.asarray(im.resize((w, h), Image.Resampling.BILINEAR))) for im in images]
        )
        with torch.inference_mode(), autocast(self.cfg.precision, self.device):
            emb_ND = self.model(x.to(self.device)).patch_tokens.float().mean(dim=1)
        emb_ND = torch.nn.functional.normalize(emb_ND, dim=1)
        return emb_ND.cpu().numpy().astype(np.float32)

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict]:
        return [{EMBEDDING_COLUMN: e.tolist()} for e in self.embed(images)]

    def settings(self) -> dict:
        c = self.cfg
        return {"model": c.model, "weights": c.weights, "weights_prefix": c.weights_prefix, "image_size": c.image_size}

    def source(self, digests: dict[str, str]) -> str:
        """What embeds the images, for ``clusters.json``: the model, its weights' digest, the pooling."""
        h, w = self.cfg.image_size
        sha = digests.get(f"{self.section}.weights", "?")
        return f"{self.cfg.model}:{sha} mean-pooled patch tokens at {h}x{w}"
