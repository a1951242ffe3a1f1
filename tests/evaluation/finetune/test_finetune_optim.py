"""Layer-wise learning-rate decay: every parameter's learning rate equals the reference's
closed form, lr = base * rate ** (L + 1 - layer_id), for every block; weight decay as the
reference says; the schedule's warm-up and decay."""

from __future__ import annotations

import pytest
import torch

from evaluation.finetune.config import FinetuneOptim
from evaluation.finetune.optim import backbone_factor, base_lr, build_optimizer, set_step_lr
from evaluation.finetune.tasks import FinetuneModel, backbone_blocks
from models import build_backbone, build_task_head


def lr_of(optimizer) -> dict[int, float]:
    return {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}


def wd_of(optimizer) -> dict[int, float]:
    return {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}


def expected_layer(name: str, L: int) -> int:
    """The reference's layer ids, spelled out independently of the code under test."""
    if name.startswith("decode_head.") or name.startswith("backbone.ln1."):
        return L + 1
    parts = name.split(".")
    if parts[1] in ("blocks", "layers"):
        return int(parts[2]) + 1
    assert parts[1] in ("patch_embed", "cls_token", "storage_tokens", "pos_embed", "mask_token"), name
    return 0


@pytest.mark.parametrize("name, rate", [("sapiens2_tiny", 0.85), ("sapiens2_tiny", 0.75), ("sapiens_tiny", 0.85)])
def test_every_parameter_gets_the_closed_form_learning_rate(name, rate):
    torch.manual_seed(0)
    backbone = build_backbone(name)
    model = FinetuneModel(backbone, build_task_head("seg", backbone.embed_dim, num_classes=7, hidden_dim=16))
    L = len(backbone_blocks(backbone))
    assert L == backbone.config.depth
    cfg = FinetuneOptim(lr=2e-3, layer_decay=rate, weight_decay=0.1)
    opt = build_optimizer(model, L, cfg)
    set_step_lr(opt, 1e-3)
    lrs, wds = lr_of(opt), wd_of(opt)
    seen_layers = set()
    for pname, p in model.named_parameters():
        layer = expected_layer(pname, L)
        seen_layers.add(layer)
        assert lrs[id(p)] == pytest.approx(1e-3 * rate ** (L + 1 - layer), rel=1e-12), pname
        no_wd = p.ndim == 1 or pname.endswith(".bias") or "pos_embed" in pname
        assert wds[id(p)] == (0.0 if no_wd else 0.1), pname
    assert seen_layers == set(range(L + 2))  # embeddings, every block, head/final norm
    named = dict(model.named_parameters())
    blocks = "blocks" if name.startswith("sapiens2") else "layers"
    first_block = next(n for n in named if n.startswith(f"backbone.{blocks}.0.") and n.endswith("weight"))
    last_block = first_block.replace(f".{blocks}.0.", f".{blocks}.{L - 1}.")
    assert lrs[id(named[first_block])] == pytest.approx(1e-3 * rate**L)
    assert lrs[id(named[last_block])] == pytest.approx(1e-3 * rate)
    assert lrs[id(named["backbone.patch_embed.projection.weight"])] == pytest.approx(1e-3 * rate ** (L + 1))
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_schedule_warms_up_linearly_then_decays_to_zero():
    cfg = FinetuneOptim(lr=1e-3, warmup_steps=10, warmup_start_factor=0.001, schedule="poly")
    assert base_lr(0, 100, cfg) == pytest.approx(1e-6)
    assert base_lr(5, 100, cfg) == pytest.approx(1e-3 * (0.001 + 0.999 * 0.5) * 0.95)
    assert base_lr(50, 100, cfg) == pytest.approx(0.5e-3)
    assert base_lr(100, 100, cfg) == 0.0
    steps = FinetuneOptim(lr=1.0, warmup_steps=0, schedule="multistep", milestones=[0.5, 0.75], gamma=0.1)
    assert [base_lr(s, 100, steps) for s in (0, 49, 50, 74, 75, 99)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])


def test_bad_optim_settings_name_the_field():
    with pytest.raises(ValueError, match="optim.layer_decay"):
        FinetuneOptim(layer_decay=1.5)
    with pytest.raises(ValueError, match="optim.freeze_backbone_steps"):
        FinetuneOptim(freeze_backbone_steps=-1)
    with pytest.raises(ValueError, match="optim.backbone_lr_scale"):
        FinetuneOptim(backbone_lr_scale=-0.5)


def _tiny_model() -> FinetuneModel:
    torch.manual_seed(0)
    backbone = build_backbone("sapiens_tiny")
    return FinetuneModel(backbone, build_task_head("seg", backbone.embed_dim, num_classes=7, hidden_dim=16))


def test_backbone_lr_scale_multiplies_embeddings_and_blocks_only():
    model = _tiny_model()
    L = len(backbone_blocks(model.backbone))
    plain = lr_of(build_optimizer(model, L, FinetuneOptim(lr=1e-3, layer_decay=0.8)))
    scaled = lr_of(build_optimizer(model, L, FinetuneOptim(lr=1e-3, layer_decay=0.8, backbone_lr_scale=0.25)))
    for pname, p in model.named_parameters():
        factor = 1.0 if expected_layer(pname, L) == L + 1 else 0.25  # the final norm goes with the head
        assert scaled[id(p)] == pytest.approx(plain[id(p)] * factor, rel=1e-12), pname


def test_lp_ft_freezes_the_backbone_then_ramps_it_up_while_the_head_trains():
    cfg = FinetuneOptim(lr=1e-2, warmup_steps=4, freeze_backbone_steps=3)
    assert [backbone_factor(s, cfg) for s in range(9)] == pytest.approx([0, 0, 0, 0.25, 0.5, 0.75, 1, 1, 1])
    assert all(backbone_factor(s, FinetuneOptim(warmup_steps=4)) == 1.0 for s in range(9))
    model = _tiny_model()
    L = len(backbone_blocks(model.backbone))
    opt = build_optimizer(model, L, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    images = torch.randn(2, 3, 64, 64)

    def step(s: int) -> None:  # as evaluation.finetune.engine.train_step
        factor = backbone_factor(s, cfg)
        set_step_lr(opt, base_lr(s, 10, cfg), factor)
        opt.zero_grad(set_to_none=True)
        model(images, train_backbone=factor > 0)["logits"].square().mean().backward()
        opt.step()

    step(0), step(1), step(2)  # frozen: no gradient reaches the backbone, its weights stay bit-identical
    backbone = {n for n in before if expected_layer(n, L) <= L}
    assert all(torch.equal(p, before[n]) and p.grad is None for n, p in model.named_parameters() if n in backbone)
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n.startswith("decode_head."))
    step(3)  # unfrozen at a quarter of the lr: the blocks move
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if ".layers." in n)
