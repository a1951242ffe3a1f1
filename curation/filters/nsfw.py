"""NSFW filter: LAION's CLIP-based NSFW detector on the CLIP embedding the pipeline computes.

The detector (LAION-AI/CLIP-based-NSFW-Detector: an autokeras model on OpenAI CLIP ViT-L/14 image
embeddings, 1 = NSFW) is read in the layout of its PyTorch port as NVIDIA NeMo Curator ships it
(``nemo_curator/models/nsfw.py``, file ``clip_autokeras_binary_nsfw.pth``): a normalisation layer,
``norm.mean`` and ``norm.variance`` [D], x -> (x - mean) / sqrt(variance), then ``linear_1`` ...
``linear_K`` with ReLU between them and a sigmoid after the last, which has one output: P(NSFW).
For ViT-L/14 that is 768 -> 64 -> 512 -> 256 -> 1; the widths are read from the file (LAION's
ViT-B/32 port, 512 -> 32 -> 32 -> 1, has the same keys), its input width is checked against the
configured CLIP model's at start-up. Its input is the L2-normalised image embedding, which
``clip_embedding`` holds. Rows scoring >= ``threshold`` get the reason ``nsfw``. The shipped 0.5
is LAION's own cut-off with this detector (``PUBLISHED``; also NeMo Curator's
``ImageNSFWFilterStage`` default); another value needs its ``calibration`` record
(``pipelines/calibrate.py nsfw``), or the step warns at start-up (``curation.filters.thresholds``).

No weights ship with the platform: a run with the filter enabled and ``weights`` unset stops
before any work, naming the setting; disable it explicitly (``content.nsfw.enabled=false``) and
stats.json and MLflow record it as not applied.

Shapes: N images, D embedding width.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from curation.filters.embedding_head import EmbeddingHead
from curation.filters.model import Placement, describe_state
from curation.filters.thresholds import Published
from curation.steps import Score

NSFW = "nsfw"

PUBLISHED = Published(
    (0.5,),
    "LAION's cut-off with this detector: LAION-Aesthetics kept LAION-5B rows with punsafe < 0.5 "
    "(github.com/rom1504/laion-prepro, laion5B/aesthetic/aesthetic_join.py)",
)

NSFW_FIELDS = [pa.field("nsfw_score", pa.float32())]  # P(NSFW)


@dataclasses.dataclass(kw_only=True)
class ContentNsfwConfig(Placement):
    """Settings of the NSFW filter (``content.nsfw``)."""

    enabled: bool = True
    weights: str = ""  # LAION's detector in NeMo Curator's PyTorch layout: clip_autokeras_binary_nsfw.pth
    threshold: float = 0.5  # drop when P(NSFW) >= threshold (0.5: LAION's, see PUBLISHED)
    calibration: str = ""  # what another threshold was measured on (pipelines/calibrate.py writes it)
    num_cpus: float = 0.25  # a few small matrix products per batch
    batch_size: int = 256


def nsfw_widths(state: dict, where: str) -> list[int]:
    """[D, ..., 1] of a detector state dict; a ``ValueError`` saying what the file holds otherwise."""
    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in state.items()}
    depth = sum(k.startswith("linear_") and k.endswith(".weight") for k in shapes)
    keys = {"norm.mean", "norm.variance", *(f"linear_{i}.{p}" for i in range(1, depth + 1) for p in ("weight", "bias"))}
    widths = list(shapes.get("norm.mean", (0,)))[:1]
    fits = depth > 0 and set(shapes) == keys and len(shapes["norm.mean"]) == 1
    fits = fits and shapes["norm.variance"] == shapes["norm.mean"]
    for i in range(1, depth + 1):
        w = shapes.get(f"linear_{i}.weight", ())
        fits = fits and len(w) == 2 and w[1] == widths[-1] and shapes.get(f"linear_{i}.bias") == w[:1]
        widths.append(w[0] if fits else 0)
    if not fits or widths[-1] != 1:
        raise ValueError(
            f"{where}: not LAION's CLIP NSFW detector (norm.mean, norm.variance [D], then linear_1 ... "
            f"linear_K down to 1 output, as NeMo Curator's clip_autokeras_binary_nsfw.pth); "
            f"it holds {describe_state(state)}"
        )
    return widths


class ContentNsfw(EmbeddingHead):
    """Adds ``nsfw_score`` (P(NSFW)) to pending rows; sets ``nsfw`` where it is >= threshold."""

    section = "content.nsfw"
    Config = ContentNsfwConfig
    reasons = (NSFW,)
    fields = NSFW_FIELDS
    scores = (Score("nsfw_score", "threshold", "P(NSFW)"),)
    score_column = "nsfw_score"
    threshold_setting = "threshold"
    published = PUBLISHED
    weights_what = "LAION's CLIP NSFW detector (NeMo Curator's PyTorch port: clip_autokeras_binary_nsfw.pth)"

    def check_settings(self) -> None:
        if not 0.0 <= self.cfg.threshold <= 1.0:
            raise ValueError(f"{self.section}.threshold={self.cfg.threshold}: a probability in [0, 1]")

    def layout(self, state: dict, where: str) -> list[int]:
        return nsfw_widths(state, where)

    def forward(self, tensors: dict, x_ND):
        import torch

        x = (x_ND - tensors["norm.mean"]) / tensors["norm.variance"].sqrt()
        depth = (len(tensors) - 2) // 2
        for i in range(1, depth + 1):
            x = torch.nn.functional.linear(x, tensors[f"linear_{i}.weight"], tensors[f"linear_{i}.bias"])
            x = torch.relu(x) if i < depth else torch.sigmoid(x)
        return x[:, 0]

    def reason(self, scores: dict) -> str | None:
        return NSFW if scores["nsfw_score"] >= self.cfg.threshold else None

    def settings(self) -> dict:
        return {"threshold": self.cfg.threshold, "weights": self.cfg.weights}

    def not_applied(self) -> dict:
        return {**super().not_applied(), "note": "images were not checked for NSFW content"}
