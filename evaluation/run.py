"""The probe suite: ``run_probes(cfg)`` probes one frozen backbone on every configured task.

Steps: check the config and the data (user errors surface before Ray starts), resolve the
checkpoint's lineage, generate the synthetic set for tasks without data paths, train and
evaluate every probe in one Ray Train run (one worker; ``evaluation.train.probe_worker``),
copy each probe's outputs to ``<output_dir>/<task>/`` and record the suite in MLflow.

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

from evaluation.config import KnnSettings, PoseSettings, ProbeConfig, SegSettings, SplitPaths, TaskSettings
from evaluation.features import check_grid
from evaluation.io import path_digest
from evaluation.lineage import RANDOM_INIT, Lineage, resolve_lineage
from evaluation.synthetic import PART_CLASSES, generate_synthetic_set, split_paths
from evaluation.tasks import TASKS, TaskData
from infra.config import config_to_dict, dump_config, from_dict

log = logging.getLogger("evaluation")
SETTINGS_CLASSES = {"pose": PoseSettings, "seg": SegSettings, "pointmap": TaskSettings, "normal": TaskSettings,
                    "albedo": TaskSettings, "knn": KnnSettings}
HEADLINE = {"pose": "AP", "seg": "mIoU", "pointmap": "l2", "normal": "mean_angle", "albedo": "mae", "knn": "top1_k20"}


@dataclasses.dataclass
class ProbeResult:
    metrics: dict[str, dict[str, float]]   # task -> metric -> value
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
            names = sorted((k for k in m if not k.startswith("iou.") and not k.endswith("seconds")),
                           key=lambda k: k != HEADLINE.get(task))
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
            data[task] = TaskData(train=s.train, val=s.val, num_classes=getattr(s, "num_classes", 0),
                                  class_names=list(getattr(s, "class_names", [])))
            continue
        root = out / "synthetic"
        syn = cfg.synthetic
        generate_synthetic_set(root, train_images=syn.train_images, val_images=syn.val_images,
                               hw=(syn.height, syn.width), seed=syn.seed)
        data[task] = TaskData(train=split_paths(root, task, "train"), val=split_paths(root, task, "val"),
                              num_classes=len(PART_CLASSES) if task == "seg" else 0,
                              class_names=list(PART_CLASSES) if task == "seg" else [])
    return data


def check_inputs(cfg: ProbeConfig, data: dict[str, TaskData]) -> None:
    """Fail before Ray starts: unknown backbone, image sizes off the feature grid, weights
    that do not fit the model, malformed annotations or unpaired files."""
    from models import get_config

    stride = get_config(cfg.backbone.name).feature_stride
    for task in cfg.tasks:
        check_grid(cfg.task(task).image_size, stride, f"{task}.image_size")
        TASKS[task].datasets(cfg.task(task), data[task])
    if cfg.backbone.checkpoint.endswith(".safetensors") and Path(cfg.backbone.checkpoint).is_file():
        _check_safetensors_keys(cfg.backbone.name, cfg.backbone.checkpoint, cfg.backbone.weights_prefix)


def _check_safetensors_keys(name: str, path: str, prefix: str) -> None:
    """Key and shape check from the file header alone (no tensor is read)."""
    import torch
    from safetensors import safe_open

    from models import build_backbone
    from models.io import check_state_dict

    with safe_open(path, framework="pt") as f:
        shapes = {k[len(prefix):]: f.get_slice(k).get_shape() for k in f.keys() if k.startswith(prefix)}
    check_state_dict(build_backbone(name, device="meta"), {k: torch.empty(s, device="meta") for k, s in shapes.items()})


def worker_spec(cfg: ProbeConfig, data: dict[str, TaskData], lineage: Lineage, out: Path) -> dict:
    """Everything the Ray Train worker needs, as plain data."""
    bb = cfg.backbone
    tasks = []
    for task in cfg.tasks:
        d = data[task]
        cache_id = {"backbone": bb.name, "weights": lineage.checkpoint_digest, "dtype": bb.dtype,
                    "images": [path_digest(d.train.images), path_digest(d.val.images)]}
        tasks.append({"name": task, "settings": config_to_dict(cfg.task(task)), "data": dataclasses.asdict(d),
                      "cache_id": cache_id})
    return {"backbone": {"name": bb.name, "checkpoint": bb.checkpoint, "weights_prefix": bb.weights_prefix,
                         "dtype": bb.dtype},
            "seed": cfg.seed, "cache_dir": str(out / "feature_cache"), "tasks": tasks}


def settings_from_spec(item: dict) -> tuple[TaskSettings, TaskData]:
    settings = from_dict(SETTINGS_CLASSES[item["name"]], item["settings"])
    d = item["data"]
    return settings, TaskData(train=SplitPaths(**d["train"]), val=SplitPaths(**d["val"]),
                              num_classes=d["num_classes"], class_names=d["class_names"])


def _fit(cfg: ProbeConfig, spec: dict, out: Path) -> dict[str, dict[str, float]]:
    """Run the worker under Ray Train; copy each probe's checkpoint to ``out/<task>``."""
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from evaluation.train import probe_worker
    from infra.ray_runtime import init_ray

    started = not ray.is_initialized()
    init_ray(cfg.ray.address, cfg.ray.num_cpus, "off", cfg.ray.object_store_memory, cfg.ray.temp_dir)
    try:
        trainer = TorchTrainer(
            probe_worker, train_loop_config=spec,
            scaling_config=ScalingConfig(num_workers=1, use_gpu=cfg.ray.use_gpu,
                                         resources_per_worker={"CPU": cfg.ray.cpus_per_worker}),
            run_config=RunConfig(name=f"probe-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
                                 storage_path=str(out / "ray"), checkpoint_config=CheckpointConfig(num_to_keep=None)))
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


