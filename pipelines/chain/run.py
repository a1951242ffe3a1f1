"""``run_dag(cfg)``: plan each stage, reuse it when its identity has a finished result, else
run it (here or as a Ray job), and record the invocation in MLflow."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Protocol

from infra import storage
from infra.config import dump_config
from infra.stage import StageResult
from infra.tracking import resolve_tracking_uri
from pipelines.chain.config import DagConfig
from pipelines.chain.jobs import submit_ray_job, write_stage_config
from pipelines.chain.record import ParentRun
from pipelines.chain.stages import Handoff, StagePlan, hand_on, plan, with_store

log = logging.getLogger("dag")

DONE = "DONE.json"  # a stage's result, written only after the stage succeeded


@dataclasses.dataclass
class StageOutcome:
    stage: str
    identity: str
    folder: str
    reused: bool
    result: StageResult  # what the next stage needs: dataset id / checkpoint / metrics

    @property
    def run_id(self) -> str | None:
        """The stage's own MLflow run (the one that produced the result)."""
        return self.result.run_id


@dataclasses.dataclass
class DagResult:
    parent_run_id: str
    tracking_uri: str
    outcomes: list[StageOutcome]

    def summary(self) -> str:
        lines = [f"mlflow: {self.tracking_uri} (parent run {self.parent_run_id})"]
        for o in self.outcomes:
            lines.append(f"{o.stage:9s} {'reused ' if o.reused else 'ran    '} {o.identity}  {o.folder}")
            for key, value in o.result.summary().items():
                if value not in ("", None):
                    lines.append(f"{'':10s}{key}: {f'{len(value)} files' if key == 'shards' else value}")
        return "\n".join(lines)


class StageObserver(Protocol):
    """What a front end (``pipelines/demo.py``) is told while the chain runs: a stage is about
    to run or be reused, and it ended (its outcome)."""

    def stage_started(self, plan: StagePlan, reused: bool, tracking_uri: str) -> None: ...

    def stage_finished(self, outcome: StageOutcome) -> None: ...


def tracking_uri(dag: DagConfig, ws: Path) -> str:
    """``tracking.uri``, else a server named by $MLFLOW_TRACKING_URI, else SQLite in the
    workspace (also when the environment names a SQLite file elsewhere)."""
    if dag.tracking.uri:
        return dag.tracking.uri
    uri = resolve_tracking_uri(None, str(ws / "mlflow.db"))
    return f"sqlite:///{ws / 'mlflow.db'}" if uri.startswith("sqlite:///") else uri


def _finished(p: StagePlan) -> StageResult | None:
    done = p.folder / DONE
    return p.facade.recorded(json.loads(done.read_text())) if done.is_file() else None


def _record(folder: Path, result: StageResult) -> None:
    storage.atomic_write_bytes(
        storage.resolve(str(folder))[0],
        str(folder / DONE),
        json.dumps(result.to_json(), indent=2, sort_keys=True, default=str).encode(),
    )


def _execute(p: StagePlan, dag: DagConfig) -> StageResult:
    """Run one stage (in this process, or as a Ray job and then read its result back from its files)."""
    if dag.submit == "ray_job":
        submit_ray_job(dag.job_address, p.facade.script, write_stage_config(p.folder, p.cfg), dag.job_timeout_s)
        return p.facade.result(p.cfg)
    return p.facade.run(p.cfg)


def reuse_or_run(
    p: StagePlan, dag: DagConfig, parent: ParentRun, lineage: dict[str, Any], observer: StageObserver | None = None
) -> StageOutcome:
    done = _finished(p)
    if observer is not None:
        observer.stage_started(p, done is not None, parent.uri)
    if done is not None:
        log.info("%s: reusing %s", p.stage, p.identity)
        parent.point_to_reused(p.stage, p.identity, done.run_id, lineage)
        return StageOutcome(p.stage, p.identity, str(p.folder), True, done)
    log.info("%s: running %s (into %s)", p.stage, p.identity, p.folder)
    result = _execute(p, dag)
    _record(p.folder, result)
    parent.adopt(p.stage, p.identity, result.run_id, lineage)
    return StageOutcome(p.stage, p.identity, str(p.folder), False, result)


def run_dag(
    dag: DagConfig, observer: StageObserver | None = None, parent_tags: dict[str, str] | None = None
) -> DagResult:
    """Run (or reuse) every stage of ``dag.stages``; ``observer`` hears each stage start and end;
    ``parent_tags``: more tags of the invocation's parent run (``mlflow.parentRunId`` nests it)."""
    dag.validate()
    ws = Path(dag.workspace).expanduser().resolve()
    ws.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri(dag, ws)
    (ws / "dag_config.yaml").write_text(dump_config(dag))
    parent = ParentRun(uri, dag.tracking.experiment, dag.tracking.run_name or dag.name, dag.stages, parent_tags)
    handoff = Handoff.from_inputs(dag.inputs)
    outcomes: list[StageOutcome] = []
    status = "FAILED"
    try:
        for stage in dag.stages:
            cfg = with_store(getattr(dag, stage), uri, dag.tracking.experiment)
            outcome = reuse_or_run(plan(stage, cfg, ws, handoff, uri), dag, parent, handoff.lineage, observer)
            parent.note_stage(stage, outcome.identity, outcome.reused)
            if observer is not None:
                observer.stage_finished(outcome)
            hand_on(handoff, outcome.result)
            outcomes.append(outcome)
        status = "FINISHED"
    finally:
        parent.finish(handoff.lineage, status)
    return DagResult(parent.run_id, uri, outcomes)
