"""Scaling of the near-duplicate search: time and peak memory for N synthetic 64-bit hashes.

    python benchmarks/dedup_scaling.py                       # sizes 1e4 1e5 1e6
    python benchmarks/dedup_scaling.py --sizes 1e4 3e4 --ray-sizes 1e4 --imagededup-max 1e4
    python benchmarks/dedup_scaling.py --accuracy            # real-photo accuracy table only

Hashes are uniform random 64-bit values; a fraction (``--dup-fraction``) are copies of an
earlier hash with 0..t bits flipped, so the planted groups are known. Each measurement runs
in a fresh subprocess: time is the wall time of the search call (hex parsing, banded search,
components and decision rows); "rss MB" is the process's peak RSS above its level after
imports, data generation and a warm-up call on 200 rows (0 when the search stays below that
level); "traced MB" is the tracemalloc peak of numpy and Python allocations, from a second,
untimed run (ours only: tracemalloc slows Python-heavy code several-fold). The Ray variant
runs on an in-process Ray (2 CPUs, the input in 8 blocks) started before the clock; its
memory column is the driver's only. imagededup's ``find_duplicates`` (brute_force_cython, one process) runs up to
``--imagededup-max`` hashes: it is quadratic (31 s at 1e4 and 326 s at 3e4 on this 2-core
machine), so larger sizes are skipped with a quadratic extrapolation. Where both ran, the
number of dropped rows must agree (groups = components of imagededup's pairs).
The growth exponent between sizes is log(time ratio) / log(size ratio).
"""
from __future__ import annotations

import argparse
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
sys.path.insert(0, ROOT)


def synthetic_table(n: int, max_distance: int, dup_fraction: float, seed: int = 0):
    import pyarrow as pa

    from curation.dedup.hashing import uint64_to_hex

    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**64, n, dtype=np.uint64)
    is_copy = rng.random(n) < dup_fraction
    copies, originals = np.flatnonzero(is_copy), np.flatnonzero(~is_copy)
    copied = values[originals[rng.integers(0, len(originals), len(copies))]]
    flips = rng.integers(0, max_distance + 1, len(copies))  # 0..t bits (a repeated bit flips back)
    for k in range(max_distance):
        bit = np.uint64(1) << rng.integers(0, 64, len(copies)).astype(np.uint64)
        copied = np.where(flips > k, copied ^ bit, copied)
    values[copies] = copied
    return pa.table({
        "key": [f"k{i:09d}" for i in range(n)],
        "phash": uint64_to_hex(values),
        "width": rng.choice([320, 640, 1024], n).astype(np.int32),
        "height": np.full(n, 480, dtype=np.int32),
        "person_score_max": pa.array(rng.random(n), pa.float32()),
    })


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_one(method: str, n: int, max_distance: int, dup_fraction: float) -> dict:
    """Run one (method, size) in this process and return its figures."""
    import warnings

    warnings.filterwarnings("ignore")
    from curation.dedup.near import NearDupConfig, near_duplicate_decisions, near_duplicate_decisions_ray

    table = synthetic_table(n, max_distance, dup_fraction)
    cfg = NearDupConfig(max_distance=max_distance, match_mirrored=False)
    if method == "ray":
        import ray
        import ray.data

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        ds = ray.data.from_arrow(table).repartition(8).materialize()
    if method == "imagededup":
        from imagededup.methods import PHash

        encoding_map = dict(zip(table.column("key").to_pylist(), table.column("phash").to_pylist()))
    warm = synthetic_table(200, max_distance, dup_fraction, seed=1)  # imports and worker start-up off the clock
    if method == "ours":
        near_duplicate_decisions(warm, cfg)
    elif method == "ray":
        near_duplicate_decisions_ray(ray.data.from_arrow(warm), cfg)
    else:
        from curation.dedup.components import component_labels  # noqa: F401
        PHash(verbose=False).find_duplicates(encoding_map=dict(zip(warm.column("key").to_pylist(),
                                                                   warm.column("phash").to_pylist())),
                                             max_distance_threshold=max_distance, num_dist_workers=0)
    base_rss = _rss_mb()
    start = time.perf_counter()
    if method == "ours":
        dropped = near_duplicate_decisions(table, cfg).num_rows
    elif method == "ray":
        dropped = near_duplicate_decisions_ray(ds, cfg).num_rows
    else:
        found = PHash(verbose=False).find_duplicates(encoding_map=encoding_map, max_distance_threshold=max_distance,
                                                     num_dist_workers=0)
    seconds = time.perf_counter() - start
    peak_rss = _rss_mb()
    traced_peak = float("nan")
    if method == "ours":  # a second, untimed run under tracemalloc (it slows Python allocations)
        tracemalloc.start()
        near_duplicate_decisions(table, cfg)
        traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if method == "imagededup":  # dropped rows = rows - components of imagededup's pair graph
        from curation.dedup.components import component_labels

        index = {k: i for i, k in enumerate(encoding_map)}
        pairs = np.array([(index[a], index[b]) for a, dups in found.items() for b in dups], dtype=np.int64).reshape(-1, 2)
        dropped = n - len(np.unique(component_labels(n, pairs[:, 0], pairs[:, 1])))
    if method == "ray":
        ray.shutdown()
    return {"method": method, "n": n, "seconds": seconds, "dropped": int(dropped),
            "rss_mb": peak_rss - base_rss, "traced_mb": traced_peak / 2**20}


