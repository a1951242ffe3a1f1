"""Incremental near dedup against a partitioned index vs loading the whole index (today's baseline).

An index of N synthetic rows (benchmarks/dedup_scaling.synthetic_table) is written partitioned
(curation.dedup.index_store, P buckets); batches of b new rows (near copies of indexed rows
and fresh ones) are decided (a) reading only the buckets their band keys touch and (b) loading
the whole index into memory first. Prints files, bytes and rows read (what the driver holds)
and wall time of each, and checks the decisions are equal.

    .venv/bin/python benchmarks/near_index_partial.py --n 200000 --batches 100 10000

Results: docs/results/near_index.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import pyarrow as pa
import pyarrow.fs as pafs
from dedup_scaling import synthetic_table  # this script's folder is first on sys.path

from curation.dedup.incremental import NearDupIndex, incremental_decisions
from curation.dedup.index_store import PartitionedNearIndex, save_index
from curation.dedup.near import DedupNearConfig, near_duplicate_decisions


def measured(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--batches", type=int, nargs="+", default=[100, 10_000])
    ap.add_argument("--buckets", type=int, default=None, help="P (default: index_store.default_buckets)")
    args = ap.parse_args()
    cfg = DedupNearConfig(match_mirrored=False)
    table = synthetic_table(args.n + max(args.batches), cfg.max_distance, 0.3, seed=1)
    old = table.slice(0, args.n)
    fs = pafs.LocalFileSystem()
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        save_index(NearDupIndex.build(old, cfg, near_duplicate_decisions(old, cfg)), fs, d, num_buckets=args.buckets)
        total_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs_ in os.walk(d) for f in fs_)
        print(
            f"index: {args.n} rows, P={PartitionedNearIndex.open(fs, d).header['num_buckets']}, written in {time.perf_counter() - t0:.1f} s, "
            f"{total_bytes / 2**20:.1f} MiB"
        )
        for b in args.batches:
            new = table.slice(args.n, b)
            index = PartitionedNearIndex.open(fs, d)
            part, t_part = measured(lambda index=index, new=new: index.decisions(new, cfg))
            opened = set(index.opened)
            read = sum(os.path.getsize(p) for p in opened)
            rows_read = index.rows_read
            whole, t_whole = measured(
                lambda new=new: incremental_decisions(new, PartitionedNearIndex.open(fs, d).load(), cfg)
            )
            assert part.equals(whole)
            print(
                f"batch {b:>6}: {part.num_rows} dropped (equal: {part.equals(whole)}); partitioned: "
                f"{len(opened)}/{index.num_files} files, {read / 2**20:.2f}/{total_bytes / 2**20:.1f} MiB, "
                f"{rows_read} rows streamed, held at most {index.largest_file} (one file) + {index.reached} reached rows, "
                f"{t_part:.2f} s | whole index: {args.n} rows held, {t_whole:.2f} s "
                f"| ratios: held {args.n / (index.largest_file + index.reached):.1f}x, time {t_whole / t_part:.2f}x"
            )


if __name__ == "__main__":
    pa.set_cpu_count(1)
    main()
