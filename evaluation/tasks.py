"""The probe tasks. Each knows its data sets, its head, its loss and its evaluator
(metrics plus overlay images); ``evaluation.probe_trainer`` runs any of them the same way.

Heads come from ``models.task_heads``: pose and segmentation at stride 4 of the input, the
dense regressions at full resolution. k-NN has no head (see ``evaluation.probe_trainer``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import evaluation.visualize as viz
from evaluation.config import KnnConfig, ProbePoseConfig, ProbeSegConfig, ProbeTaskConfig, SplitPaths
from evaluation.datasets import (
    CocoKeypointDataset,
    DenseMapDataset,
    LabeledImageDataset,
    ProbeDataset,
    SegmentationDataset,
)
from evaluation.heatmaps import apply_affine, decode_heatmaps, invert_affine
from evaluation.losses import albedo_loss, heatmap_loss, normal_loss, pointmap_loss, segmentation_loss, silog_loss
from evaluation.metrics import (
    AlbedoMetrics,
    DepthMetrics,
    NormalMetrics,
    PointmapMetrics,
    coco_keypoint_ap,
    confusion_matrix,
    segmentation_metrics,
)
from models import build_task_head

LossFn = Callable[[dict, dict], torch.Tensor]
KEYPOINT_SCORE_THRESHOLD = 0.2  # mmpose's rescoring: mean score of the confident keypoints


@dataclass
class TaskData:
    """A task's resolved data paths plus what the data says about itself."""

    train: SplitPaths
    val: SplitPaths
    num_classes: int = 0
    class_names: list[str] = field(default_factory=list)


class Evaluator:
    """Accumulates head outputs over the validation set; ``compute`` gives the metrics,
    ``visuals`` the overlays of the first ``num_visuals`` items."""

    def update(self, out: dict, batch: dict) -> None:
        raise NotImplementedError

    def compute(self) -> dict[str, float]:
        raise NotImplementedError

    def visuals(self) -> list[tuple[str, np.ndarray]]:
        return []


# ---------------------------------------------------------------- pose


class PoseTask:
    name = "pose"

    def datasets(self, s: ProbePoseConfig, data: TaskData) -> tuple[ProbeDataset, ProbeDataset]:
        kw = dict(
            image_size=tuple(s.image_size),
            heatmap_sigma=s.heatmap_sigma,
            box_padding=s.box_padding,
            sigmas=s.sigmas or None,
        )
        train = CocoKeypointDataset(data.train.images, data.train.labels, max_samples=s.max_train_samples, **kw)
        val = CocoKeypointDataset(
            data.val.images,
            data.val.labels,
            person_boxes=s.person_boxes or None,
            box_score_threshold=s.box_score_threshold,
            max_samples=s.max_val_samples,
            **kw,
        )
        if train.coco.num_keypoints != val.coco.num_keypoints:
            raise ValueError(f"pose: train has {train.coco.num_keypoints} keypoints, val {val.coco.num_keypoints}")
        return train, val

    def head(self, in_dim: int, s: ProbePoseConfig, stride: int, train: CocoKeypointDataset) -> nn.Module:
        return build_task_head(
            "pose", in_dim, num_keypoints=train.coco.num_keypoints, hidden_dim=s.head_hidden_dim, upsample=stride // 4
        )

    def loss(self, s: ProbePoseConfig, train: CocoKeypointDataset) -> LossFn:
        return lambda out, batch: heatmap_loss(out["heatmaps"], batch["heatmaps"], batch["weights"])

    def evaluator(self, s: ProbePoseConfig, val: CocoKeypointDataset) -> Evaluator:
        return PoseEvaluator(val, s.num_visuals, truncated=bool(s.max_val_samples))


class PoseEvaluator(Evaluator):
    def __init__(self, val: CocoKeypointDataset, num_visuals: int, truncated: bool) -> None:
        self.val, self.num_visuals, self.truncated = val, num_visuals, truncated
        self.results: list[dict] = []
        self.shown: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    def update(self, out: dict, batch: dict) -> None:
        xy_BK2, score_BK = decode_heatmaps(out["heatmaps"], self.val.image_size)
        for b, idx in enumerate(batch["index"].tolist()):
            xy, score = xy_BK2[b].numpy().astype(np.float64), score_BK[b].numpy().astype(np.float64)
            M = batch["affine"][b].numpy()
            in_image = apply_affine(invert_affine(M), xy)
            confident = score[score > KEYPOINT_SCORE_THRESHOLD]
            instance_score = float(batch["box_score"][b]) * float(confident.mean() if confident.size else score.mean())
            self.results.append(
                {
                    "image_id": int(batch["image_id"][b]),
                    "category_id": self.val.coco.category_id,
                    "keypoints": np.concatenate([in_image, score[:, None]], axis=1).ravel().tolist(),
                    "score": instance_score,
                }
            )
            if idx < self.num_visuals:
                self.shown.append((idx, M, xy, score))

    def compute(self) -> dict[str, float]:
        gt = self.val.coco.gt
        if self.truncated:  # evaluate only the images whose people were probed
            ids = {inst.image_id for inst in self.val.instances}
            gt = dict(
                gt,
                images=[i for i in gt["images"] if i["id"] in ids],
                annotations=[a for a in gt["annotations"] if a["image_id"] in ids],
            )
        return coco_keypoint_ap(gt, self.results, self.val.coco.sigmas)

    def visuals(self) -> list[tuple[str, np.ndarray]]:
        out, skeleton = [], self.val.coco.skeleton
        for idx, M, xy, score in self.shown:
            crop = self.val.display_image(idx)
            inst = self.val.instances[idx]
            tiles = [viz.upscale(crop)]
            if inst.keypoints is not None:
                gt_xy = apply_affine(M, inst.keypoints[:, :2])
                tiles.append(viz.draw_skeleton(crop, gt_xy, inst.keypoints[:, 2] > 0, skeleton, viz.TRUTH_COLOUR))
            tiles.append(viz.draw_skeleton(crop, xy, score > KEYPOINT_SCORE_THRESHOLD, skeleton, viz.PRED_COLOUR))
            titles = ["input", "truth", "prediction"] if len(tiles) == 3 else ["input", "prediction"]
            out.append((f"pose_{idx:03d}", viz.panel(tiles, titles, upscaled=True)))
        return out


