"""``run_finetune(cfg)``: fine-tune a backbone end to end on every task of ``cfg.tasks``.

Steps: check the config, the backbone and every label file against its vocabulary (errors
before Ray starts), resolve the checkpoint's lineage (pretraining run, dataset version),
then per task one Ray Train run (``evaluation.finetune.loop.finetune_worker``) in
``<output_dir>/<task>/``: re-running the same config resumes each unfinished task from its
newest DCP checkpoint (Ray Train's run ``train`` there) and skips finished ones.

MLflow: one run per fine-tune (``humanvision.stage=finetune``), kept across sessions
(``run.json``): params, per-step ``<task>.loss/lr/grad_norm``, final ``<task>.<metric>``,
lineage tags (``lineage.*``: checkpoint path and sha256, pretraining run, dataset version) and
per task ``finetune.<task>.export`` / ``.export_sha256`` (the exported model's sha256).

Outputs: ``config.yaml``, ``run.json``, ``results.json`` (metrics, exports, lineage, run id),
``<task>/{history.jsonl,metrics.json,overlays/,export/model.safetensors,export/export.json,train/}``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from evaluation.features import check_grid
from evaluation.finetune.config import FinetuneConfig
from evaluation.finetune.loop import EXPORT_DIR, EXPORT_MANIFEST, HISTORY
from evaluation.finetune.tasks import TaskInputs, check_labels, resolve_inputs
from evaluation.lineage import Lineage, resolve_lineage
from infra import jsonl, storage, tracking
from infra.config import config_digest, config_to_dict, dump_config

RUN_RECORD = "run.json"
RESULTS = "results.json"
STAGE_TAG = {"humanvision.stage": "finetune"}
NOT_IDENTITY = ("output_dir", "tracking", "ray", "name", "max_steps_this_session", "loader_workers")


@dataclasses.dataclass
class FinetuneRunResult:
    metrics: dict[str, dict[str, float]]
    exports: dict[str, dict[str, str]]  # task -> {"export": path, "export_sha256": hex}
    losses: dict[str, dict[int, float]]  # task -> step -> loss (the last logged value of each step)
    output_dir: str
    lineage: Lineage
    run_id: str | None
    completed: bool

    def summary(self) -> str:
        lines = [f"checkpoint: {self.lineage.checkpoint_path} ({self.lineage.checkpoint_digest[:16]})"]
        for task, m in self.metrics.items():
            shown = {k: v for k, v in m.items() if not k.startswith("iou.")}
            lines.append(f"{task:9s} " + "  ".join(f"{k}={v:.4g}" for k, v in shown.items()))
            lines.append(
                f"{'':9s} export {self.exports[task]['export']} (sha256 {self.exports[task]['export_sha256'][:16]})"
            )
        lines.append(f"outputs:  {self.output_dir}" + (f"   mlflow run: {self.run_id}" if self.run_id else ""))
        return "\n".join(lines)


def identity_digest(cfg: FinetuneConfig) -> str:
    """The settings that decide the trajectory (not where it goes or how many steps this session)."""
    d = config_to_dict(cfg)
    for key in NOT_IDENTITY:
        d.pop(key, None)
    d["backbone"].pop("pretrain_run_id", None)
    return config_digest(d)


def absolutize(cfg: FinetuneConfig) -> FinetuneConfig:
    """Local paths absolute: Ray Train workers (and Ray jobs) run elsewhere."""
    changes = {
        "output_dir": storage.local_path(cfg.output_dir),
        "backbone": dataclasses.replace(cfg.backbone, checkpoint=storage.local_path(cfg.backbone.checkpoint)),
        "augment": dataclasses.replace(cfg.augment, backgrounds=storage.local_path(cfg.augment.backgrounds)),
    }
    for task in cfg.tasks:
        s = cfg.task(task)
        splits = {
            k: dataclasses.replace(
                getattr(s, k),
                **{f: storage.local_path(getattr(getattr(s, k), f)) for f in ("images", "labels", "masks")},
            )
            for k in ("train", "val")
        }
        if task == "pose":
            splits["person_boxes"] = storage.local_path(s.person_boxes)
        changes[task] = dataclasses.replace(s, **splits)
    return dataclasses.replace(cfg, **changes)


def manifest_person_boxes(cfg: FinetuneConfig, out: Path) -> FinetuneConfig:
    """``pose.person_boxes`` naming a curated dataset folder: its manifest's detector boxes
    (``person_boxes`` / ``person_scores``) for the validation images, written as a COCO
    detections file under ``out/pose`` that the config then names."""
    from curation.output import CuratedOutput
    from evaluation.finetune.pose_eval import detections_from_manifest

    boxes = cfg.pose.person_boxes
    if "pose" not in cfg.tasks or not boxes or not Path(boxes).is_dir():
        return cfg
    rows = CuratedOutput.at(boxes).read_manifest(columns=["source", "person_boxes", "person_scores"]).to_pylist()
    images = json.loads(Path(cfg.pose.val.labels).read_text())["images"]
    dets = detections_from_manifest(rows, images, cfg.pose.box_score_threshold)
    if not dets:
        raise ValueError(
            f"pose.person_boxes={boxes!r}: no manifest row's source file matches an image of {cfg.pose.val.labels}"
        )
    path = out / "pose" / "person_boxes.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dets))
    return dataclasses.replace(cfg, pose=dataclasses.replace(cfg.pose, person_boxes=str(path)))


def check_inputs(cfg: FinetuneConfig, inputs: dict[str, TaskInputs]) -> None:
    """Everything that can be wrong before training: image sizes off the feature grid, weights
    that do not fit the backbone, label files that do not fit their vocabulary."""
    from evaluation.finetune.augment import Backgrounds
    from models import check_weights_file, get_config

    stride = get_config(cfg.backbone.name).feature_stride
    Backgrounds(cfg.augment.backgrounds)
    bb = cfg.backbone
    if Path(bb.checkpoint).is_file():  # family, size, keys and shapes, from the header alone
        check_weights_file(bb.name, bb.checkpoint, bb.weights_prefix)
    for task in cfg.tasks:
        check_grid(cfg.task(task).image_size, stride, f"{task}.image_size")
        check_labels(task, inputs[task], getattr(cfg.task(task), "ignore_index", 255))


def _record(cfg: FinetuneConfig, out: Path, uri: str | None, lineage: Lineage) -> dict:
    """``run.json``: the identity and MLflow run of this output folder (created once)."""
    path = out / RUN_RECORD
    digest = identity_digest(cfg)
    if path.is_file():
        record = json.loads(path.read_text())
        if record["identity_digest"] != digest or record["checkpoint_digest"] != lineage.checkpoint_digest:
            raise ValueError(
                f"output_dir {out} holds a fine-tune with other settings or another checkpoint; "
                "re-run it with its own settings, or choose a new output_dir"
            )
        return record
    record = {
        "identity_digest": digest,
        "checkpoint_digest": lineage.checkpoint_digest,
        "created": time.time(),
        "mlflow_run_id": _start_mlflow(cfg, out, uri, lineage) if uri else None,
        "tracking_uri": uri,
    }
    path.write_text(json.dumps(record, indent=1))
    return record


def _start_mlflow(cfg: FinetuneConfig, out: Path, uri: str, lineage: Lineage) -> str:
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(uri)
    exp = tracking.get_experiment_id(cfg.tracking.experiment, uri)
    tags = {
        **STAGE_TAG,
        **lineage.tags(),
        "finetune.tasks": ",".join(cfg.tasks),
        "model.name": cfg.backbone.name,
        "config.identity_digest": identity_digest(cfg),
    }
    with tracking.start_run(exp, cfg.tracking.run_name or out.name, tags) as run:
        tracking.log_config(cfg)
        run_id = run.info.run_id
    MlflowClient(uri).update_run(run_id, status="RUNNING")
    return run_id


def _payload(cfg: FinetuneConfig, task: str, inputs: TaskInputs, out: Path, record: dict, lineage: Lineage) -> dict:
    vocab = inputs.vocab.name if inputs.vocab is not None else ""
    meta = {
        "pretrain_run_id": lineage.pretrain_run_id,
        "dataset_id": lineage.dataset_id,
        "backbone_checkpoint_sha256": lineage.checkpoint_digest,
        "vocab": vocab,
    }
    return {
        "config": config_to_dict(cfg),
        "task": task,
        "data": dataclasses.asdict(inputs.data),
        "vocab": vocab,
        "task_dir": str(out / task),
        "mlflow_run_id": record.get("mlflow_run_id"),
        "tracking_uri": record.get("tracking_uri"),
        "meta": meta,
    }


def _fit_task(cfg: FinetuneConfig, payload: dict) -> None:
    """One task's Ray Train run (resumed from its newest checkpoint); what it ends with is
    read back from the task folder (``finished_task``)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from evaluation.finetune.loop import finetune_worker

    r = cfg.ray
    resources = {"CPU": r.cpus_per_worker, **({"GPU": 1} if r.use_gpu else {})}
    trainer = TorchTrainer(
        finetune_worker,
        train_loop_config=payload,
        torch_config=TorchConfig(backend="nccl" if r.use_gpu else "gloo", timeout_s=r.timeout_s),
        scaling_config=ScalingConfig(num_workers=r.num_workers, use_gpu=r.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name="train",
            storage_path=payload["task_dir"],
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            failure_config=FailureConfig(max_failures=r.max_failures),
        ),
    )
    trainer.fit()


