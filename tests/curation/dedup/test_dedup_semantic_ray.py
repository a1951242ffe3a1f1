"""Semantic dedup in Ray Data (``curation.dedup.distributed_semantic``) makes the in-process step's
decisions, row for row: an evaluation set's semantic copies first, then the earlier version's kept
embeddings (``dedup.against``), then the run itself, with clusters split into blocks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from dedup_fixtures import EMB, embedding_table
from test_dedup_against import earlier_output

from curation import staging
from curation.dedup.decisions import GlobalDedupInput, partition_decisions
from curation.dedup.eval_overlap import EVAL_OVERLAP, EvalSet
from curation.dedup.semantic import DedupSemanticConfig
from curation.dedup.steps import DedupContext, DedupSemantic, run_global_dedup
from infra import storage

COLUMNS = ("key", "partition", "width", "height", "clip_embedding")


def staged(root, n: int = 800, partitions: int = 4, seed: int = 0) -> GlobalDedupInput:
    """``n`` embedding rows (30% noisy copies) over ``partitions`` partitions, some ended earlier."""
    rng = np.random.default_rng(seed)
    table = embedding_table(n, dim=32, seed=seed)
    pids = [f"p{i:03d}" for i in range(partitions)]
    table = (
        table.append_column("partition", pa.array([pids[i] for i in rng.integers(0, partitions, n)]))
        .append_column("decode_ok", pa.array(rng.random(n) > 0.02))
        .append_column(
            "reason", pa.array([None if rng.random() > 0.05 else "too_small" for _ in range(n)], pa.string())
        )
    )
    staging.write_parts(*storage.resolve(str(root)), table)
    return GlobalDedupInput(str(root), tuple(pids), COLUMNS, shuffle_partitions=3)


def copies(x: np.ndarray, rows: np.ndarray, rng, scale: float) -> np.ndarray:
    return x[rows] + rng.normal(scale=scale, size=(len(rows), x.shape[1]))


def earlier_and_eval(tmp_path, inp: GlobalDedupInput):
    """An earlier version (copies of 100 rows among 300, near ties among its own) and an evaluation
    set (copies of 12 rows among 40), both as embeddings."""
    rng = np.random.default_rng(1)
    new = pa.concat_tables([staging.read_partition_rows(*storage.resolve(inp.uri), p) for p in inp.pids])
    x = np.stack(new.column("clip_embedding").to_numpy(zero_copy_only=False)).astype(np.float64)
    old = rng.normal(size=(300, x.shape[1]))
    old[:100] = copies(x, rng.integers(0, len(x), 100), rng, 0.003)
    old[100:110] = copies(old, np.arange(10), rng, 1e-4)
    table = pa.table(
        {
            "key": [f"old{i:04d}" for i in range(300)],
            "width": np.full(300, 640, np.int32),
            "height": np.full(300, 480, np.int32),
            "clip_embedding": pa.array(list(old.astype(np.float32)), EMB),
        }
    )
    ev = rng.normal(size=(40, x.shape[1]))
    ev[:12] = copies(x, rng.integers(0, len(x), 12), rng, 0.003)
    ev_rows = pa.table({"source": [f"val/{i:03d}.jpg" for i in range(40)], "clip_embedding": pa.array(list(ev), EMB)})
    return earlier_output(tmp_path / "v1", table, 4, seed=1), EvalSet(ev_rows)


def decisions(inp: GlobalDedupInput) -> pa.Table:
    fs, root = storage.resolve(inp.out)
    return pa.concat_tables([partition_decisions(fs, root, p) for p in inp.pids]).sort_by("key")


@pytest.mark.slow
def test_ray_semantic_dedup_equals_the_in_process_step(ray_local, tmp_path):
    inp = staged(tmp_path / "run")
    earlier, ev = earlier_and_eval(tmp_path, inp)
    # ~8 clusters of ~100 rows (a two-level tree: 3 coarse), each dealt into 3 blocks: units of two
    # blocks, never a whole cluster
    cfg = DedupSemanticConfig(
        enabled=True, target_cluster_size=100, kmeans_sample_size=300, block_rows=40, max_flat_clusters=3
    )
    step = DedupSemantic(cfg)
    local = run_global_dedup([step], inp, DedupContext(engine="local", earlier=earlier, eval_set=ev))
    want = decisions(inp)
    got = run_global_dedup([step], inp, DedupContext(engine="ray", earlier=earlier, eval_set=ev))
    assert got == local and decisions(inp).equals(want)
    reps = want.column("duplicate_of").to_pylist()
    kinds = [r["reason"] for r in want.to_pylist()]
    assert kinds.count(EVAL_OVERLAP) >= 10  # the evaluation set's copies
    assert sum(r.startswith("old") for r in reps) > 60  # the earlier version's
    assert sum(r.startswith("s") for r in reps) > 80  # the run's own families
