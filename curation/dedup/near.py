"""Near-duplicate dedup over 64-bit perceptual hashes, global across the run.

Two images are near-duplicates when one of their hash values (the hash, and with
``match_mirrored`` also the hash of the mirror image) lies within ``max_distance`` bits of
one of the other's. Groups are the connected components of that graph; each keeps one
representative by the documented rule (``curation.dedup.representative_sort_key``).

The search is exact (it finds every pair within t bits, the same pairs as a brute-force
scan) and sub-quadratic, by banding with the pigeonhole principle: the 64 bit positions are
dealt into B interleaved blocks (block b holds positions p with p % B == b); two values at
most t bits apart differ in at most t blocks, so they agree exactly on at least B - t
blocks. Every choice of B - t blocks is one *band* (C(B, t) bands); values that agree on a
band are candidate pairs, and each candidate pair gets the exact Hamming check. The blocks
and B come from the data (``curation.dedup.bands.plan_bands``: bits dealt by measured entropy
and correlation, B by the candidate pairs counted on a deterministic sample): on correlated
bits (real PHashes) the uniform-bit work per value, C(B, t) * (1 + n / 2^(64 (B - t) / B)),
underestimates the pairs. Any partition of the bits keeps the search exact: the result does
not depend on the plan, only the cost. (The interleaved deal, ``band_masks``, is one plan.)

Work happens on distinct hash values, not rows: rows sharing a value are joined through it,
so a value shared by many rows costs nothing quadratic. Nothing here reads images.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Iterator

import numpy as np
import pyarrow as pa

from curation.dedup import DECISION_SCHEMA
from curation.dedup.bands import plan_bands, sorted_unique
from curation.dedup.components import (
    META_COLUMNS,
    canonical_order,
    component_labels,
    decisions_from_labels,
    meta_columns,
)
from curation.dedup.hashing import hamming, hex_to_uint64
from curation.schema import NEAR_DUPLICATE  # noqa: E402  (one place for every reason)

GROUP_PREFIX = "phash:"
HASH_BITS = 64
_MAX_BANDS = 5000


@dataclasses.dataclass(kw_only=True, frozen=True)
class NearDupConfig:
    """Settings of near-duplicate dedup.

    ``max_distance`` (t): largest Hamming distance (bits of 64) that counts as a duplicate.
    The default 4 is set by scale, not by the small accuracy set. PHash distances are even,
    and between different real photos they follow the model of random 64-bit strings with 33
    bits set (docs/results/curation_design.md). Under that model two unrelated images fall
    within t bits with probability 2.5e-13 (t=4), 2.5e-11 (t=6), 1.3e-9 (t=8), 3.9e-8
    (t=10); times the corpus size, that is each image's expected number
    of false neighbours: at 1e9 images 0.00025 (t=4), 0.025 (t=6), 1.3 (t=8: past 1 a giant
    false component forms and chains unrelated images together), 39 (t=10). t=4 catches
    re-encodes, resizes, grey copies and (with ``match_mirrored``) mirror images; crops and
    burst frames need t=6-10, safe below ~1e8 images; past that, semantic dedup is the tool
    for them. It also keeps the search cheap: C(B, 4) bands instead of C(B, 6).
    ``match_mirrored``: also match the hash of the mirror image, read from column
    ``<hash>_mirror`` (``curation.dedup.hashing.phash_hex_pair``).
    ``num_blocks``: B of the banding (see the module docstring); None picks it from the
    number of distinct hash values. ``num_partitions``: groups of the Ray shuffle of band
    rows (None: about one per million band rows). ``max_pairs_per_chunk`` bounds memory
    while candidate pairs are checked.
    ``index_num_blocks``: B of the band plan of the near-dup index a run saves for later
    versions (``curation.dedup.index_store``), chosen apart from the search's: the index stores
    every value once per band, for good, so its plan trades storage against a later batch's
    candidate pairs (``curation.dedup.incremental.index_blocks``, the default when None).
    Any B keeps searches exact; an index appended to keeps the plan its header records.
    ``index_locations``: where earlier versions' outputs lie now, when one was moved or copied
    after a later version's index listed its part (``dedup.against`` itself is always
    searched): an index's earlier parts are looked up there first, then where they were
    written (``curation.dedup.index_store``, "Relocatable").
    """

    enabled: bool = True
    hash: str = "phash"
    max_distance: int = 4
    match_mirrored: bool = True
    num_blocks: int | None = None
    num_partitions: int | None = None
    max_pairs_per_chunk: int = 2_000_000
    index_num_blocks: int | None = None
    index_locations: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.hash not in ("phash", "dhash"):
            raise ValueError(f"near_dup.hash must be 'phash' or 'dhash', got {self.hash!r}")
        if not isinstance(self.max_distance, int) or not 0 <= self.max_distance <= 16:
            raise ValueError(
                f"near_dup.max_distance must be an int in 0..16 bits, got {self.max_distance!r} "
                "(beyond ~10 unrelated photos start to match; 4 is the default)"
            )
        for name in ("num_blocks", "index_num_blocks"):
            blocks = getattr(self, name)
            if blocks is not None and (not isinstance(blocks, int) or not self.max_distance < blocks <= HASH_BITS):
                raise ValueError(
                    f"near_dup.{name} must be an int in {self.max_distance + 1}..{HASH_BITS} "
                    f"(more than max_distance), or None to choose it; got {blocks!r}"
                )
            if blocks is not None and math.comb(blocks, self.max_distance) > _MAX_BANDS:
                raise ValueError(
                    f"near_dup.{name}={blocks} gives C({blocks}, {self.max_distance}) > "
                    f"{_MAX_BANDS} bands; use fewer blocks or None"
                )
        if isinstance(self.index_locations, str) or not all(isinstance(x, str) and x for x in self.index_locations):
            raise ValueError(
                f"near_dup.index_locations must be a list of output folders or URIs, got {self.index_locations!r}"
            )
        if self.num_partitions is not None and self.num_partitions < 1:
            raise ValueError(f"near_dup.num_partitions must be >= 1 or None, got {self.num_partitions}")
        if self.max_pairs_per_chunk < 1:
            raise ValueError(f"near_dup.max_pairs_per_chunk must be >= 1, got {self.max_pairs_per_chunk}")

    @property
    def mirror_column(self) -> str:
        return f"{self.hash}_mirror"

    def hash_columns(self) -> list[str]:
        return [self.hash, self.mirror_column] if self.match_mirrored else [self.hash]


# ---- banding ----------------------------------------------------------------------------


def plan_blocks(n_values: int, max_distance: int) -> int:
    """Number of blocks B minimising the expected work per value (see the module docstring)."""
    t = max_distance
    best, best_cost = t + 1, math.inf
    for blocks in range(t + 1, HASH_BITS + 1):
        bands = math.comb(blocks, t)
        if bands > _MAX_BANDS:
            break
        band_bits = HASH_BITS * (blocks - t) / blocks
        cost = bands * (1.0 + n_values / 2.0**band_bits)
        if cost < best_cost:
            best, best_cost = blocks, cost
    return best


def band_masks(num_blocks: int, max_distance: int) -> np.ndarray:
    """One 64-bit mask per band: the bits of each choice of (num_blocks - max_distance) blocks."""
    blocks = [sum(1 << p for p in range(b, HASH_BITS, num_blocks)) for b in range(num_blocks)]
    return np.array(
        [
            sum(blocks[b] for b in combo)
            for combo in itertools.combinations(range(num_blocks), num_blocks - max_distance)
        ],
        dtype=np.uint64,
    )


def _run_pairs(sorted_keys: np.ndarray, max_pairs: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Positions (i, j), i < j, of equal keys in a sorted array, in chunks of ~max_pairs."""
    n = len(sorted_keys)
    if n < 2:
        return
    cuts = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    keep = ends - starts > 1
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return
    sizes = ends - starts
    pos = np.repeat(starts, sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))
    partners = np.repeat(ends, sizes) - pos - 1
    cum = np.cumsum(partners)
    lo = 0
    while lo < len(pos):
        base = cum[lo - 1] if lo else 0
        hi = max(int(np.searchsorted(cum, base + max_pairs, side="right")), lo + 1)
        p, c = pos[lo:hi], partners[lo:hi]
        first = np.repeat(p, c)
        second = first + 1 + (np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c))
        yield first, second
        lo = hi