# ---------------------------------------------------------------- segmentation


class SegTask:
    name = "seg"

    def datasets(self, s: ProbeSegConfig, data: TaskData) -> tuple[ProbeDataset, ProbeDataset]:
        kw = dict(
            image_size=tuple(s.image_size),
            num_classes=data.num_classes,
            ignore_index=s.ignore_index,
            class_names=data.class_names or None,
        )
        return (
            SegmentationDataset(data.train.images, data.train.labels, max_samples=s.max_train_samples, **kw),
            SegmentationDataset(data.val.images, data.val.labels, max_samples=s.max_val_samples, **kw),
        )

    def head(self, in_dim: int, s: ProbeSegConfig, stride: int, train: SegmentationDataset) -> nn.Module:
        return build_task_head(
            "seg", in_dim, num_classes=train.num_classes, hidden_dim=s.head_hidden_dim, upsample=stride // 4
        )

    def loss(self, s: ProbeSegConfig, train: SegmentationDataset) -> LossFn:
        if s.class_weights:
            if len(s.class_weights) != train.num_classes:
                raise ValueError(
                    f"seg.class_weights has {len(s.class_weights)} entries for {train.num_classes} classes"
                )
            weights = torch.tensor(s.class_weights, dtype=torch.float32)
        else:  # inverse square-root frequency, mean 1 over the classes that occur
            freq = train.class_frequencies()
            w = np.where(freq > 0, 1 / np.sqrt(np.maximum(freq, 1e-12)), 0.0)
            weights = torch.tensor(w / w[freq > 0].mean(), dtype=torch.float32)

        def loss(out: dict, batch: dict) -> torch.Tensor:
            return segmentation_loss(
                out["logits"],
                batch["labels"],
                class_weights=weights.to(out["logits"].device),
                dice_weight=s.dice_weight,
                ignore_index=s.ignore_index,
            )

        return loss

    def evaluator(self, s: ProbeSegConfig, val: SegmentationDataset) -> Evaluator:
        return SegEvaluator(val, s.num_visuals, s.ignore_index)


class SegEvaluator(Evaluator):
    def __init__(self, val: SegmentationDataset, num_visuals: int, ignore_index: int) -> None:
        self.val, self.num_visuals, self.ignore_index = val, num_visuals, ignore_index
        self.conf = np.zeros((val.num_classes, val.num_classes), dtype=np.int64)
        self.shown: list[tuple[int, np.ndarray, np.ndarray]] = []

    def update(self, out: dict, batch: dict) -> None:
        labels = batch["labels"]
        logits = F.interpolate(out["logits"].float(), size=labels.shape[-2:], mode="bilinear", align_corners=False)
        pred = logits.argmax(dim=1).numpy()
        self.conf += confusion_matrix(pred, labels.numpy(), self.val.num_classes, self.ignore_index)
        for b, idx in enumerate(batch["index"].tolist()):
            if idx < self.num_visuals:
                self.shown.append((idx, labels[b].numpy(), pred[b]))

    def compute(self) -> dict[str, float]:
        return segmentation_metrics(self.conf, self.val.class_names)

    def visuals(self) -> list[tuple[str, np.ndarray]]:
        n = self.val.num_classes
        out = []
        for idx, gt, pred in self.shown:
            img = self.val.display_image(idx)
            tiles = [img, viz.blend(img, viz.colorize_labels(gt, n)), viz.blend(img, viz.colorize_labels(pred, n))]
            out.append((f"seg_{idx:03d}", viz.panel(tiles, ["input", "truth", "prediction"])))
        return out


# ---------------------------------------------------------------- pointmap / normal / albedo

