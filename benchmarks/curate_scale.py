"""Scale simulation of curation's global steps: metadata-only corpora of 1e5-1e7 rows.

    python benchmarks/curate_scale.py --sizes 1e5 1e6          # during development
    python benchmarks/curate_scale.py --sizes 1e5 1e6 1e7      # the issue's three sizes
    python benchmarks/curate_scale.py --smallest               # 2e3 rows only (the smoke test's run)

Each size runs in a fresh process (so its driver peak RSS is its own; a single size runs in this one) on a local Ray cluster
(``--cpus``, default 2; ``--shuffle`` as ``ray.shuffle``). A version V of n rows is staged as pass 1 leaves it (``_staging/<pid>/``
Parquet parts, ``--rows-per-partition`` rows each, a 6-byte placeholder for pixels) with 64-bit hashes and mirror
hashes from ``benchmarks/dedup_scaling.py`` (``--hashes``: ``stress``, correlated bits with blank
images' real hashes, the default; ``real``, the pipeline's PHashes of views of real photos; or
``uniform`` / ``correlated``), planted exact duplicates (a pool
of n / 40 digests; ``--exact``), near duplicates (one of n / 20 originals, 0..4 bits flipped;
``--near``), blank images (the zero hash, 0..2 bits; ``--blank``), 64-d unit embeddings with planted
semantic copies (one of n / 20 originals plus noise, cosine ~0.9995; ``--semantic``), 3% rows
already ended and 1% undecodable. Then a later batch B of n / 10 rows drawn the same way (so its
copies meet V's originals) is deduplicated against V (``dedup.against``).

The global steps run through the pipeline's own ``curation.passes.global_dedup`` with
``dedup.engine=ray``, timed one by one: on V exact dedup, near dedup (with the partitioned
near-dup index it writes) and semantic dedup (k-means on a bounded sample in a task, cosine pairs
in block-pair units), then the shards (``curation.finish.write_shards``: the seeded placement into shards of
``--samples-per-shard``, one shuffle, tars and sidecars) with the manifest parts naming them, and
stats + version id (``curation.finish.summarise_manifest``); on B exact, near (the Ray join of B's band
keys with V's index buckets, and V's index extended) and semantic dedup (against V's kept
embeddings, then within B). The driver's peak RSS over all of them is sampled every 50 ms
(psutil); growth exponents log(t2/t1)/log(n2/n1) are printed between sizes, wall and CPU time
(the driver's and every Ray worker's, ``--cpus`` processes' CPU from ``/proc``). Baselines in the
same run: the in-process near search up to ``--local-max``, and up to ``--check-max`` the local
engine's semantic, incremental near and semantic-against decisions, which must equal Ray's.
Results: docs/results/scale.md.
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
EMBEDDING_DIM = 64


class PeakRss:
    """The driver process's peak RSS, polled (psutil) while the block runs; every 0.2 s it also
    samples the CPU time of the processes the driver started (``cpu_seconds``)."""

    def __init__(self) -> None:
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()

    def __enter__(self):
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        ticks = 0
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            ticks += 1
            if ticks % 4 == 0:
                _sample_cpu()
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join()


_CPU: dict = {}  # (pid, start time) -> its latest CPU seconds: a Ray worker that exits keeps its last sample
_CPU_LOCK = threading.Lock()


def _sample_cpu() -> None:
    import psutil

    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            key = (proc.pid, proc.create_time())
        except psutil.Error:
            continue
        with _CPU_LOCK:
            _CPU[key] = t.user + t.system  # children_* left out: a reaped worker counts once, as sampled


def cpu_seconds() -> float:
    """CPU seconds of this process and every process it started (the local Ray cluster: raylet,
    GCS, workers), each as last sampled: a worker that ended since counts what it had used up to
    its last sample (0.2 s apart while ``PeakRss`` runs)."""
    _sample_cpu()
    with _CPU_LOCK:
        return sum(_CPU.values())


def unit_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((n, EMBEDDING_DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def embeddings(n: int, args, rng: np.random.Generator) -> np.ndarray:
    """64-d unit rows; a fraction ``args.semantic`` are copies of one of n / 20 originals plus noise."""
    x = unit_rows(n, rng)
    originals = unit_rows(max(4096, args.total // 20), np.random.default_rng(98))
    copy = rng.random(n) < args.semantic
    x[copy] = originals[rng.integers(0, len(originals), copy.sum())]
    x[copy] += rng.normal(scale=0.004, size=(copy.sum(), EMBEDDING_DIM)).astype(np.float32)
    return x


def corpus_part(n: int, start: int, pid: str, args, rng: np.random.Generator):
    """``n`` staged rows of partition ``pid`` (keys from ``start``)."""
    import pyarrow as pa
    from dedup_scaling import hash_pairs

    from curation.dedup.hashing import uint64_to_hex

    values, mirrors = hash_pairs(n, args.hashes, rng)
    originals = max(4096, args.total // 20)  # the pool grows with the corpus: families of ~2 copies
    bases = hash_pairs(originals, args.hashes, np.random.default_rng(99))[0]  # originals the copies come from
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
    sha[exact] = rng.integers(0, max(16, args.total // 40), exact.sum())  # ~2 copies a digest, across partitions
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
            "converted": np.zeros(n, bool),
            "clip_embedding": pa.array(list(embeddings(n, args, rng)), pa.list_(pa.float32())),
            "decode_ok": rng.random(n) > 0.01,
            "reason": pa.array(reasons.tolist(), pa.string()),
            "status": pa.nulls(n, pa.string()),
            "notes": pa.array([None] * n, pa.list_(pa.string())),
            # No pixels: a placeholder of a few bytes per sample, so the shards are written for real.
            "image": pa.array([b"px" + i.to_bytes(4, "little") for i in range(start, start + n)], pa.binary()),
            "image_ext": pa.array(["jpg"] * n, pa.string()),
        }
    )


def stage_corpus(root: str, n: int, args, prefix: str = "p", seed: int = 0) -> list[str]:
    """``n`` rows staged under ``root``; partitions ``<prefix><i>``, seeded ``seed + i``. The pools
    the copies come from depend on ``args.total`` only, so a later batch's copies meet V's."""
    from curation import staging
    from infra import storage

    fs, path = storage.resolve(root)
    pids = []
    for i, start in enumerate(range(0, n, args.rows_per_partition)):
        pid = f"{prefix}{i:05d}"
        rows = min(args.rows_per_partition, n - start)
        table = corpus_part(rows, start, pid, args, np.random.default_rng(seed + i))
        staging.write_parts(fs, path, table)
        staging.write_listing(fs, path, pid, table.column("key").to_pylist())
        pids.append(pid)
    return pids


def bench_job(
    root: str, against: str | None = None, engine: str = "ray", out: str | None = None, samples_per_shard: int = 0
):
    """A ``curation.job.CurationJob`` over the corpus staged at ``root`` (decisions under ``out``,
    default ``root``): the recipe's reader, decode, CLIP and dedup steps (semantic dedup on) and its
    shard writer (``samples_per_shard``), built without start-up checks (no model runs here)."""
    from curation.dedup.semantic import DedupSemanticConfig
    from curation.job import CurationJob
    from curation.recipe import HUMANS1B, CurationConfig
    from curation.steps import BuiltRecipe
    from infra import storage

    cfg = CurationConfig(output_dir=out or root)
    cfg.input.uri = root
    cfg.dedup.engine, cfg.dedup.against = engine, against
    cfg.shards.samples_per_shard = samples_per_shard
    cfg.dedup.semantic = DedupSemanticConfig(enabled=True)
    kept = (
        "input",
        "decode",
        "content.embedding",
        "dedup.decontaminate",
        "dedup.exact",
        "dedup.near",
        "dedup.semantic",
    )
    steps = BuiltRecipe([s.from_config(cfg) for s in HUMANS1B.steps if s.name in kept or s is HUMANS1B.steps[-1]])
    return CurationJob(cfg, steps, "bench", *storage.resolve(root))


def dedup_step(job, name: str):
    from curation.dedup.steps import DedupStep

    return next(s for s in job.steps.of_kind(DedupStep) if s.name == name)


def timed_steps(job, pids: list[str], names: tuple[str, ...], seconds: dict, label: str = "") -> None:
    """Each named dedup step through ``passes.global_dedup`` alone (it reads the earlier steps'
    decisions on disk): wall and CPU seconds, rows dropped."""
    from curation.passes import global_dedup

    for name in names:
        t, c = time.perf_counter(), cpu_seconds()
        dropped = global_dedup(job, pids, [dedup_step(job, name)])
        seconds[f"{label}{name}"] = time.perf_counter() - t
        seconds[f"{label}{name}_cpu"] = cpu_seconds() - c
        seconds[f"{label}{name}_dropped"] = dropped[name]


def shard_sizes(root: str, samples_per_shard: int) -> tuple[int, str]:
    """(shards, "N each" when every shard but the last holds exactly N samples, else their sizes),
    counted from the sidecars' Parquet footers."""
    import pyarrow.parquet as pq

    from curation import output

    out = output.CuratedOutput.at(root)
    sizes = []
    for path in out.sidecar_files():
        with out.fs.open_input_file(path) as fh:
            sizes.append(pq.ParquetFile(fh).metadata.num_rows)
    even = all(s == samples_per_shard for s in sizes[:-1]) and 0 < sizes[-1] <= samples_per_shard
    return len(sizes), f"{samples_per_shard} each but the last ({sizes[-1]})" if even else f"UNEVEN {sizes[:20]}"


