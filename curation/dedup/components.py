"""Duplicate groups as connected components, and the decision rows they produce.

Every dedup method ends the same way: an edge list between candidate rows (directly, or
through shared hash values), connected components of that graph as the groups, one
representative per group by ``representative_sort_key`` (an original encoding over a deliberate
conversion, then the steps' rank columns, then largest resolution, then most input bytes per
pixel, then smallest key), and
one decision row per other member. A dropped row
never represents another group: membership is decided by components, not pair by pair.

In one process, components come from scipy's union-find over a sparse graph; the distributed
global dedup computes them in Ray Data by star rounds (``curation.dedup.shuffle``) and then calls
``decisions_from_labels`` per component group, so both choose the same representatives.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA, rank_columns, representative_sort_key

META_COLUMNS = ("key", "width", "height")  # what every dedup input holds
QUALITY_COLUMNS = ("converted", "input_bytes")  # decode's quality facts, read where present (else unknown)


def meta_columns(names: Collection[str]) -> list[str]:
    """The representative rule's columns among ``names``: ``META_COLUMNS``, the quality ones and the
    steps' rank columns (``rank_*``) present."""
    return [*META_COLUMNS, *(c for c in QUALITY_COLUMNS if c in names), *rank_columns(names)]


def _rank_keys(sub: pa.Table) -> tuple[dict, list]:
    """The rank columns of ``sub`` (nulls as 0) and their sort keys, in the rule's order."""
    ranks = {c: pc.fill_null(sub.column(c).cast(pa.int64()), 0) for c in rank_columns(sub.column_names)}
    return ranks, [(c, "ascending") for c in ranks]


def component_labels(n_nodes: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each node, the smallest node id of its component (the same for any edge order)."""
    if len(a) == 0:
        return np.arange(n_nodes, dtype=np.int64)
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (np.asarray(a), np.asarray(b))), shape=(n_nodes, n_nodes))
    _, comp = connected_components(graph, directed=False)
    _, first = np.unique(comp, return_index=True)  # nodes are scanned in id order
    return first[comp].astype(np.int64)


def representative_rank(row: dict, prefer: Collection[str] = ()) -> tuple:
    """Sort key of the representative rule; keys in ``prefer`` (an existing version) win first."""
    return (0 if row["key"] in prefer else 1, *representative_sort_key(row))


def decisions_from_labels(
    meta: pa.Table, labels: np.ndarray, reason: str, group_prefix: str, prefer: Collection[str] = ()
) -> pa.Table:
    """Decision rows (sorted by key) for rows of ``meta`` grouped by ``labels``.

    ``meta`` holds ``META_COLUMNS``; ``labels[i]`` is row i's group label. The representative
    of each group is its first row under ``representative_rank`` (the same order, computed
    by one Arrow sort). The group id is ``group_prefix`` + the representative's key, so it
    does not depend on input order.
    """
    labels = np.asarray(labels, dtype=np.int64)
    members = np.flatnonzero(np.bincount(labels)[labels] > 1) if len(labels) else labels
    if not len(members):
        return DECISION_SCHEMA.empty_table()
    ranked = _ranked_members(meta.select(meta_columns(meta.column_names)).take(members), labels[members], prefer)
    return _decisions_from_ranked(ranked, reason, group_prefix)


def _ranked_members(sub: pa.Table, labels: np.ndarray, prefer: Collection[str]) -> pa.Table:
    """Group members sorted by label, then by ``representative_rank`` (one Arrow sort)."""
    keys = sub.column("key")
    pixels = pc.multiply(
        pc.fill_null(sub.column("width").cast(pa.int64()), 0), pc.fill_null(sub.column("height").cast(pa.int64()), 0)
    )
    unknown = pa.nulls(len(sub))
    converted = sub.column("converted") if "converted" in sub.column_names else unknown
    nbytes = sub.column("input_bytes") if "input_bytes" in sub.column_names else unknown
    per_pixel = pc.divide(
        pc.fill_null(nbytes.cast(pa.float64()), 0.0), pc.max_element_wise(pixels, 1).cast(pa.float64())
    )
    ranks, rank_keys = _rank_keys(sub)
    ranked = pa.table(
        {
            "label": labels,
            "other": pc.invert(pc.is_in(keys, value_set=pa.array(sorted(prefer), pa.string()))),
            "converted": pc.fill_null(converted.cast(pa.bool_()), False),
            **ranks,
            "pixels": pixels,
            "per_pixel": pc.if_else(pc.equal(pixels, 0), 0.0, per_pixel),
            "key": keys,
        }
    )
    return ranked.take(
        pc.sort_indices(
            ranked,
            sort_keys=[
                ("label", "ascending"),
                ("other", "ascending"),
                ("converted", "ascending"),
                *rank_keys,
                ("pixels", "descending"),
                ("per_pixel", "descending"),
                ("key", "ascending"),
            ],
        )
    )


def _decisions_from_ranked(ranked: pa.Table, reason: str, group_prefix: str) -> pa.Table:
    """Every member but each group's first is dropped as a duplicate of that first row."""
    sorted_labels = ranked.column("label").to_numpy()
    first = np.concatenate([[True], sorted_labels[1:] != sorted_labels[:-1]])
    rep_keys = ranked.column("key").take(pa.array(np.flatnonzero(first)[np.cumsum(first) - 1]))
    dropped = pa.array(~first)
    rep_keys = rep_keys.filter(dropped)
    out = pa.table(
        {
            "key": ranked.column("key").filter(dropped),
            "reason": pa.array(np.full(len(rep_keys), reason, dtype=object), pa.string()),
            "duplicate_of": rep_keys,
            "duplicate_group": pc.binary_join_element_wise(group_prefix, rep_keys, ""),
        }
    )
    return out.cast(DECISION_SCHEMA).sort_by("key")


def canonical_order(table: pa.Table) -> pa.Table:
    """Rows sorted by key, so every later step is independent of input and partition order."""
    keys = table.column("key")
    if keys.null_count:
        raise ValueError("candidate rows need a non-null 'key'")
    table = table.sort_by("key")
    sorted_keys = table.column("key").to_numpy(zero_copy_only=False)
    if len(sorted_keys) > 1 and (sorted_keys[1:] == sorted_keys[:-1]).any():
        dup = sorted_keys[1:][sorted_keys[1:] == sorted_keys[:-1]][0]
        raise ValueError(f"candidate keys must be unique within a run; {dup!r} appears more than once")
    return table
