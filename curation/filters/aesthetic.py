"""Aesthetic score: LAION's improved aesthetic predictor (v2) on the CLIP embedding.

The predictor (christophschuhmann/improved-aesthetic-predictor, ``simple_inference.py``; file
``sac+logos+ava1-l14-linearMSE.pth``, which NeMo Curator's aesthetic stage loads as well) is an
``nn.Sequential`` named ``layers``: Linear 768 -> 1024, Dropout 0.2, Linear 1024 -> 128, Dropout
0.2, Linear 128 -> 64, Dropout 0.1, Linear 64 -> 16, Linear 16 -> 1, so its keys are
``layers.{0,2,4,6,7}.weight`` / ``.bias``, with no activation between the layers (trained with an
MSE loss on 1-10 ratings of SAC, LAION-Logos and AVA). Its input is the L2-normalised OpenAI CLIP
ViT-L/14 image embedding, which ``clip_embedding`` holds; the widths are read from the file and
its input width is checked against the configured CLIP model's at start-up.

``aesthetic_score`` is stored for every scored row (the manifest, the shards' json and Parquet
sidecars), so that a pretraining run can weight or select by it later. With ``min_score`` set,
rows scoring below it get the reason ``low_aesthetic``; by default nothing is dropped. LAION's
cut-offs with this predictor (``PUBLISHED``: its LAION-Aesthetics V2 subsets) need no more; another
value needs its ``calibration`` record (``pipelines/calibrate.py aesthetic``), or the step warns
at start-up (``curation.filters.thresholds``).

Shapes: N images, D embedding width.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from curation.filters.embedding_head import EmbeddingHead
from curation.filters.model import Placement, describe_state
from curation.filters.thresholds import Published
from curation.steps import Score

LOW_AESTHETIC = "low_aesthetic"

AESTHETIC_FIELDS = [pa.field("aesthetic_score", pa.float32())]  # predicted rating, about 1-10

LAYERS = (0, 2, 4, 6, 7)  # the Linear layers of the v2 Sequential (Dropout at 1, 3, 5)

PUBLISHED = Published(
    (4.5, 5.0, 6.0, 6.5),
    "LAION's cut-offs with this predictor: its LAION-Aesthetics V2 subsets improved_aesthetics_4.5plus, "
    "5plus, 6plus and 6.5plus",
)


@dataclasses.dataclass(kw_only=True)
class ContentAestheticConfig(Placement):
    """Settings of the aesthetic score (``content.aesthetic``)."""

    enabled: bool = True
    weights: str = ""  # LAION's improved aesthetic predictor: sac+logos+ava1-l14-linearMSE.pth
    min_score: float | None = None  # drop rows scoring below it; None: score only
    calibration: str = ""  # what a min_score other than LAION's was measured on (pipelines/calibrate.py)
    num_cpus: float = 0.25  # five small matrix products per batch
    batch_size: int = 256


def aesthetic_widths(state: dict, where: str) -> list[int]:
    """[D, 1024, 128, 64, 16, 1] (or the file's own widths) of a v2 state dict; a ``ValueError``
    saying what the file holds otherwise."""
    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in state.items()}
    keys = {f"layers.{i}.{p}" for i in LAYERS for p in ("weight", "bias")}
    widths = [shapes.get(f"layers.{LAYERS[0]}.weight", (0, 0))[-1]]
    fits = set(shapes) == keys
    for i in LAYERS:
        w = shapes.get(f"layers.{i}.weight", ())
        fits = fits and len(w) == 2 and w[1] == widths[-1] and shapes.get(f"layers.{i}.bias") == w[:1]
        widths.append(w[0] if fits else 0)
    if not fits or widths[-1] != 1:
        raise ValueError(
            f"{where}: not LAION's aesthetic predictor v2 (Linear layers layers.0, .2, .4, .6, .7 down "
            f"to 1 output, as sac+logos+ava1-l14-linearMSE.pth); it holds {describe_state(state)}"
        )
    return widths


class ContentAesthetic(EmbeddingHead):
    """Adds ``aesthetic_score`` to pending rows; sets ``low_aesthetic`` below ``min_score`` when set."""

    section = "content.aesthetic"
    Config = ContentAestheticConfig
    reasons = (LOW_AESTHETIC,)
    fields = AESTHETIC_FIELDS
    scores = (Score("aesthetic_score", "min_score", "predicted aesthetic rating (1-10)"),)
    score_column = "aesthetic_score"
    threshold_setting = "min_score"
    published = PUBLISHED
    weights_what = "LAION's improved aesthetic predictor (sac+logos+ava1-l14-linearMSE.pth)"

    def layout(self, state: dict, where: str) -> list[int]:
        return aesthetic_widths(state, where)

    def forward(self, tensors: dict, x_ND):
        import torch

        for i in LAYERS:  # Dropout does nothing at inference, and there is no activation
            x_ND = torch.nn.functional.linear(x_ND, tensors[f"layers.{i}.weight"], tensors[f"layers.{i}.bias"])
        return x_ND[:, 0]

    def reason(self, scores: dict) -> str | None:
        floor = self.cfg.min_score
        return LOW_AESTHETIC if floor is not None and scores["aesthetic_score"] < floor else None

    def settings(self) -> dict:
        return {"min_score": self.cfg.min_score, "weights": self.cfg.weights}

    def not_applied(self) -> dict:
        return {**super().not_applied(), "note": "no aesthetic score was computed"}
