"""The geometry filter, run right after decode: it costs nothing and spares the models work."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from curation import schema
from curation.steps import Resources, RowStep, Score


@dataclasses.dataclass(kw_only=True)
class GeometryConfig:
    """The ``geometry`` section: cheap size and shape rules on the decoded image."""

    min_short_side: int = 300
    max_aspect_ratio: float = 3.0  # long side / short side

    def __post_init__(self) -> None:
        if self.min_short_side < 0:
            raise ValueError("geometry.min_short_side must be >= 0")
        if self.max_aspect_ratio < 1:
            raise ValueError(f"geometry.max_aspect_ratio must be >= 1, got {self.max_aspect_ratio}")


def geometry_reason(width: int, height: int, cfg: GeometryConfig) -> str | None:
    """Why an image of this size is dropped, or None to keep it."""
    if min(width, height) < cfg.min_short_side:
        return schema.TOO_SMALL
    if max(width, height) / min(width, height) > cfg.max_aspect_ratio:
        return schema.BAD_ASPECT_RATIO
    return None


def short_side(row: dict) -> int | None:
    """A manifest row's shorter side (None when it did not decode)."""
    return min(row["width"], row["height"]) if row.get("width") and row.get("height") else None


def aspect_ratio(row: dict) -> float | None:
    """A manifest row's long side / short side (None when it did not decode)."""
    side = short_side(row)
    return max(row["width"], row["height"]) / side if side else None


class GeometryFilter(RowStep):
    name = "geometry"
    section = "geometry"
    Config = GeometryConfig
    reasons = (schema.TOO_SMALL, schema.BAD_ASPECT_RATIO)
    reads = ("width", "height")
    scores = (
        Score("short_side", "min_short_side", "short side (px)", derive=short_side, needs=reads),
        Score("aspect_ratio", "max_aspect_ratio", "long side / short side", derive=aspect_ratio, needs=reads),
    )

    def resources(self) -> Resources:
        return Resources(num_cpus=0.25, batch_size=256)

    def process(self, batch: pa.Table) -> pa.Table:
        pending = schema.pending_mask(batch)
        widths, heights = batch.column("width").to_pylist(), batch.column("height").to_pylist()
        reasons = [geometry_reason(w, h, self.cfg) if p else None for p, w, h in zip(pending, widths, heights)]
        return schema.set_reasons(batch, reasons)

    def settings(self) -> dict:
        return {"min_short_side": self.cfg.min_short_side, "max_aspect_ratio": self.cfg.max_aspect_ratio}
