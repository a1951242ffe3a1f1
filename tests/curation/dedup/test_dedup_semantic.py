import numpy as np
import pyarrow as pa
import pytest
from dedup_fixtures import EMB, embedding_table, shuffled

from curation.dedup.components import component_labels, decisions_from_labels
from curation.dedup.semantic import DedupSemanticConfig, semantic_duplicate_decisions


def brute_force(table: pa.Table, threshold: float) -> pa.Table:
    table = table.sort_by("key")
    x = np.stack(table.column("clip_embedding").to_numpy(zero_copy_only=False)).astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    i, j = np.nonzero(np.triu(x @ x.T >= threshold, 1))
    return decisions_from_labels(table, component_labels(table.num_rows, i, j), "semantic_duplicate", "semantic:")


def test_exact_outcome_on_a_tiny_set():
    t = pa.table(
        {
            "key": ["a", "b", "c", "d"],
            "width": pa.array([10, 20, 20, 5], pa.int32()),
            "height": pa.array([10, 10, 10, 5], pa.int32()),
            "input_bytes": pa.array([100, 300, 900, 50], pa.int64()),  # same pixels: c has more bytes per pixel
            "clip_embedding": pa.array([[1, 0, 0], [0.999, 0.03, 0], [2, 0.02, 0.01], [0, 1, 0]], EMB),
        }
    )
    out = semantic_duplicate_decisions(t, DedupSemanticConfig(enabled=True, n_clusters=2)).to_pylist()
    assert out == [
        {"key": "a", "reason": "semantic_duplicate", "duplicate_of": "c", "duplicate_group": "semantic:c"},
        {"key": "b", "reason": "semantic_duplicate", "duplicate_of": "c", "duplicate_group": "semantic:c"},
    ]


@pytest.mark.parametrize("max_flat", [1024, 2], ids=["flat", "tree"])
def test_planted_duplicates_are_found_like_all_pairs_search_and_order_does_not_matter(max_flat):
    table = embedding_table()
    cfg = DedupSemanticConfig(enabled=True, target_cluster_size=100, kmeans_sample_size=300, max_flat_clusters=max_flat)
    out = semantic_duplicate_decisions(table, cfg)
    assert out.num_rows > 150
    assert out.equals(brute_force(table, cfg.threshold))  # well-separated duplicates never straddle clusters
    for seed in range(2):
        assert semantic_duplicate_decisions(shuffled(table, seed), cfg).equals(out)


def test_disabled_by_default_and_needs_embeddings():
    table = embedding_table(20)
    assert semantic_duplicate_decisions(table, DedupSemanticConfig()).num_rows == 0
    with pytest.raises(ValueError, match="embedding step"):
        semantic_duplicate_decisions(table.drop_columns(["clip_embedding"]), DedupSemanticConfig(enabled=True))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"threshold": 1.5}, "cosine"),
        ({"threshold": 0}, "cosine"),
        ({"n_clusters": 0}, "n_clusters"),
        ({"target_cluster_size": 1}, "target_cluster_size"),
        ({"use_faiss": "yes"}, "use_faiss"),
        ({"max_flat_clusters": 0}, "max_flat_clusters"),
    ],
)
def test_invalid_settings_say_what_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DedupSemanticConfig(**kwargs)


def test_faiss_always_without_faiss_says_how_to_install():
    try:
        import faiss  # noqa: F401

        pytest.skip("faiss is installed")
    except ImportError:
        pass
    with pytest.raises(ValueError, match="faiss-cpu"):
        semantic_duplicate_decisions(embedding_table(50), DedupSemanticConfig(enabled=True, use_faiss="always"))


def test_cluster_assignment_scores_in_bounded_blocks(monkeypatch):
    """The same clusters as one ``rows x k`` argmax, with many blocks forced, and a numpy peak far
    below that matrix (20,000 rows x 2,000 centroids: 320 MB whole, 64 MiB a block)."""
    import tracemalloc

    from curation.dedup import semantic

    rng = np.random.default_rng(0)
    x, c = rng.normal(size=(20_000, 8)), rng.normal(size=(2_000, 8))
    whole = np.argmax(x @ c.T, axis=1)
    tracemalloc.start()
    got = semantic.assign_clusters(x, c)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(got, whole) and peak < 100 * 2**20, peak
    monkeypatch.setattr(semantic, "SCORE_BLOCK", 7_000)  # 3 rows a block, a ragged last block
    assert np.array_equal(semantic.assign_clusters(x[:1_000], c), whole[:1_000])


def test_split_clusters_shares_k_by_sample_rows():
    from curation.dedup.semantic import split_clusters

    # one each, then 6/1 > 3/1 -> first; 6/2 = 3/1, a tie -> the lower index
    assert split_clusters(np.array([6, 3, 1]), 5).tolist() == [3, 1, 1]
    assert split_clusters(np.array([2, 2]), 4).tolist() == [2, 2]  # never more than a cluster's rows
    rows = np.random.default_rng(0).integers(1, 50, 40)
    per = split_clusters(rows, 700)
    assert per.sum() == 700 and (per >= 1).all() and (per <= rows).all()


def test_two_level_tree_assigns_each_row_its_best_fine_centroid_under_its_best_coarse_one():
    from curation.dedup.semantic import fit_tree

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3_000, 16))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cfg = DedupSemanticConfig(enabled=True, max_flat_clusters=10, kmeans_iterations=5)
    tree = fit_tree(x, 50, cfg)
    assert len(tree) == 50 and tree.coarse is not None and len(tree.coarse) <= 8  # ceil(sqrt(50))
    assert tree.offsets[0] == 0 and tree.offsets[-1] == 50 and (np.diff(tree.offsets) >= 1).all()
    got = tree.assign(x)
    top = np.argmax(x @ tree.coarse.T, axis=1)
    lo, hi = tree.offsets[top], tree.offsets[top + 1]
    scores = x @ tree.fine.T
    scores[(np.arange(50) < lo[:, None]) | (np.arange(50) >= hi[:, None])] = -np.inf
    assert np.array_equal(got, np.argmax(scores, axis=1))
    assert len(np.unique(got)) > 40  # the fine centroids are used, not collapsed
    assert np.array_equal(tree.assign(x[::7]), got[::7])  # a row's cluster does not depend on its batch
    assert fit_tree(x, 10, cfg).coarse is None  # at most max_flat_clusters: one level


def test_cluster_sums_equal_a_scatter_add_and_skip_empty_clusters():
    from curation.dedup.semantic import cluster_sums

    rng = np.random.default_rng(1)
    x, assign = rng.normal(size=(1_000, 5)), rng.integers(0, 50, 1_000)
    assign[assign == 7] = 8
    filled, sums = cluster_sums(x, assign)
    want = np.zeros((50, 5))
    np.add.at(want, assign, x)
    assert filled.tolist() == sorted(set(range(50)) - {7}) and np.allclose(sums, want[filled])
