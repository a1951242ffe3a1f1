"""Ray Data variants give exactly the local decisions, whatever the partitioning."""

import pyarrow as pa
import pytest
from dedup_fixtures import embedding_table, planted_table, shuffled

from curation.dedup.near import NearDupConfig, near_duplicate_decisions, near_duplicate_decisions_ray
from curation.dedup.semantic import SemanticDupConfig, semantic_duplicate_decisions, semantic_duplicate_decisions_ray


def dataset(table: pa.Table, blocks: int):
    import ray.data

    return ray.data.from_arrow(table).repartition(blocks)


def test_near_dup_ray_equals_local(ray_local):
    table = planted_table(2000, seed=20, max_flips=7)
    cfg = NearDupConfig(max_distance=6, num_partitions=3)
    local = near_duplicate_decisions(table, cfg)
    assert local.num_rows > 300
    assert near_duplicate_decisions_ray(dataset(shuffled(table, 1), 5), cfg).equals(local)
    assert near_duplicate_decisions_ray(dataset(shuffled(table, 2), 2), NearDupConfig(max_distance=6)).equals(local)


def test_near_dup_ray_without_duplicates(ray_local):
    table = planted_table(300, seed=3, dup_fraction=0.0)
    assert near_duplicate_decisions_ray(dataset(table, 2), NearDupConfig(num_partitions=2)).num_rows == 0


@pytest.mark.parametrize("max_flat", [1024, 2], ids=["flat", "tree"])
def test_semantic_ray_equals_local(ray_local, max_flat):
    table = embedding_table(600, seed=4)
    cfg = SemanticDupConfig(  # sample < rows
        enabled=True, target_cluster_size=100, kmeans_sample_size=200, max_flat_clusters=max_flat
    )
    local = semantic_duplicate_decisions(table, cfg)
    assert local.num_rows > 100
    assert semantic_duplicate_decisions_ray(dataset(shuffled(table, 5), 4), cfg).equals(local)