def finish_version(root: str, pids: list[str], seconds: dict, samples_per_shard: int) -> None:
    """The shards (``finish.write_shards``: kept counts, the seeded placement, one shuffle carrying the
    samples to shards of ``samples_per_shard``, tars and sidecars) and the manifest parts naming them,
    stats + version id, then ``_SUCCESS``: V is a finished output a later batch can be deduplicated against."""
    from curation import output, schema
    from curation.finish import summarise_manifest, write_shards
    from curation.versions import combine_digests
    from infra import storage

    t, c = time.perf_counter(), cpu_seconds()
    write_shards(bench_job(root, samples_per_shard=samples_per_shard), pids, pids)
    seconds["write_shards"], seconds["write_shards_cpu"] = time.perf_counter() - t, cpu_seconds() - c
    seconds["shards"], seconds["shard_sizes"] = shard_sizes(root, samples_per_shard)
    t, c = time.perf_counter(), cpu_seconds()
    counts, digests = summarise_manifest(bench_job(root))
    seconds["version"] = combine_digests(digests, "bench", "bench")
    seconds["stats_and_version"], seconds["stats_and_version_cpu"] = time.perf_counter() - t, cpu_seconds() - c
    seconds["kept"] = counts["status"].get(schema.KEPT, 0)
    fs, path = storage.resolve(root)
    storage.atomic_write_bytes(fs, output.path(path, output.SUCCESS_FILE), json.dumps({"dataset_id": "v1"}).encode())


