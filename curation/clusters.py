"""Cluster ids of the kept samples: a hierarchical k-means of their embeddings (section ``clusters``).

**What it writes.** Every kept sample gets ``cluster_l0``, ``cluster_l1``, ... (int32), one per
entry of ``clusters.levels`` (cluster counts, coarsest first): ids are global per level
(0 .. k - 1) and a sample's level-l cluster lies inside its level-(l - 1) cluster. The writer puts
them in the shards' sidecars and the manifest (an ``AttributeStep``'s per-partition files, joined by
key). ``clusters.json`` at the output's root holds per level its k and the kept samples of each
cluster that has any (a missing id has none), the parent of every cluster of each level below
the first, and what embedded the images (``FORMAT``; O(clusters), never O(samples)).

**How levels nest: bottom up**, as Vo et al. 2024 ("Automatic data curation for self-supervised
learning: a clustering-based approach") build their hierarchy: the finest level is a k-means of
the samples' embeddings; each coarser level is a k-means of the centroids of the level below,
every centroid counting once, and a cluster's parent is the coarser cluster its centroid falls
in. A sample's coarser ids follow its finest id up through the parents, so nesting holds exactly,
by construction. Fitting a coarse level on centroids rather than on samples spreads its clusters
over the concepts present instead of piling them where the data is dense: what balanced sampling
(uniform over the top level's clusters, then within) needs. (The alternatives: fitting level l
within each level-(l - 1) cluster, which inherits the first fit's density bias, or fitting levels
independently and mapping by majority, which moves samples out of their nearest cluster.) A
coarse centroid no finer centroid chose is dropped, so every cluster above the finest level has a
child; a finest cluster may end with no sample. Vo et al.'s resampling steps between levels are
not done.

**Fitting reuses semantic dedup's** (``curation.dedup.semantic``): the finest level is fitted on
the ``sample_size`` samples with the smallest key hashes, in key order (``semantic.sample_centroids``:
semantic dedup's own rule; spherical k-means from ``seed``; past ``max_flat_clusters``
clusters a two-level tree, so a sample's assignment costs about 2 sqrt(k) products, not k); the
coarser levels on the centroids below with ``fit_tree``. Every sample is then assigned in its
partition's own pass. The same seed, samples and settings give the same ids. Engines
(``engine``): ``local`` reads the candidates into the driver (small runs); ``ray`` samples and
fits in Ray tasks (``distributed_semantic.fitted_centroids``), assigns in one task per
partition and sums the counts in a Ray Data aggregation, so nothing corpus-sized reaches the
driver. Both fit on the same sample by the same rule, so they give the same ids (tested).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pyarrow as pa

from curation import output
from curation.dedup.distributed import GlobalDedupInput, candidates_dataset, read_candidates
from curation.dedup.distributed_semantic import fitted_centroids
from curation.dedup.semantic import Centroids, DedupSemanticConfig, embeddings, fit_tree, sample_centroids
from curation.steps import AttributeStep
from infra import storage

FORMAT = 1
LEVEL_PREFIX = "cluster_l"
KMEANS_BACKENDS = ("auto", "always", "never")


def level_column(level: int) -> str:
    """The column of a level's ids (0: the coarsest)."""
    return f"{LEVEL_PREFIX}{level}"


@dataclasses.dataclass(kw_only=True)
class ClustersConfig:
    """Settings of the cluster ids (``clusters``): ``levels`` are cluster counts, coarsest first, each
    larger than the one before (e.g. [8, 32] for a demo, [1000, 10000, 100000] for a corpus of 1e9);
    ``embedding_column`` is the embedding they cluster (``clip_embedding`` from content.embedding, or
    ``backbone_embedding``); ``sample_size`` samples fit the finest level (then every sample is
    assigned); ``use_faiss`` as semantic dedup's."""

    enabled: bool = False
    levels: list[int] = dataclasses.field(default_factory=lambda: [8, 32])
    embedding_column: str = "clip_embedding"
    engine: Literal["local", "ray"] = "local"
    sample_size: int = 100_000
    iterations: int = 20
    seed: int = 0
    max_flat_clusters: int = 1024
    use_faiss: Literal["auto", "always", "never"] = "auto"

    def __post_init__(self) -> None:
        levels = list(self.levels)
        if not levels or min(levels) < 1:
            raise ValueError(f"clusters.levels must list clusters per level >= 1, coarsest first, got {levels}")
        if any(b <= a for a, b in zip(levels, levels[1:])):
            raise ValueError(f"clusters.levels must grow from the coarsest level to the finest, got {levels}")
        if self.sample_size < levels[-1]:
            raise ValueError(
                f"clusters.sample_size={self.sample_size} is below the finest level's {levels[-1]} clusters: "
                "each cluster needs samples to be fitted on"
            )
        if self.iterations < 1 or self.seed < 0 or self.max_flat_clusters < 1:
            raise ValueError("clusters.iterations and clusters.max_flat_clusters must be >= 1, clusters.seed >= 0")
        if self.engine not in ("local", "ray") or self.use_faiss not in KMEANS_BACKENDS:
            raise ValueError(f"clusters.engine must be local or ray, clusters.use_faiss one of {list(KMEANS_BACKENDS)}")

    def kmeans(self) -> DedupSemanticConfig:
        """The k-means settings of semantic dedup's fitting code, for the finest level."""
        return DedupSemanticConfig(
            enabled=True,
            embedding_column=self.embedding_column,
            n_clusters=self.levels[-1],
            kmeans_iterations=self.iterations,
            kmeans_sample_size=self.sample_size,
            seed=self.seed,
            use_faiss=self.use_faiss,
            max_flat_clusters=self.max_flat_clusters,
        )


