"""A toy content filter, written the way a new filter is added: this one file (its settings,
its step) plus one line in a recipe. It drops images whose mean brightness is under a threshold."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from curation.filters.model import ModelStep, Placement
from curation.steps import Score

DARK = "too_dark"


@dataclasses.dataclass(kw_only=True)
class BrightnessConfig(Placement):
    enabled: bool = True
    threshold: float  # required: mean grey level (0..255) an image needs to be kept


class ContentBrightness(ModelStep):
    section = "content.brightness"
    Config = BrightnessConfig
    reasons = (DARK,)
    reads = ("image",)
    fields = [pa.field("brightness", pa.float32())]
    scores = (Score("brightness", "threshold", "mean grey level (0..255)"),)

    def setup(self) -> None:  # no model to place
        self.load()

    def load(self) -> None:
        """Nothing to load: the score is arithmetic."""

    def decode_size(self) -> dict:
        return {"max_side": 64}

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict]:
        return [{"brightness": float(np.asarray(im.convert("L"), np.float32).mean())} for im in images]

    def reason(self, scores: dict) -> str | None:
        return DARK if scores["brightness"] < self.cfg.threshold else None

    def settings(self) -> dict:
        return {"threshold": self.cfg.threshold}
