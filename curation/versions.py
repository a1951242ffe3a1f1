"""Dataset versions: a content-derived id for a curation output, and its resolution to shards.

A version id is a digest of (a) the kept samples (every kept key with the SHA-256 of its
input bytes), (b) the job digest of the resolved curation config (everything that decides
outputs; not where they are logged) and (c) the curation code version (a digest of the
``curation`` package's source, less the read-only ``audit`` reports). Two runs that produce
the same content with the same config and code get the same id; changing a threshold changes it.

The curation run registers the version in MLflow (tags ``dataset.id``, ``dataset.name``,
``dataset.uri`` and the artifact ``shards.txt``); ``resolve_dataset`` turns an id, a name
(latest version of that name) or an output folder into the list of shard URIs.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import pyarrow as pa

from infra import storage

CODE_ROOT = Path(__file__).resolve().parent
# Subpackages that only read outputs (reports): editing them cannot change a version's content.
READ_ONLY_PACKAGES = ("audit",)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Digest of the curation package's source files (what the outputs depend on)."""
    h = hashlib.sha256()
    for path in sorted(CODE_ROOT.rglob("*.py")):
        if path.relative_to(CODE_ROOT).parts[0] in READ_ONLY_PACKAGES:
            continue
        h.update(path.relative_to(CODE_ROOT).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def dataset_version_id(manifest: pa.Table, job_digest: str, code: str | None = None) -> str:
    kept = manifest.filter(pa.compute.equal(manifest.column("status"), "kept")).sort_by("key")
    h = hashlib.sha256(f"job={job_digest}\ncode={code or code_version()}\n".encode())
    for key, sha in zip(kept.column("key").to_pylist(), kept.column("sha256").to_pylist()):
        h.update(f"{key}\t{sha}\n".encode())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class DatasetVersion:
    id: str
    name: str
    uri: str                 # the curation output folder
    shards: tuple[str, ...]  # WebDataset tar URIs, sorted
    run_id: str | None = None
    num_samples: int | None = None


def from_output(output: str) -> DatasetVersion:
    """The version a finished curation output holds (reads its _SUCCESS marker)."""
    fs, root = storage.resolve(output)
    marker = storage.join(root, "_SUCCESS")
    if not storage.exists(fs, marker):
        raise ValueError(f"{output!r} is not a finished curation output (no _SUCCESS marker)")
    done = json.loads(storage.read_bytes(fs, marker))
    shard_dir = storage.join(root, "shards")
    shards = tuple(storage.to_uri(fs, f.path) for f in storage.list_files(fs, shard_dir, (".tar",))) \
        if storage.exists(fs, shard_dir) else ()
    return DatasetVersion(id=done["dataset_id"], name=done.get("dataset_name", Path(root).name),
                          uri=storage.to_uri(fs, root), shards=shards, run_id=done.get("mlflow_run_id"),
                          num_samples=done.get("kept"))


def resolve_dataset(ref: str, tracking_uri: str | None = None) -> DatasetVersion:
    """A version by id, by name (latest), or by output folder."""
    fs, path = storage.resolve(ref) if ("/" in ref or "://" in ref) else (None, None)
    if fs is not None and storage.exists(fs, storage.join(path, "_SUCCESS")):
        return from_output(ref)
    if tracking_uri is None:
        raise ValueError(f"dataset {ref!r} is not a curation output folder; give tracking_uri to look it up in MLflow")
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    for query in (f"tags.`dataset.id` = '{ref}'", f"tags.`dataset.name` = '{ref}'"):
        # Only curation runs register versions; training runs may tag the version they read.
        runs = client.search_runs(experiments, filter_string=query + " and tags.`humanvision.stage` = 'curation'"
                                  " and attributes.status = 'FINISHED'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        if runs:
            run = runs[0]
            shards_txt = client.download_artifacts(run.info.run_id, "shards.txt")
            shards = tuple(line for line in Path(shards_txt).read_text().splitlines() if line)
            return DatasetVersion(id=run.data.tags["dataset.id"], name=run.data.tags["dataset.name"],
                                  uri=run.data.tags["dataset.uri"], shards=shards, run_id=run.info.run_id,
                                  num_samples=int(run.data.metrics.get("kept", 0)) or None)
    raise ValueError(f"no dataset version with id or name {ref!r} in {tracking_uri}")
