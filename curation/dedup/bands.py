"""Data-driven bands for the exact near-duplicate search (``curation.dedup.near``).

Any partition of the 64 bit positions into B blocks keeps the search exact: two values at
most t bits apart differ in at most t blocks, so they agree on the B - t blocks left, and on every
*band* (a set of blocks, whose bits are compared as one key) inside them. Bands of all (B - t)-
subsets (C(B, t) of them) are one exact plan; a *covering design* is another: any family of
k-subsets (k < B - t) such that every (B - t)-subset contains one (``covering_bands``; e.g. for
t = 4, 12 bands of 3 of 9 blocks instead of 15 bands of 2 of 6, both 21.3 bits, or 21 bands of 4
of 10 blocks, 25.6 bits). Which plan only sets the cost: the sort of every band plus the Hamming
check of every pair that agrees on a band. On uniform bits a band of k bits collides with
probability 2^-k, so a larger corpus wants longer bands, and the designs give a step of 1-2 bits
per step in band count where all-subsets plans jump (15 bands of 21.3 bits, then 35 of 27.4). On
real PHashes the bits are biased and correlated (they are signs of one image's low DCT
coefficients), bands collide far more often and a B chosen for uniform bits lets the candidate
pairs grow with n^2 (issue 14: n^1.36 from 1e5 to 1e6).

``plan_bands`` chooses from the data instead:

1. a deterministic sample of the distinct values (those with the smallest splitmix64 mix,
   so the same values whatever the input order or partitioning);
2. blocks by a greedy deal of the bits, most informative first (binary entropy measured on
   the sample), each into the block where it is least correlated with the bits already there
   (so no band loses a whole family of redundant bits) and whose entropy is lowest; the plain
   interleaved deal (bit p into block p % B) is also a candidate;
3. for the PLAN_OPTIONS designs cheapest on uniform bits at this n (``cheapest_designs``), the
   candidate pairs of each band *counted* on the sample and scaled by (n / sample)^2 (never below
   the uniform-bit figure), and the cost ``bands * n * VALUE_COST + pairs * PAIR_COST``; the
   cheapest (design, deal) wins.

The plan depends on the values only (not on their order), so local and Ray runs given the
same values choose the same bands; decisions never depend on the plan.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Collection

import numpy as np

HASH_BITS = 64
MAX_BANDS = 5000
SAMPLE_SIZE = 10_000
MIX_END = 1 << 64  # mix64 values lie in [0, MIX_END)
VALUE_COST = 1.0  # relative cost of one value in one band (its share of the band's sort)
# relative cost of one candidate pair (generate + Hamming check), measured against one value's share
# of a band's sort (docs/results/dedup_scaling.md, 2026-12-07)
PAIR_COST = 0.3
DESIGN_SEARCH_LIMIT = 500_000  # options x differing sets a covering-design search may hold
DESIGN_ATTEMPTS = 8
DESIGN_MAX_BLOCKS = 12  # covering designs are searched for B up to this
PLAN_OPTIONS = 6  # designs costed on the sample


@dataclasses.dataclass(frozen=True)
class BandPlan:
    """Blocks (one 64-bit mask each, a partition of the bits), the tolerated distance t, and the
    bands as sets of block indices: every (B - t)-subset when ``bands`` is None, else a covering
    design (``covering_bands``: every (B - t)-subset contains one of them, so the search stays exact).
    """

    blocks: tuple[int, ...]
    max_distance: int
    bands: tuple[tuple[int, ...], ...] | None = None

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
        if self.bands is not None and not covers(self.bands, self.num_blocks, self.max_distance):
            raise ValueError(
                f"band plan: bands {self.bands} miss a set of {self.num_blocks - self.max_distance} "
                f"of the {self.num_blocks} blocks (two values {self.max_distance} bits apart could share no band)"
            )

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def band_sets(self) -> tuple[tuple[int, ...], ...]:
        if self.bands is not None:
            return self.bands
        return tuple(itertools.combinations(range(self.num_blocks), self.num_blocks - self.max_distance))

    def masks(self) -> np.ndarray:
        """One mask per band: the union of its blocks."""
        return np.array([sum(self.blocks[b] for b in band) for band in self.band_sets()], dtype=np.uint64)

    def to_json(self) -> dict:
        d = {"blocks": [f"{b:016x}" for b in self.blocks], "max_distance": self.max_distance}
        if self.bands is not None:
            d["bands"] = [list(band) for band in self.bands]
        return d

    @classmethod
    def from_json(cls, d: dict) -> BandPlan:
        bands = tuple(tuple(int(b) for b in band) for band in d["bands"]) if "bands" in d else None
        return cls(tuple(int(b, 16) for b in d["blocks"]), int(d["max_distance"]), bands)


def covers(bands: Collection[Collection[int]], num_blocks: int, max_distance: int) -> bool:
    """Whether every set of ``max_distance`` blocks (those two values may differ in) misses at least
    one band entirely, i.e. whether every two values within t bits agree on some band."""
    sets = [sum(1 << b for b in band) for band in bands]
    if any(not 0 < s < 1 << num_blocks for s in sets):
        return False
    return all(
        any(s & sum(1 << b for b in differ) == 0 for s in sets)
        for differ in itertools.combinations(range(num_blocks), max_distance)
    )


@functools.cache
def covering_bands(num_blocks: int, max_distance: int, band_blocks: int) -> tuple[tuple[int, ...], ...] | None:
    """A small set of ``band_blocks``-subsets of the blocks such that every (B - t)-subset contains
    one (a covering design / Turan system), by greedy covering with a fixed seed, then dropping bands
    the rest already cover; None when the search would be too large (see DESIGN_SEARCH_LIMIT).

    Each band is longer than in the plan of all (B - t)-subsets of fewer blocks with the same count,
    e.g. for t = 4: 21 bands of 4 of 10 blocks (25.6 bits) against 15 bands of 2 of 6 (21.3 bits).
    """
    b, t, k = num_blocks, max_distance, band_blocks
    if not 0 < k < b - t or math.comb(b, k) * math.comb(b, t) > DESIGN_SEARCH_LIMIT:
        return None
    differ = np.array([sum(1 << x for x in d) for d in itertools.combinations(range(b), t)], dtype=np.int64)
    options = list(itertools.combinations(range(b), k))
    option_sets = np.array([sum(1 << x for x in o) for o in options], dtype=np.int64)
    hits = (option_sets[:, None] & differ[None, :]) == 0  # option misses that differing set
    rng = np.random.default_rng(0)
    best: list[int] | None = None
    for attempt in range(DESIGN_ATTEMPTS):
        open_, chosen = np.ones(len(differ), bool), []
        while open_.any():
            gain = hits[:, open_].sum(axis=1)
            top = np.flatnonzero(gain == gain.max())
            pick = int(top[rng.integers(len(top))] if attempt else top[0])
            chosen.append(pick)
            open_ &= ~hits[pick]
        for pick in list(chosen):  # drop bands the others cover
            rest = [c for c in chosen if c != pick]
            if hits[rest].any(axis=0).all():
                chosen = rest
        if best is None or len(chosen) < len(best):
            best = chosen
    return tuple(sorted(options[c] for c in best))


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


def sample_bound(n_values: int, size: int = SAMPLE_SIZE) -> int:
    """A ``mix64`` bound under which ~4 x ``size`` of ``n_values`` values fall: the values below it
    (gathered in parts, e.g. by Ray tasks) hold ``sample_values``' sample when ``size`` distinct
    ones are among them."""
    return min(MIX_END, MIX_END * 4 * size // max(n_values, 1))


def distinct_estimate(sample: np.ndarray, size: int = SAMPLE_SIZE) -> int:
    """Distinct values of the whole from its ``sample_values`` sample: all of them when the sample is
    not full, else the k-minimum-values estimate (size - 1) / (largest mix / 2^64), ~1% off at
    size 1e4 (order-free, so every engine plans for the same n)."""
    if len(sample) < size:
        return len(sample)
    return round((size - 1) * MIX_END / (int(mix64(sample).max()) + 1))


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
    uniform = sum(n_values * (n_values - 1) / 2 / 2.0 ** bin(int(m)).count("1") for m in masks)
    pairs = max(sample_pairs(sample, masks) * scale, uniform)
    return len(masks) * n_values * VALUE_COST + pairs * PAIR_COST


def uniform_cost(num_bands: int, band_bits: float, n_values: int) -> float:
    """Cost of a plan on uniform bits: each band sorts n values and checks n^2 / 2 / 2^bits pairs."""
    return num_bands * n_values * (VALUE_COST + PAIR_COST * n_values / 2 / 2.0**band_bits)


@functools.cache
def band_designs(max_distance: int) -> tuple[tuple[int, tuple[tuple[int, ...], ...] | None], ...]:
    """The exact plans' shapes, (B, bands): every (B - t)-subset of B blocks (bands None), and the
    covering designs of fewer blocks per band for B up to DESIGN_MAX_BLOCKS, where they use fewer
    bands than all subsets."""
    t = max_distance
    out: list[tuple[int, tuple[tuple[int, ...], ...] | None]] = [
        (b, None) for b in range(t + 1, HASH_BITS + 1) if math.comb(b, t) <= MAX_BANDS
    ]
    for b in range(t + 2, DESIGN_MAX_BLOCKS + 1):
        for k in range(1, b - t):
            design = covering_bands(b, t, k)
            if design is not None and len(design) <= MAX_BANDS:
                out.append((b, design))
    return tuple(out)


def design_shape(design: tuple[int, tuple[tuple[int, ...], ...] | None], max_distance: int) -> tuple[int, float]:
    """(bands, bits per band) of a design, blocks of 64 / B bits."""
    b, bands = design
    if bands is None:
        return math.comb(b, max_distance), HASH_BITS * (b - max_distance) / b
    return len(bands), HASH_BITS * len(bands[0]) / b


def fewest_bands(num_blocks: int, max_distance: int, band_blocks: int) -> int:
    """Schoenheim's lower bound on the bands of a covering design (its complements, B - k blocks
    each, must cover every t-subset): no design of this shape has fewer."""
    v, k, bound = num_blocks, num_blocks - band_blocks, 1
    for i in range(max_distance - 1, -1, -1):
        bound = math.ceil((v - i) / (k - i) * bound)
    return bound


def cheapest_designs(
    max_distance: int, n_values: int, *, cost: Callable[[int, float], float] | None = None, options: int = PLAN_OPTIONS
) -> list[tuple[int, tuple[tuple[int, ...], ...] | None]]:
    """The ``options`` designs of ``band_designs`` cheapest by ``cost(bands, bits per band)`` (default:
    ``uniform_cost`` at ``n_values``; any cost that grows with the bands at fixed bits), searching a
    covering design only while its lower bound (``fewest_bands``) could still rank."""
    t = max_distance
    if cost is None:
        cost = functools.partial(_uniform_cost_at, n_values)
    scored = [
        (cost(*design_shape((b, None), t)), b, None)
        for b in range(t + 1, HASH_BITS + 1)
        if math.comb(b, t) <= MAX_BANDS
    ]
    shapes = sorted(
        (cost(fewest_bands(b, t, k), HASH_BITS * k / b), b, k)
        for b in range(t + 2, DESIGN_MAX_BLOCKS + 1)
        for k in range(1, b - t)
    )
    for bound, b, k in shapes:
        costs = sorted(c for c, _, _ in scored)
        if len(costs) >= options and bound >= costs[options - 1]:
            break
        design = covering_bands(b, t, k)
        if design is not None and len(design) <= MAX_BANDS:
            scored.append((cost(*design_shape((b, design), t)), b, design))
    return [(b, bands) for _, b, bands in sorted(scored, key=lambda s: (s[0], s[1]))[:options]]


def _uniform_cost_at(n_values: int, num_bands: int, band_bits: float) -> float:
    return uniform_cost(num_bands, band_bits, n_values)


def plan_bands(
    values: np.ndarray, max_distance: int, *, n_values: int | None = None, num_blocks: int | None = None
) -> BandPlan:
    """The cheapest exact plan for these values: the PLAN_OPTIONS designs cheapest on uniform bits,
    each with both deals, costed on ``sample_values``' sample, for n distinct values estimated from
    it (``distinct_estimate``) unless ``n_values`` is given. So the values' sample alone gives the
    same plan as the values: ``plan_bands(sample_values(v), t) == plan_bands(v, t)``."""
    t = max_distance
    sample = sample_values(values)
    n = n_values if n_values is not None else distinct_estimate(sample)
    if len(sample) < 2:
        return interleaved(num_blocks or t + 1, t)
    entropy, corr = bit_statistics(bit_matrix(sample))
    if num_blocks:
        options = [(num_blocks, None)]
    else:  # correlated bits collide more than uniform ones: the sample decides among the near-best
        options = cheapest_designs(t, n)
    best, best_cost = None, math.inf
    for blocks, bands in options:
        for deal in (interleaved(blocks, t), greedy_blocks(entropy, corr, blocks, t)):
            plan = dataclasses.replace(deal, bands=bands)
            cost = plan_cost(plan, sample, n)
            if cost < best_cost:
                best, best_cost = plan, cost
    return best
