"""Calibration of the image-quality step (``curation.filters.quality``) on the real photos we have.

Every real photo (``pipelines.demo_corpus``: the people and the scenes) is saved as a JPEG
(quality 92, as the demo corpus does) together with copies that are Gaussian-blurred (sigma 1
and 2 px, and 0.5%, 1% and 2% of the short side) and over- and under-exposed (+-1, 2, 3 EV: a
gain of 2^EV on linear light, sRGB in and out, clipped). Each file goes through pass 1 as the
pipeline runs it (decode's draft decode and grey thumbnail, then the step's measures), and the
script prints, per photo, the original's sharpness and clipped shares beside each copy's; then,
per kind of copy, whether every copy scored worse than its own original, the range over
originals and copies, and how many the shipped thresholds flag. For comparison it prints the
plain variance of the Laplacian on the same thumbnails (the measure the step normalises).
Not a test: it prints figures (``docs/results/image_quality.md``).

    python benchmarks/image_quality_calibration.py             # 13 photos, seconds
    python benchmarks/image_quality_calibration.py --photos 2  # the smoke run of tests/benchmarks
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from curation.config import DecodeConfig
from curation.decode import Decode, thumbnail_pixels
from curation.filters.quality import QualityConfig, measure
from pipelines.demo_corpus import non_person_photos, person_photos

BLURS = {
    "blur 1px": 1.0,
    "blur 2px": 2.0,
    "blur 0.5%": 0.005,
    "blur 1%": 0.01,
    "blur 2%": 0.02,
}  # < 1: of the short side
EXPOSURES = {f"{ev:+d} EV": ev for ev in (1, 2, 3, -1, -2, -3)}


def exposed(im: Image.Image, stops: int) -> Image.Image:
    """``im`` with its linear light multiplied by 2**stops (sRGB decoded and re-encoded, clipped):
    an exposure change, one table lookup per channel value."""
    a = np.arange(256) / 255.0
    linear = np.clip(np.where(a <= 0.04045, a / 12.92, ((a + 0.055) / 1.055) ** 2.4) * 2.0**stops, 0.0, 1.0)
    srgb = np.where(linear <= 0.0031308, linear * 12.92, 1.055 * linear ** (1 / 2.4) - 0.055)
    return im.point(np.round(srgb * 255.0).astype(int).tolist() * 3)


def copies(im: Image.Image) -> dict[str, Image.Image]:
    out = {"original": im}
    for name, sigma in BLURS.items():
        out[name] = im.filter(ImageFilter.GaussianBlur(sigma * min(im.size) if sigma < 1 else sigma))
    out.update({name: exposed(im, ev) for name, ev in EXPOSURES.items()})
    return out


def thumbnail(im: Image.Image) -> np.ndarray:
    """The grey thumbnail pass 1 computes for ``im`` saved as a JPEG (quality 92)."""
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=92)
    raw = buf.getvalue()
    row = Decode(DecodeConfig()).decode_row(
        {"partition": "p", "key": "k", "source": "s", "raw": raw, "input_bytes": len(raw), "reason": None}
    )
    return thumbnail_pixels(row["thumbnail"])


def laplacian_variance(g: np.ndarray) -> float:
    g = g.astype(np.float64)
    return float((g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4 * g[1:-1, 1:-1]).var())


def measured(photos: dict[str, Image.Image], cfg: QualityConfig) -> dict[str, dict[str, dict]]:
    """photo -> copy -> the step's measures (and the plain Laplacian variance) of its thumbnail."""
    out = {}
    for name, im in photos.items():
        out[name] = {}
        for kind, copy in copies(im).items():
            thumb = thumbnail(copy)
            out[name][kind] = {**measure(thumb, cfg), "laplacian_variance": laplacian_variance(thumb)}
    return out


def print_tables(m: dict[str, dict[str, dict]], sizes: dict[str, tuple[int, int]]) -> None:
    kinds = list(next(iter(m.values())))
    blurs = ["original", *(k for k in kinds if k.startswith("blur"))]
    print("## sharpness (Laplacian variance / gradient energy) of the 64-px grey thumbnail")
    print(f"{'photo':<14}{'size':>11}" + "".join(f"{k:>11}" for k in blurs))
    for name, row in m.items():
        size = "x".join(map(str, sizes[name]))
        print(f"{name:<14}{size:>11}" + "".join(f"{row[k]['sharpness']:>11.3f}" for k in blurs))
    for column, sign in (("clipped_bright", "+"), ("clipped_dark", "-")):
        shown = ["original", *(k for k in kinds if k.endswith("EV") and k.startswith(sign))]
        print(f"\n## {column} (share of thumbnail pixels), original and {sign}EV copies")
        print(f"{'photo':<14}" + "".join(f"{k:>11}" for k in shown))
        for name, row in m.items():
            print(f"{name:<14}" + "".join(f"{row[k][column]:>11.3f}" for k in shown))


def _summary_line(m: dict, kind: str, column: str, worse) -> str:
    origs = [row["original"][column] for row in m.values()]
    values = [row[kind][column] for row in m.values()]
    every = all(worse(row[kind][column], row["original"][column]) for row in m.values())
    return (
        f"{kind:<10}{column:<20} every copy worse than its original: {'yes' if every else 'NO'}; "
        f"originals {min(origs):.3f}..{max(origs):.3f}, copies {min(values):.3f}..{max(values):.3f}"
    )


def print_summary(m: dict[str, dict[str, dict]], cfg: QualityConfig) -> None:
    print(f"\n## per kind of copy ({len(m)} photos); thresholds: {cfg}")
    flagged = {k: sum(row[k]["rank_quality"] > 0 for row in m.values()) for k in next(iter(m.values()))}
    below, above = (lambda a, b: a < b), (lambda a, b: a > b)
    for kind in flagged:
        if kind.startswith("blur"):
            lines = [_summary_line(m, kind, "sharpness", below), _summary_line(m, kind, "laplacian_variance", below)]
        elif kind != "original":
            lines = [_summary_line(m, kind, "clipped_bright" if kind.startswith("+") else "clipped_dark", above)]
        else:
            lines = [f"{'original':<10}(the reference)"]
        for line in lines:
            print(line)
        print(f"{'':<10}flagged (rank_quality > 0) at the shipped thresholds: {flagged[kind]} of {len(m)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", type=int, default=0, help="use only the first N photos (0: all)")
    args = ap.parse_args()
    sources = {**person_photos(), **non_person_photos()}
    photos = {k: (Image.open(p) if isinstance(p, Path) else p).convert("RGB") for k, p in sources.items()}
    if args.photos:
        photos = dict(list(photos.items())[: args.photos])
    cfg = QualityConfig()
    m = measured(photos, cfg)
    print_tables(m, {k: im.size for k, im in photos.items()})
    print_summary(m, cfg)


if __name__ == "__main__":
    main()
