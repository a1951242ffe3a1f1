"""The passes' Ray Data plumbing: the model pools' input blocks are sized on the pass's own
dataset, never on the process-wide DataContext."""

from __future__ import annotations

import pyarrow as pa

from curation.partitions import Partition, partition_datasource
from curation.passes import POOL_INPUT_BYTES, pool_sized_blocks

TABLES_PER_PARTITION = 3 * POOL_INPUT_BYTES // 2**20  # of 1 MiB each: three pool blocks' worth


def _blocks(pool_sized: bool) -> int:
    import ray.data

    parts = [Partition(id="000000-a", kind="staged", uris=("x",))]
    n = TABLES_PER_PARTITION
    # a lambda, pickled by value: Ray's workers cannot import this test module by name
    tables = lambda p: (pa.table({"image": [bytes(2**20)]}) for _ in range(n))  # noqa: E731
    ds = ray.data.read_datasource(partition_datasource(parts, tables, schema=None), override_num_blocks=1)
    if pool_sized:
        pool_sized_blocks(ds)
    ds = ds.map_batches(lambda b: b, batch_format="pyarrow", zero_copy_batch=True, batch_size=None)
    return ds.materialize().num_blocks()


def test_pool_sized_blocks_split_a_partition_and_leave_the_process_context_alone(ray_local):
    import ray.data

    context = ray.data.DataContext.get_current()
    default = context.target_max_block_size
    assert default > TABLES_PER_PARTITION * 2**20  # one partition is one block unless told otherwise
    assert _blocks(pool_sized=False) == 1
    assert _blocks(pool_sized=True) >= 3  # a block of at most POOL_INPUT_BYTES per actor's take
    assert context.target_max_block_size == default and _blocks(pool_sized=False) == 1
