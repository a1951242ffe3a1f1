import itertools
import re

import numpy as np
import pyarrow as pa
import pytest
from dedup_fixtures import BASE, flip_bits, planted_table, rows, shuffled

from curation.dedup import DECISION_SCHEMA
from curation.dedup.bands import interleaved, plan_bands
from curation.dedup.hashing import hamming, hex_to_uint64
from curation.dedup.near import DedupNearConfig, near_duplicate_decisions, value_edges


def decisions(table, **cfg):
    return near_duplicate_decisions(table, DedupNearConfig(**cfg)).to_pylist()


def test_representative_rule_resolution_then_key():
    t = rows(
        ("a", BASE, 100, 100, 0.9),
        ("b", flip_bits(BASE, [3]), 200, 100, 0.1),  # largest: kept
        ("c", flip_bits(BASE, [5, 9]), 200, 100, None),
        ("x", BASE ^ 0xFFFF_0000_FFFF_0000, 300, 300, 0.5),
    )  # 32 bits away: alone
    assert decisions(t) == [
        {"key": "a", "reason": "near_duplicate", "duplicate_of": "b", "duplicate_group": "phash:b"},
        {"key": "c", "reason": "near_duplicate", "duplicate_of": "b", "duplicate_group": "phash:b"},
    ]
    t = rows(
        ("a", BASE, 200, 100, 0.2),
        ("b", flip_bits(BASE, [1]), 100, 200, 0.7),
        ("c", flip_bits(BASE, [2]), 100, 200, None),
    )
    # same pixels: a person score does not decide (the representative is chosen before detection)
    assert [(d["key"], d["duplicate_of"]) for d in decisions(t)] == [("b", "a"), ("c", "a")]
    t = rows(("b", BASE, 100, 100, None), ("a", flip_bits(BASE, [1]), 100, 100, None))
    assert [(d["key"], d["duplicate_of"]) for d in decisions(t)] == [("b", "a")]  # all tied: smallest key


def test_groups_are_connected_components():
    # a~b and b~c within 4 bits, a and c 8 bits apart: one group, one representative.
    b = flip_bits(BASE, [0, 1, 2, 3])
    c = flip_bits(b, [10, 11, 12, 13])
    t = rows(
        ("a", BASE, 100, 100, None),
        ("b", b, 10, 10, None),
        ("c", c, 101, 100, 0.5),
        ("d", BASE ^ 0x0F0F_F0F0_0F0F_F0F0, 500, 500, None),
    )
    assert hamming(*hex_to_uint64([f"{BASE:016x}", f"{c:016x}"])) == 8
    out = decisions(t)
    assert [(d["key"], d["duplicate_of"], d["duplicate_group"]) for d in out] == [
        ("a", "c", "phash:c"),
        ("b", "c", "phash:c"),
    ]  # b (smallest) is dropped and represents nothing


def test_distance_threshold_is_inclusive_and_exact_copies_group():
    t = rows(
        ("a", BASE, 10, 10, None),
        ("b", flip_bits(BASE, [1, 2, 3, 4]), 10, 10, None),
        ("c", flip_bits(BASE, [20, 21, 22, 23, 24, 25]), 10, 10, None),
        ("d", BASE, 10, 10, None),
    )
    assert [d["key"] for d in decisions(t, max_distance=4)] == ["b", "d"]
    assert [d["key"] for d in decisions(t, max_distance=6)] == ["b", "c", "d"]
    assert decisions(t, max_distance=0) == [
        {"key": "d", "reason": "near_duplicate", "duplicate_of": "a", "duplicate_group": "phash:a"}
    ]


def test_mirror_hash_matches_flipped_copies_only_when_enabled():
    flipped_copy = flip_bits(BASE, [7])
    t = rows(
        ("orig", BASE, 100, 100, None, 0x1234_5678_9ABC_DEF0),
        ("flip", 0x0F0F_0F0F_0F0F_0F0F, 50, 50, None, flipped_copy),
    )
    assert [(d["key"], d["duplicate_of"]) for d in decisions(t)] == [("flip", "orig")]
    assert decisions(t, match_mirrored=False) == []
    with pytest.raises(ValueError, match="phash_mirror"):
        near_duplicate_decisions(t.drop_columns(["phash_mirror"]), DedupNearConfig())
    assert (
        near_duplicate_decisions(t.drop_columns(["phash_mirror"]), DedupNearConfig(match_mirrored=False)).num_rows == 0
    )


