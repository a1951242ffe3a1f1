"""Incremental near dedup in Ray Data: a batch against an earlier version's partitioned index,
with the decisions of ``index_store.PartitionedNearIndex.decisions`` and nothing corpus-sized on
the driver.

1. The batch's row edges among itself (``distributed.near_edges``).
2. Per band, each (value, row) record goes to its postings bucket (``index_store.value_buckets``);
   a group reads that bucket's file of every part and joins every stored row holding a value within
   t bits of a new one to the batch (as stars: linear in postings).
3. Two shuffles by key bucket: a stored key to its representative, that to its row's node
   (``OLD_NODE``); a batch key the earlier version holds is refused.
4. ``distributed.component_decisions``, earlier rows preferred and never dropped. The graph lacks the
   in-process value nodes but has its components over the batch's rows and the representatives.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation.dedup.decisions import GlobalDedupInput
from curation.dedup.distributed import (
    candidates_dataset,
    near_edges,
    read_members,
    values_dataset,
    write_near_components,
)
from curation.dedup.incremental import refuse_reused_keys
from curation.dedup.index_store import PartitionedNearIndex, band_buckets, band_file, key_buckets, rows_file
from curation.dedup.near import DedupNearConfig, cross_pairs
from curation.dedup.shuffle import shuffle, slices

OLD_NODE = 1 << 62  # node ids of stored rows: OLD_NODE | part << 44 | bucket << 32 | position in the file
EDGE_SCHEMA = pa.schema([("row_id", pa.int64()), ("key", pa.string())])  # a batch row reaching a stored key
NEW_GROUPS = 1 << 30  # ``node >> 32`` below this: a staging partition; above: (part, bucket) of a stored row
MEMBER_TYPES = {
    "key": pa.string(),
    "width": pa.int32(),
    "height": pa.int32(),
    "converted": pa.bool_(),
    "input_bytes": pa.int64(),
    "partition": pa.string(),
    "row_id": pa.int64(),
    "label": pa.int64(),
    "_old": pa.bool_(),
}


@dataclasses.dataclass(frozen=True)
class IndexLayout:
    """What the tasks need of an index: each part's (filesystem, folder), the buckets each holds,
    the band plan and P; ``columns``: the representative rule's columns its rows carry."""

    parts: tuple[tuple[object, str], ...]
    row_buckets: tuple[frozenset, ...]
    band_buckets: tuple[tuple[frozenset, ...], ...]
    masks: tuple[int, ...]
    num_buckets: int
    columns: tuple[str, ...]

    @classmethod
    def of(cls, index: PartitionedNearIndex) -> IndexLayout:
        parts = index.header["parts"]
        located = tuple(index.locate(p) for p in parts)
        columns: tuple[str, ...] = ()
        for (fs, root), part in zip(located, parts):
            if part["row_buckets"]:
                with fs.open_input_file(rows_file(root, part["row_buckets"][0])) as fh:
                    columns = tuple(pq.read_schema(fh).names)
                break
        return cls(
            located,
            tuple(frozenset(p["row_buckets"]) for p in parts),
            tuple(tuple(frozenset(b) for b in p["band_buckets"]) for p in parts),
            tuple(int(m) for m in index.masks),
            int(index.header["num_buckets"]),
            columns,
        )

    def read(self, p: int, path_of, *at: int) -> pa.Table:
        """A file of part ``p``: ``path_of(part folder, *at)`` (``rows_file`` or ``band_file``)."""
        fs, root = self.parts[p]
        with fs.open_input_file(path_of(root, *at)) as fh:
            return pq.read_table(fh)


def _band_records(batch: pa.Table, masks: tuple[int, ...], num_buckets: int) -> pa.Table:
    """Per band j, each (value, row) record under its bucket ``j * P + value bucket``."""
    v, rows, n = batch.column("value").to_numpy(), batch.column("row_id").to_numpy(), len(masks)
    return pa.table({"_b": band_buckets(v, masks, num_buckets), "value": np.tile(v, n), "row_id": np.tile(rows, n)})


