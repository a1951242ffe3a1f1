"""Each stage's plan (identity, folder, placed config) from what flows down the chain, and
what a finished stage hands on. Stage specifics are the stage packages' facades
(``infra.stage.Stage``); this module only wires one stage's result into the next one's input."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any

from curation.output import resolve_dataset
from curation.stage import CurateResult, CurateStage
from evaluation.annotate.stage import AnnotateResult, AnnotateStage
from evaluation.finetune.stage import FinetuneResult, FinetuneStage
from evaluation.stage import ProbeStage, checkpoint_digest
from infra.stage import Stage, StageResult
from pipelines.chain.config import DagInputs
from pipelines.curate import provide_model_code
from training.stage import DistillResult, DistillStage, PretrainResult, PretrainStage

CURATE, PRETRAIN, FINETUNE, PROBE = CurateStage(), PretrainStage(), FinetuneStage(), ProbeStage()
provide_model_code()  # curation's backbone embedding runs models' backbones (curation does not import models)
DISTILL, ANNOTATE = DistillStage(), AnnotateStage()
FACADES: dict[str, Stage] = {s.name: s for s in (CURATE, PRETRAIN, DISTILL, FINETUNE, PROBE, ANNOTATE)}


@dataclasses.dataclass
class Handoff:
    """What flows down the chain: the DAG's inputs at first, then each finished stage's result.
    ``lineage``: what the upstream stages produced, tagged on every later run."""

    dataset: str  # pretraining's and distillation's input: a dataset version id, name or folder
    checkpoint: str  # distillation's teacher, fine-tuning's and probing's input: a .safetensors ("" = random init)
    pretrain_run_id: str
    dataset_id: str = ""  # known once curation ran (else resolved from ``dataset``)
    checkpoint_digest: str = ""  # known once pretraining ran (else hashed from ``checkpoint``)
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)  # the fine-tune's, task -> export
    lineage: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_inputs(cls, inputs: DagInputs) -> Handoff:
        return cls(dataset=inputs.dataset, checkpoint=inputs.checkpoint, pretrain_run_id=inputs.pretrain_run_id)


@dataclasses.dataclass
class StagePlan:
    stage: str
    identity: str
    folder: Path  # <workspace>/<stage>/<identity>
    cfg: Any  # the stage's config, placed in ``folder``

    @property
    def facade(self) -> Stage:
        return FACADES[self.stage]


def with_store(cfg: Any, uri: str, experiment: str) -> Any:
    """A stage config whose runs go to the DAG's store and experiment (a child run must live
    in its parent's experiment)."""
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, uri=uri, experiment=experiment))


