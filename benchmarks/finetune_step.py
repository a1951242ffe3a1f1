"""Fine-tuning step throughput: images/s of one end-to-end step (backbone + head, forward,
backward, clipping, AdamW over the layer-wise-decay groups), beside a frozen-probe step of the
same backbone and head on the same batch (backbone forward without grad, head trained): the
ratio says what training the whole backbone costs.

    python benchmarks/finetune_step.py                      # CPU: sapiens2_tiny at 128x96, batch 8, seg head
    python benchmarks/finetune_step.py --model sapiens_0.3b --task pose --hw 256 192 --batch 2
    python benchmarks/finetune_step.py --gpu --model sapiens2_1b --hw 1024 768 --batch 4    # + MFU

GPU mode (bf16 autocast, one device): also the model FLOPs per step (3 x the forward's,
counted with ``FlopCounterMode`` on the meta device: the backward counted as twice the forward)
and MFU against the device's bf16 peak (``training.flops.peak_tflops``). Timings are the median
of ``--steps`` after ``--warmup`` steps, wall and CPU time of this process (the latter swings
less with a shared machine's load). Results: docs/results/pretraining.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from evaluation.finetune.config import FinetuneOptim
from evaluation.finetune.optim import build_optimizer, set_step_lr
from evaluation.finetune.tasks import FinetuneModel
from models import build_backbone, build_task_head
from training.step import clip_gradients

HEAD_KW = {"pose": {"num_keypoints": 308}, "seg": {"num_classes": 28}, "normal": {}, "depth": {}}


def make_model(name: str, task: str, device: torch.device, hidden: int) -> FinetuneModel:
    torch.manual_seed(0)
    backbone = build_backbone(name, device=device)
    up = backbone.feature_stride // 4 if task in ("pose", "seg") else backbone.feature_stride
    head = build_task_head(task, backbone.embed_dim, hidden_dim=hidden, upsample=up, **HEAD_KW[task]).to(device)
    return FinetuneModel(backbone, head)


def _loss(out: dict) -> torch.Tensor:
    return sum(v.float().pow(2).mean() for v in out.values())


def timed(fn, steps: int, warmup: int, device: torch.device) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of this process per call (the CPU time
    swings less with a shared machine's load)."""
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def finetune_step_fn(model: FinetuneModel, images: torch.Tensor, amp: bool):
    opt = build_optimizer(model, model.num_layers, FinetuneOptim())
    set_step_lr(opt, 1e-4)
    params = [p for g in opt.param_groups for p in g["params"]]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=amp):
            loss = _loss(model(images))
        loss.backward()
        clip_gradients(params, 1.0)
        opt.step()

    return step


def probe_step_fn(model: FinetuneModel, images: torch.Tensor, amp: bool):
    opt = torch.optim.AdamW(model.decode_head.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=amp):
            with torch.no_grad():
                maps = model.backbone(images, out_indices=(-1,)).feature_maps
            loss = _loss(model.decode_head(maps))
        loss.backward()
        opt.step()

    return step


def step_flops(name: str, task: str, hidden: int, batch: int, hw: tuple[int, int]) -> int:
    """3 x the forward FLOPs of backbone + head (meta device)."""
    model = make_model(name, task, torch.device("meta"), hidden)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.empty(batch, 3, *hw, device="meta"))
    return 3 * counter.get_total_flops()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="sapiens2_tiny")
    ap.add_argument("--task", default="seg", choices=sorted(HEAD_KW))
    ap.add_argument("--hw", type=int, nargs=2, default=[128, 96])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64, help="head width (the released heads: 768)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gpu", action="store_true", help="one CUDA device, bf16 autocast, prints MFU")
    args = ap.parse_args()
    device = torch.device("cuda") if args.gpu else torch.device("cpu")
    model = make_model(args.model, args.task, device, args.hidden)
    images = torch.randn(args.batch, 3, *args.hw, device=device)
    (ft, ft_cpu) = timed(finetune_step_fn(model, images, args.gpu), args.steps, args.warmup, device)
    (pr, pr_cpu) = timed(probe_step_fn(model, images, args.gpu), args.steps, args.warmup, device)
    print(
        f"{args.model} + {args.task} head (width {args.hidden}), {args.hw[0]}x{args.hw[1]}, batch {args.batch}, "
        f"{device.type}{' bf16' if args.gpu else ' fp32'}, median of {args.steps} steps, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"  fine-tune step    {ft * 1e3:9.1f} ms wall {ft_cpu * 1e3:9.1f} ms CPU  {args.batch / ft:8.2f} images/s")
    print(
        f"  frozen-probe step {pr * 1e3:9.1f} ms wall {pr_cpu * 1e3:9.1f} ms CPU  {args.batch / pr:8.2f} images/s"
        "   (baseline)"
    )
    print(f"  fine-tune / probe: {ft / pr:.2f}x wall, {ft_cpu / max(pr_cpu, 1e-9):.2f}x CPU time")
    if args.gpu:
        from training.flops import peak_tflops

        flops, peak = (
            step_flops(args.model, args.task, args.hidden, args.batch, tuple(args.hw)),
            peak_tflops(0.0, device),
        )
        mfu = f"{flops / ft / (peak * 1e12):.1%}" if peak else "n/a (unknown device peak)"
        print(f"  model FLOPs/step {flops / 1e12:.2f} T, {flops / ft / 1e12:.1f} TFLOP/s, MFU {mfu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
