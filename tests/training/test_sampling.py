"""Sampling policies of the pretraining stream (``data.sampling``, ``training.sampling``).

The distribution tests draw a few thousand samples from the stream of a synthetic version with
a fixed seed and compare the counts with the policy's probabilities, computed here by hand from
the attributes (not by the code under test), with Pearson's chi-square at significance 0.001.
Each also checks that the same statistic rejects the draws of the ``uniform`` stream (p < 1e-6):
the test would fail if the policy were ignored. The stream's draws are per-epoch Bernoulli
acceptances (each sample at most once per epoch), whose counts vary less than a multinomial's:
the statistic is conservative for the policy and still decisive against ``uniform``.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from curation.output import CLUSTERS_FILE
from infra.config import load_config
from tests.conftest import REPO
from tests.training.versions import add_clusters, synthetic_version, tar_keys
from training.config import (
    Bounds,
    CropConfig,
    DataConfig,
    MaskingConfig,
    PretrainConfig,
    SamplingConfig,
    WeightConfig,
    identity_dict,
)
from training.data import RankSpec, ResumableLoader, ShardStream, fresh_states
from training.sampling import Sampler, leaf_weights, sampler_of

ALPHA = 1e-3  # the distribution tests' significance
CROPS = CropConfig(global_size=(32, 32), local_size=(16, 16), num_global=2, num_local=2)
DRAWS = 3000


def score_of(key: str) -> float | None:
    """The synthetic versions' ``score`` attribute: 0..4 by image index; every 7th sample none."""
    i = int(key.rsplit("img", 1)[1])
    return None if i % 7 == 6 else float(i % 5)


# The balanced version's clusters: level 0 has 3 clusters; their leaves (level 1) hold 16 + 4,
# 8, and 2 + 1 + 1 samples. Leaf 6 (under cluster 1) is listed in clusters.json with no sample.
LEAVES = {0: (0, 16), 1: (0, 4), 2: (1, 8), 3: (2, 2), 4: (2, 1), 5: (2, 1)}  # leaf: (parent, size)
# By hand: 1/3 per top cluster, then 1/(non-empty children), then 1/(leaf size).
P_LEAF_SAMPLE = {0: 1 / 3 / 2 / 16, 1: 1 / 3 / 2 / 4, 2: 1 / 3 / 1 / 8, 3: 1 / 3 / 3 / 2, 4: 1 / 3 / 3, 5: 1 / 3 / 3}


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> tuple[str, list[str]]:
    """4 shards of 8 samples with a ``score`` and a text ``label`` column."""
    root = tmp_path_factory.mktemp("scored")
    return synthetic_version(root, [8, 8, 8, 8], lambda k: {"score": score_of(k), "label": k[:2]})


@pytest.fixture(scope="module")
def balanced(tmp_path_factory) -> tuple[str, list[str], dict[str, int]]:
    """The ``LEAVES`` tree over 4 shards of 8 samples; returns (uri, shards, leaf of each key)."""
    root = tmp_path_factory.mktemp("balanced")
    uri, shards = synthetic_version(root, [8, 8, 8, 8], lambda k: {"score": score_of(k)})
    keys = sorted(k for s in shards for k in tar_keys(s))
    order = np.random.default_rng(5).permutation(len(keys))  # leaves spread over the shards
    sizes = [leaf for leaf, (_, size) in LEAVES.items() for _ in range(size)]
    leaf_of = {keys[i]: sizes[j] for j, i in enumerate(order)}
    add_clusters(root, lambda row: [LEAVES[leaf_of[row["key"]]][0], leaf_of[row["key"]]], [3, 7])
    clusters = json.loads((root / CLUSTERS_FILE).read_text())
    clusters["levels"][1]["counts"]["6"], clusters["parents"][1]["6"] = 0, 1
    (root / CLUSTERS_FILE).write_text(json.dumps(clusters))
    return uri, shards, leaf_of


def draw(shards, sampler, n=DRAWS, seed=0):
    """``n`` draws of one slot's stream (no decoding): (count per key, the slot's state)."""
    state = fresh_states(len(shards), rank=0, world_size=1, loader_workers=0)[0]
    stream = iter(ShardStream(tuple(shards), state, seed=seed, buffer_size=4, sampler=sampler))
    return collections.Counter(next(stream)[0] for _ in range(n)), state


def p_value(counts: collections.Counter, probability: dict[str, float]) -> float:
    keys = sorted(probability)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    expected = np.array([probability[k] for k in keys]) / sum(probability.values()) * observed.sum()
    return float(chisquare(observed, expected).pvalue)


def sampling(**kwargs) -> SamplingConfig:
    cfg = SamplingConfig(**kwargs)
    cfg.validate()
    return cfg


