"""Curation throughput on this machine, per core, against a plain Pillow decode loop over the same files.

    python benchmarks/curate_throughput.py                  # 2,000 images + 8,000 for the slope

Builds a corpus of distinct JPEGs (random crops, sizes and qualities of the real demo photos;
many are near duplicates of each other, more so as the corpus grows: pass 1 keeps ~51% of 2,000
and ~18% of 8,000), in partitions of the config's default size (1,000 images, one shard each),
then measures, in one run:
  1. a plain Pillow loop (open + load + convert to RGB): the baseline, in one process and in
     N processes (N = the CPUs given to Ray), before and after the pipeline runs (the machine's
     load drifts; their mean is the baseline the ratios use, both are printed);
  2. the curation pipeline without person detection (pass 1 only: read, header, SHA-256,
     PHash from a reduced-scale decode, geometry, staging, exact + near dedup, shard +
     manifest writing) on a local Ray, at --images and at --slope-images images. Per core:
     the pipeline with N CPUs against the N-process loop and against N x the 1-process loop.
     A small run is dominated by fixed costs per run (planning, the global steps, Ray's task
     dispatch), so the marginal cost per image, the slope (t_large - t_small) / (n_large -
     n_small) between the two runs, is printed too: it is the figure that scales, and the one
     the target (>= 1.0x per core) is judged on;
  3. the bare detector (CenterNet through ONNX Runtime, one thread) on the images the pipeline
     runs it on (pass 1's survivors of the larger run: geometry and dedup drop the rest), decoded the way the
     pipeline decodes them for it (JPEG draft decode to >= its input size), in this process and
     in N processes side by side (as the pipeline's N actors run: on this 2-vCPU machine two
     processes do not get twice one's throughput, so the N-process figure is the floor);
  4. the pipeline with that detector, N actors sharing the CPUs, pass 2's reads and staging
     writes given a quarter CPU, on half of those survivors and on all of them (distinct images:
     every one reaches the detector, so both runs do the same work per image; on the generated
     corpora themselves the slope would charge pass 1's work on ever more dropped near duplicates
     to the detected images): N x wall per image the detector ran on, and CPU-seconds per image,
     against the bare detector's time per image per core in N processes (target <= 1.2x), per
     run and at the margin between the two (judged).
Every figure is given by wall time and by CPU-seconds (of this process and every process of the
local Ray cluster, psutil): on a loaded machine wall time mostly measures the other jobs, CPU per
image does not ("cores busy" = CPU-seconds / (N x wall) shows how much of N cores a run got).
The pipeline's CPU is split into Ray's task workers and actors (the work) and the rest (the
driver's streaming executor, raylet, GCS, Ray's own actors), which polls: it grows with wall time.
A warm-up run on a small corpus comes first (untimed), so that every timed run finds Ray's
worker processes started and their imports done; Ray's own start-up is excluded too.
Everything from planning to _SUCCESS counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from PIL import Image  # noqa: E402

from curation.config import DecodeConfig, InputConfig  # noqa: E402
from curation.filters.geometry import GeometryConfig  # noqa: E402
from curation.filters.person import DetectorConfig  # noqa: E402
from curation.pipeline import run_curation  # noqa: E402
from curation.recipe import CurationConfig, weightless_content_filters  # noqa: E402
from infra.ray_runtime import RayConfig  # noqa: E402
from infra.tracking import TrackingConfig  # noqa: E402
from pipelines.demo_corpus import non_person_photos, person_photos  # noqa: E402

CENTERNET = REPO.parent / "shared" / "assets" / "models" / "person_centernet_512.onnx"


def build_corpus(folder: Path, n: int, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    sources = [
        Image.open(s).convert("RGB") if isinstance(s, Path) else s.convert("RGB")
        for s in [*person_photos().values(), *non_person_photos().values()]
    ]
    paths = []
    for i in range(n):
        src = rng.choice(sources)
        w, h = src.size
        cw, ch = int(w * rng.uniform(0.7, 1.0)), int(h * rng.uniform(0.7, 1.0))
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        scale = rng.uniform(0.8, 1.3)
        im = src.crop((x, y, x + cw, y + ch)).resize((max(64, int(cw * scale)), max(64, int(ch * scale))))
        p = folder / f"{i // 500:03d}" / f"img{i:06d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        im.save(p, quality=rng.randint(80, 95))
        paths.append(p)
    return paths


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
    t0 = time.process_time()
    for p in paths:
        with Image.open(p) as im:
            im.load()
            im.convert("RGB")
    return time.process_time() - t0


def pillow_processes(paths: list[Path], n: int) -> Timing:
    """The same loop in ``n`` processes (a pool started before timing)."""
    import multiprocessing

    chunks = [paths[i::n] for i in range(n)]
    with multiprocessing.get_context("spawn").Pool(n) as pool:
        pool.map(_pillow_chunk, [c[:2] for c in chunks])  # warm the workers
        t0 = time.perf_counter()
        cpu = sum(pool.map(_pillow_chunk, chunks))
        return Timing(len(paths), time.perf_counter() - t0, cpu)


def pillow_loop(paths: list[Path]) -> Timing:
    t0 = time.perf_counter()
    cpu = _pillow_chunk(paths)
    return Timing(len(paths), time.perf_counter() - t0, cpu)


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
    print(f"{label:<50}{t.rate:8.1f} img/s {t.cpu_ms:7.2f} ms CPU/img{split}   {rest}")


def _per_core(t: Timing, n: int, one: Timing, many: Timing, judged: bool = False) -> None:
    """Per core, by wall time (the pipeline on n CPUs against n x the 1-process loop and the
    n-process loop) and by CPU-seconds per image (against the loop's)."""
    mark = "   <- judged" if judged else ""
    print(
        f"{'':<8}per core, wall: {t.rate / (n * one.rate):.2f}x of {n} x the 1-process loop, "
        f"{t.rate / many.rate:.2f}x of the {n}-process loop; CPU: {many.cpu_ms / t.cpu_ms:.2f}x of the loop's "
        f"CPU per image ({(many.cpu / many.n) / (t.work / t.n):.2f}x counting Ray's workers only); cores busy "
        f"{t.cpu / (n * t.wall):.0%}{mark}"
    )


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


def main() -> None:
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
    ap.add_argument("--skip-detector", action="store_true")
    args = ap.parse_args()
    large = 4 * args.images if args.slope_images is None else args.slope_images
    if large and large <= args.images:
        raise SystemExit("--slope-images must be larger than --images (or 0)")
    import ray
    import ray.data

    work = Path(tempfile.mkdtemp(prefix="hv-bench-"))
    try:
        paths = build_corpus(work / "raw-large", max(args.images, large))
        small = link_corpus(paths[: args.images], work / "raw")
        mb = sum(p.stat().st_size for p in small) / 2**20
        mean_px = sum(Image.open(p).size[0] * Image.open(p).size[1] for p in paths[:200]) / min(200, len(paths))
        link_corpus(paths[: min(100, args.images)], work / "raw-warm")
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        n = args.cpus
        print(
            f"corpus: {len(small)} JPEGs, {mb:.1f} MiB, mean {mean_px / 1e6:.2f} MP"
            f"{f' (and {large} for the slope)' if large else ''}; {n} CPUs for Ray; load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        loops = [(pillow_loop(paths), pillow_processes(paths, n))]
        # Untimed: every worker process the timed runs use is started and has done its imports (reads
        # and cheap stages at 1 CPU; the detector runs' at a quarter, so four times as many processes).
        pipeline(work / "raw-warm", work / "out-warm", False, 50)
        if not args.skip_detector:
            pipeline(work / "raw-warm", work / "out-warm-quarter", False, 12, task_cpus=0.25)
        runs = {args.images: pipeline(work / "raw", work / "out-nodet", False, args.partition)}
        if large:
            runs[large] = pipeline(work / "raw-large", work / "out-nodet-large", False, args.partition)
        loops.append((pillow_loop(paths), pillow_processes(paths, n)))
        one, many = (
            Timing(sum(t.n for t in ts), sum(t.wall for t in ts), sum(t.cpu for t in ts)) for ts in zip(*loops)
        )
        print(f"load average {os.getloadavg()[0]:.1f} after the runs without detection")
        for i, (o, m) in enumerate(loops):
            when = ("before", "after")[i]
            _row(f"plain Pillow decode loop, 1 process ({when})", o)
            _row(f"plain Pillow decode loop, {n} processes ({when})", m)
        _row("baseline: both together, 1 process", one, "1.00x")
        _row(f"baseline: both together, {n} processes", many, f"{many.rate / one.rate:.2f}x")
        for size, (t, stats, phases) in runs.items():
            _row(f"pipeline, no person detection, {size} images", t, f"(kept {stats['kept']})")
            _per_core(t, n, one, many)
            print(f"{'':<8}seconds per phase: {phases}")
        if large:
            slope = runs[large][0].minus(runs[args.images][0])
            _row(
                f"pipeline, marginal per image ({args.images} -> {large})",
                slope,
                f"{n * slope.wall / slope.n * 1e3:.2f} ms wall per image per core (the loop: "
                f"{1e3 / one.rate:.2f} ms; {n * 1e3 / many.rate:.2f} ms in {n} processes)",
            )
            _per_core(slope, n, one, many, judged=True)
        if not args.skip_detector:
            # What reaches the detector: pass 1's survivors (same recipe up to it) of the largest run, distinct
            # images that all reach it again. The detection runs take half of them and all of them, so that
            # their slope compares the same work per image: the generated corpora themselves keep a falling
            # share (~51% of 2,000, ~18% of 8,000: crops of 19 photos, their near duplicates grow with n), which
            # would charge pass 1's work on ever more dropped images to the images the detector ran on.
            survivors = kept_sources(work / ("out-nodet-large" if large else "out-nodet"))
            sizes = [len(survivors) // 2, len(survivors)] if large else [len(survivors)]
            for k in sizes:
                link_corpus(survivors[:k], work / f"det-{k}")
            sample = random.Random(0).sample(survivors, min(len(survivors), args.detector_sample))
            bare, side = bare_detector(sample), bare_detector_processes(sample, n)
            _row(
                "bare CenterNet (1 thread, draft decode + run)",
                bare,
                f"({bare.wall / bare.n * 1e3:.1f} ms wall per image, on {bare.n} of the {len(survivors)} "
                "images the pipeline runs it on)",
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
                _per_detected(t, detected, n, floor_wall, floor_cpu, judged=not large)
                print(f"{'':<8}seconds per phase: {phases}")
            if large:
                slope = timed[sizes[1]].minus(timed[sizes[0]])
                _row(f"{label}, marginal ({sizes[0]} -> {sizes[1]})", slope)
                _per_detected(slope, det[sizes[1]] - det[sizes[0]], n, floor_wall, floor_cpu, judged=True)
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
