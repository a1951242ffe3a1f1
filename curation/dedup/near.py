"""Near-duplicate dedup over 64-bit perceptual hashes, global across the run.

Two images are near-duplicates when one of their hash values (the hash and, with
``match_mirrored``, the mirror image's) lies within ``max_distance`` bits of one of the other's;
groups are the connected components. The search is exact and sub-quadratic: values agreeing on a
band of the plan (``bands.plan_bands``) are candidate pairs, each given the Hamming check. Work is
on distinct values, so a value many rows share costs nothing quadratic; a bucket of many distinct
values sharing a band key (near-blank images) is split by sub-bands where that is cheaper
(``band_close_pairs``). Both engines search with these functions.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Iterator

import numpy as np
import pyarrow as pa

from curation.dedup import DECISION_SCHEMA
from curation.dedup.bands import HASH_BITS, MAX_BANDS, plan_bands, sorted_unique
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


@dataclasses.dataclass(kw_only=True, frozen=True)
class DedupNearConfig:
    """Settings of near-duplicate dedup (``dedup.near``); only ``max_distance``, ``match_mirrored``
    and ``hash`` change decisions.

    ``max_distance`` (t): the largest Hamming distance (of 64 bits) that counts as a duplicate (how
    false matches grow with the corpus and t: docs/results/curation_design.md). ``match_mirrored``:
    also match the mirror image's hash. ``num_blocks``: B of the search's plan, all (B - t)-subsets
    (``dedup.engine=ray``: in each shuffle group); None: the planner's. ``index_num_blocks``: the same
    for the index a run saves. ``max_pairs_per_chunk`` bounds the memory of the checks.
    ``index_locations``: where earlier outputs lie now (``index_store``, "Relocatable").
    """

    enabled: bool = True
    hash: str = "phash"
    max_distance: int = 4
    match_mirrored: bool = True
    num_blocks: int | None = None
    max_pairs_per_chunk: int = 2_000_000
    index_num_blocks: int | None = None
    index_locations: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.hash != "phash":  # the decode step writes phash and phash_mirror only
            raise ValueError(f"dedup.near.hash must be 'phash' (the hash decode writes), got {self.hash!r}")
        if not isinstance(self.max_distance, int) or not 0 <= self.max_distance <= 16:
            raise ValueError(
                f"dedup.near.max_distance must be an int in 0..16 bits, got {self.max_distance!r} "
                "(beyond ~10 unrelated photos start to match; 4 is the default)"
            )
        for name in ("num_blocks", "index_num_blocks"):
            b, t = getattr(self, name), self.max_distance
            if b is not None and (not isinstance(b, int) or not t < b <= HASH_BITS or math.comb(b, t) > MAX_BANDS):
                raise ValueError(
                    f"dedup.near.{name} must be None (the planner chooses) or an int in {t + 1}..{HASH_BITS} "
                    f"giving C({name}, max_distance) <= {MAX_BANDS} bands; got {b!r}"
                )
        if isinstance(self.index_locations, str) or not all(isinstance(x, str) and x for x in self.index_locations):
            raise ValueError(
                f"dedup.near.index_locations must be a list of output folders or URIs, got {self.index_locations!r}"
            )
        if self.max_pairs_per_chunk < 1:
            raise ValueError(f"dedup.near.max_pairs_per_chunk must be >= 1, got {self.max_pairs_per_chunk}")

    @property
    def mirror_column(self) -> str:
        return f"{self.hash}_mirror"

    def hash_columns(self) -> list[str]:
        return [self.hash, self.mirror_column] if self.match_mirrored else [self.hash]


def _runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of two or more equal keys in a sorted array."""
    cuts = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(sorted_keys)]
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


# A bucket of m values sharing a band key costs m (m - 1) / 2 checks. Past REFINE_MIN values it is
# split where cheaper (``_split_runs``): two of its values within t differ in at most t of the bits
# outside the band, dealt into t + 1 sub-blocks, so they agree on the band plus one of them. One
# value in one sub-band costs about SORT_COST Hamming checks.
SORT_COST = 4.0
REFINE_MIN = 64


@dataclasses.dataclass
class SearchWork:
    """What a search did: values x bands sorted (sub-bands included), pairs checked, pairs within t."""

    sorted: int = 0
    checked: int = 0
    close: int = 0

    @property
    def wasted(self) -> int:
        return self.checked - self.close


def sub_blocks(values: np.ndarray, mask: int, run_of: np.ndarray, max_distance: int) -> list[int]:
    """The bits outside ``mask`` dealt into t + 1 blocks, most varied inside the runs (``run_of``) first,
    in snake order so each block gets a share of the bits that tell the runs' members apart."""
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


