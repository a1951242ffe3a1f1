"""Top-down pose evaluation pieces: flip test, the common-keypoint protocol (a 308-keypoint
model scored on 133-keypoint labels) and person boxes from a curation manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from evaluation.datasets import CocoKeypointDataset
from evaluation.finetune.pose_eval import common_keypoint_ap, detections_from_manifest, flip_heatmaps
from evaluation.heatmaps import encode_heatmaps
from models.vocab import common_keypoints, keypoint_vocab
from tests.evaluation.conftest import HW


def test_flip_test_heatmaps_mirror_back_onto_the_unflipped_ones():
    vocab = keypoint_vocab("coco_17")
    rng = np.random.default_rng(0)
    H, W = 64, 48
    xy = rng.uniform([4, 4], [W - 5, H - 5], size=(17, 2))
    plain, _ = encode_heatmaps(xy, np.ones(17, bool), (H, W), (H // 4, W // 4), 1.5)
    mirrored = np.stack([(W - 1) - xy[:, 0], xy[:, 1]], axis=1)[list(vocab.flip_indices)]
    flipped, _ = encode_heatmaps(mirrored, np.ones(17, bool), (H, W), (H // 4, W // 4), 1.5)
    back = flip_heatmaps(torch.from_numpy(flipped)[None], vocab.flip_indices)[0].numpy()
    np.testing.assert_allclose(back, plain, atol=1e-6)


def _wholebody_gt(rng, n: int = 3) -> dict:
    anns, images = [], []
    for i in range(n):
        kps = np.concatenate([rng.uniform(20, 180, size=(133, 2)), np.full((133, 1), 2.0)], axis=1)
        images.append({"id": i + 1, "file_name": f"{i}.png", "height": 200, "width": 200})
        anns.append(
            {
                "id": i + 1,
                "image_id": i + 1,
                "category_id": 1,
                "iscrowd": 0,
                "bbox": [10, 10, 180, 180],
                "area": 180.0 * 180.0,
                "keypoints": kps.ravel().tolist(),
                "num_keypoints": 133,
            }
        )
    names = list(keypoint_vocab("coco_wholebody_133").keypoint_names)
    return {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "person", "keypoints": names}]}


def test_a_308_keypoint_model_is_scored_on_133_keypoint_labels_over_the_shared_keypoints():
    rng = np.random.default_rng(1)
    gt = _wholebody_gt(rng)
    g, w = keypoint_vocab("goliath_308"), keypoint_vocab("coco_wholebody_133")
    pairs = common_keypoints(g, w)

    def predictions(noise: float) -> list[dict]:
        out = []
        for ann in gt["annotations"]:
            truth = np.asarray(ann["keypoints"]).reshape(133, 3)
            pred = np.concatenate([rng.uniform(0, 200, size=(308, 2)), np.ones((308, 1))], axis=1)  # junk elsewhere
            for m, lab in pairs:
                pred[m, :2] = truth[lab, :2] + rng.normal(0, noise, 2)
            out.append(
                {"image_id": ann["image_id"], "category_id": 1, "keypoints": pred.ravel().tolist(), "score": 1.0}
            )
        return out

    exact = common_keypoint_ap(gt, predictions(0.0), g, w)
    assert exact["AP"] == pytest.approx(1.0) and exact["num_common"] == len(pairs) >= 63
    assert common_keypoint_ap(gt, predictions(15.0), g, w)["AP"] < 0.5  # the shared keypoints decide the score


def test_person_boxes_from_a_curation_manifest_feed_top_down_evaluation(synthetic_root, tmp_path):
    labels = synthetic_root / "val" / "person_keypoints.json"
    images = json.loads(labels.read_text())["images"]
    rows = [
        {
            "source": str(synthetic_root / "val" / "images" / images[0]["file_name"]),
            "person_boxes": [[5.0, 6.0, 30.0, 50.0], [1.0, 1.0, 2.0, 2.0]],
            "person_scores": [0.9, 0.1],
        },
        {"source": "/elsewhere/not_in_the_labels.png", "person_boxes": [[0, 0, 9, 9]], "person_scores": [0.99]},
    ]
    dets = detections_from_manifest(rows, images, min_score=0.5)
    assert dets == [
        {"image_id": images[0]["id"], "category_id": 1, "score": pytest.approx(0.9), "bbox": [5.0, 6.0, 25.0, 44.0]}
    ]
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(dets))
    ds = CocoKeypointDataset(synthetic_root / "val" / "images", labels, image_size=HW, person_boxes=path)
    assert len(ds) == 1 and ds.instances[0].box == [5.0, 6.0, 25.0, 44.0] and ds.instances[0].keypoints is None
