"""Semantic dedup on CLIP image embeddings: k-means, then pairwise cosine within each cluster.

As in SemDeDup / NeMo Curator: embeddings are L2-normalised and clustered with spherical
k-means; inside each cluster every pair with cosine similarity >= ``threshold`` is a
duplicate edge. Groups are the connected components of those edges (so always inside one
cluster) and keep one representative by the documented rule
(``curation.dedup.representative_sort_key``); NeMo's "keep the hardest/easiest by centroid
distance" is not used. Pairs split across two clusters are missed: that is the price of
cost linear in the run (N x cluster size comparisons instead of N^2). k grows with the run
(rows / ``target_cluster_size``), so past ``max_flat_clusters`` the centroids are a two-level
tree (``fit_tree``): a row is compared with about 2 sqrt(k) centroids instead of k.

Determinism: k-means trains on a sample chosen by a hash of each row's key (the
``kmeans_sample_size`` smallest hashes, then sorted by key) with a seeded initialisation,
and every later step works on key-sorted rows, so input and partition order never matter.
The local and Ray variants share every step and give identical decisions (for one choice
of k-means backend: faiss and numpy give different centroids). With ``dedup.engine=ray`` the
run's step runs in Ray Data with nothing corpus-sized on the driver
(``curation.dedup.distributed_semantic``); ``semantic_duplicate_decisions_ray`` below still
gathers the decisions, for a dataset handed in directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
from collections.abc import Collection

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
class SemanticDupConfig:
    """Settings of semantic dedup.

    Off by default: embeddings come from the CLIP embedding step, which may be off. ``threshold``:
    cosine similarity at or above which two images are duplicates; 0.99 is NeMo Curator's
    default (eps 0.01). It was not calibrated here (no real CLIP weights on these machines):
    calibrate it on real embeddings before lowering it to catch crops and burst frames.
    ``n_clusters``: k of k-means; None uses ceil(rows / ``target_cluster_size``), which keeps
    the within-cluster work at rows x cluster size. ``max_flat_clusters``: a larger k is fitted
    as a two-level tree (``fit_tree``), so assigning a row costs about 2 sqrt(k) dot products
    instead of k (k grows with the run: 10,000 at 1e7 rows). ``use_faiss``: "auto" (faiss when
    installed), "always" or "never" (numpy Lloyd iterations). ``block_rows``: with
    ``dedup.engine=ray``, a cluster of more rows is dealt into blocks and searched block pair by
    block pair, so no task holds more than two blocks of embeddings (never changes decisions).
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
            raise ValueError(f"semantic_dup.threshold is a cosine similarity in (0, 1], got {self.threshold}")
        if self.n_clusters is not None and self.n_clusters < 1:
            raise ValueError(f"semantic_dup.n_clusters must be >= 1 or None, got {self.n_clusters}")
        if self.target_cluster_size < 2:
            raise ValueError(f"semantic_dup.target_cluster_size must be >= 2, got {self.target_cluster_size}")
        if self.kmeans_iterations < 1 or self.kmeans_sample_size < 1:
            raise ValueError("semantic_dup.kmeans_iterations and kmeans_sample_size must be >= 1")
        if self.max_flat_clusters < 1:
            raise ValueError(f"semantic_dup.max_flat_clusters must be >= 1, got {self.max_flat_clusters}")
        if self.block_rows < 1:
            raise ValueError(f"semantic_dup.block_rows must be >= 1, got {self.block_rows}")
        if self.use_faiss not in ("auto", "always", "never"):
            raise ValueError(f"semantic_dup.use_faiss must be 'auto', 'always' or 'never', got {self.use_faiss!r}")

    def clusters_for(self, n_rows: int) -> int:
        return max(1, min(n_rows, self.n_clusters or math.ceil(n_rows / self.target_cluster_size)))


# ---- k-means ----------------------------------------------------------------------------


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
            raise ValueError("semantic_dup.use_faiss='always' needs faiss: pip install faiss-cpu") from None
        return None
    return faiss


