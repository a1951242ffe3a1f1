"""A finished curation output, or a dataset version id / name, -> ``AuditedVersion``.

Everything the audit shows comes from the output folder: the manifest (one row per input),
``stats.json``, the resolved ``config.yaml`` and the ``_SUCCESS`` marker (version id, job
digest, code version, MLflow run). A version id or name is first resolved to its output
folder through MLflow (``curation.output.resolve_dataset``). The folder is read through
``curation.output.CuratedOutput``, which owns the layout.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pyarrow as pa
import yaml

from curation.output import CONFIG_FILE, CuratedOutput, DatasetVersion, resolve_dataset
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
    config: dict  # the resolved config.yaml, as plain data
    manifest: pa.Table  # sorted by key, without MANIFEST_SKIP columns

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
        """A value of the resolved config by dotted name, e.g. ``geometry.min_short_side``."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def read_manifest(out: CuratedOutput) -> pa.Table:
    if not out.manifest_files():
        raise ValueError(f"{out.uri!r} has no manifest parts")
    return out.read_manifest(skip=MANIFEST_SKIP)


def load_output(output: str) -> AuditedVersion:
    """A finished curation output folder (local path or object-store URI)."""
    out = CuratedOutput.at(output)
    version = out.version()  # raises ValueError without a _SUCCESS marker
    done, stats = out.success(), out.stats()
    config = yaml.safe_load(storage.read_bytes(out.fs, storage.join(out.root, CONFIG_FILE))) or {}
    return AuditedVersion(
        version=version,
        job_digest=done.get("job_digest", stats.get("job_digest", "")),
        code_version=done.get("code_version"),
        stats=stats,
        config=config,
        manifest=read_manifest(out),
    )


def is_output(ref: str) -> bool:
    try:
        return CuratedOutput.at(ref).finished
    except (OSError, ValueError):
        return False


def load_version(ref: str, tracking_uri: str | None = None) -> AuditedVersion:
    """An output folder, or a version id or name looked up in MLflow (``tracking_uri``, else
    ``$MLFLOW_TRACKING_URI``)."""
    if is_output(ref):
        return load_output(ref)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError(
            f"{ref!r} is not a finished curation output folder; to look it up as a dataset version "
            "id or name give --tracking-uri (or set MLFLOW_TRACKING_URI)"
        )
    return load_output(resolve_dataset(ref, tracking_uri=uri).uri)


def tracking_uri_of(version: AuditedVersion, explicit: str | None = None) -> str:
    """Where the version's curation run was logged: explicit > the run's tracking.uri > env > workspace SQLite."""
    return resolve_tracking_uri(explicit or version.setting("tracking.uri"), version.uri)
