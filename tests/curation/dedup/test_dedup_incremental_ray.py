"""Incremental near dedup in Ray Data (``curation.dedup.distributed_incremental``): a staged batch
against an earlier version's partitioned index makes the driver's decisions row for row and saves
the same extended index (the earlier part listed first, the batch one new part)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from dedup_fixtures import flip_bits
from test_dedup_index_engines import CFG, curated, index_dir, new_batch

from curation import staging
from curation.config import DedupConfig
from curation.dedup.decisions import GlobalDedupInput, partition_decisions
from curation.dedup.distributed_incremental import IndexLayout, _key_bucket, _representatives
from curation.dedup.hashing import hex_to_uint64, uint64_to_hex
from curation.dedup.index_store import PartitionedNearIndex
from curation.dedup.steps import DedupContext, DedupNear, run_global_dedup
from infra import storage

PIDS = ("q000", "q001", "q002")


def batch_of(candidates: pa.Table) -> pa.Table:
    """``new_batch``'s 300 rows (near copies of earlier candidates, unrelated rows), 30 of the
    unrelated ones given near copies of each other, spread over three partitions."""
    batch = new_batch(candidates, seed=1)
    rng = np.random.default_rng(2)
    values = hex_to_uint64(batch.column("phash"))
    for i in range(200, 230):
        values[i + 40] = flip_bits(int(values[i]), rng.choice(64, 2, replace=False))
    hashes = pa.array(uint64_to_hex(values))
    n = batch.num_rows
    return (
        batch.set_column(1, "phash", hashes)
        .set_column(2, "phash_mirror", hashes)
        .append_column("partition", pa.array([PIDS[i] for i in rng.integers(0, 3, n)]))
        .append_column("decode_ok", pa.array(np.ones(n, bool)))
        .append_column("reason", pa.nulls(n, pa.string()))
    )


def run(out, batch: pa.Table, against, engine: str):
    """(rows dropped, decisions, the saved index) of the batch staged at ``out``."""
    fs, root = storage.resolve(str(out))
    staging.write_parts(fs, root, batch)
    columns = ("key", "partition", "width", "height", "phash", "phash_mirror")
    inp = GlobalDedupInput(str(out), PIDS, columns, shuffle_partitions=3)
    settings = DedupConfig(against=str(against), engine=engine)
    ctx = DedupContext.open(settings, CFG)
    assert isinstance(ctx.against_index, PartitionedNearIndex)
    dropped = run_global_dedup([DedupNear(CFG, settings)], inp, ctx)
    ctx.save_index(*storage.resolve(index_dir(out)))
    decided = pa.concat_tables([partition_decisions(fs, root, p) for p in PIDS]).sort_by("key")
    return dropped, decided, PartitionedNearIndex.open(*storage.resolve(index_dir(out)))


@pytest.mark.slow
def test_ray_incremental_near_dedup_equals_the_driver_search(ray_local, tmp_path):
    candidates = curated(tmp_path / "v1", "local")
    batch = batch_of(candidates)
    dropped, want, index = run(tmp_path / "local", batch, tmp_path / "v1", "local")
    got_dropped, got, ray_index = run(tmp_path / "ray", batch, tmp_path / "v1", "ray")
    assert got_dropped == dropped and got.equals(want)
    reps = want.column("duplicate_of").to_pylist()
    assert sum(r.startswith("k") for r in reps) > 100 and sum(r.startswith("new") for r in reps) >= 20
    assert ray_index.header == index.header  # the earlier part, then the batch's, same plan and buckets
    assert ray_index.load().rows.equals(index.load().rows)


def test_a_new_key_the_earlier_version_holds_is_refused(tmp_path):
    candidates = curated(tmp_path / "v1", "local")
    layout = IndexLayout.of(PartitionedNearIndex.open(*storage.resolve(index_dir(tmp_path / "v1"))))
    key = candidates.column("key")[0].as_py()
    group = _key_bucket(pa.table({"row_id": [0, 1], "key": [key, "fresh"], "new": [True, True]}), "key", 8)
    assert layout.num_buckets == 8
    with pytest.raises(ValueError, match="reuse keys of the existing version"):
        _representatives(group, layout)
