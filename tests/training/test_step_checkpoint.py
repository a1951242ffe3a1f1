"""One training step in a single process: the NaN guard, activation checkpointing,
DCP checkpoint round trip, exports, and the FSDP2 wrapping (one-rank gloo group)."""

import copy
import dataclasses
import hashlib

import pytest
import torch
import torch.distributed as dist

from infra.local_cluster import free_port
from models.registry import build_backbone
from tests.training.conftest import tiny_config
from training import checkpoint
from training.data import RankSpec, ResumableLoader
from training.loop import build
from training.meta_arch import SSLMetaArch
from training.optim import build_optimizer
from training.parallelize import parallelize
from training.schedules import values_at
from training.step import NonFiniteLossError, train_step

CFG = tiny_config("parallel.precision=fp32", "parallel.activation_checkpointing=false")


@pytest.fixture(scope="module")
def batches(synthetic_shards):
    data = dataclasses.replace(CFG.data, loader_workers=0, shuffle_buffer=4)
    it = ResumableLoader(tuple(synthetic_shards), data, RankSpec.of(CFG, rank=0, world_size=1, patch_stride=16))
    return [next(it) for _ in range(4)]


def fresh(cfg=CFG, ac=False):
    torch.manual_seed(cfg.seed)
    arch = SSLMetaArch(cfg)
    if ac:
        parallelize(arch, None, cfg.parallel.__class__(precision="fp32", activation_checkpointing=True))
    arch.materialize_teacher("cpu")
    return arch, build_optimizer(arch.student, cfg.optim)


def run(arch, opt, batches, first_step=0):
    return [
        train_step(
            arch, opt, b, values_at(CFG, first_step + i), step=first_step + i + 1, clip_grad=CFG.optim.clip_grad
        ).values
        for i, b in enumerate(batches)
    ]


def never_stepped(opt):
    return all(int(state["step"]) == 0 and not state["exp_avg"].any() for state in opt.state.values())


def snapshot(arch):
    return {k: v.clone() for k, v in arch.state_dict().items()}


def test_a_non_finite_loss_stops_the_step_before_any_update(batches):
    arch, opt = fresh()
    before = snapshot(arch)
    bad = copy.copy(batches[0])
    bad.global_crops = batches[0].global_crops.clone()
    bad.global_crops[0, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="step 1: non-finite loss"):
        train_step(arch, opt, bad, values_at(CFG, 0), step=1, clip_grad=3.0)
    after = snapshot(arch)
    assert all(torch.equal(before[k], after[k]) for k in before)  # student, teacher and centre untouched
    assert never_stepped(opt)


def test_a_non_finite_gradient_stops_the_step_too(batches):
    arch, opt = fresh()
    before = snapshot(arch)
    handle = arch.student["backbone"].blocks[0].attn.wq.weight.register_hook(lambda g: g * float("inf"))
    with pytest.raises(NonFiniteLossError, match="non-finite gradient norm"):
        train_step(arch, opt, batches[0], values_at(CFG, 0), step=1, clip_grad=3.0)
    handle.remove()
    after = snapshot(arch)
    assert all(torch.equal(before[k], after[k]) for k in before) and never_stepped(opt)


def test_a_step_updates_student_teacher_and_centre(batches):
    arch, opt = fresh()
    before = snapshot(arch)
    values = run(arch, opt, batches[:1])[0]
    after = snapshot(arch)
    assert set(values) >= {"loss", "loss_mae", "loss_cl", "loss_koleo", "grad_norm", "lr", "momentum"}
    w = CFG.loss
    assert values["loss"] == pytest.approx(
        w.mae_weight * values["loss_mae"] + w.cl_weight * values["loss_cl"] + w.koleo_weight * values["loss_koleo"],
        rel=1e-5,
    )
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("student.backbone.blocks") for k in changed)
    assert any(k.startswith("teacher.backbone.blocks") for k in changed)  # EMA moved it (momentum < 1)
    assert "dino_loss.center" in changed
    # the frozen last layer (first steps) is not updated
    assert "student.dino_head.last_layer.weight" not in changed


