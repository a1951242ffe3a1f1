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
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from infra.config import config_to_dict, dump_config


@dataclasses.dataclass(kw_only=True)
class TrackingConfig:
    """The ``tracking`` section of every stage's config (curation, pretraining, probing, DAG).

    Each stage gives its own default experiment name (``default_factory``)."""

    enabled: bool = True
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///<output parent>/mlflow.db
    experiment: str = "default"
    run_name: str | None = None  # None: the stage's own default (usually its output folder's name)


def tracking_section(experiment: str) -> Any:
    """A dataclass ``field`` for a stage config's ``tracking`` section with its default experiment."""
    return dataclasses.field(default_factory=lambda: TrackingConfig(experiment=experiment))


def resolve_tracking_uri(configured: str | None, output_dir: str) -> str:
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if "://" in output_dir and not output_dir.startswith("file://"):
        raise ValueError(
            f"output_dir {output_dir!r} is remote: set tracking.uri (e.g. http://mlflow:5000) "
            "or MLFLOW_TRACKING_URI; the embedded SQLite store needs a local folder"
        )
    workspace = Path(output_dir.removeprefix("file://")).expanduser().resolve().parent
    workspace.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{workspace / 'mlflow.db'}"


def _artifact_root(tracking_uri: str) -> str | None:
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None  # a server decides (its --artifacts-destination)


# Our experiments are model-development ones (runs, metrics, datasets), which MLflow records in
# this tag. MLflow 3.17.2's UI does not read it yet: it opens the GenAI view (traces, judges) unless
# the URL says ?workflowType=machine_learning, so the demo prints that link and
# tests/pipelines/test_mlflow_ui.py checks in a browser that it shows the runs.
EXPERIMENT_KIND_TAG, TRAINING_VIEW = "mlflow.experimentKind", "custom_model_development"


def get_experiment_id(name: str, tracking_uri: str) -> str:
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    root = _artifact_root(tracking_uri)
    return mlflow.create_experiment(
        name, artifact_location=f"{root}/{name}" if root else None, tags={EXPERIMENT_KIND_TAG: TRAINING_VIEW}
    )


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
        mlflow.log_params(dict(items[start : start + 100]))
    mlflow.log_text(dump_config(cfg), "config.yaml")


def make_dataset(name: str, digest: str, source_uri: str, schema=None, profile: dict | None = None):
    """An MLflow dataset for data we do not load into memory (shards, manifests): recorded by digest and URI."""
    from mlflow.data.http_dataset_source import HTTPDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource

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

    mapping = {
        "string": DataType.string,
        "int32": DataType.integer,
        "int64": DataType.long,
        "float": DataType.float,
        "double": DataType.double,
        "bool": DataType.boolean,
        "binary": DataType.binary,
    }
    cols = [ColSpec(mapping.get(str(f.type), DataType.string), f.name) for f in arrow_schema]
    return Schema(cols)


def find_run(experiment_id: str, tags: dict[str, str]) -> str | None:
    """A finished run carrying all ``tags`` (so a re-run reuses its record), or None."""
    import mlflow

    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = mlflow.search_runs(
        [experiment_id],
        filter_string=query + " and attributes.status = 'FINISHED'",
        max_results=1,
        output_format="list",
    )
    return runs[0].info.run_id if runs else None


# ---- runs of the model stages: parent/child records, step metrics, run status ------------------
# (pretraining and probing; the stage-specific tags and files are chosen by the stages)

_log = logging.getLogger(__name__)


def log_params(params: dict[str, str]) -> None:
    """``params`` on the active run: values cut to MLflow's 6000 characters, 100 per call (its batch limit)."""
    import mlflow

    items = sorted((k, v[:6000]) for k, v in params.items())
    for start in range(0, len(items), 100):
        mlflow.log_params(dict(items[start : start + 100]))


def finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric, non-NaN entries (MLflow rejects the others, or stores NaN as a gap)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}


def start_run(experiment_id: str, run_name: str, tags: dict[str, str]):
    """A new active run in ``experiment_id`` (a context manager that ends it)."""
    import mlflow

    return mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags)


