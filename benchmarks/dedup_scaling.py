"""Scaling of the near-duplicate search: time, peak memory and work in counts for N synthetic 64-bit hashes.

    python benchmarks/dedup_scaling.py              # the full run (the defaults of --help)
    python benchmarks/dedup_scaling.py --quick      # small sizes, a minute or two
    python benchmarks/dedup_scaling.py --smallest   # ours at 1e3 and 2e3, imagededup at 1e3 (the smoke test's run)

Hash families (``--kinds``), each with a fraction (``--dup-fraction``) of planted copies of an
earlier hash with 0..t bits flipped: ``uniform`` (independent fair-coin bits) and ``correlated``
(bit j = [w_j . z + ``--noise`` * e_j > 0], z a ``--latent-dim``-dimensional Gaussian per hash,
w_j fixed unit vectors: bits that move together; ``correlated:D:NOISE`` names other strengths,
smaller D and NOISE correlating harder). Neither is a model of real PHashes (their DC bit is
always set, the AC bits are signs of one image's DCT against their median): a family drawn from
real image content comes with a later change. The script prints each family's mean |correlation|
between bits, the mean and sd of the distance between unrelated hashes and the bits set.

Methods, each (kind, size) in a fresh subprocess: ``ours`` (``near_duplicate_decisions``), ``ray``
(``near_duplicate_decisions_ray`` on an in-process Ray, 2 CPUs, 8 blocks, started before the
clock), imagededup's ``find_duplicates`` with ``brute_force_cython`` and ``bktree``. imagededup
runs only at ``--imagededup-sizes`` / ``--bktree-sizes``; larger sizes are printed as
EXTRAPOLATED from a power law fitted to its own runs. Wherever imagededup ran, the script asserts
that it and ours make the same decisions on the same hashes at the same threshold (dropped rows
and groups: the components of imagededup's pairs against our groups, by digest).

For ``ours`` it also counts the search's work, which the machine's load cannot change: the plan's
blocks and bands, candidate pairs per item (pairs sharing a band key: one Hamming check each),
true pairs within t, accidental pairs (among the generator's values before copies are planted),
and the growth of work = distinct values x bands + candidate pairs.

Time is the wall time of the search call; "rss MB" the process's peak RSS above its level after
imports, data generation and a warm-up call on 200 rows; "traced MB" the tracemalloc peak of a
second, untimed run (ours only). Growth exponents are log(time ratio) / log(size ratio). Compare
within one run: every figure of a run is measured under the same load. The accuracy on real
near-duplicates is ``pytest -s tests/curation/dedup/test_dedup_accuracy.py``. Results:
docs/results/dedup_scaling.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import time
import tracemalloc

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KINDS = ("uniform", "correlated")


def kind_params(kind: str, latent_dim: int, noise: float) -> tuple[str, int, float]:
    """(family, latent dim, noise) of a ``--kinds`` entry."""
    if kind in KINDS:
        return kind, latent_dim, noise
    family, _, rest = kind.partition(":")
    if family != "correlated" or rest.count(":") != 1:
        raise ValueError(f"unknown hash kind {kind!r}: uniform, correlated or correlated:D:NOISE")
    d, nz = rest.split(":")
    return family, int(d), float(nz)


IMAGEDEDUP = {"imagededup": "brute_force_cython", "imagededup-bktree": "bktree"}


def hash_values(n: int, kind: str, rng: np.random.Generator, latent_dim: int = 8, noise: float = 1.0) -> np.ndarray:
    """n 64-bit values of the family ``kind`` (uint64)."""
    kind, latent_dim, noise = kind_params(kind, latent_dim, noise)
    if kind == "uniform":
        return rng.integers(0, 2**64, n, dtype=np.uint64)
    if kind != "correlated":
        raise ValueError(kind)
    w = np.random.default_rng(12345).standard_normal((64, latent_dim)).astype(np.float32)  # fixed across runs
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    weights = np.uint64(1) << np.arange(64, dtype=np.uint64)
    out = np.empty(n, dtype=np.uint64)
    for s in range(0, n, 200_000):  # chunks keep the float matrix small at 1e6+
        m = min(n, s + 200_000) - s
        z = rng.standard_normal((m, latent_dim), dtype=np.float32)
        bits = (z @ w.T + noise * rng.standard_normal((m, 64), dtype=np.float32)) > 0
        out[s : s + m] = (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    return out


def family_stats(kind: str, latent_dim: int, noise: float, n: int = 20000, pairs: int = 200_000) -> dict:
    rng = np.random.default_rng(7)
    v = hash_values(n, kind, rng, latent_dim, noise)
    bits = ((v[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).astype(np.float64)
    corr = np.corrcoef(bits[:5000].T)
    off = np.abs(corr[~np.eye(64, dtype=bool)])
    i, j = rng.integers(0, n, (2, pairs))
    i, j = i[i != j], j[i != j]
    dist = (bits[i] != bits[j]).sum(axis=1)
    return {
        "mean_abs_bit_corr": float(np.nanmean(off)),
        "dist_mean": float(dist.mean()),
        "dist_sd": float(dist.std()),
        "bits_set_mean": float(bits.sum(axis=1).mean()),
    }


def synthetic_table(
    n: int,
    max_distance: int,
    dup_fraction: float,
    seed: int = 0,
    kind: str = "uniform",
    latent_dim: int = 8,
    noise: float = 1.0,
):
    import pyarrow as pa

    from curation.dedup.hashing import uint64_to_hex

    rng = np.random.default_rng(seed)
    values = hash_values(n, kind, rng, latent_dim, noise)
    is_copy = rng.random(n) < dup_fraction
    copies, originals = np.flatnonzero(is_copy), np.flatnonzero(~is_copy)
    copied = values[originals[rng.integers(0, len(originals), len(copies))]]
    flips = rng.integers(0, max_distance + 1, len(copies))  # 0..t bits (a repeated bit flips back)
    for k in range(max_distance):
        bit = np.uint64(1) << rng.integers(0, 64, len(copies)).astype(np.uint64)
        copied = np.where(flips > k, copied ^ bit, copied)
    values[copies] = copied
    return pa.table(
        {
            "key": [f"k{i:09d}" for i in range(n)],
            "phash": uint64_to_hex(values),
            "width": rng.choice([320, 640, 1024], n).astype(np.int32),
            "height": np.full(n, 480, dtype=np.int32),
            "person_score_max": pa.array(rng.random(n), pa.float32()),
        }
    )


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def groups_digest(n_keys: int, keys: list[str], labels: np.ndarray) -> str:
    """Digest of key -> smallest key of its group, over rows in groups of 2+ (order-free)."""
    labels = np.asarray(labels)
    sizes = np.bincount(labels, minlength=labels.max() + 1 if len(labels) else 0)
    first: dict[int, str] = {}
    for k, lab in zip(keys, labels):
        if sizes[lab] > 1 and (lab not in first or k < first[lab]):
            first[lab] = k
    text = "\n".join(f"{k} {first[lab]}" for k, lab in sorted(zip(keys, labels)) if sizes[lab] > 1)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def decisions_digest(decisions, keys: list[str]) -> str:
    """The same digest from our decision rows (group = dropped rows + their representative)."""
    index = {k: i for i, k in enumerate(keys)}
    labels = np.arange(len(keys))
    for key, rep in zip(decisions.column("key").to_pylist(), decisions.column("duplicate_of").to_pylist()):
        labels[index[key]] = index[rep]
    return groups_digest(len(keys), keys, labels)


def measure_one(method: str, n: int, kind: str, args) -> dict:
    """Run one (method, kind, size) in this process and return its figures."""
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.INFO)  # imagededup logs every call at INFO
    from curation.dedup.near import NearDupConfig, near_duplicate_decisions, near_duplicate_decisions_ray

    t = args.max_distance
    table = synthetic_table(n, t, args.dup_fraction, kind=kind, latent_dim=args.latent_dim, noise=args.noise)
    keys = table.column("key").to_pylist()
    cfg = NearDupConfig(max_distance=t, match_mirrored=False)
    if method == "ray":
        import ray
        import ray.data

        from infra.ray_runtime import use_shuffle

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        use_shuffle("sort")  # as on a local cluster started by init_ray (RayConfig.shuffle)
        ds = ray.data.from_arrow(table).repartition(8).materialize()
    if method in IMAGEDEDUP:
        from imagededup.methods import PHash

        encoding_map = dict(zip(keys, table.column("phash").to_pylist()))

        def imagededup_search(mapping):
            return PHash(verbose=False).find_duplicates(
                encoding_map=mapping, max_distance_threshold=t, search_method=IMAGEDEDUP[method], num_dist_workers=0
            )

    warm = synthetic_table(200, t, args.dup_fraction, seed=1, kind=kind, latent_dim=args.latent_dim, noise=args.noise)
    if method == "ours":  # imports and worker start-up off the clock
        near_duplicate_decisions(warm, cfg)
    elif method == "ray":
        near_duplicate_decisions_ray(ray.data.from_arrow(warm), cfg)
    else:
        imagededup_search(dict(zip(warm.column("key").to_pylist(), warm.column("phash").to_pylist())))
    base_rss = _rss_mb()
    start = time.perf_counter()
    if method == "ours":
        decisions = near_duplicate_decisions(table, cfg)
    elif method == "ray":
        decisions = near_duplicate_decisions_ray(ds, cfg)
    else:
        found = imagededup_search(encoding_map)
    seconds = time.perf_counter() - start
    peak_rss = _rss_mb()
    traced_peak = float("nan")
    if method == "ours":  # a second, untimed run under tracemalloc (it slows Python allocations)
        tracemalloc.start()
        near_duplicate_decisions(table, cfg)
        traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if method in IMAGEDEDUP:  # groups = components of imagededup's pair graph
        from curation.dedup.components import component_labels

        index = {k: i for i, k in enumerate(keys)}
        pairs = np.array([(index[a], index[b]) for a, dups in found.items() for b in dups], dtype=np.int64).reshape(
            -1, 2
        )
        labels = component_labels(n, pairs[:, 0], pairs[:, 1])
        dropped = n - len(np.unique(labels))
        digest = groups_digest(n, keys, labels)
    else:
        dropped = decisions.num_rows
        digest = decisions_digest(decisions, keys) if n <= args.digest_max else ""
    if method == "ray":
        ray.shutdown()
    counts = search_counts(table, n, kind, args) if method == "ours" else {}
    return {
        "method": method,
        "kind": kind,
        "n": n,
        "seconds": seconds,
        "dropped": int(dropped),
        "digest": digest,
        "rss_mb": peak_rss - base_rss,
        "traced_mb": traced_peak / 2**20,
        **counts,
    }


def search_counts(table, n: int, kind: str, args) -> dict:
    """The search's work in counts (load-free): distinct values, blocks and bands of the plan,
    candidate pairs (pairs sharing a band key, summed over bands: each gets a Hamming check),
    true pairs within t among the distinct values, and the accidental ones among them: true pairs
    of the same generator's values before any copy is planted (``synthetic_table`` draws them first
    from the same seed)."""
    from curation.dedup.bands import plan_bands, sample_pairs, sorted_unique
    from curation.dedup.hashing import hex_to_uint64
    from curation.dedup.near import value_edges

    t = args.max_distance
    distinct = sorted_unique(hex_to_uint64(table.column("phash")))
    plan = plan_bands(distinct, t)
    masks = plan.masks()
    unplanted = sorted_unique(hash_values(n, kind, np.random.default_rng(0), args.latent_dim, args.noise))
    return {
        "distinct": len(distinct),
        "blocks": plan.num_blocks,
        "bands": len(masks),
        "candidates": int(sample_pairs(distinct, masks)),
        "true_pairs": len(value_edges(distinct, masks, t)[0]),
        "accidental_pairs": len(value_edges(unplanted, plan_bands(unplanted, t).masks(), t)[0]),
    }


def run_child(method: str, n: int, kind: str, args) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--one",
        method,
        str(n),
        kind,
        "--max-distance",
        str(args.max_distance),
        "--dup-fraction",
        str(args.dup_fraction),
        "--latent-dim",
        str(args.latent_dim),
        "--noise",
        str(args.noise),
        "--digest-max",
        str(args.digest_max),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"{method} {kind} n={n} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(exponent k, coefficient a) of seconds = a * n^k, least squares in log-log."""
    if len(points) < 2:
        return None
    k, log_a = np.polyfit(np.log([p[0] for p in points]), np.log([p[1] for p in points]), 1)
    return float(k), float(math.exp(log_a))


