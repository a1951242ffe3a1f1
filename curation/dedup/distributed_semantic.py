"""Semantic dedup in Ray Data (``dedup.engine=ray``): the decisions of
``semantic.semantic_duplicate_decisions`` and ``earlier.semantic_against``, nothing corpus-sized on
the driver.

1. **Centroids** (``fitted_centroids``): one task fits k-means on the in-process sample.
2. **Assignment**: a map gives every row its cluster; the driver reads the cluster sizes.
3. **Units**: a cluster is dealt into blocks of ``block_rows`` rows by a mix of the row id; each pair
   of blocks is one unit, routed by one shuffle into groups of bounded bytes (``GROUP_BYTES``) and
   searched with ``semantic.similar_pairs`` (rechecked per pair: blocking changes no pair).
4. ``distributed.component_decisions``.

Against an earlier version a unit pairs a new block with an earlier one (its kept rows, assigned to
this run's centroids), and one shuffle by row id keeps each row's best match.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from curation.dedup import decision_rows
from curation.dedup.bands import mix64
from curation.dedup.decisions import PARTITIONED_DECISION_SCHEMA, GlobalDedupInput, clear_step
from curation.dedup.distributed import candidates_dataset, component_decisions, items_dataset, write_decisions
from curation.dedup.earlier import EarlierVersion, best_matches, best_per_row
from curation.dedup.semantic import (
    GROUP_PREFIX,
    SEMANTIC_DUPLICATE,
    DedupSemanticConfig,
    embeddings,
    key_rank,
    sample_centroids,
    similar_pairs,
)
from curation.dedup.shuffle import shuffle, slices
from infra import storage

GROUP_BYTES = 256 * 2**20  # embedding bytes of one shuffle group of units (what one reduce holds)
MAX_GROUPS = 1024
EMBEDDING = pa.list_(pa.float32())
MATCH_SCHEMA = pa.schema(
    {"row_id": pa.int64(), "key": pa.string(), "partition": pa.string(), "score": pa.float64(), "match": pa.string()}
)


def _fit(refs: list, n_rows: int, cfg: DedupSemanticConfig) -> np.ndarray:
    import ray

    tables = [t for t in ray.get(list(refs)) if t.num_rows]
    return sample_centroids(pa.concat_tables(tables), n_rows, cfg)


def _ranked_below(batch: pa.Table, limit: int) -> pa.Table:
    """The rows whose key rank (``semantic.key_rank``) is below ``limit``."""
    return batch.filter(pa.array(key_rank(batch.column("key").to_pylist()) < np.uint64(limit)))


def fitted_centroids(inp: GlobalDedupInput, n_rows: int, cfg: DedupSemanticConfig):
    """An object reference to the k-means centroids of the candidates, fitted in a Ray task on the
    in-process sample (the ``kmeans_sample_size`` smallest key ranks, in key order)."""
    import ray

    keyed = candidates_dataset(inp, ["key", cfg.embedding_column])
    fraction = 2.0 * cfg.kmeans_sample_size / n_rows
    while fraction < 1.0:
        sample = keyed.map_batches(
            _ranked_below, fn_kwargs={"limit": int(fraction * 2**64)}, batch_format="pyarrow"
        ).materialize()
        if sample.count() >= cfg.kmeans_sample_size:
            break
        fraction *= 4
    else:
        sample = keyed.materialize()
    return ray.remote(_fit).remote(sample.to_arrow_refs(), n_rows, cfg)


def num_clusters(n_rows: int, cfg: DedupSemanticConfig) -> int:
    """k of the fit (``fit_centroids`` caps it at the sample size)."""
    return min(cfg.clusters_for(n_rows), cfg.kmeans_sample_size, n_rows)


def _assign(batch: pa.Table, column: str, centroids, side: int) -> pa.Table:
    """The batch with its cluster and ``side`` (0: this run's row, 1: an earlier version's)."""
    import ray

    batch = batch.set_column(batch.schema.get_field_index(column), column, batch.column(column).cast(EMBEDDING))
    clusters = ray.get(centroids).assign(embeddings(batch, column)) if batch.num_rows else []
    return batch.append_column("cluster", pa.array(clusters, pa.int32())).append_column(
        "side", pa.array(np.full(batch.num_rows, side, np.int8))
    )


def _earlier_assigned(batch: dict, uri: str, column: str, centroids) -> pa.Table:
    """Some of an earlier version's manifest parts: their kept (key, embedding), assigned."""
    earlier = EarlierVersion.open(uri)
    tables = [earlier.kept_part(str(p), ["key", column]) for p in batch["path"]]
    kept = pa.concat_tables([t.cast(pa.schema([("key", pa.string()), (column, EMBEDDING)])) for t in tables])
    n = kept.num_rows
    rows = kept.add_column(1, "partition", pa.nulls(n, pa.string())).append_column("row_id", pa.array(np.full(n, -1)))
    return _assign(rows, column, centroids, side=1)


