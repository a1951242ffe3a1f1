"""Pretraining throughput.

CPU mode (default): the tiny configuration trained through the real path (Ray Train,
FSDP2 over gloo, loader workers decoding JPEG shards) with 1 and then 2 workers on this
machine; prints images/s, step time and the share of time spent waiting for data
(median over the timed steps), and the 2-vs-1 ratio measured in the same run.

GPU mode: one training step of a real size (synthetic batches, so only the model is
measured) under FSDP2 over the local GPUs, bf16, activation checkpointing; prints step
time, images/s, tokens/s, achieved TFLOP/s per GPU and MFU (FLOPs counted by
``training.flops.step_cost``: teacher forward + 3 x student forward).

    python benchmarks/pretrain_step.py                                  # CPU, tiny, 1 vs 2 workers
    python benchmarks/pretrain_step.py --workers 1 2 --steps 20 --dataset runs/demo/curated
    python benchmarks/pretrain_step.py --device cuda                    # sapiens2_0.4b, 1024x768, all local GPUs
    python benchmarks/pretrain_step.py --step-only --gpus 2             # the same step-only code on CPU/gloo (tiny)
    python benchmarks/pretrain_step.py --device cuda --config configs/pretrain_5b.yaml --batch 4 --compile
    python benchmarks/pretrain_step.py --device cuda --config configs/pretrain_v1_0.3b.yaml --batch 64  # v1 MAE

Results: docs/results/pretraining.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


# ----------------------------------------------------------------------------- CPU mode


def synthetic_dataset(folder: Path, *, shards: int = 4, per_shard: int = 16, seed: int = 0) -> str:
    """A curation-output-shaped folder of WebDataset shards cut from the demo's real photos
    (random crops, 400-800 px), so decoding costs what real JPEGs cost."""
    import numpy as np
    from PIL import Image

    from pipelines.demo_corpus import person_photos

    photos = [
        Image.open(p).convert("RGB") if isinstance(p, Path) else p.convert("RGB") for p in person_photos().values()
    ]
    rng = np.random.default_rng(seed)
    (folder / "shards").mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with tarfile.open(folder / "shards" / f"{s:06d}-bench.tar", "w") as tar:
            for i in range(per_shard):
                photo = photos[int(rng.integers(len(photos)))]
                w, h = photo.size
                cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
                x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
                side = int(rng.integers(400, 801))
                img = photo.crop((x, y, x + cw, y + ch))
                img = img.resize((side, max(16, int(side * ch / cw))))
                buf = io.BytesIO()
                img.save(buf, format="JPEG", quality=90)
                key = f"bench_{s}_{i:04d}"
                meta = json.dumps({"key": key, "width": img.width, "height": img.height}).encode()
                for name, data in ((f"{key}.jpg", buf.getvalue()), (f"{key}.json", meta)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    (folder / "_SUCCESS").write_text(
        json.dumps(
            {"dataset_id": f"bench-{shards}x{per_shard}-{seed}", "dataset_name": "bench", "kept": shards * per_shard}
        )
    )
    return str(folder)


def cpu_run(workers: int, args, dataset: str, work: Path) -> dict:
    from mlflow import MlflowClient

    from infra.config import load_config
    from training.config import PretrainConfig
    from training.run import run_pretraining

    overrides = [
        f"data.dataset={dataset}",
        f"storage_path={work / 'runs'}",
        f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
        f"run_name=bench-{workers}w-{int(time.time())}",
        f"steps={args.warmup + args.steps}",
        f"checkpoint.every={10**9}",
        "checkpoint.export=false",
        "metrics.images_every=0",
        f"ray.num_workers={workers}",
        f"ray.cpus_per_worker={args.threads}",
        f"batch_size_per_worker={args.batch}",
        *args.set,
    ]
    cfg = load_config(PretrainConfig, args.config or REPO / "configs" / "pretrain_tiny.yaml", overrides)
    started = time.perf_counter()
    result = run_pretraining(cfg)
    wall = time.perf_counter() - started
    client = MlflowClient(result.tracking_uri)

    def timed(key):
        history = sorted(client.get_metric_history(result.mlflow_run_id, key), key=lambda m: m.step)
        return [m.value for m in history if m.step > args.warmup]

    steps, waits, images = timed("step_time_s"), timed("data_wait_s"), timed("images_per_s")
    return {
        "workers": workers,
        "threads": args.threads,
        "step_s": statistics.median(steps),
        "images_per_s": statistics.median(images),
        "wait_share": statistics.median(w / s for w, s in zip(waits, steps)),
        "batch": cfg.batch_size_per_worker,
        "wall_s": wall,
        "loader_workers": cfg.data.loader_workers,
    }


def cpu_main(args) -> None:
    import ray

    if max(args.workers) * args.threads > args.cpus:
        raise SystemExit(f"--workers {max(args.workers)} x --threads {args.threads} exceeds --cpus {args.cpus}")
    work = Path(tempfile.mkdtemp(prefix="pretrain-bench-"))
    dataset = args.dataset or synthetic_dataset(work / "data")
    ray.init(
        num_cpus=args.cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        object_store_memory=400 * 2**20,
    )
    print(
        f"config {Path(args.config).name if args.config else 'pretrain_tiny.yaml'} (the real path: Ray Train, FSDP2, "
        f"loader processes decoding JPEG shards; extra settings {args.set or 'none'}) on "
        f"{args.cpus} CPUs, dataset {dataset}; {args.steps} timed steps after {args.warmup}"
    )
    try:
        rows = [cpu_run(w, args, dataset, work) for w in args.workers]
    finally:
        ray.shutdown()
    for r in rows:
        print(
            f"{r['workers']} worker(s) x {r['threads']} thread(s), batch {r['batch']}/worker, "
            f"{r['loader_workers']} loader process(es)/worker: {r['step_s'] * 1e3:8.1f} ms/step (median)  "
            f"{r['images_per_s']:7.2f} img/s  data wait {r['wait_share']:5.1%} of step  (run wall {r['wall_s']:.0f} s)"
        )
    if len(rows) >= 2:
        print(
            f"ratio {rows[-1]['workers']} vs {rows[0]['workers']} workers: "
            f"{rows[-1]['images_per_s'] / rows[0]['images_per_s']:.2f}x images/s"
        )


# ----------------------------------------------------------------------------- step-only (GPU) mode


def step_worker(rank: int, world: int, args, port: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    from infra.config import load_config
    from training.config import PretrainConfig
    from training.data import Batch
    from training.flops import peak_tflops, step_cost
    from training.loop import build, set_determinism
    from training.masking import MaskGenerator
    from training.schedules import values_at
    from training.step import train_step

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    overrides = [
        f"parallel.compile={args.compile}",
        f"parallel.activation_checkpointing={not args.no_ac}",
        "data.dataset=synthetic",
        *args.set,
    ]
    if args.batch:
        overrides.append(f"batch_size_per_worker={args.batch}")
    default = "pretrain_0.4b.yaml" if cuda else "pretrain_tiny.yaml"
    cfg = load_config(PretrainConfig, args.config or REPO / "configs" / default, overrides)
    set_determinism(cfg, device)
    arch, optimizer = build(cfg, device, world)
    B, G, L = cfg.batch_size_per_worker, cfg.crops.num_global, cfg.crops.num_local
    (H, W), (h, w) = cfg.crops.global_size, cfg.crops.local_size
    gen = MaskGenerator(
        (H // arch.stride, W // arch.stride), ratio=cfg.masking.ratio, block_prob=cfg.masking.block_prob
    )
    rng = np.random.default_rng(rank)
    masks = torch.from_numpy(np.stack([gen(rng) for _ in range(G * B)]))
    batch = Batch(torch.randn(G * B, 3, H, W), torch.randn(L * B, 3, h, w), masks, [str(i) for i in range(B)]).to(
        device
    )
    cost = step_cost(cfg, B)
    peak = peak_tflops(args.peak_tflops, device)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    times = []
    for i in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        result = train_step(
            arch, optimizer, batch, values_at(cfg, cfg.optim.warmup_steps), step=i + 1, clip_grad=cfg.optim.clip_grad
        )
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    med = statistics.median(times)
    if rank == 0:
        params = sum(p.numel() for p in arch.student["backbone"].parameters())  # DTensor.numel(): the global size
        name = torch.cuda.get_device_name(device) if cuda else f"CPU process ({torch.get_num_threads()} threads)"
        print(
            f"{cfg.model} ({params / 1e9:.2f} B backbone params), {world} x {name}, "
            f"torch {torch.__version__}, bf16={cfg.parallel.precision == 'bf16'}, "
            f"activation checkpointing={cfg.parallel.activation_checkpointing}, compile={cfg.parallel.compile}, "
            f"fused AdamW={bool(optimizer.defaults.get('fused'))}"
        )
        print(
            f"batch {B}/GPU: {G} x {H}x{W} global + {L} x {h}x{w} local crops, mask ratio {cfg.masking.ratio}; "
            f"{cost.flops / 1e12:.1f} TFLOP per GPU-step (teacher fwd {cost.teacher_flops / 1e12:.1f} + "
            f"3 x student fwd {cost.student_forward_flops / 1e12:.1f})"
        )
        line = (
            f"{med * 1e3:.1f} ms/step (median of {args.steps}; min {min(times) * 1e3:.1f})  "
            f"{world * B / med:.1f} img/s  {world * cost.tokens / med:,.0f} tokens/s  "
            f"{cost.flops / med / 1e12:.1f} TFLOP/s/GPU"
        )
        if peak:
            line += f"  MFU {cost.flops / med / 1e12 / peak:.1%} of {peak:g} TFLOP/s"
        print(line)
        memory = f"peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB/GPU; " if cuda else ""
        print(f"{memory}last loss {result.values['loss']:.4f}")
    dist.destroy_process_group()


def step_main(args) -> None:
    import socket

    import torch
    import torch.multiprocessing as mp

    world = args.gpus or (torch.cuda.device_count() if args.device == "cuda" else 1)
    if world < 1:
        raise SystemExit("--device cuda: no GPU visible")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(step_worker, args=(world, args, port), nprocs=world, join=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--config", help="pretraining config (default: pretrain_tiny on cpu, pretrain_0.4b on cuda)")
    parser.add_argument("--batch", type=int, help="batch per worker/GPU (default: the config's; 4 on cpu)")
    parser.add_argument("--steps", type=int, help="timed steps (default 12 on cpu, 20 on cuda)")
    parser.add_argument("--warmup", type=int, help="untimed first steps (default 3 on cpu, 5 on cuda)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra config overrides")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="cpu: Ray Train worker counts to compare"
    )
    parser.add_argument("--cpus", type=int, default=2, help="cpu: CPUs given to Ray (shared by the workers)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="cpu: torch threads (= Ray CPUs) per worker. On a shared machine more than one "
        "thread per process can be far slower: OpenMP threads spin against other processes",
    )
    parser.add_argument("--dataset", help="cpu: dataset version/folder (default: synthetic shards of real photos)")
    parser.add_argument(
        "--gpus", type=int, help="step-only: processes, one per GPU (default: all visible GPUs; 1 on cpu)"
    )
    parser.add_argument(
        "--step-only",
        action="store_true",
        help="cpu: time the model step alone (synthetic batches, no Ray, no loader), as cuda mode does",
    )
    parser.add_argument("--compile", action="store_true", help="cuda: torch.compile each block")
    parser.add_argument("--no-ac", action="store_true", help="cuda: no activation checkpointing")
    parser.add_argument(
        "--peak-tflops", type=float, default=0.0, help="cuda: peak bf16 TFLOP/s per GPU (default: by name)"
    )
    args = parser.parse_args()
    if args.device == "cpu" and not args.step_only:
        args.batch = args.batch or 4
        args.steps, args.warmup = args.steps or 12, args.warmup if args.warmup is not None else 3
        cpu_main(args)
    else:
        args.steps, args.warmup = args.steps or 20, args.warmup if args.warmup is not None else 5
        step_main(args)


if __name__ == "__main__":
    main()
