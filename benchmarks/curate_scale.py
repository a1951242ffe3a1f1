"""Scale simulation of curation's global steps: metadata-only corpora of 1e5-1e7 rows.

    python benchmarks/curate_scale.py --sizes 1e5 1e6          # during development
    python benchmarks/curate_scale.py --sizes 1e5 1e6 1e7      # the issue's three sizes
    python benchmarks/curate_scale.py --smallest               # 2e3 rows only (the smoke test's run)

Each size runs in a fresh process (so its driver peak RSS is its own) on a local Ray cluster
(``--cpus``, default 2). The corpus is staged as a run's scoring leaves it (``_staging/<pid>/``
Parquet parts, ``--rows-per-partition`` rows each, no image bytes) with:

- 64-bit hashes and mirror hashes from ``benchmarks/dedup_scaling.py``'s generators
  (``--hashes``): ``uniform`` (fair-coin bits, the default) or ``correlated`` (the over-
  concentrated stress family: accidental pairs grow as n^2). Neither models real PHashes (their
  DC bit is always set); a family drawn from real image content comes with a later change;
- planted exact duplicates (a pool of n / 40 digests; ``--exact``), near duplicates (one of
  n / 20 originals with 0..4 bits flipped; ``--near``: families of ~2 copies at every size) and
  blank images (the all-zero hash, 0..2 bits flipped; ``--blank``: one near-dup group);
- 3% rows already ended by an earlier stage (a reason) and 1% undecodable.

Then the global steps, timed one by one, as ``curation.pipeline`` runs them with
``dedup.engine=ray``: exact dedup (one shuffle by SHA-256), near dedup (outer-block shuffle,
banded search, connected components by star rounds, representatives) with the partitioned
near-dup index a later incremental run searches (its write is timed where the near step calls
``curation.dedup.steps.write_near_index``, which this script wraps; included in the near step's
time and printed apart), each partition's manifest part written with its decisions (the shard
writer less the tar), stats and the dataset version id from per-part summaries. The driver's
peak RSS is sampled every 50 ms (psutil) and read from ``getrusage``; growth exponents
log(t2/t1)/log(n2/n1) are printed between sizes. The baseline in the same run: the in-process
near search (``near_duplicate_decisions``) on the same hashes up to ``--local-max``, and the
ratio of the distributed near step to it. Results: docs/results/scale.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from dedup_scaling import KINDS  # this script's folder is on sys.path: the hash generators live there

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PeakRss:
    """The driver process's peak RSS, polled (psutil) while the block runs."""

    def __init__(self) -> None:
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()

    def __enter__(self):
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join()


