"""Incremental near-duplicate dedup: a new batch against an existing dataset version.

A ``NearDupIndex`` summarises the existing version: its near-dedup candidates with each row's
representative (itself when kept, else its ``duplicate_of``), the distinct hash values and their
order under each band (on disk, partitioned: ``index_store``). Contract of ``incremental_decisions``:
existing rows are never dropped and an existing kept row stays its group's representative; for an
index built from V's candidates and decisions with the same settings, and any batch B,
``incremental_decisions(B, index, cfg) == near_duplicate_decisions(V + B, cfg, prefer=keys of V)``
restricted to B's keys, row for row (only the full recomputation may drop an old row, when a new
one bridges two old groups; incremental mode keeps it, by design).

The index's plan (``index_plan``) is chosen for ``index_workload``: each posting written once and
streamed once by a later batch (``POSTING_COST``), that batch ``INDEX_BATCH_FRACTION`` of the index
(at least ``INDEX_MIN_BATCH`` values). An index appended to keeps its plan.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA
from curation.dedup.bands import PAIR_COST, BandPlan, Workload, plan_bands
from curation.dedup.components import component_labels, decisions_from_labels, meta_columns
from curation.dedup.near import (
    GROUP_PREFIX,
    NEAR_DUPLICATE,
    DedupNearConfig,
    cross_pairs,
    prepare,
    row_values,
    unique_inverse,
    value_edges,
)

INDEX_BATCH_FRACTION = 0.1  # the later batch the index plan is chosen for: a tenth of the index ...
INDEX_MIN_BATCH = 100_000  # ... and at least this many values
POSTING_COST = 2 * PAIR_COST  # a posting written once and streamed once: two candidate checks' worth


def index_workload(n_values: int) -> Workload:
    """What the index's plan is chosen for: ``n_values`` postings per band, and a later batch."""
    return Workload(n_values, POSTING_COST, max(INDEX_MIN_BATCH, int(INDEX_BATCH_FRACTION * n_values)))


def index_plan(n_values: int, cfg: DedupNearConfig) -> BandPlan:
    """The band plan of a new index of ``n_values`` postings per band (``DedupNearConfig.index_num_blocks``
    when set); every engine writing an index calls it."""
    return plan_bands(None, cfg.max_distance, index_workload(n_values), num_blocks=cfg.index_num_blocks)


@dataclasses.dataclass
class NearDupIndex:
    """An existing version's near-dedup candidates (``rows``, key-sorted, with ``representative``), their
    sorted distinct ``values`` and ``band_orders[j]``: the argsort of ``values & masks[j]``."""

    rows: pa.Table
    values: np.ndarray
    band_orders: list[np.ndarray]
    hash: str
    match_mirrored: bool
    max_distance: int
    num_blocks: int
    plan_masks: tuple[int, ...]  # the band masks (``index_plan``'s, or the stored header's)

    @property
    def masks(self) -> np.ndarray:
        return np.array(self.plan_masks, dtype=np.uint64)

    @classmethod
    def build(cls, candidates: pa.Table, cfg: DedupNearConfig, decisions: pa.Table | None = None) -> NearDupIndex:
        """Index of a version's candidates; ``decisions``: its near-dup decisions (None: all kept)."""
        rows = indexed_rows(candidates, cfg, decisions)
        plan = index_plan(len(row_values(rows, cfg)[1]), cfg)
        return cls.from_rows(rows, cfg, masks=plan.masks(), num_blocks=plan.num_blocks, max_distance=cfg.max_distance)

    @classmethod
    def from_rows(
        cls,
        rows: pa.Table | None,
        cfg: DedupNearConfig,
        *,
        masks: np.ndarray,
        num_blocks: int,
        max_distance: int,
        like: pa.Table | None = None,
    ) -> NearDupIndex:
        """An index of stored rows under a band plan; ``rows`` None: empty, with ``like``'s columns."""
        if rows is None:
            rows = prepare(like, cfg).slice(0, 0).append_column("representative", pa.array([], pa.string()))
        rows = rows.sort_by("key")
        _, values = row_values(rows, cfg)
        distinct = np.unique(values)
        orders = [np.argsort(distinct & m) for m in masks]
        return cls(
            rows, distinct, orders, cfg.hash, cfg.match_mirrored, max_distance, num_blocks, tuple(int(m) for m in masks)
        )

    def check(self, cfg: DedupNearConfig) -> None:
        check_settings(self, cfg)


def indexed_rows(candidates: pa.Table, cfg: DedupNearConfig, decisions: pa.Table | None) -> pa.Table:
    """Prepared candidates with a ``representative`` column (each row's own key unless ``decisions``
    name another)."""
    table = prepare(candidates, cfg)
    rep = table.column("key").to_pylist()
    if decisions is not None and decisions.num_rows:
        dup_of = dict(zip(decisions.column("key").to_pylist(), decisions.column("duplicate_of").to_pylist()))
        rep = [dup_of.get(k, k) for k in rep]
    return table.append_column("representative", pa.array(rep, pa.string()))


