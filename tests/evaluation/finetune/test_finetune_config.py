"""Fine-tune configs: the shipped YAML files load and validate; bad settings are one-line
ValueErrors naming the setting."""

from __future__ import annotations

import pytest

from evaluation.finetune.config import FinetuneConfig
from infra.config import load_config
from tests.conftest import REPO


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("finetune_*.yaml")), ids=lambda p: p.name)
def test_shipped_finetune_configs_load_and_validate(path):
    cfg = load_config(FinetuneConfig, path)
    cfg.validate()
    assert cfg.optim.weight_decay == 0.1 and 0 < cfg.optim.layer_decay <= 1 and cfg.optim.clip_grad == 1.0


@pytest.mark.parametrize(
    "override, match",
    [
        ("tasks=[pose, knn]", "tasks"),
        ("optim.layer_decay=1.5", "optim.layer_decay"),
        ("steps=0", "steps"),
        ("optim.schedule=linear", "optim.schedule"),
        ("output_dir=", "output_dir"),
    ],
)
def test_bad_settings_name_the_setting(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(FinetuneConfig, REPO / "configs" / "finetune_tiny.yaml", [override]).validate()


def test_half_given_data_paths_are_refused():
    cfg = load_config(FinetuneConfig, REPO / "configs" / "finetune_tiny.yaml", ["seg.train.images=/x"])
    with pytest.raises(ValueError, match=r"seg: set both seg.train.images and seg.val.images"):
        cfg.validate()
