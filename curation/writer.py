"""Writer: one WebDataset shard, one Parquet sidecar and one manifest part per input partition.

For partition ``<pid>`` (names derived from the input partition, so re-runs reproduce them):

- ``shards/<pid>.tar``: ``<key>.jpg`` + ``<key>.json`` per kept sample, sorted by key, with
  fixed member metadata (mtime 0, uid/gid 0), so equal content gives equal bytes.
- ``shards/<pid>.parquet``: the kept samples' metadata (no pixels), for trainers and audits.
- ``manifest/<pid>.parquet``: one row per input image of the partition (kept, dropped or
  error) with its reason, scores and shard.

Each file is written under a temporary name and renamed when complete, in that order; the
manifest part is the partition's commit marker. A partition with no kept sample writes no
shard (and no sidecar), only its manifest part.
"""

from __future__ import annotations

import io
import json
import posixpath
import tarfile

import pyarrow as pa
import pyarrow.compute as pc

from curation import schema, staging
from curation.output import empty_marker_path, manifest_part_path, shard_path, sidecar_path
from curation.steps import Step
from infra import storage

_NOT_STORED = (*schema.PAYLOAD_COLUMNS, *schema.REFERENCE_COLUMNS)  # in neither the manifest nor the sidecar
_META_SKIP = set(_NOT_STORED) | {
    "decode_ok",
    "reason",
    "error_message",
    "status",
    "duplicate_of",
    "duplicate_group",
    "image_ext",
}


def sample_metadata(row: dict) -> dict:
    """The ``<key>.json`` of a kept sample: source, size, person boxes/scores, hashes, scores."""
    meta = {k: v for k, v in row.items() if k not in _META_SKIP and v is not None}
    if isinstance(meta.get("source_meta"), str):
        try:
            meta["source_meta"] = json.loads(meta["source_meta"])
        except json.JSONDecodeError:
            pass
    meta.pop("clip_embedding", None)  # kept in the sidecar; too bulky for every sample's json
    return meta


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def write_tar(fs, path: str, rows: list[dict]) -> None:
    with storage.atomic_output(fs, path) as out:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            for row in rows:
                _add_member(tar, f"{row['key']}.{row['image_ext']}", row["image"])
                meta = json.dumps(sample_metadata(row), sort_keys=True, separators=(",", ":"), allow_nan=False)
                _add_member(tar, f"{row['key']}.json", meta.encode())


def mark_duplicates(table: pa.Table, decisions: pa.Table) -> pa.Table:
    """Give pending rows their dedup decision (reason, representative, group); rows already ended
    keep theirs, and so do rows an earlier pass marked."""
    by_key = {d["key"]: d for d in decisions.to_pylist()}
    n = table.num_rows
    reasons = table.column("reason").to_pylist()
    ok = table.column("decode_ok").to_pylist()
    marked = {
        c: table.column(c).to_pylist() if c in table.column_names else [None] * n
        for c in ("duplicate_of", "duplicate_group")
    }
    for i, key in enumerate(table.column("key").to_pylist()):
        d = by_key.get(key)
        if d is not None and ok[i] and reasons[i] is None:
            reasons[i] = d["reason"]
            for c, values in marked.items():
                values[i] = d[c]
    return schema.with_columns(
        table, {"reason": pa.array(reasons, pa.string()), **{c: pa.array(v, pa.string()) for c, v in marked.items()}}
    )


def survivors_only(table: pa.Table, decisions: pa.Table) -> pa.Table:
    """A later pass's input: the earlier decisions marked, image bytes only on rows still pending
    (rows that ended pass through the row steps untouched, for their columns and the manifest)."""
    table = mark_duplicates(table, decisions)
    pending = pa.array(schema.pending_mask(table))
    return schema.with_columns(
        table, {"image": pc.if_else(pending, table.column("image"), pa.nulls(table.num_rows, pa.binary()))}
    )


def apply_decisions(table: pa.Table, decisions: pa.Table) -> pa.Table:
    """Final status per row: dedup decisions first, then the single decision rule."""
    table = mark_duplicates(table, decisions)
    status = [
        schema.final_status(o, r)
        for o, r in zip(table.column("decode_ok").to_pylist(), table.column("reason").to_pylist())
    ]
    return schema.with_columns(table, {"status": pa.array(status, pa.string())})


def write_partition(output: str, pid: str, decisions: pa.Table, staged_at: str | None = None) -> dict:
    """Write shard, sidecar and manifest part of one partition from its rows staged at
    ``staged_at`` (the last pass's staging root; default ``output``); returns its counts."""
    fs, root = storage.resolve(output)
    staged = staging.read_partition_rows(fs, storage.resolve(staged_at)[1] if staged_at else root, pid)
    if staged is None:  # no image in this input partition: nothing to account for, but it is done
        storage.atomic_write_bytes(fs, empty_marker_path(root, pid), b"")
        return {"partition": pid, "rows": 0, "kept": 0, "shard": None}
    table = apply_decisions(staged, decisions)
    kept = table.filter(pc.equal(table.column("status"), schema.KEPT))
    shard_name = posixpath.basename(shard_path(root, pid)) if kept.num_rows else None
    if kept.num_rows:
        rows = kept.to_pylist()
        for i, data in staging.referenced_bytes(kept, [True] * kept.num_rows).items():  # staged by reference
            rows[i]["image"] = data
        write_tar(fs, shard_path(root, pid), rows)
        sidecar = kept.drop_columns([c for c in _NOT_STORED if c in kept.column_names])
        sidecar = schema.with_columns(sidecar, {"shard": pa.array([shard_name] * kept.num_rows, pa.string())})
        storage.write_parquet(fs, sidecar_path(root, pid), sidecar)
    manifest = table.drop_columns([c for c in _NOT_STORED if c in table.column_names])
    shard_col = [shard_name if s == schema.KEPT else None for s in manifest.column("status").to_pylist()]
    manifest = schema.with_columns(manifest, {"shard": pa.array(shard_col, pa.string())})
    storage.write_parquet(fs, manifest_part_path(root, pid), manifest)
    return {"partition": pid, "rows": table.num_rows, "kept": kept.num_rows, "shard": shard_name}


class WriteShards(Step):
    """The recipe's last step and its one decision point: statuses from reasons and dedup
    decisions, then each partition's shard, sidecar and manifest part."""

    name = "write_shards"
    reads = ("key", "image", "image_ext")
    staged_at: str | None = None  # where the last pass staged its rows (set by the pipeline); None: the output

    def write(self, output: str, pid: str, decisions: pa.Table) -> dict:
        return write_partition(output, pid, decisions, self.staged_at)
