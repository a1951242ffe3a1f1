"""A bucket holding a large share of the values (many distinct values sharing one band key, as
near-blank images can) is split by sub-bands (``near.band_close_pairs``): the pairs found stay
exactly the brute-force pairs, in-process and in the distributed search, and the Hamming checks drop far
below the bucket's m (m - 1) / 2 -- never above it."""

import numpy as np
import pyarrow as pa
from dedup_fixtures import CANDIDATE_SCHEMA, distributed_decisions

from curation.dedup.bands import interleaved, plan_bands, sample_pairs
from curation.dedup.distributed import group_edges
from curation.dedup.hashing import hamming, uint64_to_hex
from curation.dedup.near import (
    REFINE_MIN,
    DedupNearConfig,
    SearchWork,
    band_close_pairs,
    near_duplicate_decisions,
    value_edges,
)

T = 4


def clustered(seed: int, cluster: int, others: int, fixed: int, copies: int = 400) -> np.ndarray:
    """Distinct values: ``cluster`` of them equal on the bits of ``fixed`` (random elsewhere),
    ``others`` random, and ``copies`` of random ones among them with 1..T bits flipped anywhere."""
    rng = np.random.default_rng(seed)
    fixed = np.uint64(fixed)
    centre = rng.integers(0, 2**64, dtype=np.uint64) & fixed
    values = np.concatenate(
        [
            centre | (rng.integers(0, 2**64, cluster, dtype=np.uint64) & ~fixed),
            rng.integers(0, 2**64, others, np.uint64),
        ]
    )
    copied = values[rng.integers(0, len(values), copies)]
    for k in range(T):
        flip = rng.integers(0, T, copies) >= k
        copied[flip] ^= np.uint64(1) << rng.integers(0, 64, int(flip.sum())).astype(np.uint64)
    return np.unique(np.concatenate([values, copied]))


def brute_pairs(values: np.ndarray, mask: int | None = None) -> set[tuple[int, int]]:
    d = hamming(values[:, None], values[None, :])
    i, j = np.triu_indices(len(values), 1)
    keep = d[i, j] <= T
    if mask is not None:
        keep &= (values[i] & np.uint64(mask)) == (values[j] & np.uint64(mask))
    return set(zip(i[keep].tolist(), j[keep].tolist()))


def as_set(i: np.ndarray, j: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(np.minimum(i, j).tolist(), np.maximum(i, j).tolist()))


def test_a_large_bucket_is_split_and_its_pairs_stay_exact():
    mask = int(interleaved(6, T).masks()[0])  # a band of 22 bits
    values = clustered(1, cluster=2500, others=500, fixed=mask)
    m = int(np.unique(values & np.uint64(mask), return_counts=True)[1].max())
    assert m > 2400  # the bucket
    work = SearchWork()
    got = as_set(*band_close_pairs(values, mask, T, max_pairs=10_000, work=work))
    truth = brute_pairs(values, mask)
    assert len(truth) > 100 and got == truth
    assert work.checked < 0.02 * m * (m - 1) / 2, work  # plain: every pair of the bucket
    assert work.close >= len(truth)


def test_the_whole_search_on_a_clustered_corpus_equals_brute_force_with_fewer_checks():
    masks = interleaved(6, T).masks()  # a cluster agreeing on band 0's 22 bits
    values = clustered(2, cluster=2500, others=1500, fixed=int(masks[0]))
    truth = brute_pairs(values)
    work = SearchWork()
    assert as_set(*value_edges(values, masks, T, max_pairs=10_000, work=work)) == truth
    plain = sample_pairs(values, masks)  # the plain search's checks: pairs sharing a band key
    assert plain > 3_000_000
    assert work.checked < plain / 20, (work, plain)
    assert as_set(*value_edges(values, plan_bands(values, T).masks(), T)) == truth  # the planner's own plan


def test_splitting_pays_only_where_the_other_bits_tell_values_apart():
    """A cluster varying in 12 bits only: about a third of its bucket pairs are within t (output),
    and sub-bands would not cut the checks, so the buckets are left whole; the pairs stay exact."""
    rng = np.random.default_rng(12)
    free = sum(1 << int(p) for p in rng.choice(64, 12, replace=False))
    values = clustered(2, cluster=2500, others=1500, fixed=(2**64 - 1) ^ free)
    masks = plan_bands(values, T).masks()
    work = SearchWork()
    assert as_set(*value_edges(values, masks, T, max_pairs=10_000, work=work)) == brute_pairs(values)
    assert work.checked == sample_pairs(values, masks) and work.close > work.checked / 4


def test_a_dense_bucket_is_left_whole_when_splitting_does_not_pay():
    """Values varying in 8 bits only: most pairs of the bucket are within t (output), so splitting
    saves nothing; the checks never exceed the plain search's and the pairs stay exact."""
    rng = np.random.default_rng(3)
    free = np.array([1, 5, 9, 17, 30, 41, 50, 62], np.uint64)
    values = np.unique(
        np.uint64(0x0123_4567_89AB_CDEF) ^ (((rng.random((400, 8)) < 0.5) << free).sum(axis=1).astype(np.uint64))
    )
    assert len(values) > REFINE_MIN
    for masks in (interleaved(6, T).masks(), plan_bands(values, T).masks()):
        work = SearchWork()
        assert as_set(*value_edges(values, masks, T, work=work)) == brute_pairs(values)
        assert work.checked <= sample_pairs(values, masks)


def test_the_ray_join_splits_the_same_way():
    """``group_edges`` (one shuffle group of the distributed search) on a group holding a large bucket."""
    masks = interleaved(6, T).masks()
    values = clustered(4, cluster=1500, others=300, fixed=int(masks[0]))
    group = pa.table({"outer": np.zeros(len(values), np.int8), "value": values, "row_id": np.arange(len(values))})
    edges = group_edges(group, [masks], T, max_pairs=10_000)
    got = set(zip(edges.column("a").to_pylist(), edges.column("b").to_pylist()))
    assert got == brute_pairs(values)


def test_ray_decisions_equal_local_on_a_clustered_corpus(ray_local, tmp_path):
    masks = interleaved(6, T).masks()
    values = clustered(5, cluster=800, others=600, fixed=int(masks[0]))
    mirrors = clustered(6, cluster=0, others=len(values), fixed=0, copies=0)[: len(values)]
    n = len(values)
    table = pa.table(
        {
            "key": [f"k{i:05d}" for i in range(n)],
            "phash": uint64_to_hex(values),
            "phash_mirror": uint64_to_hex(mirrors),
            "width": np.full(n, 256, np.int32),
            "height": np.full(n, 256, np.int32),
            "person_score_max": pa.array(np.zeros(n), pa.float32()),
        },
        schema=CANDIDATE_SCHEMA,
    )
    cfg = DedupNearConfig(max_distance=T, num_blocks=6)
    local = near_duplicate_decisions(table, cfg)
    assert local.num_rows > 100
    assert distributed_decisions(tmp_path, table, cfg, partitions=3).equals(local)
