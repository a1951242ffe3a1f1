"""Each stage's plan (identity, folder, placed config) from what flows down the chain, and
what a finished stage hands on. Stage specifics are the stage packages' facades; this module
only wires one stage's result into the next one's input."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from types import ModuleType
from typing import Any

import curation.stage
import evaluation.finetune.stage
import evaluation.stage
import training.stage
from curation.output import resolve_dataset
from pipelines.staged.config import DagInputs

FACADES: dict[str, ModuleType] = {
    "curate": curation.stage,
    "pretrain": training.stage,
    "finetune": evaluation.finetune.stage,
    "probe": evaluation.stage,
}


@dataclasses.dataclass
class Handoff:
    """What flows down the chain: the DAG's inputs at first, then each finished stage's result.
    ``lineage``: what the upstream stages produced, tagged on every later run."""

    dataset: str  # pretraining's input: a dataset version id, name or folder
    checkpoint: str  # fine-tuning's and probing's input: a .safetensors path ("" = random init)
    pretrain_run_id: str
    dataset_id: str = ""  # known once curation ran (else resolved from ``dataset``)
    checkpoint_digest: str = ""  # known once pretraining ran (else hashed from ``checkpoint``)
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
    def facade(self) -> ModuleType:
        return FACADES[self.stage]


def with_store(cfg: Any, uri: str, experiment: str) -> Any:
    """A stage config whose runs go to the DAG's store and experiment (a child run must live
    in its parent's experiment)."""
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, uri=uri, experiment=experiment))


def _plan_curate(cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    identity = curation.stage.identity(cfg, "")
    folder = ws / "curate" / identity
    return StagePlan("curate", identity, folder, curation.stage.place(cfg, folder))


def _plan_pretrain(cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    dataset_id = handoff.dataset_id or resolve_dataset(handoff.dataset, uri).id
    identity = training.stage.identity(cfg, dataset_id)
    folder = ws / "pretrain" / identity
    cfg = training.stage.with_dataset(cfg, handoff.dataset, uri)
    return StagePlan("pretrain", identity, folder, training.stage.place(cfg, folder))


def _checkpoint_digest(handoff: Handoff) -> str:
    if handoff.checkpoint and not handoff.checkpoint_digest:
        return evaluation.stage.checkpoint_digest(handoff.checkpoint)
    return handoff.checkpoint_digest


def _plan_finetune(cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    """Fine-tunes the checkpoint the probes get (the pretraining export): the probes measure
    the frozen backbone, the fine-tune the same backbone trained end to end."""
    identity = evaluation.finetune.stage.identity(cfg, _checkpoint_digest(handoff))
    folder = ws / "finetune" / identity
    cfg = evaluation.finetune.stage.with_backbone(cfg, handoff.checkpoint, handoff.pretrain_run_id)
    return StagePlan("finetune", identity, folder, evaluation.finetune.stage.place(cfg, folder))


def _plan_probe(cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    digest = _checkpoint_digest(handoff)
    identity = evaluation.stage.identity(cfg, digest)
    folder = ws / "probe" / identity
    cfg = evaluation.stage.with_backbone(cfg, handoff.checkpoint, handoff.pretrain_run_id)
    return StagePlan("probe", identity, folder, evaluation.stage.place(cfg, folder))


PLANNERS: dict[str, Callable[[Any, Path, Handoff, str], StagePlan]] = {
    "curate": _plan_curate,
    "pretrain": _plan_pretrain,
    "finetune": _plan_finetune,
    "probe": _plan_probe,
}


def plan(stage: str, cfg: Any, ws: Path, handoff: Handoff, uri: str) -> StagePlan:
    return PLANNERS[stage](cfg, ws, handoff, uri)


def hand_on(handoff: Handoff, stage: str, result: dict, run_id: str | None) -> None:
    """Feed a finished stage's result (ran or reused) to the stages after it."""
    if stage == "curate":
        handoff.dataset, handoff.dataset_id = result["dataset_uri"], result["dataset_id"]
        handoff.lineage.update(
            dataset_id=result["dataset_id"], dataset_uri=result["dataset_uri"], curation_run_id=run_id
        )
    elif stage == "pretrain":
        handoff.checkpoint, handoff.checkpoint_digest = result["student_weights"], result["checkpoint_digest"]
        handoff.pretrain_run_id = run_id or ""
        handoff.lineage.update(
            dataset_id=result["dataset_id"],
            checkpoint_digest=result["checkpoint_digest"],
            checkpoint_path=result["student_weights"],
            pretrain_run_id=run_id,
        )
    elif stage == "finetune":
        handoff.lineage.update(finetune_run_id=run_id)
