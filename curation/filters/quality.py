"""Image quality in pass 1: sharpness and exposure of decode's grey thumbnail, with no second decode.

Measured on ``thumbnail`` (``curation.schema.TRANSIENT_FIELDS``): decode's 8-bit luma at short
side 64, reduced from the pixels the PHash is computed from, of the same size for every copy of a
picture whatever its resolution, encoding or decode path.

- ``sharpness``: the variance of the 4-neighbour Laplacian over the mean squared gradient (forward
  differences). The Laplacian's variance alone says as much about how much texture and contrast a
  picture holds as about its focus; divided by the gradient's energy it is the share of the
  picture's detail that sits at the finest scale, which a blur removes first, and a gain in
  contrast cancels out. Sharp photos score about 2-3, white noise 5, a flat thumbnail 0.
- ``clipped_dark`` / ``clipped_bright``: the shares of thumbnail pixels at or below ``dark_level``
  (crushed shadows) and at or above ``bright_level`` (blown highlights). Two numbers, because no
  one number of clipped pixels orders every copy: brightening a photo whose shadows are crushed
  trades dark clipping for bright clipping, and can clip fewer pixels in all.
- ``rank_quality``: the copy's flaws, 0 to 2: blurred (``sharpness < min_sharpness``), badly
  exposed (a share above its maximum). A ``rank_*`` column: of a duplicate family, a copy with
  fewer flaws is kept, after "original over converted" (``curation.dedup.representative_sort_key``).

The default thresholds come from copies of the real photos we have, blurred and over- and
under-exposed (``benchmarks/image_quality_calibration.py``; figures and how they were chosen:
``docs/results/image_quality.md``). By default the step measures and ranks only; with
``drop_blurred`` / ``drop_badly_exposed`` it also sets the reasons ``blurred`` / ``badly_exposed``.

Shapes: H, W thumbnail rows and columns.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from curation import schema
from curation.decode import thumbnail_pixels
from curation.steps import Resources, RowStep, Score

BLURRED = "blurred"
BADLY_EXPOSED = "badly_exposed"

QUALITY_FIELDS = [
    pa.field("sharpness", pa.float32()),  # Laplacian variance / gradient energy of the grey thumbnail
    pa.field("clipped_dark", pa.float32()),  # share of thumbnail pixels <= dark_level
    pa.field("clipped_bright", pa.float32()),  # share of thumbnail pixels >= bright_level
    pa.field("rank_quality", pa.int8()),  # flaws: blurred + badly exposed (a duplicate family keeps fewer)
]


@dataclasses.dataclass(kw_only=True)
class QualityConfig:
    """The ``quality`` section: sharpness and exposure thresholds (calibration:
    ``docs/results/image_quality.md``), and whether flawed images are dropped or only ranked."""

    enabled: bool = True
    min_sharpness: float = 1.6  # below: blurred
    dark_level: int = 16  # luma at or below which a thumbnail pixel counts as crushed shadow
    bright_level: int = 239  # luma at or above which it counts as blown highlight
    max_clipped_dark: float = 0.4  # above: badly exposed (under)
    max_clipped_bright: float = 0.05  # above: badly exposed (over)
    drop_blurred: bool = False  # set the reason "blurred" (else the flaw only ranks the copy)
    drop_badly_exposed: bool = False  # set the reason "badly_exposed"
    num_cpus: float = 0.25
    batch_size: int = 256

    def __post_init__(self) -> None:
        if self.min_sharpness < 0:
            raise ValueError(f"quality.min_sharpness must be >= 0, got {self.min_sharpness}")
        if not 0 <= self.dark_level < self.bright_level <= 255:
            raise ValueError(
                f"quality.dark_level={self.dark_level} and quality.bright_level={self.bright_level}: "
                "need 0 <= dark_level < bright_level <= 255"
            )
        for name in ("max_clipped_dark", "max_clipped_bright"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"quality.{name}={getattr(self, name)}: a share in [0, 1]")


def sharpness(grey_HW: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian over the mean squared gradient (0 for a flat image)."""
    g = np.asarray(grey_HW, np.float64)
    if min(g.shape) < 3:
        return 0.0
    lap = g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4.0 * g[1:-1, 1:-1]
    energy = (np.diff(g, axis=1)[:-1] ** 2 + np.diff(g, axis=0)[:, :-1] ** 2).mean()
    return float(lap.var() / energy) if energy > 0 else 0.0


def clipped_shares(grey_HW: np.ndarray, dark_level: int, bright_level: int) -> tuple[float, float]:
    """(share of pixels <= ``dark_level``, share >= ``bright_level``)."""
    g = np.asarray(grey_HW)
    return float((g <= dark_level).mean()), float((g >= bright_level).mean())


def measure(grey_HW: np.ndarray, cfg: QualityConfig) -> dict:
    """The step's columns for one thumbnail, plus the flaws behind ``rank_quality``."""
    dark, bright = clipped_shares(grey_HW, cfg.dark_level, cfg.bright_level)
    value = sharpness(grey_HW)
    blurred = value < cfg.min_sharpness
    badly_exposed = dark > cfg.max_clipped_dark or bright > cfg.max_clipped_bright
    return {
        "sharpness": value,
        "clipped_dark": dark,
        "clipped_bright": bright,
        "rank_quality": int(blurred) + int(badly_exposed),
        BLURRED: blurred,
        BADLY_EXPOSED: badly_exposed,
    }


class Quality(RowStep):
    """Adds sharpness, clipped shares and ``rank_quality`` to pending rows; drops only when told to."""

    section = "quality"
    Config = QualityConfig
    reasons = (BLURRED, BADLY_EXPOSED)
    reads = ("thumbnail",)
    fields = QUALITY_FIELDS
    scores = (
        Score("sharpness", "min_sharpness", "sharpness (Laplacian variance / gradient energy, grey thumbnail)"),
        Score("clipped_dark", "max_clipped_dark", "share of thumbnail pixels <= dark_level"),
        Score("clipped_bright", "max_clipped_bright", "share of thumbnail pixels >= bright_level"),
    )

    def resources(self) -> Resources:
        return Resources(num_cpus=self.cfg.num_cpus, batch_size=self.cfg.batch_size)

    def reason(self, m: dict) -> str | None:
        if m[BLURRED] and self.cfg.drop_blurred:
            return BLURRED
        return BADLY_EXPOSED if m[BADLY_EXPOSED] and self.cfg.drop_badly_exposed else None

    def process(self, batch: pa.Table) -> pa.Table:
        thumbs = batch.column("thumbnail").to_pylist()
        found = {
            i: measure(thumbnail_pixels(thumbs[i]), self.cfg)
            for i, pending in enumerate(schema.pending_mask(batch))
            if pending and thumbs[i] is not None
        }
        values = {
            f.name: [found[i][f.name] if i in found else None for i in range(batch.num_rows)] for f in self.fields
        }
        reasons = [self.reason(found[i]) if i in found else None for i in range(batch.num_rows)]
        return schema.set_reasons(schema.typed_columns(batch, self.fields, values), reasons)

    def settings(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self.cfg).items() if k not in ("enabled", "num_cpus", "batch_size")}

    def not_applied(self) -> dict:
        return {**super().not_applied(), "note": "no sharpness or exposure measured: duplicate families ranked without"}
