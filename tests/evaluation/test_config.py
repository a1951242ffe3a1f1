"""Probe configuration, and the user errors caught before any Ray work starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.config import ProbeConfig
from evaluation.run import check_inputs, resolve_data
from infra.config import load_config
from models import build_backbone, save_state_dict_file
from models.registry import WeightsFamilyError

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "probe_tiny.yaml"


def _cfg(*overrides: str) -> ProbeConfig:
    return load_config(ProbeConfig, TINY, list(overrides))


def test_shipped_configs_load_and_validate():
    for path in sorted((REPO / "configs").glob("probe_*.yaml")):
        cfg = load_config(ProbeConfig, path, ["output_dir=/tmp/x"])
        cfg.validate()
    cfg = _cfg("output_dir=/tmp/x", "tasks=[seg,knn]", "seg.lr=0.01", "pose.sigmas=[0.1,0.2]", "knn.k=[5]")
    assert cfg.tasks == ["seg", "knn"] and cfg.seg.lr == 0.01 and cfg.pose.sigmas == [0.1, 0.2] and cfg.knn.k == [5]
    assert cfg.backbone.checkpoint == "" and cfg.seg.feature_blocks == [-1]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["seg.stepz=3"], "unknown setting 'seg.stepz'; did you mean 'steps'"),
        (["tasks=[pose,depth]"], r"'depth' is not one of"),
        (["pose.image_size=[128]"], r"image_size must be \[H, W\]"),
        (["seg.feature_blocks=[]"], "feature_blocks must name at least one block"),
    ],
)
def test_bad_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        _cfg(*overrides)


def test_probing_ray_and_tracking_sections():
    cfg = ProbeConfig()
    assert cfg.tracking.experiment == "probing" and cfg.tracking.enabled and cfg.tracking.run_name is None
    assert (cfg.ray.num_workers, cfg.ray.cpus_per_worker, cfg.ray.use_gpu, cfg.ray.max_failures) == (1, 1.0, False, 0)
    for path in sorted((REPO / "configs").glob("probe_*.yaml")):
        assert load_config(ProbeConfig, path).ray.max_failures == 0, path.name  # a failed probe fails the suite


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["output_dir="], "output_dir is required"),
        (["output_dir=/tmp/x", "ray.num_workers=2"], r"runs in one Ray Train worker.*set ray.num_workers=1"),
        (["output_dir=/tmp/x", "tasks=[seg,seg]"], "tasks lists a task twice"),
        (
            ["output_dir=/tmp/x", "seg.train.images=/data/img"],
            "set both seg.train.images and seg.val.images, or neither",
        ),
        (
            ["output_dir=/tmp/x", "normal.train.images=/a", "normal.val.images=/b"],
            "normal.train.labels and normal.val.labels are required",
        ),
        (
            [
                "output_dir=/tmp/x",
                "seg.train.images=/a",
                "seg.val.images=/b",
                "seg.train.labels=/c",
                "seg.val.labels=/d",
            ],
            r"seg.num_classes is required \(>= 2\)",
        ),
    ],
)
def test_validate(overrides, message):
    with pytest.raises(ValueError, match=message):
        _cfg(*overrides).validate()


def _small(tmp_path, *overrides):
    cfg = _cfg(
        f"output_dir={tmp_path / 'out'}",
        "synthetic.train_images=2",
        "synthetic.val_images=1",
        "synthetic.height=64",
        "synthetic.width=48",
        "tasks=[seg]",
        "seg.image_size=[64,48]",
        *overrides,
    )
    return cfg, resolve_data(cfg, tmp_path / "out")


def test_inputs_checked_before_ray(tmp_path):
    cfg, data = _small(tmp_path)
    check_inputs(cfg, data)  # fine as it is
    assert data["seg"].num_classes == 7 and data["seg"].train.labels.endswith("train/seg")
    cfg, data = _small(tmp_path, "seg.image_size=[60,48]")
    with pytest.raises(
        ValueError,
        match=r"seg.image_size \[60, 48\] must be a multiple of the backbone.s feature stride 16, e.g. \[64, 48\]",
    ):
        check_inputs(cfg, data)
    wrong = save_state_dict_file(
        build_backbone("sapiens2_small", device="meta").to_empty(device="cpu"), tmp_path / "small.safetensors"
    )
    cfg, data = _small(tmp_path, f"backbone.checkpoint={wrong}")
    # Another size of the same family: one line naming the file, what it is and what was expected.
    with pytest.raises(
        WeightsFamilyError,
        match=r"small.safetensors look like sapiens2_small \(key storage_tokens / "
        r"embed dim 256, 12 blocks\), expected sapiens2_tiny \(embed dim 64",
    ):
        check_inputs(cfg, data)
