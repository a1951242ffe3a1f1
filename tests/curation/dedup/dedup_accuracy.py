"""Ground truth for near-duplicate dedup built from real photos, and pairwise metrics (used by
the accuracy test; not part of the curation code).

``near_duplicate_variants`` turns one photo into the kinds of copies web crawls hold:
re-encodes, resizes, small crops, a mirror image and consecutive "burst" frames (a crop
window moving over the scene). Every variant of one photo belongs to that photo's group;
photos are distinct from each other. ``pair_metrics`` scores predicted groups against such
ground truth on image pairs (a pair is positive when both images are in one group).

Both methods are scored on the same closure: every pair inside a connected component of the
pairs a method matched. That is what a dedup does with matches (a component keeps one image and
drops the rest, as ours does), so imagededup's per-image duplicate lists are closed the same way
(``closed_pairs``) before they are scored, rather than scored as direct pairs against our groups.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable

from PIL import Image, ImageOps

VARIANTS = ("original", "jpeg_q50", "resize_0.5", "crop_5pct", "crop_10pct", "mirror", "frame_1", "frame_2", "frame_3")


def _jpeg(img: Image.Image, quality: int) -> Image.Image:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def _crop(img: Image.Image, fraction: float, anchor: float) -> Image.Image:
    """Cut ``fraction`` of each side, ``anchor`` of it from the left/top."""
    w, h = img.size
    dx, dy = round(w * fraction), round(h * fraction)
    x0, y0 = round(dx * anchor), round(dy * anchor)
    return img.crop((x0, y0, x0 + w - dx, y0 + h - dy))


def near_duplicate_variants(img: Image.Image) -> dict[str, Image.Image]:
    """The variants in ``VARIANTS`` of one RGB photo.

    Crops: 5% of each side cut around the centre, 10% cut mostly at the top-left. Frames:
    a window of 90% x 90% that moves right by 1% of the width per frame, starting at the
    left edge (so frame_1 .. frame_3 are consecutive frames, and all are crops of the photo).
    """
    img = img.convert("RGB")
    w, h = img.size
    cw, ch = round(w * 0.9), round(h * 0.9)
    frames = {
        f"frame_{i}": img.crop((round(w * 0.01 * i), round(h * 0.05), round(w * 0.01 * i) + cw, round(h * 0.05) + ch))
        for i in (1, 2, 3)
    }
    return {
        "original": img,
        "jpeg_q50": _jpeg(img, 50),
        "resize_0.5": img.resize((w // 2, h // 2), Image.BICUBIC),
        "crop_5pct": _crop(img, 0.05, 0.5),
        "crop_10pct": _crop(img, 0.10, 0.75),
        "mirror": ImageOps.mirror(img),
        **frames,
    }


def pairs_of_groups(groups: Iterable[Iterable[str]]) -> set[tuple[str, str]]:
    """All unordered pairs (a < b) inside each group."""
    out: set[tuple[str, str]] = set()
    for group in groups:
        out.update(itertools.combinations(sorted(set(group)), 2))
    return out


def pairs_of_lists(duplicates: dict[str, list]) -> set[tuple[str, str]]:
    """Unordered pairs from imagededup's ``find_duplicates`` output ({file: [duplicates]})."""
    return {tuple(sorted((a, b if isinstance(b, str) else b[0]))) for a, dups in duplicates.items() for b in dups}


