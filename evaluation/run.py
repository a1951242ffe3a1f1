"""The probe suite: ``run_probes(cfg)`` probes one frozen backbone on every configured task.

Steps: check the config and the data (user errors surface before Ray starts), resolve the
checkpoint's lineage, generate the synthetic set for tasks without data paths, train and
evaluate every probe in one Ray Train run (one worker; ``evaluation.probe_trainer.probe_worker``,
given ``evaluation.spec.worker_spec``), copy each probe's outputs to ``<output_dir>/<task>/``
and record the suite in MLflow.

MLflow record: one parent run per suite, one child run per probe. Both carry
``humanvision.stage=probe`` and the lineage tags (checkpoint path and sha256, pretraining run,
its dataset). A child holds its probe's settings (params, prefixed with the task), metrics,
the training-loss curve, ``metrics.json``, the overlays under ``overlays/`` and the probe data
versions as MLflow datasets (by digest and path). Head weights stay in the output folder (only
their path is tagged).

Outputs: ``config.yaml``, ``results.json`` (metrics per task, lineage, run ids),
``<task>/{metrics.json,history.json,head.safetensors,overlays/*.png}``, ``synthetic/``
(when used), ``feature_cache/`` and ``ray/`` (Ray Train's run folder).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
import uuid
from pathlib import Path

from evaluation.config import ProbeConfig, SplitPaths
from evaluation.features import check_grid
from evaluation.io import path_digest
from evaluation.lineage import RANDOM_INIT, Lineage, resolve_lineage
from evaluation.spec import worker_spec
from evaluation.synthetic import PART_CLASSES, generate_synthetic_set, split_paths
from evaluation.tasks import TASKS, TaskData
from infra import tracking
from infra.config import config_to_dict, dump_config

log = logging.getLogger("evaluation")
STAGE_TAG = {"humanvision.stage": "probe"}
HEADLINE = {"pose": "AP", "seg": "mIoU", "pointmap": "l2", "normal": "mean_angle", "albedo": "mae", "knn": "top1_k20"}


@dataclasses.dataclass
class ProbeRunResult:
    metrics: dict[str, dict[str, float]]  # task -> metric -> value
    output_dir: str
    lineage: Lineage
    parent_run_id: str | None = None
    child_run_ids: dict[str, str] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        lin = self.lineage
        digest = lin.checkpoint_digest if lin.checkpoint_path == RANDOM_INIT else f"sha256 {lin.checkpoint_digest[:16]}"
        lines = [f"checkpoint: {lin.checkpoint_path} ({digest})"]
        if self.lineage.pretrain_run_id:
            lines.append(f"pretraining run: {self.lineage.pretrain_run_id} (dataset {self.lineage.dataset_id or '?'})")
        for task, m in self.metrics.items():
            # The headline metric first; per-class IoUs and timings stay in results.json.
            names = sorted(
                (k for k in m if not k.startswith("iou.") and not k.endswith("seconds")),
                key=lambda k: k != HEADLINE.get(task),
            )
            lines.append(f"{task:9s} " + "  ".join(f"{k}={m[k]:.4g}" for k in names))
        lines.append(f"outputs:  {self.output_dir}")
        if self.parent_run_id:
            lines.append(f"mlflow run: {self.parent_run_id}")
        return "\n".join(lines)


def resolve_data(cfg: ProbeConfig, out: Path) -> dict[str, TaskData]:
    """Each task's data paths; tasks without paths use the synthetic set (generated once)."""
    data = {}
    for task in cfg.tasks:
        s = cfg.task(task)
        if s.train.images:
            data[task] = TaskData(
                train=s.train,
                val=s.val,
                num_classes=getattr(s, "num_classes", 0),
                class_names=list(getattr(s, "class_names", [])),
            )
            continue
        root = out / "synthetic"
        syn = cfg.synthetic
        generate_synthetic_set(
            root, train_images=syn.train_images, val_images=syn.val_images, hw=(syn.height, syn.width), seed=syn.seed
        )
        data[task] = TaskData(
            train=split_paths(root, task, "train"),
            val=split_paths(root, task, "val"),
            num_classes=len(PART_CLASSES) if task == "seg" else 0,
            class_names=list(PART_CLASSES) if task == "seg" else [],
        )
    return data


def check_inputs(cfg: ProbeConfig, data: dict[str, TaskData]) -> None:
    """Fail before Ray starts: unknown backbone, image sizes off the feature grid, weights
    that do not fit the model, malformed annotations or unpaired files."""
    from models import get_config

    stride = get_config(cfg.backbone.name).feature_stride
    for task in cfg.tasks:
        check_grid(cfg.task(task).image_size, stride, f"{task}.image_size")
        TASKS[task].datasets(cfg.task(task), data[task])
    if Path(cfg.backbone.checkpoint).is_file():
        _check_safetensors_keys(cfg.backbone.name, cfg.backbone.checkpoint, cfg.backbone.weights_prefix)


def _check_safetensors_keys(name: str, path: str, prefix: str) -> None:
    """Family, size, keys and shapes of a weights file (.safetensors header or memory-mapped
    .pt) against the named backbone, no tensor read: a Sapiens2 file given to a v1 name (or
    the wrong size) fails in one line, before Ray starts. ``models.check_weights_file``."""
    from models import check_weights_file

    check_weights_file(name, path, prefix)