def log_child_run(
    run_name: str,
    tags: dict[str, str],
    *,
    params: dict[str, str],
    metrics: dict[str, Any],
    series: dict[str, list[tuple[int, float]]],
    files: list[str],
    folders: dict[str, str],
    datasets: list[tuple[Any, str]],
) -> str:
    """A finished child of the active run, in the parent's experiment; returns its id.

    ``series``: metric -> [(step, value)]; ``folders``: artifact path -> local folder;
    ``datasets``: (``make_dataset(...)``, context) pairs."""
    import mlflow

    # nested=True alone would file the child under the default experiment, not the parent's.
    with mlflow.start_run(
        experiment_id=mlflow.active_run().info.experiment_id, run_name=run_name, nested=True, tags=tags
    ) as run:
        log_params(params)
        mlflow.log_metrics(finite_metrics(metrics))
        for key, points in series.items():
            for step, value in points:
                mlflow.log_metric(key, value, step=step)
        for file in files:
            mlflow.log_artifact(file)
        for artifact_path, folder in folders.items():
            mlflow.log_artifacts(folder, artifact_path)
        for dataset, context in datasets:
            mlflow.log_input(dataset, context=context)
        return run.info.run_id


def end_run(tracking_uri: str, run_id: str, status: str) -> None:
    """Mark a run ended with ``status``; a failure is logged, not raised (the caller's own error matters more)."""
    from mlflow import MlflowClient

    try:
        MlflowClient(tracking_uri).set_terminated(run_id, status=status)
    except Exception as err:  # noqa: BLE001 - see the docstring
        _log.warning("could not mark MLflow run %s %s: %s", run_id, status, err)


