import numpy as np
import pyarrow as pa
import pytest
from dedup_fixtures import EMB, embedding_table, shuffled

from curation.dedup.components import component_labels, decisions_from_labels
from curation.dedup.semantic import SemanticDupConfig, semantic_duplicate_decisions


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
    out = semantic_duplicate_decisions(t, SemanticDupConfig(enabled=True, n_clusters=2)).to_pylist()
    assert out == [
        {"key": "a", "reason": "semantic_duplicate", "duplicate_of": "c", "duplicate_group": "semantic:c"},
        {"key": "b", "reason": "semantic_duplicate", "duplicate_of": "c", "duplicate_group": "semantic:c"},
    ]


def test_planted_duplicates_are_found_like_all_pairs_search_and_order_does_not_matter():
    table = embedding_table()
    cfg = SemanticDupConfig(enabled=True, target_cluster_size=100, kmeans_sample_size=300)
    out = semantic_duplicate_decisions(table, cfg)
    assert out.num_rows > 150
    assert out.equals(brute_force(table, cfg.threshold))  # well-separated duplicates never straddle clusters
    for seed in range(2):
        assert semantic_duplicate_decisions(shuffled(table, seed), cfg).equals(out)


def test_disabled_by_default_and_needs_embeddings():
    table = embedding_table(20)
    assert semantic_duplicate_decisions(table, SemanticDupConfig()).num_rows == 0
    with pytest.raises(ValueError, match="embedding step"):
        semantic_duplicate_decisions(table.drop_columns(["clip_embedding"]), SemanticDupConfig(enabled=True))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"threshold": 1.5}, "cosine"),
        ({"threshold": 0}, "cosine"),
        ({"n_clusters": 0}, "n_clusters"),
        ({"target_cluster_size": 1}, "target_cluster_size"),
        ({"use_faiss": "yes"}, "use_faiss"),
    ],
)
def test_invalid_settings_say_what_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SemanticDupConfig(**kwargs)


def test_faiss_always_without_faiss_says_how_to_install():
    try:
        import faiss  # noqa: F401

        pytest.skip("faiss is installed")
    except ImportError:
        pass
    with pytest.raises(ValueError, match="faiss-cpu"):
        semantic_duplicate_decisions(embedding_table(50), SemanticDupConfig(enabled=True, use_faiss="always"))


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
