"""The Ray Data shuffle the distributed dedup steps share, and connected components on it.

``shuffle(ds, key, reduce)`` calls ``reduce`` once per group of rows (routed by splitmix64 of a
64-bit key), with the group's rows as one table: reduces sort what they need, so results do not
depend on row order. ``connected_components(edges)`` labels each node with the smallest node of its
component, by alternating large-star / small-star rounds (Kiveris et al., 2014), one shuffle each,
until a round changes no edge; only each round's count of changed edges reaches the driver.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from curation.dedup.bands import mix64

log = logging.getLogger("curation.dedup")

MAX_ROUNDS = 64
EDGE_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("changed", pa.int8())])


def _with_part(batch: pa.Table, key: str, num_partitions: int) -> pa.Table:
    keys = batch.column(key).to_numpy().astype(np.uint64)
    return batch.append_column("_part", pa.array((mix64(keys) % np.uint64(num_partitions)).astype(np.int32)))


def shuffle(ds, key: str, reduce, num_partitions: int, fn_kwargs: dict | None = None):
    """``reduce(group_table, **fn_kwargs)`` on each of ``num_partitions`` groups of rows by ``key``."""

    def _reduce(group: pa.Table) -> pa.Table:
        return reduce(group.drop_columns(["_part"]), **(fn_kwargs or {}))

    return (
        ds.map_batches(_with_part, fn_kwargs={"key": key, "num_partitions": num_partitions}, batch_format="pyarrow")
        .groupby("_part", num_partitions=num_partitions)
        .map_groups(_reduce, batch_format="pyarrow")
    )


def slices(table: pa.Table, column: str):
    """(value, rows) for each distinct value of an integer ``column``, in value order."""
    table = table.sort_by(column)
    v = table.column(column).to_numpy()
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]]) if len(v) else np.zeros(0, np.int64)
    for s, e in zip(starts, [*starts[1:], len(v)]):
        yield int(v[s]), table.slice(int(s), int(e - s))


def unique_edges(a: np.ndarray, b: np.ndarray, changed: np.ndarray | None = None) -> pa.Table:
    """Distinct undirected edges (a > b after orienting; self-loops dropped), max ``changed`` per edge."""
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    keep = hi != lo
    hi, lo = hi[keep], lo[keep]
    ch = np.zeros(len(hi), np.int8) if changed is None else changed[keep].astype(np.int8)
    order = np.lexsort((-ch, lo, hi))
    hi, lo, ch = hi[order], lo[order], ch[order]
    first = np.ones(len(hi), dtype=bool)
    first[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    return pa.table({"a": hi[first], "b": lo[first], "changed": ch[first]}, schema=EDGE_SCHEMA)


def _directed(batch: pa.Table, both: bool) -> pa.Table:
    """Rows (node, other, changed) per edge: both directions (large-star), or larger -> smaller (small-star)."""
    a, b = batch.column("a").to_numpy(), batch.column("b").to_numpy()
    ch = batch.column("changed").to_numpy() if "changed" in batch.column_names else np.zeros(len(a), np.int8)
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    if both:
        hi, lo, ch = np.concatenate([hi, lo]), np.concatenate([lo, hi]), np.concatenate([ch, ch])
    return pa.table({"node": hi, "other": lo, "changed": ch.astype(np.int8)})


def _neighbourhoods(group: pa.Table) -> tuple[np.ndarray, ...]:
    """Per row, sorted by (node, other): node, other, changed, the node's group id and the minimum of
    its closed neighbourhood."""
    node, other = group.column("node").to_numpy(), group.column("other").to_numpy()
    order = np.lexsort((other, node))
    node, other, changed = node[order], other[order], group.column("changed").to_numpy()[order]
    starts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]]) if len(node) else np.zeros(0, np.int64)
    mins = np.minimum(np.minimum.reduceat(other, starts), node[starts]) if len(node) else other
    sizes = np.diff(np.r_[starts, len(node)])
    return node, other, changed, np.repeat(np.arange(len(starts)), sizes), np.repeat(mins, sizes)


def _large_star(group: pa.Table) -> pa.Table:
    """Each node links its larger neighbours to the minimum of its closed neighbourhood."""
    node, other, _, _, m = _neighbourhoods(group)
    keep = other > node
    return unique_edges(other[keep], m[keep], (m[keep] < node[keep]).astype(np.int8))


def _small_star(group: pa.Table) -> pa.Table:
    """Each node links itself and its smaller neighbours to the smallest of them."""
    node, other, incoming_changed, gid, m = _neighbourhoods(group)
    if not len(node):
        return EDGE_SCHEMA.empty_table()
    counts = np.bincount(gid)
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
    incoming = np.zeros(len(counts), np.int8)
    np.maximum.at(incoming, gid, incoming_changed)
    changed = ((counts[gid] > 1) | (incoming[gid] > 0)).astype(np.int8)  # this star or the large-star before it
    a = np.concatenate([other, node[starts]])
    b = np.concatenate([m, m[starts]])
    return unique_edges(a, b, np.concatenate([changed, changed[starts]]))


def _star(edges, reduce, both: bool, num_partitions: int):
    directed = edges.map_batches(_directed, fn_kwargs={"both": both}, batch_format="pyarrow")
    return shuffle(directed, "node", reduce, num_partitions)


def connected_components(edges, num_partitions: int):
    """``(node, label)`` for every node of ``edges`` (a dataset of int64 ``a``, ``b``)."""
    edges = edges.select_columns(["a", "b"])  # duplicate edges are merged by the first round
    # One round = a large-star then a small-star shuffle, materialised once; it changed nothing
    # (no edge replaced by either star) exactly when the edges form a star forest around minima.
    for rounds in range(MAX_ROUNDS):
        edges = _star(_star(edges, _large_star, True, num_partitions), _small_star, False, num_partitions).materialize()
        changed = sum(int(r["changed"]) for r in edges.map_batches(_changed, batch_format="pyarrow").take_all())
        log.info("connected components, round %d: %d edges changed", rounds + 1, changed)
        if changed == 0:
            return edges.map_batches(_labels, batch_format="pyarrow")
    raise RuntimeError(f"connected components did not converge in {MAX_ROUNDS} rounds")


def _changed(batch: pa.Table) -> pa.Table:
    """One row per block: its edges' ``changed`` count (a map: no aggregation shuffle per round)."""
    return pa.table({"changed": [int(np.sum(batch.column("changed").to_numpy()))]})


def _labels(batch: pa.Table) -> pa.Table:
    """In a star forest (a -> b with b the component's minimum): leaves and centres with their label."""
    a, b = batch.column("a").to_numpy(), batch.column("b").to_numpy()
    return pa.table({"node": np.concatenate([a, b]), "label": np.concatenate([b, b])})
