"""MLflow plumbing shared by every stage: where runs go, configs, datasets, small artifacts.

Default store when nothing is configured: SQLite at ``<workspace>/mlflow.db`` with
artifacts in ``<workspace>/mlartifacts`` (the workspace being the folder that holds the
job's output folder), so the curation, training and probing runs of one workspace share
one store. ``tracking.uri`` or ``$MLFLOW_TRACKING_URI`` selects any other (a remote
``http://`` server included). Only configs, reports, digests and URIs are logged: shards and
checkpoints stay in storage and are referenced by URI.
"""
from __future__ import annotations

import dataclasses
import json
import os
import posixpath
from pathlib import Path
from typing import Any

from infra.config import config_to_dict, dump_config


@dataclasses.dataclass(kw_only=True)
class TrackingConfig:
    """The ``tracking`` section of every stage's config (curation, pretraining, probing, DAG).

    Each stage gives its own default experiment name (``default_factory``)."""

    enabled: bool = True
    uri: str | None = None             # None: $MLFLOW_TRACKING_URI, else sqlite:///<output parent>/mlflow.db
    experiment: str = "default"
    run_name: str | None = None        # None: the stage's own default (usually its output folder's name)


def tracking_section(experiment: str) -> Any:
    """A dataclass ``field`` for a stage config's ``tracking`` section with its default experiment."""
    return dataclasses.field(default_factory=lambda: TrackingConfig(experiment=experiment))


def resolve_tracking_uri(configured: str | None, output_dir: str) -> str:
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if "://" in output_dir and not output_dir.startswith("file://"):
        raise ValueError(f"output_dir {output_dir!r} is remote: set tracking.uri (e.g. http://mlflow:5000) "
                         "or MLFLOW_TRACKING_URI; the embedded SQLite store needs a local folder")
    workspace = Path(output_dir.removeprefix("file://")).expanduser().resolve().parent
    workspace.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{workspace / 'mlflow.db'}"


def _artifact_root(tracking_uri: str) -> str | None:
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None  # a server decides (its --artifacts-destination)


def get_experiment_id(name: str, tracking_uri: str) -> str:
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    root = _artifact_root(tracking_uri)
    return mlflow.create_experiment(name, artifact_location=f"{root}/{name}" if root else None)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


def log_config(cfg: Any) -> None:
    """Resolved config as params (flattened) and as config.yaml."""
    import mlflow

    params = {k: v[:6000] for k, v in flatten(config_to_dict(cfg)).items()}
    items = sorted(params.items())
    for start in range(0, len(items), 100):
        mlflow.log_params(dict(items[start:start + 100]))
    mlflow.log_text(dump_config(cfg), "config.yaml")


def make_dataset(name: str, digest: str, source_uri: str, schema=None, profile: dict | None = None):
    """An MLflow dataset for data we do not load into memory (shards, manifests): recorded by digest and URI."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource
    from mlflow.data.http_dataset_source import HTTPDatasetSource

    if "://" in source_uri and not source_uri.startswith("file://"):
        scheme = source_uri.split("://", 1)[0]
        if scheme in ("http", "https"):
            source = HTTPDatasetSource(source_uri)
        else:
            from mlflow.data import get_source  # noqa: F401 - registry lookup for s3/gs/...
            from mlflow.data.dataset_source_registry import resolve_dataset_source
            source = resolve_dataset_source(source_uri)
    else:
        source = LocalArtifactDatasetSource(source_uri.removeprefix("file://"))

    class _ProfiledDataset(MetaDataset):
        @property
        def profile(self):
            return profile

        def to_dict(self):
            d = super().to_dict()
            if profile is not None:
                d["profile"] = json.dumps(profile, sort_keys=True)
            return d

    return _ProfiledDataset(source=source, name=name, digest=digest, schema=schema)


def arrow_to_mlflow_schema(arrow_schema):
    """MLflow column spec of an Arrow schema (nested types recorded as strings)."""
    from mlflow.types import ColSpec, DataType, Schema

    mapping = {"string": DataType.string, "int32": DataType.integer, "int64": DataType.long,
               "float": DataType.float, "double": DataType.double, "bool": DataType.boolean,
               "binary": DataType.binary}
    cols = [ColSpec(mapping.get(str(f.type), DataType.string), f.name) for f in arrow_schema]
    return Schema(cols)


def find_run(experiment_id: str, tags: dict[str, str]) -> str | None:
    """A finished run carrying all ``tags`` (so a re-run reuses its record), or None."""
    import mlflow

    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = mlflow.search_runs([experiment_id], filter_string=query + " and attributes.status = 'FINISHED'",
                              max_results=1, output_format="list")
    return runs[0].info.run_id if runs else None


def artifact_path_join(*parts: str) -> str:
    return posixpath.join(*parts)
