"""What the probe suite's Ray Train worker is given: the backbone, the seed, the feature cache
and every task's settings and data paths, as plain data (``worker_spec`` on the driver,
``settings_from_spec`` in the worker, ``evaluation.probe_trainer.probe_worker``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from evaluation.config import KnnConfig, ProbeConfig, ProbePoseConfig, ProbeSegConfig, ProbeTaskConfig, SplitPaths
from evaluation.io import path_digest
from evaluation.lineage import Lineage
from evaluation.tasks import TaskData
from infra.config import config_to_dict, from_dict

SETTINGS_CLASSES = {
    "pose": ProbePoseConfig,
    "seg": ProbeSegConfig,
    "pointmap": ProbeTaskConfig,
    "normal": ProbeTaskConfig,
    "albedo": ProbeTaskConfig,
    "knn": KnnConfig,
}


def worker_spec(cfg: ProbeConfig, data: dict[str, TaskData], lineage: Lineage, out: Path) -> dict:
    """Everything the Ray Train worker needs, as plain data."""
    bb = cfg.backbone
    tasks = []
    for task in cfg.tasks:
        d = data[task]
        cache_id = {
            "backbone": bb.name,
            "weights": lineage.checkpoint_digest,
            "dtype": bb.dtype,
            "images": [path_digest(d.train.images), path_digest(d.val.images)],
        }
        tasks.append(
            {
                "name": task,
                "settings": config_to_dict(cfg.task(task)),
                "data": dataclasses.asdict(d),
                "cache_id": cache_id,
            }
        )
    return {
        "backbone": {
            "name": bb.name,
            "checkpoint": bb.checkpoint,
            "weights_prefix": bb.weights_prefix,
            "dtype": bb.dtype,
        },
        "seed": cfg.seed,
        "cache_dir": str(out / "feature_cache"),
        "tasks": tasks,
    }


def settings_from_spec(item: dict) -> tuple[ProbeTaskConfig, TaskData]:
    settings = from_dict(SETTINGS_CLASSES[item["name"]], item["settings"])
    d = item["data"]
    return settings, TaskData(
        train=SplitPaths(**d["train"]),
        val=SplitPaths(**d["val"]),
        num_classes=d["num_classes"],
        class_names=d["class_names"],
    )
