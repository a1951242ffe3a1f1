"""The chain's configuration: which stages, where, how they are submitted, and each stage's
own config section (the same keys as that stage's YAML)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Literal

from curation.recipe import CurationConfig
from evaluation.config import ProbeConfig
from evaluation.finetune.config import FinetuneConfig
from infra.tracking import TrackingConfig, tracking_section
from training.config import PretrainConfig

STAGES = ("curate", "pretrain", "finetune", "probe")
OPTIONAL = ("finetune",)  # a chain may leave it out: curate -> pretrain -> probe


def _contiguous(stages: list[str], chain: tuple[str, ...]) -> bool:
    if not stages or any(s not in chain for s in stages):
        return False
    start = chain.index(stages[0])
    return list(chain[start : start + len(stages)]) == list(stages)


@dataclasses.dataclass(kw_only=True)
class DagInputs:
    """Inputs of a DAG that does not start with curation (a suffix of the chain)."""

    dataset: str = ""  # pretrain first: a dataset version id, name or curation output folder
    checkpoint: str = ""  # finetune / probe first: an official-layout .safetensors ("" = random init)
    pretrain_run_id: str = ""


@dataclasses.dataclass(kw_only=True)
class DagConfig:
    """``tracking``: the one MLflow store and experiment of the parent run and of every stage's
    run (children must share it); ``uri`` None: $MLFLOW_TRACKING_URI, else
    sqlite:///<workspace>/mlflow.db; ``run_name`` None: the parent run is named ``name``."""

    name: str = "dag"
    workspace: str = "runs/dag"
    stages: list[Literal["curate", "pretrain", "finetune", "probe"]] = field(
        default_factory=lambda: [s for s in STAGES if s not in OPTIONAL]
    )
    submit: Literal["local", "ray_job"] = "local"
    job_address: str | None = None  # ray_job: the dashboard URL, e.g. http://127.0.0.1:8265
    job_timeout_s: int = 6 * 3600
    inputs: DagInputs = field(default_factory=DagInputs)
    curate: CurationConfig = field(default_factory=CurationConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    tracking: TrackingConfig = tracking_section("dag")

    def validate(self) -> None:
        order = list(self.stages)
        core = tuple(s for s in STAGES if s not in OPTIONAL)
        if not (_contiguous(order, STAGES) or _contiguous(order, core)):
            raise ValueError(
                f"stages must be a contiguous run of {list(STAGES)} in order ({', '.join(OPTIONAL)} may be "
                f"left out), got {self.stages}"
            )
        if order[0] == "pretrain" and not self.inputs.dataset:
            raise ValueError("a DAG starting at pretrain needs inputs.dataset (a dataset version id, name or folder)")
        if self.submit == "ray_job" and not self.job_address:
            raise ValueError("submit=ray_job needs job_address (the Ray dashboard URL, e.g. http://127.0.0.1:8265)")
        if not self.tracking.enabled:
            raise ValueError(
                "tracking.enabled=false: the DAG records its stages' parent/child lineage in MLflow "
                "and cannot run without it (tracking.uri chooses the store)"
            )
