"""Annotation throughput per core: the job against the same work in a plain loop, per task and size,
and per runtime: PyTorch fp32 against ONNX Runtime with the fp32 and fp16 graphs of the same model.

    python benchmarks/annotate_throughput.py                    # tiny and sapiens2_0.4b (256x192), every task
    python benchmarks/annotate_throughput.py --smallest         # tiny seg, 12 images (the smoke test's run)
    python benchmarks/annotate_throughput.py --sizes tiny --tasks pose --runtimes torch,onnx-fp32,onnx-fp16
    python benchmarks/annotate_throughput.py --sizes 0.4b --tasks pose,seg --device cuda --hw 1024 768 \\
        --precision bf16 --actors 4 --gpus-per-actor 0.25 --cpus-per-actor 3 --no-loop --peak-tflops 989

The samples: a curated-layout dataset version of rescaled real photos (``../shared/assets``
and the demo corpus' people), person boxes from the real CenterNet detector, in shards of
``--per-shard``. Models: random weights saved in the released layout (no weights are released
for the tiny size, none can be downloaded here): ``sapiens2_<size>_<task>``; depth is a v1 task
(``sapiens_tiny_depth``, ``sapiens_0.3b_depth``); the 0.4b pointmap head only runs at 1024x768
(its scale MLP is tied to a 64x48 token grid), so it is left out at other sizes.

Per task and size, in one run:

  1. the plain loop: one process, one thread (torch and OpenCV), the job's own per-sample code
     in a for loop over the shards (``annotator.annotate_shard``: read, decode, crop or resize,
     forward, post-process, encode, write), timed from loading the model to the last shard;
  2. the job (``run_annotation``) on a local Ray of ``--actors`` CPUs (Ray's start-up left
     out): ``--actors`` actors of one CPU, timed from the call to ``_SUCCESS`` (prepare, the
     models' sha256, actor start-up, every shard, the counts; no gallery, no MLflow).

Printed per task: each one's images/s (the loop's also per CPU-second), the job's images/s per
core against the loop's (target >= 0.8x), the forwards' share of the time, each actor's seconds
outside shards, and whether the two wrote the same bytes. An error row in either stops the
benchmark (the job runs with ``max_error_share=0``): error rows are not throughput.

``--runtimes`` (default ``torch``): ``torch`` runs the checkpoint in PyTorch at ``--precision``;
``onnx-fp32`` / ``onnx-fp16`` export it first (not timed; on the CPU checked against eager) and
run the graph through ONNX Runtime, on the same samples; each line after the first ends with its
images/s against the first runtime's. ONNX on ``--device cuda`` without ONNX Runtime's CUDA
provider says NOT MEASURED and exits 3. ``--parallel-loops`` adds ``--actors`` plain loops in as
many processes (no Ray): what the machine gives per core with that many copies at once. With
``--device cuda`` the loop is skipped (``--no-loop``): the job's images/s per GPU, its forward
share and the backbone's TFLOP/s against ``--peak-tflops``. Results: docs/results/annotate.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import hashlib
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
RUNTIMES = ("torch", "onnx-fp32", "onnx-fp16")
CENTERNET = REPO.parent / "shared" / "assets" / "models" / "person_centernet_512.onnx"
TASKS = ("pose", "seg", "normal", "pointmap", "depth", "albedo")


def model_name(size: str, task: str) -> str:
    if task == "depth":
        return "sapiens_tiny_depth" if size == "tiny" else "sapiens_0.3b_depth"
    return f"sapiens2_{size}_{task}"


def source_photos() -> list[tuple[Image.Image, list, list]]:
    """(photo, person boxes, scores) of the real photos with people, boxes by CenterNet (>= 0.3)."""
    from curation.filters.person import CenterNetOnnx, DetectorConfig
    from pipelines.demo_corpus import person_photos

    photos = [
        Image.open(p).convert("RGB") if isinstance(p, Path) else p.convert("RGB") for p in person_photos().values()
    ]
    det = CenterNetOnnx(DetectorConfig(backend="centernet_onnx", weights=str(CENTERNET), device="cpu"))
    out = []
    for im, (boxes, scores) in zip(photos, det.detect(photos, [im.size for im in photos])):
        keep = [(b, s) for b, s in zip(boxes, scores) if s >= 0.3] or [((0, 0, im.width - 1, im.height - 1), 1.0)]
        out.append((im, [list(b) for b, _ in keep], [s for _, s in keep]))
    return out


def build_version(folder: Path, images: int, per_shard: int, seed: int = 0) -> str:
    """A finished curated-layout output of ``images`` rescaled photos (``curation.output``'s layout)."""
    import pyarrow as pa

    from curation.output import SUCCESS_FILE, shard_path, sidecar_path
    from curation.writer import write_tar
    from infra import storage

    rng, sources, fs = random.Random(seed), source_photos(), storage.resolve(str(folder))[0]
    rows = []
    for i in range(images):
        im, boxes, scores = sources[i % len(sources)]
        s = rng.uniform(0.5, 1.0)
        small = im.resize((max(64, int(im.width * s)), max(64, int(im.height * s))), Image.Resampling.BILINEAR)
        sx, sy = small.width / im.width, small.height / im.height
        data = io.BytesIO()
        small.save(data, "JPEG", quality=90)
        b = [[x1 * sx, y1 * sy, x2 * sx, y2 * sy] for x1, y1, x2, y2 in boxes]
        rows.append(
            {
                "key": f"s{i:06d}",
                "image": data.getvalue(),
                "image_ext": "jpg",
                "width": small.width,
                "height": small.height,
                "person_boxes": b,
                "person_scores": scores,
            }
        )
    for start in range(0, images, per_shard):
        pid, part = f"{start // per_shard:06d}", rows[start : start + per_shard]
        write_tar(fs, shard_path(str(folder), pid), part)
        side = pa.Table.from_pylist([{k: v for k, v in r.items() if k not in ("image", "image_ext")} for r in part])
        storage.write_parquet(fs, sidecar_path(str(folder), pid), side)
    digest = hashlib.sha256("".join(r["key"] + hashlib.sha256(r["image"]).hexdigest() for r in rows).encode())
    done = {"dataset_id": digest.hexdigest()[:16], "dataset_name": folder.name, "kept": images}
    (folder / SUCCESS_FILE).write_text(json.dumps(done))
    return str(folder)


def make_checkpoint(name: str, folder: Path, device: str) -> Path:
    """Random weights in the released layout (built on ``device``: fast for the 0.4b models on a GPU)."""
    import torch

    from models.io import save_state_dict_file
    from models.task_models import build_task_model

    path = folder / f"{name}.safetensors"
    if not path.is_file():
        torch.manual_seed(0)
        save_state_dict_file(build_task_model(name, device=device).state_dict(), path)
    return path


def export_graph(name: str, ckpt: Path, runtime: str, hw, device: str) -> str:
    """The ``onnx-<precision>`` graph of a checkpoint (written once beside it): on the CPU
    checked against the eager fp32 model at batch 1 (a ValueError when out of tolerance)."""
    from models.onnx_export import export_checkpoint, export_onnx
    from models.task_checkpoints import load_task_checkpoint

    precision = runtime.removeprefix("onnx-")
    path = ckpt.with_suffix(f".{precision}{'' if hw is None else '.' + 'x'.join(map(str, hw))}.onnx")
    if path.is_file():
        return str(path)
    start = time.perf_counter()
    if device == "cuda":  # the eager 0.4b check at 1024x768 on the CPU would cost minutes
        loaded = load_task_checkpoint(ckpt)
        export_onnx(
            loaded.model, path, input_hw=tuple(hw or loaded.image_hw), output_names=loaded.outputs, precision=precision
        )
        check = "not checked here"
    else:
        info = export_checkpoint(
            ckpt, path, image_hw=tuple(hw) if hw else None, precision=precision, check_batch_sizes=(1,)
        )
        if not info["within_tolerance"]:
            raise ValueError(f"the {precision} graph of {name} is out of tolerance: {info}")
        check = f"max abs error {info['max_abs_error'][1]:.2g}, relative {info['max_rel_error'][1]:.2g} at batch 1"
    print(f"{'':15s} exported {name} {precision} in {time.perf_counter() - start:.0f} s ({check})", flush=True)
    return str(path)


def onnx_on_gpu_missing() -> str:
    """Why ONNX Runtime cannot run a graph on the GPU here ("" when it can)."""
    import onnxruntime as ort

    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" in providers:
        return ""
    return f"ONNX Runtime {ort.__version__} has no CUDA provider (providers: {providers}); install onnxruntime-gpu"


def annotate_config(args, dataset: str, out: Path, task: str, ckpt: Path, hw, onnx: str = ""):
    from evaluation.annotate.config import (
        ActorPoolConfig,
        AnnotateConfig,
        AnnotateDataConfig,
        GalleryConfig,
        TasksConfig,
    )
    from infra.config import from_dict
    from infra.tracking import TrackingConfig

    settings = {"checkpoint": str(ckpt), "input_hw": list(hw) if hw else None, "onnx": onnx}
    if task == "pose":
        settings.update(min_box_score=0.3, max_people=4)
    actors = ActorPoolConfig(
        device=args.device,
        num_cpus=args.cpus_per_actor,
        num_gpus=args.gpus_per_actor,
        num_actors=args.actors,
        batch_size=args.batch,
        precision=args.precision,
    )
    return AnnotateConfig(
        output_dir=str(out),
        max_error_share=0.0,  # any sample not annotated fails the job: see the module docstring
        data=AnnotateDataConfig(dataset=dataset),
        tasks=from_dict(TasksConfig, {task: settings}),
        actors=actors,
        gallery=GalleryConfig(samples=0),
        tracking=TrackingConfig(enabled=False),
    )


def plain_loop(cfg, out: Path, part: tuple[int, int] = (0, 1), barrier=None) -> tuple[float, float, int, float]:
    """(seconds, forward seconds, images, CPU seconds of the process): the job's per-sample work in
    one process, one thread, over every ``part[1]``-th shard from ``part[0]`` (after ``barrier``,
    when given)."""
    import torch

    from evaluation.annotate.annotator import Annotator, annotate_shard
    from evaluation.annotate.job import absolutize, largest_first, resolve_version
    from evaluation.annotate.models import describe
    from evaluation.annotate.shards import source_shards

    torch.set_num_threads(1)
    cfg = absolutize(cfg)
    infos = {t: describe(t, cfg.tasks.of(t)) for t in cfg.tasks.enabled()}
    shards = largest_first(source_shards(resolve_version(cfg, None)))[part[0] :: part[1]]
    if barrier is not None:
        barrier.wait()
    start, cpu = time.perf_counter(), time.process_time()
    annotator = Annotator(infos, cfg.tasks, dataclasses.replace(cfg.actors, num_cpus=1), "cpu")
    done = [annotate_shard(annotator, s, str(out)) for s in shards]
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    images, errors = sum(d["samples"] for d in done), sum(d["errors"] for d in done)
    if errors:
        raise RuntimeError(
            f"the plain loop could not annotate {errors} of {images} samples (their status, reason and error: "
            f"{out}/annotations/*.parquet): error rows are not throughput"
        )
    return seconds, annotator.forward_seconds, images, cpu_seconds


def parallel_loops(cfg, out: Path, k: int) -> tuple[float, int]:
    """(seconds, images) of ``k`` plain loops in ``k`` processes, the shards dealt out largest
    first, started together once each has its imports done: what the machine gives ``k`` copies
    of the same work without Ray."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(k)
    with ProcessPoolExecutor(k, mp_context=ctx) as pool:
        done = list(pool.map(plain_loop, [cfg] * k, [out] * k, [(i, k) for i in range(k)], [barrier] * k))
    return max(d[0] for d in done), sum(d[2] for d in done)


def run_job(cfg) -> tuple[float, dict]:
    from evaluation.annotate import run_annotation

    start = time.perf_counter()
    result = run_annotation(cfg)
    return time.perf_counter() - start, result.stats


def same_bytes(a: Path, b: Path) -> bool:
    """Whether two runs wrote the same annotation files, compared in chunks (outputs can exceed memory)."""
    names = lambda d: sorted(p.name for p in (d / "annotations").glob("*"))  # noqa: E731
    return (
        bool(names(a))
        and names(a) == names(b)
        and all(filecmp.cmp(a / "annotations" / n, b / "annotations" / n, shallow=False) for n in names(a))
    )


def backbone_tflops(name: str, hw, batch: int, precision: str) -> tuple[float, float]:
    """(TFLOP/s, ms per batch) of the task model's backbone forward on the GPU under the job's precision."""
    import torch

    from curation.filters.model import autocast
    from models.registry import count_flops
    from models.task_models import build_task_model, get_task_spec

    backbone = build_task_model(name, device="cuda").backbone.eval()
    x = torch.randn(batch, 3, *hw, device="cuda")
    with torch.inference_mode(), autocast(precision, "cuda"):
        for _ in range(3):
            backbone(x)
        torch.cuda.synchronize()
        start, n = time.perf_counter(), 10
        for _ in range(n):
            backbone(x)
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / n
    return count_flops(get_task_spec(name).backbone, tuple(hw), batch) / seconds / 1e12, seconds * 1e3


def settle() -> None:
    """Flush what earlier runs wrote (a dense task writes MBs per image) before the next is timed,
    so no run pays for another's writeback."""
    os.sync()


def measure(args, size: str, task: str, dataset: str, work: Path) -> None:
    """Every runtime of ``args.runtimes`` on one task and size."""
    name = model_name(size, task)
    hw = None if size == "tiny" else tuple(args.hw)
    ckpt = make_checkpoint(name, work / "models", "cuda" if args.device == "cuda" else "cpu")
    first = None
    for runtime in args.runtimes.split(","):
        label = f"{size:5s} {task:8s} {name:22s} {'x'.join(map(str, hw or ('trained',))):9s}"
        label += f" {runtime if runtime != 'torch' else 'torch-' + args.precision:10s}"
        onnx = export_graph(name, ckpt, runtime, hw, args.device) if runtime != "torch" else ""
        images_per_s = measure_runtime(args, label, (size, task, runtime), dataset, work, ckpt, hw, onnx)
        first = first or (runtime, images_per_s)
        if first[0] != runtime:
            print(f"{'':15s} {runtime}: {images_per_s / first[1]:.2f}x of {first[0]}'s images/s", flush=True)
    if args.device == "cuda":
        tflops, ms = backbone_tflops(name, hw, args.batch, args.precision)
        print(
            f"{'':15s} backbone forward (PyTorch), batch {args.batch}: {ms:.1f} ms, {tflops:.1f} TFLOP/s = "
            f"{tflops / args.peak_tflops:.1%} of {args.peak_tflops:g} peak",
            flush=True,
        )


def measure_runtime(
    args, line: str, run: tuple[str, str, str], dataset: str, work: Path, ckpt: Path, hw, onnx
) -> float:
    """One runtime's loop and job (see the module docstring); its loop's images/s (no loop: its
    job's per GPU)."""
    size, task, runtime = run
    tag = f"{size}-{task}-{runtime}"
    loop_dir, loops_dir, job_dir = work / f"loop-{tag}", work / f"loops-{tag}", work / f"job-{tag}"
    if not args.no_loop:
        settle()
        loop_s, loop_fwd, n, loop_cpu = plain_loop(
            annotate_config(args, dataset, loop_dir, task, ckpt, hw, onnx), loop_dir
        )
        line += (
            f" loop 1 process {n / loop_s:7.2f} img/s (forward {loop_fwd / loop_s:4.0%}, {n / loop_cpu:7.2f} per CPU-s)"
        )
        if args.parallel_loops:
            settle()
            par_s, par_n = parallel_loops(
                annotate_config(args, dataset, loops_dir, task, ckpt, hw, onnx), loops_dir, args.actors
            )
            line += f" | {args.actors} loop processes {par_n / par_s / args.actors:6.2f} img/s per core"
            line += f" = {par_n / par_s / args.actors / (n / loop_s):.2f}x"
    if args.no_job:
        print(line, flush=True)
        shutil.rmtree(loop_dir, ignore_errors=True)
        shutil.rmtree(loops_dir, ignore_errors=True)
        return n / loop_s
    settle()
    job_s, stats = run_job(annotate_config(args, dataset, job_dir, task, ckpt, hw, onnx))
    per_unit = stats["samples"] / job_s / (args.actors * args.gpus_per_actor if args.device == "cuda" else args.actors)
    unit = "GPU" if args.device == "cuda" else "core"
    line += f" | job {args.actors} actors {stats['samples'] / job_s:7.2f} img/s = {per_unit:6.2f} per {unit}"
    idle = job_s - stats["session_busy_share"] * stats["session_seconds"]  # per actor, outside any shard
    line += f" (forward {stats['session_forward_share']:4.0%}, outside shards {idle:5.1f} s per actor)"
    if not args.no_loop:
        line += f" = {per_unit / (n / loop_s):.2f}x of the loop per core; same bytes: {same_bytes(job_dir, loop_dir)}"
    print(line, flush=True)
    for out in (job_dir, loop_dir, loops_dir):
        shutil.rmtree(out, ignore_errors=True)  # a dense task writes MBs per image: free the disk per task
    return per_unit if args.no_loop else n / loop_s


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="tiny,0.4b", help="comma-separated: tiny, 0.4b")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--images", type=int, default=240, help="samples at the tiny size")
    p.add_argument("--images-large", type=int, default=24, help="samples at 0.4b")
    p.add_argument("--per-shard", type=int, default=24)
    p.add_argument("--per-shard-large", type=int, default=4)
    p.add_argument("--hw", type=int, nargs=2, default=[256, 192], help="0.4b input size (H W)")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--cpus-per-actor", type=float, default=1.0)
    p.add_argument("--gpus-per-actor", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "auto"), help="PyTorch's")
    p.add_argument("--runtimes", default="torch", help=f"comma-separated, in order: {', '.join(RUNTIMES)}")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--no-loop", action="store_true")
    p.add_argument("--no-job", action="store_true", help="the plain loops only (no Ray)")
    p.add_argument(
        "--parallel-loops", action="store_true", help="also --actors plain loops in as many processes, no Ray"
    )
    p.add_argument("--smallest", action="store_true", help="tiny seg, 12 images in 4 shards")
    args = p.parse_args(argv)
    if args.no_loop and args.no_job:
        p.error("--no-loop and --no-job leave nothing to measure")
    unknown = set(args.runtimes.split(",")) - set(RUNTIMES)
    if unknown:
        p.error(f"--runtimes: unknown {sorted(unknown)}; choose from {', '.join(RUNTIMES)}")
    if args.smallest:
        args.sizes, args.tasks, args.images, args.per_shard = "tiny", "seg", 12, 3
    return args