@pytest.mark.parametrize("t", [0, 1, 3, 4, 6, 8])
def test_banded_search_finds_exactly_the_brute_force_pairs(t):
    table = planted_table(1500, seed=t, max_flips=t + 2)
    values = np.unique(hex_to_uint64(table.column("phash")))
    d = hamming(values[:, None], values[None, :])
    i, j = np.triu_indices(len(values), 1)
    truth = set(zip(i[d[i, j] <= t].tolist(), j[d[i, j] <= t].tolist()))
    assert truth or t == 0  # planted pairs exist (distinct values are never 0 bits apart)
    for masks in (plan_bands(values, t).masks(), interleaved(t + 1, t).masks(), interleaved(t + 3, t).masks()):
        a, b = value_edges(values, masks, t, max_pairs=5000)
        assert set(zip(a.tolist(), b.tolist())) == truth, len(masks)


def test_decisions_do_not_depend_on_row_order():
    table = planted_table(3000, seed=1)
    expected = near_duplicate_decisions(table, DedupNearConfig())
    assert expected.num_rows > 500
    assert expected.schema == DECISION_SCHEMA
    for seed in range(3):
        assert near_duplicate_decisions(shuffled(table, seed), DedupNearConfig()).equals(expected)
    # the number of blocks changes the cost only
    assert near_duplicate_decisions(table, DedupNearConfig(num_blocks=9)).equals(expected)


def test_every_dropped_row_points_at_a_kept_row_of_its_group():
    table = planted_table(3000, seed=2, max_flips=6)
    out = near_duplicate_decisions(table, DedupNearConfig(max_distance=6))
    dropped = set(out.column("key").to_pylist())
    groups = {}
    for d in out.to_pylist():
        assert d["duplicate_of"] not in dropped
        assert d["duplicate_group"] == "phash:" + d["duplicate_of"]
        groups.setdefault(d["duplicate_group"], set()).add(d["duplicate_of"])
    assert all(len(reps) == 1 for reps in groups.values())


def test_prefer_makes_rows_win_the_representative_choice():
    t = rows(("old", BASE, 10, 10, None), ("new", flip_bits(BASE, [4]), 1000, 1000, 0.9))
    out = near_duplicate_decisions(t, DedupNearConfig(), prefer={"old"}).to_pylist()
    assert [(d["key"], d["duplicate_of"]) for d in out] == [("new", "old")]


def test_disabled_and_empty():
    t = planted_table(50)
    assert near_duplicate_decisions(t, DedupNearConfig(enabled=False)).num_rows == 0
    assert near_duplicate_decisions(t.slice(0, 0), DedupNearConfig()).num_rows == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_distance": 40}, "0..16"),
        ({"max_distance": -1}, "0..16"),
        ({"max_distance": 4, "num_blocks": 4}, "num_blocks"),
        ({"max_distance": 8, "num_blocks": 40}, "bands"),
        ({"hash": "ahash"}, "phash"),
    ],
)
def test_invalid_settings_say_what_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DedupNearConfig(**kwargs)


@pytest.mark.parametrize(
    "override",
    [
        "dedup.near.max_distance=40",
        "dedup.near.num_blocks=3",
        "dedup.near.index_num_blocks=65",
        "dedup.near.max_pairs_per_chunk=0",
        "dedup.near.hash=dhash",
    ],
)
def test_a_bad_value_in_the_curation_config_names_its_real_key(override):
    """The message names the key as a user writes it in the curation config (not a former name)."""
    from curation.recipe import CurationConfig
    from infra.config import load_config

    key = override.partition("=")[0]
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}\b"):
        load_config(CurationConfig, overrides=["input.uri=x", "output_dir=y", override])


