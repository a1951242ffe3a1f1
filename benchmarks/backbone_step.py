"""Forward+backward step time of a Sapiens2 backbone next to a plain
``nn.TransformerEncoder`` of the same width and depth, measured in the same run.

Per model it prints the median step time, images/s, the FLOPs of one step (counted with
``FlopCounterMode`` on the meta device, forward and backward) and the achieved TFLOP/s; on
CUDA also the MFU against ``--peak-tflops`` and the peak GPU memory. Then the Sapiens2 /
plain ratios: time, FLOPs, and time per FLOP (1.00x = the same time per counted FLOP as the
plain encoder; SwiGLU does 12 D^2 per token where the GELU MLP does 8 D^2).

On CUDA the step runs under bf16 autocast. On CPU it runs in fp32, on one torch thread by
default; the two models' steps alternate, so load from other processes hits both alike, and
the per-step ratios of wall time and of process CPU time are printed with their quartiles
and range. On a shared machine read the CPU-time ratios (with one thread they are the
step's own work), beside the load average printed at the end.

    python benchmarks/backbone_step.py                     # CPU, sapiens2_small, 256x192, 1 thread
    python benchmarks/backbone_step.py --threads 2         # all cores (a quiet machine only)
    python benchmarks/backbone_step.py --device cuda       # sapiens2_0.4b, 1024x768, bf16
    python benchmarks/backbone_step.py --device cuda --model sapiens2_1b --batch 4 --compile
    python benchmarks/backbone_step.py --model sapiens2_tiny --hw 64 48 --batch 1 --steps 1 --warmup 0

Past figures: ``docs/results/backbone_profile.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from models.registry import build_backbone, get_config

DEFAULTS = {
    "cpu": {"model": "sapiens2_small", "hw": (256, 192), "batch": 4, "steps": 20, "warmup": 2, "threads": 1},
    "cuda": {"model": "sapiens2_0.4b", "hw": (1024, 768), "batch": 8, "steps": 20, "warmup": 5, "threads": None},
}


class PlainViT(nn.Module):
    """Baseline: same patch embedding, prefix-token count, width, heads and depth; stock
    ``nn.TransformerEncoder`` (pre-norm LayerNorm, GELU MLP 4x, learnt position table)."""

    def __init__(self, *, dim: int, depth: int, heads: int, patch: int, num_patches: int, num_prefix: int) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.prefix = nn.Parameter(torch.zeros(1, num_prefix, dim))
        self.pos = nn.Parameter(torch.zeros(1, num_patches, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.encoder(torch.cat((self.prefix.expand(x.shape[0], -1, -1), x), dim=1))


def step_flops(build: Callable[[torch.device], nn.Module], out: Callable, x_shape: tuple[int, ...]) -> int:
    """Forward + backward FLOPs of one step, counted on the meta device."""
    model = build(torch.device("meta"))
    x = torch.empty(x_shape, device="meta")
    with FlopCounterMode(display=False) as counter:
        out(model)(x).float().square().mean().backward()
    return counter.get_total_flops()


def one_step(model: nn.Module, fn: Callable, x: torch.Tensor, bf16: bool) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds of one forward+backward step."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    start, start_cpu = time.perf_counter(), time.process_time()
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = fn(x).float().square().mean()
    loss.backward()
    sync()
    elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    model.zero_grad(set_to_none=True)
    return elapsed, elapsed_cpu


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", help="registry name (default: sapiens2_small on cpu, sapiens2_0.4b on cuda)")
    parser.add_argument("--hw", type=int, nargs=2, metavar=("H", "W"))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--steps", type=int, help="timed steps per model")
    parser.add_argument("--warmup", type=int, help="untimed steps per model before them")
    parser.add_argument(
        "--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s for MFU (H100/H200: 989)"
    )
    parser.add_argument("--threads", type=int, help="CPU threads (default 1 on cpu; on cuda: torch's)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument("--no-baseline", action="store_true", help="time Sapiens2 alone (no ratios): halves the run")
    args = parser.parse_args()
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    return args


def builders(name: str, hw: tuple[int, int]) -> dict[str, tuple[Callable, Callable]]:
    """label -> (build(device) -> model, model -> step function returning the tokens)."""
    cfg = get_config(name)
    if cfg.use_tokenizer:
        raise SystemExit("the baseline has no window tokenizer: pick a model without one")
    grid = (hw[0] // cfg.feature_stride) * (hw[1] // cfg.feature_stride)

    def build_plain(on: torch.device) -> nn.Module:
        with on:
            return PlainViT(
                dim=cfg.embed_dim,
                depth=cfg.depth,
                heads=cfg.num_heads,
                patch=cfg.patch_size,
                num_patches=grid,
                num_prefix=1 + cfg.num_storage_tokens,
            )

    return {
        "sapiens2": (lambda on: build_backbone(name, device=on), lambda m: lambda x: m(x).tokens),
        "plain": (build_plain, lambda m: m),
    }


def describe(args: argparse.Namespace, bf16: bool) -> None:
    cfg = get_config(args.model)
    grid = (args.hw[0] // cfg.feature_stride) * (args.hw[1] // cfg.feature_stride)
    print(
        f"model {args.model}: dim {cfg.embed_dim}, depth {cfg.depth}, heads {cfg.num_heads}, "
        f"kv heads {cfg.kv_heads} in blocks {list(cfg.gqa_blocks) or 'none'}"
    )
    print(
        f"input {args.batch}x3x{args.hw[0]}x{args.hw[1]} ({grid} patches + {1 + cfg.num_storage_tokens} prefix "
        f"tokens), device {torch.cuda.get_device_name() if bf16 else 'cpu'} "
        f"({'bf16 autocast' if bf16 else 'fp32'}, {torch.get_num_threads()} threads), torch {torch.__version__}, "
        f"{args.steps} timed steps after {args.warmup}"
    )


def run_steps(models: dict, x: torch.Tensor, args: argparse.Namespace, bf16: bool) -> tuple[dict, dict]:
    """Wall and CPU seconds of each timed step, per model; the models' steps alternate."""
    times = {label: [] for label in models}
    cpu_times = {label: [] for label in models}
    for i in range(args.warmup + args.steps):
        for label, (model, fn) in models.items():
            elapsed, elapsed_cpu = one_step(model, fn, x, bf16)
            if i >= args.warmup:
                times[label].append(elapsed)
                cpu_times[label].append(elapsed_cpu)
    return times, cpu_times


