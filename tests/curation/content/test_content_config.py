"""Start-up validation, the stage factory, the applied/disabled report and resource settings."""
from __future__ import annotations

import pickle

import pytest

from curation.content import (CONTENT_FIELDS, CONTENT_REASONS, ArtisticFilterStage, ClipEmbeddingStage,
                              ContentFiltersConfig, TextFilterStage, WatermarkFilterStage, WeightsUnavailableError,
                              build_content_stages, content_filter_report)
from curation.stages import Resources
from infra.config import from_dict, parse_overrides

NO_WEIGHTS = {"embedding": {"enabled": False}, "artistic": {"enabled": False}, "watermark": {"enabled": False}}


def test_shipped_defaults_demand_weights():
    """Every filter is on by default; without weights the run stops before any work, saying what to do."""
    cfg = ContentFiltersConfig()
    assert all(getattr(cfg, k).enabled for k in ("embedding", "artistic", "watermark", "text"))
    with pytest.raises(WeightsUnavailableError) as err:
        build_content_stages(cfg)
    assert "content.embedding.weights is not set" in str(err.value)
    assert "content.embedding.enabled=false" in str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, FileNotFoundError)


def test_missing_watermark_weights_name_the_setting(tiny_clip_dir, tmp_path):
    cfg = from_dict(ContentFiltersConfig, {"embedding": {"model": f"local-dir:{tiny_clip_dir}"},
                                           "watermark": {"weights": str(tmp_path / "watermark_model_v1.pt")}})
    with pytest.raises(WeightsUnavailableError, match=r"content\.watermark\.weights=.*no such file.*"
                                                      r"content\.watermark\.enabled=false"):
        build_content_stages(cfg)
    cfg.artistic.head_weights = str(tmp_path / "head.pt")
    with pytest.raises(WeightsUnavailableError, match=r"content\.artistic\.head_weights"):
        build_content_stages(cfg)


def test_disabled_filters_are_reported_as_not_applied():
    cfg = from_dict(ContentFiltersConfig, NO_WEIGHTS)
    stages = build_content_stages(cfg)
    assert [type(s) for s in stages] == [TextFilterStage]
    report = content_filter_report(cfg)
    assert {k: v["applied"] for k, v in report.items()} == {
        "embedding": False, "artistic": False, "watermark": False, "text": True}
    assert report["watermark"]["disabled_by"] == "content.watermark.enabled=false"
    assert "not checked for watermarks" in report["watermark"]["note"]
    assert report["text"]["min_confidence"] == cfg.text.min_confidence


def test_all_filters_in_order(tiny_clip_dir, tmp_path):
    import torch

    from curation.content.watermark import build_classifier

    weights = tmp_path / "wm.pt"
    torch.save(build_classifier("mobilenetv3_small_050", (625, 256)).state_dict(), weights)
    cfg = from_dict(ContentFiltersConfig, {
        "embedding": {"model": f"local-dir:{tiny_clip_dir}"},
        "watermark": {"weights": str(weights), "backbone": "mobilenetv3_small_050"}})
    stages = build_content_stages(cfg)
    assert [type(s) for s in stages] == [ClipEmbeddingStage, ArtisticFilterStage, WatermarkFilterStage,
                                         TextFilterStage]
    assert all(s.uses_model for s in stages)
    assert [r for s in stages for r in s.reasons] == list(CONTENT_REASONS)
    assert all(v["applied"] for v in content_filter_report(cfg).values())
    # stages travel to Ray workers pickled, before setup: settings only, no model
    for stage in stages:
        assert len(pickle.dumps(stage)) < 20_000
    assert {f.name for f in CONTENT_FIELDS} == {
        "clip_embedding", "artistic_score", "artistic_label", "watermark_score", "text_coverage",
        "text_box_count", "text_watermark"}


def test_dependencies_between_filters():
    with pytest.raises(ValueError, match=r"content\.artistic scores CLIP embeddings"):
        build_content_stages(from_dict(ContentFiltersConfig, {"embedding": {"enabled": False}}))
    with pytest.raises(ValueError, match=r"clip_head_weights scores CLIP embeddings"):
        build_content_stages(from_dict(ContentFiltersConfig, {
            "embedding": {"enabled": False}, "artistic": {"enabled": False},
            "watermark": {"clip_head_weights": "head.pt"}}))


def test_gpu_resources_from_settings(tiny_clip_dir):
    cfg = from_dict(ContentFiltersConfig, {
        "embedding": {"model": f"local-dir:{tiny_clip_dir}", "num_gpus": 0.25, "batch_size": 256,
                      "num_actors": 4, "device": "cuda"},
        "artistic": {"enabled": False}, "watermark": {"enabled": False},
        "text": {"num_cpus": 2, "batch_size": 8, "num_actors": 3}})
    embedding, text = build_content_stages(cfg)
    assert embedding.resources() == Resources(num_cpus=1.0, num_gpus=0.25, batch_size=256, num_actors=4)
    assert text.resources() == Resources(num_cpus=2.0, num_gpus=0.0, batch_size=8, num_actors=3)
    # device=cuda without a GPU share: Ray would hide the GPUs from the actor
    cfg.embedding.num_gpus = 0.0
    with pytest.raises(ValueError, match=r"content\.embedding\.device=cuda needs content\.embedding\.num_gpus > 0"):
        build_content_stages(cfg)


def test_overrides_and_bad_values():
    cfg = from_dict(ContentFiltersConfig, parse_overrides(
        ["embedding.enabled=false", "artistic.enabled=false", "watermark.enabled=false", "text.max_side=640",
         "text.coverage_threshold=0.1"]))
    assert cfg.text.max_side == 640 and cfg.text.coverage_threshold == 0.1
    with pytest.raises(ValueError, match="did you mean 'coverage_threshold'"):
        from_dict(ContentFiltersConfig, {"text": {"coverage_treshold": 0.1}})
    cfg.text.min_confidence = 1.5
    with pytest.raises(ValueError, match=r"content\.text\.min_confidence=1\.5"):
        build_content_stages(cfg)
