"""Writer: the WebDataset shards with their Parquet sidecars, and one manifest part per input partition.

Two layouts (``shards.samples_per_shard``, ``curation.config.ShardsConfig``):

- ``0``, per partition: for partition ``<pid>``, ``shards/<pid>.tar`` holds its kept samples
  sorted by key and ``shards/<pid>.parquet`` their metadata (no pixels), written by the
  partition's own task (``write_partition``) before its manifest part.
- ``N > 0``, mixed: shards of exactly N samples (the last: the rest), each kept sample placed by
  ``curation.sharding.Layout`` from its partition's first sample number; the samples travel to
  their shard in one Ray Data shuffle (``write_mixed_shards``), and each shard is written by one
  call of ``write_mixed_shard`` in its position order (``shards/<index>.tar`` and ``.parquet``).
  Manifest parts are written once every shard is.

``Shards.write_all`` writes either layout (its tasks on Ray); it is the only place that
knows which.

Either way, ``<key>.jpg`` + ``<key>.json`` per sample with fixed member metadata (mtime 0,
uid/gid 0), so equal content gives equal bytes; ``manifest/<pid>.parquet`` has one row per
input image of the partition (kept, dropped or error) with its reason, scores and shard. The
annotators' columns (cluster ids: ``curation.steps.AttributeStep``) are joined by key onto the kept
rows of both (``with_attributes``; null on the others). Each
file is written under a temporary name and renamed when complete, a tar before its sidecar
(a sidecar marks its shard complete) and the manifest part last: it is the partition's commit
marker. A partition with no kept sample writes no shard of its own, only its manifest part.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from curation import schema, staging
from curation.config import ShardsConfig
from curation.output import (
    CuratedOutput,
    empty_marker_path,
    manifest_part_path,
    shard_file_name,
    shard_path,
    sidecar_path,
    sidecar_stem,
)
from curation.sharding import Layout, first_numbers
from curation.steps import Writer
from infra import storage

log = logging.getLogger("curation")
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
    for bulky in schema.EMBEDDING_COLUMNS:  # kept in the sidecar; too bulky for every sample's json
        meta.pop(bulky, None)
    return meta


def _sample_members(rows: list[dict]):
    for row in rows:
        yield f"{row['key']}.{row['image_ext']}", row["image"]
        meta = json.dumps(sample_metadata(row), sort_keys=True, separators=(",", ":"), allow_nan=False)
        yield f"{row['key']}.json", meta.encode()


def write_tar(fs, path: str, rows: list[dict]) -> None:
    storage.write_tar_members(fs, path, _sample_members(rows))


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


def with_attributes(table: pa.Table, attributes: pa.Table | None) -> pa.Table:
    """``table`` (final statuses) with the annotators' columns (``attributes``: key + columns, one
    row per kept row) on its kept rows, null on the others. Any other match is a bug: raised."""
    if attributes is None:
        return table
    at = pc.index_in(table.column("key"), value_set=attributes.column("key"))
    kept = pc.equal(table.column("status"), schema.KEPT)
    matched = pc.and_(kept, pc.is_valid(at))
    n = pc.sum(matched).as_py() or 0
    if n != (pc.sum(kept).as_py() or 0) or n != attributes.num_rows:  # every kept row, and only those
        raise RuntimeError(
            f"annotations of {attributes.num_rows} rows do not match the {pc.sum(kept).as_py()} kept rows "
            f"of partition {table.column('partition')[0].as_py() if table.num_rows else '?'}"
        )
    columns = [c for c in attributes.column_names if c != "key"]
    return schema.with_columns(table, {c: attributes.column(c).take(at) for c in columns})


PLACE = ("_shard", "_pos")  # a kept row's place in the mixed layout, from its read task to its shard


def _staged_rows(output: str, pid: str, staged_at: str | None, columns: list[str] | None = None) -> pa.Table | None:
    fs, root = storage.resolve(output)
    return staging.read_partition_rows(fs, storage.resolve(staged_at)[1] if staged_at else root, pid, columns)


def kept_of(table: pa.Table) -> pa.Table:
    """The kept rows of a table with final statuses (``apply_decisions``), in its order."""
    return table.filter(pc.equal(table.column("status"), schema.KEPT))


def count_kept(output: str, pid: str, decisions: pa.Table, staged_at: str | None = None) -> dict:
    """One partition's kept samples and their input bytes: what the mixed layout is planned from."""
    staged = _staged_rows(output, pid, staged_at, ["key", "decode_ok", "reason", "input_bytes"])
    if staged is None:
        return {"partition": pid, "kept": 0, "bytes": 0}
    kept = kept_of(apply_decisions(staged, decisions))
    return {"partition": pid, "kept": kept.num_rows, "bytes": int(pc.sum(kept.column("input_bytes")).as_py() or 0)}


