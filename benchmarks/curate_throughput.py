"""Curation throughput on this machine, per core, against plain loops over the same files.

    python benchmarks/curate_throughput.py              # 2,000 images + 8,000 for the slope
    python benchmarks/curate_throughput.py --smallest   # 100 + 200 images, small detector sample (the smoke test's run)

The corpus (``build_corpus``): distinct JPEGs, random crops (30-70% of each side), rescales,
quarter turns and qualities of the real demo photos, each accepted only if its PHash (pass 1's
own draft decode and hash) is more than ``MIN_BITS_APART`` bits from every accepted image's
PHash and mirror hash; every 5th image is a duplicate of an earlier distinct one, alternately
byte-identical and a near copy: a repost, re-encoded 5-20% smaller at quality 60-75, which
the near search pairs with its original (its PHash within the job config's
``dedup.near.max_distance``; a draw that moved it further is drawn again, and an original that
no draw brings within reach gives way to another). So every prefix, both sizes included, holds
20% duplicates (10% exact, 10% near) and pass 1 keeps exactly the other 80% (checked); how far
the near copies' hashes moved is printed. Partitions of the config's default size (1,000
images). Measured in one run:

  1. two baselines, each in one process and in N processes (N = the CPUs given to Ray), before
     and after the pipeline runs (their sum is the baseline the ratios use): a Pillow loop
     (open + full decode + RGB), and the same-work loop: read, SHA-256, pass 1's draft decode and
     PHash, with the pipeline's own functions (``curation.decode.decode_image`` at
     ``HASH_DRAFT_SIDE``, ``curation.dedup.hashing.phash_hex_pair``);
  2. the pipeline without person detection (read, header, SHA-256, PHash, geometry, staging,
     exact + near dedup, shards + manifest) on a local Ray at --images and --slope-images. Per
     core: the pipeline on N CPUs against each N-process loop and N x each 1-process loop. A
     small run is dominated by fixed costs (planning, the global steps, dispatch), so the
     marginal cost per image between the two runs is printed too; it is judged against the
     same-work loop (the Pillow loop decodes every pixel, which pass 1 does not);
  3. the bare detector (CenterNet through ONNX Runtime, one thread) on the distinct survivors of
     the larger run, decoded as the pipeline decodes them for it, in 1 and N processes;
  4. the pipeline with that detector (N actors, pass 2's reads and staging at a quarter CPU) on
     half of those survivors and on all of them (all reach the detector): N x wall and CPU per
     image the detector ran on, against the bare detector per core in N processes (target
     <= 1.2x), per run and at the margin.
Every figure is given by wall time and by CPU-seconds (this process and every process of the
local Ray cluster, psutil; the pipeline's split into Ray's task workers and actors, the work, and
the rest, which polls and grows with wall time). A warm-up run comes first (untimed); Ray's own
start-up is excluded; everything from planning to _SUCCESS counts. Results:
docs/results/curation_throughput.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import io
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from curation.config import DecodeConfig, InputConfig
from curation.decode import HASH_DRAFT_SIDE, decode_image
from curation.dedup.hashing import hamming, hex_to_uint64, phash_hex_pair
from curation.filters.geometry import GeometryConfig
from curation.filters.person import DetectorConfig
from curation.pipeline import run_curation
from curation.recipe import CurationConfig, weightless_content_filters
from infra.ray_runtime import RayConfig, use_shuffle
from infra.tracking import TrackingConfig
from pipelines.demo_corpus import non_person_photos, person_photos

REPO = Path(__file__).resolve().parents[1]

CENTERNET = REPO.parent / "shared" / "assets" / "models" / "person_centernet_512.onnx"


DUPLICATE_EVERY = 5  # image i is a duplicate when i % 5 == 4: 20% of every prefix
MIN_BITS_APART = 10  # distinct images' PHashes (and mirror hashes): more than this apart (near dedup: 4)
NEAR_COPY_TRIES = 20  # reposts drawn of one original before another original is drawn


def _jpeg(im: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    im.save(out, "JPEG", quality=quality)
    return out.getvalue()


def pass1_hashes(data: bytes) -> np.ndarray:
    """[PHash, mirror PHash] as pass 1 computes them from these bytes (its draft decode and hash)."""
    rgb, _ = decode_image(data, DecodeConfig(), draft_side=HASH_DRAFT_SIDE)
    return hex_to_uint64(list(phash_hex_pair(rgb)))


class DistinctImages:
    """JPEGs of the real demo photos that the near-dup search cannot pair: crops, rescales and
    quarter turns, kept only when more than ``MIN_BITS_APART`` bits from every kept one."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sources = [
            Image.open(s).convert("RGB") if isinstance(s, Path) else s.convert("RGB")
            for s in [*person_photos().values(), *non_person_photos().values()]
        ]
        self.hashes = np.zeros(0, np.uint64)
        self.tried = 0
        self.near_bits = CurationConfig().dedup.near.max_distance  # what the runs' near search pairs
        self.moved: collections.Counter = collections.Counter()  # near copies by bits their PHash moved
        self.redrawn = 0  # reposts that moved it further than ``near_bits`` (drawn again)
        self.passed_over = 0  # originals no repost brought within reach

    def _candidate(self) -> Image.Image | None:
        rng, src = self.rng, self.rng.choice(self.sources)
        w, h = src.size
        cw, ch = int(w * rng.uniform(0.3, 0.7)), int(h * rng.uniform(0.3, 0.7))
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        scale = rng.uniform(0.7, 1.3)
        im = src.crop((x, y, x + cw, y + ch)).resize((int(cw * scale), int(ch * scale)))
        im = im.rotate(90 * rng.randint(0, 3), expand=True)
        return im if min(im.size) >= 96 and max(im.size) <= 2.5 * min(im.size) else None  # passes geometry

    def next(self) -> bytes:
        while True:
            self.tried += 1
            im = self._candidate()
            if im is None:
                continue
            data = _jpeg(im, self.rng.randint(80, 95))
            v = pass1_hashes(data)
            if len(self.hashes) and int(hamming(self.hashes[:, None], v[None, :]).min()) <= MIN_BITS_APART:
                continue
            self.hashes = np.concatenate([self.hashes, v])
            return data

    def near_copy(self, data: bytes) -> bytes | None:
        """A repost of ``data`` (5-20% smaller, quality 60-75) whose PHash is within ``near_bits`` of
        its own, or None when ``NEAR_COPY_TRIES`` draws all moved it further."""
        im, h = Image.open(io.BytesIO(data)).convert("RGB"), pass1_hashes(data)[0]
        for _ in range(NEAR_COPY_TRIES):
            s = self.rng.uniform(0.8, 0.95)
            copy = _jpeg(im.resize((int(im.width * s), int(im.height * s))), self.rng.randint(60, 75))
            bits = int(hamming(pass1_hashes(copy)[0], h))
            if bits <= self.near_bits:
                self.moved[bits] += 1
                return copy
            self.redrawn += 1
        return None

    def duplicate(self, distinct: list[bytes], exact: bool) -> bytes:
        """A copy of a random one of ``distinct``: its bytes, or a near copy (of another original
        when no repost of the first is within reach)."""
        while True:
            original = distinct[self.rng.randrange(len(distinct))]
            copy = original if exact else self.near_copy(original)
            if copy is not None:
                return copy
            self.passed_over += 1


