"""Shared sections (``tracking``, ``ray``) keep each stage's own defaults when a config gives only some keys."""

from __future__ import annotations

import dataclasses

from infra.config import load_config
from infra.ray_runtime import RayConfig, ray_section
from infra.tracking import TrackingConfig, tracking_section


@dataclasses.dataclass(kw_only=True)
class StageConfig:
    tracking: TrackingConfig = tracking_section("my-stage")
    ray: RayConfig = ray_section(num_workers=8, use_gpu=True)


def test_a_partial_section_fills_from_the_stage_defaults():
    cfg = load_config(StageConfig, overrides=["tracking.uri=sqlite:///x.db", "ray.address=auto"])
    assert cfg.tracking == TrackingConfig(uri="sqlite:///x.db", experiment="my-stage")
    assert (cfg.ray.address, cfg.ray.num_workers, cfg.ray.use_gpu) == ("auto", 8, True)
    assert load_config(StageConfig).ray.num_workers == 8
    assert load_config(StageConfig, overrides=["ray.num_workers=2"]).ray == RayConfig(num_workers=2, use_gpu=True)
