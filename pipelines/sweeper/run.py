"""``run_sweep(cfg)``: every variant at every seed as a DAG invocation, then the comparison.

The variants share one DAG workspace, so a stage whose identity an earlier variant or seed (or
an earlier sweep) already finished is reused, not run: a variant that changes only the
sampling policy reuses the baseline's curation, the seeds of a variant share its curation, and
a second sweep reuses everything. An invocation that fails is recorded as failed with its error,
and the sweep goes on with the others.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from infra.config import dump_config
from pipelines.chain import DagResult, run_dag
from pipelines.chain.run import tracking_uri
from pipelines.sweeper.compare import (
    SeedOutcome,
    VariantSummary,
    compare_datasets,
    compare_metrics,
)
from pipelines.sweeper.config import PlannedRun, SweepConfig, changed_settings, describe_budget, plan_runs
from pipelines.sweeper.page import PAGE_FILE, render_page
from pipelines.sweeper.record import PARENT_TAG, SweepRecord

log = logging.getLogger("sweep")
SUMMARY_FILE = "sweep.json"


@dataclasses.dataclass
class SweepResult:
    output_dir: str
    page: str
    tracking_uri: str
    run_id: str
    variants: list[VariantSummary]
    seconds: float

    def summary(self) -> str:
        lines = [f"sweep: {len(self.variants)} variants in {self.seconds:.0f} s; page {self.page}"]
        lines.append(f"mlflow: {self.tracking_uri} (sweep run {self.run_id})")
        for v in self.variants:
            reused = sum(st == "reused" for s in v.seeds for st in s.stages.values())
            total = sum(len(s.stages) for s in v.seeds)
            data = v.dataset
            kept = f"{data.kept} kept" if data is not None else "no dataset"
            lines.append(f"  {v.name:24s} {v.status:14s} {kept:>12s}   stages reused {reused}/{total}")
            for key, d in v.versus.items():
                lines.append(f"      {key}: {d.delta:+.4f} vs baseline ({d.verdict})")
        return "\n".join(lines)


def outcome_of(seed: int, result: DagResult, seconds: float) -> SeedOutcome:
    """A finished invocation's dataset, metrics and stages."""
    by_stage = {o.stage: o for o in result.outcomes}
    curate, probe = by_stage.get("curate"), by_stage.get("probe")
    return SeedOutcome(
        seed=seed,
        status="finished",
        dataset_id=curate.result.dataset_id if curate else "",
        dataset_uri=curate.result.dataset_uri if curate else "",
        kept=curate.result.kept if curate else None,
        inputs=curate.result.inputs if curate else None,
        metrics=dict(probe.result.metrics) if probe else {},
        stages={o.stage: "reused" if o.reused else "ran" for o in result.outcomes},
        identities={o.stage: o.identity for o in result.outcomes},
        dag_run_id=result.parent_run_id,
        seconds=round(seconds, 1),
    )


def run_one(plan: PlannedRun, variant_run_id: str) -> SeedOutcome:
    """One DAG invocation, its parent run nested under the variant's; a failure becomes data."""
    started = time.time()
    log.info("variant %s, seed %d: running the DAG", plan.variant, plan.seed)
    try:
        result = run_dag(plan.dag, parent_tags={PARENT_TAG: variant_run_id, "sweep.seed": str(plan.seed)})
    except Exception as err:  # noqa: BLE001 - one variant's failure must not stop the others
        log.exception("variant %s, seed %d failed", plan.variant, plan.seed)
        return SeedOutcome(seed=plan.seed, status="failed", error=f"{type(err).__name__}: {err}"[:2000])
    return outcome_of(plan.seed, result, time.time() - started)


def _ignored(cfg: SweepConfig) -> tuple[str, ...]:
    """DAG settings that differ between variants without being what they vary."""
    return ("name", "workspace", *cfg.seed_keys)


def run_variants(cfg: SweepConfig, plans: dict[str, list[PlannedRun]], record: SweepRecord) -> list[VariantSummary]:
    base = plans[cfg.baseline_name][0].dag
    summaries = []
    for v in cfg.ordered():
        run_id = record.variant(v.name, v.overrides, v.name == cfg.baseline_name)
        seeds = [run_one(p, run_id) for p in plans[v.name]]
        settings = changed_settings(base, plans[v.name][0].dag, _ignored(cfg))
        summaries.append(VariantSummary(v.name, list(v.overrides), seeds, settings, run_id=run_id))
    return summaries


def run_sweep(cfg: SweepConfig) -> SweepResult:
    """Run (or reuse) every variant at every seed; write the page and ``sweep.json``; record MLflow."""
    started = time.time()
    cfg.validate()
    if cfg.corpus:
        from pipelines.demo_corpus import build_demo_corpus

        build_demo_corpus(Path(cfg.corpus).resolve())  # deterministic: a rebuild leaves stages reusable
    plans = plan_runs(cfg)
    out = Path(cfg.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = plans[cfg.baseline_name][0].dag
    uri = tracking_uri(base, Path(base.workspace))
    record = SweepRecord(uri, base.tracking.experiment, cfg.name, dump_config(cfg))
    variants: list[VariantSummary] = []
    files: list[Path] = []
    try:
        variants = run_variants(cfg, plans, record)
        compare_metrics(variants, cfg.noise_factor)
        compare_datasets(variants, out, cfg.diff_samples)
        for v in variants:
            record.close_variant(v)
        files = write_outputs(cfg, variants, out, describe_budget(base), (uri, record.run_id))
    finally:  # the sweep ran to its page (failed variants included), or it did not
        record.finish(files, {v.name: v.status for v in variants}, "FINISHED" if files else "FAILED")
    return SweepResult(str(out), str(out / PAGE_FILE), uri, record.run_id, variants, round(time.time() - started, 1))


def write_outputs(
    cfg: SweepConfig, variants: list[VariantSummary], out: Path, budget: list[str], run: tuple[str, str]
) -> list[Path]:
    """The comparison page and ``sweep.json`` (every variant's runs and comparisons); ``run``: the
    sweep's MLflow store and run id."""
    page = out / PAGE_FILE
    page.write_text(render_page(cfg, variants, budget, *run), encoding="utf-8")
    data = {"sweep": cfg.name, "baseline": cfg.baseline_name, "variants": [dataclasses.asdict(v) for v in variants]}
    summary = out / SUMMARY_FILE
    summary.write_text(json.dumps(data, indent=2, default=str))
    return [page, summary]
