"""Data-driven bands for the exact near-duplicate search (``curation.dedup.near``).

Any partition of the 64 bit positions into B blocks keeps the search exact: two values at
most t bits apart differ in at most t blocks, so they agree on at least one *band* (a choice
of B - t blocks). Which partition, and which B, only sets the cost: the sort of every band
plus the Hamming check of every pair that agrees on a band. On uniform bits a band of k bits
collides with probability 2^-k; on real PHashes the bits are biased and correlated (they are
signs of one image's low DCT coefficients), bands collide far more often and a B chosen for
uniform bits lets the candidate pairs grow with n^2 (issue 14: n^1.36 from 1e5 to 1e6).

``plan_bands`` chooses from the data instead:

1. a deterministic sample of the distinct values (those with the smallest splitmix64 mix,
   so the same values whatever the input order or partitioning);
2. blocks by a greedy deal of the bits, most informative first (binary entropy measured on
   the sample), each into the block where it is least correlated with the bits already there
   (so no band loses a whole family of redundant bits) and whose entropy is lowest; the plain
   interleaved deal (bit p into block p % B) is also a candidate;
3. for B from the uniform-bit optimum to two more, the candidate pairs of each band *counted* on the sample and scaled by
   (n / sample)^2 (never below the uniform-bit figure), and the cost
   ``bands * n * VALUE_COST + pairs * PAIR_COST``; the cheapest (B, deal) wins.

The plan depends on the values only (not on their order), so local and Ray runs given the
same values choose the same bands; decisions never depend on the plan.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

HASH_BITS = 64
MAX_BANDS = 5000
SAMPLE_SIZE = 10_000
VALUE_COST = 1.0  # relative cost of one value in one band (its share of the band's sort)
PAIR_COST = 1.0  # relative cost of one candidate pair (generate + Hamming check; measured ratio, this machine)


@dataclasses.dataclass(frozen=True)
class BandPlan:
    """Blocks (one 64-bit mask each, a partition of the bits) and the tolerated distance t."""

    blocks: tuple[int, ...]
    max_distance: int

    def __post_init__(self) -> None:
        union = 0
        for b in self.blocks:
            if union & b:
                raise ValueError("band plan blocks overlap")
            union |= b
        if union != (1 << HASH_BITS) - 1 or len(self.blocks) <= self.max_distance:
            raise ValueError(
                f"band plan: {len(self.blocks)} blocks must cover the 64 bits and exceed "
                f"max_distance={self.max_distance}"
            )

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def masks(self) -> np.ndarray:
        """One mask per band: the union of each choice of (B - t) blocks."""
        keep = self.num_blocks - self.max_distance
        return np.array(
            [sum(self.blocks[b] for b in combo) for combo in itertools.combinations(range(self.num_blocks), keep)],
            dtype=np.uint64,
        )

    def to_json(self) -> dict:
        return {"blocks": [f"{b:016x}" for b in self.blocks], "max_distance": self.max_distance}

    @classmethod
    def from_json(cls, d: dict) -> BandPlan:
        return cls(tuple(int(b, 16) for b in d["blocks"]), int(d["max_distance"]))


def interleaved(num_blocks: int, max_distance: int) -> BandPlan:
    """Bit p in block p % B (the plan of ``curation.dedup.near.band_masks``)."""
    return BandPlan(
        tuple(sum(1 << p for p in range(b, HASH_BITS, num_blocks)) for b in range(num_blocks)), max_distance
    )


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of each value (a fixed pseudo-random order of values)."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by one sort (NumPy 2.4's ``np.unique`` hashes: far slower on large uint64 arrays)."""
    s = np.sort(values)
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s


def sample_values(values: np.ndarray, size: int = SAMPLE_SIZE) -> np.ndarray:
    """The ``size`` distinct values of smallest ``mix64`` (order-free), sorted."""
    distinct = sorted_unique(values)
    if len(distinct) <= size:
        return distinct
    return np.sort(distinct[np.argpartition(mix64(distinct), size)[:size]])


