"""What a fine-tune trains: the task's data (the probe suite's data sets, or the synthetic
set), its vocabulary, the label checks made before any training, and the model (the whole
backbone + the task's light head, ``backbone.`` / ``decode_head.`` in its state dict).

Heads, losses and evaluators are the probe tasks' (``evaluation.tasks.TASKS``; ``depth`` is
the Sapiens v1 task: per-image relative depth target, ``evaluation.depth``; scale-invariant
log loss, RMSE / AbsRel / delta1 on the human pixels).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from evaluation.coco_keypoints import load_coco_keypoints
from evaluation.config import SplitPaths
from evaluation.io import IMAGE_SUFFIXES, find_by_stem, read_class_mask
from evaluation.synthetic import generate_synthetic_set, split_paths
from evaluation.tasks import TASKS, TaskData
from models.vocab import KeypointVocab, SegVocab, keypoint_vocab, keypoint_vocab_for, seg_vocab

SYNTHETIC_VOCAB = {"pose": "coco_17", "seg": "seg_synthetic_7"}


@dataclass
class TaskInputs:
    """One task's resolved data paths and the vocabulary its labels use (pose / seg)."""

    data: TaskData
    vocab: KeypointVocab | SegVocab | None = None


def backbone_blocks(backbone: nn.Module) -> nn.ModuleList:
    """The transformer blocks (Sapiens2 ``blocks``, Sapiens v1 ``layers``)."""
    blocks = getattr(backbone, "blocks", None)
    return blocks if isinstance(blocks, nn.ModuleList) else backbone.layers


class FinetuneModel(nn.Module):
    """Backbone + head; ``forward(images)`` is the head's output dict on block
    ``feature_block``'s normalised feature map."""

    def __init__(self, backbone: nn.Module, decode_head: nn.Module, feature_block: int = -1) -> None:
        super().__init__()
        self.backbone, self.decode_head, self.feature_block = backbone, decode_head, feature_block

    @property
    def num_layers(self) -> int:
        return len(backbone_blocks(self.backbone))

    def forward(self, images_BCHW: torch.Tensor, train_backbone: bool = True) -> dict[str, torch.Tensor]:
        """``train_backbone=False`` (LP-FT's frozen steps): no graph through the backbone."""
        with torch.set_grad_enabled(train_backbone and torch.is_grad_enabled()):
            features = self.backbone(images_BCHW, out_indices=(self.feature_block,)).feature_maps
        return self.decode_head(features)


def synthetic_data(task: str, root: Path) -> TaskData:
    """The synthetic set's paths for ``task`` (depth: the pointmaps' Z, made relative by
    ``DenseMapDataset``)."""
    kind = "pointmap" if task == "depth" else task
    return TaskData(train=split_paths(root, kind, "train"), val=split_paths(root, kind, "val"))


def resolve_inputs(cfg, out: Path) -> dict[str, TaskInputs]:
    """Every task's data (synthetic where no paths are given, generated once under
    ``out/synthetic``) and vocabulary."""
    inputs = {}
    for task in cfg.tasks:
        s = cfg.task(task)
        if s.train.images:
            data = TaskData(train=s.train, val=s.val)
        else:
            syn = cfg.synthetic
            root = generate_synthetic_set(
                out / "synthetic",
                train_images=syn.train_images,
                val_images=syn.val_images,
                hw=(syn.height, syn.width),
                seed=syn.seed,
            )
            data = synthetic_data(task, root)
        inputs[task] = TaskInputs(data, _vocab(cfg, task, data, synthetic=not s.train.images))
        if isinstance(inputs[task].vocab, SegVocab):
            v = inputs[task].vocab
            data.num_classes, data.class_names = v.num_classes, list(v.classes)
    return inputs


def _vocab(cfg, task: str, data: TaskData, synthetic: bool) -> KeypointVocab | SegVocab | None:
    name = cfg.vocab or (SYNTHETIC_VOCAB.get(task, "") if synthetic else "")
    if task == "pose":
        if name:
            return keypoint_vocab(name)
        K = len(load_coco_keypoints(data.train.labels, cfg.pose.sigmas or None).keypoint_names)
        vocab = keypoint_vocab_for(K)
        if vocab is None:
            raise ValueError(
                f"pose labels {data.train.labels} have {K} keypoints and no vocabulary in models/vocab "
                "has that many; set vocab= (flip pairs are needed for flip augmentation and flip test)"
            )
        return vocab
    if task == "seg":
        if not name:
            raise ValueError(
                "seg: set vocab (e.g. vocab=seg_goliath_28): the class list and its left/right pairs "
                "come from the vocabulary"
            )
        return seg_vocab(name)
    return None


def check_labels(task: str, inputs: TaskInputs, ignore_index: int = 255) -> None:
    """Raise a one-line ``ValueError`` naming the file when a label file does not fit the
    vocabulary: a keypoint file with another keypoint count, a mask with class ids outside it."""
    for split in (inputs.data.train, inputs.data.val):
        if task == "pose":
            _check_keypoint_file(split.labels, inputs.vocab)
        elif task == "seg":
            _check_masks(split, inputs.vocab, ignore_index)


def _check_keypoint_file(path: str, vocab: KeypointVocab) -> None:
    try:
        data = json.loads(Path(path).read_text())
        cats = [c for c in data.get("categories", []) if isinstance(c, dict) and c.get("keypoints")]
    except (OSError, ValueError, AttributeError):
        cats = []  # load_coco_keypoints says what is wrong with the file
    if len(cats) == 1 and len(cats[0]["keypoints"]) != vocab.num_keypoints:
        raise ValueError(
            f"pose labels {path}: {len(cats[0]['keypoints'])} keypoints per person, expected "
            f"{vocab.num_keypoints} (vocabulary {vocab.name})"
        )
    load_coco_keypoints(path, list(vocab.sigmas))  # every annotation's keypoint count and fields


def _check_masks(split: SplitPaths, vocab: SegVocab, ignore_index: int) -> None:
    images = find_by_stem(split.images, IMAGE_SUFFIXES)
    for stem, mask_path in sorted(find_by_stem(split.labels, (".png",)).items()):
        if stem not in images:
            continue
        labels = read_class_mask(mask_path)
        bad = ((labels >= vocab.num_classes) & (labels != ignore_index)) | (labels < 0)
        if bad.any():
            ids = sorted(np.unique(labels[bad]).tolist())[:5]
            raise ValueError(
                f"seg labels {mask_path}: class ids {ids} outside the vocabulary {vocab.name} "
                f"(0..{vocab.num_classes - 1}, ignore {ignore_index})"
            )


def build_model(cfg, task: str, train_ds, backbone: nn.Module) -> FinetuneModel:
    """``backbone`` + the task's head (the probe suite's, at this config's width)."""
    s = cfg.task(task)
    head = TASKS[task].head(backbone.embed_dim, s, backbone.feature_stride, train_ds)
    return FinetuneModel(backbone, head, cfg.feature_block)
