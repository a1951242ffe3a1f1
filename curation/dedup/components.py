"""Duplicate groups as connected components, and the decision rows they produce.

Edges between candidate rows, components as the groups (scipy's in one process, star rounds in Ray
Data: ``shuffle``), one representative per group by the rule and one decision per other member:
membership is decided by components, not pair by pair, so a dropped row never represents a group.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA, decision_rows, rank_columns, representative_order

META_COLUMNS = ("key", "width", "height")  # what every dedup input holds
QUALITY_COLUMNS = ("converted", "input_bytes")  # decode's quality facts, read where present (else unknown)


def meta_columns(names: Collection[str]) -> list[str]:
    """The representative rule's columns among ``names``: ``META_COLUMNS``, the quality ones and the
    steps' rank columns (``rank_*``) present."""
    return [*META_COLUMNS, *(c for c in QUALITY_COLUMNS if c in names), *rank_columns(names)]


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


def decisions_from_labels(
    meta: pa.Table, labels: np.ndarray, reason: str, group_prefix: str, prefer: Collection[str] = ()
) -> pa.Table:
    """Decision rows (sorted by key) for rows of ``meta`` grouped by ``labels``: each group's first row
    under ``representative_order`` represents it, its id ``group_prefix`` + that row's key."""
    labels = np.asarray(labels, dtype=np.int64)
    members = np.flatnonzero(np.bincount(labels)[labels] > 1) if len(labels) else labels
    if not len(members):
        return DECISION_SCHEMA.empty_table()
    order = representative_order(meta.take(members), prefer)
    ranked = order.add_column(0, "label", pa.array(labels[members]))
    ranked = ranked.take(pc.sort_indices(ranked, sort_keys=[(c, "ascending") for c in ranked.column_names]))
    sorted_labels = ranked.column("label").to_numpy()
    first = np.concatenate([[True], sorted_labels[1:] != sorted_labels[:-1]])
    dropped = pa.array(~first)
    rep_keys = ranked.column("key").take(pa.array(np.flatnonzero(first)[np.cumsum(first) - 1])).filter(dropped)
    return decision_rows(ranked.column("key").filter(dropped), reason, rep_keys, group_prefix).sort_by("key")


def canonical_order(table: pa.Table) -> pa.Table:
    """Rows sorted by key, so every later step is independent of input and partition order."""
    if table.column("key").null_count:
        raise ValueError("candidate rows need a non-null 'key'")
    table = table.sort_by("key")
    keys = table.column("key").to_numpy(zero_copy_only=False)
    if len(dup := keys[1:][keys[1:] == keys[:-1]]):
        raise ValueError(f"candidate keys must be unique within a run; {dup[0]!r} appears more than once")
    return table