def closed_pairs(keys: list[str], pairs: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Every pair inside a connected component of ``pairs`` (the closure a dedup acts on)."""
    import numpy as np

    from curation.dedup.components import component_labels

    index = {k: i for i, k in enumerate(keys)}
    edges = np.array([(index[a], index[b]) for a, b in pairs], dtype=np.int64).reshape(-1, 2)
    labels = component_labels(len(keys), edges[:, 0], edges[:, 1])
    groups: dict[int, list[str]] = {}
    for key, label in zip(keys, labels):
        groups.setdefault(int(label), []).append(key)
    return pairs_of_groups(groups.values())


def pair_metrics(predicted: set[tuple[str, str]], truth: set[tuple[str, str]]) -> dict[str, float]:
    """Pairwise precision, recall and F1 of predicted duplicate pairs."""
    tp = len(predicted & truth)
    precision = tp / len(predicted) if predicted else 1.0
    recall = tp / len(truth) if truth else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "predicted_pairs": len(predicted),
        "true_pairs": len(truth),
    }


def groups_from_decisions(keys: Iterable[str], decisions) -> list[list[str]]:
    """Groups (lists of keys, singletons included) from a decision table."""
    rep = dict(zip(decisions.column("key").to_pylist(), decisions.column("duplicate_of").to_pylist()))
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(rep.get(key, key), []).append(key)
    return list(groups.values())


def quadrant_tiles(img: Image.Image) -> dict[str, Image.Image]:
    """The four quarter-size tiles of a photo: distinct images (hard negatives) of the same scene."""
    w, h = img.size
    return {
        f"tile_{i}": img.crop((x, y, x + w // 2, y + h // 2))
        for i, (x, y) in enumerate([(0, 0), (w // 2, 0), (0, h // 2), (w // 2, h // 2)])
    }


def compare_with_imagededup(
    photos: dict[str, Image.Image], max_distances: Iterable[int], match_mirrored: bool = True
) -> list[dict]:
    """Pairwise precision/recall of our near-dup groups and of imagededup's ``find_duplicates``,
    both on the closure of their matches (see the module docstring).

    Builds ``near_duplicate_variants`` of every photo, hashes each once, and for each
    threshold t scores: ours (components over hashes and, with ``match_mirrored``, mirror
    hashes), ours without mirror hashes (``ours_no_mirror``: the same search as imagededup's)
    and imagededup's PHash ``find_duplicates(encoding_map, max_distance_threshold=t)`` on the
    same hashes. Also gives each method's recall per variant kind (variant in the same group as
    its original). The quarter tiles of every photo join the set as distinct images (each its
    own ground-truth group).
    """
    import pyarrow as pa
    from imagededup.methods import PHash

    from curation.dedup.hashing import phash_hex_pair
    from curation.dedup.near import DedupNearConfig, near_duplicate_decisions

    rows, truth_groups = [], []
    for name, photo in sorted(photos.items()):
        keys = []
        for variant, img in near_duplicate_variants(photo).items():
            h, m = phash_hex_pair(img)
            key = f"{name}__{variant}"
            keys.append(key)
            rows.append(
                {
                    "key": key,
                    "phash": h,
                    "phash_mirror": m,
                    "width": img.width,
                    "height": img.height,
                    "person_score_max": None,
                }
            )
        truth_groups.append(keys)
        for tile, img in quadrant_tiles(photo).items():
            h, m = phash_hex_pair(img)
            rows.append(
                {
                    "key": f"{name}__{tile}",
                    "phash": h,
                    "phash_mirror": m,
                    "width": img.width,
                    "height": img.height,
                    "person_score_max": None,
                }
            )
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("key", pa.string()),
                ("phash", pa.string()),
                ("phash_mirror", pa.string()),
                ("width", pa.int32()),
                ("height", pa.int32()),
                ("person_score_max", pa.float32()),
            ]
        ),
    )
    truth = pairs_of_groups(truth_groups)
    encoding_map = {r["key"]: r["phash"] for r in rows}
    keys = [r["key"] for r in rows]
    results = []
    for t in max_distances:
        ours = {
            name: pairs_of_groups(
                groups_from_decisions(
                    keys, near_duplicate_decisions(table, DedupNearConfig(max_distance=t, match_mirrored=mirrored))
                )
            )
            for name, mirrored in (("ours", match_mirrored), ("ours_no_mirror", False))
        }
        theirs = closed_pairs(
            keys,
            pairs_of_lists(
                PHash(verbose=False).find_duplicates(
                    encoding_map=encoding_map, max_distance_threshold=t, num_dist_workers=0
                )
            ),
        )
        for method, pred in (*ours.items(), ("imagededup", theirs)):
            per_variant = {
                v: sum((tuple(sorted((f"{n}__original", f"{n}__{v}"))) in pred) for n in photos) / len(photos)
                for v in VARIANTS[1:]
            }
            results.append(
                {
                    "method": method,
                    "max_distance": t,
                    **pair_metrics(pred, truth),
                    "recall_by_variant": per_variant,
                    "pairs": pred,
                }
            )
    return results
