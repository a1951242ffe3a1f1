"""The curation run's MLflow record: config, counts, stats.json and the dataset (by digest and URI)."""
from __future__ import annotations

import json
import os

import pyarrow as pa

from curation.config import CurationConfig
from curation.versions import code_version
from infra import tracking


def log_curation_run(cfg: CurationConfig, output_uri: str, stats: dict, manifest: pa.Table, dataset_id: str,
                     dataset_name: str, shards: list[str], job_digest: str) -> str:
    """Log (or find, when an earlier attempt already logged this output) the run; returns its id."""
    import mlflow

    uri = tracking.resolve_tracking_uri(cfg.tracking.uri, cfg.output_dir)
    exp_id = tracking.get_experiment_id(cfg.tracking.experiment, uri)
    tags = {"humanvision.stage": "curation", "curation.output": output_uri, "curation.job_digest": job_digest}
    existing = tracking.find_run(exp_id, tags)
    if existing:
        return existing
    name = cfg.tracking.run_name or os.path.basename(output_uri.rstrip("/"))
    with mlflow.start_run(experiment_id=exp_id, run_name=name, tags=tags) as run:
        tracking.log_config(cfg)
        mlflow.log_metrics({"inputs": stats["inputs"], "kept": stats["kept"], "dropped": stats["dropped"],
                            "errors": stats["errors"], "shards": stats["shards"],
                            "samples_in_shards": stats["samples_in_shards"]})
        mlflow.log_metrics({f"dropped.{r}": c for r, c in stats["dropped_by_reason"].items()})
        mlflow.log_metrics({f"errors.{r}": c for r, c in stats["errors_by_reason"].items()})
        for step in stats["funnel"]:
            mlflow.log_metric(f"funnel.{step['stage']}.out", step["out"])
        for stage in stats["stages"]:
            mlflow.set_tag(f"filter.{stage['name']}.applied", str(stage["applied"]).lower())
        mlflow.log_dict(stats, "stats.json")
        mlflow.log_text("\n".join(shards) + "\n", "shards.txt")
        profile = {"inputs": stats["inputs"], "kept": stats["kept"], "dropped": stats["dropped"],
                   "errors": stats["errors"], "shards": stats["shards"]}
        dataset = tracking.make_dataset(dataset_name, dataset_id, output_uri,
                                        schema=tracking.arrow_to_mlflow_schema(manifest.schema), profile=profile)
        mlflow.log_input(dataset, context="curation_output")
        mlflow.set_tags({"dataset.id": dataset_id, "dataset.name": dataset_name, "dataset.uri": output_uri,
                         "dataset.shards": json.dumps(len(shards)), "curation.code_version": code_version()})
        return run.info.run_id