def test_duplicate_keys_are_refused():
    t = rows(("a", BASE, 10, 10, None), ("a", BASE, 10, 10, None))
    with pytest.raises(ValueError, match="unique"):
        near_duplicate_decisions(t, DedupNearConfig())


def reference_decisions(table: pa.Table, t: int) -> list[dict]:
    """Brute force over row pairs and hash variants, naive union-find, the package's group rule."""
    from curation.dedup import representative_sort_key

    def group_decisions(members, reason, group_id):  # every member but the rule's first is dropped
        ordered = sorted(members, key=representative_sort_key)
        rep = ordered[0]["key"]
        return [
            {"key": m["key"], "reason": reason, "duplicate_of": rep, "duplicate_group": group_id} for m in ordered[1:]
        ]

    recs = table.to_pylist()
    hv = [(int(r["phash"], 16), int(r["phash_mirror"], 16)) for r in recs]
    parent = list(range(len(recs)))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for i, j in itertools.combinations(range(len(recs)), 2):
        if min(bin(x ^ y).count("1") for x in hv[i] for y in hv[j]) <= t:
            parent[find(i)] = find(j)
    groups = {}
    for i, r in enumerate(recs):
        groups.setdefault(find(i), []).append(r)
    out = []
    for members in groups.values():
        if len(members) > 1:
            rep = group_decisions(members, "near_duplicate", "")[0]["duplicate_of"]
            out.extend({**d, "duplicate_group": "phash:" + rep} for d in group_decisions(members, "near_duplicate", ""))
    return sorted(out, key=lambda d: d["key"])


@pytest.mark.parametrize("t", [2, 4, 6])
def test_decisions_equal_a_brute_force_reference(t):
    table = planted_table(400, seed=10 + t, max_flips=t + 2)
    assert near_duplicate_decisions(table, DedupNearConfig(max_distance=t)).to_pylist() == reference_decisions(table, t)


@pytest.mark.parametrize("t", [2, 4, 6])
def test_data_driven_bands_find_exactly_the_brute_force_pairs_on_correlated_bits(t):
    from curation.dedup.bands import bit_matrix, bit_statistics, greedy_blocks, plan_bands

    rng = np.random.default_rng(t)
    w = rng.standard_normal((64, 4))
    bits = (rng.standard_normal((1200, 4)) @ w.T + 0.5 * rng.standard_normal((1200, 64))) > 0  # strongly correlated
    values = (bits.astype(np.uint64) << np.arange(64, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
    copies = values[rng.integers(0, 1200, 300)] ^ (np.uint64(1) << rng.integers(0, 64, 300).astype(np.uint64))
    values = np.unique(np.concatenate([values, copies]))
    d = hamming(values[:, None], values[None, :])
    i, j = np.triu_indices(len(values), 1)
    truth = set(zip(i[d[i, j] <= t].tolist(), j[d[i, j] <= t].tolist()))
    assert len(truth) > 100
    plan = plan_bands(values, t)
    assert sorted(bin(b).count("1") for b in plan.blocks) and sum(plan.blocks) == 2**64 - 1
    for masks in (plan.masks(), greedy_blocks(*bit_statistics(bit_matrix(values)), t + 2, t).masks()):
        a, b = value_edges(values, masks, t, max_pairs=5000)
        assert set(zip(a.tolist(), b.tolist())) == truth


def test_candidate_pair_count_equals_the_pairs_sharing_a_band_key():
    """``bands.sample_pairs`` (the planner's and the benchmark's candidate count) counts, summed over
    the bands, the pairs of values whose keys under the band's mask are equal."""
    from curation.dedup.bands import interleaved, sample_pairs

    rng = np.random.default_rng(3)
    values = np.unique(rng.integers(0, 2**12, 600, dtype=np.uint64) * np.uint64(0x1000100010001))  # few keys: many ties
    masks = interleaved(6, 4).masks()
    expected = sum(
        int((values[i] & m) == (values[j] & m)) for m in masks for i, j in itertools.combinations(range(len(values)), 2)
    )
    assert expected > 1000
    assert sample_pairs(values, masks) == expected