# ---- the hierarchy ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Hierarchy:
    """Fitted levels, coarsest first: the finest level's centroids (its ids are their row numbers)
    and, for each level l >= 1, ``parents[l - 1]``: level-l id -> its level-(l - 1) id."""

    finest: Centroids | None  # None: nothing was fitted (no sample)
    parents: tuple[np.ndarray, ...]
    sizes: tuple[int, ...]  # k of each level

    def assign(self, x: np.ndarray) -> list[np.ndarray]:
        """Each unit row's id at every level (int32 arrays, coarsest first)."""
        if not len(x):
            return [np.zeros(0, np.int32) for _ in self.sizes]
        ids = [self.finest.assign(x).astype(np.int32)]
        for parent in reversed(self.parents):
            ids.insert(0, parent[ids[0]])
        return ids


def empty_hierarchy(levels: int) -> Hierarchy:
    return Hierarchy(None, tuple(np.zeros(0, np.int32) for _ in range(levels - 1)), (0,) * levels)


def fit_hierarchy(finest: Centroids, levels: Sequence[int], km: DedupSemanticConfig) -> Hierarchy:
    """The coarser levels on top of the finest one's centroids: each a k-means of the level below's
    centroids (at most as many clusters as those), coarse centroids that no finer one chose dropped."""
    child, parents, sizes = finest.fine, [], [len(finest)]
    for k in reversed(levels[:-1]):
        coarse = fit_tree(child, k, km)
        parent = coarse.assign(child)
        used = np.flatnonzero(np.bincount(parent, minlength=len(coarse)))
        parents.insert(0, np.searchsorted(used, parent).astype(np.int32))
        child = coarse.fine[used]
        sizes.insert(0, len(used))
    return Hierarchy(finest, tuple(parents), tuple(sizes))


def outline(hierarchy: Hierarchy) -> tuple[tuple[int, ...], tuple[np.ndarray, ...]]:
    """(k per level, parents): what ``clusters.json`` needs, without the centroids."""
    return hierarchy.sizes, hierarchy.parents


@dataclasses.dataclass(frozen=True)
class Fitted:
    """A run's clusters: k per level, the parents, and the kept samples per cluster id of each level."""

    sizes: tuple[int, ...]
    parents: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]  # counts[l][id]: samples in cluster id of level l


def document(fitted: Fitted, embedding: str) -> dict:
    """The ``clusters.json`` of a run (see the module doc)."""
    return {
        "format": FORMAT,
        "levels": [
            {"k": int(k), "counts": {str(i): int(c[i]) for i in np.flatnonzero(c)}}
            for k, c in zip(fitted.sizes, fitted.counts, strict=True)
        ],
        "parents": [None, *({str(i): int(p) for i, p in enumerate(parent)} for parent in fitted.parents)],
        "embedding": embedding,
    }


# ---- assignment, one partition at a time --------------------------------------------------------


def unit_rows(rows: pa.Table, column: str) -> np.ndarray:
    """The rows' embeddings as unit vectors; a row without one is a bug of the recipe's order."""
    if rows.column(column).null_count:
        missing = rows.filter(rows.column(column).is_null()).column("key")[0].as_py()
        raise RuntimeError(f"clusters: a kept row has no {column!r} (e.g. {missing!r}); its step must score every row")
    return embeddings(rows, column)


def write_assignment(
    inp: GlobalDedupInput, pidx: int, rows: pa.Table, hierarchy: Hierarchy, column: str, step: str
) -> list[np.ndarray]:
    """Partition ``pidx``'s ids at every level (its candidate ``rows``: key and ``column``), written
    as its annotation file in key order; returns them."""
    ids = hierarchy.assign(unit_rows(rows, column) if rows.num_rows else np.zeros((0, 1)))
    table = pa.table(
        {
            "key": rows.column("key").cast(pa.string()),
            **{level_column(i): pa.array(v, pa.int32()) for i, v in enumerate(ids)},
        }
    )
    fs, root = storage.resolve(inp.out)
    storage.write_parquet(fs, output.attributes_path(root, step, inp.pids[pidx]), table.sort_by("key"))
    return ids