def task_losses(task_dir: Path) -> dict[int, float]:
    """Step -> loss from ``history.jsonl`` (a replayed step keeps its latest value)."""
    return {row["step"]: row["loss"] for row in jsonl.read(task_dir / HISTORY) if "step" in row}


def finished_task(task_dir: Path, steps: int) -> dict | None:
    """A task's metrics and export when it has reached ``steps`` (else None)."""
    manifest, metrics = task_dir / EXPORT_DIR / EXPORT_MANIFEST, task_dir / "metrics.json"
    if not (manifest.is_file() and metrics.is_file()):
        return None
    export = json.loads(manifest.read_text())
    if export.get("step") != steps:
        return None
    return {"metrics": json.loads(metrics.read_text()), "export": {k: export[k] for k in ("export", "export_sha256")}}


def run_finetune(cfg: FinetuneConfig) -> FinetuneRunResult:
    """Fine-tune ``cfg.backbone`` on ``cfg.tasks``; see the module docstring."""
    from infra.ray_runtime import start_ray

    cfg.validate()
    cfg = absolutize(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = manifest_person_boxes(cfg, out)
    uri = tracking.resolve_tracking_uri(cfg.tracking.uri, str(out)) if cfg.tracking.enabled else None
    lineage = resolve_lineage(
        cfg.backbone.checkpoint, seed=cfg.seed, pretrain_run_id=cfg.backbone.pretrain_run_id, tracking_uri=uri
    )
    inputs = resolve_inputs(cfg, out)
    check_inputs(cfg, inputs)
    (out / "config.yaml").write_text(dump_config(cfg))
    record = _record(cfg, out, uri, lineage)
    start_ray(dataclasses.replace(cfg.ray, progress_bars="off"))
    done = {}
    try:
        for task in cfg.tasks:
            (out / task).mkdir(exist_ok=True)
            done[task] = finished_task(out / task, cfg.steps)
            if done[task] is None:
                _fit_task(cfg, _payload(cfg, task, inputs[task], out, record, lineage))
                done[task] = finished_task(out / task, cfg.steps)  # None: this session stopped early
    except BaseException:
        if record.get("mlflow_run_id"):
            tracking.end_run(uri, record["mlflow_run_id"], "FAILED")
        raise
    return _finish(cfg, out, record, lineage, done)


def _finish(cfg: FinetuneConfig, out: Path, record: dict, lineage: Lineage, done: dict) -> FinetuneRunResult:
    finished = {t: d for t, d in done.items() if d is not None}
    result = FinetuneRunResult(
        metrics={t: d["metrics"] for t, d in finished.items()},
        exports={t: d["export"] for t, d in finished.items()},
        losses={t: task_losses(out / t) for t in cfg.tasks},
        output_dir=str(out),
        lineage=lineage,
        run_id=record.get("mlflow_run_id"),
        completed=len(finished) == len(cfg.tasks),
    )
    results_file = out / RESULTS
    results_file.write_text(
        json.dumps(
            {
                "metrics": result.metrics,
                "exports": result.exports,
                "lineage": dataclasses.asdict(lineage),
                "mlflow_run_id": result.run_id,
                "completed": result.completed,
            },
            indent=1,
        )
    )
    if result.run_id:
        _record_mlflow(record["tracking_uri"], result, results_file)
    return result


def _record_mlflow(uri: str, result: FinetuneRunResult, results_file: Path) -> None:
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    for task, export in result.exports.items():
        client.set_tag(result.run_id, f"finetune.{task}.export", export["export"])
        client.set_tag(result.run_id, f"finetune.{task}.export_sha256", export["export_sha256"])
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(run_id=result.run_id):
        tracking.log_results(
            {f"{t}.{k}": v for t, m in result.metrics.items() for k, v in m.items()}, [str(results_file)]
        )
    client.set_terminated(result.run_id, status="FINISHED" if result.completed else "KILLED")
