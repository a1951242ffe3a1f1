"""Distillation in one process (no Ray; ``test_distill_e2e`` runs it on Ray Train): its settings,
the objective's steps on real WebDataset shards, checkpoints without the frozen teacher, the
student's export, FLOPs. The teacher is the official module's ``sapiens2_tiny`` (the reference
parity weights in the released layout), the student ``sapiens2_nano``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from infra.config import load_config
from models.registry import build_backbone, count_params
from pipelines.distill import main as distill_main
from tests.training.conftest import REPO, released_tiny_backbone, shaped_zeros_file
from training import checkpoint
from training.config import default_run_name, identity_digest
from training.data import RankSpec, ResumableLoader
from training.distill_config import DistillConfig
from training.flops import step_cost, tokens_per_step
from training.meta_arch import DistillMetaArch, build_meta_arch
from training.optim import build_optimizer
from training.schedules import values_at
from training.step import train_step

DISTILL_TINY = REPO / "configs" / "distill_tiny.yaml"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return released_tiny_backbone(tmp_path_factory.mktemp("teacher") / "sapiens2_tiny.safetensors")


def distill_config(teacher, *overrides: str) -> DistillConfig:
    single = ("parallel.precision=fp32", "parallel.activation_checkpointing=false")
    return load_config(DistillConfig, DISTILL_TINY, [f"teacher.checkpoint={teacher}", *single, *overrides])


@pytest.fixture(scope="module")
def batches(synthetic_shards, teacher):
    cfg = distill_config(teacher)
    data = dataclasses.replace(cfg.data, loader_workers=0, shuffle_buffer=4)
    it = ResumableLoader(tuple(synthetic_shards), data, RankSpec.of(cfg, rank=0, world_size=1, patch_stride=16))
    return [next(it) for _ in range(6)]


def fresh(cfg):
    torch.manual_seed(cfg.seed)
    arch = build_meta_arch(cfg)
    return arch, build_optimizer(arch.student, cfg.optim)


def train(cfg, arch, opt, batches, first=0):
    return [
        train_step(arch, opt, b, values_at(cfg, first + i), step=first + i + 1, clip_grad=cfg.optim.clip_grad).values
        for i, b in enumerate(batches)
    ]


def test_settings_are_checked_in_one_line_naming_the_key(teacher):
    cfg = distill_config(teacher, "data.dataset=v")
    cfg.validate()
    assert cfg.model == "sapiens2_nano" and cfg.crops.num_local == 0
    cases = {
        "student.model=sapiens2_small": "student.model=sapiens2_small is not smaller than teacher.model=sapiens2_tiny",
        "student.model=sapiens_tiny": "student.model=sapiens_tiny: distillation runs between Sapiens2 models",
        "student.model=sapiens2_tiny_4k": "student.model=sapiens2_tiny_4k has patch stride 64, the teacher 16",
        "teacher.checkpoint=": "teacher.checkpoint is empty",
        "crops.num_local=2": "crops.num_global = 2, crops.num_local = 2: distillation matches",
        "loss.cls_weight=0": None,  # the patch term alone is a valid objective
    }
    for override, message in cases.items():
        bad = distill_config(teacher, "data.dataset=v", override)
        if message is None:
            bad.validate()
            continue
        with pytest.raises(ValueError) as err:
            bad.validate()
        assert str(err.value).startswith(message) and "\n" not in str(err.value), override
    with pytest.raises(ValueError, match="loss.cls_weight or loss.patch_weight"):
        distill_config(teacher, "data.dataset=v", "loss.cls_weight=0", "loss.patch_weight=0").validate()


def test_a_teacher_file_of_another_size_is_refused_in_one_line(tmp_path, capsys):
    big = shaped_zeros_file(tmp_path / "sapiens2_0.4b.safetensors", "sapiens2_0.4b")
    args = ["--config", str(DISTILL_TINY), f"teacher.checkpoint={big}", f"storage_path={tmp_path}", "data.dataset=x"]
    assert distill_main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"error: teacher.checkpoint={big.resolve()}: file holds a sapiens2_0.4b backbone (dim 1024, 24 blocks); "
        "model is sapiens2_tiny (dim 64, 18 blocks)"
    ]


def test_the_teachers_file_enters_the_identity_by_content_only(teacher, tmp_path):
    import shutil

    moved = shutil.copy(teacher, tmp_path / "moved.safetensors")
    a, b = distill_config(teacher, "data.dataset=v"), distill_config(moved, "data.dataset=v")
    assert identity_digest(a) == identity_digest(b)  # the path is where, not what
    assert identity_digest(distill_config(teacher, "data.dataset=v", "loss.patch_weight=2")) != identity_digest(a)
    digests = {"teacher.checkpoint": "x" * 64}
    assert default_run_name(a, digests).startswith("distill-sapiens2_nano-")
    assert default_run_name(a, digests) != default_run_name(a, {"teacher.checkpoint": "y" * 64})


def test_the_student_learns_the_teachers_tokens_and_the_teacher_stays_frozen(teacher, batches):
    cfg = distill_config(teacher)
    arch, opt = fresh(cfg)
    released = build_backbone("sapiens2_tiny", weights=teacher).state_dict()
    values = train(cfg, arch, opt, batches)
    assert set(values[0]) == {"loss", "loss_cls", "loss_patch", "grad_norm", "lr"}
    assert values[0]["loss"] == pytest.approx(values[0]["loss_cls"] + values[0]["loss_patch"], rel=1e-5)
    print("distillation loss per step:", [round(v["loss"], 4) for v in values])
    assert values[-1]["loss"] < 0.7 * values[0]["loss"]
    teacher_now = arch.teacher["backbone"].state_dict()
    assert all(torch.equal(teacher_now[k], v) for k, v in released.items())  # frozen, as loaded
    assert not any(p.requires_grad for p in arch.teacher.parameters())


def test_checkpoints_leave_the_teacher_out_and_resume_bit_exactly(teacher, batches, tmp_path):
    import torch.distributed.checkpoint as dcp

    cfg = distill_config(teacher)
    arch, opt = fresh(cfg)
    train(cfg, arch, opt, batches[:3])
    checkpoint.save(tmp_path, arch, opt, step=3, rank=0, data_state={"consumed": 3})
    saved = dcp.FileSystemReader(str(tmp_path)).read_metadata().state_dict_metadata
    assert any(k.startswith("model.student.patch_proj.") for k in saved)
    assert not any(k.startswith("model.teacher.") for k in saved)  # reloaded from its file each session
    expected = train(cfg, arch, opt, batches[3:], first=3)
    restored, opt2 = fresh(cfg)
    assert checkpoint.load(tmp_path, restored, opt2, rank=0)[0] == 3
    assert train(cfg, restored, opt2, batches[3:], first=3) == expected
    a, b = arch.state_dict(), restored.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_mae_term_shares_the_students_masked_pass(teacher, batches):
    cfg = distill_config(teacher, "loss.mae_weight=0.5")
    arch, opt = fresh(cfg)
    assert "mae_decoder" in arch.student
    values = train(cfg, arch, opt, batches[:2])
    w = cfg.loss
    for v in values:
        assert v["loss"] == pytest.approx(v["loss_cls"] + v["loss_patch"] + w.mae_weight * v["loss_mae"], rel=1e-5)
    # the masked pass costs the student a quarter of the tokens (ratio 0.75), the teacher all of them
    plain = distill_config(teacher)
    assert tokens_per_step(cfg, 4) == 4 * 2 * (24 + 6) and tokens_per_step(plain, 4) == 4 * 2 * (24 + 24)


def test_the_exported_student_is_the_registry_model_with_fewer_parameters(teacher, batches, tmp_path):
    cfg = distill_config(teacher)
    arch, opt = fresh(cfg)
    train(cfg, arch, opt, batches[:1])
    path = tmp_path / "student_backbone.safetensors"
    checkpoint.export_backbone(arch.student["backbone"], path, rank=0, metadata={"role": "student"})
    student = build_backbone("sapiens2_nano", weights=path)  # strict: the official keys, nothing else
    ours = arch.student["backbone"].state_dict()
    assert all(torch.equal(ours[k], v) for k, v in student.state_dict().items())
    assert count_params(student) * 5 < count_params("sapiens2_tiny")


def test_step_cost_counts_the_frozen_teacher_once_and_the_student_three_times(teacher):
    cfg = distill_config(teacher)
    cost = step_cost(cfg, 2)
    assert cost.flops == cost.teacher_flops + 3 * cost.student_forward_flops
    assert cost.teacher_flops > 5 * cost.student_forward_flops > 0  # tiny -> nano: ~1/10 of the forward
    assert step_cost(cfg, 4).flops == pytest.approx(2 * cost.flops, rel=1e-6)
    assert isinstance(build_meta_arch(cfg), DistillMetaArch)
