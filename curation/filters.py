"""Cheap geometric filters, run right after decode: they cost nothing and spare the models work."""
from __future__ import annotations

import pyarrow as pa

from curation import schema
from curation.config import FilterConfig
from curation.stages import Resources, Stage


def geometry_reason(width: int, height: int, cfg: FilterConfig) -> str | None:
    """Why an image of this size is dropped, or None to keep it."""
    if min(width, height) < cfg.min_short_side:
        return schema.TOO_SMALL
    if max(width, height) / min(width, height) > cfg.max_aspect_ratio:
        return schema.BAD_ASPECT_RATIO
    return None


class GeometryFilterStage(Stage):
    name = "geometry"
    reasons = (schema.TOO_SMALL, schema.BAD_ASPECT_RATIO)

    def __init__(self, cfg: FilterConfig) -> None:
        self.cfg = cfg

    def resources(self) -> Resources:
        return Resources(num_cpus=0.25, batch_size=256)

    def process(self, batch: pa.Table) -> pa.Table:
        pending = schema.pending_mask(batch)
        widths, heights = batch.column("width").to_pylist(), batch.column("height").to_pylist()
        reasons = [geometry_reason(w, h, self.cfg) if p else None for p, w, h in zip(pending, widths, heights)]
        return schema.set_reasons(batch, reasons)

    def describe(self) -> dict:
        return {"name": self.name, "applied": True, "min_short_side": self.cfg.min_short_side,
                "max_aspect_ratio": self.cfg.max_aspect_ratio}