def _plan_curate(cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    identity = CURATE.identity(cfg, "")
    folder = ws / CURATE.name / identity
    return StagePlan(CURATE.name, identity, folder, CURATE.place(cfg, folder))


def _plan_pretrain(cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    dataset_id = handoff.dataset_id or resolve_dataset(handoff.dataset, uri).id
    identity = PRETRAIN.identity(cfg, dataset_id)
    folder = ws / PRETRAIN.name / identity
    cfg = PRETRAIN.with_dataset(cfg, handoff.dataset, uri)
    return StagePlan(PRETRAIN.name, identity, folder, PRETRAIN.place(cfg, folder))


def _plan_distill(cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    """The curated version, distilled from the checkpoint handed on (the pretraining's student
    export) unless ``distill.teacher.checkpoint`` names a teacher; its digest enters the identity."""
    dataset_id = handoff.dataset_id or resolve_dataset(handoff.dataset, uri).id
    cfg = DISTILL.with_teacher(DISTILL.with_dataset(cfg, handoff.dataset, uri), handoff.checkpoint)
    identity = DISTILL.identity(cfg, dataset_id)
    folder = ws / DISTILL.name / identity
    return StagePlan(DISTILL.name, identity, folder, DISTILL.place(cfg, folder))


def _checkpoint_digest(handoff: Handoff) -> str:
    if handoff.checkpoint and not handoff.checkpoint_digest:
        return checkpoint_digest(handoff.checkpoint)
    return handoff.checkpoint_digest


def _plan_on_checkpoint(stage: FinetuneStage | ProbeStage, cfg: Any, ws: Path, handoff: Handoff) -> StagePlan:
    """Fine-tuning and probing take the same checkpoint (the pretraining export): the probes
    measure the frozen backbone, the fine-tune the same backbone trained end to end."""
    identity = stage.identity(cfg, _checkpoint_digest(handoff))
    folder = ws / stage.name / identity
    cfg = stage.with_backbone(cfg, handoff.checkpoint, handoff.pretrain_run_id)
    return StagePlan(stage.name, identity, folder, stage.place(cfg, folder))


def _plan_annotate(cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    """The curated version, labelled by the fine-tune's exports unless the config names checkpoints."""
    dataset_id = handoff.dataset_id or resolve_dataset(handoff.dataset, uri).id
    cfg = ANNOTATE.with_inputs(cfg, handoff.dataset, uri, handoff.exports)
    identity = ANNOTATE.identity(cfg, dataset_id)
    folder = ws / ANNOTATE.name / identity
    return StagePlan(ANNOTATE.name, identity, folder, ANNOTATE.place(cfg, folder))


PLANNERS: dict[str, Callable[[Any, Path, Handoff, str], StagePlan]] = {
    CURATE.name: _plan_curate,
    PRETRAIN.name: _plan_pretrain,
    DISTILL.name: _plan_distill,
    FINETUNE.name: lambda cfg, ws, handoff, uri: _plan_on_checkpoint(FINETUNE, cfg, ws, handoff),
    PROBE.name: lambda cfg, ws, handoff, uri: _plan_on_checkpoint(PROBE, cfg, ws, handoff),
    ANNOTATE.name: _plan_annotate,
}


def plan(stage: str, cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    return PLANNERS[stage](cfg, ws, handoff, uri)


def weight_lineage(weights: dict[str, str], prefix: str = "") -> dict[str, str]:
    """Lineage entries for the weight files a training stage read: ``init.backbone`` ->
    ``<prefix>init_backbone_sha256`` (tagged ``lineage.<that>`` on every later run)."""
    return {f"{prefix}{setting.replace('.', '_')}_sha256": digest for setting, digest in weights.items()}


def hand_on(handoff: Handoff, result: StageResult) -> None:
    """Feed a finished stage's result (ran or reused) to the stages after it."""
    if isinstance(result, CurateResult):
        handoff.dataset, handoff.dataset_id = result.dataset_uri, result.dataset_id
        handoff.lineage.update(
            dataset_id=result.dataset_id, dataset_uri=result.dataset_uri, curation_run_id=result.run_id
        )
    elif isinstance(result, PretrainResult):
        handoff.checkpoint, handoff.checkpoint_digest = result.student_weights, result.checkpoint_digest
        handoff.pretrain_run_id = result.run_id or ""
        handoff.lineage.update(
            dataset_id=result.dataset_id,
            checkpoint_digest=result.checkpoint_digest,
            checkpoint_path=result.student_weights,
            pretrain_run_id=result.run_id,
            **weight_lineage(result.weights),
        )
    elif isinstance(result, DistillResult):
        # the distilled student is what fine-tuning and probing take from here (set their
        # backbone.name to the student's model); its run is the one that produced the checkpoint
        handoff.lineage.update(
            distill_run_id=result.run_id,
            checkpoint_digest=result.checkpoint_digest,
            checkpoint_path=result.student_weights,
            **weight_lineage(result.weights, "distill_"),
        )
        handoff.checkpoint, handoff.checkpoint_digest = result.student_weights, result.checkpoint_digest
        handoff.pretrain_run_id = result.run_id or ""
    elif isinstance(result, FinetuneResult):
        handoff.exports = dict(result.exports)
        handoff.lineage.update(finetune_run_id=result.run_id)
    elif isinstance(result, AnnotateResult):
        handoff.lineage.update(annotation_version_id=result.version_id, annotate_run_id=result.run_id)
