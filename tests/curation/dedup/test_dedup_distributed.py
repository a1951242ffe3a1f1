"""The distributed global dedup (Ray Data shuffles, connected components by star rounds, decisions
written per partition) gives exactly the in-process decisions, which equal brute force
(``test_dedup_near``), on staged candidates spread over several partitions."""

import numpy as np
import pyarrow as pa
import pytest
from dedup_fixtures import planted_table

from curation import output, staging
from curation.dedup.components import component_labels
from curation.dedup.decisions import GlobalDedupInput, partition_decisions
from curation.dedup.near import DedupNearConfig
from curation.dedup.shuffle import connected_components
from curation.dedup.steps import DedupContext, DedupExact, DedupExactConfig, DedupNear, run_global_dedup
from infra import storage

pytestmark = pytest.mark.slow


def staged_run(root, n: int, partitions: int, seed: int) -> GlobalDedupInput:
    """Candidates staged as a run's scoring would leave them: some exact copies, some rows ended
    earlier (a reason) or undecodable, spread over ``partitions`` partitions."""
    rng = np.random.default_rng(seed)
    table = planted_table(n, seed=seed, max_flips=7)
    sha = [f"{int(x):064x}" for x in rng.integers(0, 2**62, n)]
    for i in rng.choice(n, n // 10, replace=False):
        sha[i] = sha[int(rng.integers(0, n))]  # exact copies (same bytes)
    reasons = [None if rng.random() > 0.05 else "too_small" for _ in range(n)]
    pids = [f"p{i:03d}" for i in range(partitions)]
    table = (
        table.append_column("sha256", pa.array(sha))
        .append_column("partition", pa.array([pids[i] for i in rng.integers(0, partitions, n)]))
        .append_column("decode_ok", pa.array(rng.random(n) > 0.03))
        .append_column("reason", pa.array(reasons, pa.string()))
    )
    fs, path = storage.resolve(str(root))
    staging.write_parts(fs, path, table)
    columns = ("key", "partition", "sha256", "width", "height", "phash", "phash_mirror")
    return GlobalDedupInput(str(root), tuple(pids), columns, shuffle_partitions=3)


def all_decisions(inp: GlobalDedupInput) -> pa.Table:
    fs, root = storage.resolve(inp.uri)
    return pa.concat_tables([partition_decisions(fs, root, pid) for pid in inp.pids]).sort_by("key")


def test_distributed_exact_and_near_equal_the_in_process_decisions(ray_local, tmp_path):
    near = DedupNearConfig(max_distance=6)
    steps = [DedupExact(DedupExactConfig()), DedupNear(near)]
    inp = staged_run(tmp_path / "out", 800, 5, seed=3)
    local = run_global_dedup(steps, inp, DedupContext(engine="local"))
    expected = all_decisions(inp)
    assert local["dedup.exact"] > 30 and local["dedup.near"] > 100
    distributed = run_global_dedup(steps, inp, DedupContext(engine="ray"))
    assert distributed == local
    assert all_decisions(inp).equals(expected)
    files = sorted(
        p.name for p in (tmp_path / "out" / output.DEDUP_DIR / output.DECISIONS_DIR / "dedup.near").iterdir()
    )
    assert files == [f"{pid}.parquet" for pid in inp.pids]  # one file per partition with drops


def test_star_rounds_give_the_components_of_a_chain_and_a_random_graph(ray_local):
    import ray.data

    rng = np.random.default_rng(1)
    n = 300
    a = np.r_[rng.integers(0, n, 150), np.arange(100, 130)]  # a 31-node path needs several rounds
    b = np.r_[rng.integers(0, n, 150), np.arange(101, 131)]
    ids = np.sort(rng.choice(2**40, n, replace=False)).astype(np.int64)
    ds = ray.data.from_arrow(pa.table({"a": ids[b], "b": ids[a]})).repartition(3)
    out = pa.concat_tables(list(connected_components(ds, 2).iter_batches(batch_format="pyarrow", batch_size=None)))
    got = dict(zip(out.column("node").to_pylist(), out.column("label").to_pylist()))
    reference = component_labels(n, a, b)
    linked = np.unique(np.r_[a[a != b], b[a != b]])
    assert {int(ids[i]): int(ids[reference[i]]) for i in linked} == got
