"""The band planner: one plan, one cost model, for every exact near-duplicate search.

Any partition of the 64 bits into B blocks keeps the search exact: two values at most t bits apart
differ in at most t blocks, so they agree on the B - t others and on every *band* (a set of blocks
compared as one key) among them. All (B - t)-subsets make one exact plan; a *covering design*
(``covering_bands``) makes another with fewer, longer bands. A plan may also hold bits ``within``
every band, for values known to agree on them (the distributed search's shuffle groups).

A plan sets the cost (``Workload``), never the pairs found. Real PHash bits (biased, correlated)
collide far more often than uniform ones, so where the values are at hand the pairs are counted
on a sample of them (``sample_values``: the same whatever the order or partitioning).
``plan_bands`` serves the in-process search (``near``), the distributed one (``distributed``) and
the near-dup index (``incremental.index_plan``): the same values give the same plan in every engine.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Collection

import numpy as np

HASH_BITS = 64
ALL_BITS = (1 << HASH_BITS) - 1
MAX_BANDS = 5000
SAMPLE_SIZE = 10_000
MIX_END = 1 << 64  # mix64 values lie in [0, MIX_END)
VALUE_COST = 1.0  # relative cost of one value in one band (its share of the band's sort)
PAIR_COST = 0.3  # of one candidate pair (generate + Hamming check), as measured: docs/results/dedup_scaling.md
DESIGN_SEARCH_LIMIT = 500_000  # options x differing sets a covering-design search may hold
DESIGN_ATTEMPTS = 8
DESIGN_MAX_BLOCKS = 12  # covering designs are searched for B up to this
PLAN_OPTIONS = 6  # designs costed on the sample


@dataclasses.dataclass(frozen=True)
class BandPlan:
    """Blocks (one mask each, a partition of the bits outside ``within``), the tolerated distance t,
    and the bands as sets of block indices: every (B - t)-subset when ``bands`` is None, else a
    covering design (every (B - t)-subset contains one of them, so the search stays exact)."""

    blocks: tuple[int, ...]
    max_distance: int
    bands: tuple[tuple[int, ...], ...] | None = None
    within: int = 0

    def __post_init__(self) -> None:
        union = self.within
        for b in self.blocks:
            if union & b:
                raise ValueError("band plan blocks overlap")
            union |= b
        if union != ALL_BITS or len(self.blocks) <= self.max_distance:
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

    def masks(self) -> np.ndarray:
        """One mask per band: the union of its blocks, and ``within``."""
        b, t = self.num_blocks, self.max_distance
        bands = self.bands if self.bands is not None else itertools.combinations(range(b), b - t)
        return np.array([self.within | sum(self.blocks[i] for i in band) for band in bands], np.uint64)


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
    one, by greedy covering with a fixed seed, less bands the rest cover; None past DESIGN_SEARCH_LIMIT."""
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


def free_bits(within: int) -> list[int]:
    return [p for p in range(HASH_BITS) if not within >> p & 1]


