"""The chain's configuration: which stages, where, how they are submitted, and each stage's
own config section (the same keys as that stage's YAML)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Literal

from curation.recipe import CurationConfig
from evaluation.annotate.config import AnnotateConfig
from evaluation.config import ProbeConfig
from evaluation.finetune.config import FinetuneConfig
from infra.tracking import TrackingConfig, tracking_section
from training.config import PretrainConfig
from training.distill_config import DistillConfig

STAGES = ("curate", "pretrain", "distill", "finetune", "probe", "annotate")
OPTIONAL = ("distill", "finetune", "annotate")  # a chain may leave them out: curate -> pretrain -> probe


def _in_order(stages: list[str]) -> bool:
    """A run of ``STAGES`` in order, from its first to its last stage, skipping optional ones only."""
    if not stages or any(s not in STAGES for s in stages):
        return False
    first, last = STAGES.index(stages[0]), STAGES.index(stages[-1])
    return list(stages) == [s for s in STAGES[first : last + 1] if s in stages or s not in OPTIONAL]


@dataclasses.dataclass(kw_only=True)
class DagInputs:
    """Inputs of a DAG that does not start with curation (a suffix of the chain)."""

    dataset: str = ""  # pretrain or distill first: a dataset version id, name or curation output folder
    # finetune / probe first: an official-layout .safetensors ("" = random init); distill first: its teacher
    checkpoint: str = ""
    pretrain_run_id: str = ""


@dataclasses.dataclass(kw_only=True)
class DagConfig:
    """``tracking``: the one MLflow store and experiment of the parent run and of every stage's
    run (children must share it); ``uri`` None: $MLFLOW_TRACKING_URI, else
    sqlite:///<workspace>/mlflow.db; ``run_name`` None: the parent run is named ``name``."""

    name: str = "dag"
    workspace: str = "runs/dag"
    stages: list[Literal["curate", "pretrain", "distill", "finetune", "probe", "annotate"]] = field(
        default_factory=lambda: [s for s in STAGES if s not in OPTIONAL]
    )
    submit: Literal["local", "ray_job"] = "local"
    job_address: str | None = None  # ray_job: the dashboard URL, e.g. http://127.0.0.1:8265
    job_timeout_s: int = 6 * 3600
    inputs: DagInputs = field(default_factory=DagInputs)
    curate: CurationConfig = field(default_factory=CurationConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    annotate: AnnotateConfig = field(default_factory=AnnotateConfig)
    tracking: TrackingConfig = tracking_section("dag")

    def validate(self) -> None:
        order = list(self.stages)
        if not _in_order(order):
            raise ValueError(
                f"stages must be a contiguous run of {list(STAGES)} in order ({', '.join(OPTIONAL)} may be "
                f"left out), got {self.stages}"
            )
        needs_dataset = order[0] in ("pretrain", "distill") or ("annotate" in order and "curate" not in order)
        if needs_dataset and not self.inputs.dataset:
            first = order[0] if order[0] in ("pretrain", "distill") else "annotate"
            raise ValueError(
                f"a DAG with {first} but no curate needs inputs.dataset (a dataset version id, name or folder)"
            )
        if order[0] == "distill" and not (self.inputs.checkpoint or self.distill.teacher.checkpoint):
            raise ValueError(
                "a DAG that starts with distill needs its teacher: inputs.checkpoint or distill.teacher.checkpoint"
            )
        for stage in ("finetune", "probe"):
            name = getattr(self, stage).backbone.name
            if "distill" in order and stage in order and name != self.distill.student.model:
                raise ValueError(
                    f"{stage}.backbone.name={name}: after distill the chain hands on the distilled "
                    f"{self.distill.student.model}; set {stage}.backbone.name={self.distill.student.model}"
                )
        if self.submit == "ray_job" and not self.job_address:
            raise ValueError("submit=ray_job needs job_address (the Ray dashboard URL, e.g. http://127.0.0.1:8265)")
        if not self.tracking.enabled:
            raise ValueError(
                "tracking.enabled=false: the DAG records its stages' parent/child lineage in MLflow "
                "and cannot run without it (tracking.uri chooses the store)"
            )
