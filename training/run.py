"""``run_pretraining(cfg)``: one pretraining run (Sapiens2, or Sapiens v1 MAE) on Ray Train, start or resume.

Layout of a run (``<storage_path>/<run_name>``, the Ray Train experiment folder):

    run.json                  identity of the run: settings digest, dataset version, MLflow run
    config.yaml               the resolved settings of the latest session
    checkpoint_<step>/        DCP checkpoints (newest ``checkpoint.keep``), written by Ray Train
    export/                   student/teacher backbones (.safetensors; Sapiens v1: student only) and export.json
    batch_keys/               per-rank batch keys per step (only with ``record_batch_keys``)

Re-running with the same ``run_name`` and ``storage_path`` resumes from the newest
checkpoint (Ray Train's ``get_checkpoint``), on the dataset version recorded in
``run.json``, into the same MLflow run. Settings that define the trajectory must not
change between sessions (``training.config.RESUME_FREE`` lists those that may).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field

from curation.output import DatasetVersion, resolve_dataset
from infra import storage
from infra.config import config_to_dict, dump_config, from_dict
from infra.ray_runtime import start_ray
from infra.tracking import end_run, get_experiment_id, log_config, make_dataset, metric_history, resolve_tracking_uri
from training.config import PretrainConfig, identity_dict, identity_digest, with_run_name
from training.loop import EXPORT_DIR, EXPORT_MANIFEST, train_loop_per_worker

RUN_RECORD = "run.json"
HISTORY_KEYS = ("loss", "loss_mae", "loss_cl", "loss_koleo", "lr", "momentum", "grad_norm")


@dataclass
class PretrainResult:
    """What a session leaves. ``losses``: total loss per step 1..``final_step`` (from
    MLflow, all sessions of the run); ``history``: every logged value per step.
    ``completed``: the run reached ``steps`` (else it stopped at ``max_steps_this_session``).
    ``checkpoint_digest``: sha256 of the exported student file ('' before the end)."""

    run_name: str
    run_dir: str
    checkpoint_uri: str | None
    student_weights: str | None
    teacher_weights: str | None
    checkpoint_digest: str
    final_step: int
    completed: bool
    losses: list[float]
    mlflow_run_id: str
    tracking_uri: str
    dataset_id: str
    dataset_uri: str
    config_digest: str
    seconds: float
    history: dict[int, dict[str, float]] = field(default_factory=dict)

    def loss_trend(self, window: int = 10) -> dict[str, tuple[float, float, int]]:
        """Mean of each loss over the first and the last ``window`` logged steps (one step's
        value is too noisy to say whether training went down): {key: (first, last, window)}."""
        out = {}
        for key in ("loss", "loss_mae", "loss_cl", "loss_koleo"):
            values = [v[key] for _, v in sorted(self.history.items()) if key in v]
            if values:
                n = max(1, min(window, len(values) // 2))
                out[key] = (sum(values[:n]) / n, sum(values[-n:]) / n, n)
        return out

    def summary(self) -> str:
        lines = [
            f"run:        {self.run_name} ({'completed' if self.completed else 'paused'} at step {self.final_step})",
            f"run dir:    {self.run_dir}",
            f"checkpoint: {self.checkpoint_uri}",
            f"dataset:    {self.dataset_id} ({self.dataset_uri})",
            f"mlflow:     {self.tracking_uri} run {self.mlflow_run_id}",
        ]
        for key, (first, last, window) in self.loss_trend().items():
            lines.append(
                f"{key + ':':11s} {first:.4f} (mean of the first {window} steps) -> {last:.4f} (last {window})"
            )
        if self.student_weights:
            lines.append(f"student:    {self.student_weights}")
            if self.teacher_weights:
                lines.append(f"teacher:    {self.teacher_weights}")
            lines.append(f"digest:     {self.checkpoint_digest}")
        return "\n".join(lines)


def absolutize(cfg: PretrainConfig) -> PretrainConfig:
    dataset = cfg.data.dataset
    if dataset and ("/" in dataset or dataset.startswith(".")) and "://" not in dataset:
        dataset = storage.local_path(dataset)
    return dataclasses.replace(
        cfg, storage_path=storage.local_path(cfg.storage_path), data=dataclasses.replace(cfg.data, dataset=dataset)
    )


def _dataset_version(cfg: PretrainConfig, tracking_uri: str) -> DatasetVersion:
    """The curated version ``data.dataset`` names (ids and names looked up in ``data.tracking_uri``,
    else the run's store)."""
    try:
        return resolve_dataset(cfg.data.dataset, cfg.data.tracking_uri or tracking_uri)
    except ValueError as err:
        raise ValueError(
            f"data.dataset={cfg.data.dataset!r}: {err} (pretraining looks ids and names up in "
            "data.tracking_uri, default: this run's tracking.uri)"
        ) from None


def run_pretraining(cfg: PretrainConfig) -> PretrainResult:
    started = time.time()
    cfg.validate()
    cfg = with_run_name(absolutize(cfg))
    fs, storage_root = storage.resolve(cfg.storage_path)
    run_dir = storage.to_uri(fs, storage.join(storage_root, cfg.run_name))
    tracking_uri = resolve_tracking_uri(cfg.tracking.uri, cfg.storage_path)

    record = _read_record(fs, run_dir)
    dataset = _dataset_version(cfg, tracking_uri)
    digest = identity_digest(cfg)
    if record is not None:
        _check_resumable(cfg, record, digest, dataset.id)
        shards = tuple(record["dataset"]["shards"])
    else:
        shards = dataset.shards
    if not shards:
        raise ValueError(f"dataset {dataset.id} ({dataset.uri}) has no shards")

    run_id = _start_mlflow_run(cfg, tracking_uri, record, dataset, shards, digest)
    record = record or {
        "identity_digest": digest,
        "identity": identity_dict(cfg),
        "created": time.time(),
        "dataset": {
            "id": dataset.id,
            "name": dataset.name,
            "uri": dataset.uri,
            "shards": list(shards),
            "num_samples": dataset.num_samples,
        },
    }
    record.update(mlflow_run_id=run_id, tracking_uri=tracking_uri)
    storage.atomic_write_bytes(
        fs, storage.join(storage.resolve(run_dir)[1], RUN_RECORD), json.dumps(record, indent=2).encode()
    )
    storage.atomic_write_bytes(fs, storage.join(storage.resolve(run_dir)[1], "config.yaml"), dump_config(cfg).encode())

    start_ray(cfg.ray)
    payload = {
        "config": config_to_dict(cfg),
        "shards": list(shards),
        "run_dir": run_dir,
        "tracking_uri": tracking_uri,
        "mlflow_run_id": run_id,
        "dataset": {"id": record["dataset"]["id"], "uri": record["dataset"]["uri"]},
    }
    try:
        result = _trainer(cfg, payload).fit()
    except BaseException:
        end_run(tracking_uri, run_id, "FAILED")
        raise
    return _finish(cfg, result, run_dir, tracking_uri, run_id, record, started)


def _trainer(cfg: PretrainConfig, payload: dict):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    r = cfg.ray
    resources = {"CPU": r.cpus_per_worker, **({"GPU": 1} if r.use_gpu else {})}
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=payload,
        torch_config=TorchConfig(backend="nccl" if r.use_gpu else "gloo", timeout_s=r.timeout_s),
        scaling_config=ScalingConfig(num_workers=r.num_workers, use_gpu=r.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name=cfg.run_name,
            storage_path=cfg.storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            failure_config=FailureConfig(max_failures=r.max_failures),
        ),
    )


