"""The recipe: one list of steps from which the config, the funnel, the step descriptions and the
dedup columns derive. A filter added as one file + one recipe line shows up everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curation.pipeline import run_curation
from curation.recipe import HUMANS1B
from curation.steps import BuiltRecipe, Recipe
from infra.config import load_config
from tests.curation.toy_brightness import DARK, ContentBrightness

# The recipe of the shipped job with the toy filter after the text filter: the one recipe line.
_AFTER_TEXT = [s.name for s in HUMANS1B.steps].index("content.text") + 1
WITH_BRIGHTNESS = Recipe(
    [*HUMANS1B.steps[:_AFTER_TEXT], ContentBrightness, *HUMANS1B.steps[_AFTER_TEXT:]], job=HUMANS1B.job
)


def test_the_shipped_recipe_is_in_order():
    names = [s.name for s in HUMANS1B.steps]
    assert names == [
        "input",
        "decode",
        "geometry",
        "quality",
        "dedup.decontaminate",
        "dedup.exact",
        "dedup.near",
        "detector",
        "content.embedding",
        "content.nsfw",
        "content.artistic",
        "content.watermark",
        "content.aesthetic",
        "content.text",
        "backbone_embedding",
        "dedup.semantic",
        "clusters",
        "shards",
    ]


def _config(recipe: Recipe, *overrides: str):
    return load_config(
        recipe.config_class(),
        overrides=[
            "input.uri=x",
            "output_dir=y",
            "detector.backend=none",
            "content.artistic.enabled=false",
            "content.watermark.enabled=false",
            *overrides,
        ],
    )


def test_the_global_steps_are_the_pass_boundaries():
    cfg = _config(HUMANS1B, "dedup.semantic.enabled=true")  # (CLIP weights not needed: the steps are not checked)
    passes = BuiltRecipe([s.from_config(cfg) for s in HUMANS1B.steps]).passes()
    names = [([s.name for s in p.row_steps], [s.name for s in p.global_steps]) for p in passes]
    assert names == [
        (["decode", "geometry", "quality"], ["dedup.exact", "dedup.near"]),
        (["content.embedding", "content.nsfw", "content.aesthetic", "content.text"], ["dedup.semantic"]),
    ]  # (detector.backend=none)
    # a disabled global step is no boundary: without any dedup, one pass
    cfg = _config(HUMANS1B, "dedup.exact.enabled=false", "dedup.near.enabled=false")
    flat = BuiltRecipe([s.from_config(cfg) for s in HUMANS1B.steps]).passes()
    assert [[s.name for s in p.row_steps] for p in flat] == [
        ["decode", "geometry", "quality", "content.embedding", "content.nsfw", "content.aesthetic", "content.text"]
    ]


def test_each_step_writes_its_declared_fields_and_charts_its_own_columns_and_settings():
    """``writes`` is the names of ``fields``; a score the audit charts is read from columns the
    step writes (or, derived, reads) and its threshold is a key of the step's description."""
    cfg = _config(WITH_BRIGHTNESS, "content.brightness.threshold=60")
    charted = []
    for cls in WITH_BRIGHTNESS.steps:
        assert cls.writes == tuple(f.name for f in cls.fields), cls.name
        described = cls.from_config(cfg).settings()
        for score in cls.scores:
            assert set(score.columns()) <= {*cls.writes, *cls.reads}, (cls.name, score.column)
            assert score.setting is None or score.setting in described, (cls.name, score.setting)
            charted.append(score.column)
    assert charted[:6] == [
        "short_side",
        "aspect_ratio",
        "sharpness",
        "clipped_dark",
        "clipped_bright",
        "person_score_max",
    ]
    with pytest.raises(TypeError, match="declare the columns it writes as ``fields``"):
        type("HandListed", (ContentBrightness,), {"writes": ("brightness",)})


def test_the_reader_and_the_writer_are_named_not_found_by_position():
    built = BuiltRecipe([s.from_config(_config(HUMANS1B)) for s in HUMANS1B.steps])
    assert (built.reader.name, built.writer.name) == ("input", "shards")
    assert [s.name for s in built.between] == [s.name for s in HUMANS1B.steps][1:-1]
    first_pass = built.up_to(built.passes()[0])  # what pass 1's global steps see: the reader, no writer
    assert first_pass.reader is built.reader
    with pytest.raises(ValueError, match="recipe: 0 writer steps, one expected"):
        _ = first_pass.writer
    reader, *between, writer = HUMANS1B.steps
    for steps in ([reader, *between], [writer, reader, *between], [reader, writer, *between]):
        with pytest.raises(ValueError, match="recipe: needs one reader first and one writer last"):
            Recipe(steps, job=HUMANS1B.job)


