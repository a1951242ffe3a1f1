"""COCO keypoint files: annotations (``load_coco_keypoints``) and a detector's person boxes
(``detector_instances``), read and checked, with a ``ValueError`` naming the file and the
annotation at fault. ``evaluation.datasets.CocoKeypointDataset`` crops the persons they give.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evaluation.metrics.pose import KNOWN_SIGMAS


@dataclass
class CocoKeypoints:
    """A validated COCO keypoint file: the cleaned ``gt`` dict (what pycocotools evaluates
    against), keypoint names, skeleton (0-based pairs) and OKS sigmas."""

    gt: dict
    keypoint_names: list[str]
    skeleton: list[tuple[int, int]]
    sigmas: np.ndarray
    category_id: int

    @property
    def num_keypoints(self) -> int:
        return len(self.keypoint_names)


def load_coco_keypoints(path: str | Path, sigmas: list[float] | None = None) -> CocoKeypoints:
    """Read and check a COCO keypoint JSON.

    Filled in when absent: annotation ``iscrowd`` (0), ``num_keypoints`` (labelled count),
    ``area`` (box area: COCO's area is the segment's, usually smaller). Sigmas: ``sigmas``
    if given, else the category's ``sigmas`` field, else COCO-17 / WholeBody-133 by K.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read COCO keypoint file {path}: {err}") from None
    where = f"COCO keypoint file {path}"
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), list) for k in ("images", "annotations", "categories")
    ):
        raise ValueError(f"{where}: needs top-level lists 'images', 'annotations' and 'categories'")
    cat, names, skeleton = _keypoint_category(data["categories"], where)
    K = len(names)
    chosen = sigmas or cat.get("sigmas") or KNOWN_SIGMAS.get(K)
    if chosen is None:
        raise ValueError(
            f"{where}: {K} keypoints has no standard OKS sigmas; set pose.sigmas "
            "(one per keypoint) or add a 'sigmas' list to the category"
        )
    if len(chosen) != K or not all(isinstance(s, (int, float)) and s > 0 for s in chosen):
        raise ValueError(f"{where}: sigmas must be {K} positive numbers, got {len(chosen)}")
    image_ids = set()
    for img in data["images"]:
        if not isinstance(img, dict) or "id" not in img or "file_name" not in img:
            raise ValueError(f"{where}: every image needs 'id' and 'file_name' (bad entry: {str(img)[:120]})")
        image_ids.add(img["id"])
    anns = [
        clean
        for n, ann in enumerate(data["annotations"])
        if (clean := _pose_annotation(ann, n, cat["id"], K, image_ids, where)) is not None
    ]
    if len({a["id"] for a in anns}) != len(anns):
        raise ValueError(f"{where}: annotation ids are not unique")
    gt = {"images": data["images"], "annotations": anns, "categories": [cat]}
    return CocoKeypoints(gt, names, skeleton, np.asarray(chosen, dtype=np.float64), cat["id"])


def _keypoint_category(categories: list, where: str) -> tuple[dict, list[str], list[tuple[int, int]]]:
    """The one category with keypoints: (category, keypoint names, 0-based skeleton pairs)."""
    cats = [c for c in categories if isinstance(c, dict) and c.get("keypoints")]
    if len(cats) != 1:
        raise ValueError(f"{where}: expected exactly one category with a 'keypoints' list, found {len(cats)}")
    cat = cats[0]
    names = [str(n) for n in cat["keypoints"]]
    K = len(names)
    skeleton = []
    for pair in cat.get("skeleton") or []:
        if len(pair) != 2 or not all(isinstance(j, int) and 1 <= j <= K for j in pair):
            raise ValueError(f"{where}: skeleton entry {pair} must be two 1-based keypoint indices in 1..{K}")
        skeleton.append((pair[0] - 1, pair[1] - 1))
    return cat, names, skeleton


def _pose_annotation(ann, n: int, category_id, K: int, image_ids: set, where: str) -> dict | None:
    """Annotation number ``n`` checked and completed; None when it is of another category."""
    aid = ann.get("id", f"#{n}") if isinstance(ann, dict) else f"#{n}"
    bad = f"{where}, annotation {aid}"
    if not isinstance(ann, dict) or ann.get("image_id") not in image_ids:
        raise ValueError(f"{bad}: 'image_id' missing or not among the images")
    if ann.get("category_id") != category_id:
        return None  # another category (e.g. a box-only class) is not a pose instance
    kps = ann.get("keypoints")
    if not isinstance(kps, list) or len(kps) != 3 * K or not all(isinstance(v, (int, float)) for v in kps):
        raise ValueError(
            f"{bad}: 'keypoints' must be {3 * K} numbers (x, y, v for {K} keypoints), "
            f"got {len(kps) if isinstance(kps, list) else type(kps).__name__}"
        )
    if any(v not in (0, 1, 2) for v in kps[2::3]):
        raise ValueError(f"{bad}: keypoint visibility must be 0, 1 or 2")
    box = ann.get("bbox")
    if (
        not isinstance(box, list)
        or len(box) != 4
        or not all(isinstance(v, (int, float)) for v in box)
        or box[2] <= 0
        or box[3] <= 0
    ):
        raise ValueError(f"{bad}: 'bbox' must be [x, y, w, h] with w, h > 0, got {box}")
    return dict(
        ann,
        id=ann.get("id", n + 1),
        iscrowd=int(ann.get("iscrowd", 0)),
        num_keypoints=int(ann.get("num_keypoints", sum(v > 0 for v in kps[2::3]))),
        area=float(ann.get("area", box[2] * box[3])),
    )


@dataclass
class PersonInstance:
    """One person box of an image: ground truth (with its keypoints) or a detector's."""

    image_id: int
    file_name: str
    box: list[float]
    score: float
    keypoints: np.ndarray | None  # (K, 3) ground truth for training; None for detector boxes


def detector_instances(path: str | Path, files: dict, category_id: int, threshold: float) -> list[PersonInstance]:
    """The person boxes of a detector's COCO results file (``files``: image id -> file name) of
    ``category_id`` scoring at least ``threshold``; a malformed file raises ``ValueError``."""
    try:
        dets = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read person boxes {path}: {err}") from None
    if not isinstance(dets, list):
        raise ValueError(f"person boxes {path}: expected a COCO results list of {{image_id, bbox, score}}")
    out = []
    for n, d in enumerate(dets):
        if not isinstance(d, dict) or d.get("image_id") not in files or len(d.get("bbox", [])) != 4:
            raise ValueError(
                f"person boxes {path}, entry {n}: needs an 'image_id' of the annotation file and a 4-number 'bbox'"
            )
        if (
            d.get("category_id", category_id) == category_id
            and d.get("score", 1.0) >= threshold
            and d["bbox"][2] > 0
            and d["bbox"][3] > 0
        ):
            out.append(PersonInstance(d["image_id"], files[d["image_id"]], d["bbox"], float(d.get("score", 1.0)), None))
    return out
