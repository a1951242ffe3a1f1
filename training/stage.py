"""Pretraining and distillation as stages of the chain (``infra.stage``, ``pipelines.chain``): the
chain calls ``PretrainStage`` / ``DistillStage`` and never spells their config fields or run-folder
files itself.

A stage's identity is the run-defining settings' digest + the id of the dataset version trained
on (+ the sha256 of the weight files it reads: ``init``, a distillation's teacher; their content,
never their path); its folder is Ray Train's experiment folder, so a re-run into it resumes from
its newest checkpoint; its result is read back from the run folder (``run.json`` and the export
manifest).
"""

from __future__ import annotations

import abc
import dataclasses
import json
from pathlib import Path

from infra.stage import Stage, StageResult, stage_digest
from training.config import PretrainConfig, TrainConfig, identity_digest
from training.distill_config import DistillConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainResult(StageResult):
    """A finished run's exported weights, their digest and the dataset version trained on."""

    student_weights: str
    teacher_weights: str | None
    checkpoint_digest: str
    dataset_id: str
    final_step: int
    loss_trend: str = ""  # known to the session that trained (from MLflow), not kept in the run folder
    weights: dict[str, str] = dataclasses.field(default_factory=dict)  # files it started from: setting -> sha256
    shown = ("student_weights", "checkpoint_digest", "loss_trend")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillResult(StageResult):
    """A finished distillation: the student's export (official layout), its digest, the dataset
    version and the weight files read (``teacher.checkpoint`` among them) by sha256."""

    student_weights: str
    student_model: str
    checkpoint_digest: str
    dataset_id: str
    final_step: int
    loss_trend: str = ""
    weights: dict[str, str] = dataclasses.field(default_factory=dict)
    shown = ("student_weights", "student_model", "checkpoint_digest", "loss_trend")


def weights_part(cfg: TrainConfig) -> tuple[dict[str, str], ...]:
    """The weight files' digests as a part of a stage identity: none when the run reads none (so
    the identities of runs without them are what they always were)."""
    if not cfg.weight_files():
        return ()
    from training.init import weight_digests  # torch: only when there is a file to read

    return (weight_digests(cfg),)


class TrainingStage(Stage):
    """What pretraining and distillation share as stages: identity, placement, an in-process run
    and the result read back from the run folder; subclasses say how the result looks."""

    def identity(self, cfg: TrainConfig, upstream: str) -> str:
        """``upstream``: the id of the dataset version trained on."""
        return stage_digest(self.name, identity_digest(cfg), upstream, *weights_part(cfg))

    def with_dataset(self, cfg: TrainConfig, dataset: str, tracking_uri: str) -> TrainConfig:
        """``dataset``: a version id, name or curation output folder, looked up in ``tracking_uri``."""
        return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dataset=dataset, tracking_uri=tracking_uri))

    def place(self, cfg: TrainConfig, folder: Path) -> TrainConfig:
        # training.run pulls in torch and Ray Train: imported when a stage is placed, not when a
        # chain's config is only parsed.
        from training.run import absolutize

        return dataclasses.replace(absolutize(cfg), storage_path=str(folder.parent), run_name=folder.name)

    def run(self, cfg: TrainConfig) -> StageResult:
        """Train (or resume) in this process to ``cfg.steps``; the result carries the loss trend."""
        from training.run import run_training

        res = run_training(cfg)
        if not res.completed:
            raise RuntimeError(f"{self.name} stopped at step {res.final_step} of {cfg.steps}; re-run the DAG to resume")
        trend = res.loss_trend()
        if "loss" not in trend:
            return self.result(cfg)
        first, last, window = trend["loss"]
        text = f"{first:.4f} (mean of the first {window} steps) -> {last:.4f} (last {window})"
        return dataclasses.replace(self.result(cfg), loss_trend=text)

    def result(self, cfg: TrainConfig) -> StageResult:
        from training.loop import EXPORT_DIR, EXPORT_MANIFEST
        from training.run import RUN_RECORD

        run_dir = Path(cfg.storage_path) / cfg.run_name
        record = json.loads((run_dir / RUN_RECORD).read_text())
        export = json.loads((run_dir / EXPORT_DIR / EXPORT_MANIFEST).read_text())
        if export.get("step") != cfg.steps:
            raise RuntimeError(
                f"{self.name} run {cfg.run_name} has not reached step {cfg.steps} (export at {export.get('step')})"
            )
        return self.read_result(cfg, record, export)

    @abc.abstractmethod
    def read_result(self, cfg: TrainConfig, record: dict, export: dict) -> StageResult:
        """The stage's result from the run record and the export manifest."""


class PretrainStage(TrainingStage, Stage[PretrainConfig, PretrainResult]):
    name = "pretrain"
    script = "pretrain.py"
    Result = PretrainResult

    def read_result(self, cfg: PretrainConfig, record: dict, export: dict) -> PretrainResult:
        return PretrainResult(
            student_weights=export["export_student"],
            teacher_weights=export.get("export_teacher"),
            checkpoint_digest=export["export_student_sha256"],
            run_id=record["mlflow_run_id"],
            dataset_id=record["dataset"]["id"],
            final_step=export["step"],
            weights=dict(record.get("weights", {})),
        )


class DistillStage(TrainingStage, Stage[DistillConfig, DistillResult]):
    """Distillation after pretraining: by default its teacher is the checkpoint the chain hands on
    (the pretraining's student export), unless ``teacher.checkpoint`` names a file."""

    name = "distill"
    script = "distill.py"
    Result = DistillResult

    def with_teacher(self, cfg: DistillConfig, checkpoint: str) -> DistillConfig:
        """``cfg`` with ``checkpoint`` as its teacher, unless it names one itself."""
        if cfg.teacher.checkpoint or not checkpoint:
            return cfg
        return dataclasses.replace(cfg, teacher=dataclasses.replace(cfg.teacher, checkpoint=checkpoint))

    def read_result(self, cfg: DistillConfig, record: dict, export: dict) -> DistillResult:
        return DistillResult(
            student_weights=export["export_student"],
            student_model=cfg.student.model,
            checkpoint_digest=export["export_student_sha256"],
            run_id=record["mlflow_run_id"],
            dataset_id=record["dataset"]["id"],
            final_step=export["step"],
            weights=dict(record.get("weights", {})),
        )
