"""Curation throughput on this machine, against a plain Pillow decode loop over the same files.

    python benchmarks/curate_throughput.py --images 2000

Builds a corpus of distinct JPEGs (random crops, sizes and qualities of the real demo photos),
then measures, in one run:
  1. a plain Pillow loop (open + load + convert to RGB): the baseline, in one process and in
     N processes (N = the CPUs given to Ray), so the pipeline is compared per core;
  2. the curation pipeline without person detection (read, decode, hashes, geometry filter,
     staging, exact dedup, shard + manifest writing) on a local Ray;
  3. the same with the real CenterNet person detector (ONNX Runtime, CPU), once with
     cpus-1 detector actors of 1 CPU, once with one actor per CPU and the reads and cheap
     stages given a quarter CPU (the detector is almost all of the work).
  4. the bare detector (CenterNet through ONNX Runtime, one thread, in this process) on the
     same images, decoded the way the pipeline decodes them for it: its per-core time per image
     is the floor the detection pipeline is compared with.
and prints images/s and the ratio of each pipeline run to the baselines. Ray start-up is
excluded (the cluster is started before timing); everything from planning to _SUCCESS counts.
"""
from __future__ import annotations

import argparse
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
from curation.recipe import CurationConfig, weightless_content_filters  # noqa: E402
from infra.ray_runtime import RayConfig  # noqa: E402
from infra.tracking import TrackingConfig  # noqa: E402
from curation.pipeline import run_curation  # noqa: E402
from pipelines.demo_corpus import non_person_photos, person_photos  # noqa: E402

CENTERNET = REPO.parent / "shared" / "assets" / "models" / "person_centernet_512.onnx"