def count_table(ids: list[np.ndarray]) -> pa.Table:
    """(level, cluster, n) of one partition's ids."""
    parts = [(level, *np.unique(v, return_counts=True)) for level, v in enumerate(ids)]
    return pa.table(
        {
            "level": pa.array(np.concatenate([np.full(len(c), lv) for lv, c, _ in parts]), pa.int32()),
            "cluster": pa.array(np.concatenate([c for _, c, _ in parts]), pa.int32()),
            "n": pa.array(np.concatenate([n for _, _, n in parts]), pa.int64()),
        }
    )


# ---- the engines --------------------------------------------------------------------------------


def cluster_locally(inp: GlobalDedupInput, cfg: ClustersConfig, step: str) -> Fitted:
    """In this process: every partition's candidates read, the sample fitted, each partition assigned."""
    column = cfg.embedding_column
    tables = [read_candidates(inp, i, ["key", column]) for i in range(len(inp.pids))]
    found = [t for t in tables if t.num_rows]  # an empty partition's table has no typed columns
    candidates = pa.concat_tables(found) if found else None
    if candidates is None:
        hierarchy = empty_hierarchy(len(cfg.levels))
    else:
        km = cfg.kmeans()
        finest = sample_centroids(candidates.select(["key", column]), candidates.num_rows, km)
        hierarchy = fit_hierarchy(finest, cfg.levels, km)
    counts = [np.zeros(k, np.int64) for k in hierarchy.sizes]
    for i, rows in enumerate(tables):
        for level, ids in enumerate(write_assignment(inp, i, rows, hierarchy, column, step)):
            counts[level] += np.bincount(ids, minlength=len(counts[level]))
    return Fitted(hierarchy.sizes, hierarchy.parents, tuple(counts))


def _assign_and_count(batch: dict, inp: GlobalDedupInput, hierarchy, column: str, step: str) -> pa.Table:
    import ray

    fitted = ray.get(hierarchy)
    tables = []
    for pidx in batch["pidx"]:
        rows = read_candidates(inp, int(pidx), ["key", column])
        tables.append(count_table(write_assignment(inp, int(pidx), rows, fitted, column, step)))
    return pa.concat_tables(tables)


def cluster_with_ray(inp: GlobalDedupInput, cfg: ClustersConfig, step: str) -> Fitted:
    """In Ray: the sample fitted in a task, the coarser levels in another, each partition assigned
    in a task, the counts summed by a Ray Data aggregation (k rows per level reach the driver)."""
    import ray
    import ray.data

    n = candidates_dataset(inp, ["key"]).count()
    if not n:  # nothing to fit: each partition's (empty) file
        return cluster_locally(inp, cfg, step)
    km = cfg.kmeans()
    hierarchy = ray.remote(fit_hierarchy).remote(fitted_centroids(inp, n, km), list(cfg.levels), km)
    sizes, parents = ray.get(ray.remote(outline).remote(hierarchy))
    items = ray.data.from_items(
        [{"pidx": i} for i in range(len(inp.pids))], override_num_blocks=max(1, min(len(inp.pids), 200))
    )
    kwargs = {"inp": inp, "hierarchy": hierarchy, "column": cfg.embedding_column, "step": step}
    counted = items.map_batches(_assign_and_count, batch_size=1, batch_format="numpy", fn_kwargs=kwargs)
    groups = max(1, min(64, sum(sizes) // 4096))
    counts = [np.zeros(k, np.int64) for k in sizes]
    for r in counted.groupby(["level", "cluster"], num_partitions=groups).sum("n").take_all():
        counts[int(r["level"])][int(r["cluster"])] = int(r["sum(n)"])
    return Fitted(tuple(sizes), tuple(parents), tuple(counts))


ENGINES = {"local": cluster_locally, "ray": cluster_with_ray}


class Clusters(AttributeStep):
    """Cluster ids at every level for the kept samples, and ``clusters.json`` (the module doc)."""

    section = "clusters"
    Config = ClustersConfig

    def columns_read(self) -> tuple[str, ...]:
        return (self.cfg.embedding_column,)

    def columns_written(self) -> tuple[str, ...]:
        return tuple(level_column(i) for i in range(len(self.cfg.levels)))

    def settings(self) -> dict:
        c = self.cfg
        keys = ("levels", "embedding_column", "engine", "sample_size", "iterations", "seed", "max_flat_clusters")
        return {k: getattr(c, k) for k in keys}

    def annotate(self, inp: GlobalDedupInput, sources: dict[str, str]) -> None:
        """The ids of ``inp``'s candidates (``inp.columns`` ending with the embedding), written per
        partition, then ``clusters.json``."""
        column = self.cfg.embedding_column
        inp = dataclasses.replace(inp, columns=("key", "partition", column))
        fitted = ENGINES[self.cfg.engine](inp, self.cfg, self.name)
        totals = {int(c.sum()) for c in fitted.counts}
        if len(totals) > 1:
            raise RuntimeError(f"clusters: the levels count {sorted(totals)} samples; every level must count each once")
        fs, root = storage.resolve(inp.out)
        doc = document(fitted, sources.get(column, "unknown"))
        storage.atomic_write_bytes(fs, output.path(root, output.CLUSTERS_FILE), json.dumps(doc).encode())
