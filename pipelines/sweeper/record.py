"""The MLflow record of a sweep: a parent run, one child run per variant, and under each variant
the DAG invocations of its seeds (``run_dag``'s parent runs, nested by ``mlflow.parentRunId``),
whose stage runs are theirs. A variant's run holds its overrides, its dataset's size and each
probe metric's mean, spread and difference to the baseline; the parent holds the page."""

from __future__ import annotations

import json
from pathlib import Path

from infra.tracking import finite_metrics, get_experiment_id
from pipelines.sweeper.compare import VariantSummary

PARENT_TAG = "mlflow.parentRunId"


class SweepRecord:
    def __init__(self, uri: str, experiment: str, name: str, config_yaml: str) -> None:
        from mlflow import MlflowClient

        self.uri, self.client = uri, MlflowClient(uri)
        self.experiment_id = get_experiment_id(experiment, uri)
        tags = {"humanvision.stage": "sweep", "sweep.name": name}
        self.run_id = self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id
        self.client.log_text(self.run_id, config_yaml, "sweep.yaml")
        self.open_variants: list[str] = []  # variant runs not yet closed (ended by ``finish`` if left)

    def variant(self, name: str, overrides: list[str], baseline: bool) -> str:
        """A child run for the variant (open until ``close_variant``); its DAG runs nest under it."""
        tags = {PARENT_TAG: self.run_id, "humanvision.stage": "sweep-variant", "sweep.variant": name}
        tags["sweep.baseline"] = str(baseline).lower()
        run_id = self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id
        self.client.log_text(run_id, "\n".join(overrides) + "\n", "overrides.txt")
        self.open_variants.append(run_id)
        return run_id

    def close_variant(self, v: VariantSummary) -> None:
        metrics = {f"{k}.mean": s.mean for k, s in v.stats.items()}
        metrics |= {f"{k}.spread": s.spread for k, s in v.stats.items() if s.spread is not None}
        metrics |= {f"{k}.delta": d.delta for k, d in v.versus.items()}
        data = v.dataset
        if data is not None and data.kept is not None:
            metrics["dataset.kept"] = data.kept
        metrics |= {"seeds.finished": len(v.finished), "seeds.total": len(v.seeds)}
        for key, value in finite_metrics(metrics).items():
            self.client.log_metric(v.run_id, key, value)
        for key, d in v.versus.items():
            self.client.set_tag(v.run_id, f"verdict.{key}", d.verdict)
        self.client.set_tag(v.run_id, "sweep.status", v.status)
        self.client.set_terminated(v.run_id, status="FINISHED" if v.status == "finished" else "FAILED")
        self.open_variants.remove(v.run_id)

    def finish(self, files: list[Path], summary: dict, status: str) -> None:
        """The parent run ended with ``status``; a variant run still open (the sweep was stopped or
        failed before comparing) ends as KILLED, tagged ``sweep.status=interrupted``."""
        for run_id in self.open_variants:
            self.client.set_tag(run_id, "sweep.status", "interrupted")
            self.client.set_terminated(run_id, status="KILLED")
        self.open_variants.clear()
        for f in files:
            self.client.log_artifact(self.run_id, str(f))
        self.client.set_tag(self.run_id, "sweep.variants", json.dumps(summary, sort_keys=True))
        self.client.set_terminated(self.run_id, status=status)