def build_corpus(folder: Path, n: int, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    sources = [Image.open(s).convert("RGB") if isinstance(s, Path) else s.convert("RGB")
               for s in [*person_photos().values(), *non_person_photos().values()]]
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


def _pillow_chunk(paths: list[Path]) -> int:
    for p in paths:
        with Image.open(p) as im:
            im.load()
            im.convert("RGB")
    return len(paths)


def pillow_processes(paths: list[Path], n: int) -> float:
    """The same loop in ``n`` processes (a pool started before timing)."""
    import multiprocessing

    chunks = [paths[i::n] for i in range(n)]
    with multiprocessing.get_context("spawn").Pool(n) as pool:
        pool.map(_pillow_chunk, [c[:2] for c in chunks])  # warm the workers
        t0 = time.perf_counter()
        done = sum(pool.map(_pillow_chunk, chunks))
        return done / (time.perf_counter() - t0)


def bare_detector(paths: list[Path]) -> float:
    """Seconds per image of CenterNet alone (JPEG draft decode to its input + inference), 1 thread."""
    from curation.filters.model import decode_rgb
    from curation.filters.person import CenterNetOnnx, DetectorConfig

    cfg = DetectorConfig(backend="centernet_onnx", weights=str(CENTERNET), device="cpu", intra_op_threads=1)
    model = CenterNetOnnx(cfg)
    images = [p.read_bytes() for p in paths]
    model.detect([decode_rgb(images[0], min_side=cfg.size)], [(1, 1)])  # warm-up
    t0 = time.perf_counter()
    for data in images:
        im = decode_rgb(data, min_side=cfg.size)
        model.detect([im], [im.size])
    return (time.perf_counter() - t0) / len(images)


def pillow_loop(paths: list[Path]) -> float:
    t0 = time.perf_counter()
    for p in paths:
        with Image.open(p) as im:
            im.load()
            im.convert("RGB")
    return len(paths) / (time.perf_counter() - t0)


def pipeline(raw: Path, out: Path, detector: bool, partition: int, actors: int = 1,
             actor_cpus: float = 1.0, task_cpus: float = 1.0) -> tuple[float, dict, dict]:
    det = (DetectorConfig(backend="centernet_onnx", weights=str(CENTERNET), score_threshold=0.3, min_box_size=100,
                          batch_size=8, num_actors=actors, num_cpus=actor_cpus)
           if detector else DetectorConfig(backend="none"))
    cfg = CurationConfig(input=InputConfig(uri=str(raw), images_per_partition=partition, num_cpus=task_cpus),
                         output_dir=str(out), decode=DecodeConfig(num_cpus=task_cpus),
                         geometry=GeometryConfig(min_short_side=64),
                         detector=det, content=weightless_content_filters(text=False),
                         tracking=TrackingConfig(enabled=False), ray=RayConfig(progress_bars="off"))
    t0 = time.perf_counter()
    result = run_curation(cfg)
    rate = result.stats["inputs"] / (time.perf_counter() - t0)
    phases = json.loads((out / "_SUCCESS").read_text())["phase_seconds"]
    return rate, result.stats, phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--partition", type=int, default=250, help="images per input partition (= per shard)")
    ap.add_argument("--skip-detector", action="store_true")
    args = ap.parse_args()
    import ray
    import ray.data

    work = Path(tempfile.mkdtemp(prefix="hv-bench-"))
    try:
        paths = build_corpus(work / "raw", args.images)
        mb = sum(p.stat().st_size for p in paths) / 2**20
        mean_px = sum(Image.open(p).size[0] * Image.open(p).size[1] for p in paths[:200]) / min(200, len(paths))
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        print(f"corpus: {len(paths)} JPEGs, {mb:.1f} MiB, mean {mean_px / 1e6:.2f} MP; {args.cpus} CPUs for Ray")
        base = pillow_loop(paths)
        multi = pillow_processes(paths, args.cpus)
        print(f"{'plain Pillow decode loop (1 process)':<48}{base:8.1f} img/s   1.00x")
        print(f"{f'plain Pillow decode loop ({args.cpus} processes)':<48}{multi:8.1f} img/s   {multi / base:.2f}x")
        rate, stats, phases = pipeline(work / "raw", work / "out-nodet", False, args.partition)
        print(f"{'pipeline, no person detection':<48}{rate:8.1f} img/s   {rate / base:.2f}x   (kept {stats['kept']})")
        print(f"{'':<8}per core: {rate / (args.cpus * base):.2f}x of {args.cpus} x the 1-process loop, "
              f"{rate / multi:.2f}x of the {args.cpus}-process loop")
        print(f"{'':<8}seconds per phase: {phases}")
        if not args.skip_detector:
            sample = paths[: min(len(paths), 300)]
            per_image = bare_detector(sample)
            print(f"{'bare CenterNet (1 thread, draft decode + run)':<48}{1 / per_image:8.1f} img/s   "
                  f"({per_image * 1e3:.1f} ms per image per core, on {len(sample)} images)")
            # The detector is ~95% of the work here: as many actors as CPUs, the reads and the cheap
            # stages squeezed into what is left (a fixed pool holds its CPUs for the whole run).
            share = (args.cpus - 0.5) / args.cpus
            for actors, cpus, label in ((max(1, args.cpus - 1), 1.0, "cpus-1 actors x 1 CPU"),
                                        (args.cpus, share, f"{args.cpus} actors x {share:.3g} CPU")):
                rate, stats, phases = pipeline(work / "raw", work / f"out-det-{actors}", True, args.partition,
                                               actors, cpus, task_cpus=0.25 if cpus < 1 else 1.0)
                print(f"{'pipeline + CenterNet, ' + label:<48}{rate:8.1f} img/s   {rate / base:.2f}x   "
                      f"(kept {stats['kept']}, no person {stats['dropped_by_reason'].get('no_salient_person', 0)})")
                print(f"{'':<8}per core: {args.cpus / rate * 1e3:.1f} ms per image = "
                      f"{args.cpus / rate / per_image:.2f}x the bare detector's per-core time")
                print(f"{'':<8}seconds per phase: {phases}")
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
