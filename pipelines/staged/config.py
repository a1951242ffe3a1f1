"""The chain's configuration: which stages, where, how they are submitted, and each stage's
own config section (the same keys as that stage's YAML)."""
from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Literal

from curation.recipe import CurationConfig
from evaluation.config import ProbeConfig
from infra.tracking import TrackingConfig, tracking_section
from training.config import PretrainConfig

STAGES = ("curate", "pretrain", "probe")


@dataclasses.dataclass(kw_only=True)
class DagInputs:
    """Inputs of a DAG that does not start with curation (a suffix of the chain)."""

    dataset: str = ""      # pretrain first: a dataset version id, name or curation output folder
    checkpoint: str = ""   # probe only: an official-layout .safetensors ("" = random init)
    pretrain_run_id: str = ""


@dataclasses.dataclass(kw_only=True)
class DagConfig:
    """``tracking``: the one MLflow store and experiment of the parent run and of every stage's
    run (children must share it); ``uri`` None: $MLFLOW_TRACKING_URI, else
    sqlite:///<workspace>/mlflow.db; ``run_name`` None: the parent run is named ``name``."""

    name: str = "dag"
    workspace: str = "runs/dag"
    stages: list[Literal["curate", "pretrain", "probe"]] = field(default_factory=lambda: list(STAGES))
    submit: Literal["local", "ray_job"] = "local"
    job_address: str | None = None      # ray_job: the dashboard URL, e.g. http://127.0.0.1:8265
    job_timeout_s: int = 6 * 3600
    inputs: DagInputs = field(default_factory=DagInputs)
    curate: CurationConfig = field(default_factory=CurationConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    tracking: TrackingConfig = tracking_section("dag")

    def validate(self) -> None:
        order = [s for s in STAGES if s in self.stages]
        if not order or order != list(self.stages) or STAGES[STAGES.index(order[0]):][: len(order)] != tuple(order):
            raise ValueError(f"stages must be a contiguous run of {list(STAGES)} in order, got {self.stages}")
        if order[0] == "pretrain" and not self.inputs.dataset:
            raise ValueError("a DAG starting at pretrain needs inputs.dataset (a dataset version id, name or folder)")
        if self.submit == "ray_job" and not self.job_address:
            raise ValueError("submit=ray_job needs job_address (the Ray dashboard URL, e.g. http://127.0.0.1:8265)")
        if not self.tracking.enabled:
            raise ValueError("tracking.enabled=false: the DAG records its stages' parent/child lineage in MLflow "
                             "and cannot run without it (tracking.uri chooses the store)")
