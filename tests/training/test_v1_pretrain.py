"""The Sapiens v1 pretraining recipe as a config of the pretraining stage, without Ray:
the recipe's settings against the reference, the MAE-only meta-architecture through the
real data pipeline and training step, and the step's FLOPs against the analytic count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infra.config import load_config
from models import get_config
from models.pretrain_heads import patchify
from models.sapiens1 import sincos_pos_embed
from tests.models.test_sapiens1_reference import reference_dir
from training.config import DataConfig, PretrainConfig
from training.data import RankSpec, ResumableLoader
from training.flops import step_cost
from training.meta_arch import MAEMetaArch, build_meta_arch
from training.optim import build_optimizer
from training.schedules import values_at
from training.step import train_step

REPO = Path(__file__).resolve().parents[2]
RECIPE, TINY = REPO / "configs/pretrain_v1_0.3b.yaml", REPO / "configs/pretrain_v1_tiny.yaml"


@pytest.fixture(scope="module")
def mae_reference() -> dict:
    return json.loads((reference_dir() / "sapiens1_reference.json").read_text())


def _load(path, *overrides) -> PretrainConfig:
    cfg = load_config(PretrainConfig, path, ["data.dataset=some-version-id", *overrides])
    cfg.validate()
    return cfg


def test_recipe_follows_the_released_mae_config(mae_reference):
    ref, cfg = mae_reference["pretrain_mae"], _load(RECIPE)
    assert cfg.model == "sapiens_0.3b" and get_config(cfg.model).patch_size == ref["patch_size"]
    assert list(cfg.crops.global_size) == ref["image_size"] and (cfg.crops.num_global, cfg.crops.num_local) == (1, 0)
    assert cfg.masking.ratio == ref["mask_ratio"] and cfg.masking.block_prob == 0.0  # per-sample uniform random
    dec = ref["decoder"]
    assert (cfg.decoder.embed_dim, cfg.decoder.depth, cfg.decoder.num_heads) == (
        dec["decoder_embed_dim"],
        dec["decoder_depth"],
        dec["decoder_num_heads"],
    )
    assert cfg.loss.norm_pix == ref["head"]["norm_pix"]
    opt = ref["optimizer"]
    assert list(cfg.optim.betas) == opt["betas"] and cfg.optim.weight_decay == opt["weight_decay"]
    assert cfg.optim.clip_grad == opt["clip_grad"]["max_norm"]
    assert cfg.optim.lr == pytest.approx(1.5e-4 * 4096 / 256)
    assert cfg.ray.num_workers * cfg.batch_size_per_worker == 4096  # the base batch the lr was scaled for
    sched = ref["schedule"]
    warmup_fraction = sched["warmup"]["end"] / sched["max_epochs"]
    assert cfg.optim.warmup_steps == pytest.approx(warmup_fraction * cfg.steps)


def test_recipe_builds_the_released_pretrain_and_neck_layouts(mae_reference):
    cfg = _load(RECIPE)
    with torch.device("meta"):
        arch = build_meta_arch(cfg)
    assert isinstance(arch, MAEMetaArch) and len(arch.teacher) == 0
    ref = mae_reference["sapiens_0.3b"]
    assert {k: list(v.shape) for k, v in arch.student["backbone"].state_dict().items()} == ref[
        "state_dict_pretrain_clean"
    ]
    neck = {f"neck.{k}": list(v.shape) for k, v in arch.student["mae_decoder"].state_dict().items()}
    assert neck == ref["state_dict_pretrain_full_extra_neck"]


def test_v1_settings_that_cannot_work_name_the_setting():
    with pytest.raises(ValueError, match="crops.num_local = 2: Sapiens v1 pretraining is MAE only"):
        _load(TINY, "crops.num_local=2")
    with pytest.raises(ValueError, match="decoder.embed_dim must be divisible by decoder.num_heads"):
        _load(TINY, "decoder.embed_dim=66", "decoder.num_heads=3")
    with pytest.raises(ValueError, match="crops.num_global must be >= 1"):
        _load(TINY, "crops.num_global=0")


def _analytic(n: int, c: int, f: int, layers: int) -> int:
    """The reference README's count per transformer: L * (2NC*3C + 2NC*C + 4NCF + 4N^2 C)."""
    return layers * (2 * n * c * 3 * c + 2 * n * c * c + 4 * n * c * f + 4 * n * n * c)