def fit_centroids(sample: np.ndarray, k: int, cfg: SemanticDupConfig, seed: int | None = None) -> np.ndarray:
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
    """Each row's centroid of largest dot product, scored ``SCORE_BLOCK // k`` rows at a time, so a
    fit or an assignment task holds a bounded score matrix whatever its rows and ``k`` (a whole
    ``rows x k`` matrix is 8 GB for a 100,000-row sample and 10,000 clusters)."""
    rows = max(1, SCORE_BLOCK // max(1, len(centroids)))
    out = np.empty(len(x), np.int32)
    for start in range(0, len(x), rows):
        out[start : start + rows] = np.argmax(x[start : start + rows] @ centroids.T, axis=1)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Centroids:
    """Fitted k-means centroids, flat (``coarse`` None) or a two-level tree (``fit_tree``).

    ``fine`` holds the k centroids rows are assigned to (a cluster id is a row number of it). In a
    tree they are grouped by coarse centroid, those under coarse centroid c at
    ``fine[offsets[c]:offsets[c + 1]]``, and a row goes to the best fine centroid under its best
    coarse one."""

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
    """Fine clusters per coarse cluster of ``rows`` sample rows each (all >= 1, sum >= ``k``):
    one each, then the rest one at a time to the cluster with the most rows per fine cluster
    (D'Hondt; ties to the lower index), never more than a cluster's rows. Sums to exactly k."""
    per = np.ones(len(rows), np.int64)
    heap = [(-float(r), c) for c, r in enumerate(rows) if r > 1]
    heapq.heapify(heap)
    for _ in range(k - len(rows)):
        _, c = heapq.heappop(heap)
        per[c] += 1
        if per[c] < rows[c]:
            heapq.heappush(heap, (-rows[c] / per[c], c))
    return per


def fit_tree(sample: np.ndarray, k: int, cfg: SemanticDupConfig) -> Centroids:
    """k centroids of a key-sorted sample: flat up to ``cfg.max_flat_clusters``, else two levels.

    The tree: ceil(sqrt(k)) coarse centroids fitted on the whole sample (those no sample row chose
    are dropped), then each coarse cluster's sample rows (in key order) fitted with its share of k
    (``split_clusters``), seeded by ``cfg.seed`` + 1 + its index. Fitting costs about 2 sqrt(k)
    products per sample row and iteration instead of k. A near pair split by a coarse boundary is
    missed, as one split by a flat boundary is."""
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


# ---- within a cluster -------------------------------------------------------------------


def similar_pairs(
    xa: np.ndarray, xb: np.ndarray, threshold: float, *, upper: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, cosine) of every pair of unit rows ``xa[i]``, ``xb[j]`` with cosine >= ``threshold``
    (``upper``: ``xa`` is ``xb``, pairs i < j only), ``_ROW_BLOCK`` rows of ``xa`` at a time.

    The matrix product finds the candidates (within ``_SLACK`` of the threshold); each
    candidate's cosine is then recomputed as its own row product, so the pairs and their scores
    depend on the two vectors only, not on which other rows shared the product (a BLAS kernel
    may round a dot product differently with the shape of the matrices): the Ray engine, which
    blocks a cluster differently, finds the same pairs."""
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


def cluster_decisions(cluster: pa.Table, cfg: SemanticDupConfig, prefer: Collection[str] = ()) -> pa.Table:
    """Decisions inside one cluster: components of the pairs with cosine >= threshold."""
    table = canonical_order(cluster)
    x = embeddings(table, cfg.embedding_column)
    a, b, _ = similar_pairs(x, x, cfg.threshold, upper=True)
    labels = component_labels(table.num_rows, a, b)
    return decisions_from_labels(table, labels, SEMANTIC_DUPLICATE, GROUP_PREFIX, prefer)


def _cluster_group(group: pa.Table, cfg: SemanticDupConfig, prefer: Collection[str]) -> pa.Table:
    return cluster_decisions(group.drop_columns(["cluster"]), cfg, prefer)


# ---- entry points -----------------------------------------------------------------------


def _columns(cfg: SemanticDupConfig, names=META_COLUMNS) -> list[str]:
    return [*meta_columns(names), cfg.embedding_column]


def _check_columns(names, cfg: SemanticDupConfig) -> None:
    missing = [c for c in _columns(cfg) if c not in names]
    if missing:
        raise ValueError(
            f"semantic dedup candidates lack columns {missing}"
            + (" (the CLIP embedding step must run first)" if cfg.embedding_column in missing else "")
        )


def _sample_centroids(sample: pa.Table, n_rows: int, cfg: SemanticDupConfig) -> Centroids:
    """Centroids from the rows of ``sample`` with the smallest key ranks (then in key order)."""
    ranks = key_rank(sample.column("key").to_pylist())
    chosen = np.sort(np.argsort(ranks, kind="stable")[: cfg.kmeans_sample_size])
    sample = canonical_order(sample.take(chosen))
    return fit_tree(embeddings(sample, cfg.embedding_column), cfg.clusters_for(n_rows), cfg)


def semantic_duplicate_decisions(
    candidates: pa.Table, cfg: SemanticDupConfig, *, prefer: Collection[str] = ()
) -> pa.Table:
    """Decision rows (``DECISION_SCHEMA``, reason ``semantic_duplicate``, sorted by key), in one process.

    ``candidates``: key, width, height (converted, input_bytes where known) and ``cfg.embedding_column``
    (list<float32>, any fixed length; normalised here). Row order does not matter.
    """
    if not cfg.enabled or candidates.num_rows == 0:
        return DECISION_SCHEMA.empty_table()
    _check_columns(candidates.column_names, cfg)
    table = canonical_order(candidates.select(_columns(cfg, candidates.column_names)))
    centroids = _sample_centroids(table.select(["key", cfg.embedding_column]), table.num_rows, cfg)
    clusters = centroids.assign(embeddings(table, cfg.embedding_column))
    order = np.argsort(clusters, kind="stable")
    bounds = np.flatnonzero(np.diff(clusters[order])) + 1
    parts = [cluster_decisions(table.take(idx), cfg, prefer) for idx in np.split(order, bounds) if len(idx) > 1]
    return pa.concat_tables([DECISION_SCHEMA.empty_table(), *parts]).sort_by("key")


def _with_rank(batch: pa.Table) -> pa.Table:
    return batch.append_column("_rank", pa.array(key_rank(batch.column("key").to_pylist()), pa.uint64()))


def _below(batch: pa.Table, limit: int) -> pa.Table:
    return batch.filter(pa.array(batch.column("_rank").to_numpy() < np.uint64(limit))).drop_columns(["_rank"])


def _assign(batch: pa.Table, column: str, centroids: Centroids) -> pa.Table:
    return batch.append_column("cluster", pa.array(centroids.assign(embeddings(batch, column))))


def _gather(ds) -> pa.Table | None:
    batches = [b for b in ds.iter_batches(batch_format="pyarrow", batch_size=None) if b.num_rows]
    return pa.concat_tables(batches) if batches else None


def semantic_duplicate_decisions_ray(
    candidates_ds, cfg: SemanticDupConfig, *, prefer: Collection[str] = ()
) -> pa.Table:
    """The same decisions with Ray Data: k-means on the driver over a key-hash sample,
    cluster assignment in ``map_batches``, pairwise cosine per cluster in ``map_groups``."""
    if not cfg.enabled:
        return DECISION_SCHEMA.empty_table()
    _check_columns(list(candidates_ds.schema().names), cfg)
    ds = candidates_ds.select_columns(_columns(cfg, candidates_ds.schema().names)).materialize()
    n_rows = ds.count()
    if n_rows == 0:
        return DECISION_SCHEMA.empty_table()
    keyed = ds.select_columns(["key", cfg.embedding_column])
    fraction = 2.0 * cfg.kmeans_sample_size / n_rows
    while True:  # the sample is the kmeans_sample_size smallest ranks: fetch all ranks below a margin
        if fraction >= 1.0:
            sample = _gather(keyed)
            break
        sample = _gather(
            keyed.map_batches(_with_rank, batch_format="pyarrow").map_batches(
                _below, fn_kwargs={"limit": int(fraction * 2**64)}, batch_format="pyarrow"
            )
        )
        if sample is not None and sample.num_rows >= cfg.kmeans_sample_size:
            break
        fraction *= 4
    centroids = _sample_centroids(sample, n_rows, cfg)
    out = (
        ds.map_batches(
            _assign, fn_kwargs={"column": cfg.embedding_column, "centroids": centroids}, batch_format="pyarrow"
        )
        .groupby("cluster")
        .map_groups(_cluster_group, fn_kwargs={"cfg": cfg, "prefer": prefer}, batch_format="pyarrow")
    )
    parts = [b for b in out.iter_batches(batch_format="pyarrow", batch_size=None) if b.num_rows]
    return pa.concat_tables([DECISION_SCHEMA.empty_table(), *[p.cast(DECISION_SCHEMA) for p in parts]]).sort_by("key")
