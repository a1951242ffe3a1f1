"""Incremental dedup against an earlier version read part by part (``curation.dedup.earlier``):
exact and semantic decisions equal the whole-version reference (the earlier version loaded on
the driver), with the local engine and (exact) in Ray Data; the distributed semantic search
against an earlier version is held to the in-process one in ``test_dedup_semantic_ray``."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_dedup_distributed import all_decisions, staged_run

from curation import output, schema
from curation.dedup.decisions import read_candidates
from curation.dedup.earlier import EarlierVersion, semantic_against
from curation.dedup.exact import exact_against, exact_duplicate_decisions
from curation.dedup.semantic import DedupSemanticConfig, semantic_duplicate_decisions
from curation.dedup.steps import DedupContext, DedupExact, DedupExactConfig, DedupSemantic, run_global_dedup, without


def earlier_output(root, table: pa.Table, parts: int, seed: int) -> EarlierVersion:
    """A finished output whose manifest (``table`` plus a status, some rows dropped) is split
    into ``parts`` part files."""
    rng = np.random.default_rng(seed)
    status = np.where(rng.random(table.num_rows) < 0.3, schema.DROPPED, schema.KEPT)
    table = table.append_column("status", pa.array(status.tolist(), pa.string()))
    (root / output.MANIFEST).mkdir(parents=True)
    which = rng.integers(0, parts, table.num_rows)
    for i in range(parts):
        pq.write_table(table.filter(pa.array(which == i)), root / output.MANIFEST / f"e{i:03d}.parquet")
    (root / output.SUCCESS_FILE).write_text("{}")
    return EarlierVersion.open(str(root))


def whole_kept(earlier: EarlierVersion, columns: list[str]) -> pa.Table:
    """The reference's view: the earlier version's kept rows, loaded whole."""
    manifest = earlier.output.read_manifest([*columns, "status"])
    return manifest.filter(pc.equal(manifest.column("status"), schema.KEPT)).select(columns)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_exact_against_an_earlier_version_equals_the_whole_version_reference(ray_local, tmp_path, engine):
    inp = staged_run(tmp_path / "out", 600, 4, seed=11)
    new = pa.concat_tables([read_candidates(inp, i) for i in range(len(inp.pids))])
    rng = np.random.default_rng(11)
    shas = new.column("sha256").to_pylist()
    old_sha = [
        shas[int(i)] if rng.random() < 0.4 else f"{int(x):064x}"
        for i, x in zip(rng.integers(0, len(shas), 500), rng.integers(0, 2**62, 500))
    ]
    earlier = earlier_output(
        tmp_path / "v1", pa.table({"key": [f"old{i:04d}" for i in range(500)], "sha256": old_sha}), parts=5, seed=11
    )
    dropped = run_global_dedup([DedupExact(DedupExactConfig())], inp, DedupContext(engine=engine, earlier=earlier))
    got = all_decisions(inp)
    against = exact_against(new, whole_kept(earlier, ["key", "sha256"]))
    within = exact_duplicate_decisions(without(new.select(["key", "sha256", "width", "height"]), against))
    want = pa.concat_tables([against, within]).sort_by("key")
    assert against.num_rows > 40 and within.num_rows > 10
    assert dropped["dedup.exact"] == want.num_rows and got.equals(want)
    assert set(against.column("duplicate_of").to_pylist()) <= set(
        whole_kept(earlier, ["key"]).column("key").to_pylist()
    )


def embedding_table(keys: list[str], x: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "key": keys,
            "width": np.full(len(keys), 640, np.int32),
            "height": np.full(len(keys), 480, np.int32),
            "clip_embedding": pa.array(list(x.astype(np.float32)), pa.list_(pa.float32())),
        }
    )


def brute_force_against(new: pa.Table, kept: pa.Table, threshold: float) -> pa.Table:
    """Per new row: the earlier kept row of highest cosine (then smallest key) if >= threshold, pair by pair."""
    from curation.dedup.semantic import embeddings

    xn, xo = embeddings(new, "clip_embedding"), embeddings(kept, "clip_embedding")
    keys = kept.column("key").to_pylist()
    rows = []
    for i, k in enumerate(new.column("key").to_pylist()):
        sims = [float(np.dot(xn[i], xo[j])) for j in range(len(keys))]
        best = min(
            (j for j in range(len(keys)) if sims[j] >= threshold), key=lambda j: (-sims[j], keys[j]), default=None
        )
        if best is not None:
            rows.append(
                {
                    "key": k,
                    "reason": schema.SEMANTIC_DUPLICATE,
                    "duplicate_of": keys[best],
                    "duplicate_group": f"semantic:{keys[best]}",
                }
            )
    from curation.dedup import DECISION_SCHEMA

    return pa.Table.from_pylist(rows, schema=DECISION_SCHEMA)


def test_semantic_against_an_earlier_version_equals_brute_force(tmp_path):
    rng = np.random.default_rng(5)
    old = rng.normal(size=(300, 16))
    old[150:160] = old[140:150] + rng.normal(scale=1e-3, size=(10, 16))  # near ties among earlier rows
    earlier = earlier_output(tmp_path / "v1", embedding_table([f"old{i:04d}" for i in range(300)], old), 4, seed=5)
    copies = rng.integers(0, 300, 60)
    new = rng.normal(size=(200, 16))
    new[:60] = old[copies] + rng.normal(scale=0.02, size=(60, 16))  # copies of earlier rows (kept or dropped)
    new[60:80] = new[80:100] + rng.normal(scale=0.02, size=(20, 16))  # copies within the batch
    new_table = embedding_table([f"new{i:04d}" for i in range(200)], new)
    cfg = DedupSemanticConfig(enabled=True, threshold=0.98, n_clusters=2, use_faiss="never")
    against = semantic_against(new_table, earlier, cfg)
    want = brute_force_against(new_table, whole_kept(earlier, ["key", "clip_embedding"]), cfg.threshold)
    assert 25 < want.num_rows < 60 and against.equals(want)
    got = DedupSemantic(cfg).decide(new_table, DedupContext(earlier=earlier))
    within = semantic_duplicate_decisions(without(new_table, want), cfg)
    assert within.num_rows >= 15 and got.equals(pa.concat_tables([want, within]).sort_by("key"))


def test_an_earlier_version_without_embeddings_gives_no_semantic_decisions(tmp_path):
    earlier = earlier_output(tmp_path / "v1", pa.table({"key": ["a"], "sha256": ["0" * 64]}), 1, seed=0)
    new = embedding_table(["b"], np.ones((1, 4)))
    assert semantic_against(new, earlier, DedupSemanticConfig(enabled=True)).num_rows == 0


def test_against_an_unfinished_output_is_refused(tmp_path):
    (tmp_path / "v1").mkdir()
    with pytest.raises(ValueError, match="not a finished curation output"):
        EarlierVersion.open(str(tmp_path / "v1"))
