"""A sweep's settings, and the DAG configurations they expand to: one per variant and seed.

Each variant is a list of ``key=value`` overrides of one DAG configuration (``dag``), applied
after the sweep's own ``overrides`` (the settings every variant shares) and before the seed's
(``seed_keys=<seed>``). Every variant must train the same model for as many images and be
probed alike (``budget``): a variant that changes any of that is refused before anything runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from pathlib import Path

from infra.config import config_to_dict, load_config
from infra.tracking import flatten
from pipelines.chain import DagConfig

DAG_FOLDER = "dag"  # the variants' shared DAG workspace, under output_dir (unless overridden)
# What a variant may not change: the model, the images it sees, the probes (and the stages).
BUDGET_KEYS = (
    "stages",
    "pretrain.model",
    "pretrain.steps",
    "pretrain.batch_size_per_worker",
    "pretrain.ray.num_workers",
    "pretrain.crops.",
    "probe.",
)
# Never part of the budget: where things go, how runs are named, the seed.
NOT_BUDGET = (
    "probe.seed",
    "probe.name",
    "probe.output_dir",
    "probe.tracking.",
    "probe.ray.",
    "probe.backbone.checkpoint",
)


@dataclasses.dataclass(kw_only=True)
class VariantConfig:
    """One variant: its ``name`` (a page column, an MLflow run) and its ``overrides`` of the DAG config."""

    name: str
    overrides: list[str] = field(default_factory=list)


@dataclasses.dataclass(kw_only=True)
class SweepConfig:
    """``dag``: the DAG configuration every variant starts from (a YAML path); ``overrides``:
    ``key=value`` settings of it for every variant (the shared budget: stages, steps, probes);
    ``variants``: each a name and its own overrides; ``baseline``: the variant the others are
    compared with ("" = the first); ``seeds``: each variant runs once per seed, every key of
    ``seed_keys`` set to it; ``corpus``: build the demo corpus there (``pipelines/demo_corpus.py``,
    deterministic) and curate it (``curate.input.uri``), "" = use the DAG config's input;
    ``output_dir``: the comparison page, ``sweep.json`` and the audit diffs; the DAG workspace is
    ``<output_dir>/dag`` unless the overrides set ``workspace``; ``noise_factor``: a difference of
    means exceeds the seed spread when it is larger than this many standard errors;
    ``diff_samples``: gallery images per reason in each variant's audit diff page."""

    name: str = "sweep"
    dag: str = "configs/dag_demo.yaml"
    overrides: list[str] = field(default_factory=list)
    variants: list[VariantConfig] = field(default_factory=list)
    baseline: str = ""
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    seed_keys: list[str] = field(default_factory=lambda: ["pretrain.seed", "probe.seed"])
    corpus: str = ""
    output_dir: str = "runs/sweep"
    noise_factor: float = 2.0
    diff_samples: int = 6

    @property
    def baseline_name(self) -> str:
        return self.baseline or (self.variants[0].name if self.variants else "")

    def validate(self) -> None:
        names = [v.name for v in self.variants]
        if not names:
            raise ValueError("variants is empty: give at least the baseline, e.g. variants=[{name: baseline}]")
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"variants need distinct, non-empty names, got {names}")
        if self.baseline_name not in names:
            raise ValueError(f"baseline={self.baseline!r} is not one of the variants {names}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        if self.noise_factor <= 0:
            raise ValueError(f"noise_factor must be > 0, got {self.noise_factor}")
        if not Path(self.dag).is_file():
            raise ValueError(f"dag={self.dag!r}: no such DAG config file")

    def ordered(self) -> list[VariantConfig]:
        """The variants, the baseline first."""
        return sorted(self.variants, key=lambda v: v.name != self.baseline_name)


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One DAG invocation of the sweep: a variant at a seed."""

    variant: str
    seed: int
    dag: DagConfig


def dag_config(cfg: SweepConfig, variant: VariantConfig, seed: int) -> DagConfig:
    """The variant's DAG configuration at ``seed`` (a ``ValueError`` naming the variant)."""
    first = [f"workspace={Path(cfg.output_dir).resolve() / DAG_FOLDER}", f"name={cfg.name}-{variant.name}-s{seed}"]
    if cfg.corpus:
        first.append(f"curate.input.uri={Path(cfg.corpus).resolve()}")
    seeds = [f"{key}={seed}" for key in cfg.seed_keys]
    try:
        dag = load_config(DagConfig, cfg.dag, [*first, *cfg.overrides, *variant.overrides, *seeds])
        dag.validate()
    except ValueError as err:
        raise ValueError(f"variant {variant.name!r}: {err}") from None
    return dag


def plan_runs(cfg: SweepConfig) -> dict[str, list[PlannedRun]]:
    """Every variant's runs (baseline first), their budgets checked against the baseline's."""
    plans = {v.name: [PlannedRun(v.name, s, dag_config(cfg, v, s)) for s in cfg.seeds] for v in cfg.ordered()}
    reference = budget(plans[cfg.baseline_name][0].dag)
    for name, runs in plans.items():
        for run in runs:
            check_budget(reference, budget(run.dag), name)
    return plans


def _in_budget(key: str) -> bool:
    hit = any(key == k or (k.endswith(".") and key.startswith(k)) for k in BUDGET_KEYS)
    return hit and not any(key == k or (k.endswith(".") and key.startswith(k)) for k in NOT_BUDGET)


def budget(dag: DagConfig) -> dict[str, str]:
    """The settings every variant shares (``BUDGET_KEYS``), flat."""
    return {k: v for k, v in flatten(config_to_dict(dag)).items() if _in_budget(k)}


def check_budget(reference: dict[str, str], other: dict[str, str], variant: str) -> None:
    changed = sorted(k for k in reference.keys() | other.keys() if reference.get(k) != other.get(k))
    if changed:
        key = changed[0]
        raise ValueError(
            f"variant {variant!r} changes {key} ({reference.get(key)} in the baseline, {other.get(key)} here): "
            "every variant trains the same model on as many images and is probed alike; set it in the "
            "sweep's overrides instead"
        )


def changed_settings(base: DagConfig, other: DagConfig, ignore: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(key, baseline's value, this one's) of every DAG setting that differs, less ``ignore``d keys."""
    a, b = flatten(config_to_dict(base)), flatten(config_to_dict(other))
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k not in ignore)
    return [(k, a.get(k, "-"), b.get(k, "-")) for k in keys]


def describe_budget(dag: DagConfig) -> list[str]:
    """What every variant shares, in words."""
    p = dag.pretrain
    seen = p.steps * p.batch_size_per_worker * p.ray.num_workers
    return [
        f"every run: stages {', '.join(dag.stages)}; {p.model}, {p.steps} steps x {p.batch_size_per_worker} "
        f"images x {p.ray.num_workers} workers = {seen} images seen; probes {', '.join(dag.probe.tasks)}"
    ]
