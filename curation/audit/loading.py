"""A finished curation output, or a dataset version id / name, -> ``AuditedVersion``.

Everything the audit shows comes from the output folder: the manifest (one row per input),
``stats.json``, the resolved ``config.yaml`` and the ``_SUCCESS`` marker (version id, job
digest, code version, MLflow run). A version id or name is first resolved to its output
folder through MLflow (``curation.output.resolve_dataset``). The folder is read through
``curation.output.CuratedOutput``, which owns the layout.

The manifest is never read whole by the report or the diff: ``AuditedVersion.batches`` streams
its Parquet parts, at most ``BATCH_ROWS`` rows of one part at a time (nothing read ahead), and
the audit merges per-batch aggregates. ``rows`` (the whole manifest as Python rows)
remains for small versions and tests.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import yaml

from curation import schema
from curation.output import CONFIG_FILE, CuratedOutput, DatasetVersion, resolve_dataset
from infra import storage
from infra.tracking import resolve_tracking_uri

# Bulky columns no audit view needs (pixels never reach the manifest; embeddings are large).
MANIFEST_SKIP = frozenset({*schema.EMBEDDING_COLUMNS, "source_meta", *schema.PAYLOAD_COLUMNS})
BATCH_ROWS = 65_536  # the most manifest rows one streamed batch holds


@dataclasses.dataclass(frozen=True)
class AuditedVersion:
    """One dataset version with everything its audit reads."""

    version: DatasetVersion
    job_digest: str
    code_version: str | None
    stats: dict
    config: dict  # the resolved config.yaml, as plain data
    output: CuratedOutput
    parts: tuple[str, ...]  # the manifest's Parquet parts (paths in ``output.fs``), sorted

    @property
    def id(self) -> str:
        return self.version.id

    @property
    def uri(self) -> str:
        return self.version.uri

    @functools.cached_property
    def dataset(self) -> pads.Dataset:
        return pads.dataset(list(self.parts), format="parquet", filesystem=self.output.fs)

    @property
    def columns(self) -> list[str]:
        """The manifest's columns less ``MANIFEST_SKIP``."""
        return [n for n in self.dataset.schema.names if n not in MANIFEST_SKIP]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([self.dataset.schema.field(n) for n in self.columns])

    def batches(
        self, columns: list[str] | None = None, where: pads.Expression | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The manifest's rows (``columns`` of them, default ``columns``; ``where`` only), part by
        part in path order, in batches of at most ``BATCH_ROWS`` in their part's order. Read as they
        are consumed, nothing ahead: one part's row group and one batch at a time (a dataset
        scanner's read-ahead fills up with the whole manifest behind a slow consumer)."""
        names = [c for c in (self.columns if columns is None else columns) if c in self.dataset.schema.names]
        target = pa.schema([self.dataset.schema.field(n) for n in names])
        for path in self.parts:
            with self.output.fs.open_input_file(path) as fh:
                part = pq.ParquetFile(fh)
                have = [n for n in names if n in part.schema_arrow.names]
                for batch in part.iter_batches(batch_size=BATCH_ROWS, columns=have):
                    batch = _conform(batch, target)
                    if where is not None:
                        batch = pa.Table.from_batches([batch]).filter(where).combine_chunks()
                        batch = batch.to_batches()[0] if batch.num_rows else None
                    if batch is not None and batch.num_rows:
                        yield batch

    def scan(self, *aggregators) -> None:
        """One streamed pass over the manifest: each aggregator's ``add(batch)`` sees every batch,
        of the columns they name together (``columns``; None: all of ``columns``)."""
        wanted = [a.columns for a in aggregators]
        names = None if any(c is None for c in wanted) else list(dict.fromkeys(c for cs in wanted for c in cs))
        for batch in self.batches(names):
            for a in aggregators:
                a.add(batch)

    @functools.cached_property
    def rows(self) -> list[dict]:
        """The whole manifest as Python rows, sorted by key: for small versions and tests only
        (the report and the diff stream ``batches`` instead)."""
        return pa.Table.from_batches(list(self.batches()), schema=self.schema).sort_by("key").to_pylist()

    def setting(self, dotted: str, default=None):
        """A value of the resolved config by dotted name, e.g. ``geometry.min_short_side``."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def _conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``target``'s columns, order and types (a column the part lacks: nulls)."""
    have = batch.schema.names
    arrays = [
        (batch.column(f.name) if batch.schema.field(f.name).type == f.type else batch.column(f.name).cast(f.type))
        if f.name in have
        else pa.nulls(batch.num_rows, f.type)
        for f in target
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def manifest_parts(out: CuratedOutput) -> tuple[str, ...]:
    parts = tuple(out.manifest_files())
    if not parts:
        raise ValueError(f"{out.uri!r} has no manifest parts")
    return parts


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
        output=out,
        parts=manifest_parts(out),
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