def _split_runs(
    values: np.ndarray, starts: np.ndarray, ends: np.ndarray, mask: int, max_distance: int, work: SearchWork
) -> tuple[np.ndarray, list[int]]:
    """Which runs (of ``values`` sorted by key under ``mask``) to split, and the sub-band masks: those
    whose pairs left in the sub-bands plus SORT_COST per value and sub-band cost less than theirs."""
    members = _positions(starts, ends)
    run_of = np.repeat(np.arange(len(starts)), ends - starts)
    mv = values[members]
    masks = [mask | b for b in sub_blocks(mv, mask, run_of, max_distance) if b]
    after = np.zeros(len(starts))
    for sub in masks:
        order = np.argsort(mv & np.uint64(sub), kind="stable")  # stable: a run's members stay together
        lo, hi = _runs((mv & np.uint64(sub))[order])
        np.add.at(after, run_of[order[lo]], (hi - lo) * (hi - lo - 1) // 2)
        work.sorted += len(mv)
    m = (ends - starts).astype(np.float64)
    return after + SORT_COST * len(masks) * m < m * (m - 1) / 2, masks


KEY_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiply-shift hashing of band keys
MAX_INDEX_BITS = 40  # past 2^40 values a band is sorted by argsort instead


def sort_by_band(values: np.ndarray, mask: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, sorted keys): positions of ``values`` grouped by their bits under ``mask``, one key each,
    by one plain sort of packed words (a hash of the masked bits above the position) rather than an
    argsort. Two masked keys sharing a hash only add Hamming checks, never lose a pair."""
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
    """Index pairs (i, j) of distinct ``values`` agreeing on ``mask`` and within ``max_distance`` bits,
    each at least once; buckets past REFINE_MIN values are split by sub-bands where cheaper."""
    work = work if work is not None else SearchWork()
    mask = int(mask)
    order, sorted_keys = sort_by_band(values, mask)
    in_order = values[order]  # the pairs' values, read in key order (cache-friendly)
    work.sorted += len(values)
    starts, ends = _runs(sorted_keys)
    out_i, out_j = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    big = ends - starts > REFINE_MIN
    if big.any() and HASH_BITS - mask.bit_count() > max_distance:
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
    values: np.ndarray, masks: np.ndarray, max_distance: int, max_pairs: int = 2_000_000, work: SearchWork | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs (a < b) of distinct ``values`` within ``max_distance`` bits, for the masks of an
    exact plan (``bands.BandPlan.masks``); ``work`` counts what it did."""
    n = len(values)
    found = [np.zeros(0, dtype=np.int64)]
    for mask in masks:
        i, j = band_close_pairs(values, mask, max_distance, max_pairs, work)
        if len(i):
            found.append(sorted_unique(np.minimum(i, j).astype(np.int64) * n + np.maximum(i, j)))
    edges = sorted_unique(np.concatenate(found))
    return edges // max(n, 1), edges % max(n, 1)


def cross_pairs(
    new: np.ndarray, old: np.ndarray, mask: int, max_distance: int, order=None, max_pairs: int = 2_000_000
) -> tuple[np.ndarray, np.ndarray]:
    """(i, j): ``new[i]``, ``old[j]`` sharing the band key under ``mask`` and within ``max_distance``
    bits, each once (``order``: the argsort of ``old & mask``, when kept), ~``max_pairs`` at a time."""
    m = np.uint64(mask)
    order = np.argsort(old & m, kind="stable") if order is None else order
    old_keys = (old & m)[order]
    lo = np.searchsorted(old_keys, new & m, side="left")
    counts = np.searchsorted(old_keys, new & m, side="right") - lo
    hit = np.flatnonzero(counts)
    out_i, out_j = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for chunk in np.array_split(hit, max(1, int(counts.sum()) // max_pairs + 1)):
        i = np.repeat(chunk, counts[chunk])
        j = order[_positions(lo[chunk], lo[chunk] + counts[chunk])]
        close = hamming(new[i], old[j]) <= max_distance
        out_i.append(i[close].astype(np.int64))
        out_j.append(j[close].astype(np.int64))
    return np.concatenate(out_i), np.concatenate(out_j)


def row_values(table: pa.Table, cfg: DedupNearConfig) -> tuple[np.ndarray, np.ndarray]:
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


def prepare(candidates: pa.Table, cfg: DedupNearConfig) -> pa.Table:
    """The candidates' rule and hash columns, key-sorted (``canonical_order``), once they are there."""
    names = candidates.column_names
    missing = [c for c in (*META_COLUMNS, *cfg.hash_columns()) if c not in names]
    if cfg.match_mirrored and cfg.mirror_column in missing:
        raise ValueError(
            f"candidates have no {cfg.mirror_column!r} column: compute it in the decode step "
            "with curation.dedup.hashing.phash_hex_pair, or set dedup.near.match_mirrored=false"
        )
    if missing:
        raise ValueError(f"near-duplicate candidates lack columns {missing}")
    return canonical_order(candidates.select(list(dict.fromkeys([*meta_columns(names), *cfg.hash_columns()]))))


def near_duplicate_decisions(candidates: pa.Table, cfg: DedupNearConfig, *, prefer: Collection[str] = ()) -> pa.Table:
    """Decision rows (reason ``near_duplicate``, sorted by key) in one process, whatever the row order.
    ``candidates``: key, the hash columns (16 hex chars), width, height and the rule's other columns
    where known; ``prefer``: keys that win the representative choice first (an existing version's)."""
    if not cfg.enabled or candidates.num_rows == 0:
        return DECISION_SCHEMA.empty_table()
    table = prepare(candidates, cfg)
    rows, values = row_values(table, cfg)
    distinct, value_ids = unique_inverse(values)
    masks = plan_bands(distinct, cfg.max_distance, num_blocks=cfg.num_blocks).masks()
    ea, eb = value_edges(distinct, masks, cfg.max_distance, cfg.max_pairs_per_chunk)
    n = table.num_rows  # nodes: rows, then distinct values
    labels = component_labels(n + len(distinct), np.r_[rows, ea + n], np.r_[value_ids + n, eb + n])[:n]
    return decisions_from_labels(table, labels, NEAR_DUPLICATE, GROUP_PREFIX, prefer)