def _write_shard(fs, root: str, stem: str, kept: pa.Table) -> None:
    """Shard ``stem``: the tar of ``kept``'s rows in their order (bytes staged by reference read
    back from the input), then its sidecar, which marks the shard complete."""
    rows = kept.to_pylist()
    for i, data in staging.referenced_bytes(kept, [True] * kept.num_rows).items():
        rows[i]["image"] = data
    write_tar(fs, shard_path(root, stem), rows)
    sidecar = kept.drop_columns([c for c in _NOT_STORED if c in kept.column_names])
    sidecar = schema.with_columns(sidecar, {"shard": pa.array([shard_file_name(stem)] * kept.num_rows, pa.string())})
    storage.write_parquet(fs, sidecar_path(root, stem), sidecar)


def write_partition(
    output: str,
    pid: str,
    decisions: pa.Table,
    staged_at: str | None = None,
    placed: tuple[Layout, int] | None = None,
    attributes: pa.Table | None = None,
) -> dict:
    """The manifest part of one partition from its rows staged at ``staged_at`` (the last pass's
    staging root; default ``output``); returns its counts. ``placed`` None (per-partition
    layout): the partition's shard and sidecar are written first. ``placed`` = (mixed layout, the
    partition's first sample number): its kept rows' shards, written already, are named.
    ``attributes``: the annotators' columns of its kept rows (``with_attributes``)."""
    fs, root = storage.resolve(output)
    staged = _staged_rows(output, pid, staged_at)
    if staged is None:  # no image in this input partition: nothing to account for, but it is done
        storage.atomic_write_bytes(fs, empty_marker_path(root, pid), b"")
        return {"partition": pid, "rows": 0, "kept": 0}
    table = with_attributes(apply_decisions(staged, decisions), attributes)
    kept = kept_of(table)
    if placed is None:
        names = [shard_file_name(pid)] * kept.num_rows
        if kept.num_rows:
            _write_shard(fs, root, pid, kept)
    else:
        layout, first = placed
        names = [shard_file_name(layout.stem(int(s))) for s in layout.place(first, kept.num_rows)[0]]
    manifest = table.drop_columns([c for c in _NOT_STORED if c in table.column_names])
    in_order = iter(names)  # kept rows, in the table's (key) order
    shard_col = [next(in_order) if s == schema.KEPT else None for s in manifest.column("status").to_pylist()]
    manifest = schema.with_columns(manifest, {"shard": pa.array(shard_col, pa.string())})
    storage.write_parquet(fs, manifest_part_path(root, pid), manifest)
    return {"partition": pid, "rows": table.num_rows, "kept": kept.num_rows}


def placed_rows(
    output: str,
    pid: str,
    first: int,
    decisions: pa.Table,
    layout: Layout,
    done,
    staged_at: str | None = None,
    attributes: pa.Table | None = None,
) -> pa.Table:
    """Partition ``pid``'s kept rows bound for mixed shards not yet written (``done``: a bool
    per shard), with their image bytes, the annotators' columns and their place (``PLACE``:
    shard, position)."""
    kept = kept_of(with_attributes(apply_decisions(_staged_rows(output, pid, staged_at), decisions), attributes))
    shard, pos = layout.place(first, kept.num_rows)
    todo = ~done[shard]
    kept = kept.filter(pa.array(todo))
    kept = staging.load_image_bytes(kept, [True] * kept.num_rows)
    return schema.with_columns(kept, {PLACE[0]: pa.array(shard[todo]), PLACE[1]: pa.array(pos[todo])})


def write_mixed_shard(group: pa.Table, output: str, layout: Layout) -> pa.Table:
    """One mixed shard from all of its rows (one group of the shuffle), in position order; returns
    a one-row summary (shard, samples). A group that is not exactly the shard's positions is a bug."""
    shard = group.column(PLACE[0])[0].as_py()
    rows = group.sort_by(PLACE[1])
    if rows.column(PLACE[1]).to_pylist() != list(range(layout.size(shard))):
        raise RuntimeError(f"mixed shard {shard} got {rows.num_rows} rows, expected {layout.size(shard)}")
    fs, root = storage.resolve(output)
    _write_shard(fs, root, layout.stem(shard), rows.drop_columns(list(PLACE)).combine_chunks())
    return pa.table({"shard": [shard], "samples": [rows.num_rows]})


# Kept input bytes per group of the shuffle that carries the samples to their mixed shards.
SHUFFLE_GROUP_BYTES = 512 * 2**20


def _placed(
    batch: pa.Table, output: str, decisions, layout: Layout, done, staged_at: str | None, attributes
) -> pa.Table:
    pid, first = batch.column("partition")[0].as_py(), batch.column("first")[0].as_py()
    return placed_rows(output, pid, first, decisions(pid), layout, done, staged_at, _of(attributes, pid))


