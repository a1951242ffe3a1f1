"""``run_training(cfg)``: one training run on Ray Train, start or resume, for either objective:
``run_pretraining`` (Sapiens2, or Sapiens v1 MAE) and ``run_distillation`` (a frozen teacher's
features into a smaller student) share this driver, the loop, the data path and the checkpoints.

Layout of a run (``<storage_path>/<run_name>``, the Ray Train experiment folder):

    run.json                  identity of the run: settings digest, weight files' sha256, dataset version, MLflow run
    config.yaml               the resolved settings of the latest session
    checkpoint_<step>/        DCP checkpoints (newest ``checkpoint.keep``), written by Ray Train
    export/                   student/teacher backbones (.safetensors; Sapiens v1 and distillation: student only)
                              and export.json
    batch_keys/               per-rank batch keys per step (only with ``record_batch_keys``)

Re-running with the same ``run_name`` and ``storage_path`` resumes from the newest
checkpoint (Ray Train's ``get_checkpoint``), on the dataset version recorded in
``run.json``, into the same MLflow run. Settings that define the trajectory must not
change between sessions (``training.config.RESUME_FREE`` lists those that may), nor may the
content of the weight files it read (``init``, a distillation's teacher): a resumed run checks
them against the sha256 it recorded (an ``init`` file that is gone is not needed any more).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from curation.output import DatasetVersion, resolve_dataset
from infra import storage
from infra.config import config_to_dict, dump_config, from_dict
from infra.ray_runtime import start_ray
from infra.tracking import (
    end_run,
    get_experiment_id,
    log_config,
    log_params,
    make_dataset,
    metric_history,
    resolve_tracking_uri,
)
from training.config import PretrainConfig, TrainConfig, identity_dict, identity_digest, with_run_name
from training.distill_config import DistillConfig
from training.init import check_weight_files, weight_digests
from training.loop import EXPORT_DIR, EXPORT_MANIFEST, train_loop_per_worker
from training.sampling import check_sampling

RUN_RECORD = "run.json"


def history_keys(cfg: TrainConfig | type[TrainConfig]) -> tuple[str, ...]:
    """The per-step values a run of ``cfg``'s objective reads back from MLflow."""
    return ("loss", *(f"loss_{part}" for part in cfg.loss_parts), "lr", "momentum", "grad_norm")


HISTORY_KEYS = history_keys(PretrainConfig)


@dataclass
class TrainingResult:
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
    weights: dict[str, str] = field(default_factory=dict)  # weight files read: setting -> sha256

    def loss_trend(self, window: int = 10) -> dict[str, tuple[float, float, int]]:
        """Mean of each loss over the first and the last ``window`` logged steps (one step's
        value is too noisy to say whether training went down): {key: (first, last, window)}."""
        out = {}
        keys = dict.fromkeys(k for v in self.history.values() for k in v if k.startswith("loss"))
        for key in keys:
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
        for setting, digest in self.weights.items():
            lines.append(f"{setting}: sha256 {digest}")
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


def absolutize(cfg: TrainConfig) -> TrainConfig:
    """Local paths made absolute: storage, a dataset folder, the weight files."""

    def local(path: str) -> str:
        return path if not path or "://" in path else str(Path(path).expanduser().resolve())

    dataset = cfg.data.dataset
    if dataset and ("/" in dataset or dataset.startswith(".")) and "://" not in dataset:
        dataset = local(dataset)
    cfg = dataclasses.replace(
        cfg, storage_path=local(cfg.storage_path), data=dataclasses.replace(cfg.data, dataset=dataset)
    )
    for setting, path in cfg.weight_files().items():
        section, key = setting.split(".")
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{key: local(path)})})
    return cfg


def _dataset_version(cfg: TrainConfig, tracking_uri: str) -> DatasetVersion:
    """The curated version ``data.dataset`` names (ids and names looked up in ``data.tracking_uri``,
    else the run's store)."""
    try:
        return resolve_dataset(cfg.data.dataset, cfg.data.tracking_uri or tracking_uri)
    except ValueError as err:
        raise ValueError(
            f"data.dataset={cfg.data.dataset!r}: {err} (training looks ids and names up in "
            "data.tracking_uri, default: this run's tracking.uri)"
        ) from None


def run_pretraining(cfg: PretrainConfig) -> TrainingResult:
    """Start or resume the pretraining run ``cfg`` names and train it to the end of this session."""
    return run_training(cfg)


