"""Global dedup as Ray Data jobs (``dedup.engine=ray``): nothing corpus-sized on the driver.

- **Exact**: one shuffle by SHA-256 (``exact.exact_duplicate_decisions`` per group).
- **Near** (``near_edges``): an *outer* plan of t + 1 blocks (two values within t agree on one) and,
  per outer block, the plan of the search inside it, both from the values' sample (``value_sample``:
  the in-process one); values shuffled by outer block key meet every partner within t in a group.
  Then ``component_decisions``, as in one process.
- **The near-dup index** (``write_near_index``): ``index_store``'s files, by the tasks of two shuffles.

Decisions are written per partition by the tasks that grouped them.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation import output
from curation.dedup import DECISION_SCHEMA, index_store
from curation.dedup.bands import (
    MIX_END,
    SAMPLE_SIZE,
    BandPlan,
    mix64,
    plan_bands,
    sample_bound,
    sample_values,
    sorted_unique,
)
from curation.dedup.components import decisions_from_labels
from curation.dedup.decisions import (
    PARTITIONED_DECISION_SCHEMA,
    GlobalDedupInput,
    clear_step,
    read_candidates,
    read_decisions,
    with_partitions,
    write_partition_decisions,
)
from curation.dedup.earlier import KEY_SHA, EarlierVersion
from curation.dedup.exact import exact_duplicate_decisions
from curation.dedup.hashing import hex_to_uint64
from curation.dedup.incremental import index_plan, indexed_rows
from curation.dedup.near import GROUP_PREFIX, NEAR_DUPLICATE, DedupNearConfig, row_values, value_edges
from curation.dedup.shuffle import connected_components, shuffle
from infra import storage

log = logging.getLogger("curation.dedup")


def items_dataset(name: str, values):
    """A Ray dataset of one item ``{name: value}`` per value (at most 200 blocks), for tasks reading them."""
    import ray.data

    return ray.data.from_items([{name: v} for v in values], override_num_blocks=max(1, min(len(values), 200)))


def candidates_dataset(inp: GlobalDedupInput, columns: list[str] | None = None):
    def _read(batch: dict) -> pa.Table:
        return pa.concat_tables(
            [read_candidates(inp, int(i), columns) for i in batch["pidx"]], promote_options="default"
        )

    return items_dataset("pidx", range(len(inp.pids))).map_batches(_read, batch_size=1, batch_format="numpy")


def _write_group(group: pa.Table, uri: str, step: str) -> pa.Table:
    fs, root = storage.resolve(uri)
    pid = group.column("partition")[0].as_py()
    write_partition_decisions(fs, root, step, pid, group)
    return pa.table({"partition": [pid], "dropped": [group.num_rows]})


def write_decisions(decisions_ds, uri: str, step: str, num_partitions: int) -> int:
    """Write a dataset of partitioned decisions (one file per partition); returns rows written."""
    fs, root = storage.resolve(uri)
    clear_step(fs, root, step)
    written = decisions_ds.groupby("partition", num_partitions=num_partitions).map_groups(
        _write_group, fn_kwargs={"uri": uri, "step": step}, batch_format="pyarrow"
    )
    return sum(int(r["dropped"]) for r in written.take_all())  # one small row per partition with drops


def _exact_group(group: pa.Table) -> pa.Table:
    """One shuffle group's exact duplicates. Rows marked ``_earlier`` (an earlier version's kept
    images, ``dedup.against``) are never dropped (``exact_duplicate_decisions``' ``earlier_kept``)."""
    old = None
    if "_earlier" in group.column_names:
        earlier = pc.fill_null(group.column("_earlier"), False)
        old, group = group.filter(earlier).select(["key", "sha256"]), group.filter(pc.invert(earlier))
    return with_partitions(exact_duplicate_decisions(group, old), group)


def _sha_key(batch: pa.Table) -> pa.Table:
    return batch.append_column("_sha", pa.array(hex_to_uint64(pc.utf8_slice_codeunits(batch.column("sha256"), 0, 16))))


def _earlier_kept(batch: dict, uri: str) -> pa.Table:
    """The kept (key, sha256) rows of some of an earlier version's manifest parts, marked ``_earlier``."""
    earlier = EarlierVersion.open(uri)
    table = pa.concat_tables(
        [KEY_SHA.empty_table(), *[earlier.kept_part(str(p), ["key", "sha256"]).cast(KEY_SHA) for p in batch["path"]]]
    )
    table = table.filter(pc.is_valid(table.column("sha256")))
    return _sha_key(table).append_column("_earlier", pa.array(np.ones(table.num_rows, bool)))


def exact_decisions(inp: GlobalDedupInput, step: str, earlier: EarlierVersion | None = None) -> int:
    """Exact duplicates (same SHA-256) over the run, one shuffle by digest; returns rows dropped.
    ``earlier``: its kept rows join the shuffle, read by Ray tasks part by part."""
    ds = candidates_dataset(inp, inp.meta("sha256")).map_batches(_sha_key, batch_format="pyarrow")
    parts = inp.partitions_by_input()
    if earlier is not None and earlier.parts:
        old = items_dataset("path", earlier.parts).map_batches(
            _earlier_kept, batch_size=1, batch_format="numpy", fn_kwargs={"uri": earlier.uri}
        )
        ds = ds.union(old)
        parts = max(parts, min(256, len(earlier.parts) // 4))
    decided = shuffle(ds, "_sha", lambda g: _exact_group(g.drop_columns(["_sha"])), parts)
    return write_decisions(decided, inp.out, step, parts)


def value_records(batch: pa.Table, cfg: DedupNearConfig) -> pa.Table:
    """(row_id, value) per distinct hash value of each row (``near.row_values``)."""
    rows, values = row_values(batch, cfg)
    return pa.table({"row_id": batch.column("row_id").take(pa.array(rows)), "value": pa.array(values, pa.uint64())})


def _values_below(batch: pa.Table, bound: int) -> pa.Table:
    values = sorted_unique(batch.column("value").to_numpy())
    return pa.table({"value": values if bound >= MIX_END else values[mix64(values) < np.uint64(bound)]})


def value_sample(values_ds) -> np.ndarray:
    """``bands.sample_values`` of a dataset's ``value`` column, gathered by tasks: each sends its
    distinct values under a ``mix64`` bound (~4 x SAMPLE_SIZE in all); the bound grows 16x while too
    few distinct values are under it (a corpus of few distinct values), up to every value."""
    bound = sample_bound(values_ds.count())
    while True:
        below = values_ds.map_batches(_values_below, fn_kwargs={"bound": bound}, batch_format="pyarrow")
        batches = below.iter_batches(batch_format="pyarrow", batch_size=None)
        kept = sorted_unique(np.concatenate([np.empty(0, np.uint64), *(b.column("value").to_numpy() for b in batches)]))
        if len(kept) >= SAMPLE_SIZE or bound == MIX_END:
            return sample_values(kept)
        bound = min(MIX_END, bound * 16)


def _outer_rows(batch: pa.Table, outer: BandPlan, num_partitions: int) -> pa.Table:
    """One record per (distinct value, outer block): shuffle group, block, value, row."""
    rows, values = batch.column("row_id").to_numpy(), batch.column("value").to_numpy()
    n = len(outer.blocks)
    keys = [mix64((values & np.uint64(b)) ^ np.uint64(i + 1)) for i, b in enumerate(outer.blocks)]
    part = np.concatenate([(k % np.uint64(num_partitions)).astype(np.int32) for k in keys])
    which = np.repeat(np.arange(n, dtype=np.int8), len(values))
    return pa.table({"_part": part, "outer": which, "value": np.tile(values, n), "row_id": np.tile(rows, n)})


def group_edges(group: pa.Table, inner: list[np.ndarray], max_distance: int, max_pairs: int) -> pa.Table:
    """Row edges found among the values of one shuffle group (module docstring); ``inner[i]``: the
    masks of the search within outer block i."""
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
        ea, eb = value_edges(distinct, inner[i], max_distance, max_pairs)
        out_a.append(first[ea])
        out_b.append(first[eb])
    a, b = np.concatenate(out_a), np.concatenate(out_b)
    keep = a != b
    return pa.table({"a": a[keep], "b": b[keep]})


def near_edges(values_ds, cfg: DedupNearConfig, num_partitions: int):
    """Row edges (a lazy dataset) of the rows whose values lie within t bits (module docstring)."""
    sample, t = value_sample(values_ds), cfg.max_distance  # the outer plan, then the search's in each block
    outer = plan_bands(sample, t, num_blocks=t + 1)
    inner = [plan_bands(sample, t, num_blocks=cfg.num_blocks, within=b).masks() for b in outer.blocks]
    records = values_ds.map_batches(
        _outer_rows, fn_kwargs={"outer": outer, "num_partitions": num_partitions}, batch_format="pyarrow"
    )
    kw = {"inner": inner, "max_distance": cfg.max_distance, "max_pairs": cfg.max_pairs_per_chunk}
    return records.groupby("_part", num_partitions=num_partitions).map_groups(
        group_edges, fn_kwargs=kw, batch_format="pyarrow"
    )


def values_dataset(inp: GlobalDedupInput, cfg: DedupNearConfig):
    """Every candidate's distinct hash values with its row id (materialised: read twice)."""
    return (
        candidates_dataset(inp, ["row_id", *cfg.hash_columns()])
        .map_batches(value_records, fn_kwargs={"cfg": cfg}, batch_format="pyarrow")
        .materialize()
    )


def read_members(group: pa.Table, inp: GlobalDedupInput) -> pa.Table:
    """The labelled rows (``node``: row id, ``label``) of one staging partition, with their metadata."""
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


def write_near_components(inp: GlobalDedupInput, edges, step: str, **kw) -> int:
    """Write the near decisions of the components of row ``edges`` (materialised; None: no values),
    ``kw`` passed on to ``component_decisions``; returns rows dropped."""
    n_edges = 0 if edges is None else edges.count()
    if not n_edges:
        clear_step(*storage.resolve(inp.out), step)
        return 0
    parts = inp.num_partitions(n_edges)
    decided = component_decisions(inp, edges, NEAR_DUPLICATE, GROUP_PREFIX, parts, **kw)
    return write_decisions(decided, inp.out, step, parts)


def near_decisions(inp: GlobalDedupInput, cfg: DedupNearConfig, step: str) -> int:
    """Near duplicates over the run (module docstring); returns rows dropped."""
    values = values_dataset(inp, cfg)
    n_values, edges, t = values.count(), None, time.perf_counter()
    if n_values:
        edges = near_edges(values, cfg, inp.num_partitions(n_values * (cfg.max_distance + 1))).materialize()
        log.info("near dedup: %d hash values, %d row edges in %.1f s", n_values, edges.count(), time.perf_counter() - t)
    return write_near_components(inp, edges, step)


def component_decisions(inp: GlobalDedupInput, edges, reason: str, prefix: str, parts: int, members=None, **kw):
    """Partitioned decisions (a lazy dataset) of the connected components of row ``edges`` (int64
    ``a``, ``b``: row ids): star rounds, the members' metadata read back by partition (``members``,
    default ``read_members``, called with ``inp`` and ``kw``), one shuffle by label choosing the
    representatives (``_near_group``)."""
    t = time.perf_counter()
    labels = connected_components(edges, parts).materialize()
    log.info("%s: components in %.1f s", prefix.rstrip(":"), time.perf_counter() - t)
    labelled = (
        labels.map_batches(_pidx, batch_format="pyarrow")
        .groupby("pidx", num_partitions=parts)
        .map_groups(members or read_members, fn_kwargs={"inp": inp, **kw}, batch_format="pyarrow")
    )
    return shuffle(labelled, "label", _near_group, parts, fn_kwargs={"reason": reason, "prefix": prefix})


def _index_rows(batch: pa.Table, inp: GlobalDedupInput, cfg: DedupNearConfig, step: str) -> pa.Table:
    """Index rows (``incremental.indexed_rows``) of the batch's partitions, each representative read
    from the partition's decisions of ``step``."""
    fs, root = storage.resolve(inp.out)
    pids = pc.unique(batch.column("partition")).to_pylist()
    decided = pa.concat_tables([DECISION_SCHEMA.empty_table(), *(read_decisions(fs, root, p, step) for p in pids)])
    return indexed_rows(batch.drop_columns(["partition", "row_id"]), cfg, decided)


def _key_sums(batch: pa.Table, cfg) -> pa.Table:
    """Rows, postings per band (their distinct hash values) and the key digest of one block."""
    key_sum = str(index_store.keys_sum(batch.column("key").to_pylist()))
    return pa.table({"rows": [batch.num_rows], "values": [len(row_values(batch, cfg)[1])], "sum": [key_sum]})


def _write_buckets_of(group: pa.Table, uri: str, **kw) -> pa.Table:
    written = index_store.write_buckets(storage.resolve(uri)[0], records=group, **kw)
    return pa.table({"_b": pa.array(written, pa.int64())})


def write_near_index(inp: GlobalDedupInput, cfg: DedupNearConfig, step: str, base=None) -> dict:
    """The run's near-dup index (``index_store``'s files: every near candidate with its representative),
    written by Ray tasks; a new one takes ``incremental.index_plan``, ``base`` (``dedup.against``) is
    extended as ``index_store.IndexExtension`` is: its settings and parts, then this run's."""
    fs, root = storage.resolve(inp.out)
    index_root = output.path(root, output.DEDUP_DIR, output.NEAR_INDEX_DIR)
    if storage.exists(fs, index_root):
        fs.delete_dir(index_root)
    rows = (
        candidates_dataset(inp, inp.meta(*cfg.hash_columns()))
        .map_batches(_index_rows, fn_kwargs={"inp": inp, "cfg": cfg, "step": step}, batch_format="pyarrow")
        .materialize()
    )
    n, n_values, key_sum = 0, 0, 0
    for r in rows.map_batches(_key_sums, fn_kwargs={"cfg": cfg}, batch_format="pyarrow").take_all():
        n, n_values, key_sum = n + int(r["rows"]), n_values + int(r["values"]), key_sum + int(r["sum"])
    settings = base.header if base else None
    if settings is None:
        plan = index_plan(n_values, cfg)
        settings = index_store.index_settings(cfg, plan.num_blocks, plan.masks(), index_store.default_buckets(n))
    parts = [_write_index_part(inp, cfg, rows, index_root, (n, n_values, key_sum), settings)] if n else []
    return index_store.write_header(fs, index_root, settings, parts, base)


def _write_index_part(inp: GlobalDedupInput, cfg, rows, index_root: str, sums: tuple, settings: dict) -> dict:
    """This run's part: ``rows`` shuffled into key bucket files and their postings into (band, value
    bucket) files by Ray tasks (``sums``: rows, postings per band, key digest); its header entry."""
    (n, n_values, key_sum), masks, p = sums, index_store.settings_masks(settings), settings["num_buckets"]
    pid = index_store.part_id(n, key_sum % 2**128)
    kw = {"uri": inp.out, "part": storage.join(index_root, index_store.relative_part(pid)), "num_buckets": p}
    records = rows.map_batches(index_store.row_records, fn_kwargs={"num_buckets": p}, batch_format="pyarrow")
    row_b = shuffle(records, "_b", _write_buckets_of, inp.num_partitions(n), fn_kwargs={**kw, "kind": "rows"})
    kw_bands = {"cfg": cfg, "masks": masks, "num_buckets": p}
    records = rows.map_batches(index_store.band_records, fn_kwargs=kw_bands, batch_format="pyarrow")
    parts = inp.num_partitions(n * len(masks))
    band_b = shuffle(records, "_b", _write_buckets_of, parts, fn_kwargs={**kw, "kind": "bands"})
    row_b, band_b = ([int(r["_b"]) for r in ds.take_all()] for ds in (row_b, band_b))
    return index_store.part_entry(pid, n, row_b, band_b, settings, postings=n_values * len(masks))
