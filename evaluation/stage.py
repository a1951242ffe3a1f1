"""Probing as one stage of the chain (``infra.stage``, ``pipelines.chain``): the chain calls
``ProbeStage`` and never spells probing's config fields or result files itself.

Its identity is the probe settings' digest + the probed checkpoint's digest (``checkpoint_digest``
for a checkpoint file given as the chain's input); its result, the metrics and MLflow runs, is
read back from ``results.json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from evaluation.config import ProbeConfig
from evaluation.run import run_probes
from infra.config import config_digest, config_to_dict
from infra.digests import sha256_file
from infra.stage import Stage, StageResult, stage_digest

RESULTS_FILE = "results.json"  # written by evaluation.run


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeResult(StageResult):
    """Headline metrics per task (per-class IoUs and timings left out) and the suite's runs
    (``run_id``: the suite's parent run)."""

    metrics: dict[str, dict[str, float]]
    child_run_ids: dict[str, str]
    shown = ("metrics",)


def checkpoint_digest(path: str) -> str:
    """The digest a checkpoint file enters the probe and fine-tune identities by."""
    return sha256_file(path)


class ProbeStage(Stage[ProbeConfig, ProbeResult]):
    name = "probe"
    script = "probe.py"
    Result = ProbeResult

    def identity(self, cfg: ProbeConfig, upstream: str) -> str:
        """``upstream``: the probed checkpoint's sha256 ("" = a randomly initialised backbone,
        which the seed decides). Where outputs and records go, and which file or run the
        checkpoint is, are not part of it: its digest is."""
        d = config_to_dict(cfg)
        for key in ("output_dir", "tracking", "ray", "name"):
            d.pop(key, None)
        d["backbone"].pop("checkpoint", None)
        d["backbone"].pop("pretrain_run_id", None)
        return stage_digest("probe", config_digest(d), upstream or f"random-init:seed={cfg.seed}")

    def with_backbone(self, cfg: ProbeConfig, checkpoint: str, pretrain_run_id: str) -> ProbeConfig:
        """``checkpoint``: an official-layout .safetensors ("" = random init); ``pretrain_run_id``:
        the MLflow run that produced it ("" = searched by digest)."""
        return dataclasses.replace(
            cfg, backbone=dataclasses.replace(cfg.backbone, checkpoint=checkpoint, pretrain_run_id=pretrain_run_id)
        )

    def place(self, cfg: ProbeConfig, folder: Path) -> ProbeConfig:
        return dataclasses.replace(cfg, output_dir=str(folder))

    def run(self, cfg: ProbeConfig) -> ProbeResult:
        """Probe in this process."""
        run_probes(cfg)
        return self.result(cfg)

    def result(self, cfg: ProbeConfig) -> ProbeResult:
        results = json.loads((Path(cfg.output_dir) / RESULTS_FILE).read_text())
        return ProbeResult(
            metrics={
                t: {k: v for k, v in m.items() if not k.startswith("iou.") and not k.endswith("seconds")}
                for t, m in results["metrics"].items()
            },
            run_id=results["mlflow"]["parent_run_id"],
            child_run_ids=results["mlflow"]["child_run_ids"],
        )