def cluster_sizes(assigned, k: int) -> np.ndarray:
    """Rows per (side, cluster): a (2, k) array, from one aggregation (k rows reach the driver)."""
    sizes = np.zeros((2, k), np.int64)
    groups = max(1, min(64, k // 4096))  # (Ray Data's default, 200 groups, costs seconds per shuffle even for k = 10)
    for r in assigned.groupby(["side", "cluster"], num_partitions=groups).count().take_all():
        sizes[int(r["side"]), int(r["cluster"])] = int(r["count()"])
    return sizes


def unit_groups(inp: GlobalDedupInput, assigned, sizes: np.ndarray, blocks: np.ndarray) -> int:
    """Shuffle groups for the unit records of the ``assigned`` rows (``sizes``, ``blocks``: per side and
    cluster; a row has one record per block of the other side, of its own with one side)."""
    if inp.shuffle_partitions:
        return inp.shuffle_partitions
    records = int((sizes * blocks[::-1]).sum())
    per_record = assigned.size_bytes() / max(int(sizes.sum()), 1)
    return max(1, min(MAX_GROUPS, math.ceil(records * per_record / GROUP_BYTES)))


def _own_block(batch: pa.Table, blocks: np.ndarray) -> np.ndarray:
    """Each row's block of its cluster: a mix of its row id (of its key's rank for an earlier row)."""
    ids = batch.column("row_id").to_numpy().astype(np.uint64)
    old = batch.column("row_id").to_numpy() < 0
    if old.any():
        ids[old] = key_rank(batch.column("key").filter(pa.array(old)).to_pylist())
    return (mix64(ids) % np.maximum(blocks, 1).astype(np.uint64)).astype(np.int64)


def _units(batch: pa.Table, blocks, column: str, cross: bool) -> pa.Table:
    """One record per (row, unit holding its block). ``blocks[side, cluster]``: blocks of a cluster
    (0: no unit). Within the run (``cross`` False) a unit is a pair of blocks lo <= hi of one
    cluster; against an earlier version it is (new block, earlier block)."""
    import ray

    blocks = ray.get(blocks)
    cluster = batch.column("cluster").to_numpy().astype(np.int64)
    side = batch.column("side").to_numpy().astype(np.int64)
    mine_of = blocks[side, cluster]
    own = _own_block(batch, mine_of)
    counts = blocks[1 - side, cluster] if cross else mine_of  # one copy per unit holding the row's block
    idx = np.repeat(np.arange(len(counts)), counts)
    other = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    mine, side = own[idx], side[idx]
    if cross:
        first, second = np.where(side == 0, mine, other), np.where(side == 0, other, mine)
    else:
        first, second = np.minimum(mine, other), np.maximum(mine, other)
    keep = [c for c in ("row_id", "key", "partition", column, "side") if c in batch.column_names]
    return (
        batch.select(keep)
        .take(pa.array(idx, pa.int64()))
        .append_column("block", pa.array(mine))
        .append_column("unit", pa.array((cluster[idx] << 32) | (first << 16) | second, pa.int64()))
    )


def _unit_pairs(group: pa.Table, column: str, threshold: float) -> pa.Table:
    """Row pairs with cosine >= threshold in each unit of one shuffle group."""
    a, b = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for unit, rows in slices(group, "unit"):
        lo, hi = unit >> 16 & 0xFFFF, unit & 0xFFFF
        ids, block = rows.column("row_id").to_numpy(), rows.column("block").to_numpy()
        x = embeddings(rows, column)
        if lo == hi:
            i, j, _ = similar_pairs(x, x, threshold, upper=True)
            a.append(ids[i])
            b.append(ids[j])
            continue
        first, second = block == lo, block == hi
        i, j, _ = similar_pairs(x[first], x[second], threshold)
        a.append(ids[first][i])
        b.append(ids[second][j])
    return pa.table({"a": np.concatenate(a), "b": np.concatenate(b)})


def _unit_matches(group: pa.Table, column: str, threshold: float) -> pa.Table:
    """Each new row's best earlier match in each unit (new block x earlier block) of one group."""
    out = []
    for _, rows in slices(group, "unit"):
        side = rows.column("side").to_numpy()
        new, old = rows.filter(pa.array(side == 0)), rows.filter(pa.array(side == 1))
        if not new.num_rows or not old.num_rows:
            continue
        best = best_matches(embeddings(new, column), embeddings(old, column), old.column("key"), threshold)
        found = new.select(["row_id", "key", "partition"]).take(best.column("row"))
        out.append(found.append_column("score", best.column("score")).append_column("match", best.column("key")))
    return pa.concat_tables(out) if out else MATCH_SCHEMA.empty_table()


def _best_of_row(group: pa.Table) -> pa.Table:
    """Per new row its best match over the units (``earlier.best_per_row``): a decision."""
    best = best_per_row(group, "row_id", "match")
    decided = decision_rows(best.column("key"), SEMANTIC_DUPLICATE, best.column("match"), GROUP_PREFIX)
    return decided.append_column("partition", best.column("partition")).cast(PARTITIONED_DECISION_SCHEMA)


def _blocks(sizes: np.ndarray, block_rows: int, minimum: int) -> np.ndarray:
    """Blocks per (side, cluster); 0 where a cluster has fewer than ``minimum`` rows of a side."""
    return np.where(sizes >= minimum, -(-sizes // block_rows), 0)


def _assigned(inp: GlobalDedupInput, columns: list[str], centroids, cfg: DedupSemanticConfig):
    """The candidates' ``columns`` with their cluster (``_assign``: this run's side)."""
    kw = {"column": cfg.embedding_column, "centroids": centroids, "side": 0}
    return candidates_dataset(inp, columns).map_batches(_assign, fn_kwargs=kw, batch_format="pyarrow")


def _unit_results(inp: GlobalDedupInput, rows, sizes, blocks, reduce, cross: bool, cfg: DedupSemanticConfig):
    """``reduce`` (``_unit_pairs`` or ``_unit_matches``) on each unit of the assigned ``rows``, routed
    by one shuffle into ``unit_groups`` groups (``sizes``, ``blocks``: per side and cluster)."""
    import ray

    kw = {"column": cfg.embedding_column}
    units = rows.map_batches(
        _units, fn_kwargs={**kw, "blocks": ray.put(blocks), "cross": cross}, batch_format="pyarrow"
    )
    parts = unit_groups(inp, rows, sizes, blocks)
    return shuffle(units, "unit", reduce, parts, fn_kwargs={**kw, "threshold": cfg.threshold})


def within_decisions(inp: GlobalDedupInput, cfg: DedupSemanticConfig):
    """Decisions (a lazy dataset) among the candidates, or None when there is no pair."""
    n = candidates_dataset(inp, ["key"]).count()
    if n < 2:
        return None
    k = num_clusters(n, cfg)
    rows = _assigned(inp, [cfg.embedding_column], fitted_centroids(inp, n, cfg), cfg).materialize()
    sizes = cluster_sizes(rows, k)[:1]
    blocks = _blocks(sizes, cfg.block_rows, 2)
    edges = _unit_results(inp, rows, sizes, blocks, _unit_pairs, False, cfg).materialize()
    if not edges.count():
        return None
    return component_decisions(inp, edges, SEMANTIC_DUPLICATE, GROUP_PREFIX, inp.num_partitions(edges.count()))


def against_decisions(inp: GlobalDedupInput, earlier: EarlierVersion, cfg: DedupSemanticConfig):
    """Decisions (a lazy dataset) dropping the candidates with an earlier kept match in their cluster."""
    n = candidates_dataset(inp, ["key"]).count()
    if not n or not earlier.parts or cfg.embedding_column not in earlier.columns:
        return None
    k, column = num_clusters(n, cfg), cfg.embedding_column
    centroids = fitted_centroids(inp, n, cfg)
    old = items_dataset("path", earlier.parts).map_batches(
        _earlier_assigned,
        batch_size=1,
        batch_format="numpy",
        fn_kwargs={"uri": earlier.uri, "column": column, "centroids": centroids},
    )
    rows = _assigned(inp, ["key", "partition", column], centroids, cfg).union(old).materialize()
    sizes = cluster_sizes(rows, k)
    blocks = _blocks(sizes, cfg.block_rows, 1) * (sizes.min(axis=0) > 0)  # a cluster needs both sides
    matches = _unit_results(inp, rows, sizes, blocks, _unit_matches, True, cfg)
    return shuffle(matches, "row_id", _best_of_row, inp.num_partitions(n))


def semantic_decisions(
    inp: GlobalDedupInput,
    cfg: DedupSemanticConfig,
    step: str,
    earlier: EarlierVersion | None = None,
    before: tuple[Callable, ...] = (),
) -> int:
    """The step's decisions over the run, written per partition; returns rows dropped. Stages in
    order, each on the rows the earlier ones left: ``before`` (functions of the input giving a
    decisions dataset or None), the earlier version (``against_decisions``), the run itself."""
    clear_step(*storage.resolve(inp.out), step)
    stages = [*before]
    if earlier is not None:
        stages.append(lambda i: against_decisions(i, earlier, cfg))
    stages.append(lambda i: within_decisions(i, cfg))
    found, total = [], 0
    for stage in stages:
        ds = stage(inp)
        if ds is None or not (ds := ds.materialize()).count():
            continue
        found.append(ds)
        merged = found[0].union(*found[1:]) if len(found) > 1 else found[0]
        total = write_decisions(merged, inp.out, step, inp.num_partitions(merged.count()))
        if step not in inp.earlier_steps:  # the next stage reads the rows these decisions left
            inp = dataclasses.replace(inp, earlier_steps=(*inp.earlier_steps, step))
    return total
