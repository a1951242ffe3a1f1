"""Incremental near-duplicate dedup: a new batch against an existing dataset version.

The existing version is summarised by a ``NearDupIndex``: its near-dedup candidate rows
(key, hashes, size, person score), each row's representative (itself when kept, else its
``duplicate_of``), the distinct hash values, and per band the sort order of the values by
band key, so a new batch is searched against it without re-sorting or re-deciding the old
rows. On disk it is stored partitioned by band key (``curation.dedup.index_store``); a search
there loads only the small ``NearDupIndex`` of the rows a new batch can reach.

Contract of ``incremental_decisions(new, index, cfg)``:

- existing rows are never dropped, and an existing kept row always stays the
  representative: a new row joined (through any chain of duplicate edges, which may pass
  through existing rows and their groups) to an existing group is dropped with
  ``duplicate_of`` = the best existing representative of its component by the rule;
- new rows whose component has no existing row are grouped as in full mode.

Equality with a full recomputation, precisely: if the index was built from version V's
candidates and V's ``near_duplicate_decisions(V, cfg)`` with the same settings, then for
any batch B
    incremental_decisions(B, index, cfg)
    == near_duplicate_decisions(V + B, cfg, prefer=keys of V) restricted to keys of B,
row for row (key, reason, duplicate_of, duplicate_group). ``prefer`` makes V's rows win the
representative choice before the rule; where the rule alone already picks a row of V in
every component that touches V (e.g. the old copies are larger), plain
``near_duplicate_decisions(V + B, cfg)`` gives the same rows. Only with ``prefer`` can a
full recomputation drop an existing row (when a new row bridges two old groups, the worse
old representative); incremental mode keeps it, by design.

**The index's band plan** (``index_plan``) is chosen apart from the in-run search's
(``bands.plan_bands``, which minimises one run's sort + pair work): the index is written once
and kept, and every later batch searches it. For a plan of m bands of L bits (all (B - t)-subsets
of B interleaved blocks, or a covering design, ``bands.covering_bands``), with N values indexed
(postings per band: one per distinct hash value of a row) and a later batch of b values, the
cost per indexed value is

    m x 2                       postings written once, and streamed once by the batch
                                (b >= P buckets: every bucket file of a band is opened)
  + m x b x 2^-L                candidate pairs that batch checks, per indexed value
                                (bands x N x 2^-L per query value, uniform bits)

a posting and a candidate counted at the same cost (a candidate is a key read back and a
row fetched, about what a posting costs to write). The batch assumed is
``INDEX_BATCH_FRACTION`` of the index (a version adds a tenth of the corpus) and at least
``INDEX_MIN_BATCH`` values. With t = 4 that gives 9 bands of 18.3 bits up to ~3e6 values, 12 of
21.3 up to ~4e7, 21 of 25.6 up to ~7e8, 32 of 28.4 up to ~4e9 (2e9 values: 1e9 images with mirror
hashes), where all-subsets plans alone would store 15, 15, 35 and 35 postings per value. Any plan
is exact (pigeonhole): the plan changes only cost. ``NearDupConfig.index_num_blocks`` asks for all
(B - t)-subsets of B blocks instead; an index that is appended to keeps the masks its header records.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA
from curation.dedup.bands import BandPlan, cheapest_designs, interleaved
from curation.dedup.components import component_labels, decisions_from_labels, meta_columns
from curation.dedup.hashing import hamming
from curation.dedup.near import (
    GROUP_PREFIX,
    NEAR_DUPLICATE,
    NearDupConfig,
    _check_columns,
    _prepare,
    row_values,
    value_edges,
)

INDEX_BATCH_FRACTION = 0.1  # the later batch the index plan is chosen for: a tenth of the index ...
INDEX_MIN_BATCH = 100_000  # ... and at least this many values


def index_batch(n_values: int) -> int:
    """Values of the later batch ``index_plan`` assumes for an index of ``n_values``."""
    return max(INDEX_MIN_BATCH, int(INDEX_BATCH_FRACTION * n_values))


def index_cost(num_bands: int, band_bits: float, batch_values: int) -> float:
    """Relative cost per indexed value of a plan of ``num_bands`` bands of ``band_bits`` bits (the
    module docstring's model)."""
    return num_bands * (2.0 + batch_values / 2.0**band_bits)


def index_plan(
    n_values: int, max_distance: int, *, batch_values: int | None = None, num_blocks: int | None = None
) -> BandPlan:
    """The index's band plan for ``n_values`` postings per band: the design cheapest by ``index_cost``
    (``bands.cheapest_designs``), interleaved blocks; ``num_blocks`` given: all (B - t)-subsets of B
    blocks. ``batch_values`` None: ``index_batch(n_values)``."""
    if num_blocks is not None:
        return interleaved(num_blocks, max_distance)
    b = index_batch(n_values) if batch_values is None else batch_values
    [(blocks, bands)] = cheapest_designs(
        max_distance, n_values, cost=lambda n_bands, bits: index_cost(n_bands, bits, b), options=1
    )
    return dataclasses.replace(interleaved(blocks, max_distance), bands=bands)


@dataclasses.dataclass
class NearDupIndex:
    """An existing version's near-dedup candidates, ready to be searched by a new batch.

    ``rows``: key-sorted candidates with a ``representative`` column. ``values``: sorted
    distinct hash values of those rows; ``band_orders[j]``: argsort of ``values & masks[j]``.
    Built for ``max_distance`` (searches with any smaller distance stay exact).
    """

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
    def build(cls, candidates: pa.Table, cfg: NearDupConfig, decisions: pa.Table | None = None) -> NearDupIndex:
        """Index of a version's candidates; ``decisions``: its near-dup decisions (None: all kept)."""
        rows = _indexed_rows(candidates, cfg, decisions)
        n_values = len(row_values(rows, cfg)[1])
        plan = index_plan(n_values, cfg.max_distance, num_blocks=cfg.index_num_blocks)
        return cls.from_rows(rows, cfg, masks=plan.masks(), num_blocks=plan.num_blocks, max_distance=cfg.max_distance)

    def extended(self, new: pa.Table, new_decisions: pa.Table, cfg: NearDupConfig) -> NearDupIndex:
        """The index of the next version: these rows plus a new batch and its decisions."""
        old = self.rows.drop_columns(["representative"])
        rep = dict(zip(self.rows.column("key").to_pylist(), self.rows.column("representative").to_pylist()))
        decisions = pa.concat_tables(
            [
                pa.Table.from_pylist(
                    [
                        {"key": k, "reason": NEAR_DUPLICATE, "duplicate_of": r, "duplicate_group": ""}
                        for k, r in rep.items()
                        if r != k
                    ],
                    schema=DECISION_SCHEMA,
                ),
                new_decisions.cast(DECISION_SCHEMA),
            ]
        )
        new_rows = _prepare(new, cfg)  # columns the older index lacks (a step's rank_*) are not kept
        merged = pa.concat_tables([old, new_rows.select(old.column_names).cast(old.schema)])
        same = dataclasses.replace(cfg, max_distance=self.max_distance)
        return NearDupIndex.from_rows(  # this index's plan, whatever cfg asks
            _indexed_rows(merged, same, decisions),
            same,
            masks=self.masks,
            num_blocks=self.num_blocks,
            max_distance=self.max_distance,
        )

    @classmethod
    def from_rows(
        cls,
        rows: pa.Table | None,
        cfg: NearDupConfig,
        *,
        masks: np.ndarray,
        num_blocks: int,
        max_distance: int,
        like: pa.Table | None = None,
    ) -> NearDupIndex:
        """An index of stored rows (with ``representative``) under a given band plan; ``rows`` None:
        an empty index with ``like``'s prepared columns."""
        if rows is None:
            rows = _prepare(like, cfg).slice(0, 0).append_column("representative", pa.array([], pa.string()))
        rows = rows.sort_by("key")
        _, values = row_values(rows, cfg)
        distinct = np.unique(values)
        orders = [np.argsort(distinct & m) for m in masks]
        return cls(
            rows, distinct, orders, cfg.hash, cfg.match_mirrored, max_distance, num_blocks, tuple(int(m) for m in masks)
        )

    def check(self, cfg: NearDupConfig) -> None:
        check_settings(self.hash, self.match_mirrored, self.max_distance, cfg)


def _indexed_rows(candidates: pa.Table, cfg: NearDupConfig, decisions: pa.Table | None) -> pa.Table:
    """Prepared candidates with a ``representative`` column (each row's own key unless ``decisions``
    name another)."""
    table = _prepare(candidates, cfg)
    rep = table.column("key").to_pylist()
    if decisions is not None and decisions.num_rows:
        dup_of = dict(zip(decisions.column("key").to_pylist(), decisions.column("duplicate_of").to_pylist()))
        rep = [dup_of.get(k, k) for k in rep]
    return table.append_column("representative", pa.array(rep, pa.string()))


def check_settings(hash_name: str, match_mirrored: bool, max_distance: int, cfg: NearDupConfig) -> None:
    """A ValueError when ``cfg`` cannot be searched against an index built with these settings."""
    if cfg.hash != hash_name or cfg.match_mirrored != match_mirrored:
        raise ValueError(
            f"the index was built with hash={hash_name!r}, match_mirrored={match_mirrored}; "
            f"the config asks hash={cfg.hash!r}, match_mirrored={cfg.match_mirrored}"
        )
    if cfg.max_distance > max_distance:
        raise ValueError(
            f"the index was built for max_distance <= {max_distance}, the config asks "
            f"{cfg.max_distance}: rebuild the index (NearDupIndex.build) with the new setting"
        )


def _cross_edges(
    new_values: np.ndarray, index: NearDupIndex, max_distance: int, max_pairs: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (new value idx, index value idx) within ``max_distance``, one searchsorted per band."""
    found = [np.zeros(0, dtype=np.int64)]
    n_old = len(index.values)
    for mask, order in zip(index.masks, index.band_orders):
        old_keys = index.values[order] & mask
        keys = new_values & mask
        lo = np.searchsorted(old_keys, keys, side="left")
        counts = np.searchsorted(old_keys, keys, side="right") - lo
        hit = np.flatnonzero(counts)
        for chunk in np.array_split(hit, max(1, int(counts.sum()) // max_pairs + 1)):
            c = counts[chunk]
            a = np.repeat(chunk, c)
            b = order[np.repeat(lo[chunk], c) + (np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c))]
            close = hamming(new_values[a], index.values[b]) <= max_distance
            found.append(a[close].astype(np.int64) * n_old + b[close])
    codes = np.unique(np.concatenate(found))
    return codes // max(n_old, 1), codes % max(n_old, 1)


def incremental_decisions(
    new: pa.Table, existing: NearDupIndex | pa.Table, cfg: NearDupConfig, *, existing_decisions: pa.Table | None = None
) -> pa.Table:
    """Decision rows for a new batch only (see the module docstring for the contract).

    ``existing``: a ``NearDupIndex``, or the existing version's candidate table (then
    ``existing_decisions`` are its near-dup decisions; None means all its rows were kept).
    """
    if not cfg.enabled or new.num_rows == 0:
        return DECISION_SCHEMA.empty_table()
    index = existing if isinstance(existing, NearDupIndex) else NearDupIndex.build(existing, cfg, existing_decisions)
    table = _checked_batch(new, index, cfg)
    rows, values = row_values(table, cfg)
    distinct = np.unique(values)
    ea, eb = value_edges(distinct, index.masks, cfg.max_distance, cfg.max_pairs_per_chunk)
    ca, cb = _cross_edges(distinct, index, cfg.max_distance, cfg.max_pairs_per_chunk)
    side = _ExistingSide.of(index, cb, cfg)

    # One graph: new rows, new distinct values, hit existing values, existing rows (compact).
    n_new = table.num_rows
    v0 = n_new
    h0 = v0 + len(distinct)
    r0 = h0 + len(side.hit)
    a = np.concatenate([rows, v0 + ea, v0 + ca, h0 + side.holder_vals, r0 + side.node(side.involved)])
    b = np.concatenate(
        [
            v0 + np.searchsorted(distinct, values),
            v0 + eb,
            h0 + np.searchsorted(side.hit, cb),
            r0 + side.node(side.holder_rows),
            r0 + side.node(side.reps),
        ]
    )
    labels = component_labels(r0 + len(side.old_nodes), a, b)
    return _new_rows_decisions(table, index, side, labels[:n_new], labels[r0:])


def _checked_batch(new: pa.Table, index: NearDupIndex, cfg: NearDupConfig) -> pa.Table:
    """The new batch prepared for the search, after checking it fits the index."""
    index.check(cfg)
    _check_columns(new.column_names, cfg)
    table = _prepare(new, cfg)
    clash = pc.is_in(table.column("key"), value_set=index.rows.column("key"))
    if pc.any(clash).as_py():
        raise ValueError(
            f"new rows reuse keys of the existing version: {table.filter(clash).column('key')[0].as_py()!r}"
        )
    return table


@dataclasses.dataclass(frozen=True)
class _ExistingSide:
    """The existing rows a new batch touches: the hit index values, the rows holding them and
    those rows' representatives, numbered compactly as ``old_nodes``."""

    hit: np.ndarray  # index value positions within max_distance of a new value
    holder_rows: np.ndarray  # existing rows holding a hit value ...
    holder_vals: np.ndarray  # ... and that value's position in ``hit``
    involved: np.ndarray  # distinct holder rows
    reps: np.ndarray  # their representatives' rows
    old_nodes: np.ndarray  # involved rows and representatives, sorted
    keys: list[str]  # key of every existing row
    rep_keys: list[str]  # representative key of every existing row

    @classmethod
    def of(cls, index: NearDupIndex, cb: np.ndarray, cfg: NearDupConfig) -> _ExistingSide:
        hit = np.unique(cb)
        old_rows, old_values = row_values(index.rows, cfg)
        holds = np.isin(old_values, index.values[hit])
        holder_rows = old_rows[holds]
        holder_vals = np.searchsorted(hit, np.searchsorted(index.values, old_values[holds]))
        keys = index.rows.column("key").to_pylist()
        rep_keys = index.rows.column("representative").to_pylist()
        involved = np.unique(holder_rows)
        position = {k: i for i, k in enumerate(keys)}
        reps = np.array([position[rep_keys[r]] for r in involved], dtype=np.int64)
        return cls(
            hit, holder_rows, holder_vals, involved, reps, np.unique(np.concatenate([involved, reps])), keys, rep_keys
        )

    def node(self, rows: np.ndarray) -> np.ndarray:
        """Compact numbers of existing rows (which must be in ``old_nodes``)."""
        return np.searchsorted(self.old_nodes, rows)


def _new_rows_decisions(
    table: pa.Table, index: NearDupIndex, side: _ExistingSide, new_labels: np.ndarray, old_labels: np.ndarray
) -> pa.Table:
    """Decide over the new rows and the existing representatives of their components (existing
    ones preferred); keep only the new rows' decisions."""
    is_rep = np.array([side.rep_keys[r] == side.keys[r] for r in side.old_nodes], dtype=bool)
    rep_nodes = side.old_nodes[is_rep]
    columns = [c for c in meta_columns(table.column_names) if c in index.rows.column_names]
    new_meta = table.select(columns)
    meta = pa.concat_tables([new_meta, index.rows.select(columns).take(rep_nodes).cast(new_meta.schema)])
    meta_labels = np.concatenate([new_labels, old_labels[side.node(rep_nodes)]])
    existing_keys = {side.keys[r] for r in rep_nodes}
    decisions = decisions_from_labels(meta, meta_labels, NEAR_DUPLICATE, GROUP_PREFIX, prefer=existing_keys)
    old = pc.is_in(decisions.column("key"), value_set=pa.array(sorted(existing_keys), pa.string()))
    return decisions.filter(pc.invert(old))