def interleaved(num_blocks: int, max_distance: int, within: int = 0) -> BandPlan:
    """The k-th bit outside ``within`` in block k % B, every (B - t)-subset a band."""
    bits = free_bits(within)
    return BandPlan(
        tuple(sum(1 << p for p in bits[b::num_blocks]) for b in range(num_blocks)), max_distance, None, within
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
    """Distinct values of the whole from its ``sample_values`` sample (exact when not full, else the
    k-minimum-values estimate: order-free, so every engine plans for the same n)."""
    if len(sample) < size:
        return len(sample)
    return round((size - 1) * MIX_END / (int(mix64(sample).max()) + 1))


def bit_matrix(values: np.ndarray) -> np.ndarray:
    return ((values[:, None] >> np.arange(HASH_BITS, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)


def bit_statistics(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(binary entropy of each bit, |correlation| between bits; 0 for a constant bit) of a sample
    (rows of 0/1), counted exactly on packed bit columns (co-occurrences by popcount)."""
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
    q = np.clip(p, 1e-12, 1 - 1e-12)
    return -(q * np.log2(q) + (1 - q) * np.log2(1 - q)), corr


def greedy_blocks(
    entropy: np.ndarray, corr: np.ndarray, num_blocks: int, max_distance: int, within: int = 0
) -> BandPlan:
    """Deal the bits outside ``within``, most informative first, where they add the least correlation."""
    bits = free_bits(within)
    cap = math.ceil(len(bits) / num_blocks)
    members: list[list[int]] = [[] for _ in range(num_blocks)]
    for bit in sorted(bits, key=lambda j: (-round(float(entropy[j]), 9), j)):
        open_blocks = [b for b in range(num_blocks) if len(members[b]) < cap]
        best = min(
            open_blocks,
            key=lambda b: (round(float(corr[bit, members[b]].sum()), 6), round(float(entropy[members[b]].sum()), 6), b),
        )
        members[best].append(bit)
    return BandPlan(tuple(sum(1 << p for p in m) for m in members), max_distance, None, within)


def sample_pairs(sample: np.ndarray, masks: np.ndarray) -> float:
    """Pairs of sample values sharing a band key, summed over the bands."""
    total = 0
    for mask in masks:  # run lengths of the sorted keys (np.unique's counts hash, slower at 1e6)
        keys = np.sort(sample & mask)
        counts = np.diff(np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True]))
        total += int((counts * (counts - 1) // 2).sum())
    return float(total)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a plan is chosen for: ``values`` hashed into every band at ``value_cost`` each, and a
    Hamming check (``PAIR_COST``) per pair sharing a band key, among the values (``queries`` None:
    a search) or between them and a later batch of ``queries`` values (an index)."""

    values: int
    value_cost: float = VALUE_COST
    queries: int | None = None

    @property
    def pair_scale(self) -> float:
        """The pairs a band of collision probability 1 would give."""
        return self.values**2 / 2 if self.queries is None else float(self.values) * self.queries

    def uniform_cost(self, num_bands: int, band_bits: float) -> float:
        """Cost of ``num_bands`` bands of ``band_bits`` bits on uniform bits."""
        return num_bands * (self.values * self.value_cost + PAIR_COST * self.pair_scale / 2.0**band_bits)

    def cost(self, plan: BandPlan, sample: np.ndarray | None) -> float:
        """Cost of ``plan``, its pairs counted on ``sample`` and scaled up, never below the uniform figure."""
        masks = plan.masks()
        pairs = sum(self.pair_scale / 2.0 ** int(m).bit_count() for m in masks)
        if sample is not None and len(sample) > 1:
            pairs = max(sample_pairs(sample, masks) * self.pair_scale / (len(sample) ** 2 / 2), pairs)
        return len(masks) * self.values * self.value_cost + pairs * PAIR_COST


def design_shape(design: tuple[int, tuple | None], max_distance: int, within: int = 0) -> tuple[int, float]:
    """(bands, bits per band) of a design, blocks of an equal share of the bits outside ``within``."""
    b, bands = design
    fixed = int(within).bit_count()
    if bands is None:
        return math.comb(b, max_distance), (HASH_BITS - fixed) * (b - max_distance) / b + fixed
    return len(bands), (HASH_BITS - fixed) * len(bands[0]) / b + fixed


def fewest_bands(num_blocks: int, max_distance: int, band_blocks: int) -> int:
    """Schoenheim's lower bound on the bands of a covering design (its complements, B - k blocks
    each, must cover every t-subset): no design of this shape has fewer."""
    v, k, bound = num_blocks, num_blocks - band_blocks, 1
    for i in range(max_distance - 1, -1, -1):
        bound = math.ceil((v - i) / (k - i) * bound)
    return bound


def cheapest_designs(
    max_distance: int, workload: Workload, options: int = PLAN_OPTIONS, within: int = 0
) -> list[tuple[int, tuple[tuple[int, ...], ...] | None]]:
    """The ``options`` plan shapes (B, bands) cheapest by ``workload.uniform_cost``: all (B - t)-subsets
    (bands None) and the covering designs for B up to DESIGN_MAX_BLOCKS, each searched only while
    its lower bound (``fewest_bands``) could rank."""
    t, space, fixed = max_distance, HASH_BITS - int(within).bit_count(), int(within).bit_count()
    scored = [
        (workload.uniform_cost(*design_shape((b, None), t, within)), b, None)
        for b in range(t + 1, space + 1)
        if math.comb(b, t) <= MAX_BANDS
    ]
    shapes = sorted(
        (workload.uniform_cost(fewest_bands(b, t, k), space * k / b + fixed), b, k)
        for b in range(t + 2, min(DESIGN_MAX_BLOCKS, space) + 1)
        for k in range(1, b - t)
    )
    for bound, b, k in shapes:
        costs = sorted(c for c, _, _ in scored)
        if len(costs) >= options and bound >= costs[options - 1]:
            break
        design = covering_bands(b, t, k)
        if design is not None and len(design) <= MAX_BANDS:
            scored.append((workload.uniform_cost(*design_shape((b, design), t, within)), b, design))
    return [(b, bands) for _, b, bands in sorted(scored, key=lambda s: (s[0], s[1]))[:options]]


def plan_bands(
    values: np.ndarray | None,
    max_distance: int,
    workload: Workload | None = None,
    *,
    num_blocks: int | None = None,
    within: int = 0,
) -> BandPlan:
    """The cheapest exact plan for ``workload`` (default: a search among ``values``, as many as
    ``distinct_estimate`` says): ``cheapest_designs`` (all (B - t)-subsets of ``num_blocks`` blocks when
    given), each deal costed on the sample of ``values`` (None: uniform bits, interleaved). The sample
    alone gives the values' plan: ``plan_bands(sample_values(v), t) == plan_bands(v, t)``."""
    t = max_distance
    sample = None if values is None else sample_values(values)
    if sample is not None and len(sample) < 2:
        return interleaved(num_blocks or t + 1, t, within)
    workload = workload or Workload(distinct_estimate(sample))
    stats = bit_statistics(bit_matrix(sample)) if sample is not None else None
    options = [(num_blocks, None)] if num_blocks else cheapest_designs(t, workload, within=within)
    best, best_cost = None, math.inf
    for blocks, bands in options:
        deals = [interleaved(blocks, t, within)] + ([greedy_blocks(*stats, blocks, t, within)] if stats else [])
        for deal in deals:
            plan = dataclasses.replace(deal, bands=bands)
            cost = workload.cost(plan, sample)
            if cost < best_cost:
                best, best_cost = plan, cost
    return best
