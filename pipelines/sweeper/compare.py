"""What a sweep found: each variant's runs, its probe metrics over seeds against the baseline's,
and how its dataset differs from the baseline's (the curation audit's diff).

The noise rule. A metric's spread is its sample standard deviation over the variant's finished
seeds. The difference of a variant's mean from the baseline's exceeds the seed spread when
``|delta| > noise_factor * sqrt(sd_v^2 / n_v + sd_b^2 / n_b)`` (``noise_factor`` standard errors
of the difference of the means, 2 by default) and both sides have at least two seeds; otherwise
it is "within noise" (or, with a single seed on a side, its spread is unknown and no claim is
made). With two seeds the spread is itself a rough estimate: the rule screens, it does not test.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

from curation.audit import diff_versions, load_version, render_diff
from pipelines.demo import HEADLINE

WITHIN_NOISE, NO_SPREAD = "within noise", "spread unknown (one seed)"


@dataclasses.dataclass(frozen=True)
class SeedOutcome:
    """One DAG invocation of a variant: how it ended, its dataset, probe metrics and stages."""

    seed: int
    status: str  # "finished" or "failed"
    error: str = ""
    dataset_id: str = ""
    dataset_uri: str = ""
    kept: int | None = None
    inputs: int | None = None
    metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    stages: dict[str, str] = dataclasses.field(default_factory=dict)  # stage -> "ran" / "reused"
    identities: dict[str, str] = dataclasses.field(default_factory=dict)  # stage -> identity
    dag_run_id: str = ""
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class MetricStats:
    """One probe metric of a variant over its finished seeds (``spread``: None below two seeds)."""

    task: str
    metric: str
    better: str  # "higher", "lower" or "" (not a headline metric)
    values: tuple[float, ...]
    mean: float
    spread: float | None


@dataclasses.dataclass(frozen=True)
class Versus:
    """A variant's metric against the baseline's: ``delta`` of the means, the ``noise`` it must
    exceed (None when a side has one seed) and the ``verdict``."""

    delta: float
    noise: float | None
    verdict: str  # "better", "worse", "differs" (no direction known), WITHIN_NOISE or NO_SPREAD


@dataclasses.dataclass(frozen=True)
class FateChanges:
    """The variant's dataset against the baseline's (``curation.audit.diff``): ``same`` when both
    are one version; else the content settings that changed, the counts, each group of images that
    changed fate (direction, the other side's status and reason, count, explaining settings, first
    keys) and the full diff page's file name."""

    same: bool
    settings: list[str] = dataclasses.field(default_factory=list)
    added: int = 0
    removed: int = 0
    kept_in_both: int = 0
    renamed: int = 0
    groups: list[dict] = dataclasses.field(default_factory=list)
    page: str = ""


@dataclasses.dataclass
class VariantSummary:
    name: str
    overrides: list[str]
    seeds: list[SeedOutcome]
    settings: list[tuple[str, str, str]]  # (DAG setting, baseline's value, this variant's)
    stats: dict[str, MetricStats] = dataclasses.field(default_factory=dict)  # "task.metric" ->
    versus: dict[str, Versus] = dataclasses.field(default_factory=dict)
    fate: FateChanges | None = None
    run_id: str = ""

    @property
    def finished(self) -> list[SeedOutcome]:
        return [s for s in self.seeds if s.status == "finished"]

    @property
    def status(self) -> str:
        n = len(self.finished)
        return "finished" if n == len(self.seeds) else "failed" if n == 0 else "partly failed"

    @property
    def dataset(self) -> SeedOutcome | None:
        """A seed that curated (all seeds share the variant's curation)."""
        return next((s for s in self.seeds if s.dataset_id), None)


# ---- metrics over seeds -------------------------------------------------------------------------


def shown_metrics(task: str, metrics: dict[str, float]) -> list[str]:
    """The task's headline metric when it has it, else every metric it reported."""
    headline = HEADLINE.get(task, ("", ""))[0]
    return [headline] if headline in metrics else sorted(metrics)


def metric_stats(seeds: list[SeedOutcome]) -> dict[str, MetricStats]:
    """Every shown metric of the finished seeds, as mean and spread."""
    values: dict[tuple[str, str], list[float]] = {}
    for s in seeds:
        for task, metrics in s.metrics.items():
            for metric in shown_metrics(task, metrics):
                values.setdefault((task, metric), []).append(float(metrics[metric]))
    return {f"{t}.{m}": _stats(t, m, v) for (t, m), v in values.items()}


def _stats(task: str, metric: str, values: list[float]) -> MetricStats:
    headline, direction = HEADLINE.get(task, ("", ""))
    better = direction if metric == headline else ""
    spread = statistics.stdev(values) if len(values) > 1 else None
    return MetricStats(task, metric, better, tuple(values), statistics.fmean(values), spread)


def versus(base: MetricStats, other: MetricStats, noise_factor: float) -> Versus:
    """``other`` against the baseline's ``base`` by the module's noise rule."""
    delta = other.mean - base.mean
    if base.spread is None or other.spread is None:
        return Versus(delta, None, NO_SPREAD)
    noise = noise_factor * math.sqrt(other.spread**2 / len(other.values) + base.spread**2 / len(base.values))
    if abs(delta) <= noise:
        return Versus(delta, noise, WITHIN_NOISE)
    if not base.better:
        return Versus(delta, noise, "differs")
    return Versus(delta, noise, "better" if (delta > 0) == (base.better == "higher") else "worse")


def compare_metrics(variants: list[VariantSummary], noise_factor: float) -> None:
    """Fill each variant's ``stats`` and (but the baseline, the first) its ``versus``."""
    for v in variants:
        v.stats = metric_stats(v.finished)
    base = variants[0].stats
    for v in variants[1:]:
        v.versus = {k: versus(base[k], s, noise_factor) for k, s in v.stats.items() if k in base}


# ---- datasets -----------------------------------------------------------------------------------


def fate_changes(base: SeedOutcome, other: SeedOutcome, folder: Path, name: str, samples: int) -> FateChanges:
    """The audit diff from the baseline's dataset to the variant's; its page written to ``folder``."""
    if base.dataset_id == other.dataset_id:
        return FateChanges(same=True)
    d = diff_versions(load_version(base.dataset_uri), load_version(other.dataset_uri), per_reason=samples)
    page = f"diff-{name}.html"
    (folder / page).write_text(render_diff(d, per_reason=samples), encoding="utf-8")
    groups = [
        _group(direction, g)
        for direction, side in (("removed", d.removals), ("added", d.additions))
        for g in side.groups
    ]
    return FateChanges(
        same=False,
        settings=[str(c) for c in d.config_changes if not c.bookkeeping],
        added=d.additions.total,
        removed=d.removals.total,
        kept_in_both=d.kept_in_both,
        renamed=d.renamed_total,
        groups=groups,
        page=page,
    )


def _group(direction: str, g) -> dict:
    """One ``ChangeGroup`` of the diff as plain data."""
    return {
        "direction": direction,
        "status": g.status,
        "reason": g.reason,
        "step": g.step,
        "count": g.count,
        "explained_by": list(g.explained_by),
        "keys": list(g.keys),
    }


def compare_datasets(variants: list[VariantSummary], folder: Path, samples: int) -> None:
    """Each variant's ``fate`` against the baseline (the first); none where either has no dataset."""
    base = variants[0].dataset
    for v in variants[1:]:
        mine = v.dataset
        if base is not None and mine is not None:
            v.fate = fate_changes(base, mine, folder, v.name, samples)
