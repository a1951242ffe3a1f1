"""Shard layouts of a simulated run: one shard per input partition against mixed shards of N.

P partitions of ``--per-partition`` inputs keep a binomial(``--keep``) share each; the mixed
layout (``curation.sharding.Layout``, the placement the pipeline uses) places the kept samples
in shards of N. Prints, for both layouts, the shard sizes and how many input partitions feed a
shard (and the most samples one partition gives one shard), and the placement's CPU time.
Only the placement runs: no images, no Ray.

    .venv/bin/python benchmarks/shard_layout.py --partitions 1000 --per-partition 1000 --keep 0.18 --samples-per-shard 1000

Results: docs/results/sharding.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from curation.sharding import Layout, first_numbers


def describe(name: str, shard_of: np.ndarray, part_of: np.ndarray) -> str:
    sizes = np.bincount(shard_of)
    order = np.argsort(shard_of, kind="stable")
    groups = np.split(part_of[order], np.cumsum(sizes)[:-1])
    distinct = [len(np.unique(g)) for g in groups]
    most = [int(np.bincount(g).max()) for g in groups]
    return (
        f"{name:<14} shards={len(sizes):>6}  size min/median/max={sizes.min()}/{int(np.median(sizes))}/{sizes.max()}"
        f"  last={sizes[-1]}  partitions per shard min/median/max={min(distinct)}/{int(np.median(distinct))}/"
        f"{max(distinct)}  most from one partition: median {int(np.median(most))}, max {max(most)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--per-partition", type=int, default=1000)
    ap.add_argument("--keep", type=float, default=0.18)
    ap.add_argument("--samples-per-shard", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    kept = {f"{p:06d}": int(k) for p, k in enumerate(rng.binomial(args.per_partition, args.keep, args.partitions))}
    counts = np.array([kept[p] for p in sorted(kept)])
    part_of = np.repeat(np.arange(args.partitions), counts)
    layout, firsts = Layout(args.samples_per_shard, int(counts.sum()), args.seed), first_numbers(kept)
    t = time.process_time()
    mixed = np.concatenate([layout.place(firsts[p], n)[0] for p, n in sorted(kept.items())])
    seconds = time.process_time() - t
    print(f"kept {counts.sum()} of {args.partitions * args.per_partition} in {args.partitions} partitions")
    print(describe("per partition", part_of, part_of))
    print(describe(f"mixed N={args.samples_per_shard}", mixed, part_of))
    print(f"placement: {seconds:.3f} CPU s ({1e9 * seconds / counts.sum():.0f} ns per sample)")


if __name__ == "__main__":
    main()
