"""Probing as one stage of the staged chain (``pipelines.staged``): the chain calls these
functions and never spells probing's config fields or result files itself.

- ``identity(cfg, upstream)``: the probe settings' digest + the probed checkpoint's digest.
- ``checkpoint_digest(path)``: that digest for a checkpoint file given as the chain's input.
- ``with_backbone(cfg, checkpoint, pretrain_run_id)``: the config probing that checkpoint.
- ``place(cfg, folder)``: the config writing into ``folder``.
- ``run(cfg)``: probe in this process; ``result(cfg)``: the metrics and MLflow runs, read back
  from ``results.json``.
- ``SCRIPT``: the ``pipelines/`` script that runs one stage config as a Ray job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from evaluation.config import ProbeConfig
from evaluation.io import sha256_file
from evaluation.run import run_probes
from infra.config import config_digest, config_to_dict

SCRIPT = "probe.py"
RESULTS_FILE = "results.json"  # written by evaluation.run


def _digest(*parts: Any) -> str:
    # The chain's identity recipe (the same in every stage facade): existing workspaces are
    # found by these strings, so the recipe must not change.
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def identity(cfg: ProbeConfig, upstream: str) -> str:
    """``upstream``: the probed checkpoint's sha256 ("" = a randomly initialised backbone,
    which the seed decides). Where outputs and records go, and which file or run the
    checkpoint is, are not part of it: its digest is."""
    d = config_to_dict(cfg)
    for key in ("output_dir", "tracking", "ray", "name"):
        d.pop(key, None)
    d["backbone"].pop("checkpoint", None)
    d["backbone"].pop("pretrain_run_id", None)
    return _digest("probe", config_digest(d), upstream or f"random-init:seed={cfg.seed}")


def checkpoint_digest(path: str) -> str:
    return sha256_file(path)


def with_backbone(cfg: ProbeConfig, checkpoint: str, pretrain_run_id: str) -> ProbeConfig:
    """``checkpoint``: an official-layout .safetensors ("" = random init); ``pretrain_run_id``:
    the MLflow run that produced it ("" = searched by digest)."""
    return dataclasses.replace(
        cfg, backbone=dataclasses.replace(cfg.backbone, checkpoint=checkpoint, pretrain_run_id=pretrain_run_id)
    )


def place(cfg: ProbeConfig, folder: Path) -> ProbeConfig:
    return dataclasses.replace(cfg, output_dir=str(folder))


def run(cfg: ProbeConfig) -> dict:
    """Probe in this process. Returns nothing beyond what ``result`` reads back."""
    run_probes(cfg)
    return {}


def result(cfg: ProbeConfig) -> dict:
    """Headline metrics per task (per-class IoUs and timings left out) and the suite's runs."""
    results = json.loads((Path(cfg.output_dir) / RESULTS_FILE).read_text())
    return {
        "metrics": {
            t: {k: v for k, v in m.items() if not k.startswith("iou.") and not k.endswith("seconds")}
            for t, m in results["metrics"].items()
        },
        "run_id": results["mlflow"]["parent_run_id"],
        "child_run_ids": results["mlflow"]["child_run_ids"],
    }
