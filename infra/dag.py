"""Staged curate -> pretrain -> probe runs: reuse what did not change, resume what failed.

Thin on purpose: Ray runs the work and MLflow keeps the record; there is no scheduler here.

- **Identity.** Each stage's identity is a digest of its resolved configuration (the part
  that decides its outputs) and of its inputs' digests: curation = job digest + curation
  code version; pretraining = run-defining settings + dataset version id; probing = probe
  settings + checkpoint digest. Its outputs live in ``<workspace>/<stage>/<identity>``.
- **Reuse.** A stage whose identity has a finished result (``DONE.json``, written only after
  the stage succeeded) is not run again; its recorded result feeds the next stage.
- **Resume.** A stage that failed or was killed is run again into the same folder, and each
  stage resumes itself there: curation skips committed partitions, pretraining restarts
  from its newest DCP checkpoint (same Ray Train run name), probing redoes its probes.
- **Where.** ``submit=local`` runs the stages in this process (on a local or given Ray);
  ``submit=ray_job`` submits each stage as a Ray job (``python pipelines/<stage>.py --config
  <its resolved YAML>``) to ``job_address`` with Ray's job submission SDK and follows its
  status until it ends.
- **Record.** One MLflow parent run per DAG invocation; each stage's run becomes its child
  (``mlflow.parentRunId``) with lineage tags. A reused stage gets a small child run that
  points at the run that produced it (``dag.reused_run_id``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from curation.config import CurationConfig
from evaluation.config import ProbeConfig
from infra import storage
from infra.config import config_digest, config_to_dict, dump_config
from training.config import PretrainConfig

log = logging.getLogger("dag")

STAGES = ("curate", "pretrain", "probe")
DONE = "DONE.json"
REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(kw_only=True)
class DagInputs:
    """Inputs of a DAG that does not start with curation (a suffix of the chain)."""

    dataset: str = ""      # pretrain first: a dataset version id, name or curation output folder
    checkpoint: str = ""   # probe only: an official-layout .safetensors ("" = random init)
    pretrain_run_id: str = ""


@dataclasses.dataclass(kw_only=True)
class DagTracking:
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///<workspace>/mlflow.db
    experiment: str = "dag"


@dataclasses.dataclass(kw_only=True)
class DagConfig:
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
    tracking: DagTracking = field(default_factory=DagTracking)

    def validate(self) -> None:
        order = [s for s in STAGES if s in self.stages]
        if not order or order != list(self.stages) or STAGES[STAGES.index(order[0]):][: len(order)] != tuple(order):
            raise ValueError(f"stages must be a contiguous run of {list(STAGES)} in order, got {self.stages}")
        if order[0] == "pretrain" and not self.inputs.dataset:
            raise ValueError("a DAG starting at pretrain needs inputs.dataset (a dataset version id, name or folder)")
        if self.submit == "ray_job" and not self.job_address:
            raise ValueError("submit=ray_job needs job_address (the Ray dashboard URL, e.g. http://127.0.0.1:8265)")


@dataclasses.dataclass
class StageOutcome:
    stage: str
    identity: str
    folder: str
    reused: bool
    run_id: str | None       # the stage's own MLflow run (the one that produced the result)
    result: dict[str, Any]   # what the next stage needs: dataset id / checkpoint / metrics


@dataclasses.dataclass
class DagResult:
    parent_run_id: str
    tracking_uri: str
    outcomes: list[StageOutcome]

    def summary(self) -> str:
        lines = [f"mlflow: {self.tracking_uri} (parent run {self.parent_run_id})"]
        for o in self.outcomes:
            lines.append(f"{o.stage:9s} {'reused ' if o.reused else 'ran    '} {o.identity}  {o.folder}")
            for key, value in o.result.items():
                if key in ("dataset_id", "shards", "student_weights", "checkpoint_digest", "metrics", "loss_trend",
                           "report"):
                    text = f"{len(value)} files" if key == "shards" else value
                    lines.append(f"{'':10s}{key}: {text}")
        return "\n".join(lines)


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def input_listing_digest(uri: str) -> str:
    """Digest of the raw input's listing (paths and sizes): new, removed or changed files change it."""
    fs, root = storage.resolve(uri)
    return _digest([(f.path, f.size) for f in storage.list_files(fs, root)])