def check_settings(built, cfg: DedupNearConfig) -> None:
    """A ValueError when ``cfg`` cannot be searched against an index built with the settings of
    ``built`` (its hash, match_mirrored and max_distance)."""
    if cfg.hash != built.hash or cfg.match_mirrored != built.match_mirrored:
        raise ValueError(
            f"the index was built with hash={built.hash!r}, match_mirrored={built.match_mirrored}; "
            f"the config asks hash={cfg.hash!r}, match_mirrored={cfg.match_mirrored}"
        )
    if cfg.max_distance > built.max_distance:
        raise ValueError(
            f"the index was built for max_distance <= {built.max_distance}, the config asks "
            f"{cfg.max_distance}: rebuild the index (NearDupIndex.build) with the new setting"
        )


def cross_edges(
    new_values: np.ndarray, index: NearDupIndex, max_distance: int, max_pairs: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (new value idx, index value idx) within ``max_distance``, each once, band by band."""
    found = [np.zeros(0, dtype=np.int64)]
    n_old = len(index.values)
    for mask, order in zip(index.masks, index.band_orders):
        i, j = cross_pairs(new_values, index.values, int(mask), max_distance, order, max_pairs)
        found.append(i * n_old + j)
    codes = np.unique(np.concatenate(found))
    return codes // max(n_old, 1), codes % max(n_old, 1)


def incremental_decisions(
    new: pa.Table,
    existing: NearDupIndex | pa.Table,
    cfg: DedupNearConfig,
    *,
    existing_decisions: pa.Table | None = None,
) -> pa.Table:
    """Decision rows for a new batch (module docstring); ``existing``: a ``NearDupIndex``, or the
    existing version's candidates and ``existing_decisions``. One graph: the batch's rows to their
    values, values within t of each other and of the index's values, indexed rows to their values and
    representatives; decided over the batch and the indexed representatives, those preferred."""
    if not cfg.enabled or new.num_rows == 0:
        return DECISION_SCHEMA.empty_table()
    index = existing if isinstance(existing, NearDupIndex) else NearDupIndex.build(existing, cfg, existing_decisions)
    index.check(cfg)
    table = prepare(new, cfg)
    refuse_reused_keys(table.column("key"), index.rows.column("key"))
    rows, values = row_values(table, cfg)
    distinct, value_ids = unique_inverse(values)
    ea, eb = value_edges(distinct, index.masks, cfg.max_distance, cfg.max_pairs_per_chunk)
    ca, cb = cross_edges(distinct, index, cfg.max_distance, cfg.max_pairs_per_chunk)
    old_rows, old_values = row_values(index.rows, cfg)
    n_old = index.rows.num_rows
    where = pc.index_in(index.rows.column("representative"), value_set=index.rows.column("key"))
    reps = pc.fill_null(where, pa.array(np.arange(n_old, dtype=np.int32))).to_numpy().astype(np.int64)
    v0 = table.num_rows  # nodes: the batch's rows, its values, the index's values, its rows
    w0, r0 = v0 + len(distinct), v0 + len(distinct) + len(index.values)
    a = np.concatenate([rows, v0 + ea, v0 + ca, r0 + old_rows, r0 + np.arange(n_old)])
    b = np.concatenate([v0 + value_ids, v0 + eb, w0 + cb, w0 + np.searchsorted(index.values, old_values), r0 + reps])
    labels = component_labels(r0 + n_old, a, b)
    kept = np.flatnonzero(reps == np.arange(n_old))
    columns = [c for c in meta_columns(table.column_names) if c in index.rows.column_names]
    meta = pa.concat_tables(
        [table.select(columns), index.rows.select(columns).take(kept).cast(table.select(columns).schema)]
    )
    old = index.rows.column("key").take(pa.array(kept))
    decided = decisions_from_labels(
        meta, np.concatenate([labels[:v0], labels[r0 + kept]]), NEAR_DUPLICATE, GROUP_PREFIX, set(old.to_pylist())
    )
    return decided.filter(pc.invert(pc.is_in(decided.column("key"), value_set=old)))


def refuse_reused_keys(keys: pa.ChunkedArray, stored: pa.ChunkedArray) -> None:
    """A ValueError naming the first of ``keys`` that the existing version holds (``stored``)."""
    clash = keys.filter(pc.is_in(keys, value_set=stored))
    if len(clash):
        raise ValueError(f"new rows reuse keys of the existing version: {clash[0].as_py()!r}")