def growth(results: list[dict], method: str, kind: str, sizes: list[int] | None = None) -> str | None:
    pts = sorted(
        (r["n"], r["seconds"])
        for r in results
        if r["method"] == method and r["kind"] == kind and (sizes is None or r["n"] in sizes)
    )
    if not pts:
        return None
    if len(pts) == 1:
        return f"{method:18s} {kind:16s}: one size only"
    steps = [
        f"{n1:.0e}->{n2:.0e}: n^{math.log(t2 / t1) / math.log(n2 / n1):.2f}" for (n1, t1), (n2, t2) in zip(pts, pts[1:])
    ]
    return f"{method:18s} {kind:16s}: {'; '.join(steps)}; fit over all sizes n^{fit(pts)[0]:.2f}"


def print_work_growth(results: list[dict], kinds: list[str], sizes: list[int]) -> None:
    """Growth of the search's work in counts (free of the machine's load): work = distinct values x
    bands (the band sorts) + candidate pairs (the Hamming checks), one unit each."""
    print("\nsearch work in counts (work = distinct values x bands + candidate pairs; ~ n^k):")
    for kind in kinds:
        rows = sorted(
            (
                r
                for r in results
                if r["method"] == "ours" and r["kind"] == kind and r["n"] in sizes and "candidates" in r
            ),
            key=lambda r: r["n"],
        )
        work = [(r["n"], r["distinct"] * r["bands"] + r["candidates"]) for r in rows]
        steps = [
            f"{n1:.0e}->{n2:.0e}: work {w1:.3g}->{w2:.3g} n^{math.log(w2 / w1) / math.log(n2 / n1):.2f}, "
            f"candidates n^{math.log(c2 / c1) / math.log(n2 / n1):.2f}, "
            f"accidental pairs {a1}->{a2}"
            for (n1, w1), (n2, w2), c1, c2, a1, a2 in zip(
                work,
                work[1:],
                [r["candidates"] or 1 for r in rows],
                [r["candidates"] or 1 for r in rows[1:]],
                [r["accidental_pairs"] for r in rows],
                [r["accidental_pairs"] for r in rows[1:]],
            )
        ]
        if steps:
            print(f"  ours {kind:16s}: " + "; ".join(steps))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", type=float, default=[1e4, 1e5, 1e6], help="ours, every kind")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), help="uniform, correlated, correlated:D:NOISE")
    p.add_argument("--ray-sizes", nargs="*", type=float, default=[1e4, 1e5], help="the Ray variant, uniform")
    p.add_argument(
        "--imagededup-sizes",
        nargs="*",
        type=float,
        default=[1e4, 3e4],
        help="imagededup brute_force_cython, on --imagededup-kinds",
    )
    p.add_argument("--imagededup-kinds", nargs="+", default=list(KINDS))
    p.add_argument(
        "--bktree-sizes",
        nargs="*",
        type=float,
        default=[3e3, 1e4],
        help="imagededup bktree (pure Python, slower than its brute force here), every kind",
    )
    p.add_argument("--max-distance", type=int, default=4)
    p.add_argument("--dup-fraction", type=float, default=0.1)
    p.add_argument("--latent-dim", type=int, default=8, help="correlated hashes: dimension of the latent Gaussian")
    p.add_argument(
        "--noise", type=float, default=1.0, help="correlated hashes: per-bit noise (0: fully determined by z)"
    )
    p.add_argument("--digest-max", type=float, default=1e5, help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="sizes 1e3 1e4 (ours), 1e3 3e3 (imagededup), 1e3 (bktree)")
    p.add_argument(
        "--smallest",
        action="store_true",
        help="sizes 1e3 2e3 (ours), 1e3 (imagededup brute force, uniform only), no Ray or BK-tree runs",
    )
    p.add_argument("--one", nargs=3, metavar=("METHOD", "N", "KIND"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.one[2], args)))
        return
    if args.quick:
        args.sizes, args.ray_sizes, args.imagededup_sizes, args.bktree_sizes = [1e3, 1e4], [1e3], [1e3, 3e3], [1e3]
    if args.smallest:
        args.sizes, args.ray_sizes, args.imagededup_sizes, args.bktree_sizes = [1e3, 2e3], [], [1e3], []
        args.imagededup_kinds = ["uniform"]

    sizes = [int(s) for s in args.sizes]
    print(
        f"near-duplicate search, t={args.max_distance}, {args.dup_fraction:.0%} planted copies, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start"
    )
    for kind in args.kinds:
        s = family_stats(kind, args.latent_dim, args.noise)
        _, d, nz = kind_params(kind, args.latent_dim, args.noise)
        extra = f" (latent dim {d}, noise {nz})" if kind.startswith("correlated") else ""
        print(
            f"hash family {kind}{extra}: mean |corr| between bits {s['mean_abs_bit_corr']:.3f}; "
            f"Hamming distance between unrelated hashes mean {s['dist_mean']:.1f}, sd {s['dist_sd']:.1f} "
            f"(independent uniform bits: 32.0, 4.0); bits set {s['bits_set_mean']:.1f}"
        )
    width = max(10, *map(len, args.kinds))
    print(
        f"{'method':18s} {'kind':{width}s} {'N':>9s} {'seconds':>9s} {'rss MB':>8s} {'traced MB':>9s} {'dropped':>8s}"
        f" {'B/bands':>7s} {'cand/item':>9s} {'true pairs':>10s} {'accidental':>10s}"
    )
    plan = [("ours", n, k) for k in args.kinds for n in sizes]
    plan += [("ray", int(n), "uniform") for n in args.ray_sizes if "uniform" in args.kinds]
    for method, method_sizes, kinds in (
        ("imagededup", args.imagededup_sizes, args.imagededup_kinds),
        ("imagededup-bktree", args.bktree_sizes, args.kinds),
    ):
        plan += [(method, int(n), k) for k in args.kinds if k in kinds for n in method_sizes]
    # ours at every size where imagededup runs, for the decision check
    plan[len(args.kinds) * len(sizes) : len(args.kinds) * len(sizes)] = sorted(
        {("ours", n, k) for m, n, k in plan if m in IMAGEDEDUP} - {("ours", n, k) for k in args.kinds for n in sizes}
    )
    results = []
    for method, n, kind in plan:
        r = run_child(method, n, kind, args)
        results.append(r)
        counts = (
            f" {r['blocks']:>3d}/{r['bands']:<3d} {r['candidates'] / n:9.2f} {r['true_pairs']:10d} "
            f"{r['accidental_pairs']:10d}"
            if "candidates" in r
            else ""
        )
        print(
            f"{method:18s} {kind:{width}s} {n:9d} {r['seconds']:9.2f} {r['rss_mb']:8.0f} {r['traced_mb']:9.0f} "
            f"{r['dropped']:8d}{counts}",
            flush=True,
        )

    print("\ndecisions check (same hashes, same threshold):")
    checked = 0
    for r in (r for r in results if r["method"] in IMAGEDEDUP):
        ours = next(o for o in results if o["method"] == "ours" and o["n"] == r["n"] and o["kind"] == r["kind"])
        same = ours["dropped"] == r["dropped"] and ours["digest"] == r["digest"]
        print(
            f"  {r['kind']:10s} n={r['n']:>6d}: dropped ours={ours['dropped']} {r['method']}={r['dropped']}, "
            f"groups digest ours={ours['digest']} {r['method']}={r['digest']}: {'equal' if same else 'DIFFERENT'}"
        )
        assert same, f"ours and {r['method']} disagree on {r['kind']} n={r['n']}"
        checked += 1
    print(f"  {checked} comparisons, all equal")

    print("\ngrowth (seconds ~ n^k; ours over --sizes only, its extra runs below are for the check):")
    for method in ("ours", "ray", *IMAGEDEDUP):
        for kind in args.kinds:
            line = growth(results, method, kind, sizes if method == "ours" else None)
            if line:
                print("  " + line)
    print_work_growth(results, args.kinds, sizes)
    by = lambda m, k: sorted((r["n"], r["seconds"]) for r in results if r["method"] == m and r["kind"] == k)  # noqa: E731
    for kind in args.kinds:
        ours = dict(by("ours", kind))
        for method in IMAGEDEDUP:
            pts = by(method, kind)
            f = fit(pts)
            for n in sizes:
                if n in dict(pts):
                    print(
                        f"  {kind:16s} n={n:>8d}: {method} {dict(pts)[n]:.2f} s measured, ours {ours[n]:.2f} s: "
                        f"ours is {dict(pts)[n] / ours[n]:.0f}x faster"
                    )
                elif f and n > max(dict(pts)):
                    est = f[1] * n ** f[0]
                    print(
                        f"  {kind:16s} n={n:>8d}: {method} ~{est:,.0f} s EXTRAPOLATED (fit a*n^{f[0]:.2f} to its "
                        f"runs at {', '.join(f'{m:.0e}' for m, _ in pts)}), ours {ours[n]:.2f} s measured"
                    )
    if "uniform" in args.kinds:
        for n in sizes:
            t = {
                k: next(r["seconds"] for r in results if r["method"] == "ours" and r["kind"] == k and r["n"] == n)
                for k in args.kinds
            }
            print(
                f"  ours at n={n:>8d}: time / uniform time: "
                + ", ".join(f"{k} {t[k] / t['uniform']:.2f}" for k in args.kinds if k != "uniform")
            )


if __name__ == "__main__":
    main()
