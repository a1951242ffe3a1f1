"""The near-dup index a run saves, whichever engine decided: ``dedup.engine=ray`` writes the
partitioned index from Ray tasks, and an incremental run against it opens that index (not the
manifest fallback) and decides as against a local-engine output; a copied output keeps working
(the index names its own parts relative to its folder)."""

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dedup_fixtures import flip_bits
from test_dedup_distributed import all_decisions, staged_run

from curation import output, schema
from curation.config import DedupConfig
from curation.dedup.decisions import read_candidates
from curation.dedup.hashing import hex_to_uint64, uint64_to_hex
from curation.dedup.index_store import PartitionedNearIndex, is_relative
from curation.dedup.near import DedupNearConfig
from curation.dedup.steps import DedupContext, DedupExact, DedupExactConfig, DedupNear, run_global_dedup
from infra import storage

pytestmark = pytest.mark.slow
CFG = DedupNearConfig(max_distance=4)


def index_dir(out) -> str:
    return output.path(str(out), output.DEDUP_DIR, output.NEAR_INDEX_DIR)


def curated(out, engine: str):
    """A run's global dedup with ``engine`` and its index saved as the pipeline does, then a minimal
    finished output (manifest: every candidate, kept unless a decision dropped it)."""
    inp = staged_run(out, 800, 5, seed=3)
    ctx = DedupContext(engine=engine)
    run_global_dedup([DedupExact(DedupExactConfig()), DedupNear(CFG)], inp, ctx)
    ctx.save_index(*storage.resolve(index_dir(out)))
    candidates = pa.concat_tables([read_candidates(inp, i) for i in range(len(inp.pids))])
    dropped = all_decisions(inp).column("key")
    status = pc.if_else(pc.is_in(candidates.column("key"), value_set=dropped), schema.DROPPED, schema.KEPT)
    (out / output.MANIFEST).mkdir()
    pq.write_table(
        candidates.select(["key", "sha256"]).append_column("status", status), out / output.MANIFEST / "p.parquet"
    )
    (out / output.SUCCESS_FILE).write_text("{}")
    return candidates


def new_batch(candidates: pa.Table, seed: int) -> pa.Table:
    """300 new rows: near copies (0-3 bits flipped) of earlier candidates, and unrelated hashes."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, candidates.num_rows, 300)
    old = hex_to_uint64(candidates.column("phash"))[src]
    values = [
        flip_bits(int(v), rng.choice(64, int(rng.integers(0, 4)), replace=False))
        if i < 200
        else int(rng.integers(0, 2**63))
        for i, v in enumerate(old)
    ]
    hashes = uint64_to_hex(np.array(values, dtype=np.uint64))
    return pa.table(
        {
            "key": [f"new{i:04d}" for i in range(300)],
            "phash": hashes,
            "phash_mirror": hashes,
            "width": pa.array(np.full(300, 320, np.int32)),
            "height": pa.array(np.full(300, 480, np.int32)),
        }
    )


def decide_against(against, batch: pa.Table) -> tuple[object, pa.Table]:
    settings = DedupConfig(against=str(against))
    ctx = DedupContext.open(settings, CFG)
    return ctx.against_index, DedupNear(CFG, settings).decide(batch, ctx)


@pytest.fixture(scope="module")
def ray_output(ray_local, tmp_path_factory):
    """One ray-engine output (the slow part) for both tests; each test copies it before changing anything."""
    out = tmp_path_factory.mktemp("index_engines") / "ray"
    return out, curated(out, "ray")


def test_a_ray_engine_run_saves_the_partitioned_index_and_incremental_runs_use_it(ray_output, tmp_path):
    candidates = curated(tmp_path / "local", "local")
    shutil.copytree(ray_output[0], tmp_path / "ray")
    local, ray_ = (PartitionedNearIndex.open(*storage.resolve(index_dir(tmp_path / e))) for e in ("local", "ray"))
    assert [is_relative(p["uri"]) for p in ray_.header["parts"]] == [True]
    assert ray_.load().rows.equals(local.load().rows)  # every candidate, the same representatives
    assert ray_.header["parts"][0]["id"] == local.header["parts"][0]["id"]  # identity by content
    # the same band plan (the index's own, from the same postings count) and postings written
    assert (ray_.header["masks"], ray_.header["parts"][0]["postings"]) == (
        local.header["masks"],
        local.header["parts"][0]["postings"],
    )
    batch = new_batch(candidates, seed=1)
    index_l, want = decide_against(tmp_path / "local", batch)
    index_r, got = decide_against(tmp_path / "ray", batch)
    assert isinstance(index_r, PartitionedNearIndex) and isinstance(index_l, PartitionedNearIndex)
    assert want.num_rows > 100 and got.equals(want)


def test_a_copied_output_is_searched_where_it_now_lies(ray_output, tmp_path):
    shutil.copytree(ray_output[0], tmp_path / "v1")
    candidates = ray_output[1]
    batch = new_batch(candidates, seed=2)
    _, want = decide_against(tmp_path / "v1", batch)
    shutil.copytree(tmp_path / "v1", tmp_path / "moved" / "v1")
    shutil.rmtree(tmp_path / "v1")
    index, got = decide_against(tmp_path / "moved" / "v1", batch)
    assert isinstance(index, PartitionedNearIndex) and want.num_rows > 100 and got.equals(want)
    assert all(p.startswith(str(tmp_path / "moved")) for p in index.opened)
    # the next version: its own part relative, the earlier version's part by absolute path
    settings = DedupConfig(against=str(tmp_path / "moved" / "v1"))
    ctx = DedupContext.open(settings, CFG)
    DedupNear(CFG, settings).decide(batch, ctx)
    ctx.save_index(*storage.resolve(index_dir(tmp_path / "v2")))
    v2 = PartitionedNearIndex.open(*storage.resolve(index_dir(tmp_path / "v2")))
    first, own = (p["uri"] for p in v2.header["parts"])
    assert first == index_dir(tmp_path / "moved" / "v1") + "/" + index.header["parts"][0]["uri"]
    assert own == f"parts/{v2.header['parts'][1]['id']}"
