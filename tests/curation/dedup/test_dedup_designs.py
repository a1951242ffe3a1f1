"""Covering-design band plans (``curation.dedup.bands.covering_bands``) and the packed band sort:
both must keep the near-duplicate search exact."""

import dataclasses
import itertools
import math

import numpy as np
import pytest
from dedup_fixtures import planted_table

from curation.dedup.bands import (
    DESIGN_MAX_BLOCKS,
    HASH_BITS,
    MAX_BANDS,
    PLAN_OPTIONS,
    SAMPLE_SIZE,
    Workload,
    cheapest_designs,
    covering_bands,
    covers,
    design_shape,
    distinct_estimate,
    fewest_bands,
    interleaved,
    mix64,
    plan_bands,
    sample_bound,
    sample_values,
)
from curation.dedup.hashing import hamming, hex_to_uint64
from curation.dedup.near import sort_by_band, value_edges


def band_designs(t: int) -> list[tuple[int, tuple[tuple[int, ...], ...] | None]]:
    """Every exact plan's shape the planner chooses among, (B, bands): every (B - t)-subset of B
    blocks (bands None), and the covering designs of fewer blocks per band for B up to
    DESIGN_MAX_BLOCKS, where they use fewer bands than all subsets."""
    out: list = [(b, None) for b in range(t + 1, HASH_BITS + 1) if math.comb(b, t) <= MAX_BANDS]
    for b in range(t + 2, DESIGN_MAX_BLOCKS + 1):
        for k in range(1, b - t):
            design = covering_bands(b, t, k)
            if design is not None and len(design) <= MAX_BANDS:
                out.append((b, design))
    return out


def brute_force(values: np.ndarray, t: int) -> set[tuple[int, int]]:
    d = hamming(values[:, None], values[None, :])
    i, j = np.triu_indices(len(values), 1)
    keep = d[i, j] <= t
    return set(zip(i[keep].tolist(), j[keep].tolist()))


@pytest.mark.parametrize("t", [2, 4])
def test_every_design_covers_and_none_has_a_spare_band(t):
    designs = [(b, bands) for b, bands in band_designs(t) if bands is not None]
    assert len(designs) >= 10
    for b, bands in designs:
        assert covers(bands, b, t), (b, bands)
        assert len(bands) < len(list(itertools.combinations(range(b), b - t)))  # fewer than all subsets
        for drop in range(len(bands)):  # minimal: every band is needed
            assert not covers(bands[:drop] + bands[drop + 1 :], b, t), (b, bands, drop)


def test_a_plan_whose_bands_miss_a_subset_is_refused():
    bands = covering_bands(10, 4, 4)
    plan = dataclasses.replace(interleaved(10, 4), bands=bands)
    with pytest.raises(ValueError, match="miss a set of 6 of the 10 blocks"):
        dataclasses.replace(plan, bands=bands[1:])
    with pytest.raises(ValueError, match="miss"):
        dataclasses.replace(plan, bands=((0, 1, 2, 10),))  # a block that does not exist


@pytest.mark.parametrize("t", [2, 4])
def test_every_design_finds_exactly_the_brute_force_pairs(t):
    values = np.unique(hex_to_uint64(planted_table(1200, seed=t + 11, max_flips=t + 2).column("phash")))
    truth = brute_force(values, t)
    assert len(truth) > 100
    for b, bands in band_designs(t):
        if bands is None and b > t + 3:
            continue
        plan = dataclasses.replace(interleaved(b, t), bands=bands)
        a, c = value_edges(values, plan.masks(), t, max_pairs=5000)
        assert set(zip(a.tolist(), c.tolist())) == truth, (b, bands)


def test_the_planner_takes_longer_bands_as_the_corpus_grows():
    """The plan is chosen for the size it will search: past a few million values a covering
    design of longer bands beats every all-subsets plan on uniform bits (cost model, no search)."""
    values = np.random.default_rng(0).integers(0, 2**63, 20000, dtype=np.uint64)
    shapes = []
    for n in (10**5, 10**7, 10**9):
        plan = plan_bands(values, 4, Workload(n))
        bits = [bin(int(m)).count("1") for m in plan.masks()]
        shapes.append((len(bits), min(bits)))
    assert shapes[0][1] < shapes[1][1] < shapes[2][1]
    big = plan_bands(values, 4, Workload(10**9))
    assert big.bands is not None and len(big.masks()) < 70  # all 4-of-8 subsets, 32 bits, is 70 bands


def test_packed_band_sort_groups_exactly_the_equal_masked_keys():
    rng = np.random.default_rng(5)
    mask = 0x00FF_F00F_00FF_F0F0
    keys_in_mask = rng.integers(0, 2**63, 40, dtype=np.uint64) & np.uint64(mask)  # 40 band keys
    rest = rng.integers(0, 2**63, 5000, dtype=np.uint64) & ~np.uint64(mask)
    values = np.unique(keys_in_mask[rng.integers(0, 40, 5000)] | rest)
    order, keys = sort_by_band(values, mask)
    assert sorted(order.tolist()) == list(range(len(values)))  # a permutation
    masked = values[order] & np.uint64(mask)
    same_key = keys[1:] == keys[:-1]
    assert same_key.sum() > 1000  # many ties
    np.testing.assert_array_equal(same_key, masked[1:] == masked[:-1])  # runs of keys == runs of masked bits
    assert len(np.unique(masked)) == len(np.unique(keys))


@pytest.mark.parametrize("t", [2, 4, 10])
def test_the_planner_searches_designs_lazily_yet_ranks_as_if_it_had_all(t):
    for b, bands in band_designs(t):
        if bands is not None:
            assert len(bands) >= fewest_bands(b, t, len(bands[0]))  # the bound that lets it stop early
    for n in (10**3, 10**5, 2 * 10**6, 10**8, 10**9):
        full = sorted(band_designs(t), key=lambda d: (Workload(n).uniform_cost(*design_shape(d, t)), d[0]))
        assert cheapest_designs(t, Workload(n)) == full[:PLAN_OPTIONS], n


def test_a_sample_alone_gives_the_values_plan():
    """What lets the Ray search plan from tasks' samples: ``plan_bands`` of the values'
    ``sample_values`` sample is the plan of the values (n estimated from the sample either way),
    and the values under ``sample_bound`` hold that sample."""
    rng = np.random.default_rng(11)
    base = rng.integers(0, 2**63, 60_000, dtype=np.uint64)
    values = np.concatenate([base, base[:20_000] ^ np.uint64(0b1011)])  # correlated: planted near copies
    sample = sample_values(values)
    assert len(sample) == SAMPLE_SIZE
    assert plan_bands(sample, 4) == plan_bands(values, 4)
    below = values[mix64(values) < np.uint64(sample_bound(len(values)))]
    np.testing.assert_array_equal(sample_values(below), sample)
    n = len(np.unique(values))
    assert abs(distinct_estimate(sample) - n) < 0.05 * n
    few = np.repeat(base[:50], 100)  # fewer distinct values than a sample: counted exactly
    assert distinct_estimate(sample_values(few)) == 50