def index_figures(root: str, seconds: dict, label: str = "") -> None:
    from curation import output
    from curation.dedup.index_store import PartitionedNearIndex
    from infra import storage

    fs, path = storage.resolve(root)
    header = PartitionedNearIndex.open(fs, output.path(path, output.DEDUP_DIR, output.NEAR_INDEX_DIR)).header
    seconds[f"{label}index_blocks"], seconds[f"{label}index_bands"] = header["num_blocks"], len(header["masks"])
    seconds[f"{label}index_postings"] = sum(p["postings"] for p in header["parts"])
    seconds[f"{label}index_parts"] = len(header["parts"])


def global_steps(root: str, batch: str, pids: list[str], bpids: list[str], samples_per_shard: int) -> dict:
    """The global steps on V, V's shards, manifest and stats, then B's against V; seconds per step."""
    seconds: dict = {}
    timed_steps(bench_job(root), pids, ("dedup.exact", "dedup.near", "dedup.semantic"), seconds)
    index_figures(root, seconds)
    finish_version(root, pids, seconds, samples_per_shard)
    timed_steps(bench_job(batch, against=root), bpids, ("dedup.exact", "dedup.near", "dedup.semantic"), seconds, "b_")
    index_figures(batch, seconds, "b_")
    v_steps = ("dedup.exact", "dedup.near", "dedup.semantic", "write_shards", "stats_and_version")
    seconds["v_total"] = sum(seconds[k] for k in v_steps)
    seconds["b_total"] = sum(seconds[f"b_{k}"] for k in ("dedup.exact", "dedup.near", "dedup.semantic"))
    seconds["global_total"] = seconds["v_total"] + seconds["b_total"]
    seconds["global_cpu"] = sum(v for k, v in seconds.items() if k.endswith("_cpu"))
    return seconds


