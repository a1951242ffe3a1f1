"""Fine-tuning as one stage of the chain (``infra.stage``, ``pipelines.chain``), between
pretraining and probing: the chain calls ``FinetuneStage`` and never spells fine-tuning's
config fields or result files itself.

Its identity is the fine-tune settings' digest + the checkpoint's digest + the data's digest
(each real data path's content/listing digest; the synthetic set is decided by the settings);
an unfinished run in its folder resumes; its result, metrics, exports and the MLflow run, is
read back from ``results.json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from evaluation.finetune.config import FinetuneConfig
from evaluation.io import path_digest
from infra.stage import Stage, StageResult, stage_digest

RESULTS_FILE = "results.json"  # written by evaluation.finetune.run


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinetuneResult(StageResult):
    """Headline metrics per task (per-class IoUs left out), the exports and the steps per task."""

    metrics: dict[str, dict[str, float]]
    exports: dict[str, Any]
    steps: int
    shown = ("metrics",)


def data_digest(cfg: FinetuneConfig) -> str:
    """What the tasks' data paths hold (real data); the synthetic set is in the settings."""
    parts = {}
    for task in cfg.tasks:
        s = cfg.task(task)
        parts[task] = [path_digest(p) for split in (s.train, s.val) for p in (split.images, split.labels, split.masks)]
    parts["backgrounds"] = path_digest(cfg.augment.backgrounds)
    return stage_digest(parts)


def _without_checkpoint(cfg: FinetuneConfig) -> FinetuneConfig:
    return dataclasses.replace(
        cfg,
        backbone=dataclasses.replace(cfg.backbone, checkpoint="", pretrain_run_id=""),
        augment=dataclasses.replace(cfg.augment, backgrounds=""),
    )


class FinetuneStage(Stage[FinetuneConfig, FinetuneResult]):
    name = "finetune"
    script = "finetune.py"
    Result = FinetuneResult

    def identity(self, cfg: FinetuneConfig, upstream: str) -> str:
        """``upstream``: the fine-tuned checkpoint's sha256 ("" = random init, decided by the seed)."""
        from evaluation.finetune.run import identity_digest

        return stage_digest(
            "finetune",
            identity_digest(_without_checkpoint(cfg)),
            upstream or f"random-init:seed={cfg.seed}",
            data_digest(cfg),
        )

    def with_backbone(self, cfg: FinetuneConfig, checkpoint: str, pretrain_run_id: str) -> FinetuneConfig:
        return dataclasses.replace(
            cfg, backbone=dataclasses.replace(cfg.backbone, checkpoint=checkpoint, pretrain_run_id=pretrain_run_id)
        )

    def place(self, cfg: FinetuneConfig, folder: Path) -> FinetuneConfig:
        from evaluation.finetune.run import absolutize

        return dataclasses.replace(absolutize(cfg), output_dir=str(folder))

    def run(self, cfg: FinetuneConfig) -> FinetuneResult:
        from evaluation.finetune.run import run_finetune

        res = run_finetune(cfg)
        if not res.completed:
            raise RuntimeError(f"fine-tuning stopped before step {cfg.steps}; re-run the DAG to resume")
        return self.result(cfg)

    def result(self, cfg: FinetuneConfig) -> FinetuneResult:
        results = json.loads((Path(cfg.output_dir) / RESULTS_FILE).read_text())
        if not results["completed"]:
            raise RuntimeError(f"fine-tuning in {cfg.output_dir} has not finished")
        return FinetuneResult(
            metrics={
                t: {k: v for k, v in m.items() if not k.startswith("iou.")} for t, m in results["metrics"].items()
            },
            # the input size each export was fine-tuned at (its file does not record it): for its users
            exports={t: {**e, "input_hw": list(cfg.task(t).image_size)} for t, e in results["exports"].items()},
            run_id=results["mlflow_run_id"],
            steps=cfg.steps,
        )
