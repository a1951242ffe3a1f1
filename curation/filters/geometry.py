"""The geometry filter, run right after decode: it costs nothing and spares the models work.

A gatherer may have resized the image before it reached us: img2dataset stores its resized
image and records the size it downloaded as ``original_width`` / ``original_height`` in the
sample's json (``source_meta``). When the input records them, the shape (aspect ratio) is
judged on the original size, and the short side on the smaller of the original and the
decoded one: an upscale adds no detail, and a downscale leaves the shard fewer pixels.
"""

from __future__ import annotations

import dataclasses
import json

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


ORIGINAL_FIELDS = [
    pa.field("original_width", pa.int32()),  # the size before the gatherer resized it, when the input says
    pa.field("original_height", pa.int32()),
]


def original_size(source_meta: str | None) -> tuple[int, int] | None:
    """(width, height) img2dataset's json records as ``original_width``/``original_height``, or None."""
    if not source_meta or "original_width" not in source_meta:
        return None
    try:
        meta = json.loads(source_meta)
    except json.JSONDecodeError:
        return None
    size = (meta.get("original_width"), meta.get("original_height")) if isinstance(meta, dict) else (None, None)
    return size if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size) else None


def judged_size(width: int, height: int, original: tuple[int, int] | None = None) -> tuple[int, tuple[int, int]]:
    """(short side, (w, h) whose shape is judged) of a decoded size and, when the input records it,
    the ``original`` size before the gatherer resized it (the module's rule)."""
    shape = original or (width, height)
    return min(width, height, *shape), shape


def _row_sizes(row: dict) -> tuple[int, tuple[int, int]] | None:
    if not row.get("width") or not row.get("height"):
        return None
    original = (row.get("original_width"), row.get("original_height"))
    return judged_size(row["width"], row["height"], original if all(original) else None)


def geometry_reason(
    width: int, height: int, cfg: GeometryConfig, original: tuple[int, int] | None = None
) -> str | None:
    """Why an image of this size is dropped, or None to keep it (``original``: as in ``judged_size``)."""
    side, (w, h) = judged_size(width, height, original)
    if side < cfg.min_short_side:
        return schema.TOO_SMALL
    if max(w, h) / min(w, h) > cfg.max_aspect_ratio:
        return schema.BAD_ASPECT_RATIO
    return None


def short_side(row: dict) -> int | None:
    """A manifest row's short side as the filter judged it (None when it did not decode)."""
    sizes = _row_sizes(row)
    return sizes[0] if sizes else None


def aspect_ratio(row: dict) -> float | None:
    """A manifest row's long side / short side as the filter judged it (None when it did not decode)."""
    sizes = _row_sizes(row)
    return max(sizes[1]) / min(sizes[1]) if sizes else None


class Geometry(RowStep):
    section = "geometry"
    Config = GeometryConfig
    reasons = (schema.TOO_SMALL, schema.BAD_ASPECT_RATIO)
    reads = ("width", "height", "source_meta")
    fields = ORIGINAL_FIELDS
    _judged = ("width", "height")  # and original_width/_height where present (outputs from before have none)
    scores = (
        Score("short_side", "min_short_side", "short side (px)", derive=short_side, needs=_judged),
        Score("aspect_ratio", "max_aspect_ratio", "long side / short side", derive=aspect_ratio, needs=_judged),
    )

    def resources(self) -> Resources:
        return Resources(num_cpus=0.25, batch_size=256)

    def process(self, batch: pa.Table) -> pa.Table:
        pending = schema.pending_mask(batch)
        widths, heights = batch.column("width").to_pylist(), batch.column("height").to_pylist()
        originals = [original_size(m) for m in batch.column("source_meta").to_pylist()]
        reasons = [
            geometry_reason(w, h, self.cfg, o) if p else None for p, w, h, o in zip(pending, widths, heights, originals)
        ]
        values = {"original_width": [o and o[0] for o in originals], "original_height": [o and o[1] for o in originals]}
        return schema.typed_columns(schema.set_reasons(batch, reasons), ORIGINAL_FIELDS, values)

    def settings(self) -> dict:
        return {"min_short_side": self.cfg.min_short_side, "max_aspect_ratio": self.cfg.max_aspect_ratio}
