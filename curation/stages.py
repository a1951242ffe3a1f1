"""Stages: the unit the curation recipe is written in, and their adapter onto Ray Data.

A stage is a small object holding its settings. It declares its resources, loads whatever
it needs once per worker in ``setup()``, and maps a ``pyarrow.Table`` batch of rows to the
same rows with its columns added (``process``). Filter stages annotate: they record scores
and set ``reason`` on the pending rows they would drop (``curation.schema.set_reasons``);
the pipeline's one decision point turns reasons into statuses and counts them.

``apply_stage`` runs a stage on a Ray Dataset: cheap stages as stateless tasks, model
stages (``uses_model = True``) as an actor pool so weights load once per actor, with
fractional GPUs where the configuration asks for them.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import pyarrow as pa


@dataclasses.dataclass(kw_only=True)
class Resources:
    """Where a stage runs: CPUs/GPUs per task or actor, batch size, actor pool size."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int = 16
    num_actors: int = 1  # model stages only: size of the actor pool (max; min is 1)

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must be >= 0")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {self.num_actors}")


class Stage(abc.ABC):
    """One step of the recipe. Subclasses set ``name`` and ``reasons`` and implement ``process``."""

    name: ClassVar[str]
    reasons: ClassVar[tuple[str, ...]] = ()  # drop/error reasons this stage may set, in funnel order
    uses_model: ClassVar[bool] = False

    def resources(self) -> Resources:
        return Resources()

    def setup(self) -> None:
        """Load models or other per-worker state (called once per worker before ``process``)."""

    @abc.abstractmethod
    def process(self, batch: pa.Table) -> pa.Table:
        """Return ``batch`` with this stage's columns set; never raise for one bad row."""

    def describe(self) -> dict:
        """Settings recorded in stats.json and MLflow (what ran, with what thresholds)."""
        return {"name": self.name, "applied": True}


class _StageWorker:
    """Ray Data callable class: builds its stage once, then processes batches."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.stage.setup()

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.stage.process(batch)


def _run_task(batch: pa.Table, stage: Stage) -> pa.Table:
    if not getattr(stage, "_ready", False):
        stage.setup()
        stage._ready = True  # cached per worker process: stages are pickled once per task
    return stage.process(batch)


def apply_stage(ds, stage: Stage, autoscale: bool = False):
    """Append ``stage`` to a Ray Dataset pipeline with the stage's declared resources. A model
    stage's pool is ``num_actors`` actors from the start, or (``autoscale``) 1 growing to it."""
    import ray.data

    res = stage.resources()
    common = dict(batch_size=res.batch_size, batch_format="pyarrow", zero_copy_batch=True,
                  num_cpus=res.num_cpus)
    if res.num_gpus:
        common["num_gpus"] = res.num_gpus
    if stage.uses_model:
        return ds.map_batches(_StageWorker, fn_constructor_args=(stage,),
                              compute=ray.data.ActorPoolStrategy(min_size=1 if autoscale else res.num_actors,
                                                                 max_size=res.num_actors),
                              **common)
    return ds.map_batches(_run_task, fn_kwargs={"stage": stage}, **common)


def run_stages_locally(batch: pa.Table, stages: list[Stage]) -> pa.Table:
    """Apply stages in order in this process (tests, benchmarks and small inputs)."""
    for stage in stages:
        if not getattr(stage, "_ready", False):
            stage.setup()
            stage._ready = True
        batch = stage.process(batch)
    return batch


def check_fits(stages: list[Stage], read_cpus: float, total_cpus: float, autoscale: bool) -> None:
    """On a cluster of known size (a local one): fixed actor pools hold their CPUs for the whole
    run, so the largest task (the read, or a cheap stage) must still fit beside them, or the
    job would wait forever. Raises ``ValueError`` naming what to change."""
    if autoscale:
        return
    held = sum(s.resources().num_cpus * s.resources().num_actors for s in stages if s.uses_model)
    tasks = [("input.num_cpus", read_cpus)] + [(f"{s.name} num_cpus", s.resources().num_cpus)
                                               for s in stages if not s.uses_model]
    name, largest = max(tasks, key=lambda t: t[1])
    if held + largest > total_cpus + 1e-9:
        pools = ", ".join(f"{s.name} {s.resources().num_actors} x {s.resources().num_cpus:g}"
                          for s in stages if s.uses_model)
        raise ValueError(f"the model stages' actor pools hold {held:g} of {total_cpus:g} CPUs ({pools}), leaving "
                         f"too little for {name}={largest:g}: lower their num_actors or num_cpus, lower {name}, "
                         "or set ray.actor_pools=autoscaling")
