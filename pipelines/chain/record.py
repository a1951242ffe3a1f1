"""The MLflow record of one DAG invocation: a parent run, each stage's run made its child with
the stage's identity and the upstream lineage as tags, and a small pointer run for a stage
that was reused."""

from __future__ import annotations

from typing import Any

from infra.tracking import get_experiment_id


class ParentRun:
    """``tags``: more tags of the parent run (a sweep makes it a child of its own run)."""

    def __init__(
        self, uri: str, experiment: str, run_name: str, stages: list[str], tags: dict[str, str] | None = None
    ) -> None:
        from mlflow import MlflowClient

        self.uri = uri
        self.client = MlflowClient(uri)
        self.experiment_id = get_experiment_id(experiment, uri)
        tags = {"humanvision.stage": "dag", "dag.stages": ",".join(stages), **(tags or {})}
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id

    def _stage_tags(self, stage: str, identity: str, lineage: dict[str, Any]) -> dict[str, str]:
        return {
            "mlflow.parentRunId": self.run_id,
            "dag.stage": stage,
            "dag.identity": identity,
            **{f"lineage.{k}": str(v) for k, v in lineage.items()},
        }

    def adopt(self, stage: str, identity: str, stage_run_id: str, lineage: dict[str, Any]) -> None:
        """Make the run a stage just produced this invocation's child."""
        for key, value in {**self._stage_tags(stage, identity, lineage), "dag.parent_run_id": self.run_id}.items():
            self.client.set_tag(stage_run_id, key, value)

    def point_to_reused(self, stage: str, identity: str, stage_run_id: str, lineage: dict[str, Any]) -> None:
        """A child run standing for a reused stage: it names the run that produced the result."""
        tags = {**self._stage_tags(stage, identity, lineage), "dag.reused": "true", "dag.reused_run_id": stage_run_id}
        run = self.client.create_run(self.experiment_id, run_name=f"{stage} (reused)", tags=tags)
        self.client.set_terminated(run.info.run_id)

    def note_stage(self, stage: str, identity: str, reused: bool) -> None:
        self.client.set_tag(self.run_id, f"dag.{stage}.identity", identity)
        self.client.set_tag(self.run_id, f"dag.{stage}.reused", str(reused).lower())

    def finish(self, lineage: dict[str, Any], status: str) -> None:
        for key, value in lineage.items():
            self.client.set_tag(self.run_id, f"lineage.{key}", str(value))
        self.client.set_terminated(self.run_id, status=status)