_DENSE_LOSS = {
    "pointmap": lambda out, b: pointmap_loss(out["xyz"], out["scale"], b["target"], b["mask"]),
    "normal": lambda out, b: normal_loss(out["normal"], b["target"], b["mask"]),
    "albedo": lambda out, b: albedo_loss(out["albedo"], b["target"], b["mask"]),
    "depth": lambda out, b: silog_loss(out["depth"], b["target"], b["mask"]),
}
_DENSE_METRICS = {"pointmap": PointmapMetrics, "normal": NormalMetrics, "albedo": AlbedoMetrics, "depth": DepthMetrics}


def dense_prediction(kind: str, out: dict) -> torch.Tensor:
    """(B, 3, H, W) prediction in the ground truth's units."""
    if kind == "pointmap":
        return out["xyz"] * out["scale"][:, :, None, None]
    return out[kind]


class DenseTask:
    def __init__(self, kind: str) -> None:
        self.name = kind

    def datasets(self, s: ProbeTaskConfig, data: TaskData) -> tuple[ProbeDataset, ProbeDataset]:
        kw = dict(image_size=tuple(s.image_size), kind=self.name)
        return (
            DenseMapDataset(
                data.train.images, data.train.labels, data.train.masks or None, max_samples=s.max_train_samples, **kw
            ),
            DenseMapDataset(
                data.val.images, data.val.labels, data.val.masks or None, max_samples=s.max_val_samples, **kw
            ),
        )

    def head(self, in_dim: int, s: ProbeTaskConfig, stride: int, train: DenseMapDataset) -> nn.Module:
        return build_task_head(self.name, in_dim, hidden_dim=s.head_hidden_dim, upsample=stride)

    def loss(self, s: ProbeTaskConfig, train: DenseMapDataset) -> LossFn:
        return _DENSE_LOSS[self.name]

    def evaluator(self, s: ProbeTaskConfig, val: DenseMapDataset) -> Evaluator:
        return DenseEvaluator(self.name, val, s.num_visuals)


class DenseEvaluator(Evaluator):
    def __init__(self, kind: str, val: DenseMapDataset, num_visuals: int) -> None:
        self.kind, self.val, self.num_visuals = kind, val, num_visuals
        self.metrics = _DENSE_METRICS[kind]()
        self.shown: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    def update(self, out: dict, batch: dict) -> None:
        pred = dense_prediction(self.kind, out).float()
        target, mask = batch["target"], batch["mask"]
        if pred.shape[-2:] != target.shape[-2:]:
            pred = F.interpolate(pred, size=target.shape[-2:], mode="bilinear", align_corners=False)
        pred, target, mask = pred.numpy(), target.numpy(), mask.numpy()
        self.metrics.update(pred, target, mask)
        for b, idx in enumerate(batch["index"].tolist()):
            if idx < self.num_visuals:
                self.shown.append((idx, target[b], pred[b], mask[b]))

    def compute(self) -> dict[str, float]:
        return self.metrics.compute()

    def visuals(self) -> list[tuple[str, np.ndarray]]:
        out = []
        for idx, gt, pred, mask in self.shown:
            img = self.val.display_image(idx)
            if self.kind == "normal":
                maps = [viz.normal_to_rgb(gt, mask), viz.normal_to_rgb(pred, mask)]
            elif self.kind == "albedo":
                maps = [viz.rgb_map(gt, mask), viz.rgb_map(pred, mask)]
            elif self.kind == "depth":  # relative depth: 0 (nearest) .. 1 (farthest) on the person
                fg = gt[0] >= 0
                maps = [viz.scalar_to_rgb(gt[0], fg, 0.0, 1.0), viz.scalar_to_rgb(pred[0], fg, 0.0, 1.0)]
            else:  # pointmap: Z of the points, one colour range from the truth
                z = gt[2][mask] if mask.any() else np.zeros(1)
                lo, hi = float(z.min()), float(z.max())
                maps = [viz.scalar_to_rgb(gt[2], mask, lo, hi), viz.scalar_to_rgb(pred[2], mask, lo, hi)]
            out.append((f"{self.kind}_{idx:03d}", viz.panel([img, *maps], ["input", "truth", "prediction"])))
        return out


# ---------------------------------------------------------------- k-NN


class KnnTask:
    """No head and no training: CLS features of both splits and a weighted vote."""

    name = "knn"

    def datasets(self, s: KnnConfig, data: TaskData) -> tuple[ProbeDataset, ProbeDataset]:
        train = LabeledImageDataset(
            data.train.images,
            data.train.labels or None,
            image_size=tuple(s.image_size),
            max_samples=s.max_train_samples,
        )
        val = LabeledImageDataset(
            data.val.images,
            data.val.labels or None,
            image_size=tuple(s.image_size),
            classes=train.classes,
            max_samples=s.max_val_samples,
        )
        return train, val


# "depth" (Sapiens v1) is fine-tuned, not probed: evaluation.config's probe tasks do not list it.
TASKS = {
    "pose": PoseTask(),
    "seg": SegTask(),
    "pointmap": DenseTask("pointmap"),
    "normal": DenseTask("normal"),
    "albedo": DenseTask("albedo"),
    "depth": DenseTask("depth"),
    "knn": KnnTask(),
}
