"""The MLflow run of an annotation version (``infra.tracking``): the resolved config as params,
counts and throughput as metrics, lineage tags (the dataset version, each model's sha256, the
annotation version id), the dataset version as the run's input, and small artifacts only (the
counts and the gallery page; the annotation shards stay in storage, named by URI).

A re-run of a finished version finds its run by the ``annotate.version_id`` tag instead of
logging a second one.
"""

from __future__ import annotations

import os
from typing import Any

STAGE_TAG = "annotate"
GALLERY_ARTIFACT_DIR = "gallery"


def run_tags(job: Any) -> dict[str, str]:
    """Lineage of the annotations: what they were made from, by content."""
    tags = {
        "lineage.dataset_id": job.version.id,
        "lineage.dataset_uri": job.version.uri,
        "lineage.curation_run_id": job.version.run_id or "",
        "annotate.output": job.uri,
        "annotate.tasks": ",".join(job.infos),
    }
    for task, info in job.infos.items():
        tags[f"annotate.{task}.model"] = info.name
        tags[f"annotate.{task}.checkpoint_sha256"] = info.sha256
        if info.onnx:
            tags[f"annotate.{task}.onnx_sha256"] = info.onnx_sha256
    return tags


def _log_gallery(gallery: str) -> None:
    """The page as an artifact, linked from the run (a tag and the run's description)."""
    import mlflow

    mlflow.log_artifact(gallery, GALLERY_ARTIFACT_DIR)
    artifact = f"{GALLERY_ARTIFACT_DIR}/{os.path.basename(gallery)}"
    uri = mlflow.get_artifact_uri(artifact)
    mlflow.set_tags(
        {
            "annotate.gallery": artifact,
            "annotate.gallery_uri": uri,
            "mlflow.note.content": f"Predictions drawn on a few samples: [{artifact}]({uri}) (artifact `{artifact}`)",
        }
    )


def record_run(job: Any, stats: dict, gallery: str | None) -> str | None:
    """Log (or find, when an earlier attempt logged it) the run of ``job``'s annotation version."""
    if job.tracking_uri is None:
        return None
    import mlflow

    from infra import tracking

    exp = tracking.get_experiment_id(job.cfg.tracking.experiment, job.tracking_uri)
    tags = {"humanvision.stage": STAGE_TAG, "annotate.version_id": job.version_id}
    existing = tracking.find_run(exp, tags)
    if existing:
        return existing
    name = job.cfg.tracking.run_name or job.cfg.name
    with tracking.start_run(exp, name, tags) as run:
        tracking.log_config(job.cfg)
        mlflow.log_metrics(tracking.finite_metrics(stats))
        mlflow.set_tags(run_tags(job))
        mlflow.log_dict({**stats, "annotation_version_id": job.version_id}, "annotate_stats.json")
        v = job.version
        mlflow.log_input(tracking.make_dataset(v.name, v.id, v.uri), context="annotation_input")
        if gallery:
            _log_gallery(gallery)
        return run.info.run_id
