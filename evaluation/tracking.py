"""The probe suite's MLflow record: one parent run per suite, one child run per probe.

Both carry ``humanvision.stage=probe`` and the lineage tags (checkpoint path and sha256,
pretraining run, its dataset). A child holds its probe's settings (params, prefixed with
the task), metrics, the training-loss curve, ``metrics.json``, the overlays under
``overlays/`` and the probe data versions as MLflow datasets (by digest and path). Head
weights stay in the output folder (only their path is tagged).
"""
from __future__ import annotations

import json
from pathlib import Path

from infra import tracking
from infra.config import config_to_dict

STAGE_TAG = {"humanvision.stage": "probe"}


def start_suite_run(experiment_id: str, run_name: str, tags: dict[str, str]):
    import mlflow

    return mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags={**STAGE_TAG, **tags,
                                                                                  "probe.role": "suite"})


def log_probe_run(task: str, settings, metrics: dict[str, float], task_dir: Path, run_name: str,
                  tags: dict[str, str], data_versions: dict[str, tuple[str, str]]) -> str:
    """A child of the active suite run; returns its id. ``data_versions``: split -> (path, digest)."""
    import mlflow

    # nested=True alone would file the child under the default experiment, not the parent's.
    with mlflow.start_run(experiment_id=mlflow.active_run().info.experiment_id, run_name=run_name, nested=True,
                          tags={**STAGE_TAG, **tags, "probe.role": "probe", "probe.task": task,
                                "probe.head_path": str(task_dir / "head.safetensors")}) as run:
        params = tracking.flatten(config_to_dict(settings), prefix=task)
        mlflow.log_params({k: v[:6000] for k, v in params.items()})
        mlflow.log_metrics(_finite(metrics))
        history = json.loads((task_dir / "history.json").read_text()) if (task_dir / "history.json").exists() else []
        for point in history:
            mlflow.log_metric("train_loss", point["loss"], step=point["step"])
        mlflow.log_artifact(str(task_dir / "metrics.json"))
        if (task_dir / "overlays").is_dir():
            mlflow.log_artifacts(str(task_dir / "overlays"), "overlays")
        for split, (path, digest) in data_versions.items():
            dataset = tracking.make_dataset(f"probe-{task}-{split}", digest, path)
            mlflow.log_input(dataset, context=f"probe_{split}")
        return run.info.run_id


def log_suite_summary(metrics: dict[str, dict[str, float]], results_file: Path) -> None:
    import mlflow

    mlflow.log_metrics(_finite({f"{task}.{k}": v for task, m in metrics.items() for k, v in m.items()}))
    mlflow.log_artifact(str(results_file))


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}
