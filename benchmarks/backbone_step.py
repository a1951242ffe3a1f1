"""Forward+backward step time of a Sapiens2 backbone next to a plain
``nn.TransformerEncoder`` of the same width and depth, measured in the same run.

The figure is the time ratio (Sapiens2 / baseline); FLOPs per step are printed for both
(counted with ``FlopCounterMode`` on the meta device, forward and backward), so the ratio
can be read against the extra work of SwiGLU (12 D^2 vs 8 D^2 per token), QK-norm and
RoPE. On CUDA the step runs under bf16 autocast and achieved TFLOP/s and MFU are printed.

On CPU the steps of the two models alternate and the headline is the median of the
per-step ratios of process CPU time, with its quartiles and range, over the FLOP ratio
("per FLOP": 1.00x = the same time per counted FLOP as the plain encoder). One torch
thread by default: its CPU time is the step's own work however loaded the machine is,
where with two threads on a shared machine OpenMP threads wait for each other behind
other processes (wall times there spread over 4x). The load average is printed with it.

Measured 2026-11-30 (2 shared cores, load average 6-13; process CPU time, 1 thread, 20 steps;
FLOP ratio 1.267): before the fused QK-norm + RoPE and the shorter RMSNorm backward (at 849bc15)
1.043x per FLOP (quartiles 1.024..1.072); after 1.060x (1.014..1.117). The two versions
interleaved in one process (20 steps each, with the plain encoder): 1.041x and 1.041x, after/
before 0.998 (range 0.953..1.068). The change is below this machine's noise (component timings
predict ~0.5%: QK-norm + RoPE fwd+bwd ~10% faster, RMSNorm ~10%); the target (<= 1.00x) is not
reached: the remaining ~4% is elementwise work the plain encoder does not have (QK-norm, bf16
RoPE, SiLU gate) and that eager PyTorch on CPU cannot fuse further. The fused version was
reverted (no measurable gain for a second, CPU-only QK-norm + RoPE path): the code measured
here is the "before" one, 1.04x per FLOP.

Where the rest goes (2026-11-30, ``torch.profiler``, 3 steps each, 1 thread, load ~2): matrix
products take 1.854 s for Sapiens2 and 1.423 s for the plain encoder, 1.30x, which is their FLOP
ratio (SwiGLU's 12 D^2 against 8 D^2); attention 0.290 s against 0.304 s (GQA). Everything else
is 0.488 s against 0.249 s: the plain encoder's fused LayerNorm costs ~0.2 ms a call, Sapiens2's
49 RMSNorms a step (ln1, ln2, QK-norm, final) ~0.9 ms, its SiLU gate 43 ms a step against GELU's
26, RoPE 21 ms. With ``--fuse-elementwise`` (those three regions compiled by Inductor; a
diagnostic, see ``fused_elementwise``), interleaved in one run, load 5: eager 1.040x per FLOP
(quartiles 1.026..1.066), fused 1.015x (0.997..1.025). Fusing them closes about 60% of the
excess; the rest is elementwise work the plain encoder has no counterpart for (QK-norm and RoPE
on q and k, LayerScale, the gate's second operand), so <= 1.00x per FLOP is out of reach on CPU
without dropping parity-relevant ops.

Measured 2026-12-01, after two changes in ``models.layers`` found by profiling the step (``torch.profiler``
with shapes and parent ops): ``aten::copy_`` took ~38 ms of a ~760 ms step, 16 ms of it ``addmm`` copying
the broadcast bias into SwiGLU's (804, 2048) ``w12`` output before the GEMM, so biased linears now run as
``matmul`` + in-place bias add (``layers.linear``); and RMSNorm's sum of squares is one ``linalg.vecdot``
with a closed-form backward (fwd+bwd 1.0 ms against 1.3-1.6 ms per call). The old and new layers stepped
the same weights interleaved with the plain encoder in one process (1 thread, 30 steps each; three runs
at load 1-4): new / old **0.968** (quartiles 0.924..1.011), 0.964 and 0.976. The same run at load 1.0:
old 1.090x per FLOP, new **1.051x** (quartiles 1.021..1.073); ``python benchmarks/backbone_step.py`` right
after: 1.073x (1.027..1.133). On this day's machine the old code measured 1.09x where it measured 1.04x on
2026-11-30, so the absolute per-FLOP figure moves with the machine by more than the change; the
interleaved new / old ratio does not. The target (<= 1.00x per FLOP) is still not met on CPU.

The host allocator, measured 2026-12-01 (later that day; 1 thread, load ~1): glibc gives the top of
the heap back to the kernel when more than twice its adaptive ``mmap`` threshold is free there, which
a step's freed activations can reach; the next step then faults those pages in again. Depending on
what the process allocated before, sapiens2_small's step took 0 or 5,000-10,000 minor page faults
(the plain encoder: 0 in every run). Training workers on CPU now keep freed memory
(``infra.allocator``, from ``training.loop.prepare_process``), and so does this benchmark for both
models (``--glibc-default-allocator`` to compare; faults per step are printed). Both settings in the
same process layout (a script stepping the two models alternately, 20 steps): defaults 1.089x and
1.093x per FLOP (8,800-9,800 faults per step), memory retained 1.058x (1 fault). This benchmark, 16
steps, runs alternating: defaults 1.084x (0 faults in that run), 1.044x (5,060), 1.056x (5,524);
retained 1.055x, 1.034x, 1.049x (0). Retaining is 1.5-3% faster, about this machine's run-to-run
spread. With it and the elementwise regions compiled (``--fuse-elementwise``): eager 1.050x, fused
1.002x per FLOP (quartiles 0.963..1.023): even fused by Inductor the step is only level with the plain
encoder. Also tried and dropped: LayerScale folded into the output projection's weight and the
residual added by the GEMM itself (``addmm_``, beta 1): new / old 0.997 and 1.004, no gain.

Fused CPU kernels, measured 2026-12-01 (later again). What the step's extra elementwise work costs,
found by taking it out (not parity; the same model stepped interleaved, 12 steps, load ~3): without
RoPE 0.953 of the full step, without RoPE and QK-norm 0.896, without LayerScale 0.978, against the
plain encoder's 0.768: QK-norm + RoPE were 10% of the step, ~20 eager passes over q and over k each
way. ``models.kernels`` now runs them as one C pass each way (forward bit-identical to the eager
layers), and the SwiGLU gate's backward as one pass instead of three ops (silu(a) is then not kept).
Compiling the same QK region with Inductor (one region per block, bf16 casts emulated) gained only
0.994 of the eager step; the C kernels take ~0.1 ms forward and ~0.2 ms backward for one (4, 4, 201,
64) q against ~3 ms eager. ``python benchmarks/backbone_step.py --eager-layers`` (load 1.1-1.3, 20
steps): kernels **0.969x per FLOP** (quartiles 0.957..0.984), eager layers 1.045x (1.031..1.061) in
the same run; ``--threads 2 --steps 16``: 0.983x (0.959..1.034) against 1.055x.

    python benchmarks/backbone_step.py                       # CPU, sapiens2_small, 256x192, 1 thread
    python benchmarks/backbone_step.py --eager-layers        # + a column with the fused CPU kernels off
    python benchmarks/backbone_step.py --threads 2           # all cores (a quiet machine only)
    python benchmarks/backbone_step.py --fuse-elementwise    # + a column with RMSNorm, gate, RoPE compiled
    python benchmarks/backbone_step.py --glibc-default-allocator   # malloc as glibc leaves it (see above)
    python benchmarks/backbone_step.py --device cuda         # sapiens2_0.4b, 1024x768, bf16
    python benchmarks/backbone_step.py --device cuda --model sapiens2_1b --batch 4 --peak-tflops 989
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from infra.allocator import retain_freed_memory
from models.kernels import available as kernels_available
from models.registry import build_backbone, get_config

DEFAULTS = {
    "cpu": {"model": "sapiens2_small", "hw": (256, 192), "batch": 4, "steps": 20, "warmup": 2, "threads": 1},
    "cuda": {"model": "sapiens2_0.4b", "hw": (1024, 768), "batch": 8, "steps": 20, "warmup": 5},
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


@contextlib.contextmanager
def fused_elementwise():
    """Diagnostic (``--fuse-elementwise``): while active, the Sapiens2 layers' elementwise regions
    (RMSNorm, including QK-norm; the SwiGLU gate; RoPE) run as ``torch.compile``d versions of
    their reference formulas, so Inductor fuses each into one or two loops while the matrix
    products and attention stay eager. The benchmark then times a third column, the same
    Sapiens2 model stepped inside this context, interleaved with the other two: how much of the
    per-FLOP excess is those regions' memory passes. Not the shipped path: it needs a C++
    compiler and compiles once per process (~15 s on this machine)."""
    import models.layers as layers

    with native_kernels(False), _compiled_regions(layers):
        yield


@contextlib.contextmanager
def native_kernels(on: bool):
    """The fused CPU kernels (``models.kernels``) on or off while active (its environment switch)."""
    from models.kernels import ENV_SWITCH

    saved = os.environ.get(ENV_SWITCH)
    os.environ[ENV_SWITCH] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV_SWITCH)
        else:
            os.environ[ENV_SWITCH] = saved


@contextlib.contextmanager
def _compiled_regions(layers):
    saved = layers.RMSNorm.forward, layers.SwiGLU.forward, layers.apply_rope
    layers.RMSNorm.forward = lambda self, x: _rms_norm(x, self.weight, self.eps)
    layers.SwiGLU.forward = lambda self, x: self.w3(_silu_gate(self.w12(x)))
    layers.apply_rope = lambda x, rope: _rope(x, *rope)
    try:
        yield
    finally:
        layers.RMSNorm.forward, layers.SwiGLU.forward, layers.apply_rope = saved


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _compiled("rms_norm", lambda x, w, eps: F.rms_norm(x, [x.shape[-1]], w, eps))(x, weight, eps)


def _silu_gate(h: torch.Tensor) -> torch.Tensor:
    def gate(h):
        a, b = h.chunk(2, dim=-1)
        return F.silu(a) * b

    return _compiled("silu_gate", gate)(h)


def _rope(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    from models.layers import _rope_reference

    return _compiled("rope", _rope_reference)(x, sin, cos)


def _inside(context: Callable, fn: Callable) -> Callable:
    def run(x: torch.Tensor) -> torch.Tensor:
        with context():
            return fn(x)

    return run


_COMPILED: dict[str, Callable] = {}


def _compiled(name: str, fn: Callable) -> Callable:
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=True)
    return _COMPILED[name]


def sapiens_tokens(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: model(x).tokens


def step_flops(build: Callable[[torch.device], nn.Module], out: Callable, x_shape: tuple[int, ...]) -> int:
    """Forward + backward FLOPs of one step, counted on the meta device."""
    model = build(torch.device("meta"))
    x = torch.empty(x_shape, device="meta")
    with FlopCounterMode(display=False) as counter:
        out(model)(x).float().square().mean().backward()
    return counter.get_total_flops()


def one_step(model: nn.Module, fn: Callable, x: torch.Tensor, bf16: bool) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds of one forward+backward step.

    On a shared CPU the wall time includes whatever other processes took; the CPU time
    does not (with one torch thread it is the step's own work), so its ratio is the
    steadier of the two there."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", help="registry name (default: sapiens2_small on cpu, sapiens2_0.4b on cuda)")
    parser.add_argument("--hw", type=int, nargs=2, metavar=("H", "W"))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument(
        "--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s for MFU (H100/H200: 989)"
    )
    parser.add_argument("--threads", type=int, help="CPU threads (default 1 on cpu; on cuda: torch's)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument(
        "--fuse-elementwise",
        action="store_true",
        help="diagnostic: compile only Sapiens2's RMSNorm, SwiGLU gate and RoPE (see fuse_elementwise)",
    )
    parser.add_argument(
        "--eager-layers",
        action="store_true",
        help="a column with Sapiens2's fused CPU kernels off (models.kernels): the eager layers alone",
    )
    parser.add_argument(
        "--glibc-default-allocator",
        action="store_true",
        help="leave malloc at glibc's defaults instead of the training workers' setting (infra.allocator)",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="time Sapiens2 alone (its TFLOP/s and MFU; no ratio): halves the run, and the compile time",
    )
    args = parser.parse_args()
    d = DEFAULTS[args.device]
    name, (H, W) = args.model or d["model"], tuple(args.hw or d["hw"])
    batch, steps, warmup = args.batch or d["batch"], args.steps or d["steps"], args.warmup or d["warmup"]
    if args.threads or d.get("threads"):
        torch.set_num_threads(args.threads or d["threads"])
    bf16 = args.device == "cuda"
    device = torch.device(args.device)
    # The allocator the training workers run with on CPU (training.loop.prepare_process), for both models.
    retained = not bf16 and not args.glibc_default_allocator and retain_freed_memory()

    cfg = get_config(name)
    grid = (H // cfg.feature_stride) * (W // cfg.feature_stride)
    if cfg.use_tokenizer:
        raise SystemExit("the baseline has no window tokenizer: pick a model without one")

    def build_sapiens(on: torch.device) -> nn.Module:
        return build_backbone(name, device=on)

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

    x_shape = (batch, 3, H, W)
    runs = {"sapiens2": (build_sapiens, sapiens_tokens), "plain": (build_plain, lambda m: m)}
    if args.no_baseline:
        del runs["plain"]
    print(
        f"model {name}: dim {cfg.embed_dim}, depth {cfg.depth}, heads {cfg.num_heads}, "
        f"kv heads {cfg.kv_heads} in blocks {list(cfg.gqa_blocks) or 'none'}"
    )
    print(
        f"input {batch}x3x{H}x{W} ({grid} patches + {1 + cfg.num_storage_tokens} prefix tokens), device "
        f"{torch.cuda.get_device_name() if bf16 else 'cpu'} ({'bf16 autocast' if bf16 else 'fp32'}, "
        f"{torch.get_num_threads()} threads), torch {torch.__version__}, {steps} timed steps after {warmup}"
    )
    if not bf16:
        print(
            f"host allocator: {'freed memory retained (infra.allocator)' if retained else 'glibc defaults'}; "
            f"fused CPU kernels (models.kernels): {'on' if kernels_available() else 'off'}"
        )
    load_before = os.getloadavg()
    torch.manual_seed(0)
    x = torch.randn(x_shape, device=device)
    models, times, cpu_times, flops, faults = {}, {}, {}, {}, {}
    for label, (build, out) in runs.items():
        flops[label] = step_flops(build, out, x_shape)
        model = build(device).train()
        models[label] = (model, out(torch.compile(model) if args.compile else model))
        times[label], cpu_times[label], faults[label] = [], [], []
    if args.eager_layers:  # the same model and weights without the fused CPU kernels
        model, fn = models["sapiens2"]
        models["eager"], flops["eager"], times["eager"], cpu_times["eager"], faults["eager"] = (
            (model, _inside(lambda: native_kernels(False), fn)),
            flops["sapiens2"],
            [],
            [],
            [],
        )
    if args.fuse_elementwise:  # the same model and weights, its elementwise regions compiled
        model, fn = models["sapiens2"]
        models["fused"], flops["fused"], times["fused"], cpu_times["fused"], faults["fused"] = (
            (model, _inside(fused_elementwise, fn)),
            flops["sapiens2"],
            [],
            [],
            [],
        )
    # Steps alternate between the two models, so load from other processes (or clock
    # changes) hits both alike and the ratio stays meaningful on a shared machine.
    for i in range(warmup + steps):
        for label, (model, fn) in models.items():
            minflt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            elapsed, elapsed_cpu = one_step(model, fn, x, bf16)
            if i >= warmup:
                times[label].append(elapsed)
                cpu_times[label].append(elapsed_cpu)
                faults[label].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - minflt)
    results = {}
    for label, (model, _) in models.items():
        med = statistics.median(times[label])
        results[label] = (med, flops[label])
        params = sum(p.numel() for p in model.parameters())
        line = (
            f"{label:>9}: {params / 1e6:8.1f} M params  {med * 1e3:9.1f} ms/step (median; min "
            f"{min(times[label]) * 1e3:.1f})  {batch / med:8.2f} img/s  {flops[label] / 1e9:9.1f} GFLOP/step  "
            f"{flops[label] / med / 1e12:7.3f} TFLOP/s  {statistics.median(faults[label]):7.0f} page faults/step"
        )
        if bf16:
            line += f"  MFU {flops[label] / med / 1e12 / args.peak_tflops:6.1%} of {args.peak_tflops:g}"
        print(line)
    if bf16:
        print(
            f"peak GPU memory ({'both models' if len(models) > 1 else 'sapiens2'}): {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
        )
    if args.no_baseline:
        return
    t_p, f_p = results["plain"]
    for label in [k for k in results if k != "plain"]:
        t_s, f_s = results[label]
        best = min(times[label]) / min(times["plain"])
        # Per-step ratios (the models' steps alternate), their median and spread.
        flop_ratio = f_s / f_p
        print(
            f"ratio {label}/plain: time {t_s / t_p:.2f}x (median), {best:.2f}x (best step); FLOPs "
            f"{flop_ratio:.2f}x; time per FLOP {(t_s / f_s) / (t_p / f_p):.2f}x (median)"
        )
        for what, (a, b) in {
            "wall": (times[label], times["plain"]),
            "process CPU time": (cpu_times[label], cpu_times["plain"]),
        }.items():
            ratios = sorted(s / p for s, p in zip(a, b))
            q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            med = statistics.median(ratios)
            print(
                f"  per-step ratios, {what}: median {med:.3f} (quartiles {q1:.3f}..{q3:.3f}, range "
                f"{ratios[0]:.3f}..{ratios[-1]:.3f}) = {med / flop_ratio:.3f}x per FLOP "
                f"(quartiles {q1 / flop_ratio:.3f}..{q3 / flop_ratio:.3f})"
            )
    print(
        "load average (1/5/15 min) before {:.1f}/{:.1f}/{:.1f}, after {:.1f}/{:.1f}/{:.1f}; {} cores".format(
            *load_before, *os.getloadavg(), os.cpu_count()
        )
    )


if __name__ == "__main__":
    main()
