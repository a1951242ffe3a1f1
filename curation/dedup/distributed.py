"""Global dedup as Ray Data jobs: nothing the size of the corpus passes through the driver.

The input is the run's staging (``curation.staging``): partition i's candidate rows (decoded,
no reason yet, not dropped by an earlier dedup step) are read by Ray tasks, one partition at
a time, with only the columns the steps read. Every row gets a *row id*
``i << 32 | position of its key in the partition`` (deterministic, no global numbering).

- **Exact**: one shuffle by SHA-256; each group decides its duplicates.
- **Near**: each row's distinct hash values go through one shuffle keyed by an *outer* block
  of the bits (a data-driven ``BandPlan`` of t + 1 blocks: any two values within t bits agree
  on one of them, so every such pair meets in one group); inside a group, the exact banded
  search (``near.value_edges``) with *inner* bands (each widened by the outer block) finds the
  value pairs, which become row edges (rows of one value are joined as a star to its smallest
  row). Connected components of the row edges (``shuffle.connected_components``), the
  members' metadata read back partition by partition, then one shuffle by component label
  chooses the representatives with ``components.decisions_from_labels``, exactly as the
  in-process search does (the exactness tests compare the two).

Decisions land partitioned by the dropped row's own partition, one Parquet file per step and
partition (``output.decisions_path``), written by the task that grouped them; the shard
writer reads only its partition's files. The driver sees counts, the list of partitions and
a fixed-size sample of hash values (for the band plan).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation import output, staging
from curation.dedup import DECISION_SCHEMA
from curation.dedup.bands import BandPlan, bit_matrix, bit_statistics, greedy_blocks, interleaved, mix64
from curation.dedup.components import decisions_from_labels, meta_columns
from curation.dedup.exact import exact_against
from curation.dedup.hashing import hex_to_uint64
from curation.dedup.shuffle import connected_components, shuffle
from infra import storage

log = logging.getLogger("curation.dedup")
SAMPLE_ROWS = 20_000
ROWS_PER_SHUFFLE_PARTITION = 2_000_000
PARTITIONED_DECISION_SCHEMA = DECISION_SCHEMA.append(pa.field("partition", pa.string(), nullable=False))


@dataclasses.dataclass(frozen=True)
class GlobalDedupInput:
    """Where the candidates are and which columns to read (``steps.candidate_columns``)."""

    uri: str  # the curation output (its _staging holds the candidates)
    pids: tuple[str, ...]  # every partition of the run, in plan order
    columns: tuple[str, ...]  # read from staging
    absent: tuple[str, ...] = ()  # preferred columns no step wrote: nulls
    earlier_steps: tuple[str, ...] = ()  # their decisions remove rows before this step
    decisions_uri: str = ""  # the output whose _dedup holds the decisions (default: ``uri``)
    shuffle_partitions: int | None = None  # groups of every shuffle (None: one per ~2M records)

    @property
    def out(self) -> str:
        return self.decisions_uri or self.uri

    def meta(self, *extra: str) -> list[str]:
        """The representative rule's columns this run has, the partition and ``extra``."""
        return list(dict.fromkeys([*meta_columns(self.columns), *extra, "partition"]))

    def partitions_by_input(self) -> int:
        """Shuffle groups when the row count is not known yet: one per 4 input partitions."""
        return self.shuffle_partitions or max(1, min(256, len(self.pids) // 4))

    def num_partitions(self, records: int) -> int:
        if self.shuffle_partitions:
            return self.shuffle_partitions
        return max(1, min(256, math.ceil(records / ROWS_PER_SHUFFLE_PARTITION)))


def read_candidates(inp: GlobalDedupInput, pidx: int, columns: list[str] | None = None) -> pa.Table:
    """Partition ``pidx``'s candidate rows with ``row_id``, less rows earlier steps dropped."""
    fs, root = storage.resolve(inp.uri)
    pid = inp.pids[pidx]
    need = list(dict.fromkeys(["key", *(columns or inp.columns), "decode_ok", "reason"]))
    table = staging.read_partition_rows(fs, root, pid, [c for c in need if c not in (*inp.absent, "row_id")])
    names = list(dict.fromkeys([*(columns or inp.columns), "row_id"]))
    if table is None:
        return pa.table({c: pa.array([], pa.string()) for c in names if c != "row_id"}).append_column(
            "row_id", pa.array([], pa.int64())
        )
    table = table.append_column("row_id", pa.array((np.int64(pidx) << 32) + np.arange(table.num_rows)))
    ok = pc.and_(pc.fill_null(table.column("decode_ok"), False), pc.is_null(table.column("reason")))
    dropped = decided_keys(*storage.resolve(inp.out), pid, inp.earlier_steps)
    if len(dropped):
        ok = pc.and_(ok, pc.invert(pc.is_in(table.column("key"), value_set=dropped)))
    table = table.filter(ok)
    for column in inp.absent:
        if column in names:
            table = table.append_column(column, pa.nulls(table.num_rows, pa.float32()))
    return table.select(names)


def decided_keys(fs, root: str, pid: str, steps: tuple[str, ...]) -> pa.Array:
    parts = [read_decisions(fs, root, pid, step).column("key") for step in steps]
    return pa.concat_arrays([c.combine_chunks() for c in parts]) if parts else pa.array([], pa.string())


def read_decisions(fs, root: str, pid: str, step: str) -> pa.Table:
    """One step's decisions for one partition (empty when it dropped nothing there)."""
    path = output.decisions_path(root, step, pid)
    if not storage.exists(fs, path):
        return DECISION_SCHEMA.empty_table()
    import pyarrow.parquet as pq

    with fs.open_input_file(path) as fh:
        return pq.read_table(fh).cast(DECISION_SCHEMA)


def decided_steps(fs, root: str) -> list[str]:
    """The dedup steps that have written decisions into the output at ``root``."""
    d = output.path(root, output.DEDUP_DIR, output.DECISIONS_DIR)
    if not storage.exists(fs, d):
        return []
    from pyarrow.fs import FileSelector, FileType

    return sorted(i.base_name for i in fs.get_file_info(FileSelector(d)) if i.type == FileType.Directory)


def partition_decisions(fs, root: str, pid: str) -> pa.Table:
    """Every step's decisions for one partition, by key (what its shard writer applies)."""
    parts = [read_decisions(fs, root, pid, s) for s in decided_steps(fs, root)]
    return pa.concat_tables([DECISION_SCHEMA.empty_table(), *parts]).sort_by("key")


def candidates_dataset(inp: GlobalDedupInput, columns: list[str] | None = None):
    import ray.data

    def _read(batch: dict) -> pa.Table:
        return pa.concat_tables(
            [read_candidates(inp, int(i), columns) for i in batch["pidx"]], promote_options="default"
        )

    items = ray.data.from_items(
        [{"pidx": i} for i in range(len(inp.pids))], override_num_blocks=max(1, min(len(inp.pids), 200))
    )
    return items.map_batches(_read, batch_size=1, batch_format="numpy")


# ---- writing decisions ------------------------------------------------------------------------


def _write_group(group: pa.Table, uri: str, step: str) -> pa.Table:
    fs, root = storage.resolve(uri)
    pid = group.column("partition")[0].as_py()
    rows = group.drop_columns(["partition"]).cast(DECISION_SCHEMA).sort_by("key")
    storage.write_parquet(fs, output.decisions_path(root, step, pid), rows)
    return pa.table({"partition": [pid], "dropped": [rows.num_rows]})


def write_decisions(decisions_ds, uri: str, step: str, num_partitions: int) -> int:
    """Write a dataset of partitioned decisions (one file per partition); returns rows written."""
    fs, root = storage.resolve(uri)
    clear_step(fs, root, step)
    written = decisions_ds.groupby("partition", num_partitions=num_partitions).map_groups(
        _write_group, fn_kwargs={"uri": uri, "step": step}, batch_format="pyarrow"
    )
    return sum(int(r["dropped"]) for r in written.take_all())  # one small row per partition with drops


def clear_step(fs, root: str, step: str) -> None:
    d = output.path(root, output.DEDUP_DIR, output.DECISIONS_DIR, step)
    if storage.exists(fs, d):
        fs.delete_dir(d)


def with_partitions(decisions: pa.Table, meta: pa.Table) -> pa.Table:
    """Decision rows with the dropped row's partition (from ``meta``: key, partition)."""
    where = pc.index_in(decisions.column("key"), value_set=meta.column("key"))
    return decisions.append_column("partition", meta.column("partition").take(where)).cast(PARTITIONED_DECISION_SCHEMA)


# ---- exact ------------------------------------------------------------------------------------


def _exact_group(group: pa.Table, reason: str) -> pa.Table:
    """One shuffle group's exact duplicates. Rows marked ``_earlier`` (an earlier version's kept
    images, ``dedup.against``) are never dropped: every new row with their digest is dropped as a
    duplicate of the smallest earlier key with it; the other new rows group by digest."""
    earlier = pc.fill_null(group.column("_earlier"), False) if "_earlier" in group.column_names else None
    parts = [PARTITIONED_DECISION_SCHEMA.empty_table()]
    if earlier is not None and pc.any(earlier).as_py():
        old = group.filter(earlier).select(["key", "sha256"])
        group = group.filter(pc.invert(earlier))
        hit = pc.is_in(group.column("sha256"), value_set=old.column("sha256"))
        parts.append(with_partitions(exact_against(group.filter(hit).select(["key", "sha256"]), old), group))
        group = group.filter(pc.invert(hit))
    if group.num_rows >= 2:
        sha = group.column("sha256")
        codes = pc.index_in(sha, value_set=pc.unique(sha)).to_numpy()
        out = decisions_from_labels(group, codes, reason, "sha256:")
        digest = sha.take(pc.index_in(out.column("key"), value_set=group.column("key")))
        group_ids = pc.binary_join_element_wise("sha256:", pc.utf8_slice_codeunits(digest, 0, 16), "")
        out = out.set_column(out.schema.get_field_index("duplicate_group"), "duplicate_group", group_ids)
        parts.append(with_partitions(out, group))
    return pa.concat_tables(parts)


def _sha_key(batch: pa.Table) -> pa.Table:
    return batch.append_column("_sha", pa.array(hex_to_uint64(pc.utf8_slice_codeunits(batch.column("sha256"), 0, 16))))


def _earlier_kept(batch: dict, uri: str) -> pa.Table:
    """The kept (key, sha256) rows of some of an earlier version's manifest parts, marked ``_earlier``."""
    from curation.dedup.earlier import KEY_SHA, EarlierVersion

    earlier = EarlierVersion.open(uri)
    table = pa.concat_tables(
        [KEY_SHA.empty_table(), *[earlier.kept_part(str(p), ["key", "sha256"]).cast(KEY_SHA) for p in batch["path"]]]
    )
    table = table.filter(pc.is_valid(table.column("sha256")))
    return _sha_key(table).append_column("_earlier", pa.array(np.ones(table.num_rows, bool)))


def exact_decisions(inp: GlobalDedupInput, reason: str, step: str, earlier=None) -> int:
    """Exact duplicates (same SHA-256) over the run, one shuffle by digest; returns rows dropped.
    ``earlier`` (an ``EarlierVersion``): its kept rows join the shuffle, read by Ray tasks part by part."""
    ds = candidates_dataset(inp, inp.meta("sha256")).map_batches(_sha_key, batch_format="pyarrow")
    parts = inp.partitions_by_input()
    if earlier is not None and earlier.parts:
        import ray.data

        old = ray.data.from_items(
            [{"path": p} for p in earlier.parts], override_num_blocks=max(1, min(len(earlier.parts), 200))
        )
        ds = ds.union(
            old.map_batches(_earlier_kept, batch_size=1, batch_format="numpy", fn_kwargs={"uri": earlier.uri})
        )
        parts = max(parts, min(256, len(earlier.parts) // 4))
    decided = shuffle(ds, "_sha", lambda g: _exact_group(g.drop_columns(["_sha"]), reason), parts)
    return write_decisions(decided, inp.out, step, parts)


# ---- near: values -> edges ---------------------------------------------------------------------


def _row_values(batch: pa.Table, hash_columns: list[str]) -> pa.Table:
    """(row_id, value) per distinct hash value of each row."""
    rows = batch.column("row_id").to_numpy()
    cols = [hex_to_uint64(batch.column(c)) for c in hash_columns]
    ids, values = np.tile(rows, len(cols)), np.concatenate(cols)
    if len(cols) > 1:
        keep = np.concatenate([np.ones(len(rows), bool), cols[1] != cols[0]])
        ids, values = ids[keep], values[keep]
    return pa.table({"row_id": ids, "value": values})


def _sampled(batch: pa.Table, threshold: int) -> pa.Table:
    keep = mix64(batch.column("value").to_numpy()) < np.uint64(threshold)
    return batch.select(["value"]).filter(pa.array(keep))


def near_plan(values_ds, n_values: int, max_distance: int) -> tuple[BandPlan, int]:
    """(outer plan of t + 1 blocks for the shuffle, number of inner blocks for the search inside a
    group), from a sample of about ``SAMPLE_ROWS`` values chosen by their mix (the same values
    whatever the layout): outer blocks by ``bands.greedy_blocks``; inner blocks deal the other
    bits, their number by the expected cost with the bits' measured entropy."""
    threshold = min(2**64 - 1, int(2**64 * min(1.0, SAMPLE_ROWS / max(n_values, 1))))
    batches = values_ds.map_batches(_sampled, fn_kwargs={"threshold": threshold}, batch_format="pyarrow")
    sample = np.unique(
        np.concatenate(
            [b.column("value").to_numpy() for b in batches.iter_batches(batch_format="pyarrow", batch_size=None)]
            or [np.zeros(0, np.uint64)]
        )
    )
    t = max_distance
    if len(sample) < 2:
        return interleaved(t + 1, t), t + 1
    entropy, corr = bit_statistics(bit_matrix(sample))
    outer = greedy_blocks(entropy, corr, t + 1, t)
    per_key = n_values / 2 ** (float(entropy.sum()) / (t + 1))  # values sharing one outer key
    rest = float(entropy.sum()) * t / (t + 1)  # information in the other bits
    costs = {
        b: math.comb(b, t) * (1 + per_key / 2 ** (rest * (b - t) / b))
        for b in range(t + 1, 64 - 64 // (t + 1))
        if math.comb(b, t) <= 500
    } or {t + 1: 0.0}
    return outer, min(costs, key=lambda b: (costs[b], b))


def inner_masks(outer_block: int, num_blocks: int, max_distance: int) -> np.ndarray:
    """Bands over the bits outside ``outer_block`` (dealt into ``num_blocks`` blocks), each widened
    by the outer block: pairs within t bits that agree on the outer block agree on one of them."""
    bits = [p for p in range(64) if not outer_block >> p & 1]
    blocks = [sum(1 << p for p in bits[b::num_blocks]) for b in range(num_blocks)]
    return np.array(
        [
            outer_block | sum(blocks[i] for i in combo)
            for combo in itertools.combinations(range(num_blocks), num_blocks - max_distance)
        ],
        dtype=np.uint64,
    )


def _outer_rows(batch: pa.Table, outer: BandPlan, num_partitions: int) -> pa.Table:
    """One record per (distinct value, outer block): shuffle group, block, value, row."""
    rows, values = batch.column("row_id").to_numpy(), batch.column("value").to_numpy()
    blocks = outer.blocks
    keys = [mix64((values & np.uint64(b)) ^ np.uint64(i + 1)) for i, b in enumerate(blocks)]
    return pa.table(
        {
            "_part": np.concatenate([(k % np.uint64(num_partitions)).astype(np.int32) for k in keys]),
            "outer": np.repeat(np.arange(len(blocks), dtype=np.int8), len(values)),
            "value": np.tile(values, len(blocks)),
            "row_id": np.tile(rows, len(blocks)),
        }
    )


def _group_edges(group: pa.Table, outer: BandPlan, inner_blocks: int, max_distance: int, max_pairs: int) -> pa.Table:
    """Row edges found among the values of one shuffle group (see the module docstring)."""
    from curation.dedup.near import value_edges

    which = group.column("outer").to_numpy()
    values, rows = group.column("value").to_numpy(), group.column("row_id").to_numpy()
    out_a, out_b = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for i in np.unique(which):
        sel = which == i
        distinct, inverse = np.unique(values[sel], return_inverse=True)
        first = np.full(len(distinct), np.iinfo(np.int64).max)
        np.minimum.at(first, inverse, rows[sel])  # each value's smallest row
        out_a.append(rows[sel])  # rows of a value: a star to its smallest row
        out_b.append(first[inverse])
        ea, eb = value_edges(
            distinct, inner_masks(outer.blocks[i], inner_blocks, max_distance), max_distance, max_pairs
        )
        out_a.append(first[ea])
        out_b.append(first[eb])
    a, b = np.concatenate(out_a), np.concatenate(out_b)
    keep = a != b
    return pa.table({"a": a[keep], "b": b[keep]})


def near_edges(values_ds, n_values: int, cfg, num_partitions: int):
    outer, inner_blocks = near_plan(values_ds, n_values, cfg.max_distance)
    records = values_ds.map_batches(
        _outer_rows, fn_kwargs={"outer": outer, "num_partitions": num_partitions}, batch_format="pyarrow"
    )
    return records.groupby("_part", num_partitions=num_partitions).map_groups(
        _group_edges,
        fn_kwargs={
            "outer": outer,
            "inner_blocks": inner_blocks,
            "max_distance": cfg.max_distance,
            "max_pairs": cfg.max_pairs_per_chunk,
        },
        batch_format="pyarrow",
    )


# ---- near: components -> members -> decisions ---------------------------------------------------


def _members(group: pa.Table, inp: GlobalDedupInput) -> pa.Table:
    """The labelled rows of one staging partition, with their metadata."""
    nodes, labels = group.column("node").to_numpy(), group.column("label").to_numpy()
    nodes, first = np.unique(nodes, return_index=True)
    pidx = int(nodes[0] >> 32)
    meta = read_candidates(inp, pidx, inp.meta())
    where = np.searchsorted(meta.column("row_id").to_numpy(), nodes)
    meta = meta.take(pa.array(where))
    return meta.append_column("label", pa.array(labels[first]))


def _pidx(batch: pa.Table) -> pa.Table:
    return batch.append_column("pidx", pa.array(batch.column("node").to_numpy() >> 32))


def _near_group(group: pa.Table, reason: str, prefix: str) -> pa.Table:
    """Decisions of the components in one shuffle group. Rows marked ``_old`` (an earlier
    version's, ``dedup.against``) win the representative choice and are never dropped."""
    if group.num_rows < 2:
        return PARTITIONED_DECISION_SCHEMA.empty_table()
    labels = group.column("label").to_numpy()
    _, codes = np.unique(labels, return_inverse=True)
    old = pa.array([], pa.string())
    if "_old" in group.column_names:
        old = group.filter(pc.fill_null(group.column("_old"), False)).column("key").combine_chunks()
        group = group.drop_columns(["_old"])
    out = decisions_from_labels(group, codes, reason, prefix, prefer=set(old.to_pylist()))
    if len(old):
        out = out.filter(pc.invert(pc.is_in(out.column("key"), value_set=old)))
    return with_partitions(out, group)


def near_decisions(inp: GlobalDedupInput, cfg, reason: str, prefix: str, step: str) -> int:
    """Near duplicates over the run (module docstring); returns rows dropped."""
    values = (
        candidates_dataset(inp, ["row_id", *cfg.hash_columns()])
        .map_batches(_row_values, fn_kwargs={"hash_columns": cfg.hash_columns()}, batch_format="pyarrow")
        .materialize()
    )
    n_values = values.count()
    if n_values == 0:
        clear_step(*storage.resolve(inp.out), step)
        return 0
    parts = inp.num_partitions(n_values * (cfg.max_distance + 1))
    t = time.perf_counter()
    edges = near_edges(values, n_values, cfg, parts).materialize()
    log.info("near dedup: %d hash values, %d row edges in %.1f s", n_values, edges.count(), time.perf_counter() - t)
    if edges.count() == 0:
        clear_step(*storage.resolve(inp.out), step)
        return 0
    parts = inp.num_partitions(edges.count())
    return write_decisions(component_decisions(inp, edges, reason, prefix, parts), inp.out, step, parts)


def component_decisions(inp: GlobalDedupInput, edges, reason: str, prefix: str, parts: int, members=None, **kw):
    """Partitioned decisions (a lazy dataset) of the connected components of row ``edges`` (int64
    ``a``, ``b``: row ids): star rounds, the members' metadata read back partition by partition
    (``members``, default ``_members``; called with ``inp`` and ``kw``), one shuffle by component
    label choosing the representatives (``_near_group``). Near and semantic dedup share it."""
    t = time.perf_counter()
    labels = connected_components(edges, parts).materialize()
    log.info("%s: components in %.1f s", prefix.rstrip(":"), time.perf_counter() - t)
    labelled = (
        labels.map_batches(_pidx, batch_format="pyarrow")
        .groupby("pidx", num_partitions=parts)
        .map_groups(members or _members, fn_kwargs={"inp": inp, **kw}, batch_format="pyarrow")
    )
    return shuffle(labelled, "label", _near_group, parts, fn_kwargs={"reason": reason, "prefix": prefix})


# ---- near: the partitioned index the next version searches --------------------------------------


def _index_rows(batch: pa.Table, inp: GlobalDedupInput, cfg, step: str) -> pa.Table:
    """Index rows (``index_store``'s: prepared candidates and their representative) of the batch's
    partitions, the representative read from the partition's decisions of ``step``."""
    from curation.dedup.near import _prepare

    fs, root = storage.resolve(inp.out)
    dup_of: dict[str, str] = {}
    for pid in pc.unique(batch.column("partition")).to_pylist():
        d = read_decisions(fs, root, pid, step)
        dup_of.update(zip(d.column("key").to_pylist(), d.column("duplicate_of").to_pylist()))
    rows = _prepare(batch.drop_columns([c for c in ("partition", "row_id") if c in batch.column_names]), cfg)
    reps = [dup_of.get(k, k) for k in rows.column("key").to_pylist()]
    return rows.append_column("representative", pa.array(reps, pa.string()))


def _key_sums(batch: pa.Table, cfg) -> pa.Table:
    """Rows, postings per band (their distinct hash values) and the key digest of one block."""
    from curation.dedup.index_store import keys_sum
    from curation.dedup.near import row_values

    return pa.table(
        {
            "rows": [batch.num_rows],
            "values": [len(row_values(batch, cfg)[1])],
            "sum": [str(keys_sum(batch.column("key").to_pylist()))],
        }
    )


def _row_bucket_of(batch: pa.Table, num_buckets: int) -> pa.Table:
    from curation.dedup.index_store import key_buckets

    return batch.append_column("_b", pa.array(key_buckets(batch.column("key").to_pylist(), num_buckets)))


def _band_records(batch: pa.Table, cfg, masks: np.ndarray, num_buckets: int) -> pa.Table:
    """Per band j and distinct hash value of a row: (value, key, _b = j * P + value bucket)."""
    from curation.dedup.index_store import postings, value_buckets

    post = postings(batch, cfg)
    v = post.column("value").to_numpy()
    return pa.concat_tables(
        [
            post.append_column("_b", pa.array(j * num_buckets + value_buckets(v, int(m), num_buckets)))
            for j, m in enumerate(masks)
        ]
    )


def _write_buckets_of(group: pa.Table, uri: str, part: str, num_buckets: int, kind: str) -> pa.Table:
    """Every bucket file of one shuffle group (rows by ``_b`` = key bucket, or postings by
    ``_b`` = band * P + value bucket); returns the ``_b`` written."""
    from curation.dedup.index_store import bucket_slices, write_band_bucket, write_row_bucket

    fs, _ = storage.resolve(uri)
    written = bucket_slices(group.column("_b").to_numpy())
    body = group.drop_columns(["_b"])
    for b, idx in written.items():
        if kind == "rows":
            write_row_bucket(fs, part, b, body.take(idx))
        else:
            write_band_bucket(fs, part, b // num_buckets, b % num_buckets, body.take(idx))
    return pa.table({"_b": pa.array(list(written), pa.int64())})


def write_near_index(inp: GlobalDedupInput, cfg, step: str, base=None) -> dict:
    """The run's near-dup index (``curation.dedup.index_store``'s format: one part of every near
    candidate with its representative), written under the output by Ray tasks: rows shuffled by
    key bucket, postings by (band, value bucket), each group writing its bucket files. The driver
    holds counts, the per-block key digests and the lists of buckets written. The band plan is the
    index's (``NearDupConfig.index_num_blocks`` or ``incremental.index_plan``), not the search's.
    ``base`` (the earlier version's ``PartitionedNearIndex``, ``dedup.against``): the index extends
    it, as ``index_store.IndexExtension`` does on the driver: its plan and P, its parts listed
    first, this run's rows one new part."""
    from curation.dedup.index_store import write_header

    fs, root = storage.resolve(inp.out)
    index_root = output.path(root, output.DEDUP_DIR, output.NEAR_INDEX_DIR)
    if storage.exists(fs, index_root):
        fs.delete_dir(index_root)
    rows = (
        candidates_dataset(inp, inp.meta(*cfg.hash_columns()))
        .map_batches(_index_rows, fn_kwargs={"inp": inp, "cfg": cfg, "step": step}, batch_format="pyarrow")
        .materialize()
    )
    sums = [
        (int(r["rows"]), int(r["values"]), int(r["sum"]))
        for r in rows.map_batches(_key_sums, fn_kwargs={"cfg": cfg}, batch_format="pyarrow").take_all()
    ]
    n, n_values = sum(r for r, _, _ in sums), sum(v for _, v, _ in sums)
    plan, parts = _index_plan(cfg, n, n_values, base, fs, index_root)
    blocks, max_distance, masks, p = plan
    if n:
        parts.append(_write_index_part(inp, cfg, rows, index_root, sums, masks, p))
    if base is not None:
        h = base.header
        cfg = dataclasses.replace(cfg, hash=h["hash"], match_mirrored=h["match_mirrored"])
    return write_header(
        fs, index_root, cfg, masks=masks, num_blocks=blocks, max_distance=max_distance, num_buckets=p, parts=parts
    )


def _write_index_part(inp: GlobalDedupInput, cfg, rows, index_root: str, sums: list, masks: np.ndarray, p: int) -> dict:
    """This run's part of the index: ``rows`` (with representatives) shuffled into P key buckets and
    their postings into (band, value bucket) files, by Ray tasks; its header entry."""
    from curation.dedup.index_store import part_dir, part_entry, part_id

    n, n_values = sum(r for r, _, _ in sums), sum(v for _, v, _ in sums)
    pid = part_id(n, sum(s for _, _, s in sums) % 2**128)
    kw = {"uri": inp.out, "part": part_dir(index_root, pid), "num_buckets": p}
    row_b = shuffle(
        rows.map_batches(_row_bucket_of, fn_kwargs={"num_buckets": p}, batch_format="pyarrow"),
        "_b",
        _write_buckets_of,
        inp.num_partitions(n),
        fn_kwargs={**kw, "kind": "rows"},
    )
    records = rows.map_batches(
        _band_records, fn_kwargs={"cfg": cfg, "masks": masks, "num_buckets": p}, batch_format="pyarrow"
    )
    band_b = shuffle(
        records, "_b", _write_buckets_of, inp.num_partitions(n * len(masks)), fn_kwargs={**kw, "kind": "bands"}
    )
    written = np.concatenate(
        [b.column("_b").to_numpy() for b in band_b.iter_batches(batch_format="pyarrow", batch_size=None)]
        or [np.zeros(0, int)]
    )
    rows_written = [int(r["_b"]) for r in row_b.take_all()]
    bands_written = [written[written // p == j] % p for j in range(len(masks))]
    return part_entry(pid, n, rows_written, bands_written, postings=n_values * len(masks))


def _index_plan(cfg, n: int, n_values: int, base, fs, index_root: str) -> tuple[tuple, list[dict]]:
    """((B, t, masks, P), the parts listed before this run's): a new index's own plan, or ``base``'s."""
    from curation.dedup.incremental import index_plan
    from curation.dedup.index_store import default_buckets

    if base is None:  # the index's plan, not the search's
        plan = index_plan(n_values, cfg.max_distance, num_blocks=cfg.index_num_blocks)
        return (plan.num_blocks, cfg.max_distance, plan.masks(), default_buckets(n)), []
    h = base.header
    listed = [base.listed_from(part, fs, index_root) for part in h["parts"]]
    return (h["num_blocks"], h["max_distance"], base.masks, h["num_buckets"]), listed