def build_corpus(folder: Path, n: int, seed: int = 0) -> tuple[list[Path], DistinctImages]:
    """``n`` JPEGs and the generator that drew them (its counts): image i is a duplicate of a random
    earlier distinct image when ``i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1`` (byte-identical and
    near copy in turn), else a new distinct image. Any prefix of k images holds k // DUPLICATE_EVERY
    duplicates."""
    gen, distinct, paths = DistinctImages(seed), [], []
    for i in range(n):
        if i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1:
            data = gen.duplicate(distinct, exact=(i // DUPLICATE_EVERY) % 2 == 0)
        else:
            data = gen.next()
            distinct.append(data)
        p = folder / f"{i // 500:03d}" / f"img{i:06d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        paths.append(p)
    return paths, gen


def distinct_in(n: int) -> int:
    """Distinct images among the first ``n`` of a corpus: what pass 1 must keep."""
    return n - n // DUPLICATE_EVERY


def link_corpus(paths: list[Path], folder: Path) -> list[Path]:
    """The first images of a corpus as a corpus of their own (hard links, same bytes)."""
    out = []
    for p in paths:
        q = folder / p.relative_to(p.parents[1])
        q.parent.mkdir(parents=True, exist_ok=True)
        os.link(p, q)
        out.append(q)
    return out


@dataclasses.dataclass
class Timing:
    """``n`` images in ``wall`` seconds using ``cpu`` CPU-seconds (every process involved)."""

    n: int
    wall: float
    cpu: float
    work: float = 0.0  # of ``cpu``: Ray's task workers and actors (the rest: driver, raylet, GCS, Ray's own actors)

    @property
    def rate(self) -> float:
        return self.n / self.wall

    @property
    def cpu_ms(self) -> float:
        return self.cpu / self.n * 1e3

    def minus(self, other: Timing) -> Timing:
        """The marginal cost of the images one has more than the other (the slope)."""
        return Timing(self.n - other.n, self.wall - other.wall, self.cpu - other.cpu, self.work - other.work)


class TreeCpu:
    """CPU-seconds of this process and every descendant (the local Ray cluster's processes:
    raylet, GCS, workers, actors) while in the ``with`` block, polled every ``every`` seconds so
    that processes which end inside it (an actor pool's actors) count too, up to their last poll.
    A loaded machine stretches wall time, not this."""

    def __init__(self, every: float = 0.25) -> None:
        self.every, self.seen, self.start, self.workers = every, {}, {}, set()
        self.cpu = self.work = 0.0

    def _poll(self) -> None:
        import psutil

        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                key = (proc.pid, proc.create_time())
                self.seen[key] = t.user + t.system
                if key not in self.workers and _is_worker(proc.cmdline()[:1]):
                    self.workers.add(key)
            except psutil.Error:
                pass

    def _run(self) -> None:
        while not self.done.wait(self.every):
            self._poll()

    def __enter__(self) -> TreeCpu:
        import threading

        self._poll()
        self.start = dict(self.seen)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        self._poll()
        used = {k: v - self.start.get(k, 0.0) for k, v in self.seen.items()}
        self.cpu, self.work = sum(used.values()), sum(v for k, v in used.items() if k in self.workers)


_RAY_OWN = (
    "ray::_StatsActor",
    "ray::ActorLocationTracker",
    "ray::_AutoscalingCoordinatorActor",
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
)


def _is_worker(argv0: list[str]) -> bool:
    """A Ray task worker or actor of the job (its process title), not one of Ray's own."""
    title = argv0[0] if argv0 else ""
    return title.startswith("ray::") and not title.startswith(_RAY_OWN) or title.endswith("default_worker.py")


def _pillow_chunk(paths: list[Path]) -> float:
    """CPU-seconds of a plain Pillow loop: open, full decode, RGB."""
    t0 = time.process_time()
    for p in paths:
        with Image.open(p) as im:
            im.load()
            im.convert("RGB")
    return time.process_time() - t0


def _same_work_chunk(paths: list[Path]) -> float:
    """CPU-seconds of pass 1's per-image work in a plain loop, with the pipeline's own functions:
    read, SHA-256, the draft decode (``decode_image`` at ``HASH_DRAFT_SIDE``), PHash and mirror."""
    cfg = DecodeConfig()
    t0 = time.process_time()
    for p in paths:
        raw = p.read_bytes()
        hashlib.sha256(raw).hexdigest()
        rgb, _ = decode_image(raw, cfg, draft_side=HASH_DRAFT_SIDE)
        phash_hex_pair(rgb)
    return time.process_time() - t0


LOOPS = {"Pillow decode loop": _pillow_chunk, "same-work loop (draft decode + SHA-256 + PHash)": _same_work_chunk}


def loop_processes(chunk, paths: list[Path], n: int) -> Timing:
    """``chunk`` over ``paths`` in ``n`` processes (a pool started and warmed before timing)."""
    import multiprocessing

    chunks = [paths[i::n] for i in range(n)]
    with multiprocessing.get_context("spawn").Pool(n) as pool:
        pool.map(chunk, [c[:2] for c in chunks])  # warm the workers
        t0 = time.perf_counter()
        cpu = sum(pool.map(chunk, chunks))
        return Timing(len(paths), time.perf_counter() - t0, cpu)


def loop_one(chunk, paths: list[Path]) -> Timing:
    chunk(paths[:2])
    t0 = time.perf_counter()
    cpu = chunk(paths)
    return Timing(len(paths), time.perf_counter() - t0, cpu)


def measure_loops(paths: list[Path], n: int) -> dict[str, tuple[Timing, Timing]]:
    """Each loop's (1-process, n-process) timing."""
    return {label: (loop_one(chunk, paths), loop_processes(chunk, paths, n)) for label, chunk in LOOPS.items()}


_DETECTOR = None


def _detector_chunk(paths: list[Path]) -> float:
    """CPU-seconds of CenterNet alone on ``paths``, decoding as the pipeline's detector stage does
    (``decode_rgb`` draft decode to >= the input size, then resize + inference), 1 thread; the
    model is loaded once per process."""
    global _DETECTOR
    from curation.filters.model import decode_rgb
    from curation.filters.person import CenterNetOnnx, DetectorConfig

    if _DETECTOR is None:
        cfg = DetectorConfig(backend="centernet_onnx", weights=str(CENTERNET), device="cpu", intra_op_threads=1)
        _DETECTOR = CenterNetOnnx(cfg)
    size = _DETECTOR.cfg.size
    images = [p.read_bytes() for p in paths]
    c0 = time.process_time()
    for data in images:
        im = decode_rgb(data, min_side=size)
        _DETECTOR.detect([im], [im.size])
    return time.process_time() - c0


def bare_detector(paths: list[Path]) -> Timing:
    """The bare detector in this process (after one warm-up image)."""
    _detector_chunk(paths[:1])
    t0 = time.perf_counter()
    cpu = _detector_chunk(paths)
    return Timing(len(paths), time.perf_counter() - t0, cpu)


def bare_detector_processes(paths: list[Path], n: int) -> Timing:
    """The bare detector in ``n`` processes side by side (models loaded and warmed before timing),
    as the pipeline's ``n`` actors run: what n CPUs of this machine give it."""
    import multiprocessing

    chunks = [paths[i::n] for i in range(n)]
    with multiprocessing.get_context("spawn").Pool(n) as pool:
        pool.map(_detector_chunk, [c[:1] for c in chunks])
        t0 = time.perf_counter()
        cpu = sum(pool.map(_detector_chunk, chunks))
        return Timing(len(paths), time.perf_counter() - t0, cpu)


def pipeline(
    raw: Path,
    out: Path,
    detector: bool,
    partition: int,
    actors: int = 1,
    actor_cpus: float = 1.0,
    task_cpus: float = 1.0,
) -> tuple[Timing, dict, dict]:
    """(timing, stats, seconds per phase) of one curation run."""
    det = (
        DetectorConfig(
            backend="centernet_onnx",
            weights=str(CENTERNET),
            score_threshold=0.3,
            min_box_size=100,
            batch_size=8,
            num_actors=actors,
            num_cpus=actor_cpus,
        )
        if detector
        else DetectorConfig(backend="none")
    )
    cfg = CurationConfig(
        input=InputConfig(uri=str(raw), images_per_partition=partition, num_cpus=task_cpus),
        output_dir=str(out),
        decode=DecodeConfig(),
        geometry=GeometryConfig(min_short_side=64),
        detector=det,
        content=weightless_content_filters(text=False),
        tracking=TrackingConfig(enabled=False),
        ray=RayConfig(progress_bars="off"),
    )
    t0 = time.perf_counter()
    with TreeCpu() as cpu:
        result = run_curation(cfg)
    timing = Timing(result.stats["inputs"], time.perf_counter() - t0, cpu.cpu, cpu.work)
    phases = json.loads((out / "_SUCCESS").read_text())["phase_seconds"]
    return timing, result.stats, phases


def kept_sources(out: Path) -> list[Path]:
    """The source files of a finished run's kept images."""
    import pyarrow.dataset as pads

    table = pads.dataset(str(out / "manifest"), format="parquet").to_table(columns=["source", "status"])
    return sorted(
        Path(s) for s, st in zip(table.column("source").to_pylist(), table.column("status").to_pylist()) if st == "kept"
    )


def _row(label: str, t: Timing, rest: str = "") -> None:
    split = f" ({t.work / t.n * 1e3:.2f} in workers)" if t.work else ""
    print(f"{label:<50}{t.rate:8.1f} img/s {t.cpu_ms:7.2f} ms CPU/img{split}   {rest}".rstrip())


def _per_core(t: Timing, n: int, baselines: dict[str, tuple[Timing, Timing]], judged: str = "") -> None:
    """Per core against each loop: by wall time (the pipeline on n CPUs against n x the 1-process
    loop and the n-process loop) and by CPU-seconds per image (against the n-process loop's)."""
    for label, (one, many) in baselines.items():
        mark = "   <- judged" if label == judged else ""
        print(
            f"{'':<8}per core against the {label}: wall {t.rate / (n * one.rate):.2f}x of {n} x 1 process, "
            f"{t.rate / many.rate:.2f}x of {n} processes; CPU {many.cpu_ms / t.cpu_ms:.2f}x "
            f"({(many.cpu / many.n) / (t.work / t.n):.2f}x counting Ray's workers only){mark}"
        )
    print(f"{'':<8}cores busy {t.cpu / (n * t.wall):.0%}")


def _per_detected(t: Timing, detected: int, n: int, floor_wall: float, floor_cpu: float, judged: bool) -> None:
    """Per image the detector ran on, per core, against the bare detector's time per image."""
    wall, cpu = n * t.wall / detected, t.cpu / detected
    print(
        f"{'':<8}per image the detector ran on, per core: {wall * 1e3:.1f} ms wall ({n} x wall) = "
        f"{wall / floor_wall:.2f}x the bare detector's ({n} processes) wall time per core; "
        f"{cpu * 1e3:.1f} ms CPU = {cpu / floor_cpu:.2f}x its CPU time ({t.work / detected / floor_cpu:.2f}x "
        f"counting Ray's workers only); cores busy {t.cpu / (n * t.wall):.0%}"
        f"{'   <- judged (target <= 1.2x)' if judged else ''}"
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument(
        "--slope-images",
        type=int,
        default=None,
        help="a larger run for the marginal cost per image (default 4 x --images; 0: none)",
    )
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument(
        "--partition",
        type=int,
        default=InputConfig().images_per_partition,
        help="images per input partition (= per shard; default: the config's)",
    )
    ap.add_argument("--detector-sample", type=int, default=300, help="survivors the bare detector is timed on")
    ap.add_argument(
        "--detection-images", type=int, default=0, help="at most this many survivors reach detection (0: all)"
    )
    ap.add_argument("--skip-detector", action="store_true")
    ap.add_argument(
        "--smallest",
        action="store_true",
        help="100 + 200 images, 20 for the bare detector, 40 survivors through detection",
    )
    args = ap.parse_args()
    if args.smallest:
        args.images, args.slope_images, args.detector_sample, args.detection_images = 100, 200, 20, 40
    args.large = 4 * args.images if args.slope_images is None else args.slope_images
    if args.large and args.large <= args.images:
        raise SystemExit("--slope-images must be larger than --images (or 0)")
    return args


def _summed(a: Timing, b: Timing) -> Timing:
    return Timing(a.n + b.n, a.wall + b.wall, a.cpu + b.cpu)


def cheap_path(work: Path, paths: list[Path], args, n: int) -> dict[int, tuple[Timing, dict, dict]]:
    """Both loops before and after the runs without detection, the runs, and their figures."""
    before = measure_loops(paths, n)
    # Untimed: every worker process the timed runs use is started and has done its imports (reads
    # and cheap stages at 1 CPU; the detector runs' at a quarter, so four times as many processes).
    pipeline(work / "raw-warm", work / "out-warm", False, 50)
    if not args.skip_detector:
        pipeline(work / "raw-warm", work / "out-warm-quarter", False, 12, task_cpus=0.25)
    runs = {args.images: pipeline(work / "raw", work / "out-nodet", False, args.partition)}
    if args.large:
        runs[args.large] = pipeline(work / "raw-large", work / "out-nodet-large", False, args.partition)
    after = measure_loops(paths, n)
    print(f"load average {os.getloadavg()[0]:.1f} after the runs without detection")
    baselines = {}
    for label in LOOPS:
        for when, loops in (("before", before), ("after", after)):
            _row(f"{label}, 1 process ({when})", loops[label][0])
            _row(f"{label}, {n} processes ({when})", loops[label][1])
        baselines[label] = tuple(_summed(x, y) for x, y in zip(before[label], after[label]))
        one, many = baselines[label]
        _row(f"{label}: both together, 1 process", one, "1.00x")
        _row(f"{label}: both together, {n} processes", many, f"{many.rate / one.rate:.2f}x")
    judged = list(LOOPS)[1]
    for size, (t, stats, phases) in runs.items():
        if stats["kept"] != distinct_in(size):
            raise RuntimeError(f"pass 1 kept {stats['kept']} of {size}, not its {distinct_in(size)} distinct images")
        _row(f"pipeline, no person detection, {size} images", t, f"(kept {stats['kept']}, {stats['kept'] / size:.0%})")
        _per_core(t, n, baselines)
        print(f"{'':<8}seconds per phase: {phases}")
    if args.large:
        slope = runs[args.large][0].minus(runs[args.images][0])
        one, many = baselines[judged]
        _row(
            f"pipeline, marginal per image ({args.images} -> {args.large})",
            slope,
            f"{n * slope.wall / slope.n * 1e3:.2f} ms wall per image per core (same-work loop: "
            f"{1e3 / one.rate:.2f} ms; {n * 1e3 / many.rate:.2f} ms in {n} processes)",
        )
        _per_core(slope, n, baselines, judged=judged)
    return runs


def detection(work: Path, args, n: int) -> None:
    """The bare detector and the pipeline with it, on pass 1's distinct survivors of the larger run."""
    survivors = kept_sources(work / ("out-nodet-large" if args.large else "out-nodet"))
    if args.detection_images:
        survivors = survivors[: args.detection_images]
    sizes = [len(survivors) // 2, len(survivors)] if args.large else [len(survivors)]
    for k in sizes:
        link_corpus(survivors[:k], work / f"det-{k}")
    sample = random.Random(0).sample(survivors, min(len(survivors), args.detector_sample))
    bare, side = bare_detector(sample), bare_detector_processes(sample, n)
    _row(
        "bare CenterNet (1 thread, draft decode + run)",
        bare,
        f"({bare.wall / bare.n * 1e3:.1f} ms wall per image, on {bare.n} of the {len(survivors)} images)",
    )
    _row(
        f"bare CenterNet, {n} processes side by side",
        side,
        f"({n * side.wall / side.n * 1e3:.1f} ms wall per image per core: the floor the pipeline's "
        f"{n} actors are judged against)",
    )
    floor_wall, floor_cpu = n * side.wall / side.n, side.cpu / side.n
    share = (n - 0.5) / n  # one actor per CPU; reads and staging writes in what is left
    label = f"pipeline + CenterNet, {n} actors x {share:.3g} CPU"
    det, timed = {}, {}
    for size in sizes:
        t, stats, phases = pipeline(
            work / f"det-{size}", work / f"out-det-{size}", True, args.partition, n, share, task_cpus=0.25
        )
        det[size] = detected = stats["kept"] + stats["dropped_by_reason"].get("no_salient_person", 0)
        if detected != size:
            raise RuntimeError(f"the detector ran on {detected} of {size} distinct survivors")
        timed[size] = t
        _row(
            f"{label}, {size} images",
            t,
            f"(detector ran on {detected}, kept {stats['kept']}; load average {os.getloadavg()[0]:.1f})",
        )
        _per_detected(t, detected, n, floor_wall, floor_cpu, judged=not args.large)
        print(f"{'':<8}seconds per phase: {phases}")
    if args.large:
        slope = timed[sizes[1]].minus(timed[sizes[0]])
        _row(f"{label}, marginal ({sizes[0]} -> {sizes[1]})", slope)
        _per_detected(slope, det[sizes[1]] - det[sizes[0]], n, floor_wall, floor_cpu, judged=True)


def main() -> None:
    args = parse_args()
    import ray
    import ray.data

    work = Path(tempfile.mkdtemp(prefix="hv-bench-"))
    try:
        t0 = time.perf_counter()
        paths, gen = build_corpus(work / "raw-large", max(args.images, args.large))
        built = time.perf_counter() - t0
        small = link_corpus(paths[: args.images], work / "raw")
        mb = sum(p.stat().st_size for p in small) / 2**20
        mean_px = sum(Image.open(p).size[0] * Image.open(p).size[1] for p in paths[:200]) / min(200, len(paths))
        link_corpus(paths[: min(100, args.images)], work / "raw-warm")
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        use_shuffle("sort")  # as on a local cluster started by init_ray (RayConfig.shuffle)
        n = args.cpus
        dups = args.images // DUPLICATE_EVERY
        print(
            f"corpus: {len(small)} JPEGs, {mb:.1f} MiB, mean {mean_px / 1e6:.2f} MP, {dups} duplicates "
            f"({dups / len(small):.0%}: byte-identical and near copies in turn; the same share in the "
            f"{args.large} for the slope); built in {built:.0f} s; {n} CPUs for Ray; load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        moved = ", ".join(f"{k} bits: {v}" for k, v in sorted(gen.moved.items()))
        print(
            f"near copies' PHash moved from their originals' ({moved}); reposts drawn again (moved more "
            f"than {gen.near_bits} bits): {gen.redrawn}; originals passed over: {gen.passed_over}"
        )
        cheap_path(work, paths, args, n)
        if not args.skip_detector:
            detection(work, args, n)
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
