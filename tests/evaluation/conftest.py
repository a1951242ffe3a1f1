"""Shared fixtures: a tiny synthetic probe set (64 x 48) and tiny backbones, made once."""

from __future__ import annotations

import pytest
import torch

from evaluation.synthetic import generate_synthetic_set

HW = (64, 48)


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory):
    return generate_synthetic_set(tmp_path_factory.mktemp("synthetic"), train_images=12, val_images=6, hw=HW, seed=3)


@pytest.fixture(scope="session")
def random_backbone():
    from evaluation.features import load_frozen_backbone

    return load_frozen_backbone("sapiens2_tiny", seed=0)


@pytest.fixture(scope="session")
def pretrain_checkpoint(tmp_path_factory):
    """A backbone after two self-supervised (MAE + contrastive) steps, saved in the official
    layout: the stand-in for a pretraining-stage export."""
    from evaluation.warmup import ssl_warmup, synthetic_stream
    from models import build_backbone, save_state_dict_file

    torch.manual_seed(1)
    backbone = build_backbone("sapiens2_tiny")
    ssl_warmup(backbone, synthetic_stream(8, HW, seed=9)["images"], steps=2, batch_size=4)
    return save_state_dict_file(
        backbone,
        tmp_path_factory.mktemp("ckpt") / "student.safetensors",
        metadata={"objective": "mae-warmup", "steps": 2},
    )
