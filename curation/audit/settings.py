"""Config diffs, and which settings own each drop reason (to say which change removed an image).

``flatten`` turns a resolved config.yaml into ``dotted.key -> value``; ``config_changes``
lists the keys whose values differ between two versions. A change is *bookkeeping* when it
cannot change outputs (where runs are logged, how Ray runs, the output folder): the same
keys ``curation.job.job_digest`` leaves out.

``REASON_SETTINGS`` names, per drop reason, the settings that decide it (a trailing dot means
a whole section). A removed image is explained by the changed settings that own its reason;
reasons not listed fall back to the settings of the step that set them (``STEP_SETTINGS``, and
for a step not listed there the recipe's own word, ``recipe_settings``: its section and the
sections of the steps whose columns it reads), so a step added to the recipe needs no entry here.
When no setting owning the reason changed, a change in an earlier step (or an earlier check of
the same step) may still be why: it changes what reaches the step. ``explain`` then names
those settings, prefixed ``upstream``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from curation import schema

BOOKKEEPING = ("tracking.", "ray.", "output_dir", "name")

REASON_SETTINGS: dict[str, tuple[str, ...]] = {
    schema.READ_FAILED: ("input.",),
    schema.EMPTY_FILE: ("input.",),
    schema.FILE_TOO_LARGE: ("decode.max_bytes",),
    schema.DECOMPRESSION_BOMB: ("decode.max_pixels",),
    schema.NOT_AN_IMAGE: ("decode.",),
    schema.TRUNCATED: ("decode.",),
    schema.DECODE_FAILED: ("decode.",),
    schema.UNSUPPORTED_MODE: ("decode.",),
    schema.TOO_SMALL: ("geometry.min_short_side", "decode.max_side"),
    schema.BAD_ASPECT_RATIO: ("geometry.max_aspect_ratio",),
    schema.NO_SALIENT_PERSON: ("detector.",),
    schema.EXACT_DUPLICATE: ("dedup.",),
    "near_duplicate": ("dedup.",),
    "semantic_duplicate": ("dedup.", "content.embedding."),
    "artistic": ("content.artistic.", "content.embedding."),
    "watermark": ("content.watermark.", "content.embedding."),
    "text": ("content.text.",),
    "watermark_text": ("content.text.",),
}

STEP_SETTINGS: dict[str, tuple[str, ...]] = {
    "input": ("input.", "decode.max_bytes"),
    "decode": ("decode.",),
    "geometry": ("geometry.",),
    "detector": ("detector.",),
    "content.embedding": ("content.embedding.",),
    "content.artistic": ("content.artistic.", "content.embedding."),
    "content.watermark": ("content.watermark.",),
    "content.text": ("content.text.",),
    "dedup.exact": ("dedup.",),
    "dedup.near": ("dedup.",),
    "dedup.semantic": ("dedup.", "content.embedding."),
}


@dataclasses.dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    @property
    def bookkeeping(self) -> bool:
        return matches(self.key, BOOKKEEPING)

    def __str__(self) -> str:
        return f"{self.key}: {show_value(self.old)} -> {show_value(self.new)}"


_MISSING = "<absent>"


def show_value(value: Any) -> str:
    return value if value == _MISSING else json.dumps(value, sort_keys=True)


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """``{"geometry": {"min_short_side": 256}}`` -> ``{"geometry.min_short_side": 256}``; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_changes(old: dict, new: dict) -> list[Change]:
    """Every setting whose value differs (or exists on one side only), sorted by key."""
    a, b = flatten(old), flatten(new)
    return [
        Change(k, a.get(k, _MISSING), b.get(k, _MISSING))
        for k in sorted(set(a) | set(b))
        if a.get(k, _MISSING) != b.get(k, _MISSING)
    ]


def matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(key.startswith(p) if p.endswith(".") else key == p for p in patterns)


def recipe_settings(step: str | None) -> tuple[str, ...]:
    """The sections that decide what the recipe step named ``step`` does: its own and those of the
    steps that write the columns it reads (e.g. ``content.embedding.`` for a head on the CLIP
    embedding). Empty for a step the recipe does not hold."""
    from curation.recipe import HUMANS1B

    cls = next((c for c in HUMANS1B.steps if c.name == step), None)
    if cls is None or not cls.section:
        return ()
    feeders = [o.section for o in HUMANS1B.steps if o is not cls and o.section and set(o.writes) & set(cls.reads)]
    return tuple(dict.fromkeys(f"{s}." for s in (cls.section, *feeders)))


def step_settings(step: str | None) -> tuple[str, ...]:
    """The settings of a step: as listed in ``STEP_SETTINGS``, else as the recipe declares them."""
    return STEP_SETTINGS.get(step) or recipe_settings(step)


def settings_of(reason: str | None, step: str | None = None) -> tuple[str, ...]:
    """The settings that decide ``reason`` (via the step that set it when the reason is unknown)."""
    if reason in REASON_SETTINGS:
        return REASON_SETTINGS[reason]
    if step_settings(step):
        return step_settings(step)
    if reason and reason.endswith("duplicate"):
        return ("dedup.",)
    return ()


def explaining(reason: str | None, changes: list[Change], step: str | None = None) -> list[str]:
    """The changed (non-bookkeeping) settings that own ``reason``."""
    owners = settings_of(reason, step)
    return [c.key for c in changes if not c.bookkeeping and matches(c.key, owners)]


def explain(reason: str | None, step: str | None, funnel_steps: list[str], changes: list[Change]) -> list[str]:
    """The changed settings owning ``reason``; else ``upstream <key>`` for changed settings of the
    steps up to ``step`` in ``funnel_steps`` (pipeline order)."""
    own = explaining(reason, changes, step)
    if own or step not in funnel_steps:
        return own
    before = funnel_steps[: funnel_steps.index(step) + 1]
    owners = tuple(p for s in before for p in step_settings(s))
    return [f"upstream {c.key}" for c in changes if not c.bookkeeping and matches(c.key, owners)]
