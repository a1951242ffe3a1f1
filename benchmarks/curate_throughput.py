"""Curation throughput on this machine, against a plain Pillow decode loop over the same files.

    python benchmarks/curate_throughput.py --images 2000

Builds a corpus of distinct JPEGs (random crops, sizes and qualities of the real demo photos),
then measures, in one run:
  1. a plain single-process Pillow loop (open + load + convert to RGB): the baseline;
  2. the curation pipeline without person detection (read, decode, hashes, geometry filter,
     staging, exact dedup, shard + manifest writing) on a local Ray;
  3. the same with the real CenterNet person detector (ONNX Runtime, CPU), once with
     cpus-1 detector actors of 1 CPU, once with one actor per CPU and the reads and cheap
     stages given a quarter CPU (the detector is almost all of the work).
and prints images/s and the ratio of each pipeline run to the baseline. Ray start-up is
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
        print(f"{'plain Pillow decode loop (1 process)':<48}{base:8.1f} img/s   1.00x")
        rate, stats, phases = pipeline(work / "raw", work / "out-nodet", False, args.partition)
        print(f"{'pipeline, no person detection':<48}{rate:8.1f} img/s   {rate / base:.2f}x   (kept {stats['kept']})")
        print(f"{'':<8}seconds per phase: {phases}")
        if not args.skip_detector:
            # The detector is ~95% of the work here: as many actors as CPUs, the reads and the cheap
            # stages squeezed into what is left (a fixed pool holds its CPUs for the whole run).
            share = (args.cpus - 0.5) / args.cpus
            for actors, cpus, label in ((max(1, args.cpus - 1), 1.0, "cpus-1 actors x 1 CPU"),
                                        (args.cpus, share, f"{args.cpus} actors x {share:.3g} CPU")):
                rate, stats, phases = pipeline(work / "raw", work / f"out-det-{actors}", True, args.partition,
                                               actors, cpus, task_cpus=0.25 if cpus < 1 else 1.0)
                print(f"{'pipeline + CenterNet, ' + label:<48}{rate:8.1f} img/s   {rate / base:.2f}x   "
                      f"(kept {stats['kept']}, no person {stats['dropped_by_reason'].get('no_salient_person', 0)})")
                print(f"{'':<8}seconds per phase: {phases}")
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
