"""One name per step: a step's name is its config section's path as a user writes it, its class
is that path in CamelCase, and everything written with step names (funnel, descriptions, MLflow
metric and tag names, decision folders) says the same."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pyarrow as pa
import pytest
from PIL import Image

import curation
from curation import output
from curation.dedup import DECISION_SCHEMA
from curation.filters.geometry import Geometry
from curation.recipe import HUMANS1B, CurationConfig
from curation.recipe_config import section_class_name
from curation.stats import compute_stats, tracking_record
from curation.steps import BuiltRecipe, Recipe, Step
from infra.config import load_config

# The shipped recipe's class names, in order, as decided: the section's words in CamelCase.
SHIPPED_CLASSES = [
    "Input",
    "Decode",
    "Geometry",
    "Quality",
    "DedupDecontaminate",
    "DedupExact",
    "DedupNear",
    "Detector",
    "ContentEmbedding",
    "ContentNsfw",
    "ContentArtistic",
    "ContentWatermark",
    "ContentAesthetic",
    "ContentText",
    "BackboneEmbedding",
    "DedupSemantic",
    "Clusters",
    "Shards",
]


def _library_modules():
    for info in pkgutil.walk_packages(curation.__path__, "curation."):
        yield importlib.import_module(info.name)


def _library_recipes() -> list[Recipe]:
    return [r for m in _library_modules() for r in vars(m).values() if isinstance(r, Recipe)]


def _library_steps() -> list[type[Step]]:
    found, todo = set(), [Step]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return sorted((c for c in found if c.__module__.startswith("curation.")), key=lambda c: c.__qualname__)


def test_section_class_name_joins_the_words_of_a_path():
    assert section_class_name("dedup.exact") == "DedupExact"
    assert section_class_name("backbone_embedding") == "BackboneEmbedding"
    assert section_class_name("content.nsfw") == "ContentNsfw"
    assert section_class_name("input") == "Input"


def test_every_step_of_every_recipe_is_named_by_its_section():
    recipes = _library_recipes()
    assert HUMANS1B in recipes
    for recipe in recipes:
        for cls in recipe.steps:
            assert cls.section and cls.name == cls.section, cls.__qualname__
            assert cls.__name__ == section_class_name(cls.section), (cls.__name__, cls.section)
            assert cls.Config is None or cls.Config.__name__ == f"{cls.__name__}Config", cls.Config
    assert [cls.__name__ for cls in HUMANS1B.steps] == SHIPPED_CLASSES


def test_every_library_step_class_is_named_by_its_section_or_is_a_base():
    """A step class of the library without a section is a base others derive from, never a step."""
    steps = _library_steps()
    assert len([c for c in steps if c.section]) >= len(SHIPPED_CLASSES)
    for cls in steps:
        if cls.section:
            assert cls.name == cls.section and cls.__name__ == section_class_name(cls.section), cls.__qualname__
        else:
            assert cls.__subclasses__() or inspect.isabstract(cls), f"{cls.__qualname__} has no section"
            assert all(cls not in r.steps for r in _library_recipes()), cls.__qualname__


def test_a_step_that_writes_its_name_is_refused():
    with pytest.raises(TypeError, match=r"GeometryNamed: declare its config ``section``; a step's ``name`` is its"):
        type("GeometryNamed", (Geometry,), {"name": "geometry_filter"})


def test_stats_and_mlflow_say_the_step_names_users_write():
    """The funnel, the descriptions and the MLflow names of a run's stats: the config sections."""
    overrides = ["input.uri=x", "output_dir=y", "detector.backend=none", "content.artistic.enabled=false"]
    cfg = load_config(CurationConfig, overrides=[*overrides, "content.watermark.enabled=false"])
    built = BuiltRecipe([s.from_config(cfg) for s in HUMANS1B.steps])  # no start-up checks: no weights here
    manifest = pa.table(
        {
            "key": ["a", "b", "c"],
            "sha256": ["1", "2", "3"],
            "status": ["kept", "dropped", "dropped"],
            "reason": [None, "exact_duplicate", "text"],
            "notes": [[], [], []],
        }
    )
    stats = compute_stats(manifest, built.funnel(), samples_in_shards=1, shards=1, descriptions=built.describe())
    assert stats["format"] == 2 and stats["reconciled"]
    removing = {e["step"]: e["removed"] for e in stats["funnel"] if e["removed"]}
    assert removing == {"dedup.exact": {"exact_duplicate": 1}, "content.text": {"text": 1}}
    assert [d["name"] for d in stats["steps"]] == [s.section for s in HUMANS1B.steps[1:-1]]
    artistic = next(d for d in stats["steps"] if d["name"] == "content.artistic")
    assert (artistic["applied"], artistic["disabled_by"]) == (False, "content.artistic.enabled=false")
    metrics, tags, _ = tracking_record(stats)
    assert metrics["funnel.dedup.exact.out"] == 2 and metrics["funnel.content.text.out"] == 1
    assert tags["step.content.artistic.applied"] == "false" and tags["step.dedup.near.applied"] == "true"
    assert not any(k.startswith("filter.") for k in tags)


def test_a_resumed_run_drops_the_decisions_written_under_the_former_step_names(tmp_path, centernet_path):
    """Global steps decide again on every run; a folder of a run begun under the former names
    would be read beside theirs (``partition_decisions`` reads every step's folder)."""
    from curation.job import prepare
    from curation.passes import plan
    from infra import storage
    from tests.curation.test_pipeline import demo_config

    (tmp_path / "raw").mkdir()
    Image.new("RGB", (64, 48), (120, 30, 60)).save(tmp_path / "raw" / "one.jpg")
    job = prepare(demo_config(tmp_path / "raw", tmp_path / "out", centernet_path), HUMANS1B)
    table = pa.table([["k"], ["near_duplicate"], ["j"], ["g"]], schema=DECISION_SCHEMA)
    for step in ("near_dedup", "dedup.near"):
        storage.write_parquet(job.fs, output.decisions_path(job.root, step, "000000-x"), table)
    plan(job)
    folders = tmp_path / "out" / output.DEDUP_DIR / output.DECISIONS_DIR
    assert sorted(p.name for p in folders.iterdir()) == ["dedup.near"]
