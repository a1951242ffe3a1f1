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
band are candidate pairs, and each candidate pair gets the exact Hamming check. Fewer, longer
bands also suffice when every B - t blocks contain one of them (a covering design). The blocks,
B and the bands come from the data (``curation.dedup.bands.plan_bands``: bits dealt by measured
entropy and correlation, the design by the candidate pairs counted on a deterministic sample): on correlated
bits (real PHashes) the uniform-bit work per value, C(B, t) * (1 + n / 2^(64 (B - t) / B)),
underestimates the pairs. Any partition of the bits keeps the search exact: the result does
not depend on the plan, only the cost. (The interleaved deal, ``band_masks``, is one plan.)

Work happens on distinct hash values, not rows: rows sharing a value are joined through it,
so a value shared by many rows costs nothing quadratic. Many *distinct* values sharing one band
key (a bucket: near-blank images, gradients) would cost m (m - 1) / 2 checks; a bucket past
``REFINE_MIN`` values is split instead where that is cheaper (``band_close_pairs``: pigeonhole
again, on the bits outside the band), so it costs about its pairs within t, which are output.
The in-process, Ray and distributed searches share it. Nothing here reads images.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Iterator

import numpy as np
import pyarrow as pa

from curation.dedup import DECISION_SCHEMA
from curation.dedup.bands import (
    MAX_BANDS,
    MIX_END,
    SAMPLE_SIZE,
    interleaved,
    mix64,
    plan_bands,
    sample_bound,
    sample_values,
    sorted_unique,
)
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
    candidate pairs (``curation.dedup.incremental.index_plan``, the default when None).
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
            if blocks is not None and math.comb(blocks, self.max_distance) > MAX_BANDS:
                raise ValueError(
                    f"near_dup.{name}={blocks} gives C({blocks}, {self.max_distance}) > "
                    f"{MAX_BANDS} bands; use fewer blocks or None"
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


def band_masks(num_blocks: int, max_distance: int) -> np.ndarray:
    """One 64-bit mask per band: the bits of each choice of (num_blocks - max_distance) interleaved blocks."""
    return interleaved(num_blocks, max_distance).masks()


def _runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of two or more equal keys in a sorted array."""
    n = len(sorted_keys)
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cuts = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    keep = ends - starts > 1
    return starts[keep], ends[keep]


def _pairs_of_runs(starts: np.ndarray, ends: np.ndarray, max_pairs: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Positions (i, j), i < j, of the pairs inside each run [start, end), in chunks of ~max_pairs."""
    if not len(starts):
        return
    sizes = ends - starts
    pos = _positions(starts, ends)
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


# A bucket (values sharing one band key) of m values costs m (m - 1) / 2 Hamming checks. Past
# REFINE_MIN values it is split instead, when that is cheaper (``_split_runs``): its values agree
# on the band's bits, so two of them within t bits differ in at most t of the *other* bits; those
# are dealt into t + 1 sub-blocks, and every pair within t agrees on the band plus one sub-block
# (pigeonhole again). One value in one sub-band costs about SORT_COST Hamming checks.
SORT_COST = 4.0
REFINE_MIN = 64


@dataclasses.dataclass
class SearchWork:
    """What a search did, in counts: values x bands sorted (sub-bands included), candidate pairs
    given the Hamming check, and how many of those were within t (the rest is work not output)."""

    sorted: int = 0
    checked: int = 0
    close: int = 0

    @property
    def wasted(self) -> int:
        return self.checked - self.close


def sub_blocks(values: np.ndarray, mask: int, run_of: np.ndarray, max_distance: int) -> list[int]:
    """The bits outside ``mask`` dealt into t + 1 blocks (a partition: the split stays exact), most
    varied first (variance of each bit inside the runs ``run_of`` labels), in snake order so each
    block gets a share of the bits that tell the runs' members apart."""
    rest = [p for p in range(HASH_BITS) if not mask >> p & 1]
    sizes = np.bincount(run_of).astype(np.float64)
    spread = []
    for p in rest:
        bit = ((values >> np.uint64(p)) & np.uint64(1)).astype(np.float64)
        share = np.bincount(run_of, weights=bit, minlength=len(sizes)) / np.maximum(sizes, 1)
        spread.append(float((sizes * share * (1 - share)).sum()))
    ranked = [rest[k] for k in sorted(range(len(rest)), key=lambda k: (-round(spread[k], 6), rest[k]))]
    blocks = [0] * (max_distance + 1)
    for rank, p in enumerate(ranked):
        lap, pos = divmod(rank, max_distance + 1)
        blocks[pos if lap % 2 == 0 else max_distance - pos] |= 1 << p
    return blocks


def _positions(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Every position of the runs [start, end), in order."""
    sizes = ends - starts
    return np.repeat(starts, sizes) + (np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes))


def _pair_count(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per run of two or more equal keys in a sorted array: (first position, pairs in it)."""
    starts, ends = _runs(sorted_keys)
    sizes = ends - starts
    return starts, sizes * (sizes - 1) // 2


def _split_runs(
    values: np.ndarray, starts: np.ndarray, ends: np.ndarray, mask: int, max_distance: int, work: SearchWork
) -> tuple[np.ndarray, list[int]]:
    """Which of the runs (of ``values``, sorted by key under ``mask``) to split, and the sub-band
    masks: a run is split when the pairs its sub-bands would leave plus SORT_COST per value and
    sub-band cost less than its own pairs (the sub-band keys are sorted to count them)."""
    members = _positions(starts, ends)
    run_of = np.repeat(np.arange(len(starts)), ends - starts)
    mv = values[members]
    masks = [mask | b for b in sub_blocks(mv, mask, run_of, max_distance) if b]
    after = np.zeros(len(starts))
    for sub in masks:
        order = np.argsort(mv & np.uint64(sub), kind="stable")  # stable: a run's members stay together
        first, pairs = _pair_count((mv & np.uint64(sub))[order])
        np.add.at(after, run_of[order[first]], pairs)
        work.sorted += len(mv)
    m = (ends - starts).astype(np.float64)
    return after + SORT_COST * len(masks) * m < m * (m - 1) / 2, masks


KEY_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiply-shift hashing of band keys
MAX_INDEX_BITS = 40  # past 2^40 values a band is sorted by argsort instead


def sort_by_band(values: np.ndarray, mask: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, sorted keys): positions of ``values`` grouped by their bits under ``mask``, and one
    key per position, equal for equal masked bits. One plain sort of packed words (a hash of the
    masked bits in the high bits, the position in the low bits) instead of an argsort: several
    times faster on uint64. Two different masked keys may share a hash (probability ~2^-(64 -
    index bits) a pair); that only adds Hamming checks, never loses a pair."""
    n = len(values)
    index_bits = max(1, (n - 1).bit_length())
    if index_bits > MAX_INDEX_BITS:
        keys = values & np.uint64(mask)
        order = np.argsort(keys)
        return order, keys[order]
    low = np.uint64((1 << index_bits) - 1)
    packed = ((values & np.uint64(mask)) * KEY_MIX) & ~low | np.arange(n, dtype=np.uint64)
    packed.sort()
    return (packed & low).astype(np.intp), packed >> np.uint64(index_bits)


def band_close_pairs(
    values: np.ndarray, mask: int, max_distance: int, max_pairs: int = 2_000_000, work: SearchWork | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) of distinct ``values`` that agree on the bits of ``mask`` and lie within
    ``max_distance`` bits: every such pair at least once (a pair may repeat). Buckets of more than
    REFINE_MIN values are split by sub-bands where that is cheaper (see SORT_COST), recursively, so a
    bucket holding a large share of the values (near-blank images) costs no quadratic work unless its
    pairs are within t (output)."""
    work = work if work is not None else SearchWork()
    mask = int(mask)
    order, sorted_keys = sort_by_band(values, mask)
    in_order = values[order]  # the pairs' values, read in key order (cache-friendly)
    work.sorted += len(values)
    starts, ends = _runs(sorted_keys)
    out_i, out_j = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    big = ends - starts > REFINE_MIN
    if big.any() and HASH_BITS - bin(mask).count("1") > max_distance:
        split, sub_masks = _split_runs(in_order, starts[big], ends[big], mask, max_distance, work)
        if split.any():
            chosen = np.flatnonzero(big)[split]
            members = _positions(starts[chosen], ends[chosen])
            for sub in sub_masks:
                i, j = band_close_pairs(in_order[members], sub, max_distance, max_pairs, work)
                out_i.append(order[members[i]])
                out_j.append(order[members[j]])
            keep = np.ones(len(starts), bool)
            keep[chosen] = False
            starts, ends = starts[keep], ends[keep]
    two = ends - starts == 2  # the commonest bucket: its one pair without the general expansion
    pairs = itertools.chain([(starts[two], starts[two] + 1)], _pairs_of_runs(starts[~two], ends[~two], max_pairs))
    for i, j in pairs:
        close = hamming(in_order[i], in_order[j]) <= max_distance
        work.checked += len(i)
        work.close += int(close.sum())
        out_i.append(order[i[close]])
        out_j.append(order[j[close]])
    return np.concatenate(out_i), np.concatenate(out_j)


def value_edges(
    values: np.ndarray,
    masks: np.ndarray,
    max_distance: int,
    max_pairs: int = 2_000_000,
    work: SearchWork | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs (a < b) of distinct ``values`` within ``max_distance`` bits.

    ``values`` must hold distinct uint64s. Exact for the bands of any partition of the bits into
    more than ``max_distance`` blocks (``bands.BandPlan.masks``): each band is one sort, then the
    Hamming check on pairs sharing a band key (``band_close_pairs``). ``work`` counts what it did.
    """
    n = len(values)
    found = [np.zeros(0, dtype=np.int64)]
    for mask in masks:
        i, j = band_close_pairs(values, mask, max_distance, max_pairs, work)
        if len(i):
            found.append(sorted_unique(np.minimum(i, j).astype(np.int64) * n + np.maximum(i, j)))
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


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` by one argsort."""
    order = np.argsort(values)
    ordered = values[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]] if len(ordered) else np.zeros(0, bool)
    inverse = np.empty(len(values), np.int64)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


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
    distinct, value_ids = unique_inverse(values)
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
        i, j = band_close_pairs(distinct, masks[band], max_distance, max_pairs)
        a, b = distinct[i], distinct[j]
        out_a.append(np.minimum(a, b))
        out_b.append(np.maximum(a, b))
    return pa.table({"a": np.concatenate(out_a).astype(np.uint64), "b": np.concatenate(out_b).astype(np.uint64)})


def _rows_touching(batch: pa.Table, cfg: NearDupConfig, hot: np.ndarray) -> pa.Table:
    rows, values = row_values(batch, cfg)
    touching = np.zeros(batch.num_rows, dtype=bool)
    touching[rows[np.isin(values, hot)]] = True
    return batch.filter(pa.array(touching))


def _values_below(batch: pa.Table, cfg: NearDupConfig, bound: int) -> pa.Table:
    """The batch's distinct hash values whose ``mix64`` is below ``bound``."""
    _, values = row_values(batch, cfg)
    values = sorted_unique(values)
    return pa.table({"value": values if bound >= MIX_END else values[mix64(values) < np.uint64(bound)]})


def _ray_sample(ds, cfg: NearDupConfig, n_values: int) -> np.ndarray:
    """``bands.sample_values`` of the dataset's hash values, gathered by tasks: each sends its values
    under a ``mix64`` bound (~4 x SAMPLE_SIZE in all); the bound grows 16x while too few distinct
    values are under it (a corpus of few distinct values), up to every value."""
    bound = sample_bound(n_values)
    while True:
        below = _collect(
            ds.select_columns(cfg.hash_columns()).map_batches(
                _values_below, fn_kwargs={"cfg": cfg, "bound": bound}, batch_format="pyarrow"
            )
        )
        kept = sorted_unique(np.concatenate([b.column("value").to_numpy() for b in below] or [np.empty(0, np.uint64)]))
        if len(kept) >= SAMPLE_SIZE or bound == MIX_END:
            return sample_values(kept)
        bound = min(MIX_END, bound * 16)


def _collect(ds) -> list[pa.Table]:
    return [b for b in ds.iter_batches(batch_format="pyarrow", batch_size=None) if b.num_rows]


def near_duplicate_decisions_ray(candidates_ds, cfg: NearDupConfig, *, prefer: Collection[str] = ()) -> pa.Table:
    """The same decisions as ``near_duplicate_decisions``, with the search in Ray Data.

    Steps: (0) the plan, ``bands.plan_bands`` of the values' sample gathered by tasks
    (``_ray_sample``), so the same values get the same bands as in one process;
    (1) each row's distinct hash values become one row per band, keyed by a hash of
    (band, band key) into ``num_partitions`` shuffle partitions; (2) ``groupby(part)`` +
    ``map_groups`` sorts each partition by band key and emits Hamming-verified edges between
    hash values; (3) on the driver: the rows touching an edge are fetched (a filter on the
    dataset, metadata columns only) and grouped by union-find over the edge list. The edge
    list and the rows that have a duplicate are small next to the run; the driver never
    holds the full candidate table. Shuffle volume: rows x values per row x the plan's bands.
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
    masks = plan_bands(_ray_sample(ds, cfg, n_values), cfg.max_distance, num_blocks=cfg.num_blocks).masks()
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
    return _decisions_of_value_pairs(ds, cfg, pairs, prefer)


def _decisions_of_value_pairs(ds, cfg: NearDupConfig, pairs: np.ndarray, prefer: Collection[str]) -> pa.Table:
    """Decisions from verified edges between hash values: the rows touching one are fetched
    (metadata columns only) and grouped by union-find over the edges, on the driver."""
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