def test_activation_checkpointing_changes_no_number(batches):
    plain, opt_plain = fresh()
    ac, opt_ac = fresh(ac=True)
    assert run(plain, opt_plain, batches[:2]) == run(ac, opt_ac, batches[:2])
    sd_plain, sd_ac = plain.state_dict(), ac.state_dict()
    assert sd_plain.keys() == sd_ac.keys()  # the wrapper's prefix never reaches checkpoints
    assert all(torch.equal(sd_plain[k], sd_ac[k]) for k in sd_plain)


def test_checkpoint_round_trip_resumes_bit_exactly(batches, tmp_path):
    arch, opt = fresh()
    run(arch, opt, batches[:2])  # the DINO head's last layer is still frozen: it has no gradient yet
    assert len(opt.state) == sum(len(g["params"]) for g in opt.param_groups)
    checkpoint.save(tmp_path, arch, opt, step=2, rank=0, data_state={"consumed": 2}, meta={"model": CFG.model})
    expected = run(arch, opt, batches[2:], first_step=2)

    restored, opt2 = fresh()
    step, data_state, train_state = checkpoint.load(tmp_path, restored, opt2, rank=0)
    assert (step, data_state, train_state["model"]) == (2, {"consumed": 2}, CFG.model)
    assert run(restored, opt2, batches[2:], first_step=2) == expected
    assert all(torch.equal(a, b) for a, b in zip(arch.state_dict().values(), restored.state_dict().values()))


def test_exported_backbones_load_into_the_registry_model(batches, tmp_path):
    arch, opt = fresh()
    run(arch, opt, batches[:1])
    for role in ("student", "teacher"):
        path = tmp_path / f"{role}.safetensors"
        digest = checkpoint.export_backbone(getattr(arch, role)["backbone"], path, rank=0, metadata={"role": role})
        assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
        model = build_backbone(CFG.model, weights=path)  # strict: every official key, nothing else
        ours = getattr(arch, role)["backbone"].state_dict()
        assert all(torch.equal(ours[k], v) for k, v in model.state_dict().items())
    assert checkpoint.export_backbone(arch.student["backbone"], tmp_path / "x.safetensors", rank=1, metadata={}) is None


def test_fsdp2_wrapping_in_a_one_rank_group_trains_in_bf16_with_checkpointing(batches):
    from torch.distributed.fsdp import FSDPModule

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        cfg = tiny_config(
            "parallel.precision=bf16", "parallel.activation_checkpointing=true", "parallel.shard_blocks=true"
        )
        arch, opt = build(cfg, torch.device("cpu"), 1)
        assert isinstance(arch, FSDPModule) and isinstance(arch.student["backbone"].blocks[0], FSDPModule)
        assert isinstance(arch.teacher["backbone"].blocks[0], FSDPModule)
        p = arch.student["backbone"].blocks[0].attn.wq.weight
        assert type(p).__name__ == "DTensor" and p.dtype == torch.float32  # fp32 master weights, bf16 compute
        teacher, student = arch.ema_pairs()
        assert all(torch.equal(t.to_local(), s.to_local()) for t, s in zip(teacher, student))  # teacher = student
        keys = set(checkpoint.get_state_dict(arch, opt)[0])
        assert keys == set(SSLMetaArch(cfg).state_dict())  # no FSDP / checkpoint-wrapper names in checkpoints
        values = [
            train_step(arch, opt, b, values_at(cfg, i), step=i + 1, clip_grad=3.0).values
            for i, b in enumerate(batches[:2])
        ]
        assert all(torch.isfinite(torch.tensor(v["loss"])) for v in values)
    finally:
        dist.destroy_process_group()


def test_shard_blocks_false_makes_one_fsdp_unit_per_sub_model():
    from torch.distributed.fsdp import FSDPModule

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        cfg = tiny_config("parallel.shard_blocks=false", "parallel.activation_checkpointing=false")
        arch, _ = build(cfg, torch.device("cpu"), 1)
        assert isinstance(arch.student["backbone"], FSDPModule) and isinstance(arch.teacher["dino_head"], FSDPModule)
        assert not any(isinstance(b, FSDPModule) for b in arch.student["backbone"].blocks)
    finally:
        dist.destroy_process_group()
