"""Configurations, run identity and the command line."""

import dataclasses
from pathlib import Path

import pytest

from infra.config import load_config
from models.registry import get_config
from tests.training.conftest import tiny_config
from training.config import PretrainConfig, default_run_name, identity_digest
from training.flops import step_cost, tokens_per_step

# The Sapiens2 recipe's configs; the v1 recipe's (pretrain_v1_*) are checked in test_v1_pretrain.py.
CONFIGS = sorted(
    p
    for p in (Path(__file__).resolve().parents[2] / "configs").glob("pretrain_*.yaml")
    if not p.stem.startswith("pretrain_v1_")
)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_pretrain_config_loads_and_validates(path):
    cfg = load_config(PretrainConfig, path, ["data.dataset=some-version-id"])
    cfg.validate()
    get_config(cfg.model)
    assert (cfg.loss.mae_weight, cfg.loss.cl_weight, cfg.loss.koleo_weight) == (1.0, 0.4, 0.04)
    assert (cfg.masking.ratio, cfg.masking.block_prob) == (0.75, 0.4)
    assert (cfg.crops.num_global, cfg.crops.num_local) == (2, 4) and cfg.teacher.momentum == 0.992
    if path.stem != "pretrain_tiny":
        assert cfg.crops.global_size == (1024, 768) and cfg.ray.use_gpu and cfg.parallel.precision == "bf16"
        assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.steps) == (1e-4, 0.05, 500000)


def test_real_sizes_cover_04b_to_5b():
    models = {load_config(PretrainConfig, p).model for p in CONFIGS}
    assert {"sapiens2_0.4b", "sapiens2_0.8b", "sapiens2_1b", "sapiens2_5b", "sapiens2_tiny"} <= models


def test_invalid_settings_name_the_setting():
    with pytest.raises(ValueError, match="data.dataset"):
        tiny_config().__class__().validate()
    with pytest.raises(ValueError, match="crops.global_size"):
        tiny_config("crops.global_size=[100, 64]").validate()
    with pytest.raises(ValueError, match="unknown setting 'loss.cl_wieght'"):
        tiny_config("loss.cl_wieght=0.4")
    with pytest.raises(ValueError, match="num_global"):
        tiny_config("crops.num_global=1").validate()


def test_identity_ignores_session_settings_only():
    base = tiny_config()
    same = tiny_config(
        "max_steps_this_session=3",
        "metrics.log_every=1",
        "checkpoint.keep=9",
        "ray.max_failures=5",
        "tracking.uri=http://elsewhere:5000",
        "tracking.experiment=x",
        "ray.address=auto",
        "ray.num_cpus=64",
        "ray.temp_dir=/tmp/r",
        "data.tracking_uri=sqlite:///x.db",
    )
    other = tiny_config("optim.lr=0.5")
    assert identity_digest(base) == identity_digest(same) != identity_digest(other)
    assert default_run_name(base) == default_run_name(same) != default_run_name(other)
    assert default_run_name(base) != default_run_name(
        dataclasses.replace(base, data=dataclasses.replace(base.data, dataset="another"))
    )
    assert default_run_name(base).startswith("pretrain-sapiens2_tiny-")


# Digests of runs recorded before the ray and tracking sections were shared with the other
# stages: a re-run of the same command must keep finding (and resuming) those runs. The tiny
# config's DINO temperatures changed on purpose (student 0.2, teacher 0.04; see its comment), so
# its digest is the new recipe's: a tiny run of the old recipe is not resumed under the new one.
# Its parallel settings changed on purpose too (fp32, no activation checkpointing, one FSDP unit
# per sub-model: the CPU settings), which changes its digest again.
RECORDED = {
    "pretrain_tiny": ("62efc869f6fdad75", "pretrain-sapiens2_tiny-09c2b4ea53"),
    "pretrain_0.4b": ("76a9b046cfff22ce", "pretrain-sapiens2_04b-70f758ba4c"),
    "pretrain_5b": ("1bcaa778c101bca4", "pretrain-sapiens2_5b-cba690c335"),
}


@pytest.mark.parametrize("stem", sorted(RECORDED))
def test_run_identity_is_what_earlier_versions_recorded(stem):
    cfg = load_config(PretrainConfig, CONFIGS[0].parent / f"{stem}.yaml", ["data.dataset=v1"])
    assert (identity_digest(cfg), default_run_name(cfg)) == RECORDED[stem]


def test_world_size_and_device_settings_stay_in_the_identity():
    base = tiny_config()
    for override in ("ray.num_workers=3", "ray.cpus_per_worker=2", "ray.use_gpu=true"):
        assert identity_digest(tiny_config(override)) != identity_digest(base), override


def test_pretraining_ray_and_tracking_defaults():
    cfg = PretrainConfig()
    assert (cfg.ray.num_workers, cfg.ray.cpus_per_worker, cfg.ray.use_gpu) == (8, 8.0, True)
    assert cfg.tracking.experiment == "pretrain" and tiny_config().tracking.experiment == "pretrain-tiny"
    with pytest.raises(ValueError, match="tracking.enabled=false"):
        tiny_config("tracking.enabled=false", "data.dataset=v1").validate()
    with pytest.raises(ValueError, match="metrics.log_every"):
        tiny_config("metrics.log_every=0").validate()


def test_step_cost_counts_teacher_and_student_work():
    cfg = tiny_config()
    cost = step_cost(cfg, 2)
    # 96x64 -> 24 patches, 18 masked, 6 visible; 48x32 -> 6 patches
    assert tokens_per_step(cfg, 2) == cost.tokens == 2 * (2 * (24 + 6) + 4 * 6)
    assert cost.flops == cost.teacher_flops + 3 * cost.student_forward_flops
    assert cost.teacher_flops > 0 and cost.student_forward_flops > 0
    assert step_cost(cfg, 4).flops == pytest.approx(2 * cost.flops, rel=1e-6)


def test_cli_reports_config_errors_with_exit_code_2(capsys, tmp_path):
    from pipelines.pretrain import main

    assert main(["--config", "configs/pretrain_tiny.yaml", "bogus.key=1"]) == 2
    assert "unknown setting 'bogus'" in capsys.readouterr().err
    assert (
        main(
            [
                "--config",
                "configs/pretrain_tiny.yaml",
                f"storage_path={tmp_path}",
                f"data.dataset={tmp_path}/nonexistent",
            ]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


def test_a_run_recorded_before_a_setting_existed_still_resumes():
    from training.config import identity_dict
    from training.run import _check_resumable

    cfg = tiny_config("parallel.shard_blocks=true")  # the setting's default
    old = identity_dict(cfg)
    del old["parallel"]["shard_blocks"]  # as written by a version without that setting
    record = {"identity_digest": "from-an-older-version", "identity": old, "dataset": {"id": "d1"}}
    _check_resumable(cfg, record, identity_digest(cfg), "d1")  # default value: same run
    with pytest.raises(ValueError, match=r"different settings \(parallel.shard_blocks\)"):
        _check_resumable(tiny_config("parallel.shard_blocks=false"), record, "x", "d1")
    with pytest.raises(ValueError, match="dataset version d1"):
        _check_resumable(cfg, record, identity_digest(cfg), "d2")
