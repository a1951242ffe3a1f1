"""Where a probed backbone came from: its checkpoint (path and sha256), the pretraining run
that produced it and that run's dataset version.

The pretraining stage tags its MLflow run with ``checkpoint.digest`` (and ``dataset.id``,
``dataset.uri``, ``checkpoint.student``). Given a run id, its tags are read; otherwise the
run is looked up across all experiments by the checkpoint's digest (a tag holding the full
sha256, ``sha256:<hex>``, or a prefix of at least 12 hex digits matches).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from infra.digests import sha256_file

log = logging.getLogger("evaluation")
RANDOM_INIT = "random-init"
MIN_DIGEST_PREFIX = 12


@dataclass
class Lineage:
    checkpoint_path: str  # RANDOM_INIT for a randomly initialised backbone
    checkpoint_digest: str  # sha256 hex, or "random-init:seed=<seed>"
    pretrain_run_id: str = ""
    dataset_id: str = ""
    dataset_uri: str = ""
    source: str = ""  # how the pretraining run was found: given / digest / none
    digest_matches_run: bool | None = None

    def tags(self) -> dict[str, str]:
        tags = {
            "lineage.checkpoint_path": self.checkpoint_path,
            "lineage.checkpoint_digest": self.checkpoint_digest,
            "lineage.pretrain_run_id": self.pretrain_run_id,
            "lineage.dataset_id": self.dataset_id,
            "lineage.dataset_uri": self.dataset_uri,
            "lineage.source": self.source,
        }
        if self.digest_matches_run is not None:
            tags["lineage.digest_matches_pretrain_run"] = str(self.digest_matches_run).lower()
        return tags


def _normalise(digest: str) -> str:
    return digest.strip().lower().removeprefix("sha256:")


def digest_matches(tag_value: str, sha256_hex: str) -> bool:
    tag = _normalise(tag_value)
    return len(tag) >= MIN_DIGEST_PREFIX and sha256_hex.startswith(tag)


def resolve_lineage(
    checkpoint: str, *, seed: int, pretrain_run_id: str = "", tracking_uri: str | None = None
) -> Lineage:
    """The lineage of ``checkpoint`` (empty = random init from ``seed``); MLflow is asked
    only when ``tracking_uri`` is given."""
    if not checkpoint:
        if pretrain_run_id:
            raise ValueError("backbone.pretrain_run_id is set but backbone.checkpoint is empty (random init)")
        return Lineage(RANDOM_INIT, f"{RANDOM_INIT}:seed={seed}", source="none")
    path = Path(checkpoint).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"backbone.checkpoint {checkpoint!r} does not exist")
    lineage = Lineage(str(path), sha256_file(path))
    if tracking_uri is None:
        lineage.source = "given" if pretrain_run_id else "none"
        lineage.pretrain_run_id = pretrain_run_id
        return lineage
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    if pretrain_run_id:
        try:
            run = mlflow.get_run(pretrain_run_id)
        except mlflow.exceptions.MlflowException as err:
            raise ValueError(
                f"backbone.pretrain_run_id {pretrain_run_id!r} is not a run in {tracking_uri}: {err}"
            ) from None
        lineage.source = "given"
        recorded = run.data.tags.get("checkpoint.digest")
        if recorded:
            lineage.digest_matches_run = digest_matches(recorded, lineage.checkpoint_digest)
            if not lineage.digest_matches_run:
                log.warning(
                    "checkpoint %s (sha256 %s) differs from the one pretraining run %s recorded (%s)",
                    path,
                    lineage.checkpoint_digest[:16],
                    pretrain_run_id,
                    recorded,
                )
    else:
        run = find_pretrain_run(lineage.checkpoint_digest)
        lineage.source = "digest" if run else "none"
        if run:
            lineage.digest_matches_run = True
    if run is not None:
        lineage.pretrain_run_id = run.info.run_id
        lineage.dataset_id = run.data.tags.get("dataset.id", "")
        lineage.dataset_uri = run.data.tags.get("dataset.uri", "")
    return lineage


def find_pretrain_run(sha256_hex: str):
    """The newest run (any experiment) whose ``checkpoint.digest`` tag matches, or None."""
    import mlflow

    runs = mlflow.search_runs(
        search_all_experiments=True,
        filter_string="tags.`checkpoint.digest` LIKE '%'",
        order_by=["attributes.start_time DESC"],
        max_results=1000,
        output_format="list",
    )
    for run in runs:
        if digest_matches(run.data.tags["checkpoint.digest"], sha256_hex):
            return run
    return None
