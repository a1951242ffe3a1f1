"""The trained stand-ins: they change the backbone, leave it frozen, and use only the
synthetic stream (not the probe splits)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from evaluation.datasets import to_tensor
from evaluation.warmup import ssl_warmup, supervised_warmup, synthetic_stream
from models import build_backbone


def test_stream_is_apart_from_the_probe_splits(synthetic_root):
    stream = synthetic_stream(3, (64, 48), seed=3)  # the probe set's seed, another stream
    assert stream["images"].shape == (3, 3, 64, 48) and stream["parts"].shape == (3, 64, 48)
    probe_first = np.asarray(Image.open(synthetic_root / "train/images/000000.png"))
    assert not torch.equal(stream["images"][0], to_tensor(probe_first))


def test_both_standins_train_the_backbone_and_freeze_it():
    stream = synthetic_stream(4, (64, 48), seed=5)
    for train in (
        lambda bb: ssl_warmup(bb, stream["images"], steps=2, batch_size=2),
        lambda bb: supervised_warmup(bb, stream, steps=2, batch_size=2),
    ):
        torch.manual_seed(0)
        backbone = build_backbone("sapiens2_tiny")
        before = {k: v.clone() for k, v in backbone.state_dict().items()}
        losses = train(backbone)
        assert len(losses) == 2 and all(np.isfinite(losses))
        assert not torch.equal(before["blocks.0.attn.wq.weight"], backbone.state_dict()["blocks.0.attn.wq.weight"])
        assert not backbone.training and not any(p.requires_grad for p in backbone.parameters())
