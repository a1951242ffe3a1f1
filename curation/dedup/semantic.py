"""Semantic dedup on CLIP image embeddings: k-means, then pairwise cosine within each cluster.

As in SemDeDup / NeMo Curator: unit embeddings, spherical k-means, every pair in a cluster with
cosine >= ``threshold`` an edge; groups are the components (inside one cluster: pairs split across
clusters are missed, the price of cost linear in the run). Past ``max_flat_clusters`` the centroids
are a two-level tree (``fit_tree``). k-means trains on the ``kmeans_sample_size`` rows of smallest
key hash, in key order, seeded, and every later step works on key-sorted rows: no input or
partition order matters, and both engines decide the same (for one k-means backend).
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math

import numpy as np
import pyarrow as pa

from curation.dedup import DECISION_SCHEMA
from curation.dedup.components import (
    META_COLUMNS,
    canonical_order,
    component_labels,
    decisions_from_labels,
    meta_columns,
)
from curation.schema import SEMANTIC_DUPLICATE  # noqa: E402  (one place for every reason)

GROUP_PREFIX = "semantic:"
_ROW_BLOCK = 2048  # rows of a cluster's similarity matrix computed at once
_SLACK = 1e-9  # candidates this far below the threshold are rechecked exactly (``similar_pairs``)


@dataclasses.dataclass(kw_only=True, frozen=True)
class DedupSemanticConfig:
    """Settings of semantic dedup (``dedup.semantic``), off by default (the CLIP embedding step may be).

    ``threshold``: the cosine at or above which two images are duplicates (NeMo Curator's 0.99; not
    calibrated on real CLIP embeddings here). ``n_clusters``: k (None: rows / ``target_cluster_size``);
    past ``max_flat_clusters`` k-means is a two-level tree. ``use_faiss``: "auto", "always" or "never"
    (numpy). ``block_rows``: with ``dedup.engine=ray``, the rows of a cluster's block (bounded memory).
    """

    enabled: bool = False
    embedding_column: str = "clip_embedding"
    threshold: float = 0.99
    n_clusters: int | None = None
    target_cluster_size: int = 1000
    kmeans_iterations: int = 20
    kmeans_sample_size: int = 100_000
    seed: int = 0
    use_faiss: str = "auto"
    block_rows: int = 4096
    max_flat_clusters: int = 1024

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"dedup.semantic.threshold is a cosine similarity in (0, 1], got {self.threshold}")
        if self.n_clusters is not None and self.n_clusters < 1:
            raise ValueError(f"dedup.semantic.n_clusters must be >= 1 or None, got {self.n_clusters}")
        if self.target_cluster_size < 2:
            raise ValueError(f"dedup.semantic.target_cluster_size must be >= 2, got {self.target_cluster_size}")
        for name in ("kmeans_iterations", "kmeans_sample_size", "max_flat_clusters", "block_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"dedup.semantic.{name} must be >= 1, got {getattr(self, name)}")
        if self.use_faiss not in ("auto", "always", "never"):
            raise ValueError(f"dedup.semantic.use_faiss must be 'auto', 'always' or 'never', got {self.use_faiss!r}")

    def clusters_for(self, n_rows: int) -> int:
        return max(1, min(n_rows, self.n_clusters or math.ceil(n_rows / self.target_cluster_size)))


def key_rank(keys: list[str]) -> np.ndarray:
    """A stable pseudo-random uint64 per key (BLAKE2b): picks the k-means sample."""
    return np.array(
        [int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8).digest(), "big") for k in keys], dtype=np.uint64
    )


def embeddings(table: pa.Table, column: str) -> np.ndarray:
    """The embedding column as a float64 matrix with unit rows."""
    col = table.column(column).combine_chunks()
    if col.null_count:
        raise ValueError(f"semantic dedup candidates need a non-null {column!r} on every row")
    flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
    x = flat.reshape(len(col), -1) if len(col) else np.zeros((0, 1))
    if len(col) and len(flat) != len(col) * x.shape[1]:
        raise ValueError(f"all {column!r} embeddings must have the same length")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _faiss_or_none(use_faiss: str):
    if use_faiss == "never":
        return None
    try:
        import faiss
    except ImportError:
        if use_faiss == "always":
            raise ValueError("dedup.semantic.use_faiss='always' needs faiss: pip install faiss-cpu") from None
        return None
    return faiss


def fit_centroids(sample: np.ndarray, k: int, cfg: DedupSemanticConfig, seed: int | None = None) -> np.ndarray:
    """Spherical k-means centroids (unit rows) of a key-sorted sample, seeded by ``seed``
    (default ``cfg.seed``)."""
    k, seed = min(k, len(sample)), cfg.seed if seed is None else seed
    faiss = _faiss_or_none(cfg.use_faiss)
    if faiss is not None:
        km = faiss.Kmeans(sample.shape[1], k, niter=cfg.kmeans_iterations, seed=seed, spherical=True, verbose=False)
        km.train(np.ascontiguousarray(sample, dtype=np.float32))
        centroids = km.centroids.astype(np.float64)
    else:
        rng = np.random.default_rng(seed)
        centroids = sample[np.sort(rng.choice(len(sample), size=k, replace=False))].copy()
        for _ in range(cfg.kmeans_iterations):
            filled, sums = cluster_sums(sample, assign_clusters(sample, centroids))
            centroids[filled] = sums  # an empty cluster keeps its centroid
            centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    return centroids


def cluster_sums(x: np.ndarray, assign: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(clusters with rows, the sum of each one's rows): rows sorted by cluster, then summed
    run by run (``np.add.reduceat``; ``np.add.at`` was half of a fit's time)."""
    order = np.argsort(assign, kind="stable")
    ordered = assign[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    return ordered[starts], np.add.reduceat(x[order], starts, axis=0)


SCORE_BLOCK = 1 << 23  # scores (row x centroid dot products) held at once: 64 MiB of float64


def assign_clusters(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each row's centroid of largest dot product, ``SCORE_BLOCK // k`` rows at a time (bounded memory)."""
    rows = max(1, SCORE_BLOCK // max(1, len(centroids)))
    out = np.empty(len(x), np.int32)
    for start in range(0, len(x), rows):
        out[start : start + rows] = np.argmax(x[start : start + rows] @ centroids.T, axis=1)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Centroids:
    """k-means centroids ``fine`` (a cluster id is a row of it), flat or a two-level tree: those under
    coarse centroid c at ``fine[offsets[c]:offsets[c + 1]]``, a row assigned under its best coarse one."""

    fine: np.ndarray
    coarse: np.ndarray | None = None
    offsets: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.fine)

    def assign(self, x: np.ndarray) -> np.ndarray:
        """Each unit row's cluster id (int32)."""
        if self.coarse is None:
            return assign_clusters(x, self.fine)
        top = assign_clusters(x, self.coarse)
        out = np.empty(len(x), np.int32)
        order = np.argsort(top, kind="stable")
        for rows in np.split(order, np.flatnonzero(np.diff(top[order])) + 1):
            if len(rows):
                lo, hi = self.offsets[top[rows[0]]], self.offsets[top[rows[0]] + 1]
                out[rows] = lo + assign_clusters(x[rows], self.fine[lo:hi])
        return out


def split_clusters(rows: np.ndarray, k: int) -> np.ndarray:
    """Fine clusters per coarse cluster of ``rows`` sample rows each, summing to k: one each, then one at
    a time to the most rows per fine cluster (D'Hondt, ties to the lower index), at most its rows."""
    per = np.ones(len(rows), np.int64)
    heap = [(-float(r), c) for c, r in enumerate(rows) if r > 1]
    heapq.heapify(heap)
    for _ in range(k - len(rows)):
        _, c = heapq.heappop(heap)
        per[c] += 1
        if per[c] < rows[c]:
            heapq.heappush(heap, (-rows[c] / per[c], c))
    return per


def fit_tree(sample: np.ndarray, k: int, cfg: DedupSemanticConfig) -> Centroids:
    """k centroids of a key-sorted sample: flat up to ``cfg.max_flat_clusters``, else ceil(sqrt(k))
    coarse centroids (those unused dropped), each coarse cluster's rows fitted with its share of k
    (``split_clusters``), seeded ``cfg.seed`` + 1 + its index: about 2 sqrt(k) products per row."""
    k = min(k, len(sample))
    if k <= cfg.max_flat_clusters:
        return Centroids(fit_centroids(sample, k, cfg))
    coarse = fit_centroids(sample, math.isqrt(k - 1) + 1, cfg)
    top = assign_clusters(sample, coarse)
    used = np.flatnonzero(np.bincount(top, minlength=len(coarse)))
    coarse, top = coarse[used], np.searchsorted(used, top)
    per = split_clusters(np.bincount(top, minlength=len(coarse)), k)
    fine = [fit_centroids(sample[top == c], int(per[c]), cfg, seed=cfg.seed + 1 + c) for c in range(len(coarse))]
    return Centroids(np.concatenate(fine), coarse, np.r_[0, np.cumsum(per)])


def similar_pairs(
    xa: np.ndarray, xb: np.ndarray, threshold: float, *, upper: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, cosine) of every pair of unit rows ``xa[i]``, ``xb[j]`` with cosine >= ``threshold``
    (``upper``: ``xa`` is ``xb``, i < j). The product finds candidates within ``_SLACK``; each is
    rechecked by its own row product, so no blocking of the rows (or BLAS rounding) changes a pair."""
    found_i, found_j = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for start in range(0, len(xa), _ROW_BLOCK):
        sim = xa[start : start + _ROW_BLOCK] @ xb.T
        i, j = np.nonzero(sim >= threshold - _SLACK)
        i = i + start
        if upper:
            i, j = i[j > i], j[j > i]
        found_i.append(i.astype(np.int64))
        found_j.append(j.astype(np.int64))
    i, j = np.concatenate(found_i), np.concatenate(found_j)
    score = np.sum(xa[i] * xb[j], axis=1)
    close = score >= threshold
    return i[close], j[close], score[close]


def sample_centroids(sample: pa.Table, n_rows: int, cfg: DedupSemanticConfig) -> Centroids:
    """Centroids from the rows of ``sample`` with the smallest key ranks (then in key order)."""
    ranks = key_rank(sample.column("key").to_pylist())
    chosen = np.sort(np.argsort(ranks, kind="stable")[: cfg.kmeans_sample_size])
    sample = canonical_order(sample.take(chosen))
    return fit_tree(embeddings(sample, cfg.embedding_column), cfg.clusters_for(n_rows), cfg)


def semantic_duplicate_decisions(candidates: pa.Table, cfg: DedupSemanticConfig) -> pa.Table:
    """Decision rows (reason ``semantic_duplicate``, sorted by key) in one process, whatever the row
    order; ``candidates``: key, the rule's columns and ``cfg.embedding_column`` (any fixed length).
    A cluster's groups are the components of its pairs with cosine >= threshold."""
    if not cfg.enabled or candidates.num_rows == 0:
        return DECISION_SCHEMA.empty_table()
    names = candidates.column_names
    missing = [c for c in (*META_COLUMNS, cfg.embedding_column) if c not in names]
    if missing:
        hint = " (the CLIP embedding step must run first)" if cfg.embedding_column in missing else ""
        raise ValueError(f"semantic dedup candidates lack columns {missing}{hint}")
    table = canonical_order(candidates.select([*meta_columns(names), cfg.embedding_column]))
    centroids = sample_centroids(table.select(["key", cfg.embedding_column]), table.num_rows, cfg)
    x = embeddings(table, cfg.embedding_column)
    clusters = centroids.assign(x)
    order = np.argsort(clusters, kind="stable")  # stable: a cluster's rows stay in key order
    parts = [DECISION_SCHEMA.empty_table()]
    for idx in np.split(order, np.flatnonzero(np.diff(clusters[order])) + 1):
        a, b, _ = similar_pairs(x[idx], x[idx], cfg.threshold, upper=True)
        labels = component_labels(len(idx), a, b)
        parts.append(decisions_from_labels(table.take(idx), labels, SEMANTIC_DUPLICATE, GROUP_PREFIX))
    return pa.concat_tables(parts).sort_by("key")