def corpus_part(n: int, start: int, pid: str, args, rng: np.random.Generator):
    """``n`` staged rows of partition ``pid`` (keys from ``start``)."""
    import pyarrow as pa
    from dedup_scaling import hash_values

    from curation.dedup.hashing import uint64_to_hex

    values = hash_values(n, args.hashes, rng)
    mirrors = hash_values(n, args.hashes, rng)
    originals = max(4096, args.total // 20)  # the pool grows with the corpus: families of ~2 copies
    bases = hash_values(originals, args.hashes, np.random.default_rng(99))  # originals the copies come from
    u = rng.random(n)
    near = u < args.near
    blank = (u >= args.near) & (u < args.near + args.blank)
    values[near] = bases[rng.integers(0, len(bases), near.sum())]
    values[blank] = 0
    for k in range(4):  # 0..4 bits flipped (0..2 for blanks)
        flip = (near & (rng.integers(0, 5, n) > k)) | (blank & (rng.integers(0, 3, n) > k))
        values[flip] ^= np.uint64(1) << rng.integers(0, 64, flip.sum()).astype(np.uint64)
    sha = rng.integers(0, 2**63, n)
    exact = rng.random(n) < args.exact
    sha[exact] = rng.integers(0, max(4096, args.total // 40), exact.sum())  # copies across partitions
    reasons = np.where(rng.random(n) < 0.03, "too_small", None)
    return pa.table(
        {
            "key": [f"{pid}-{start + i:09d}" for i in range(n)],
            "partition": [pid] * n,
            "sha256": [f"{s:064x}" for s in sha],
            "phash": uint64_to_hex(values),
            "phash_mirror": uint64_to_hex(mirrors),
            "width": rng.choice([320, 640, 1024], n).astype(np.int32),
            "height": np.full(n, 480, np.int32),
            "input_bytes": rng.integers(10_000, 400_000, n),
            "decode_ok": rng.random(n) > 0.01,
            "reason": pa.array(reasons.tolist(), pa.string()),
            "status": pa.nulls(n, pa.string()),
            "notes": pa.array([None] * n, pa.list_(pa.string())),
        }
    )


def stage_corpus(root: str, n: int, args) -> list[str]:
    from curation import staging
    from infra import storage

    args.total = n

    fs, path = storage.resolve(root)
    pids = []
    for i, start in enumerate(range(0, n, args.rows_per_partition)):
        pid = f"p{i:05d}"
        rows = min(args.rows_per_partition, n - start)
        table = corpus_part(rows, start, pid, args, np.random.default_rng(i))
        staging.write_parts(fs, path, table)
        staging.write_listing(fs, path, pid, table.column("key").to_pylist())
        pids.append(pid)
    return pids


def write_manifest_part(row: dict, uri: str, columns: list[str]) -> dict:
    """What the shard writer does for one partition, less the tar: decisions applied, manifest part."""
    from curation import output, staging, writer
    from curation.dedup.distributed import partition_decisions
    from infra import storage

    fs, root = storage.resolve(uri)
    rows = staging.read_partition_rows(fs, root, row["pid"], columns)
    table = writer.apply_decisions(rows, partition_decisions(fs, root, row["pid"]))
    storage.write_parquet(fs, output.manifest_part_path(root, row["pid"]), table)
    return {"pid": row["pid"], "rows": table.num_rows}


def global_steps(root: str, pids: list[str], args) -> dict:
    """The global steps on the staged corpus; seconds per step."""
    import ray.data

    from curation import schema
    from curation.dedup import steps as steps_module
    from curation.dedup.distributed import GlobalDedupInput, write_near_index
    from curation.dedup.near import NearDupConfig
    from curation.dedup.steps import DedupContext, ExactDedup, ExactDupConfig, NearDedup, run_global_dedup
    from curation.output import CuratedOutput
    from curation.stats import SUMMARY_COLUMNS, manifest_counts, merge_counts
    from curation.versions import combine_digests, partition_digest

    seconds = {}
    columns = ("key", "partition", "sha256", "width", "height", "input_bytes", "phash", "phash_mirror")
    inp = GlobalDedupInput(root, tuple(pids), columns)
    ctx = DedupContext(engine="ray")
    headers = []

    def timed_index(*a, **kw) -> dict:  # the real writer, timed where the near step calls it
        t0 = time.perf_counter()
        headers.append(write_near_index(*a, **kw))
        seconds["near_index"] = time.perf_counter() - t0
        return headers[-1]

    if not hasattr(steps_module, "write_near_index"):
        raise RuntimeError("curation.dedup.steps no longer has write_near_index: update this benchmark's timing")
    steps_module.write_near_index = timed_index
    try:
        for step in (ExactDedup(ExactDupConfig()), NearDedup(NearDupConfig(max_distance=4))):
            t = time.perf_counter()
            dropped = run_global_dedup([step], inp, ctx)
            seconds[step.name] = time.perf_counter() - t
            seconds[f"{step.name}_dropped"] = dropped[step.name]
            inp = GlobalDedupInput(root, tuple(pids), columns, earlier_steps=(*inp.earlier_steps, step.name))
    finally:
        steps_module.write_near_index = write_near_index
    if not headers:
        raise RuntimeError("the near step no longer calls curation.dedup.steps.write_near_index: update this benchmark")
    header = headers[-1]
    seconds["near_index_blocks"] = header["num_blocks"]
    seconds["near_index_bands"] = len(header["masks"])
    seconds["near_index_postings"] = sum(p["postings"] for p in header["parts"])
    t = time.perf_counter()
    read = [*columns, "decode_ok", "reason", "status", "notes"]
    ray.data.from_items([{"pid": p} for p in pids], override_num_blocks=min(len(pids), 64)).map(
        write_manifest_part, fn_kwargs={"uri": root, "columns": read}
    ).take_all()
    seconds["write_manifest"] = time.perf_counter() - t
    t = time.perf_counter()
    out = CuratedOutput.at(root)

    def summarise(row: dict) -> dict:
        part = CuratedOutput.at(root).read_part(row["path"], SUMMARY_COLUMNS)
        return {"pid": row["pid"], "counts": json.dumps(manifest_counts(part)), "digest": partition_digest(part)}

    from curation.output import part_id

    rows = (
        ray.data.from_items(
            [{"pid": part_id(f), "path": f} for f in out.manifest_files()], override_num_blocks=min(len(pids), 64)
        )
        .map(summarise)
        .take_all()
    )
    counts = merge_counts({k: v for k, v in json.loads(r["counts"]).items()} for r in rows)
    version = combine_digests({r["pid"]: r["digest"] for r in rows}, "bench", "bench")
    seconds["stats_and_version"] = time.perf_counter() - t
    seconds["global_total"] = sum(
        seconds[k] for k in ("exact_dedup", "near_dedup", "write_manifest", "stats_and_version")
    )
    seconds["kept"] = counts["status"].get(schema.KEPT, 0)
    seconds["version"] = version
    return seconds


def local_near(root: str, pids: list[str]) -> float:
    """Baseline in the same run: the in-process near search over the same candidates."""
    import pyarrow as pa

    from curation import staging
    from curation.dedup.near import NearDupConfig, near_duplicate_decisions
    from infra import storage

    fs, path = storage.resolve(root)
    tables = [
        staging.read_partition_rows(fs, path, p, ["key", "phash", "phash_mirror", "width", "height"]) for p in pids
    ]
    table = pa.concat_tables(tables)
    t = time.perf_counter()
    near_duplicate_decisions(table, NearDupConfig(max_distance=4))
    return time.perf_counter() - t


def measure(n: int, args) -> dict:
    import logging

    import ray

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ray").setLevel(logging.WARNING)
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.data.DataContext.get_current().print_on_execution_start = False
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as root:
        t = time.perf_counter()
        pids = stage_corpus(root, n, args)
        staged = time.perf_counter() - t
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with PeakRss() as rss:
            seconds = global_steps(root, pids, args)
        seconds.update(
            n=n,
            partitions=len(pids),
            staging_s=staged,
            peak_rss_mb=rss.peak / 2**20,
            maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            rss_before_mb=base,
        )
        if n <= args.local_max:
            seconds["local_near_s"] = local_near(root, pids)
    ray.shutdown()
    return seconds


def exponent(a: dict, b: dict, key: str) -> float:
    return math.log(b[key] / a[key]) / math.log(b["n"] / a["n"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6])
    p.add_argument("--rows-per-partition", type=int, default=100_000)
    p.add_argument("--exact", type=float, default=0.05)
    p.add_argument("--near", type=float, default=0.10)
    p.add_argument("--blank", type=float, default=0.01)
    p.add_argument(
        "--hashes",
        default="uniform",
        choices=KINDS,
        help="hash generator of benchmarks/dedup_scaling.py: uniform (fair-coin bits, default) or correlated "
        "(the over-concentrated stress family); neither models real PHashes, whose DC bit is always set: a "
        "family drawn from real image content comes with a later change",
    )
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--local-max", type=float, default=1e6, help="the in-process near search up to this size")
    p.add_argument("--workdir", default=None, help="where the staged corpus goes (default: the temp dir)")
    p.add_argument("--smallest", action="store_true", help="size 2e3 only, 1,000 rows per partition")
    p.add_argument("--one", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smallest:
        args.sizes, args.rows_per_partition = [2e3], 1000
    if args.one:
        print(json.dumps(measure(int(args.one), args)))
        return
    print(
        f"curation global steps at scale: {os.cpu_count()} CPUs, Ray on {args.cpus}, load average "
        f"{os.getloadavg()[0]:.1f} at start; {args.rows_per_partition} rows per partition; {args.hashes} hashes"
    )
    results = []
    for n in [int(s) for s in args.sizes]:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--one",
            str(n),
            "--rows-per-partition",
            str(args.rows_per_partition),
            "--exact",
            str(args.exact),
            "--near",
            str(args.near),
            "--blank",
            str(args.blank),
            "--cpus",
            str(args.cpus),
            "--local-max",
            str(args.local_max),
            "--hashes",
            args.hashes,
        ]
        cmd += ["--workdir", args.workdir] if args.workdir else []
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
        if out.returncode or not lines:
            raise SystemExit(f"n={n} failed:\n{out.stderr[-4000:]}")
        r = json.loads(lines[-1])
        results.append(r)
        print(
            f"n={n:>10,d}: global steps {r['global_total']:8.1f} s (exact {r['exact_dedup']:.1f}, near "
            f"{r['near_dedup']:.1f} of which index {r['near_index']:.1f}: B={r['near_index_blocks']}, {r['near_index_bands']} bands, "
            f"{r['near_index_postings']:,} postings; manifest {r['write_manifest']:.1f}, stats+version {r['stats_and_version']:.1f}); "
            f"dropped exact {r['exact_dedup_dropped']:,} near {r['near_dedup_dropped']:,}, kept {r['kept']:,}; "
            f"driver peak RSS {r['peak_rss_mb']:.0f} MB (getrusage max {r['maxrss_mb']:.0f} MB); staging "
            f"{r['staging_s']:.1f} s; load {os.getloadavg()[0]:.1f}"
            + (
                f"; baseline in-process near search {r['local_near_s']:.1f} s (near step / baseline "
                f"{r['near_dedup'] / r['local_near_s']:.1f}x)"
                if "local_near_s" in r
                else ""
            ),
            flush=True,
        )
    for a, b in zip(results, results[1:]):
        print(
            f"{a['n']:.0e} -> {b['n']:.0e}: global steps n^{exponent(a, b, 'global_total'):.2f}, near dedup "
            f"n^{exponent(a, b, 'near_dedup'):.2f} (index n^{exponent(a, b, 'near_index'):.2f}), exact n^{exponent(a, b, 'exact_dedup'):.2f}; driver peak RSS "
            f"x{b['peak_rss_mb'] / a['peak_rss_mb']:.2f}"
        )
    if len(results) > 1:
        first, last = results[0], results[-1]
        print(
            f"driver peak RSS at {last['n']:.0e} / at {first['n']:.0e}: {last['peak_rss_mb'] / first['peak_rss_mb']:.2f} "
            "(target <= 1.5)"
        )


if __name__ == "__main__":
    main()