def value_edges(
    values: np.ndarray, masks: np.ndarray, max_distance: int, max_pairs: int = 2_000_000
) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs (a < b) of distinct ``values`` within ``max_distance`` bits.

    ``values`` must hold distinct uint64s. Exact for masks from ``band_masks`` with the same
    ``max_distance``: each band is one sort, then the Hamming check on pairs sharing a band key.
    """
    n = len(values)
    found = [np.zeros(0, dtype=np.int64)]
    for mask in masks:
        keys = values & mask
        order = np.argsort(keys)  # any sort: only the pair set matters
        in_order = values[order]  # the pairs' values, read in key order (cache-friendly)
        codes = []
        for i, j in _run_pairs(keys[order], max_pairs):
            close = hamming(in_order[i], in_order[j]) <= max_distance
            a, b = order[i[close]], order[j[close]]
            codes.append(np.minimum(a, b).astype(np.int64) * n + np.maximum(a, b))
        if codes:
            found.append(sorted_unique(np.concatenate(codes)))
    edges = sorted_unique(np.concatenate(found))
    return edges // max(n, 1), edges % max(n, 1)


# ---- rows -> hash values -> groups -------------------------------------------------------


def _check_columns(names: list[str], cfg: NearDupConfig) -> None:
    missing = [c for c in (*META_COLUMNS, *cfg.hash_columns()) if c not in names]
    if cfg.match_mirrored and cfg.mirror_column in missing:
        raise ValueError(
            f"candidates have no {cfg.mirror_column!r} column: compute it in the decode step "
            "with curation.dedup.hashing.phash_hex_pair, or set near_dup.match_mirrored=false"
        )
    if missing:
        raise ValueError(f"near-duplicate candidates lack columns {missing}")


def row_values(table: pa.Table, cfg: NearDupConfig) -> tuple[np.ndarray, np.ndarray]:
    """(row index, hash value) per distinct value of each row: its hash and mirror hash."""
    n = table.num_rows
    cols = [hex_to_uint64(table.column(c)) for c in cfg.hash_columns()]
    rows = np.tile(np.arange(n, dtype=np.int64), len(cols))
    values = np.concatenate(cols) if cols else np.zeros(0, dtype=np.uint64)
    if len(cols) > 1:  # a symmetric image's mirror hash equals its hash: one entry
        keep = np.concatenate([np.ones(n, dtype=bool), cols[1] != cols[0]])
        rows, values = rows[keep], values[keep]
    return rows, values


def labels_from_value_edges(
    n_rows: int, n_values: int, rows: np.ndarray, value_ids: np.ndarray, ea: np.ndarray, eb: np.ndarray
) -> np.ndarray:
    """Component label per row of a graph whose nodes are rows and distinct hash values.

    Row ``rows[k]`` links to value ``value_ids[k]``; value ``ea[k]`` links to value ``eb[k]``.
    """
    a = np.concatenate([rows, ea + n_rows])
    b = np.concatenate([value_ids + n_rows, eb + n_rows])
    return component_labels(n_rows + n_values, a, b)[:n_rows]


def _prepare(candidates: pa.Table, cfg: NearDupConfig) -> pa.Table:
    _check_columns(candidates.column_names, cfg)
    return canonical_order(
        candidates.select(list(dict.fromkeys([*meta_columns(candidates.column_names), *cfg.hash_columns()])))
    )


def near_duplicate_decisions(candidates: pa.Table, cfg: NearDupConfig, *, prefer: Collection[str] = ()) -> pa.Table:
    """Decision rows (``DECISION_SCHEMA``, reason ``near_duplicate``, sorted by key), in one process.

    ``candidates``: key, <hash> (16 hex chars), <hash>_mirror when ``match_mirrored``, width,
    height, converted and input_bytes (where known). Row order does not matter. ``prefer``: keys that win
    the representative choice before the rule applies (an existing version's rows; see
    ``curation.dedup.incremental``). Handles tens of millions of rows; beyond, use the Ray variant.
    """
    if not cfg.enabled or candidates.num_rows == 0:
        return DECISION_SCHEMA.empty_table()
    table = _prepare(candidates, cfg)
    rows, values = row_values(table, cfg)
    distinct, value_ids = np.unique(values, return_inverse=True)
    masks = plan_bands(distinct, cfg.max_distance, num_blocks=cfg.num_blocks).masks()
    ea, eb = value_edges(distinct, masks, cfg.max_distance, cfg.max_pairs_per_chunk)
    labels = labels_from_value_edges(table.num_rows, len(distinct), rows, value_ids, ea, eb)
    return decisions_from_labels(table, labels, NEAR_DUPLICATE, GROUP_PREFIX, prefer)


# ---- Ray Data ---------------------------------------------------------------------------


def _partition_of(keys: np.ndarray, band: int, num_partitions: int) -> np.ndarray:
    """Shuffle partition of (band, band key): splitmix64 of the pair, mod num_partitions."""
    z = keys ^ np.uint64((band + 1) * 0x9E3779B97F4A7C15 % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(num_partitions)).astype(np.int32)


def _band_rows(batch: pa.Table, cfg: NearDupConfig, masks: np.ndarray, num_partitions: int) -> pa.Table:
    """One row per (row's distinct hash value, band): partition, band, value."""
    _, values = row_values(batch, cfg)
    parts, bands, vals = [], [], []
    for band, mask in enumerate(masks):
        parts.append(_partition_of(values & mask, band, num_partitions))
        bands.append(np.full(len(values), band, dtype=np.int16))
        vals.append(values)
    return pa.table({"part": np.concatenate(parts), "band": np.concatenate(bands), "value": np.concatenate(vals)})


def _join_partition(group: pa.Table, masks: np.ndarray, max_distance: int, max_pairs: int) -> pa.Table:
    """Verified edges (a <= b, as hash values) among the band rows of one shuffle partition.

    A value sent by two or more rows in band 0 gives a self edge (v, v): rows sharing it are
    duplicates at distance 0 (each row sends each of its values once per band).
    """
    bands = group.column("band").to_numpy()
    values = group.column("value").to_numpy()
    out_a, out_b = [], []
    zero, counts = np.unique(values[bands == 0], return_counts=True)
    out_a.append(zero[counts > 1])
    out_b.append(zero[counts > 1])
    for band in np.unique(bands):
        distinct = np.unique(values[bands == band])
        mask = masks[band]
        keys = distinct & mask
        order = np.argsort(keys)  # any sort: only the pair set matters
        for i, j in _run_pairs(keys[order], max_pairs):
            a, b = distinct[order[i]], distinct[order[j]]
            close = hamming(a, b) <= max_distance
            out_a.append(np.minimum(a[close], b[close]))
            out_b.append(np.maximum(a[close], b[close]))
    return pa.table({"a": np.concatenate(out_a).astype(np.uint64), "b": np.concatenate(out_b).astype(np.uint64)})


def _rows_touching(batch: pa.Table, cfg: NearDupConfig, hot: np.ndarray) -> pa.Table:
    rows, values = row_values(batch, cfg)
    touching = np.zeros(batch.num_rows, dtype=bool)
    touching[rows[np.isin(values, hot)]] = True
    return batch.filter(pa.array(touching))


def _collect(ds) -> list[pa.Table]:
    return [b for b in ds.iter_batches(batch_format="pyarrow", batch_size=None) if b.num_rows]


def near_duplicate_decisions_ray(candidates_ds, cfg: NearDupConfig, *, prefer: Collection[str] = ()) -> pa.Table:
    """The same decisions as ``near_duplicate_decisions``, with the search in Ray Data.

    Steps: (1) each row's distinct hash values become one row per band, keyed by a hash of
    (band, band key) into ``num_partitions`` shuffle partitions; (2) ``groupby(part)`` +
    ``map_groups`` sorts each partition by band key and emits Hamming-verified edges between
    hash values; (3) on the driver: the rows touching an edge are fetched (a filter on the
    dataset, metadata columns only) and grouped by union-find over the edge list. The edge
    list and the rows that have a duplicate are small next to the run; the driver never
    holds the full candidate table. Shuffle volume: rows x values per row x C(B, t) bands.
    """
    if not cfg.enabled:
        return DECISION_SCHEMA.empty_table()
    _check_columns(list(candidates_ds.schema().names), cfg)
    columns = list(dict.fromkeys([*meta_columns(candidates_ds.schema().names), *cfg.hash_columns()]))
    ds = candidates_ds.select_columns(columns).materialize()
    n_rows = ds.count()
    if n_rows == 0:
        return DECISION_SCHEMA.empty_table()
    n_values = n_rows * len(cfg.hash_columns())
    masks = band_masks(cfg.num_blocks or plan_blocks(n_values, cfg.max_distance), cfg.max_distance)
    parts = cfg.num_partitions or max(1, math.ceil(n_values * len(masks) / 1_000_000))
    edges_ds = (
        ds.select_columns(cfg.hash_columns())
        .map_batches(
            _band_rows, fn_kwargs={"cfg": cfg, "masks": masks, "num_partitions": parts}, batch_format="pyarrow"
        )
        .groupby("part", num_partitions=parts)
        .map_groups(
            _join_partition,
            fn_kwargs={"masks": masks, "max_distance": cfg.max_distance, "max_pairs": cfg.max_pairs_per_chunk},
            batch_format="pyarrow",
        )
    )
    edges = _collect(edges_ds)
    if not edges:
        return DECISION_SCHEMA.empty_table()
    edge_table = pa.concat_tables(edges)
    pairs = np.unique(np.stack([edge_table.column("a").to_numpy(), edge_table.column("b").to_numpy()], axis=1), axis=0)
    hot = np.unique(pairs)
    sub = canonical_order(
        pa.concat_tables(
            _collect(ds.map_batches(_rows_touching, fn_kwargs={"cfg": cfg, "hot": hot}, batch_format="pyarrow"))
        )
    )
    rows, values = row_values(sub, cfg)
    distinct, value_ids = np.unique(values, return_inverse=True)
    labels = labels_from_value_edges(
        sub.num_rows,
        len(distinct),
        rows,
        value_ids,
        np.searchsorted(distinct, pairs[:, 0]),
        np.searchsorted(distinct, pairs[:, 1]),
    )
    return decisions_from_labels(sub, labels, NEAR_DUPLICATE, GROUP_PREFIX, prefer)
