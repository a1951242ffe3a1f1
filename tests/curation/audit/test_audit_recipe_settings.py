"""The audit's settings of a step the hand-written tables do not list come from the recipe: its
section and the sections of the steps whose columns it reads."""

from __future__ import annotations

import dataclasses

from curation.audit import settings
from curation.recipe import ContentFiltersConfig, weightless_content_filters


def test_a_step_not_listed_gets_its_section_and_its_feeders():
    assert "content.artistic" in settings.STEP_SETTINGS  # listed: the table wins
    assert settings.step_settings("content.artistic") == settings.STEP_SETTINGS["content.artistic"]
    assert settings.recipe_settings("content.artistic") == ("content.artistic.", "content.embedding.")
    assert settings.recipe_settings("no_such_step") == ()


def test_an_unlisted_reason_is_explained_by_its_steps_sections():
    changes = [settings.Change("content.embedding.model", "ViT-B-32", "ViT-L-14")]
    unlisted = "some_new_reason"
    assert unlisted not in settings.REASON_SETTINGS
    assert settings.explaining(unlisted, changes, "content.artistic") == ["content.embedding.model"]


def test_weightless_content_filters_disable_every_content_step_but_ocr():
    cfg = weightless_content_filters()
    enabled = {f.name: getattr(cfg, f.name).enabled for f in dataclasses.fields(ContentFiltersConfig)}
    assert enabled.pop("text") is True and enabled and not any(enabled.values())
