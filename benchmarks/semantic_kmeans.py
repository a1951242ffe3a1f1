"""Semantic dedup's k-means, flat against the two-level tree: time and recall, in one process.

    python benchmarks/semantic_kmeans.py                      # 1e5 and 1e6 rows, k = n / 100
    python benchmarks/semantic_kmeans.py --sizes 1e5 --cluster-size 1000

Rows: ``--dim``-d unit vectors, uniform on the sphere, a fraction ``--copies`` of them noisy copies
of one of n / 20 originals (noise ``--noise`` per coordinate: two copies of one original are at a
cosine near 0.999), the family ``benchmarks/curate_scale.py`` stages. The truth is the planted
groups: each original's copies but one should be dropped; unrelated uniform rows never reach the
0.99 threshold at 64 dimensions (the script counts the drops outside planted groups, which should
be 0). For each size it runs ``semantic.semantic_duplicate_decisions`` (sample fit, assignment,
pairs within each cluster, components) with k = n / ``--cluster-size`` as one flat k-means
(``max_flat_clusters`` above k) and as the tree (``max_flat_clusters`` 1), and prints for each the
wall time of the call, the fit and assignment alone (``sample_centroids`` then
``Centroids.assign``), the rows dropped, the recall (drops / planted drops) and the agreement of
the two (dropped keys in both / in either). The ratio flat / tree is the speed-up at that k; the
recall difference is what the coarse boundaries cost. Uniform rows have no cluster structure, so
real CLIP embeddings (clustered) will show a different recall; none ship on this machine.
Results: docs/results/scale.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import pyarrow as pa

from curation.dedup import semantic


def rows(n: int, args) -> tuple[pa.Table, int]:
    """The table and its planted drops (copies - distinct originals copied)."""
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((n, args.dim)).astype(np.float32)
    originals = rng.standard_normal((max(1, n // 20), args.dim)).astype(np.float32)
    copy = rng.random(n) < args.copies
    which = rng.integers(0, len(originals), int(copy.sum()))
    x[copy] = originals[which] + rng.normal(scale=args.noise, size=(len(which), args.dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    group = np.full(n, -1, np.int64)  # the original a row copies, -1: none
    group[copy] = which
    table = pa.table(
        {
            "key": [f"k{i:09d}" for i in range(n)],
            "width": np.full(n, 640, np.int32),
            "height": np.full(n, 480, np.int32),
            "clip_embedding": pa.array(list(x), pa.list_(pa.float32())),
            "planted": pa.array(group),
        }
    )
    return table, int(len(which) - len(np.unique(which)))


def run(table: pa.Table, cfg: semantic.DedupSemanticConfig) -> dict:
    cand = table.drop_columns(["planted"])
    t0 = time.perf_counter()
    out = semantic.semantic_duplicate_decisions(cand, cfg)
    total = time.perf_counter() - t0
    t0 = time.perf_counter()
    centroids = semantic.sample_centroids(cand.select(["key", cfg.embedding_column]), cand.num_rows, cfg)
    fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    centroids.assign(semantic.embeddings(cand, cfg.embedding_column))
    assign = time.perf_counter() - t0
    return {"total": total, "fit": fit, "assign": assign, "dropped": set(out.column("key").to_pylist())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6])
    p.add_argument("--cluster-size", type=int, default=100, help="target_cluster_size: k = n / this")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--copies", type=float, default=0.10)
    p.add_argument("--noise", type=float, default=0.004)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for n in (int(s) for s in args.sizes):
        table, planted = rows(n, args)
        group = table.column("planted").to_numpy()
        keys = np.array(table.column("key").to_pylist())
        base = semantic.DedupSemanticConfig(enabled=True, target_cluster_size=args.cluster_size, use_faiss="never")
        k = base.clusters_for(n)
        got = {}
        for name, max_flat in (("flat", k), ("tree", 1)):
            r = got[name] = run(table, dataclasses.replace(base, max_flat_clusters=max_flat))
            outside = int((group[np.isin(keys, list(r["dropped"]))] < 0).sum())
            print(
                f"n={n:>11,} k={k:>6,} {name}: call {r['total']:7.1f} s (fit {r['fit']:6.1f} s, assign "
                f"{r['assign']:6.1f} s); dropped {len(r['dropped']):,} of {planted:,} planted "
                f"(recall {len(r['dropped']) / max(planted, 1):.4f}, outside planted groups {outside})",
                flush=True,
            )
        a, b = got["flat"]["dropped"], got["tree"]["dropped"]
        print(
            f"n={n:>11,} flat / tree: call {got['flat']['total'] / got['tree']['total']:.2f}x, fit + assign "
            f"{(got['flat']['fit'] + got['flat']['assign']) / (got['tree']['fit'] + got['tree']['assign']):.2f}x; "
            f"agreement {len(a & b) / max(len(a | b), 1):.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
