"""Content filters in the recipe: start-up validation, order, the applied/disabled report, resources."""

from __future__ import annotations

import pickle

import pytest

from curation.filters.aesthetic import LOW_AESTHETIC, ContentAesthetic
from curation.filters.artistic import ARTISTIC, ContentArtistic
from curation.filters.clip_embedding import ContentEmbedding
from curation.filters.model import WeightsUnavailableError
from curation.filters.nsfw import NSFW, ContentNsfw
from curation.filters.text import TEXT, WATERMARK_TEXT, ContentText
from curation.filters.watermark import WATERMARK, ContentWatermark
from curation.recipe import HUMANS1B, ContentFiltersConfig, CurationConfig
from curation.steps import Resources
from infra.config import from_dict, parse_overrides

NO_WEIGHTS = {
    "embedding": {"enabled": False},
    "nsfw": {"enabled": False},
    "artistic": {"enabled": False},
    "watermark": {"enabled": False},
    "aesthetic": {"enabled": False},
}


CONTENT_STEPS = [ContentEmbedding, ContentNsfw, ContentArtistic, ContentWatermark, ContentAesthetic, ContentText]


def nsfw_layout(width: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of LAION's NSFW detector (NeMo Curator's port) for ``width``-d embeddings."""
    widths = (width, 64, 512, 256, 1)
    shapes = {"norm.mean": (width,), "norm.variance": (width,)}
    for i in range(4):
        shapes |= {f"linear_{i + 1}.weight": (widths[i + 1], widths[i]), f"linear_{i + 1}.bias": (widths[i + 1],)}
    return shapes


def aesthetic_layout(width: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of LAION's aesthetic predictor v2 for ``width``-d embeddings."""
    widths = (width, 1024, 128, 64, 16, 1)
    return {
        f"layers.{i}.{p}": (widths[j + 1], widths[j]) if p == "weight" else (widths[j + 1],)
        for j, i in enumerate((0, 2, 4, 6, 7))
        for p in ("weight", "bias")
    }


def random_head(path, shapes: dict[str, tuple[int, ...]]):
    """Random weights of these shapes saved as a state dict (variances positive)."""
    import torch

    torch.manual_seed(0)
    torch.save({k: torch.rand(s) if k.endswith("variance") else torch.randn(s) * 0.1 for k, s in shapes.items()}, path)
    return path


def build(content: dict | ContentFiltersConfig, **sections):
    """The recipe's content steps (enabled or not), built from a config with this content section."""
    cfg = from_dict(
        CurationConfig, {"input": {"uri": "in"}, "output_dir": "out", "detector": {"backend": "none"}, **sections}
    )
    cfg.content = content if isinstance(content, ContentFiltersConfig) else from_dict(ContentFiltersConfig, content)
    return [s for s in HUMANS1B.build(cfg).steps if s.section.startswith("content.")]


def test_shipped_defaults_demand_weights():
    """Every filter is on by default but the artistic one, whose threshold no one has measured
    (curation.filters.thresholds); without weights the run stops before any work, saying what to do."""
    cfg = ContentFiltersConfig()
    assert all(getattr(cfg, k).enabled for k in ("embedding", "nsfw", "watermark", "aesthetic", "text"))
    assert not cfg.artistic.enabled
    with pytest.raises(WeightsUnavailableError) as err:
        build(cfg)
    assert "content.embedding.weights is not set" in str(err.value)
    assert "content.embedding.enabled=false" in str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, FileNotFoundError)


def test_missing_watermark_weights_name_the_setting(tiny_clip_dir, tmp_path):
    content = {
        "embedding": {"model": f"local-dir:{tiny_clip_dir}"},
        "nsfw": {"enabled": False},
        "aesthetic": {"enabled": False},
        "watermark": {"weights": str(tmp_path / "watermark_model_v1.pt")},
    }
    with pytest.raises(
        WeightsUnavailableError,
        match=r"content\.watermark\.weights=.*no such file.*"
        r"content\.watermark\.enabled=false",
    ):
        build(content)
    content["watermark"] = {"enabled": False}
    content["artistic"] = {"enabled": True, "head_weights": str(tmp_path / "head.pt")}
    with pytest.raises(WeightsUnavailableError, match=r"content\.artistic\.head_weights"):
        build(content)


def test_disabled_filters_stay_in_the_recipe_and_report_not_applied():
    steps = build(NO_WEIGHTS)
    assert [type(s) for s in steps] == CONTENT_STEPS
    assert [s.enabled for s in steps] == [False, False, False, False, False, True]
    report = {s.section: s.describe() for s in steps}
    assert {k: v["applied"] for k, v in report.items()} == {
        "content.embedding": False,
        "content.nsfw": False,
        "content.artistic": False,
        "content.watermark": False,
        "content.aesthetic": False,
        "content.text": True,
    }
    assert report["content.watermark"]["disabled_by"] == "content.watermark.enabled=false"
    assert "not checked for watermarks" in report["content.watermark"]["note"]
    assert report["content.text"]["min_confidence"] == ContentFiltersConfig().text.min_confidence


