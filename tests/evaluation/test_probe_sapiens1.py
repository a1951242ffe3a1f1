"""Probing compares families: a Sapiens v1 backbone goes through the same probe code and
light decoder as a Sapiens2 one (the family comes from the model name), and a weights file
of the other family fails the input check in one line before any training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evaluation.config import BackboneConfig, ProbeConfig, ProbeSegConfig
from evaluation.features import FrozenBackbone, load_frozen_backbone
from evaluation.probe_trainer import run_probe
from evaluation.run import check_inputs
from evaluation.synthetic import PART_CLASSES, split_paths
from evaluation.tasks import TaskData
from models import build_backbone, build_task_head, family_of, get_config, save_state_dict_file
from models.io import load_weights
from models.sapiens1 import pretrain_state_dict

HW = [64, 48]


def _seg_data(root) -> TaskData:
    return TaskData(
        train=split_paths(root, "seg", "train"),
        val=split_paths(root, "seg", "val"),
        num_classes=len(PART_CLASSES),
        class_names=list(PART_CLASSES),
    )


@pytest.fixture(scope="module")
def v1_clean_checkpoint(tmp_path_factory):
    """A v1 backbone in the released pretrain layout (CLS, frozen 4x4 sin-cos table)."""
    torch.manual_seed(2)
    backbone = build_backbone(get_config("sapiens_small").as_pretrain((64, 64)))
    return save_state_dict_file(pretrain_state_dict(backbone), tmp_path_factory.mktemp("v1") / "v1_clean.safetensors")


def test_v1_probe_runs_with_the_same_light_decoder(synthetic_root, v1_clean_checkpoint, tmp_path):
    assert family_of("sapiens_small") == "sapiens1"
    backbone = load_frozen_backbone("sapiens_small", str(v1_clean_checkpoint))
    extractor = FrozenBackbone(backbone, [-2, -1])
    settings = ProbeSegConfig(
        steps=4, batch_size=4, eval_batch_size=4, image_size=HW, head_hidden_dim=16, warmup_steps=1, num_visuals=1
    )
    metrics = run_probe("seg", settings, _seg_data(synthetic_root), extractor, tmp_path, seed=0)
    assert {"mIoU", "mAcc", "aAcc"} <= set(metrics) and all(np.isfinite(v) for v in metrics.values())
    # The head is the one a Sapiens2 probe trains, on 2 blocks x 256 channels of v1 features.
    load_weights(
        build_task_head("seg", 2 * 256, hidden_dim=16, num_classes=len(PART_CLASSES), upsample=4),
        tmp_path / "head.safetensors",
    )


def _cfg(tmp_path, name, checkpoint) -> ProbeConfig:
    return ProbeConfig(
        output_dir=str(tmp_path),
        tasks=["seg"],
        backbone=BackboneConfig(name=name, checkpoint=str(checkpoint)),
        seg=ProbeSegConfig(image_size=HW),
    )


def test_input_check_accepts_a_v1_file_and_refuses_the_other_family(synthetic_root, v1_clean_checkpoint, tmp_path):
    data = {"seg": _seg_data(synthetic_root)}
    check_inputs(_cfg(tmp_path, "sapiens_small", v1_clean_checkpoint), data)
    with pytest.raises(ValueError) as err:
        check_inputs(_cfg(tmp_path, "sapiens2_small", v1_clean_checkpoint), data)
    message = str(err.value)
    assert "\n" not in message and str(v1_clean_checkpoint) in message
    assert "look like sapiens_small" in message and "expected sapiens2_small" in message