def curate_identity(cfg: CurationConfig) -> str:
    from curation.pipeline import absolutize, job_digest
    from curation.versions import code_version

    cfg = absolutize(cfg)
    return _digest("curate", job_digest(cfg), code_version(), input_listing_digest(cfg.input.uri))


def pretrain_identity(cfg: PretrainConfig, dataset_id: str) -> str:
    from training.config import identity_digest

    return _digest("pretrain", identity_digest(cfg), dataset_id)


def probe_identity(cfg: ProbeConfig, checkpoint_digest: str) -> str:
    d = config_to_dict(cfg)
    for key in ("output_dir", "tracking", "ray", "name"):
        d.pop(key, None)
    d["backbone"].pop("checkpoint", None)
    d["backbone"].pop("pretrain_run_id", None)
    return _digest("probe", config_digest(d), checkpoint_digest)


# ---- stage runners: in-process or as Ray jobs; each returns its result from files -------

def _write_yaml(folder: str, cfg: Any) -> str:
    path = Path(folder) / "stage_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_config(cfg))
    return str(path)


def submit_ray_job(address: str, script: str, config_path: str, timeout_s: int) -> None:
    """Run ``python pipelines/<script> --config <yaml>`` as a Ray job and wait for it."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    job_id = client.submit_job(entrypoint=f"python pipelines/{script} --config {config_path}",
                               runtime_env={"working_dir": str(REPO),
                                            "excludes": [".venv", "runs", ".git", "*.tar", "*.parquet"]})
    log.info("submitted %s as Ray job %s", script, job_id)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            break
        time.sleep(2)
    else:
        client.stop_job(job_id)
        raise TimeoutError(f"Ray job {job_id} ({script}) did not finish within {timeout_s}s")
    if status != JobStatus.SUCCEEDED:
        logs = client.get_job_logs(job_id)
        raise RuntimeError(f"Ray job {job_id} ({script}) ended {status}:\n{logs[-4000:]}")


def run_curate(cfg: CurationConfig, dag: DagConfig) -> dict:
    from curation.versions import from_output

    if dag.submit == "ray_job":
        submit_ray_job(dag.job_address, "curate.py", _write_yaml(cfg.output_dir, cfg), dag.job_timeout_s)
    else:
        from curation.pipeline import run_curation
        run_curation(cfg)
    version = from_output(cfg.output_dir)
    stats = json.loads((Path(cfg.output_dir) / "stats.json").read_text())
    return {"dataset_id": version.id, "dataset_uri": version.uri, "shards": list(version.shards),
            "run_id": version.run_id, "kept": stats["kept"], "inputs": stats["inputs"]}


def pretrain_result_from_files(cfg: PretrainConfig) -> dict:
    """A finished pretraining run's result, read from its run folder (run.json + export.json)."""
    run_dir = Path(cfg.storage_path) / cfg.run_name
    record = json.loads((run_dir / "run.json").read_text())
    export = json.loads((run_dir / "export" / "export.json").read_text())
    if export.get("step") != cfg.steps:
        raise RuntimeError(f"pretraining run {cfg.run_name} has not reached step {cfg.steps} (export at {export.get('step')})")
    return {"student_weights": export["export_student"], "teacher_weights": export["export_teacher"],
            "checkpoint_digest": export["export_student_sha256"], "run_id": record["mlflow_run_id"],
            "dataset_id": record["dataset"]["id"], "final_step": export["step"]}


