"""Top-down pose evaluation pieces the fine-tune adds to the probe's (``evaluation.tasks``):

- ``flip_heatmaps``: the flip test (mmpose ``flip_mode="heatmap"``, UDP so no shift): the
  flipped crop's heatmaps mirrored back and their channels swapped through the vocabulary.
- ``common_keypoint_ap``: scoring a model of one keypoint set against labels of another
  (the Sapiens protocol: a 308-keypoint model on 133-keypoint labels, over the keypoints both
  share, ``models.vocab.common_keypoints``), pycocotools OKS AP on that subset.
- ``detections_from_manifest``: person boxes of a curated dataset's manifest (the detector's
  ``person_boxes`` / ``person_scores``) as a COCO detections list for the images of a COCO
  keypoint file, matched by file name (``pose.person_boxes`` takes the written JSON).
"""

from __future__ import annotations

import copy
from pathlib import PurePosixPath

import numpy as np
import torch

from evaluation.metrics import coco_keypoint_ap
from models.vocab import KeypointVocab, common_keypoints


def flip_heatmaps(heatmaps_BKhw: torch.Tensor, flip_indices) -> torch.Tensor:
    return heatmaps_BKhw.flip(-1)[:, list(flip_indices)]


def subset_keypoints(flat: list[float], keep: list[int]) -> list[float]:
    kps = np.asarray(flat, dtype=np.float64).reshape(-1, 3)[keep]
    return kps.ravel().tolist()


def common_keypoint_ap(gt: dict, results: list[dict], model: KeypointVocab, labels: KeypointVocab) -> dict[str, float]:
    """AP/AR of ``results`` (``model``'s keypoints) against ``gt`` (``labels``' keypoints) on the
    keypoints both share; also ``num_common``."""
    pairs = common_keypoints(model, labels)
    model_ids, label_ids = [m for m, _ in pairs], [lab for _, lab in pairs]
    sub_gt = copy.deepcopy(gt)
    for cat in sub_gt["categories"]:
        if cat.get("keypoints"):
            cat["keypoints"] = [cat["keypoints"][i] for i in label_ids]
            cat["skeleton"] = []
    for ann in sub_gt["annotations"]:
        ann["keypoints"] = subset_keypoints(ann["keypoints"], label_ids)
        ann["num_keypoints"] = int(sum(v > 0 for v in ann["keypoints"][2::3]))
    sub_res = [dict(r, keypoints=subset_keypoints(r["keypoints"], model_ids)) for r in results]
    sigmas = np.asarray(labels.sigmas)[label_ids]
    return {**coco_keypoint_ap(sub_gt, sub_res, sigmas), "num_common": float(len(pairs))}


def detections_from_manifest(rows: list[dict], images: list[dict], min_score: float = 0.0) -> list[dict]:
    """COCO detections (image_id, category_id 1, bbox x,y,w,h, score) from manifest rows
    (``source``, ``person_boxes`` x1,y1,x2,y2, ``person_scores``) of the ``images`` (COCO
    ``images`` entries) whose file name matches a row's source file name."""
    by_name = {PurePosixPath(img["file_name"]).name: img["id"] for img in images}
    out = []
    for row in rows:
        name = PurePosixPath(str(row["source"]).split("#")[-1]).name
        if name not in by_name:
            continue
        for (x1, y1, x2, y2), score in zip(row.get("person_boxes") or [], row.get("person_scores") or []):
            if score >= min_score and x2 > x1 and y2 > y1:
                out.append(
                    {
                        "image_id": by_name[name],
                        "category_id": 1,
                        "score": float(score),
                        "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)],
                    }
                )
    return out
