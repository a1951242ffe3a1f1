"""Content filters: CLIP embedding, artistic / non-natural depiction, watermark and text (OCR).

Sapiens drops images with watermarks, text, artistic depictions or other non-natural elements.
Each filter here is a stage that annotates scores and a reason on pending rows; the pipeline's
one decision point drops and counts. ``ContentFiltersConfig`` (``content`` in the curation
config) holds one section per filter; ``build_content_stages`` checks it on the driver before
any Ray work (an enabled filter whose weights are missing is an error naming the setting to fix)
and returns the enabled stages in order; ``content_filter_report`` records, for stats.json and
MLflow, which filters were applied and which were disabled by configuration.

Shipped defaults: every filter is enabled. The CLIP, artistic and watermark filters then need
weights (``content.embedding.weights``, ``content.watermark.weights``): a run without them
fails at start-up until they are given or the filter is disabled explicitly. The text filter
needs nothing more: rapidocr ships its ONNX models.
"""
from __future__ import annotations

import dataclasses

from curation.content.artistic import (ARTISTIC, ARTISTIC_FIELDS, ArtisticFilterConfig, ArtisticFilterStage,
                                       check_artistic_config)
from curation.content.common import WeightsUnavailableError
from curation.content.embedding import (EMBEDDING_FIELDS, ClipEmbeddingConfig, ClipEmbeddingStage,
                                        check_clip_config)
from curation.content.text import (TEXT, TEXT_FIELDS, WATERMARK_TEXT, TextFilterConfig, TextFilterStage,
                                   check_text_config)
from curation.content.watermark import (WATERMARK, WATERMARK_FIELDS, WatermarkFilterConfig, WatermarkFilterStage,
                                        check_watermark_config)
from curation.stages import Stage

__all__ = [
    "ARTISTIC", "WATERMARK", "TEXT", "WATERMARK_TEXT", "CONTENT_REASONS", "CONTENT_FIELDS",
    "ClipEmbeddingConfig", "ArtisticFilterConfig", "WatermarkFilterConfig", "TextFilterConfig",
    "ContentFiltersConfig", "ClipEmbeddingStage", "ArtisticFilterStage", "WatermarkFilterStage",
    "TextFilterStage", "WeightsUnavailableError", "build_content_stages", "check_content_config",
    "content_filter_report",
]

# Drop reasons in funnel order (the order of the stages).
CONTENT_REASONS = (ARTISTIC, WATERMARK, TEXT, WATERMARK_TEXT)
# Columns the stages add (null on rows that were not pending, or whose filter did not run).
CONTENT_FIELDS = [*EMBEDDING_FIELDS, *ARTISTIC_FIELDS, *WATERMARK_FIELDS, *TEXT_FIELDS]

_WHAT = {
    "embedding": "no CLIP embeddings were computed (no clip_embedding column for semantic dedup)",
    "artistic": "images were not checked for artistic / non-natural depictions",
    "watermark": "images were not checked for watermarks by the classifier",
    "text": "images were not checked for text or text watermarks",
}


@dataclasses.dataclass(kw_only=True)
class ContentFiltersConfig:
    """The ``content`` section of the curation config."""

    embedding: ClipEmbeddingConfig = dataclasses.field(default_factory=ClipEmbeddingConfig)
    artistic: ArtisticFilterConfig = dataclasses.field(default_factory=ArtisticFilterConfig)
    watermark: WatermarkFilterConfig = dataclasses.field(default_factory=WatermarkFilterConfig)
    text: TextFilterConfig = dataclasses.field(default_factory=TextFilterConfig)


def check_content_config(cfg: ContentFiltersConfig, where: str = "content") -> None:
    """Start-up validation of the enabled filters (weights present, settings in range)."""
    if cfg.artistic.enabled and not cfg.embedding.enabled:
        raise ValueError(f"{where}.artistic scores CLIP embeddings: enable {where}.embedding "
                         f"or set {where}.artistic.enabled=false")
    if cfg.watermark.enabled and cfg.watermark.clip_head_weights and not cfg.embedding.enabled:
        raise ValueError(f"{where}.watermark.clip_head_weights scores CLIP embeddings: enable "
                         f"{where}.embedding, or clear {where}.watermark.clip_head_weights")
    if cfg.embedding.enabled:
        check_clip_config(cfg.embedding, f"{where}.embedding")
    if cfg.artistic.enabled:
        check_artistic_config(cfg.artistic, f"{where}.artistic")
    if cfg.watermark.enabled:
        check_watermark_config(cfg.watermark, f"{where}.watermark")
    if cfg.text.enabled:
        check_text_config(cfg.text, f"{where}.text")


def _stages(cfg: ContentFiltersConfig) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    if cfg.embedding.enabled:
        stages["embedding"] = ClipEmbeddingStage(cfg.embedding)
    if cfg.artistic.enabled:
        stages["artistic"] = ArtisticFilterStage(cfg.artistic, cfg.embedding)
    if cfg.watermark.enabled:
        stages["watermark"] = WatermarkFilterStage(cfg.watermark)
    if cfg.text.enabled:
        stages["text"] = TextFilterStage(cfg.text)
    return stages


def build_content_stages(cfg: ContentFiltersConfig) -> list[Stage]:
    """The enabled content stages, embedding first (the heads read it), after checking the config."""
    check_content_config(cfg)
    return list(_stages(cfg).values())


def content_filter_report(cfg: ContentFiltersConfig) -> dict:
    """For stats.json and MLflow: per filter, ``applied`` and its settings, or why it was not applied."""
    stages = _stages(cfg)
    report: dict = {}
    for key in ("embedding", "artistic", "watermark", "text"):
        if key in stages:
            report[key] = stages[key].describe()
        else:
            report[key] = {"applied": False, "disabled_by": f"content.{key}.enabled=false",
                           "note": _WHAT[key]}
    return report
