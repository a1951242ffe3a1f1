"""Dataset versions: a content-derived id for a curation output, and its resolution to shards.

A version id is a digest of (a) the kept samples (per partition, a digest of every kept key
with the SHA-256 of its input bytes, in key order; the partition digests combined in
partition-id order, so each manifest part is digested where it lies and no process reads
the whole manifest; ids from before this scheme digested one key-sorted list and differ), (b) the job digest of the resolved curation config (everything that decides
outputs; not where they are logged) and (c) the curation code version (a digest of the
``curation`` package's source, less the read-only ``audit`` reports). Two runs that produce
the same content with the same config and code get the same id; changing a threshold changes it.

The curation run registers the version in MLflow (tags ``dataset.id``, ``dataset.name``,
``dataset.uri`` and the artifact ``shards.txt``); ``curation.output.resolve_dataset`` turns an
id, a name (latest version of that name) or an output folder into the list of shard URIs.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pyarrow as pa

CODE_ROOT = Path(__file__).resolve().parent
# Modules that only read outputs (reports, the chain facade): editing them cannot change a version's content.
READ_ONLY_PACKAGES = ("audit", "stage.py")  # stage.py: the chain's facade (``CurateStage``)


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


def partition_digest(manifest_part: pa.Table) -> str:
    """Digest of one manifest part's kept samples: every kept key with its input's SHA-256, by key."""
    kept = manifest_part.filter(pa.compute.equal(manifest_part.column("status"), "kept")).sort_by("key")
    h = hashlib.sha256()
    for key, sha in zip(kept.column("key").to_pylist(), kept.column("sha256").to_pylist()):
        h.update(f"{key}\t{sha}\n".encode())
    return h.hexdigest()


def combine_digests(digests: dict[str, str], job_digest: str, code: str | None = None) -> str:
    """The version id from the per-partition digests, combined in partition-id order."""
    h = hashlib.sha256(f"job={job_digest}\ncode={code or code_version()}\n".encode())
    for pid in sorted(digests):
        h.update(f"{pid}\t{digests[pid]}\n".encode())
    return h.hexdigest()[:16]


def dataset_version_id(manifest: pa.Table, job_digest: str, code: str | None = None) -> str:
    """The version id of a whole manifest table (key, sha256, status, partition): the same value
    as the pipeline's, which digests each part where it lies and combines the digests."""
    parts = manifest.column("partition").to_pylist()
    digests = {
        pid: partition_digest(manifest.filter(pa.compute.equal(manifest.column("partition"), pid)))
        for pid in sorted(set(parts))
    }
    return combine_digests(digests, job_digest, code)
