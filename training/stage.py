"""Pretraining as one stage of the chain (``infra.stage``, ``pipelines.chain``): the chain calls
``PretrainStage`` and never spells pretraining's config fields or run-folder files itself.

Its identity is the run-defining settings' digest + the id of the dataset version trained on;
its folder is Ray Train's experiment folder, so a re-run into it resumes from its newest
checkpoint; its result is read back from the run folder (``run.json`` and the export manifest).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from infra.stage import Stage, StageResult, stage_digest
from training.config import PretrainConfig, identity_digest


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainResult(StageResult):
    """A finished run's exported weights, their digest and the dataset version trained on."""

    student_weights: str
    teacher_weights: str | None
    checkpoint_digest: str
    dataset_id: str
    final_step: int
    loss_trend: str = ""  # known to the session that trained (from MLflow), not kept in the run folder
    shown = ("student_weights", "checkpoint_digest", "loss_trend")


class PretrainStage(Stage[PretrainConfig, PretrainResult]):
    name = "pretrain"
    script = "pretrain.py"
    Result = PretrainResult

    def identity(self, cfg: PretrainConfig, upstream: str) -> str:
        """``upstream``: the id of the dataset version trained on."""
        return stage_digest("pretrain", identity_digest(cfg), upstream)

    def with_dataset(self, cfg: PretrainConfig, dataset: str, tracking_uri: str) -> PretrainConfig:
        """``dataset``: a version id, name or curation output folder, looked up in ``tracking_uri``."""
        return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dataset=dataset, tracking_uri=tracking_uri))

    def place(self, cfg: PretrainConfig, folder: Path) -> PretrainConfig:
        # training.run pulls in torch and Ray Train: imported when a stage is placed, not when a
        # chain's config is only parsed.
        from training.run import absolutize

        return dataclasses.replace(absolutize(cfg), storage_path=str(folder.parent), run_name=folder.name)

    def run(self, cfg: PretrainConfig) -> PretrainResult:
        """Train (or resume) in this process to ``cfg.steps``; the result carries the loss trend."""
        from training.run import run_pretraining

        res = run_pretraining(cfg)
        if not res.completed:
            raise RuntimeError(f"pretraining stopped at step {res.final_step} of {cfg.steps}; re-run the DAG to resume")
        trend = res.loss_trend()
        if "loss" not in trend:
            return self.result(cfg)
        first, last, window = trend["loss"]
        text = f"{first:.4f} (mean of the first {window} steps) -> {last:.4f} (last {window})"
        return dataclasses.replace(self.result(cfg), loss_trend=text)

    def result(self, cfg: PretrainConfig) -> PretrainResult:
        from training.loop import EXPORT_DIR, EXPORT_MANIFEST
        from training.run import RUN_RECORD

        run_dir = Path(cfg.storage_path) / cfg.run_name
        record = json.loads((run_dir / RUN_RECORD).read_text())
        export = json.loads((run_dir / EXPORT_DIR / EXPORT_MANIFEST).read_text())
        if export.get("step") != cfg.steps:
            raise RuntimeError(
                f"pretraining run {cfg.run_name} has not reached step {cfg.steps} (export at {export.get('step')})"
            )
        return PretrainResult(
            student_weights=export["export_student"],
            teacher_weights=export.get("export_teacher"),
            checkpoint_digest=export["export_student_sha256"],
            run_id=record["mlflow_run_id"],
            dataset_id=record["dataset"]["id"],
            final_step=export["step"],
        )