@pytest.mark.filterwarnings("ignore::curation.filters.thresholds.UncalibratedThresholdWarning")
def test_all_filters_in_order(tiny_clip_dir, tmp_path):
    import torch

    from curation.filters.watermark import build_classifier

    weights = tmp_path / "wm.pt"
    torch.save(build_classifier("mobilenetv3_small_050", (625, 256)).state_dict(), weights)
    steps = build(
        {
            "embedding": {"model": f"local-dir:{tiny_clip_dir}"},
            "nsfw": {"weights": str(random_head(tmp_path / "nsfw.pth", nsfw_layout(32)))},
            "artistic": {"enabled": True},
            "watermark": {"weights": str(weights), "backbone": "mobilenetv3_small_050"},
            "aesthetic": {"weights": str(random_head(tmp_path / "aesthetic.pth", aesthetic_layout(32)))},
        }
    )
    assert [type(s) for s in steps] == CONTENT_STEPS
    assert all(s.uses_model and s.enabled for s in steps)
    assert [r for s in steps for r in s.reasons] == [NSFW, ARTISTIC, WATERMARK, LOW_AESTHETIC, TEXT, WATERMARK_TEXT]
    # steps travel to Ray workers pickled, before setup: settings only, no model
    for step in steps:
        assert len(pickle.dumps(step)) < 20_000
    assert {c for s in steps for c in s.columns_written()} == {
        "clip_embedding",
        "nsfw_score",
        "artistic_score",
        "artistic_label",
        "watermark_score",
        "aesthetic_score",
        "text_coverage",
        "text_box_count",
        "text_watermark",
    }


def test_a_step_reading_a_disabled_steps_column_is_refused():
    with pytest.raises(
        ValueError,
        match=r"step 'content\.artistic' reads column 'clip_embedding', which no earlier "
        r"enabled step writes: 'content\.embedding' writes it but is disabled; set "
        r"content\.embedding\.enabled=true or content\.artistic\.enabled=false",
    ):
        build(
            {
                "embedding": {"enabled": False},
                "nsfw": {"enabled": False},
                "artistic": {"enabled": True},
                "aesthetic": {"enabled": False},
            }
        )
    with pytest.raises(ValueError, match=r"step 'content\.nsfw' reads column 'clip_embedding'"):
        build({"embedding": {"enabled": False}})
    with pytest.raises(ValueError, match=r"step 'content\.watermark' reads column 'clip_embedding'"):
        build(
            {
                "embedding": {"enabled": False},
                "nsfw": {"enabled": False},
                "artistic": {"enabled": False},
                "aesthetic": {"enabled": False},
                "watermark": {"clip_head_weights": "head.pt"},
            }
        )
    with pytest.raises(ValueError, match=r"step 'dedup\.semantic' reads column 'clip_embedding'"):
        build(NO_WEIGHTS, dedup={"semantic": {"enabled": True}})


def test_gpu_resources_from_settings(tiny_clip_dir):
    content = {
        "embedding": {
            "model": f"local-dir:{tiny_clip_dir}",
            "num_gpus": 0.25,
            "batch_size": 256,
            "num_actors": 4,
            "device": "cuda",
        },
        "nsfw": {"enabled": False},
        "artistic": {"enabled": False},
        "watermark": {"enabled": False},
        "aesthetic": {"enabled": False},
        "text": {"num_cpus": 2, "batch_size": 8, "num_actors": 3},
    }
    embedding, *_, text = build(content)
    assert embedding.resources() == Resources(num_cpus=1.0, num_gpus=0.25, batch_size=256, num_actors=4)
    assert text.resources() == Resources(num_cpus=2.0, num_gpus=0.0, batch_size=8, num_actors=3)
    # device=cuda without a GPU share: Ray would hide the GPUs from the actor
    content["embedding"]["num_gpus"] = 0.0
    with pytest.raises(ValueError, match=r"content\.embedding\.device=cuda needs content\.embedding\.num_gpus > 0"):
        build(content)


def test_overrides_and_bad_values():
    cfg = from_dict(
        ContentFiltersConfig,
        parse_overrides(
            [
                "embedding.enabled=false",
                "nsfw.enabled=false",
                "artistic.enabled=false",
                "watermark.enabled=false",
                "aesthetic.enabled=false",
                "text.max_side=640",
                "text.coverage_threshold=0.1",
            ]
        ),
    )
    assert cfg.text.max_side == 640 and cfg.text.coverage_threshold == 0.1
    with pytest.raises(ValueError, match="did you mean 'coverage_threshold'"):
        from_dict(ContentFiltersConfig, {"text": {"coverage_treshold": 0.1}})
    cfg.text.min_confidence = 1.5
    with pytest.raises(ValueError, match=r"content\.text\.min_confidence=1\.5"):
        build(cfg)