def write_mixed_shards(
    output: str,
    layout: Layout,
    counts: list[dict],
    firsts: dict[str, int],
    decisions: Callable[[str], pa.Table],
    staged_at: str | None = None,
    read_cpus: float = 1.0,
    attributes: Callable[[str], pa.Table | None] | None = None,
) -> None:
    """The mixed shards whose sidecar is not written yet: a Ray Data task per partition with kept
    samples (``counts``, from ``count_kept``) reads those bound for them (``placed_rows``), one
    shuffle by shard brings each shard's samples together, and each group is written as its shard
    (``write_mixed_shard``). What reaches the driver: one flag per shard and one row per shard written."""
    import numpy as np
    import ray.data

    done = np.zeros(layout.num_shards, bool)
    for path in CuratedOutput.at(output).sidecar_files():
        done[int(sidecar_stem(path))] = True
    todo = int((~done).sum())
    log.info("mixed shards: %d of %d to write (%d samples each)", todo, layout.num_shards, layout.samples_per_shard)
    if not todo:
        return
    items = [{"partition": c["partition"], "first": firsts[c["partition"]]} for c in counts]
    kwargs = {"output": output, "decisions": decisions, "layout": layout, "done": done, "staged_at": staged_at}
    kwargs["attributes"] = attributes
    ds = ray.data.from_items(items, override_num_blocks=min(len(items), 1000)).map_batches(
        _placed, batch_size=1, batch_format="pyarrow", fn_kwargs=kwargs, num_cpus=read_cpus
    )
    groups = max(1, min(todo, -(-sum(c["bytes"] for c in counts) // SHUFFLE_GROUP_BYTES)))
    written = (
        ds.groupby(PLACE[0], num_partitions=groups)
        .map_groups(write_mixed_shard, fn_kwargs={"output": output, "layout": layout}, batch_format="pyarrow")
        .take_all()
    )
    if len(written) != todo:
        raise RuntimeError(f"{len(written)} mixed shards written, {todo} expected")


def _of(attributes, pid: str) -> pa.Table | None:
    return attributes(pid) if attributes is not None else None


def _write_own_shard(pid: str, output: str, decisions, staged_at: str | None, attributes) -> dict:
    return write_partition(output, pid, decisions(pid), staged_at, attributes=_of(attributes, pid))


def _count(pid: str, output: str, decisions, staged_at: str | None) -> dict:
    return count_kept(output, pid, decisions(pid), staged_at)


def _write_placed(
    pid: str, output: str, decisions, staged_at: str | None, layout: Layout, firsts: dict, attributes
) -> dict:
    return write_partition(output, pid, decisions(pid), staged_at, (layout, firsts[pid]), _of(attributes, pid))


class Shards(Writer):
    """The recipe's last step and its one decision point: statuses from reasons and dedup
    decisions, then the shards with their sidecars, and each partition's manifest part."""

    section = "shards"
    Config = ShardsConfig
    reads = ("key", "image", "image_ext")

    def layout(self, total: int) -> Layout | None:
        """The mixed layout of a run of ``total`` kept samples; None for one shard per partition."""
        n = self.cfg.samples_per_shard
        return Layout(n, total, self.cfg.seed) if n else None

    def write_all(
        self,
        output: str,
        partitions: list[str],
        pending: list[str],
        decisions: Callable[[str], pa.Table],
        staged_at: str | None = None,
        read_cpus: float = 1.0,
        attributes: Callable[[str], pa.Table | None] | None = None,
    ) -> list[dict]:
        """The shards with their sidecars, and the manifest parts of the ``pending`` partitions,
        from the rows the last pass staged at ``staged_at`` (default ``output``); a task reads its
        partition's decisions only (``decisions(pid)``) and annotations (``attributes(pid)``, when
        the recipe has annotators). One shard per partition: each pending partition's task writes
        its shard, then its manifest part. Mixed shards: the kept counts of all ``partitions`` (a
        task each), the shards not yet complete (``write_mixed_shards``, its read tasks of
        ``read_cpus``), then the manifest parts naming them. Returns each written part's counts."""
        from infra.ray_runtime import map_tasks

        where = {"output": output, "decisions": decisions, "staged_at": staged_at}
        if not self.cfg.samples_per_shard:
            own = functools.partial(_write_own_shard, **where, attributes=attributes)
            return map_tasks(own, pending, num_cpus=1, name="curation.write")
        counts = map_tasks(functools.partial(_count, **where), partitions, num_cpus=1, name="curation.count_kept")
        layout = self.layout(sum(c["kept"] for c in counts))
        firsts = first_numbers({c["partition"]: c["kept"] for c in counts})
        kept = [c for c in counts if c["kept"]]
        write_mixed_shards(output, layout, kept, firsts, decisions, staged_at, read_cpus, attributes)
        manifest = functools.partial(_write_placed, **where, layout=layout, firsts=firsts, attributes=attributes)
        return map_tasks(manifest, pending, num_cpus=1, name="curation.write_manifest")

    def check_shard_sizes(self, sizes: list[int]) -> None:
        """In a mixed layout, every shard but the last holds exactly ``samples_per_shard`` samples."""
        n = self.cfg.samples_per_shard
        if n and (any(c != n for c in sizes[:-1]) or (sizes and not 0 < sizes[-1] <= n)):
            raise RuntimeError(f"shards of {n} samples expected, the shards hold {sizes}")