def run_pretrain(cfg: PretrainConfig, dag: DagConfig) -> dict:
    if dag.submit == "ray_job":
        submit_ray_job(dag.job_address, "pretrain.py", _write_yaml(str(Path(cfg.storage_path) / cfg.run_name), cfg),
                       dag.job_timeout_s)
        return pretrain_result_from_files(cfg)
    from training.run import run_pretraining

    res = run_pretraining(cfg)
    if not res.completed:
        raise RuntimeError(f"pretraining stopped at step {res.final_step} of {cfg.steps}; re-run the DAG to resume")
    out = pretrain_result_from_files(cfg)
    trend = res.loss_trend()
    if "loss" in trend:
        first, last, window = trend["loss"]
        out.update(loss_trend=f"{first:.4f} (mean of the first {window} steps) -> {last:.4f} (last {window})")
    return out


def run_probe(cfg: ProbeConfig, dag: DagConfig) -> dict:
    if dag.submit == "ray_job":
        submit_ray_job(dag.job_address, "probe.py", _write_yaml(cfg.output_dir, cfg), dag.job_timeout_s)
    else:
        from evaluation.run import run_probes
        run_probes(cfg)
    results = json.loads((Path(cfg.output_dir) / "results.json").read_text())
    return {"metrics": {t: {k: v for k, v in m.items() if not k.startswith("iou.") and not k.endswith("seconds")}
                        for t, m in results["metrics"].items()},
            "run_id": results["mlflow"]["parent_run_id"], "child_run_ids": results["mlflow"]["child_run_ids"]}


# ---- the DAG ---------------------------------------------------------------------------------

def _stage_configs(dag: DagConfig, ws: Path, uri: str):
    """Stage configs with the DAG's tracking store and experiment (children must share it), and
    local paths made absolute (a Ray job runs in a copy of the repo, not in this folder)."""
    from curation.pipeline import absolutize as absolute_curation
    from training.run import absolutize as absolute_pretrain

    curate = dataclasses.replace(absolute_curation(dag.curate), tracking=dataclasses.replace(
        dag.curate.tracking, uri=uri, experiment=dag.tracking.experiment))
    pretrain = dataclasses.replace(absolute_pretrain(dag.pretrain), storage_path=str(ws / "pretrain"), mlflow=dataclasses.replace(
        dag.pretrain.mlflow, uri=uri, experiment=dag.tracking.experiment))
    probe = dataclasses.replace(dag.probe, tracking=dataclasses.replace(
        dag.probe.tracking, uri=uri, experiment=dag.tracking.experiment))
    return curate, pretrain, probe


def _finished(folder: Path) -> dict | None:
    done = folder / DONE
    return json.loads(done.read_text()) if done.is_file() else None


def _record(folder: Path, result: dict) -> None:
    storage.atomic_write_bytes(storage.resolve(str(folder))[0], str(folder / DONE),
                               json.dumps(result, indent=2, sort_keys=True, default=str).encode())