def same_decisions(job, pids: list[str], step: str, earlier: tuple[str, ...]) -> tuple[bool, int]:
    """The local engine's decisions of ``step`` (into a folder of their own, the earlier steps'
    decisions copied there) against the Ray run's: (equal, rows)."""
    import shutil

    import pyarrow as pa

    from curation import output
    from curation.dedup.decisions import read_decisions
    from infra import storage

    fs, root = storage.resolve(job.cfg.output_dir)
    check = tempfile.mkdtemp(dir=os.path.dirname(root))
    for name in earlier:
        src = output.path(root, output.DEDUP_DIR, output.DECISIONS_DIR, name)
        if os.path.isdir(src):
            shutil.copytree(src, output.path(check, output.DEDUP_DIR, output.DECISIONS_DIR, name))
    local = bench_job(job.uri, job.cfg.dedup.against, engine="local", out=check)
    timed_steps(local, pids, (step,), {})
    tables = [[read_decisions(fs, r, p, step) for p in pids] for r in (root, check)]
    ray_, here = (pa.concat_tables(t).sort_by("key") for t in tables)
    shutil.rmtree(check)
    return ray_.equals(here), ray_.num_rows


def local_near(root: str, pids: list[str]) -> float:
    """Baseline in the same run: the in-process near search over the same candidates."""
    import pyarrow as pa

    from curation import staging
    from curation.dedup.near import DedupNearConfig, near_duplicate_decisions
    from infra import storage

    fs, path = storage.resolve(root)
    tables = [
        staging.read_partition_rows(fs, path, p, ["key", "phash", "phash_mirror", "width", "height"]) for p in pids
    ]
    table = pa.concat_tables(tables)
    t = time.perf_counter()
    near_duplicate_decisions(table, DedupNearConfig(max_distance=4))
    return time.perf_counter() - t