def _bucket_edges(rows: pa.Table, postings: pa.Table, mask: int, max_distance: int) -> pa.Table:
    """(row_id, stored key) edges joining the batch's records of one bucket to one stored part."""
    distinct, inverse = np.unique(rows.column("value").to_numpy(), return_inverse=True)
    first = np.full(len(distinct), np.iinfo(np.int64).max)
    np.minimum.at(first, inverse, rows.column("row_id").to_numpy())  # each value's smallest row
    keys = postings.column("value").to_numpy() & np.uint64(mask)
    postings = postings.filter(pa.array(np.isin(keys, distinct & np.uint64(mask))))
    old, holder = np.unique(postings.column("value").to_numpy(), return_inverse=True)
    i, j = cross_pairs(distinct, old, mask, max_distance)
    if not len(i):
        return EDGE_SCHEMA.empty_table()
    reach = np.full(len(old), np.iinfo(np.int64).max)
    np.minimum.at(reach, j, first[i])  # per stored value: the smallest new row reaching it
    hit = np.isin(np.arange(len(old)), j)[holder]
    held = postings.filter(pa.array(hit)).sort_by("key")
    anchor = {}  # per stored value its smallest key
    for v, k in zip(held.column("value").to_numpy(), held.column("key").to_pylist()):
        anchor.setdefault(int(v), k)
    held_at = np.searchsorted(old, held.column("value").to_numpy())
    anchors = pa.array([anchor[int(w)] for w in old[j]], pa.string())
    keys = pa.concat_arrays([held.column("key").combine_chunks(), anchors])
    return pa.table({"row_id": np.concatenate([reach[held_at], first[i]]), "key": keys})


def _join_buckets(group: pa.Table, layout: IndexLayout, max_distance: int) -> pa.Table:
    """The (row_id, stored key) edges of the buckets in one shuffle group (one file at a time)."""
    out = [EDGE_SCHEMA.empty_table()]
    for bucket, rows in slices(group, "_b"):
        j, b = divmod(bucket, layout.num_buckets)
        for p in range(len(layout.parts)):
            if b in layout.band_buckets[p][j]:
                out.append(_bucket_edges(rows, layout.read(p, band_file, j, b), layout.masks[j], max_distance))
    return pa.concat_tables(out)


def _key_bucket(batch: pa.Table, column: str, num_buckets: int) -> pa.Table:
    return batch.append_column("_kb", pa.array(key_buckets(batch.column(column).to_pylist(), num_buckets)))


def _stored(layout: IndexLayout, b: int, keys: pa.Array) -> pa.Table | None:
    """(key, representative) of the stored rows with these keys in rows bucket ``b`` of every part."""
    tables = [
        layout.read(p, rows_file, b).select(["key", "representative"])
        for p in range(len(layout.parts))
        if b in layout.row_buckets[p]
    ]
    tables = [t.filter(pc.is_in(t.column("key"), value_set=keys)) for t in tables]
    return pa.concat_tables(tables) if tables else None


def _representatives(group: pa.Table, layout: IndexLayout) -> pa.Table:
    """(row_id, representative key) per edge record (``new`` false) of the group. The batch's own
    keys come as ``new`` records: one the index already holds is refused."""
    out = [EDGE_SCHEMA.empty_table()]
    for b, rows in slices(group, "_kb"):
        stored = _stored(layout, b, pc.unique(rows.column("key")))
        if stored is None or not stored.num_rows:
            continue
        refuse_reused_keys(rows.filter(rows.column("new")).column("key"), stored.column("key"))
        edges = rows.filter(pc.invert(rows.column("new")))
        where = pc.index_in(edges.column("key"), value_set=stored.column("key"))
        out.append(pa.table({"row_id": edges.column("row_id"), "key": stored.column("representative").take(where)}))
    return pa.concat_tables(out)