def start_ray(args) -> None:
    import ray

    ray.init(
        num_cpus=max(args.actors, int(args.actors * args.cpus_per_actor + 0.999)),
        num_gpus=1 if args.device == "cuda" else 0,
        include_dashboard=False,
        log_to_driver=False,
    )
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    # Ray Data starts its own helper actors on a session's first execution: Ray's start-up, left out.
    ray.data.from_items([{"x": 1}]).map_batches(lambda b: b).take_all()


def main(argv=None) -> int:
    import ray
    import torch

    args = parse(argv)
    torch.set_num_threads(1)
    onnx = [r for r in args.runtimes.split(",") if r != "torch"]
    why = onnx_on_gpu_missing() if onnx and args.device == "cuda" else ""
    if why:  # before any work: the GPU's time is not spent on the other runtimes
        print(f"{', '.join(onnx)} NOT MEASURED: {why}", flush=True)
        return 3
    work = Path(tempfile.mkdtemp(prefix="annotate-bench-"))
    try:
        if not args.no_job:
            start_ray(args)
        for size in args.sizes.split(","):
            n, per = (args.images, args.per_shard) if size == "tiny" else (args.images_large, args.per_shard_large)
            dataset = build_version(work / f"curated-{size}", n, per)
            print(
                f"{size}: {n} samples in {-(-n // per)} shards of {per}; batch {args.batch}, {args.precision}",
                flush=True,
            )
            for task in args.tasks.split(","):
                if size != "tiny" and task == "pointmap" and tuple(args.hw) != (1024, 768):
                    print(f"{size:5s} {task:8s} left out: the 0.4b pointmap head runs at 1024x768 only", flush=True)
                    continue
                measure(args, size, task, dataset, work)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