def metric_history(tracking_uri: str, run_id: str, keys: tuple[str, ...]) -> dict[int, dict[str, float]]:
    """{step: {key: value}} of a run's ``keys``; a step logged twice (replayed after a restart)
    keeps its latest value."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    out: dict[int, dict[str, float]] = {}
    for key in keys:
        for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
            out.setdefault(m.step, {})[key] = m.value
    return dict(sorted(out.items()))


class MetricsLogger:
    """Step metrics, images and tags for one run, from a process that must not wait for or
    fail because of the store (a training worker).

    Importing MLflow and opening its store take seconds: that happens in a background
    thread while the caller goes on. A failed flush is logged as a warning (at most once a
    minute) and its metrics stay buffered (up to ``max_buffer``) for the next attempt. Past
    ``max_buffer`` the oldest values are dropped: counted in ``dropped``, warned about (the
    first time, then at most once a minute, with the count so far) and, once a flush goes
    through, recorded on the run as the tag ``DROPPED_TAG`` (the count), so a gap in its
    series says what it is.
    """

    DROPPED_TAG = "metrics.dropped"

    def __init__(self, tracking_uri: str, run_id: str, *, flush_every: int, max_buffer: int = 200_000) -> None:
        self.run_id, self.flush_every, self.max_buffer = run_id, flush_every, max_buffer
        self.buffer: list[tuple[str, float, int, int]] = []
        self.dropped, self._dropped_recorded, self._last_drop_warning = 0, 0, None
        self._last_warning = 0.0
        self._client = None
        self._tracking_uri, self._open_error, self._last_open = tracking_uri, None, 0.0
        self._connect = threading.Thread(target=self._open, daemon=True)
        self._connect.start()

    def _open(self) -> None:
        """Open the store (SQLite schema checks, the run exists); a failure is kept, not raised."""
        self._last_open = time.monotonic()
        try:
            from mlflow import MlflowClient

            client = MlflowClient(self._tracking_uri)
            client.get_run(self.run_id)
            self._client, self._open_error = client, None
        except Exception as err:  # noqa: BLE001 - tracking outages must not stop the caller
            self._open_error = err

    @property
    def client(self):
        self._connect.join()
        if self._client is None and time.monotonic() - self._last_open > 60:
            self._open()  # a store that was down may be back; at most once a minute
        if self._client is None:
            raise RuntimeError(f"MLflow store {self._tracking_uri} could not be opened: {self._open_error}")
        return self._client

    def log(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.buffer.extend((key, float(v), now, step) for key, v in values.items() if v is not None)
        if len(self.buffer) > self.max_buffer:
            self._drop(len(self.buffer) - self.max_buffer)
        if step % self.flush_every == 0:
            self.flush()

    def _drop(self, n: int) -> None:
        """Drop the ``n`` oldest buffered values, counted and warned about (see the class doc)."""
        del self.buffer[:n]
        self.dropped += n
        if self._last_drop_warning is None or time.monotonic() - self._last_drop_warning > 60:
            _log.warning(
                "MLflow: metrics buffer full (max_buffer=%d values): dropped the oldest, %d in all so far",
                self.max_buffer,
                self.dropped,
            )
            self._last_drop_warning = time.monotonic()

    def flush(self) -> None:
        while self.buffer:
            chunk = self.buffer[:1000]  # MLflow's log_batch limit
            if not self._guard("log metrics", lambda chunk=chunk: self._log_batch(chunk)):
                return
            del self.buffer[: len(chunk)]
        if self.dropped > self._dropped_recorded:
            count = self.dropped
            if self._guard(
                "record the dropped metrics", lambda: self.client.set_tag(self.run_id, self.DROPPED_TAG, str(count))
            ):
                self._dropped_recorded = count

    def _log_batch(self, chunk) -> None:
        client = self.client  # first: waits for the background import of mlflow to finish
        from mlflow.entities import Metric

        client.log_batch(self.run_id, metrics=[Metric(k, v, ts, step) for k, v, ts, step in chunk])

    def log_image(self, image: Any, artifact_file: str) -> None:
        """``image``: a PIL image (or a numpy array), stored at ``artifact_file``."""
        self._guard("log an image", lambda: self.client.log_image(self.run_id, image, artifact_file=artifact_file))

    def set_tag(self, key: str, value: str) -> None:
        self._guard("set a tag", lambda: self.client.set_tag(self.run_id, key, value))

    def _guard(self, what: str, fn) -> bool:
        try:
            fn()
            return True
        except Exception as err:  # noqa: BLE001 - tracking outages must not stop the caller
            if time.monotonic() - self._last_warning > 60:
                _log.warning("MLflow: could not %s (%s); training goes on, will retry", what, err)
                self._last_warning = time.monotonic()
            return False


def log_results(metrics: dict[str, Any], files: list[str]) -> None:
    """The finite ``metrics`` and the ``files`` on the active run (a suite's summary)."""
    import mlflow

    mlflow.log_metrics(finite_metrics(metrics))
    for file in files:
        mlflow.log_artifact(file)


# ---- a dataset version's run (curation) ---------------------------------------------------------


def log_dataset_run(
    settings: TrackingConfig,
    tracking_uri: str,
    config: Any,
    *,
    output_uri: str,
    tags: dict[str, str],
    metrics: dict[str, float],
    run_tags: dict[str, str],
    documents: dict[str, Any],
    dataset_name: str,
    dataset_id: str,
    dataset_schema=None,
    profile: dict | None = None,
) -> str:
    """Log (or find, when an earlier attempt already logged ``tags``) the run that produced a
    dataset version: config, metrics, JSON/text documents and the dataset by digest and URI."""
    import mlflow

    exp_id = get_experiment_id(settings.experiment, tracking_uri)
    existing = find_run(exp_id, tags)
    if existing:
        return existing
    name = settings.run_name or os.path.basename(output_uri.rstrip("/"))
    with mlflow.start_run(experiment_id=exp_id, run_name=name, tags=tags) as run:
        log_config(config)
        mlflow.log_metrics(metrics)
        mlflow.set_tags(run_tags)
        for file_name, doc in documents.items():
            (mlflow.log_text if isinstance(doc, str) else mlflow.log_dict)(doc, file_name)
        dataset = make_dataset(dataset_name, dataset_id, output_uri, schema=dataset_schema, profile=profile)
        mlflow.log_input(dataset, context="curation_output")
        return run.info.run_id
