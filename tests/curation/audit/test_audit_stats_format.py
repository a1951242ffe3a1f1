"""stats.json of format 1 (no ``format``: ``stage``/``stages`` and the former step names), as
outputs finished before format 2 hold it, reads as format 2 everywhere a finished output is read:
the version, the audit's summary and page, and the version diff are what they are for the same
output written in format 2.

The versions are small finished outputs of ``benchmarks/audit_scale.py`` (the real manifest schema,
the demo's steps); the format 1 file is written here from the former names, never through the
reading code's own table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from curation import stats as stats_module
from curation.audit import counts, diff, load_version, render_diff, render_report
from curation.output import STATS_FILE
from curation.recipe import HUMANS1B

REPO = Path(__file__).resolve().parents[3]
# The shipped recipe's step names before format 2, in recipe order.
FORMAT1_RECIPE = (
    "read",
    "decode",
    "geometry",
    "image_quality",
    "decontaminate",
    "exact_dedup",
    "near_dedup",
    "person_detection",
    "clip_embedding",
    "nsfw_filter",
    "artistic_filter",
    "watermark_filter",
    "aesthetic_filter",
    "text_filter",
    "backbone_embedding",
    "semantic_dedup",
    "clusters",
    "write_shards",
)


def as_format1(stats: dict) -> dict:
    """A format 2 stats.json as the code before format 2 wrote it."""
    former = dict(zip([s.name for s in HUMANS1B.steps], FORMAT1_RECIPE, strict=True))
    old = {k: v for k, v in stats.items() if k not in ("format", "funnel", "steps")}
    old["funnel"] = [
        {"stage": former.get(e["step"], e["step"]), **{k: v for k, v in e.items() if k != "step"}}
        for e in stats["funnel"]
    ]
    old["stages"] = [{**d, "name": former[d["name"]]} for d in stats["steps"]]
    return old


@pytest.fixture
def versions(tmp_path) -> tuple[Path, Path]:
    """Two finished outputs (A, B) of the same corpus, their stats.json in format 2."""
    spec = importlib.util.spec_from_file_location("audit_scale", REPO / "benchmarks" / "audit_scale.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    corpus, a, b = (tmp_path / x for x in ("corpus", "a", "b"))
    gen.write_version(str(a), str(corpus), [0, 1], 200, gen.MIN_SIDE_A, False)
    gen.write_version(str(b), str(corpus), [0, 2], 200, gen.MIN_SIDE_B, True)
    return a, b


def test_upgrade_names_the_steps_by_their_sections():
    old = {
        "inputs": 3,
        "funnel": [
            {"stage": "read", "in": 3, "out": 3, "removed": {}},
            {"stage": "exact_dedup", "in": 3, "out": 2, "removed": {"exact_duplicate": 1}},
            {"stage": "other", "in": 2, "out": 2, "removed": {}},
        ],
        "stages": [{"name": "person_detection", "applied": False, "disabled_by": "detector.enabled=false"}],
    }
    new = stats_module.upgrade(old)
    assert new == {
        "format": 2,
        "inputs": 3,
        "funnel": [
            {"step": "input", "in": 3, "out": 3, "removed": {}},
            {"step": "dedup.exact", "in": 3, "out": 2, "removed": {"exact_duplicate": 1}},
            {"step": "other", "in": 2, "out": 2, "removed": {}},
        ],
        "steps": [{"name": "detector", "applied": False, "disabled_by": "detector.enabled=false"}],
    }
    assert stats_module.upgrade(new) is new
    with pytest.raises(ValueError, match=r"^stats.json has format 3, newer than this code reads \(1 to 2\)$"):
        stats_module.upgrade({**new, "format": 3})


def rewrite_as_format1(folder: Path) -> dict:
    """Rewrite the output's stats.json in format 1; returns the format 2 file it held."""
    written = json.loads((folder / STATS_FILE).read_text())
    assert written["format"] == 2
    old = as_format1(written)
    assert "format" not in old and "steps" not in old and "step" not in old["funnel"][0]
    names = {d["name"] for d in old["stages"]} | {e["stage"] for e in old["funnel"]}
    assert {"person_detection", "text_filter", "exact_dedup", "image_quality"} <= names
    (folder / STATS_FILE).write_text(json.dumps(old, indent=2, sort_keys=True))
    return written


def test_the_audit_summary_and_the_diff_read_a_format1_stats_json(versions):
    a, b = versions
    before = load_version(str(a))
    summary = counts.summary_text(before)
    changes = diff.diff_versions(before, load_version(str(b)), per_reason=2)
    page, text = render_diff(changes, per_reason=2), diff.diff_summary(changes)
    assert "content.text" in summary and "content.text" in page

    written = rewrite_as_format1(a)
    after = load_version(str(a))
    assert after.stats == before.stats == written
    assert "disagrees" not in counts.summary_text(after) and counts.summary_text(after) == summary
    changes = diff.diff_versions(after, load_version(str(b)), per_reason=2)
    assert diff.diff_summary(changes) == text and render_diff(changes, per_reason=2) == page


@pytest.mark.slow  # two renders of the audit page (~30 s each on a loaded 2-core machine)
def test_the_audit_page_of_a_format1_stats_json_is_the_same(versions):
    a, _ = versions
    report = render_report(load_version(str(a)), per_reason=2, kept=2)
    assert 'data-step="detector"' in report and 'data-step="content.text"' in report
    rewrite_as_format1(a)
    assert render_report(load_version(str(a)), per_reason=2, kept=2) == report