# ---- uniform: the stream before policies ---------------------------------------------------------

# The first 6 batches of ``ResumableLoader`` on ``synthetic_shards`` (2 loader workers, buffer 4,
# batch 3, seed 0), as the loader made them before sampling policies existed (training/data.py at
# d606518, run once to record them). The order is integer arithmetic (splitmix64, numpy's
# permutation), the same on every machine. The same run compared the whole batches (crops and
# masks, torch.equal) of the old and the new loader on 5 layouts: identical.
BEFORE_POLICIES = {
    (0, 1): [
        ["s2_img002", "s2_img000", "s2_img001"],
        ["s1_img001", "s1_img003", "s1_img002"],
        ["s0_img000", "s2_img003", "s0_img004"],
        ["s1_img005", "s1_img000", "s1_img001"],
        ["s2_img000", "s0_img003", "s2_img002"],
        ["s1_img006", "s1_img002", "s1_img004"],
    ],
    (1, 2): [
        ["s1_img002", "s2_img002", "s1_img006"],
        ["s2_img003", "s2_img003", "s0_img000"],
        ["s1_img002", "s1_img006", "s0_img003"],
        ["s1_img003", "s1_img003", "s0_img000"],
        ["s2_img002", "s0_img002", "s0_img003"],
        ["s0_img004", "s0_img004", "s1_img006"],
    ],
}


@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2)])
def test_uniform_is_the_stream_before_policies_and_reads_no_sidecar(synthetic_shards, rank, world):
    spec = RankSpec(
        rank=rank, world_size=world, batch_size=3, crops=CROPS, masking=MaskingConfig(), patch_stride=16, seed=0
    )
    data = DataConfig(loader_workers=2, shuffle_buffer=4, sampling=SamplingConfig(policy="uniform"))
    # synthetic_shards has no sidecars and no version folder: uniform never looks for them.
    it = ResumableLoader(tuple(synthetic_shards), data, spec, dataset_uri="/nonexistent")
    assert it.sampler is None
    assert [next(it).keys for _ in range(6)] == BEFORE_POLICIES[(rank, world)]
    assert it.metrics() == {}
    it.close()


def test_the_default_policy_leaves_a_runs_identity_as_it_was():
    cfg = load_config(PretrainConfig, REPO / "configs" / "pretrain_tiny.yaml")
    assert "sampling" not in identity_dict(cfg)["data"]
    weighted = load_config(
        PretrainConfig,
        REPO / "configs" / "pretrain_tiny.yaml",
        ["data.sampling.policy=weighted", "data.sampling.weight.column=aesthetic_score"],
    )
    assert identity_dict(weighted)["data"]["sampling"]["weight"]["column"] == "aesthetic_score"


# ---- the distributions ---------------------------------------------------------------------------


def test_filter_draws_exactly_the_samples_within_its_bounds(scored):
    uri, shards = scored
    cfg = sampling(policy="filter", filter={"score": Bounds(min=2, max=3)})
    counts, state = draw(shards, Sampler(cfg, uri), n=600)
    keys = [k for s in shards for k in tar_keys(s)]
    inside = {k for k in keys if score_of(k) is not None and 2 <= score_of(k) <= 3}
    assert set(counts) == inside and 0 < len(inside) < len(keys)  # nulls and the rest never drawn
    assert state.accepted / state.offered == pytest.approx(len(inside) / len(keys), abs=0.02)


def test_weighted_draws_follow_the_clipped_weights(scored):
    uri, shards = scored
    cfg = sampling(policy="weighted", weight=WeightConfig(column="score", fn="linear", scale=1.0, clip=(0.5, 4.0)))
    keys = [k for s in shards for k in tar_keys(s)]
    # By hand: w = clip(score, 0.5, 4), a missing score weighs lo = 0.5.
    weight = {k: 0.5 if score_of(k) is None else min(4.0, max(0.5, score_of(k))) for k in keys}
    counts, _ = draw(shards, Sampler(cfg, uri))
    assert p_value(counts, weight) > ALPHA
    ignored, _ = draw(shards, None)
    assert p_value(ignored, weight) < 1e-6


def test_weighted_functions_filter_and_cap(scored):
    uri, shards = scored
    exp = Sampler(
        sampling(policy="weighted", weight=WeightConfig(column="score", fn="exp", scale=0.5, clip=(0, 9))), uri
    )
    power = WeightConfig(column="score", fn="power", scale=1.0, offset=-1.0, exponent=2.0, clip=(0, 9))
    capped = Sampler(sampling(policy="weighted", weight=power, cap=1.0, filter={"score": Bounds(max=3)}), uri)
    for key, a in exp.chances(shards[0]).items():
        s = score_of(key)
        assert a == pytest.approx(0 if s is None else min(9.0, math.exp(0.5 * s)) / 9)
    for key, a in capped.chances(shards[0]).items():
        s = score_of(key)  # (s - 1)^2 for s >= 1, accepted with min(1, w / cap); score 4 filtered out
        assert a == pytest.approx(0 if s is None or s > 3 else min(1.0, max(s - 1, 0) ** 2))