def _read_record(fs, run_dir: str) -> dict | None:
    path = storage.join(storage.resolve(run_dir)[1], RUN_RECORD)
    return json.loads(storage.read_bytes(fs, path)) if storage.exists(fs, path) else None


def _recorded_identity(record: dict) -> dict:
    """The run's recorded settings, with settings added to the code since then at their
    defaults (so a new option does not make every older run unresumable)."""
    try:
        return identity_dict(from_dict(PretrainConfig, record["identity"]))
    except ValueError:  # a recorded setting no longer exists: compare as recorded
        return record["identity"]


def _check_resumable(cfg: PretrainConfig, record: dict, digest: str, dataset_id: str) -> None:
    ours = identity_dict(cfg)
    if record["identity_digest"] != digest and _recorded_identity(record) != ours:
        changed = sorted(_diff(_recorded_identity(record), ours))
        raise ValueError(
            f"run {cfg.run_name!r} exists with different settings ({', '.join(changed)}); "
            "resume it with its own settings, or choose a new run_name"
        )
    if record["dataset"]["id"] != dataset_id:
        raise ValueError(
            f"run {cfg.run_name!r} trains on dataset version {record['dataset']['id']}, but "
            f"data.dataset={cfg.data.dataset!r} now resolves to {dataset_id}; pass "
            f"data.dataset={record['dataset']['id']} (or its folder), or choose a new run_name"
        )