def run_dag(dag: DagConfig) -> DagResult:
    import mlflow
    from mlflow import MlflowClient

    from infra.tracking import get_experiment_id, resolve_tracking_uri

    dag.validate()
    ws = Path(dag.workspace).expanduser().resolve()
    ws.mkdir(parents=True, exist_ok=True)
    uri = dag.tracking.uri or resolve_tracking_uri(None, str(ws / "x"))
    if uri.startswith("sqlite:///") and not dag.tracking.uri:
        uri = f"sqlite:///{ws / 'mlflow.db'}"
    curate_cfg, pretrain_cfg, probe_cfg = _stage_configs(dag, ws, uri)
    (ws / "dag_config.yaml").write_text(dump_config(dag))
    client = MlflowClient(uri)
    exp_id = get_experiment_id(dag.tracking.experiment, uri)
    parent = client.create_run(exp_id, run_name=dag.name, tags={"humanvision.stage": "dag", "dag.stages": ",".join(dag.stages)})
    parent_id = parent.info.run_id
    mlflow.set_tracking_uri(uri)
    outcomes: list[StageOutcome] = []
    lineage: dict[str, str] = {}
    dataset_ref, checkpoint, checkpoint_digest, pretrain_run = dag.inputs.dataset, dag.inputs.checkpoint, "", dag.inputs.pretrain_run_id
    status = "FAILED"
    try:
        for stage in dag.stages:
            if stage == "curate":
                identity = curate_identity(curate_cfg)
                folder = ws / "curate" / identity
                cfg = dataclasses.replace(curate_cfg, output_dir=str(folder))
                runner = lambda cfg=cfg: run_curate(cfg, dag)  # noqa: E731
            elif stage == "pretrain":
                from training.run import resolve_version
                dataset_id = lineage.get("dataset_id") or resolve_version(dataset_ref, uri).id
                dataset = lineage.get("dataset_uri") or dataset_ref
                identity = pretrain_identity(pretrain_cfg, dataset_id)
                folder = ws / "pretrain" / identity
                cfg = dataclasses.replace(pretrain_cfg, run_name=identity,
                                          data=dataclasses.replace(pretrain_cfg.data, dataset=dataset, tracking_uri=uri))
                runner = lambda cfg=cfg: run_pretrain(cfg, dag)  # noqa: E731
            else:
                if checkpoint and not checkpoint_digest:
                    checkpoint_digest = hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()
                identity = probe_identity(probe_cfg, checkpoint_digest or f"random-init:seed={probe_cfg.seed}")
                folder = ws / "probe" / identity
                cfg = dataclasses.replace(probe_cfg, output_dir=str(folder), backbone=dataclasses.replace(
                    probe_cfg.backbone, checkpoint=checkpoint, pretrain_run_id=pretrain_run or ""))
                runner = lambda cfg=cfg: run_probe(cfg, dag)  # noqa: E731
            done = _finished(folder)
            if done is None:
                log.info("%s: running %s (into %s)", stage, identity, folder)
                result = runner()
                _record(folder, result)
                stage_run = result["run_id"]
                client.set_tag(stage_run, "mlflow.parentRunId", parent_id)
                for key, value in {"dag.stage": stage, "dag.identity": identity, "dag.parent_run_id": parent_id,
                                   **{f"lineage.{k}": v for k, v in lineage.items()}}.items():
                    client.set_tag(stage_run, key, str(value))
            else:
                log.info("%s: reusing %s", stage, identity)
                result, stage_run = done, done["run_id"]
                reuse = client.create_run(exp_id, run_name=f"{stage} (reused)", tags={
                    "mlflow.parentRunId": parent_id, "dag.stage": stage, "dag.identity": identity, "dag.reused": "true",
                    "dag.reused_run_id": stage_run, **{f"lineage.{k}": str(v) for k, v in lineage.items()}})
                client.set_terminated(reuse.info.run_id)
            outcomes.append(StageOutcome(stage, identity, str(folder), done is not None, stage_run, result))
            client.set_tag(parent_id, f"dag.{stage}.identity", identity)
            client.set_tag(parent_id, f"dag.{stage}.reused", str(done is not None).lower())
            if stage == "curate":
                lineage.update(dataset_id=result["dataset_id"], dataset_uri=result["dataset_uri"], curation_run_id=stage_run)
            elif stage == "pretrain":
                checkpoint, checkpoint_digest, pretrain_run = (result["student_weights"], result["checkpoint_digest"],
                                                               stage_run)
                lineage.update(dataset_id=result["dataset_id"], checkpoint_digest=checkpoint_digest,
                               checkpoint_path=checkpoint, pretrain_run_id=stage_run)
        status = "FINISHED"
    finally:
        for key, value in lineage.items():
            client.set_tag(parent_id, f"lineage.{key}", str(value))
        client.set_terminated(parent_id, status=status)
    return DagResult(parent_id, uri, outcomes)