def report_model(label: str, model: nn.Module, times: list[float], flops: int, args, bf16: bool) -> None:
    med = statistics.median(times)
    params = sum(p.numel() for p in model.parameters())
    line = (
        f"{label:>9}: {params / 1e6:8.1f} M params  {med * 1e3:9.1f} ms/step (median; min "
        f"{min(times) * 1e3:.1f})  {args.batch / med:8.2f} img/s  {flops / 1e9:9.1f} GFLOP/step  "
        f"{flops / med / 1e12:7.3f} TFLOP/s"
    )
    if bf16:
        line += f"  MFU {flops / med / 1e12 / args.peak_tflops:6.1%} of {args.peak_tflops:g}"
    print(line)


def report_ratios(times: dict, cpu_times: dict, flops: dict) -> None:
    t_s, t_p = statistics.median(times["sapiens2"]), statistics.median(times["plain"])
    flop_ratio = flops["sapiens2"] / flops["plain"]
    best = min(times["sapiens2"]) / min(times["plain"])
    print(
        f"ratio sapiens2/plain: time {t_s / t_p:.2f}x (median), {best:.2f}x (best step); FLOPs "
        f"{flop_ratio:.2f}x; time per FLOP {t_s / t_p / flop_ratio:.2f}x (median)"
    )
    for what, per_model in {"wall": times, "process CPU time": cpu_times}.items():
        ratios = sorted(s / p for s, p in zip(per_model["sapiens2"], per_model["plain"]))
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        med = statistics.median(ratios)
        print(
            f"  per-step ratios, {what}: median {med:.3f} (quartiles {q1:.3f}..{q3:.3f}, range "
            f"{ratios[0]:.3f}..{ratios[-1]:.3f}) = {med / flop_ratio:.3f}x per FLOP "
            f"(quartiles {q1 / flop_ratio:.3f}..{q3 / flop_ratio:.3f})"
        )


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = args.device == "cuda"
    device = torch.device(args.device)
    runs = builders(args.model, tuple(args.hw))
    if args.no_baseline:
        del runs["plain"]
    describe(args, bf16)
    load_before = os.getloadavg()
    x_shape = (args.batch, 3, *args.hw)
    torch.manual_seed(0)
    x = torch.randn(x_shape, device=device)
    models, flops = {}, {}
    for label, (build, out) in runs.items():
        flops[label] = step_flops(build, out, x_shape)
        model = build(device).train()
        models[label] = (model, out(torch.compile(model) if args.compile else model))
    times, cpu_times = run_steps(models, x, args, bf16)
    for label, (model, _) in models.items():
        report_model(label, model, times[label], flops[label], args, bf16)
    if bf16:
        print(f"peak GPU memory ({', '.join(models)}): {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    if not args.no_baseline:
        report_ratios(times, cpu_times, flops)
    print(
        "load average (1/5/15 min) before {:.1f}/{:.1f}/{:.1f}, after {:.1f}/{:.1f}/{:.1f}; {} cores".format(
            *load_before, *os.getloadavg(), os.cpu_count()
        )
    )


if __name__ == "__main__":
    main()