def _diff(a, b, prefix: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = set()
        for key in set(a) | set(b):
            out |= _diff(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return set() if a == b else {prefix.rstrip(".")}


def _start_mlflow_run(cfg: PretrainConfig, tracking_uri: str, record: dict | None, dataset, shards, digest: str) -> str:
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    run_id = record.get("mlflow_run_id") if record else None
    if run_id is not None and record.get("tracking_uri") != tracking_uri:
        run_id = None  # the record's store is not this one: start a run here
    resumed = run_id is not None
    if not resumed:
        experiment_id = get_experiment_id(cfg.tracking.experiment, tracking_uri)
        tags = {
            "humanvision.stage": "pretrain",
            "training.run_name": cfg.run_name,
            "model.name": cfg.model,
            "config.identity_digest": digest,
            "dataset.id": dataset.id,
            "dataset.name": dataset.name,
            "dataset.uri": dataset.uri,
        }
        run_id = client.create_run(experiment_id, run_name=cfg.tracking.run_name or cfg.run_name, tags=tags).info.run_id
    mlflow.set_tracking_uri(tracking_uri)
    with mlflow.start_run(run_id=run_id):
        if not resumed:
            log_config(cfg)
            profile = {"num_samples": dataset.num_samples, "num_shards": len(shards)}
            mlflow.log_input(make_dataset(dataset.name, dataset.id, dataset.uri, profile=profile), context="training")
        else:
            mlflow.log_text(dump_config(cfg), f"sessions/config_{int(time.time())}.yaml")
    client.update_run(run_id, status="RUNNING")
    return run_id


def _finish(cfg, result, run_dir, tracking_uri, run_id, record, started) -> PretrainResult:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    fs, root = storage.resolve(run_dir)
    checkpoint_uri = result.checkpoint.path if result.checkpoint is not None else None
    if checkpoint_uri and "://" not in checkpoint_uri and not storage.is_local(fs):
        checkpoint_uri = storage.to_uri(fs, checkpoint_uri)
    history = metric_history(tracking_uri, run_id, HISTORY_KEYS)
    final_step = int((result.metrics or {}).get("step", 0)) or max(
        (s for s, v in history.items() if "loss" in v), default=0
    )
    manifest_path = storage.join(root, EXPORT_DIR, EXPORT_MANIFEST)
    manifest = json.loads(storage.read_bytes(fs, manifest_path)) if storage.exists(fs, manifest_path) else {}
    if manifest.get("step") != final_step:
        manifest = {}  # an export of an earlier end, not of this state
    completed = final_step >= cfg.steps
    tags = {"training.final_step": str(final_step), "training.state": "completed" if completed else "paused"}
    if checkpoint_uri:
        tags["checkpoint.uri"] = checkpoint_uri
    if manifest:
        tags.update(
            {"checkpoint.student": manifest["export_student"], "checkpoint.digest": manifest["export_student_sha256"]}
        )
        if "export_teacher" in manifest:  # Sapiens v1's MAE has no teacher
            tags.update(
                {
                    "checkpoint.teacher": manifest["export_teacher"],
                    "checkpoint.teacher_digest": manifest["export_teacher_sha256"],
                }
            )
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    client.set_terminated(run_id, status="FINISHED" if completed else "KILLED")
    losses = [history[s]["loss"] for s in range(1, final_step + 1) if "loss" in history.get(s, {})]
    return PretrainResult(
        run_name=cfg.run_name,
        run_dir=run_dir,
        checkpoint_uri=checkpoint_uri,
        student_weights=manifest.get("export_student"),
        teacher_weights=manifest.get("export_teacher"),
        checkpoint_digest=manifest.get("export_student_sha256", ""),
        final_step=final_step,
        completed=completed,
        losses=losses,
        mlflow_run_id=run_id,
        tracking_uri=tracking_uri,
        dataset_id=record["dataset"]["id"],
        dataset_uri=record["dataset"]["uri"],
        config_digest=record["identity_digest"],
        seconds=round(time.time() - started, 3),
        history=history,
    )
