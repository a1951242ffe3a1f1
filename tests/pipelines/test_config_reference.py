"""``docs/configuration.md`` is what ``pipelines/config_reference.py`` generates, it documents the
config of every ``pipelines/*.py`` script that loads one, and the generator renders a handmade
config tree exactly as intended."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import re
from dataclasses import field
from pathlib import Path
from typing import Literal

import pytest

from pipelines import config_reference
from pipelines.config_reference import JOBS, JobReference, anchors, render

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "configuration.md"
LOADERS = {"config_main": 1, "load_config": 0}  # call -> position of the config class argument


def test_committed_reference_is_current():
    committed, generated = REFERENCE.read_text(), render()
    diff = difflib.unified_diff(committed.splitlines(), generated.splitlines(), "committed", "generated", lineterm="")
    assert committed == generated, (
        "docs/configuration.md is stale: run python pipelines/config_reference.py\n" + "\n".join(list(diff)[:30])
    )


# ---- every config a script loads is documented ----------------------------------------------


def loaded_classes(script: Path) -> list[type]:
    """The config classes ``script`` passes to ``config_main`` or ``load_config``, resolved through
    its ``from ... import`` statements."""
    tree = ast.parse(script.read_text())
    imported = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        name = getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
        if name not in LOADERS:
            continue
        position = LOADERS[name]
        arg = node.args[position] if len(node.args) > position else None
        arg = arg or next((k.value for k in node.keywords if k.arg in ("config_cls", "cls")), None)
        where = f"{script.relative_to(REPO).as_posix()}:{node.lineno}"
        assert isinstance(arg, ast.Name) and arg.id in imported, f"{where}: {name}(...) names no imported class"
        module, attr = imported[arg.id]
        found.append(getattr(importlib.import_module(module), attr))
    return found


def scripts_and_configs() -> dict[str, list[type]]:
    return {
        script.relative_to(REPO).as_posix(): classes
        for script in sorted((REPO / "pipelines").glob("*.py"))
        if (classes := loaded_classes(script))
    }


def test_every_script_config_is_documented():
    found = scripts_and_configs()
    # the scan misses no script that calls config_main, whatever the call looks like
    by_text = [
        p.relative_to(REPO).as_posix() for p in (REPO / "pipelines").glob("*.py") if "config_main(" in p.read_text()
    ]
    assert by_text and set(by_text) <= set(found), f"config_main called where no class was found: {by_text}"
    documented = {(script, job.cls) for job in JOBS for script in job.scripts}
    loaded = {(script, cls) for script, classes in found.items() for cls in classes}
    assert loaded == documented, (
        f"scripts whose config JOBS in pipelines/config_reference.py leaves out: {sorted(loaded - documented)}; "
        f"entries of JOBS no script loads: {sorted(documented - loaded)}"
    )
    text = REFERENCE.read_text()
    for job in JOBS:
        assert f"\n## {job.name}\n" in text and f"`{job.cls.__name__}`, loaded by" in text, job.name


def test_dag_links_the_stage_sections_instead_of_repeating_them():
    text = REFERENCE.read_text()
    dag = text[text.index("\n## dag\n") : text.index("\n## sweep\n")]
    assert "| `curate` | `CurationConfig` | the [curate](#curate) job's |" in dag
    assert "| `probe` | `ProbeConfig` | the [probe](#probe) job's |" in dag
    assert not re.search(r"^\| `(curate|pretrain|distill|finetune|probe|annotate)\.", dag, re.M), dag
    # the curate job's own part has the keys, without the DAG's prefix
    assert "| `detector.score_threshold` | `float \\| None` | `null` |" in text


def test_readme_links_into_the_reference_reach_a_heading():
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"docs/configuration\.md#([\w-]+)", readme)
    assert targets, "README.md links no part of docs/configuration.md"
    missing = sorted(set(targets) - set(anchors(REFERENCE.read_text())))
    assert not missing, f"README.md links to parts of docs/configuration.md that do not exist: {missing}"


def test_check_mode_fails_on_a_stale_file_and_passes_on_a_fresh_one(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    out.write_text(REFERENCE.read_text().replace("| `steps` |", "| `stepz` |", 1))
    assert config_reference.main(["--check", "--output", str(out)]) == 1
    assert "stale: run python pipelines/config_reference.py" in capsys.readouterr().out
    assert config_reference.main(["--output", str(out)]) == 0
    assert config_reference.main(["--check", "--output", str(out)]) == 0
    assert out.read_text() == render()


# ---- the generator on a handmade tree --------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class ToyInner:
    """Inner settings.

    Rules: a <tag> is text, and x * y is no emphasis; ``a*b <c>`` stays code."""

    mode: Literal["fast", "slow", ""] = "fast"
    sizes: list[int] = field(default_factory=lambda: list(range(40)))


@dataclasses.dataclass(kw_only=True)
class ToyItem:
    name: str
    weight: float = 1.0


@dataclasses.dataclass(kw_only=True)
class ToyJob:
    """A toy job."""

    steps: int = 10
    path: str | None = None
    span: tuple[int, ...] = (1, 2)
    inner: ToyInner = field(default_factory=lambda: ToyInner(mode="slow"))
    again: ToyInner = field(default_factory=ToyInner)
    items: list[ToyItem] = field(default_factory=list)
    bounds: dict[str, ToyItem] = field(default_factory=dict)


@dataclasses.dataclass(kw_only=True)
class ToyChain:
    toy: ToyJob = field(default_factory=lambda: ToyJob(steps=5))
    seed: int = 0


TOY = JobReference(name="toy", cls=ToyJob, scripts=("pipelines/toy.py",))
CHAIN = JobReference(name="chain", cls=ToyChain, scripts=("pipelines/chain_toy.py",))


def test_toy_tree_renders_keys_types_defaults_and_sections_in_order():
    text = render((TOY, CHAIN))
    lines = text.splitlines()
    for row in [
        "| `steps` | `int` | `10` |",
        "| `path` | `str \\| None` | `null` |",
        "| `span` | `tuple[int, ...]` | `[1, 2]` |",
        "| `inner.mode` | `fast \\| slow \\| ''` | `slow` |",  # the job's instance, not the class default
        "| `inner.sizes` | `list[int]` | `[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ...] (40 items)` |",
        "| `again.mode` | `fast \\| slow \\| ''` | `fast` |",
        "| `items` | `list[ToyItem]` | `[]` |",
        "| `items[].name` | `str` | *required* |",
        "| `items[].weight` | `float` | `1.0` |",
        "| `bounds.<key>.weight` | `float` | `1.0` |",
        "| `seed` | `int` | `0` |",
        "| `toy` | `ToyJob` | the [toy](#toy) job's, except `steps: 5` |",
    ]:
        assert row in lines, row
    headings = [line for line in lines if line.startswith("#")]
    assert headings == [
        "# Configuration reference",
        "## toy",
        "### toy: top level",
        "### toy: `inner`",
        "### toy: `again`",
        "### toy: `items[]`",
        "### toy: `bounds.<key>`",
        "## chain",
        "### chain: top level",
    ]
    assert "Sections: [`inner`](#toy-inner), [`again`](#toy-again), [`items[]`](#toy-items), " in text
    assert "[`bounds.<key>`](#toy-boundskey)." in text
    assert text.count("Inner settings.") == 1  # the second ToyInner section links to the first
    assert "Described under [toy: `inner`](#toy-inner)." in text
    assert "Rules: a &lt;tag> is text, and x \\* y is no emphasis; ``a*b <c>`` stays code." in text
    assert "ToyItem(" not in text  # no generated signature for a class without a docstring
    assert "| [toy](#toy) | `ToyJob` | `pipelines/toy.py` |" in lines


def test_long_mappings_keep_their_first_keys_and_count():
    prompts = {f"kind{i}": [f"a long prompt number {j}" for j in range(4)] for i in range(7)}
    assert config_reference.default_text(prompts) == "{kind0: ..., kind1: ..., kind2: ..., kind3: ..., ...} (7 keys)"
    assert config_reference.default_text({"one": ["x" * 80]}) == "{one: ...}"
    assert config_reference.default_text("y" * 80) == "y" * 57 + "..."


def test_a_name_given_twice_is_refused():
    with pytest.raises(RuntimeError, match="anchors used twice"):
        render((TOY, dataclasses.replace(CHAIN, name="toy")))