def _fit(cfg: ProbeConfig, spec: dict, out: Path) -> dict[str, dict[str, float]]:
    """Run the worker under Ray Train; copy each probe's checkpoint to ``out/<task>``."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from evaluation.probe_trainer import probe_worker
    from infra.ray_runtime import start_ray

    started = not ray.is_initialized()
    # No Ray Data here: the progress-bar setting would only toggle Ray Data's bars; off, as always.
    start_ray(dataclasses.replace(cfg.ray, progress_bars="off"))
    r = cfg.ray
    try:
        trainer = TorchTrainer(
            probe_worker,
            train_loop_config=spec,
            torch_config=TorchConfig(timeout_s=r.timeout_s),
            scaling_config=ScalingConfig(
                num_workers=r.num_workers, use_gpu=r.use_gpu, resources_per_worker={"CPU": r.cpus_per_worker}
            ),
            run_config=RunConfig(
                name=f"probe-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
                storage_path=str(out / "ray"),
                checkpoint_config=CheckpointConfig(num_to_keep=None),
                failure_config=FailureConfig(max_failures=r.max_failures),
            ),
        )
        result = trainer.fit()
    finally:
        if started:
            ray.shutdown()
    metrics = {}
    for checkpoint, reported in result.best_checkpoints:
        task = reported["task"]
        if (out / task).exists():
            shutil.rmtree(out / task)
        checkpoint.to_directory(str(out / task))
        metrics[task] = {k: v for k, v in reported.items() if k != "task"}
    missing = [t for t in cfg.tasks if t not in metrics]
    if missing:
        raise RuntimeError(f"the probe worker reported no result for {missing}")
    return {t: metrics[t] for t in cfg.tasks}


def run_probes(cfg: ProbeConfig) -> ProbeRunResult:
    """Probe ``cfg.backbone`` on ``cfg.tasks``; see the module docstring."""
    cfg.validate()
    out = Path(cfg.output_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))
    uri = tracking.resolve_tracking_uri(cfg.tracking.uri, str(out)) if cfg.tracking.enabled else None
    lineage = resolve_lineage(
        cfg.backbone.checkpoint, seed=cfg.seed, pretrain_run_id=cfg.backbone.pretrain_run_id, tracking_uri=uri
    )
    data = resolve_data(cfg, out)
    check_inputs(cfg, data)
    spec = worker_spec(cfg, data, lineage, out)
    result = ProbeRunResult(metrics={}, output_dir=str(out), lineage=lineage)
    if uri is None:
        result.metrics = _fit(cfg, spec, out)
        _write_results(out, result)
        return result

    exp_id = tracking.get_experiment_id(cfg.tracking.experiment, uri)
    suite_tags = {**STAGE_TAG, **lineage.tags(), **_family_tag(cfg), "probe.role": "suite"}
    with tracking.start_run(exp_id, cfg.tracking.run_name or out.name, suite_tags) as parent:
        result.parent_run_id = parent.info.run_id
        tracking.log_config(cfg)
        result.metrics = _fit(cfg, spec, out)
        for task in cfg.tasks:
            result.child_run_ids[task] = _record_probe(cfg, task, data[task], result.metrics[task], out, lineage)
        results_file = _write_results(out, result)
        _record_suite(result.metrics, results_file)
    return result


def _family_tag(cfg: ProbeConfig) -> dict[str, str]:
    """Which model family was probed (``sapiens1`` / ``sapiens2``), from the backbone's name:
    the runs of both families sit side by side in one experiment (the papers' Table 2)."""
    from models import family_of

    return {"probe.backbone_family": family_of(cfg.backbone.name)}


def _record_probe(
    cfg: ProbeConfig, task: str, data: TaskData, metrics: dict[str, float], out: Path, lineage: Lineage
) -> str:
    """The probe's child run (see the module docstring); returns its id."""
    task_dir = out / task
    tags = {
        **STAGE_TAG,
        **lineage.tags(),
        **_family_tag(cfg),
        "probe.role": "probe",
        "probe.task": task,
        "probe.head_path": str(task_dir / "head.safetensors"),
    }
    history_file = task_dir / "history.json"
    history = json.loads(history_file.read_text()) if history_file.exists() else []
    splits = (("train", data.train), ("val", data.val))
    return tracking.log_child_run(
        f"{out.name}/{task}",
        tags,
        params=tracking.flatten(config_to_dict(cfg.task(task)), prefix=task),
        metrics=metrics,
        series={"train_loss": [(point["step"], point["loss"]) for point in history]},
        files=[str(task_dir / "metrics.json")],
        folders={"overlays": str(task_dir / "overlays")} if (task_dir / "overlays").is_dir() else {},
        datasets=[
            (tracking.make_dataset(f"probe-{task}-{split}", _split_digest(p), p.images), f"probe_{split}")
            for split, p in splits
        ],
    )


def _record_suite(metrics: dict[str, dict[str, float]], results_file: Path) -> None:
    """Every probe's metrics (``<task>.<metric>``) and ``results.json`` on the active suite run."""
    tracking.log_results({f"{task}.{k}": v for task, m in metrics.items() for k, v in m.items()}, [str(results_file)])


def _split_digest(paths: SplitPaths) -> str:
    """Version of one split: its images, labels and masks paths' digests, hashed together."""
    parts = json.dumps([path_digest(paths.images), path_digest(paths.labels), path_digest(paths.masks)])
    return hashlib.sha256(parts.encode()).hexdigest()[:16]


def _write_results(out: Path, result: ProbeRunResult) -> Path:
    path = out / "results.json"
    mlflow_ids = {"parent_run_id": result.parent_run_id, "child_run_ids": result.child_run_ids}
    path.write_text(
        json.dumps(
            {"metrics": result.metrics, "lineage": dataclasses.asdict(result.lineage), "mlflow": mlflow_ids}, indent=1
        )
    )
    return path
