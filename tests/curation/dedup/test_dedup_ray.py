"""The distributed engine (``dedup.engine=ray``) gives exactly the in-process decisions, whatever the
partitioning."""

import pyarrow as pa
import pytest
from dedup_fixtures import distributed_decisions, embedding_table, planted_table, shuffled

from curation.dedup.near import DedupNearConfig, near_duplicate_decisions
from curation.dedup.semantic import DedupSemanticConfig, semantic_duplicate_decisions


def test_near_dup_ray_equals_local(ray_local, tmp_path):
    table = planted_table(2000, seed=20, max_flips=7)
    cfg = DedupNearConfig(max_distance=6)
    local = near_duplicate_decisions(table, cfg)
    assert local.num_rows > 300
    assert distributed_decisions(tmp_path / "a", shuffled(table, 1), cfg, partitions=5).equals(local)
    assert distributed_decisions(tmp_path / "b", shuffled(table, 2), cfg, 2, shuffle_partitions=None).equals(local)


def test_near_dup_ray_without_duplicates(ray_local, tmp_path):
    table = planted_table(300, seed=3, dup_fraction=0.0)
    assert distributed_decisions(tmp_path, table, DedupNearConfig(), partitions=2).num_rows == 0


@pytest.mark.parametrize("max_flat", [1024, 2], ids=["flat", "tree"])
def test_semantic_ray_equals_local(ray_local, tmp_path, max_flat):
    table = embedding_table(600, seed=4)
    cfg = DedupSemanticConfig(  # sample < rows
        enabled=True, target_cluster_size=100, kmeans_sample_size=200, max_flat_clusters=max_flat
    )
    local = semantic_duplicate_decisions(table, cfg)
    assert local.num_rows > 100
    assert distributed_decisions(tmp_path, shuffled(table, 5), cfg, partitions=4).equals(local)


def test_the_ray_search_plans_from_the_same_sample_as_one_process(ray_local):
    """``distributed.value_sample`` gathers exactly ``bands.sample_values`` of every hash value, also
    when the first mix bound holds too few distinct values (many rows share values), so the
    distributed search plans the same bands as the local one."""
    import numpy as np
    import ray.data

    from curation.dedup.bands import SAMPLE_SIZE, plan_bands, sample_values
    from curation.dedup.distributed import value_sample
    from curation.dedup.near import row_values

    cfg = DedupNearConfig()
    many = planted_table(30_000, seed=8)  # 60,000 values: the first bound keeps ~2/3 of them
    repeated = pa.concat_tables([planted_table(6000, seed=9)] * 5)  # 12,000 distinct of 60,000: ~8,000 kept
    few = pa.concat_tables([planted_table(2000, seed=10)] * 20)  # 4,000 distinct values: all of them
    for table in (many, repeated, few):
        _, values = row_values(table, cfg)
        sample = value_sample(ray.data.from_arrow(pa.table({"value": values})).repartition(4))
        np.testing.assert_array_equal(sample, sample_values(values))
        assert plan_bands(sample, cfg.max_distance) == plan_bands(values, cfg.max_distance)
    assert len(sample_values(row_values(repeated, cfg)[1])) == SAMPLE_SIZE