def test_leaf_weights_are_the_hierarchical_balance_by_hand(balanced):
    uri, _, _ = balanced
    w = leaf_weights(json.loads(Path(uri, CLUSTERS_FILE).read_text()))
    assert w.tolist() == pytest.approx([32 * P_LEAF_SAMPLE[leaf] for leaf in range(6)] + [0.0])


def test_balanced_draws_are_uniform_over_top_clusters_then_within(balanced):
    uri, shards, leaf_of = balanced
    sampler = Sampler(sampling(policy="balanced"), uri)
    counts, state = draw(shards, sampler)
    assert p_value(counts, {k: P_LEAF_SAMPLE[leaf] for k, leaf in leaf_of.items()}) > ALPHA
    top = collections.Counter()
    for key, n in counts.items():
        top[LEAVES[leaf_of[key]][0]] += n
    assert chisquare([top[c] for c in range(3)]).pvalue > ALPHA  # a third each, though they hold 20, 8 and 4
    # Acceptance: 1 / (N max p) = 1 / (32 / 9), as clusters.json alone predicts it.
    assert sampler.expected_acceptance() == pytest.approx(9 / 32)
    assert state.accepted / state.offered == pytest.approx(9 / 32, abs=0.02)
    ignored, _ = draw(shards, None)
    assert p_value(ignored, {k: P_LEAF_SAMPLE[leaf] for k, leaf in leaf_of.items()}) < 1e-6
    uniform_top = collections.Counter()
    for key, n in ignored.items():
        uniform_top[LEAVES[leaf_of[key]][0]] += n
    assert chisquare([uniform_top[c] for c in range(3)]).pvalue < 1e-6  # 20 : 8 : 4 without the policy


def test_a_cap_below_the_largest_weight_flattens_the_smallest_clusters(balanced):
    uri, shards, leaf_of = balanced
    exact = Sampler(sampling(policy="balanced"), uri)
    capped = Sampler(sampling(policy="balanced", cap=32 / 24), uri)  # the weight of leaves 1 and 2
    assert capped.expected_acceptance() > exact.expected_acceptance()
    chances = {k: a for s in shards for k, a in capped.chances(s).items()}
    assert {leaf: chances[k] for k, leaf in leaf_of.items() if leaf != 0} == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}


def test_acceptance_is_the_same_whichever_slot_reads_a_sample(balanced):
    uri, shards, _ = balanced
    sampler = Sampler(sampling(policy="balanced"), uri)

    def kept(world: int, epoch: int) -> list[str]:
        keys = []
        for rank in range(world):
            for state in fresh_states(len(shards), rank=rank, world_size=world, loader_workers=1):
                keys += ShardStream(tuple(shards), state, seed=3, buffer_size=2, sampler=sampler).epoch_keys(epoch)
        return sorted(keys)

    for epoch in (0, 1):
        assert kept(1, epoch) == kept(3, epoch) == kept(8, epoch)  # 8 slots > 4 shards: split by sample
    assert kept(1, 0) != kept(1, 1)  # a new draw each epoch


# ---- exact resume --------------------------------------------------------------------------------


def loader(uri, shards, cfg, state=None, workers=2):
    spec = RankSpec(rank=0, world_size=1, batch_size=3, crops=CROPS, masking=MaskingConfig(), patch_stride=16, seed=1)
    data = DataConfig(loader_workers=workers, shuffle_buffer=4, sampling=cfg)
    return ResumableLoader(tuple(shards), data, spec, state=state, dataset_uri=uri)


@pytest.mark.parametrize("policy", ["weighted", "balanced"])
def test_a_stopped_loader_resumes_to_the_same_batches(balanced, policy):
    uri, shards, _ = balanced
    weight = WeightConfig(column="score", clip=(0.25, 4.0))
    cfg = sampling(policy=policy, weight=weight if policy == "weighted" else WeightConfig())
    reference = loader(uri, shards, cfg)
    expected = [next(reference) for _ in range(9)]
    reference.close()
    first = loader(uri, shards, cfg)
    assert [next(first).keys for _ in range(4)] == [b.keys for b in expected[:4]]
    state = json.loads(ResumableLoader.dumps(first.state_dict()))  # as a checkpoint keeps it
    acceptance = first.metrics()["data_acceptance"]
    first.close()
    resumed = loader(uri, shards, cfg, state=state)
    for got, want in zip((next(resumed) for _ in range(5)), expected[4:]):
        assert got.keys == want.keys
        assert torch.equal(got.global_crops, want.global_crops) and torch.equal(got.masks, want.masks)
    assert 0 < acceptance < 1 and resumed.metrics()["data_acceptance"] > 0
    resumed.close()