def run_child(method: str, n: int, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, str(n), "--max-distance",
           str(args.max_distance), "--dup-fraction", str(args.dup_fraction)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"{method} n={n} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def growth(results: list[dict], method: str) -> str:
    pts = sorted((r["n"], r["seconds"]) for r in results if r["method"] == method)
    steps = [f"{math.log(t2 / t1) / math.log(n2 / n1):.2f}" for (n1, t1), (n2, t2) in zip(pts, pts[1:])]
    if len(pts) > 1:
        slope = np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0]
        return f"{method}: exponent between sizes {', '.join(steps)}; fit over all sizes {slope:.2f}"
    return f"{method}: one size only"


def print_accuracy() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    # The accuracy test's real photos and its ground truth / metrics live next to that test.
    sys.path.insert(0, os.path.join(ROOT, "tests", "curation", "dedup"))
    import dedup_fixtures as fixtures
    from dedup_accuracy import compare_with_imagededup

    print("accuracy on real near-duplicates (pairwise; 16 photos x 9 variants + 64 distinct tiles)")
    print(f"{'method':10s} {'t':>3s} {'precision':>9s} {'recall':>7s} {'f1':>6s}  recall by variant")
    for r in compare_with_imagededup(fixtures.real_photos(), [2, 4, 6, 8, 10]):
        by_variant = " ".join(f"{k}={v:.2f}" for k, v in r["recall_by_variant"].items())
        print(f"{r['method']:10s} {r['max_distance']:3d} {r['precision']:9.3f} {r['recall']:7.3f} {r['f1']:6.3f}  {by_variant}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    p.add_argument("--ray-sizes", nargs="*", type=float, default=[1e4, 1e5])
    p.add_argument("--imagededup-max", type=float, default=1e4)
    p.add_argument("--max-distance", type=int, default=4)
    p.add_argument("--dup-fraction", type=float, default=0.1)
    p.add_argument("--accuracy", action="store_true", help="print the real-photo accuracy table and exit")
    p.add_argument("--one", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.max_distance, args.dup_fraction)))
        return
    if args.accuracy:
        print_accuracy()
        return

    sizes = [int(s) for s in args.sizes]
    print(f"near-duplicate search, t={args.max_distance}, {args.dup_fraction:.0%} planted copies, "
          f"{os.cpu_count()} CPUs")
    print(f"{'method':10s} {'N':>9s} {'seconds':>9s} {'rss MB':>8s} {'traced MB':>9s} {'dropped':>8s}")
    results = []
    plan = [("ours", n) for n in sizes] + [("ray", int(n)) for n in args.ray_sizes] \
        + [("imagededup", n) for n in sizes if n <= args.imagededup_max]
    for method, n in plan:
        r = run_child(method, n, args)
        results.append(r)
        print(f"{method:10s} {n:9d} {r['seconds']:9.2f} {r['rss_mb']:8.0f} {r['traced_mb']:9.0f} {r['dropped']:8d}",
              flush=True)
    ref = [r for r in results if r["method"] == "imagededup"]
    for r in ref:
        ours = next(o for o in results if o["method"] == "ours" and o["n"] == r["n"])
        print(f"check n={r['n']}: dropped rows ours={ours['dropped']} imagededup={r['dropped']} "
              f"{'equal' if ours['dropped'] == r['dropped'] else 'DIFFERENT'}")
    if ref:
        largest = max(ref, key=lambda r: r["n"])
        for n in sizes:
            if n > args.imagededup_max:
                print(f"imagededup skipped at N={n}: quadratic, ~{largest['seconds'] * (n / largest['n']) ** 2:,.0f} s "
                      "extrapolated from its largest run")
    for method in ("ours", "ray", "imagededup"):
        if any(r["method"] == method for r in results):
            print(growth(results, method))


if __name__ == "__main__":
    main()
