"""Fine-tuning as one stage of the staged chain (``pipelines.staged``), between pretraining and
probing: the chain calls these functions and never spells fine-tuning's config fields or
result files itself.

- ``identity(cfg, upstream)``: the fine-tune settings' digest + the checkpoint's digest + the
  data's digest (each real data path's content/listing digest; the synthetic set is decided by
  the settings).
- ``with_backbone(cfg, checkpoint, pretrain_run_id)``: the config fine-tuning that checkpoint.
- ``place(cfg, folder)``: the config writing into ``folder``.
- ``run(cfg)``: fine-tune in this process (an unfinished run in ``folder`` resumes);
  ``result(cfg)``: metrics, exports and the MLflow run, read back from ``results.json``.
- ``SCRIPT``: the ``pipelines/`` script that runs one stage config as a Ray job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from evaluation.finetune.config import FinetuneConfig
from evaluation.io import path_digest

SCRIPT = "finetune.py"
RESULTS_FILE = "results.json"  # written by evaluation.finetune.run


def _digest(*parts: Any) -> str:
    # The chain's identity recipe (the same in every stage facade): existing workspaces are
    # found by these strings, so the recipe must not change.
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def data_digest(cfg: FinetuneConfig) -> str:
    """What the tasks' data paths hold (real data); the synthetic set is in the settings."""
    parts = {}
    for task in cfg.tasks:
        s = cfg.task(task)
        parts[task] = [path_digest(p) for split in (s.train, s.val) for p in (split.images, split.labels, split.masks)]
    parts["backgrounds"] = path_digest(cfg.augment.backgrounds)
    return _digest(parts)


def identity(cfg: FinetuneConfig, upstream: str) -> str:
    """``upstream``: the fine-tuned checkpoint's sha256 ("" = random init, decided by the seed)."""
    from evaluation.finetune.run import identity_digest

    return _digest(
        "finetune",
        identity_digest(_without_checkpoint(cfg)),
        upstream or f"random-init:seed={cfg.seed}",
        data_digest(cfg),
    )


def _without_checkpoint(cfg: FinetuneConfig) -> FinetuneConfig:
    return dataclasses.replace(
        cfg,
        backbone=dataclasses.replace(cfg.backbone, checkpoint="", pretrain_run_id=""),
        augment=dataclasses.replace(cfg.augment, backgrounds=""),
    )


def with_backbone(cfg: FinetuneConfig, checkpoint: str, pretrain_run_id: str) -> FinetuneConfig:
    return dataclasses.replace(
        cfg, backbone=dataclasses.replace(cfg.backbone, checkpoint=checkpoint, pretrain_run_id=pretrain_run_id)
    )


def place(cfg: FinetuneConfig, folder: Path) -> FinetuneConfig:
    """Local paths absolute: a Ray job runs in a copy of the repo, not in this folder."""
    from evaluation.finetune.run import absolutize

    return dataclasses.replace(absolutize(cfg), output_dir=str(folder))


def run(cfg: FinetuneConfig) -> dict:
    from evaluation.finetune.run import run_finetune

    res = run_finetune(cfg)
    if not res.completed:
        raise RuntimeError(f"fine-tuning stopped before step {cfg.steps}; re-run the DAG to resume")
    return {}


def result(cfg: FinetuneConfig) -> dict:
    """Headline metrics per task (per-class IoUs left out), the exports and the MLflow run."""
    results = json.loads((Path(cfg.output_dir) / RESULTS_FILE).read_text())
    if not results["completed"]:
        raise RuntimeError(f"fine-tuning in {cfg.output_dir} has not finished")
    return {
        "metrics": {t: {k: v for k, v in m.items() if not k.startswith("iou.")} for t, m in results["metrics"].items()},
        "exports": results["exports"],
        "run_id": results["mlflow_run_id"],
        "steps": cfg.steps,
    }
