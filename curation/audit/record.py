"""The audit's MLflow side: log reports to the curation run, and find the runs around a version.

Reports are small HTML files logged as artifacts (``audit/...``) of the curation run that
produced the version (its id is in the output's ``_SUCCESS`` marker), so the record of a
dataset version carries its audit, and the command that explores it interactively (tag
``EXPLORE_TAG``). Runs that *used* a version are the runs that logged it as an input dataset
(``mlflow.log_input``: digest = version id) other than curation runs.
"""

from __future__ import annotations

import dataclasses
import shlex

AUDIT_DIR = "audit"
EXPLORE_TAG = "audit.explore"
# The ``humanvision.stage`` tag of the run that produced a dataset version: the DAG stage's name,
# ``curate``. Runs recorded before the tag took the stage's name say ``curation``; they are read
# as producers too until the next release, then that value goes.
PRODUCING_STAGES = ("curate", "curation")


def explore_command(uri: str, python: str = "python") -> str:
    """The command line that serves version ``uri`` in the explorer (``pipelines/explore.py``)."""
    return f"{python} pipelines/explore.py {shlex.quote(uri)}"


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


def tag_explore_command(tracking_uri: str, run_id: str, uri: str) -> str:
    """Tag the version's curation run with the command that explores it; returns the command."""
    import mlflow

    command = explore_command(uri)
    mlflow.MlflowClient(tracking_uri).set_tag(run_id, EXPLORE_TAG, command)
    return command


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
        (produced if stage in PRODUCING_STAGES else used).append(ref)
    return produced, used