def run_distillation(cfg: DistillConfig) -> TrainingResult:
    """Start or resume the distillation run ``cfg`` names and train it to the end of this session."""
    return run_training(cfg)


def run_training(cfg: TrainConfig) -> TrainingResult:
    """Start or resume the run ``cfg`` names (see the module docstring) and train it to the
    end of this session."""
    started = time.time()
    cfg.validate()
    cfg = absolutize(cfg)
    if not cfg.run_name:  # the default name digests the weight files: check them before reading them
        check_weight_files(cfg, resuming=False)
        cfg = with_run_name(cfg, weight_digests(cfg))
    fs, storage_root = storage.resolve(cfg.storage_path)
    run_dir = storage.to_uri(fs, storage.join(storage_root, cfg.run_name))
    tracking_uri = resolve_tracking_uri(cfg.tracking.uri, cfg.storage_path)
    record, dataset, shards, weights = _inputs(cfg, run_dir, tracking_uri)
    sampling = check_sampling(cfg.data.sampling, record["dataset"]["uri"] if record else dataset.uri, shards[0])
    run_id = _start_mlflow_run(cfg, tracking_uri, record, dataset, shards, weights, sampling)
    record = _write_record(cfg, run_dir, record or _new_record(cfg, dataset, shards, weights), run_id, tracking_uri)
    start_ray(cfg.ray)
    payload = {
        "objective": cfg.objective,
        "config": config_to_dict(cfg),
        "shards": list(record["dataset"]["shards"]),
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
    return _finish(cfg, result, run_dir, record, started)


def _inputs(cfg: TrainConfig, run_dir: str, tracking_uri: str) -> tuple[dict | None, DatasetVersion, tuple, dict]:
    """The run's record (None for a new run, checked against ``cfg`` for a resumed one), the
    dataset version ``data.dataset`` names, the shards to stream (a resumed run: its own) and
    the weight files' digests (setting -> sha256), each file checked against its model."""
    record = _read_record(storage.resolve(run_dir)[0], run_dir)
    check_weight_files(cfg, resuming=record is not None)
    weights = weight_digests(cfg, record.get("weights") if record else None)
    dataset = _dataset_version(cfg, tracking_uri)
    if record is not None:
        _check_resumable(cfg, record, identity_digest(cfg), dataset.id, weights)
        shards = tuple(record["dataset"]["shards"])
    else:
        shards = dataset.shards
    if not shards:
        raise ValueError(f"dataset {dataset.id} ({dataset.uri}) has no shards")
    return record, dataset, shards, weights


def _new_record(cfg: TrainConfig, dataset: DatasetVersion, shards: tuple, weights: dict[str, str]) -> dict:
    return {
        "identity_digest": identity_digest(cfg),
        "identity": identity_dict(cfg),
        "weights": weights,
        "created": time.time(),
        "dataset": {
            "id": dataset.id,
            "name": dataset.name,
            "uri": dataset.uri,
            "shards": list(shards),
            "num_samples": dataset.num_samples,
        },
    }


def _write_record(cfg: TrainConfig, run_dir: str, record: dict, run_id: str, tracking_uri: str) -> dict:
    """``run.json`` (with this session's MLflow run and store) and the session's ``config.yaml``."""
    fs, root = storage.resolve(run_dir)
    record.update(mlflow_run_id=run_id, tracking_uri=tracking_uri)
    storage.atomic_write_bytes(fs, storage.join(root, RUN_RECORD), json.dumps(record, indent=2).encode())
    storage.atomic_write_bytes(fs, storage.join(root, "config.yaml"), dump_config(cfg).encode())
    return record


def _trainer(cfg: TrainConfig, payload: dict):
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


def _recorded_identity(cfg: TrainConfig, record: dict) -> dict:
    """The run's recorded settings, with settings added to the code since then at their
    defaults (so a new option does not make every older run unresumable)."""
    try:
        return identity_dict(from_dict(type(cfg), record["identity"]))
    except ValueError:  # a recorded setting no longer exists: compare as recorded
        return record["identity"]


def _check_resumable(
    cfg: TrainConfig, record: dict, digest: str, dataset_id: str, weights: dict[str, str] | None = None
) -> None:
    """A resumed run has the recorded settings, weight files and dataset version, else a ``ValueError``."""
    ours = identity_dict(cfg)
    if record["identity_digest"] != digest and _recorded_identity(cfg, record) != ours:
        changed = sorted(_diff(_recorded_identity(cfg, record), ours))
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
    recorded = record.get("weights", {})
    for setting in sorted(set(recorded) | set(weights or {})):
        was, now = recorded.get(setting, "not set"), (weights or {}).get(setting, "not set")
        if was != now:
            raise ValueError(
                f"{setting}: run {cfg.run_name!r} started from a file of sha256 {was}, this one is {now}; "
                "resume it with its own file, or choose a new run_name"
            )


def _diff(a, b, prefix: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = set()
        for key in set(a) | set(b):
            out |= _diff(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return set() if a == b else {prefix.rstrip(".")}


def _start_mlflow_run(
    cfg: TrainConfig,
    tracking_uri: str,
    record: dict | None,
    dataset,
    shards,
    weights: dict[str, str],
    sampling: str | None,
) -> str:
    """The run's MLflow run (created, or the recorded one resumed); ``sampling``: the policy's
    description, tagged ``data.sampling`` on a new run."""
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
            "humanvision.stage": cfg.objective,
            "training.run_name": cfg.run_name,
            "model.name": cfg.model,
            "config.identity_digest": identity_digest(cfg),
            "dataset.id": dataset.id,
            "dataset.name": dataset.name,
            "dataset.uri": dataset.uri,
            **({"data.sampling": sampling} if sampling else {}),
        }
        run_id = client.create_run(experiment_id, run_name=cfg.tracking.run_name or cfg.run_name, tags=tags).info.run_id
    mlflow.set_tracking_uri(tracking_uri)
    with mlflow.start_run(run_id=run_id):
        if not resumed:
            log_config(cfg)
            log_params({f"{setting}_sha256": digest for setting, digest in weights.items()})
            profile = {"num_samples": dataset.num_samples, "num_shards": len(shards)}
            mlflow.log_input(make_dataset(dataset.name, dataset.id, dataset.uri, profile=profile), context="training")
        else:
            mlflow.log_text(dump_config(cfg), f"sessions/config_{int(time.time())}.yaml")
    client.update_run(run_id, status="RUNNING")
    return run_id


def _finish(cfg: TrainConfig, result, run_dir: str, record: dict, started: float) -> TrainingResult:
    """Tag and end the MLflow run with where the session stopped; the session's result."""
    tracking_uri, run_id = record["tracking_uri"], record["mlflow_run_id"]
    fs = storage.resolve(run_dir)[0]
    checkpoint_uri = result.checkpoint.path if result.checkpoint is not None else None
    if checkpoint_uri and "://" not in checkpoint_uri and not storage.is_local(fs):
        checkpoint_uri = storage.to_uri(fs, checkpoint_uri)
    history = metric_history(tracking_uri, run_id, history_keys(cfg))
    final_step = int((result.metrics or {}).get("step", 0)) or max(
        (s for s, v in history.items() if "loss" in v), default=0
    )
    manifest = _export_manifest(run_dir, final_step)
    completed = final_step >= cfg.steps
    _tag_end(tracking_uri, run_id, final_step, completed, checkpoint_uri, manifest)
    return TrainingResult(
        run_name=cfg.run_name,
        run_dir=run_dir,
        checkpoint_uri=checkpoint_uri,
        student_weights=manifest.get("export_student"),
        teacher_weights=manifest.get("export_teacher"),
        checkpoint_digest=manifest.get("export_student_sha256", ""),
        final_step=final_step,
        completed=completed,
        losses=[history[s]["loss"] for s in range(1, final_step + 1) if "loss" in history.get(s, {})],
        mlflow_run_id=run_id,
        tracking_uri=tracking_uri,
        dataset_id=record["dataset"]["id"],
        dataset_uri=record["dataset"]["uri"],
        config_digest=record["identity_digest"],
        seconds=round(time.time() - started, 3),
        history=history,
        weights=dict(record.get("weights", {})),
    )


def _export_manifest(run_dir: str, final_step: int) -> dict:
    """The export manifest of the state at ``final_step`` ({} when there is none: an export of
    an earlier end describes another state)."""
    fs, root = storage.resolve(run_dir)
    path = storage.join(root, EXPORT_DIR, EXPORT_MANIFEST)
    manifest = json.loads(storage.read_bytes(fs, path)) if storage.exists(fs, path) else {}
    return manifest if manifest.get("step") == final_step else {}


def _tag_end(
    tracking_uri: str, run_id: str, final_step: int, completed: bool, checkpoint_uri: str | None, manifest: dict
) -> None:
    from mlflow import MlflowClient

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
    client = MlflowClient(tracking_uri)
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    client.set_terminated(run_id, status="FINISHED" if completed else "KILLED")