def run_probes(cfg: ProbeConfig) -> ProbeResult:
    """Probe ``cfg.backbone`` on ``cfg.tasks``; see the module docstring."""
    from infra import tracking as infra_tracking

    cfg.validate()
    out = Path(cfg.output_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))
    uri = infra_tracking.resolve_tracking_uri(cfg.tracking.uri, str(out)) if cfg.tracking.enabled else None
    lineage = resolve_lineage(cfg.backbone.checkpoint, seed=cfg.seed, pretrain_run_id=cfg.backbone.pretrain_run_id,
                              tracking_uri=uri)
    data = resolve_data(cfg, out)
    check_inputs(cfg, data)
    spec = worker_spec(cfg, data, lineage, out)
    result = ProbeResult(metrics={}, output_dir=str(out), lineage=lineage)
    if uri is None:
        result.metrics = _fit(cfg, spec, out)
        _write_results(out, result)
        return result

    from evaluation import tracking

    exp_id = infra_tracking.get_experiment_id(cfg.tracking.experiment, uri)
    with tracking.start_suite_run(exp_id, cfg.tracking.run_name or out.name, lineage.tags()) as parent:
        result.parent_run_id = parent.info.run_id
        infra_tracking.log_config(cfg)
        result.metrics = _fit(cfg, spec, out)
        for task in cfg.tasks:
            d = data[task]
            versions = {split: (p.images, _split_digest(p)) for split, p in (("train", d.train), ("val", d.val))}
            result.child_run_ids[task] = tracking.log_probe_run(
                task, cfg.task(task), result.metrics[task], out / task, f"{out.name}/{task}", lineage.tags(), versions)
        results_file = _write_results(out, result)
        tracking.log_suite_summary(result.metrics, results_file)
    return result


def _split_digest(paths: SplitPaths) -> str:
    """Version of one split: its images, labels and masks paths' digests, hashed together."""
    parts = json.dumps([path_digest(paths.images), path_digest(paths.labels), path_digest(paths.masks)])
    return hashlib.sha256(parts.encode()).hexdigest()[:16]


def _write_results(out: Path, result: ProbeResult) -> Path:
    path = out / "results.json"
    mlflow_ids = {"parent_run_id": result.parent_run_id, "child_run_ids": result.child_run_ids}
    path.write_text(json.dumps({"metrics": result.metrics, "lineage": dataclasses.asdict(result.lineage),
                                "mlflow": mlflow_ids}, indent=1))
    return path
