"""A finished curation output, or a dataset version id / name, -> ``AuditedVersion``.

Everything the audit shows comes from the output folder: the manifest (one row per input),
``stats.json``, the resolved ``config.yaml`` and the ``_SUCCESS`` marker (version id, job
digest, code version, MLflow run). A version id or name is first resolved to its output
folder through MLflow (``curation.versions.resolve_dataset``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os

import pyarrow as pa
import pyarrow.dataset as pads
import yaml

from curation.versions import DatasetVersion, from_output, resolve_dataset
from infra import storage
from infra.tracking import resolve_tracking_uri

# Bulky columns no audit view needs (pixels never reach the manifest; embeddings are large).
MANIFEST_SKIP = frozenset({"clip_embedding", "source_meta", "image", "raw"})


@dataclasses.dataclass(frozen=True)
class AuditedVersion:
    """One dataset version with everything its audit reads."""

    version: DatasetVersion
    job_digest: str
    code_version: str | None
    stats: dict
    config: dict              # the resolved config.yaml, as plain data
    manifest: pa.Table        # sorted by key, without MANIFEST_SKIP columns

    @property
    def id(self) -> str:
        return self.version.id

    @property
    def uri(self) -> str:
        return self.version.uri

    @functools.cached_property
    def rows(self) -> list[dict]:
        """The manifest as Python rows (sorted by key)."""
        return self.manifest.to_pylist()

    def setting(self, dotted: str, default=None):
        """A value of the resolved config by dotted name, e.g. ``filters.min_short_side``."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def read_manifest(output: str) -> pa.Table:
    fs, root = storage.resolve(output)
    files = [f.path for f in storage.list_files(fs, storage.join(root, "manifest"), (".parquet",))]
    if not files:
        raise ValueError(f"{output!r} has no manifest parts under manifest/")
    dataset = pads.dataset(files, format="parquet", filesystem=fs)
    columns = [n for n in dataset.schema.names if n not in MANIFEST_SKIP]
    return dataset.to_table(columns=columns).sort_by("key")


def load_output(output: str) -> AuditedVersion:
    """A finished curation output folder (local path or object-store URI)."""
    version = from_output(output)  # raises ValueError without a _SUCCESS marker
    fs, root = storage.resolve(version.uri)
    done = json.loads(storage.read_bytes(fs, storage.join(root, "_SUCCESS")))
    stats = json.loads(storage.read_bytes(fs, storage.join(root, "stats.json")))
    config = yaml.safe_load(storage.read_bytes(fs, storage.join(root, "config.yaml"))) or {}
    return AuditedVersion(version=version, job_digest=done.get("job_digest", stats.get("job_digest", "")),
                          code_version=done.get("code_version"), stats=stats, config=config,
                          manifest=read_manifest(version.uri))


def is_output(ref: str) -> bool:
    try:
        fs, root = storage.resolve(ref)
        return storage.exists(fs, storage.join(root, "_SUCCESS"))
    except (OSError, ValueError):
        return False


def load_version(ref: str, tracking_uri: str | None = None) -> AuditedVersion:
    """An output folder, or a version id or name looked up in MLflow (``tracking_uri``, else
    ``$MLFLOW_TRACKING_URI``)."""
    if is_output(ref):
        return load_output(ref)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError(f"{ref!r} is not a finished curation output folder; to look it up as a dataset version "
                         "id or name give --tracking-uri (or set MLFLOW_TRACKING_URI)")
    return load_output(resolve_dataset(ref, tracking_uri=uri).uri)


def tracking_uri_of(version: AuditedVersion, explicit: str | None = None) -> str:
    """Where the version's curation run was logged: explicit > the run's tracking.uri > env > workspace SQLite."""
    return resolve_tracking_uri(explicit or version.setting("tracking.uri"), version.uri)