def test_a_model_step_before_the_first_dedup_is_refused():
    steps = list(HUMANS1B.steps)
    person = steps.pop(steps.index(next(s for s in steps if s.name == "detector")))
    steps.insert(3, person)  # right after geometry: it would score every duplicate
    with pytest.raises(
        ValueError,
        match=r"model step 'detector' comes before the first global \(dedup\) "
        r"step, so it would score every duplicate",
    ):
        Recipe(steps, job=HUMANS1B.job)


def test_a_recipe_in_the_wrong_order_is_refused_naming_step_and_column(tmp_path):
    swapped = list(HUMANS1B.steps)
    swapped[1], swapped[2] = swapped[2], swapped[1]  # geometry before decode
    recipe = Recipe(swapped, job=HUMANS1B.job)
    cfg = load_config(
        recipe.config_class(),
        overrides=[
            "input.uri=x",
            "output_dir=y",
            "detector.backend=none",
            "content.embedding.enabled=false",
            "content.artistic.enabled=false",
            "content.watermark.enabled=false",
        ],
    )
    with pytest.raises(
        ValueError,
        match=r"step 'geometry' reads column 'width', which no earlier enabled step "
        r"writes: 'decode' writes it later in the recipe; move 'geometry' after it",
    ):
        recipe.build(cfg)


def test_the_new_filters_missing_setting_is_refused_clearly():
    cls = WITH_BRIGHTNESS.config_class()
    with pytest.raises(ValueError, match=r"content\.brightness\.threshold: required setting, not given"):
        load_config(cls, overrides=["input.uri=x", "output_dir=y"])
    cfg = load_config(cls, overrides=["input.uri=x", "output_dir=y", "content.brightness.threshold=60"])
    assert cfg.content.brightness.threshold == 60.0


@pytest.mark.slow
def test_a_filter_added_in_one_file_and_one_line_runs_everywhere(tmp_path, ray_local, centernet_path):
    """Funnel in stats.json, the audit page, MLflow: all from the recipe list."""
    import mlflow

    from curation.audit import load_version, render_report
    from pipelines.demo_corpus import build_demo_corpus

    build_demo_corpus(tmp_path / "raw")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config(
        WITH_BRIGHTNESS.config_class(),
        Path(__file__).parents[2] / "configs" / "curate_demo.yaml",
        [
            f"input.uri={tmp_path / 'raw'}",
            f"output_dir={tmp_path / 'out'}",
            f"detector.weights={centernet_path}",
            f"tracking.uri={uri}",
            "content.text.enabled=false",
            "content.brightness.threshold=100",
            "content.brightness.num_cpus=0.25",
            "backbone_embedding.enabled=false",  # (the demo's cluster ids: tests/curation/test_pipeline.py)
            "clusters.enabled=false",
        ],
    )
    result = run_curation(cfg, recipe=WITH_BRIGHTNESS)
    funnel = {step["step"]: step for step in result.stats["funnel"]}
    assert list(funnel).index("content.brightness") == list(funnel).index("detector") + 1
    assert funnel["content.brightness"]["removed"].get(DARK, 0) >= 1  # the demo's people include dark photos
    assert result.stats["reconciled"]
    steps = {s["name"]: s for s in result.stats["steps"]}
    assert steps["content.brightness"] == {"name": "content.brightness", "applied": True, "threshold": 100.0}
    on_disk = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert on_disk["funnel"] == result.stats["funnel"]

    run = mlflow.MlflowClient(uri).get_run(result.mlflow_run_id)
    assert run.data.params["content.brightness.threshold"] == "100.0"
    assert run.data.tags["step.content.brightness.applied"] == "true"
    assert run.data.metrics["funnel.content.brightness.out"] == funnel["content.brightness"]["out"]

    page = render_report(load_version(str(tmp_path / "out")))
    assert "content.brightness" in page and DARK in page


def test_an_output_dir_that_cannot_be_created_is_one_line_and_exit_2(tmp_path):
    """A user error like any other setting: named, before any Ray work, no traceback."""
    import subprocess
    import sys

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    repo = Path(__file__).parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            str(repo / "pipelines" / "curate.py"),
            f"input.uri={tmp_path}",
            f"output_dir={blocker / 'out'}",
            "detector.backend=none",
            "content.embedding.enabled=false",
            "content.nsfw.enabled=false",
            "content.artistic.enabled=false",
            "content.watermark.enabled=false",
            "content.aesthetic.enabled=false",
            "tracking.enabled=false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "output_dir=" in errors[0] and "cannot be created" in errors[0]
    assert "Traceback" not in proc.stderr