def measure(n: int, args) -> dict:
    import logging

    import ray

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ray").setLevel(logging.WARNING)
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    import ray.data

    from infra.ray_runtime import use_shuffle

    use_shuffle(args.shuffle)

    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.data.DataContext.get_current().print_on_execution_start = False
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    args.total = n
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root, batch = os.path.join(tmp, "v1"), os.path.join(tmp, "v2")
        t = time.perf_counter()
        pids = stage_corpus(root, n, args)
        bpids = stage_corpus(batch, max(1, n // 10), args, prefix="b", seed=1_000_003)
        staged = time.perf_counter() - t
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with PeakRss() as rss:
            seconds = global_steps(root, batch, pids, bpids, args.samples_per_shard)
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
        if n <= args.check_max:  # after the RSS block: the local engine holds the candidates on the driver
            seconds["same"] = {
                "semantic": same_decisions(bench_job(root), pids, "dedup.semantic", ("dedup.exact", "dedup.near")),
                "B near": same_decisions(bench_job(batch, root), bpids, "dedup.near", ("dedup.exact",)),
                "B semantic": same_decisions(
                    bench_job(batch, root), bpids, "dedup.semantic", ("dedup.exact", "dedup.near")
                ),
            }
    ray.shutdown()
    return seconds


def exponent(a: dict, b: dict, key: str) -> float:
    return math.log(b[key] / a[key]) / math.log(b["n"] / a["n"])


def size_line(r: dict) -> str:
    same = ", ".join(
        f"{k} {'equal' if eq else 'DIFFERENT'} ({rows:,} rows)" for k, (eq, rows) in r.get("same", {}).items()
    )
    return (
        f"n={r['n']:>10,d}: global steps {r['global_total']:8.1f} s, {r['global_cpu']:.1f} CPU-s; "
        f"V: exact {r['dedup.exact']:.1f}, near {r['dedup.near']:.1f} (index B={r['index_blocks']}, "
        f"{r['index_bands']} bands, {r['index_postings']:,} postings), semantic {r['dedup.semantic']:.1f}, "
        f"shards + manifest {r['write_shards']:.1f} ({r['shards']:,} shards of {r['shard_sizes']}), stats+version {r['stats_and_version']:.1f}; "
        f"B against V: exact {r['b_dedup.exact']:.1f}, near {r['b_dedup.near']:.1f} (index of {r['b_index_parts']} parts), "
        f"semantic {r['b_dedup.semantic']:.1f}; dropped V exact {r['dedup.exact_dropped']:,} near "
        f"{r['dedup.near_dropped']:,} semantic {r['dedup.semantic_dropped']:,}, B exact {r['b_dedup.exact_dropped']:,} "
        f"near {r['b_dedup.near_dropped']:,} semantic {r['b_dedup.semantic_dropped']:,}; kept {r['kept']:,}; "
        f"driver peak RSS {r['peak_rss_mb']:.0f} MB (getrusage max {r['maxrss_mb']:.0f} MB); staging "
        f"{r['staging_s']:.1f} s; load {os.getloadavg()[0]:.1f}"
        + (f"; Ray == local: {same}" if same else "")
        + (
            f"; baseline in-process near search {r['local_near_s']:.1f} s (near step / baseline "
            f"{r['dedup.near'] / r['local_near_s']:.1f}x)"
            if "local_near_s" in r
            else ""
        )
    )


def growth_line(a: dict, b: dict) -> str:
    steps = ("dedup.near", "dedup.semantic", "b_dedup.near", "b_dedup.semantic", "dedup.exact", "write_shards")
    parts = ", ".join(f"{k} n^{exponent(a, b, k):.2f} (CPU n^{exponent(a, b, k + '_cpu'):.2f})" for k in steps)
    return (
        f"{a['n']:.0e} -> {b['n']:.0e}: global steps n^{exponent(a, b, 'global_total'):.2f} "
        f"(CPU n^{exponent(a, b, 'global_cpu'):.2f}); {parts}; driver peak RSS x{b['peak_rss_mb'] / a['peak_rss_mb']:.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6])
    p.add_argument("--rows-per-partition", type=int, default=100_000)
    p.add_argument("--exact", type=float, default=0.05)
    p.add_argument("--near", type=float, default=0.10)
    p.add_argument("--blank", type=float, default=0.01)
    p.add_argument("--semantic", type=float, default=0.10, help="fraction of rows that are semantic copies")
    p.add_argument(
        "--hashes",
        default="stress",
        choices=KINDS,
        help="hash family of benchmarks/dedup_scaling.py (hash_pairs): stress (correlated bits, 5%% blank "
        "images' hashes; the default), real (the pipeline's PHashes of views of real photos, made and cached by "
        "dedup_scaling's generator: ~20 min per 1e6 the first time), uniform (fair-coin bits) or correlated",
    )
    p.add_argument("--samples-per-shard", type=int, default=1000, help="shards.samples_per_shard of V's shards")
    p.add_argument(
        "--shuffle",
        default="sort",
        choices=("sort", "hash"),
        help="ray.shuffle: sort (what auto gives a local cluster, the default) or hash (Ray's default, a joined cluster's)",
    )
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--local-max", type=float, default=1e6, help="the in-process near search up to this size")
    p.add_argument("--check-max", type=float, default=1e5, help="Ray == local engine checked up to this size")
    p.add_argument("--workdir", default=None, help="where the staged corpus goes (default: the temp dir)")
    p.add_argument("--smallest", action="store_true", help="size 2e3 only, 1,000 rows per partition")
    p.add_argument("--one", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smallest:
        args.sizes, args.rows_per_partition, args.samples_per_shard = [2e3], 1000, 100
    if args.one:
        print(json.dumps(measure(int(args.one), args)))
        return
    print(
        f"curation global steps at scale: {os.cpu_count()} CPUs, Ray on {args.cpus}, load average "
        f"{os.getloadavg()[0]:.1f} at start; {args.rows_per_partition} rows per partition; {args.hashes} hashes"
    )
    sizes = [int(s) for s in args.sizes]
    if len(sizes) == 1:  # nothing ran in this process yet: its driver peak RSS is the size's own
        print(size_line(measure(sizes[0], args)), flush=True)
        return
    results = []
    for n in sizes:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", str(n)]
        for name in (
            "rows_per_partition",
            "exact",
            "near",
            "blank",
            "semantic",
            "cpus",
            "local_max",
            "check_max",
            "hashes",
            "samples_per_shard",
            "shuffle",
        ):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        cmd += ["--workdir", args.workdir] if args.workdir else []
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
        if out.returncode or not lines:
            raise SystemExit(f"n={n} failed:\n{out.stderr[-4000:]}")
        results.append(json.loads(lines[-1]))
        print(size_line(results[-1]), flush=True)
    for a, b in zip(results, results[1:]):
        print(growth_line(a, b))
    if len(results) > 1:
        first, last = results[0], results[-1]
        print(
            f"driver peak RSS at {last['n']:.0e} / at {first['n']:.0e}: {last['peak_rss_mb'] / first['peak_rss_mb']:.2f} "
            "(target <= 1.5)"
        )


if __name__ == "__main__":
    main()