def bit_matrix(values: np.ndarray) -> np.ndarray:
    return ((values[:, None] >> np.arange(HASH_BITS, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)


def _entropy(p: np.ndarray) -> np.ndarray:
    q = np.clip(p, 1e-12, 1 - 1e-12)
    return -(q * np.log2(q) + (1 - q) * np.log2(1 - q))


def bit_statistics(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(binary entropy of each bit, |correlation| between bits; 0 for a constant bit) measured on a
    sample (rows of 0/1). Counted exactly on packed bit columns (the pairs' co-occurrences by
    popcount) rather than by a float correlation matrix."""
    n = len(bits)
    packed = np.packbits(bits.astype(bool), axis=0).T.copy()  # [bit, byte]
    words = np.zeros((packed.shape[0], -(-packed.shape[1] // 8) * 8), np.uint8)
    words[:, : packed.shape[1]] = packed
    words = words.view(np.uint64)  # [bit, word]
    both = np.bitwise_count(words[:, None, :] & words[None, :, :]).sum(axis=2, dtype=np.int64)
    p = np.diag(both) / max(n, 1)
    cov = both / max(n, 1) - np.outer(p, p)
    var = p * (1 - p)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.nan_to_num(np.abs(cov / np.sqrt(np.outer(var, var))), nan=0.0, posinf=0.0)
    corr[var == 0, :] = 0.0
    corr[:, var == 0] = 0.0
    return _entropy(p), corr


def greedy_blocks(entropy: np.ndarray, corr: np.ndarray, num_blocks: int, max_distance: int) -> BandPlan:
    """Deal bits, most informative first, into the block where they add the least correlation."""
    cap = math.ceil(HASH_BITS / num_blocks)
    members: list[list[int]] = [[] for _ in range(num_blocks)]
    for bit in sorted(range(HASH_BITS), key=lambda j: (-round(float(entropy[j]), 9), j)):
        open_blocks = [b for b in range(num_blocks) if len(members[b]) < cap]
        best = min(
            open_blocks,
            key=lambda b: (round(float(corr[bit, members[b]].sum()), 6), round(float(entropy[members[b]].sum()), 6), b),
        )
        members[best].append(bit)
    return BandPlan(tuple(sum(1 << p for p in m) for m in members), max_distance)


def sample_pairs(sample: np.ndarray, masks: np.ndarray) -> float:
    """Pairs of sample values sharing a band key, summed over the bands."""
    total = 0
    for mask in masks:  # run lengths of the sorted keys (np.unique's counts hash, slower at 1e6)
        keys = np.sort(sample & mask)
        counts = np.diff(np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True]))
        total += int((counts * (counts - 1) // 2).sum())
    return float(total)


def plan_cost(plan: BandPlan, sample: np.ndarray, n_values: int) -> float:
    masks = plan.masks()
    scale = (n_values / max(len(sample), 1)) ** 2
    band_bits = HASH_BITS * (plan.num_blocks - plan.max_distance) / plan.num_blocks
    uniform = len(masks) * n_values * (n_values - 1) / 2 / 2.0**band_bits
    pairs = max(sample_pairs(sample, masks) * scale, uniform)
    return len(masks) * n_values * VALUE_COST + pairs * PAIR_COST


def uniform_blocks(n_values: int, max_distance: int) -> int:
    """B minimising the cost on uniform bits: C(B, t) * (n + PAIR_COST * n^2 / 2 / 2^(64 (B - t) / B))."""
    t = max_distance
    costs = {
        b: math.comb(b, t) * n_values * (VALUE_COST + PAIR_COST * n_values / 2 / 2.0 ** (HASH_BITS * (b - t) / b))
        for b in range(t + 1, HASH_BITS + 1)
        if math.comb(b, t) <= MAX_BANDS
    }
    return min(costs, key=lambda b: (costs[b], b))


def plan_bands(
    values: np.ndarray, max_distance: int, *, n_values: int | None = None, num_blocks: int | None = None
) -> BandPlan:
    """The cheapest exact plan for these values (a sample of them when ``n_values`` is given)."""
    t = max_distance
    sample = sample_values(values)
    n = n_values if n_values is not None else len(sorted_unique(values))
    if len(sample) < 2:
        return interleaved(num_blocks or t + 1, t)
    entropy, corr = bit_statistics(bit_matrix(sample))
    if num_blocks:
        options = [num_blocks]
    else:  # around the uniform-bit optimum; correlated bits want more blocks, never fewer
        b0 = uniform_blocks(n, t)
        options = [b for b in (b0, b0 + 1, b0 + 2) if b <= HASH_BITS and math.comb(b, t) <= MAX_BANDS]
    best, best_cost = None, math.inf
    for blocks in options:
        for plan in (interleaved(blocks, t), greedy_blocks(entropy, corr, blocks, t)):
            cost = plan_cost(plan, sample, n)
            if cost < best_cost:
                best, best_cost = plan, cost
    return best