def _rep_nodes(group: pa.Table, layout: IndexLayout) -> pa.Table:
    """Edges (a: new row, b: the representative's node) of one group of representative keys."""
    a, b_ = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for b, rows in slices(group, "_kb"):
        for p in range(len(layout.parts)):
            if b not in layout.row_buckets[p]:
                continue
            keys = layout.read(p, rows_file, b).column("key")
            where = pc.index_in(rows.column("key"), value_set=keys)
            found = pc.is_valid(where)
            pos = pc.fill_null(where, 0).to_numpy().astype(np.int64)[found.to_numpy(zero_copy_only=False)]
            a.append(rows.column("row_id").filter(found).to_numpy())
            b_.append(OLD_NODE | (p << 44) | (b << 32) | pos)
    return pa.table({"a": np.concatenate(a), "b": np.concatenate(b_)})


def _canonical(members: pa.Table, old: bool) -> pa.Table:
    names = [c for c in MEMBER_TYPES if c in members.column_names or c == "_old"]
    cols = [
        members.column(c).cast(MEMBER_TYPES[c]) if c != "_old" else pa.array(np.full(members.num_rows, old))
        for c in names
    ]
    return pa.table(dict(zip(names, cols)))


def _members_with_old(group: pa.Table, inp: GlobalDedupInput, layout: IndexLayout, columns: list[str]) -> pa.Table:
    """The labelled nodes of one group: a staging partition's rows, or one rows bucket file's."""
    pidx = int(group.column("pidx")[0].as_py())
    if pidx < NEW_GROUPS:
        return _canonical(read_members(group, inp).select([*columns, "partition", "row_id", "label"]), old=False)
    nodes, first = np.unique(group.column("node").to_numpy(), return_index=True)
    p, b = (pidx >> 12) & 0x3FFF, pidx & 0xFFF
    rows = layout.read(p, rows_file, b).take(pa.array(nodes & 0xFFFFFFFF))
    meta = rows.select(columns).append_column("partition", pa.nulls(len(nodes), pa.string()))
    meta = meta.append_column("row_id", pa.array(nodes)).append_column("label", group.column("label").take(first))
    return _canonical(meta, old=True)


def _edges_to_index(inp: GlobalDedupInput, values, layout: IndexLayout, cfg, parts: int):
    """Edges (a: new row, b: representative node) from the batch to the stored rows."""
    records = values.map_batches(
        _band_records, fn_kwargs={"masks": layout.masks, "num_buckets": layout.num_buckets}, batch_format="pyarrow"
    )
    joined = shuffle(
        records, "_b", _join_buckets, parts, fn_kwargs={"layout": layout, "max_distance": cfg.max_distance}
    )
    new_keys = candidates_dataset(inp, ["key"]).map_batches(_flagged, fn_kwargs={"new": True}, batch_format="pyarrow")
    edges = joined.map_batches(_flagged, fn_kwargs={"new": False}, batch_format="pyarrow").union(new_keys)
    kw = {"column": "key", "num_buckets": layout.num_buckets}
    for reduce in (_representatives, _rep_nodes):  # stored key -> its representative -> its node
        keyed = edges.map_batches(_key_bucket, fn_kwargs=kw, batch_format="pyarrow")
        edges = shuffle(keyed, "_kb", reduce, parts, fn_kwargs={"layout": layout})
    return edges


def _flagged(batch: pa.Table, new: bool) -> pa.Table:
    """(row_id, key, new): a batch row's own key (``new``) or a stored key it reaches."""
    return batch.select(["row_id", "key"]).append_column("new", pa.array(np.full(batch.num_rows, new)))


def near_against_decisions(inp: GlobalDedupInput, cfg: DedupNearConfig, index: PartitionedNearIndex, step: str) -> int:
    """The batch's near-duplicate decisions against ``index`` (module docstring), written per
    partition; returns rows dropped."""
    index.check(cfg)
    values = values_dataset(inp, cfg)
    n_values = values.count()
    if not n_values:
        return write_near_components(inp, None, step)
    layout = IndexLayout.of(index)
    within = near_edges(values, cfg, inp.num_partitions(n_values * (cfg.max_distance + 1)))
    edges = within.union(_edges_to_index(inp, values, layout, cfg, inp.num_partitions(n_values * len(layout.masks))))
    columns = [c for c in inp.meta() if c != "partition" and c in layout.columns]
    return write_near_components(
        inp, edges.materialize(), step, members=_members_with_old, layout=layout, columns=columns
    )
