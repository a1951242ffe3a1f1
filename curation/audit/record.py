"""The audit's MLflow side: log reports to the curation run, and find the runs around a version.

Reports are small HTML files logged as artifacts (``audit/...``) of the curation run that
produced the version (its id is in the output's ``_SUCCESS`` marker), so the record of a
dataset version carries its audit. Runs that *used* a version are the runs that logged it as
an input dataset (``mlflow.log_input``: digest = version id) other than curation runs.
"""

from __future__ import annotations

import dataclasses

AUDIT_DIR = "audit"


@dataclasses.dataclass(frozen=True)
class RunRef:
    run_id: str
    experiment: str
    name: str
    stage: str
    status: str


def log_report(tracking_uri: str, run_id: str, path: str, tag: str) -> str:
    """Log ``path`` under ``audit/`` of the run; tag the run with where it is. Returns the artifact path."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    client.log_artifact(run_id, path, AUDIT_DIR)
    artifact = f"{AUDIT_DIR}/{path.replace(chr(92), '/').rsplit('/', 1)[-1]}"
    client.set_tag(run_id, tag, artifact)
    return artifact


def runs_of_version(tracking_uri: str, dataset_id: str) -> tuple[list[RunRef], list[RunRef]]:
    """(curation runs that produced the version, other runs that logged it as an input)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    if not experiments:
        return [], []
    seen: dict[str, object] = {}
    for query in (f"tags.`dataset.id` = '{dataset_id}'", f"datasets.digest = '{dataset_id}'"):
        for run in client.search_runs(list(experiments), filter_string=query, order_by=["attributes.start_time ASC"]):
            seen.setdefault(run.info.run_id, run)
    produced, used = [], []
    for run in seen.values():
        stage = run.data.tags.get("humanvision.stage", "")
        ref = RunRef(
            run.info.run_id,
            experiments.get(run.info.experiment_id, run.info.experiment_id),
            run.data.tags.get("mlflow.runName", ""),
            stage,
            run.info.status,
        )
        (produced if stage == "curation" else used).append(ref)
    return produced, used
