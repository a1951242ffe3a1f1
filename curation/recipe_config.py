"""The job config class of a recipe: the job's own settings plus one section per step.

A step's ``section`` is a dotted path: ``decode`` becomes the field ``decode``, ``content.text``
the field ``text`` of a ``content`` group. A group's class also carries the settings its steps
share (a step's ``group`` class, e.g. ``dedup.engine``). So adding a step with its own config
section adds its settings to the job's config, its YAML and its ``key=value`` overrides, with
no other edit. A section whose dataclass has required fields must be given in the config; the
error names the missing setting.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any


def section_class_name(path: str) -> str:
    """A section path's words in CamelCase (``dedup.exact`` -> ``DedupExact``,
    ``backbone_embedding`` -> ``BackboneEmbedding``): the class name of the step it configures."""
    return "".join(word.capitalize() for word in re.split(r"[._]", path) if word)


def _factory(cls: type, where: str):
    def make() -> Any:
        try:
            return cls()
        except TypeError as err:  # a required field without a default
            missing = re.findall(r"'(\w+)'", str(err))
            names = ", ".join(f"{where}.{m}" for m in missing) or where
            raise ValueError(f"{names}: required setting, not given (e.g. {names.split(', ')[0]}=<value>)") from None

    return make


def _group_class(path: str, children: dict[str, Any], bases: tuple[type, ...], module: str) -> type:
    fields = [
        (name, tp, dataclasses.field(default_factory=_factory(tp, f"{path}.{name}" if path else name)))
        for name, tp in children.items()
    ]
    name = section_class_name(path) + "Section"
    cls = dataclasses.make_dataclass(name, fields, bases=bases, kw_only=True)
    cls.__module__, cls.__qualname__ = module, name
    cls.__doc__ = f"The ``{path}`` section: " + ", ".join(children) + "."
    return cls


def config_class(recipe, name: str, module: str | None) -> type:
    """A keyword-only dataclass named ``name``: ``recipe.job``'s fields plus the steps' sections.

    Group classes are reachable as ``<class>.sections[<group path>]``."""
    module = module or recipe.job.__module__
    tree: dict[str, Any] = {}  # nested: group name -> {...} | Config class
    group_bases: dict[str, type] = {}
    for step in recipe.steps:
        if step.Config is None:
            continue
        *groups, leaf = step.section.split(".")
        node = tree
        for i, g in enumerate(groups):
            node = node.setdefault(g, {})
            if step.group is not None:
                group_bases[".".join(groups[: i + 1])] = step.group
        node[leaf] = step.Config
    sections: dict[str, type] = {}

    def build(path: str, node: dict) -> type:
        children = {k: (build(f"{path}.{k}" if path else k, v) if isinstance(v, dict) else v) for k, v in node.items()}
        if not path:
            return _group_class("", children, (recipe.job,), module)
        base = group_bases.get(path)
        sections[path] = _group_class(path, children, (base,) if base else (), module)
        return sections[path]

    cls = build("", tree)
    cls.__name__ = cls.__qualname__ = name
    cls.__doc__ = f"Settings of a curation job: {recipe.job.__name__} + the recipe's step sections."
    cls.sections = sections
    return cls