def test_step_flops_are_three_times_masked_encoder_plus_decoder():
    cfg = _load(RECIPE)
    P, V, C = 4096, 1024, 1024
    encoder = 2 * P * 3 * 16 * 16 * C + _analytic(1 + V, C, 4 * C, 24)  # patch conv over the full view
    decoder = 2 * (1 + V) * C * 512 + _analytic(1 + P, 512, 2048, 8) + 2 * P * 512 * 768  # embed, blocks, pred
    cost = step_cost(cfg, 1)
    assert cost.student_forward_flops == encoder + decoder and cost.flops == 3 * cost.student_forward_flops
    assert cost.tokens == V  # the visible tokens of one view: no teacher pass over all P


@pytest.fixture()
def tiny_batch(synthetic_shards):
    cfg = _load(TINY)
    spec = RankSpec.of(cfg, rank=0, world_size=1, patch_stride=16)
    loader = ResumableLoader(tuple(synthetic_shards), DataConfig(loader_workers=0, shuffle_buffer=4), spec)
    try:
        return cfg, next(loader)
    finally:
        loader.close()


def test_data_pipeline_makes_one_masked_square_view(tiny_batch):
    cfg, batch = tiny_batch
    B = cfg.batch_size_per_worker
    assert batch.global_crops.shape == (B, 3, 64, 64) and batch.local_crops.shape[0] == 0
    assert batch.masks.shape == (B, 16) and batch.masks.sum(1).tolist() == [12] * B
    assert len({tuple(m.tolist()) for m in batch.masks}) > 1  # drawn per sample


def test_mae_step_trains_the_masked_reconstruction_only(tiny_batch):
    cfg, batch = tiny_batch
    torch.manual_seed(0)
    arch = build_meta_arch(cfg)
    optimizer = build_optimizer(arch.student, cfg.optim)
    with torch.no_grad():
        out = arch(batch.global_crops, batch.local_crops, batch.masks, teacher_temp=0.0)
    # The loss by hand: per-patch (unbiased) normalised pixels, mean squared error over the masked patches.
    backbone = arch.student["backbone"]
    enc = backbone(batch.global_crops, visible_mask=~batch.masks)
    with torch.no_grad():
        pred = arch.student["mae_decoder"](enc.tokens, enc.ids_keep, enc.grid_hw, 1)
    patches = patchify(batch.global_crops, 16)
    target = (patches - patches.mean(-1, keepdim=True)) / (patches.var(-1, keepdim=True) + 1e-6).sqrt()
    by_hand = ((pred - target).square().mean(-1) * batch.masks).sum() / batch.masks.sum()
    assert out.loss.item() == pytest.approx(by_hand.item(), rel=1e-5) and set(out.parts) == {"mae"}
    losses = [
        train_step(arch, optimizer, batch, values_at(cfg, s), step=s + 1, clip_grad=cfg.optim.clip_grad).values
        for s in range(20)
    ]
    assert set(losses[0]) == {"loss", "loss_mae", "grad_norm", "lr"}  # no teacher, CLS or KoLeo values
    # Measured on this batch: 1.15 -> 0.93 over 20 steps (40-step schedule, lr 1.5e-3).
    assert losses[-1]["loss_mae"] < 0.85 * losses[0]["loss_mae"]
    # The sin-cos tables stay frozen (no gradient, no decay); the CLS slot stays zero.
    table = sincos_pos_embed((4, 4), 64)
    assert torch.equal(backbone.pos_embed[0, 1:], table) and not backbone.pos_embed[0, 0].any()