# ---- errors --------------------------------------------------------------------------------------


def one_line_error(fn, match: str) -> str:
    with pytest.raises(ValueError, match=match) as err:
        fn()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_an_unknown_policy_is_a_one_line_error_naming_the_setting():
    one_line_error(
        lambda: load_config(PretrainConfig, None, ["data.sampling.policy=clusters"]), r"data\.sampling\.policy"
    )


def test_inconsistent_sections_are_refused_before_any_work():
    one_line_error(lambda: sampling(policy="filter"), r"data\.sampling\.policy=filter needs data\.sampling\.filter")
    one_line_error(lambda: sampling(filter={"score": Bounds(min=1)}), r"data\.sampling\.filter is set but")
    one_line_error(lambda: sampling(policy="filter", filter={"score": Bounds()}), r"data\.sampling\.filter\.score")
    one_line_error(lambda: sampling(policy="weighted"), r"data\.sampling\.weight\.column")
    bad_clip = WeightConfig(column="score", clip=(2.0, 1.0))
    one_line_error(lambda: sampling(policy="weighted", weight=bad_clip), r"data\.sampling\.weight\.clip")


def test_unknown_or_unusable_columns_name_their_setting(scored):
    uri, shards = scored
    shard = shards[0]
    missing = Sampler(sampling(policy="filter", filter={"aesthetic_score": Bounds(min=5)}), uri)
    text = one_line_error(lambda: missing.check(shard), r"^data\.sampling\.filter\.aesthetic_score: ")
    assert "has no column 'aesthetic_score'" in text and "score" in text
    weighted = Sampler(sampling(policy="weighted", weight=WeightConfig(column="nsfw_score")), uri)
    one_line_error(lambda: weighted.check(shard), r"^data\.sampling\.weight\.column=nsfw_score: ")
    text_column = Sampler(sampling(policy="filter", filter={"label": Bounds(min=1)}), uri)
    one_line_error(lambda: text_column.check(shard), r"data\.sampling\.filter\.label: column 'label' is string")
    one_line_error(lambda: sampler_of(sampling(policy="filter", filter={"score": Bounds(min=1)}), None), "folder")


def test_balanced_needs_clusters_json_and_the_cluster_columns(scored, balanced, tmp_path):
    uri, shards = scored
    no_clusters = Sampler(sampling(policy="balanced"), uri)
    one_line_error(lambda: no_clusters.check(shards[0]), r"^data\.sampling\.policy=balanced: .* has no clusters\.json")
    # clusters.json present, but the sidecars without cluster columns
    root, unclustered = synthetic_version(tmp_path / "v", [4], lambda k: {"score": score_of(k)})
    (Path(root) / CLUSTERS_FILE).write_text(Path(balanced[0], CLUSTERS_FILE).read_text())
    columns = Sampler(sampling(policy="balanced"), root)
    text = one_line_error(lambda: columns.check(unclustered[0]), r"^data\.sampling\.policy=balanced: ")
    assert "has no column 'cluster_l1'" in text


def test_a_filter_nothing_passes_stops_the_stream_naming_the_policy(scored):
    uri, shards = scored
    cfg = sampling(policy="filter", filter={"score": Bounds(min=100)})
    one_line_error(lambda: draw(shards, Sampler(cfg, uri), n=1), r"data\.sampling\.policy=filter gives every")


def test_pretrain_refuses_a_balanced_run_on_a_version_without_clusters_before_it_starts(scored, tmp_path, capsys):
    from pipelines.pretrain import main

    uri, _ = scored
    code = main(
        [
            "--config",
            str(REPO / "configs" / "pretrain_tiny.yaml"),
            f"data.dataset={uri}",
            f"storage_path={tmp_path / 'runs'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "data.sampling.policy=balanced",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.splitlines()
    assert line.startswith("error: data.sampling.policy=balanced: ") and "clusters.json" in line
    assert not (tmp_path / "mlflow.db").exists()  # refused before the run was recorded


def test_the_versions_sidecars_are_read_by_projection_in_tar_order(scored):
    import pyarrow.parquet as pq

    from curation.output import CuratedOutput

    uri, shards = scored
    out = CuratedOutput.at(uri)
    assert [Path(p).name for p in out.shard_files()] == [Path(s).name for s in shards]
    table = out.read_sidecar(shards[1], ["key", "score"])
    assert table.column("key").to_pylist() == tar_keys(shards[1]) and table.num_columns == 2
    assert pq.read_schema(out.sidecar_files()[1]).names == ["key", "score", "label"]
