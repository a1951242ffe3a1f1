"""Reading a curated shard's samples and writing an annotation shard.

A source shard is a curation WebDataset tar (``<key>.<image ext>`` + ``<key>.json``) with its
Parquet sidecar (the kept samples' metadata: size and person boxes, in the tar's order). The
samples of a shard are the sidecar's rows (and any other key the tar holds), in that order. What
is wrong with the shard itself gives records with a reason and an error rather than an exception:
a sample whose image the tar lacks (``missing_image``), a tar that cannot be read to its end (a
corrupt tar, or none where the version lists one: ``unreadable_tar``), a sample with no metadata
or an unparsable ``<key>.json`` (``bad_metadata``). Any other failure to read (an I/O error of the
storage) is raised: it is not a property of the samples, and a re-run reads the shard again.

An annotation shard is written as curation writes its shards: tar members with fixed
metadata (mtime 0, uid/gid 0) in the source shard's order, then the Parquet table with fixed
settings, each file atomically (``infra.storage``), the table last: equal annotations give
equal bytes, and a shard whose table exists is complete. The tar holds the source tar's keys
exactly (a sample missing from the source is a row of the table only), so the two pair up
sample by sample.
"""

from __future__ import annotations

import dataclasses
import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq

import evaluation.annotate.layout as layout
from curation.output import DatasetVersion, sidecar_path, split_member
from infra import storage

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
MISSING = "missing"  # the status of a sample its shard's tar lacks
# Why a sample is not annotated, when its shard is to blame (``read_shard``).
MISSING_IMAGE, UNREADABLE_TAR, BAD_METADATA = "missing_image", "unreadable_tar", "bad_metadata"
META_COLUMNS = ["key", "width", "height", "person_boxes", "person_scores"]


@dataclasses.dataclass(frozen=True)
class SourceShard:
    id: str
    tar: str  # URI of the curated tar
    sidecar: str  # URI of its Parquet sidecar


def source_shards(version: DatasetVersion) -> list[SourceShard]:
    """The version's shards, each with its sidecar (named by its partition, the tar's file stem)."""
    return [SourceShard(layout.shard_id(t), t, sidecar_path(version.uri, layout.shard_id(t))) for t in version.shards]


@dataclasses.dataclass
class Record:
    """One sample as read: its image bytes and metadata, or why it could not be read."""

    key: str
    image: bytes | None = None
    meta: dict | None = None
    error: str | None = None
    reason: str | None = None  # with ``error``: one of the reasons above


def read_tar(uri: str) -> tuple[dict[str, dict[str, bytes]], str | None]:
    """{key: {extension: bytes}} of a tar, and the error that stopped reading it (None: read whole)."""
    fs, p = storage.resolve(uri)
    members: dict[str, dict[str, bytes]] = {}
    try:
        with fs.open_input_stream(p) as fh, tarfile.open(fileobj=fh, mode="r|") as tar:
            for info in tar:
                split = split_member(info.name) if info.isfile() else None
                if split is not None:
                    members.setdefault(split[0], {})[split[1]] = tar.extractfile(info).read()
    except (FileNotFoundError, tarfile.TarError, EOFError) as err:  # the shard's own fault, not the storage's
        return members, f"shard tar unreadable after {len(members)} samples: {type(err).__name__}: {err}"
    return members, None


def _read_sidecar(uri: str) -> dict[str, dict]:
    """{key: size and boxes} of the kept samples a sidecar lists ({} without one)."""
    if not uri:
        return {}
    fs, p = storage.resolve(uri)
    if not storage.exists(fs, p):
        return {}
    with fs.open_input_file(p) as fh:
        names = pq.ParquetFile(fh).schema_arrow.names
        table = pq.read_table(fh, columns=[c for c in META_COLUMNS if c in names])
    return {row["key"]: row for row in table.to_pylist()}


def _meta_of(key: str, members: dict[str, bytes], sidecar: dict[str, dict]) -> tuple[dict | None, str | None]:
    """The sample's metadata (its sidecar row, else its ``<key>.json``), or None and why not."""
    if key in sidecar:
        return sidecar[key], None
    if "json" not in members:
        return None, f"no metadata (person boxes) of sample {key!r} in the shard"
    try:
        meta = json.loads(members["json"])
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        return None, f"{key}.json of the shard is not JSON: {err}"
    return (meta, None) if isinstance(meta, dict) else (None, f"{key}.json of the shard is not a JSON object")


def read_shard(shard: SourceShard) -> list[Record]:
    """The shard's samples in its order (see the module docstring)."""
    members, tar_error = read_tar(shard.tar)
    sidecar = _read_sidecar(shard.sidecar)
    records = []
    for key in [*sidecar, *(k for k in members if k not in sidecar)]:
        found = members.get(key, {})
        image = next((found[e] for e in IMAGE_EXTS if e in found), None)
        meta, error = _meta_of(key, found, sidecar)
        reason = BAD_METADATA if error else None
        if image is None:
            reason = UNREADABLE_TAR if tar_error else MISSING_IMAGE
            error = tar_error or f"no image of sample {key!r} in {shard.tar}"
        records.append(Record(key, image, meta, error, reason))
    return records


# ---- writing ------------------------------------------------------------------------------------


def sample_json(row: dict, members: dict[str, str]) -> bytes:
    """A sample's ``<key>.json``: its columns other than the tar's own members, nulls left out."""
    doc = {k: v for k, v in row.items() if k not in members and v is not None}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_tar(fs, path: str, rows: list[dict], members: dict[str, str]) -> None:
    """``<key>.json`` then each map member (``members``: column -> extension) of every row."""
    storage.write_tar_members(fs, path, _annotation_members(rows, members))


def _annotation_members(rows: list[dict], members: dict[str, str]):
    for row in rows:
        if row["status"] == MISSING:  # not in the source tar either
            continue
        yield f"{row['key']}.json", sample_json(row, members)
        for column, ext in members.items():
            if row.get(column) is not None:
                yield f"{row['key']}.{ext}", row[column]


def write_shard(fs, tar: str, table_file: str, rows: list[dict], schema: pa.Schema, members: dict[str, str]) -> None:
    """The shard's tar, then its table (the commit marker). PNG members are stored as they are."""
    write_tar(fs, tar, rows, members)
    table = pa.Table.from_pylist(rows, schema=schema)
    pngs = tuple(c for c, ext in members.items() if ext.endswith(".png"))
    storage.write_parquet(fs, table_file, table, stored=pngs)
