"""Pretraining as one stage of the staged chain (``pipelines.staged``): the chain calls these
functions and never spells pretraining's config fields or run-folder files itself.

- ``identity(cfg, upstream)``: the run-defining settings' digest + the dataset version id.
- ``with_dataset(cfg, dataset, tracking_uri)``: the config reading that dataset version.
- ``place(cfg, folder)``: the config whose run folder is ``folder`` (Ray Train's experiment
  folder, so a re-run into it resumes from its newest checkpoint).
- ``run(cfg)``: train in this process; ``result(cfg)``: what probing needs, read back from
  the run folder (``run.json`` and the export manifest).
- ``SCRIPT``: the ``pipelines/`` script that runs one stage config as a Ray job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from training.config import PretrainConfig, identity_digest

SCRIPT = "pretrain.py"


def _digest(*parts: Any) -> str:
    # The chain's identity recipe (the same in every stage facade): existing workspaces are
    # found by these strings, so the recipe must not change.
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def identity(cfg: PretrainConfig, upstream: str) -> str:
    """``upstream``: the id of the dataset version trained on."""
    return _digest("pretrain", identity_digest(cfg), upstream)


def with_dataset(cfg: PretrainConfig, dataset: str, tracking_uri: str) -> PretrainConfig:
    """``dataset``: a version id, name or curation output folder, looked up in ``tracking_uri``."""
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dataset=dataset, tracking_uri=tracking_uri))


def place(cfg: PretrainConfig, folder: Path) -> PretrainConfig:
    """Local paths absolute: a Ray job runs in a copy of the repo, not in this folder."""
    # training.run pulls in torch and Ray Train: imported when a stage is placed, not when a
    # chain's config is only parsed.
    from training.run import absolutize

    return dataclasses.replace(absolutize(cfg), storage_path=str(folder.parent), run_name=folder.name)


def run(cfg: PretrainConfig) -> dict:
    """Train (or resume) in this process to ``cfg.steps``. Returns the loss trend, which the
    session has from its MLflow history and the run folder does not hold."""
    from training.run import run_pretraining

    res = run_pretraining(cfg)
    if not res.completed:
        raise RuntimeError(f"pretraining stopped at step {res.final_step} of {cfg.steps}; re-run the DAG to resume")
    trend = res.loss_trend()
    if "loss" not in trend:
        return {}
    first, last, window = trend["loss"]
    return {"loss_trend": f"{first:.4f} (mean of the first {window} steps) -> {last:.4f} (last {window})"}


def result(cfg: PretrainConfig) -> dict:
    """A finished run's exported weights, their digest, its MLflow run and dataset version."""
    from training.loop import EXPORT_DIR, EXPORT_MANIFEST
    from training.run import RUN_RECORD

    run_dir = Path(cfg.storage_path) / cfg.run_name
    record = json.loads((run_dir / RUN_RECORD).read_text())
    export = json.loads((run_dir / EXPORT_DIR / EXPORT_MANIFEST).read_text())
    if export.get("step") != cfg.steps:
        raise RuntimeError(
            f"pretraining run {cfg.run_name} has not reached step {cfg.steps} (export at {export.get('step')})"
        )
    return {
        "student_weights": export["export_student"],
        "teacher_weights": export.get("export_teacher"),
        "checkpoint_digest": export["export_student_sha256"],
        "run_id": record["mlflow_run_id"],
        "dataset_id": record["dataset"]["id"],
        "final_step": export["step"],
    }
