"""Does end-to-end fine-tuning beat the frozen probe of the same backbone, and does pretraining
matter end to end? Three runs per dense task at equal steps, same data, heads, batch size and
head lr, each once per seed (``--seeds``; mean ± half the range, paired wins per seed):

- "probe": the pretrained backbone frozen, the task's head trained (``evaluation.probe_trainer.run_probe``);
- "fine-tune": the pretrained backbone + the same head trained end to end (``evaluation.finetune``:
  layer-wise lr decay as the reference, with ``RECIPE`` on top of configs/finetune_tiny.yaml);
- "fine-tune (random init)": the same fine-tune recipe from a randomly initialised backbone.

    python benchmarks/finetune_vs_probe.py --pretrain synthetic   # the platform's pretraining on curated renders
    python benchmarks/finetune_vs_probe.py --pretrain demo        # the platform's pretraining on the demo corpus
    python benchmarks/finetune_vs_probe.py                        # default: the ssl stand-in, 1500 steps
    python benchmarks/finetune_vs_probe.py --pretrain mae         # the MAE-only stand-in (the v1 objective)
    python benchmarks/finetune_vs_probe.py --checkpoint x.safetensors --steps 400 --seeds 0,1,2,3
    python benchmarks/finetune_vs_probe.py --tasks seg,pose --task-steps pose=1000   # per-task steps

The backbone: ``--pretrain synthetic`` renders ``--pretrain-images`` figures (``evaluation.synthetic``,
a stream apart from the probe splits), curates them with the real pipeline (no person detector:
they are renders) and runs the platform's pretraining stage (``configs/pretrain_tiny.yaml``: the
Sapiens2 objective, Ray Train, FSDP2) on the curated shards for ``--pretrain-steps``;
``--pretrain demo`` does the same on the curated demo corpus (both through
``benchmarks/probe_trained_vs_random.py``). The stand-ins are no pretraining of the platform:
``ssl`` (``evaluation.warmup.ssl_warmup``: MAE + contrastive, no labels) and ``mae`` (MAE alone,
visible patches at full weight; ``STANDINS``) train in this process on ``--pretrain-images``
freshly rendered images of the probe tasks' distribution, a built-in advantage: say so when
quoting them. ``--checkpoint`` takes any official-layout backbone instead.

Pose is scored without flip test in all three runs (``PROTOCOL``); depth gets RMSE and delta1
beside AbsRel (``DEPTH_METRICS``). Image size: the synthetic set's (``--set synthetic.height=64
synthetic.width=48`` for a faster look). Everything but the platform's pretraining runs in this
process on the CPU (the Ray Train / FSDP2 fine-tuning path is the same code, tested in
tests/evaluation/finetune/). Prints one line per task and seed, then the table; writes
``bench.json`` under ``--out``. Results, the recipe study behind ``RECIPE`` included:
docs/results/finetune_vs_probe.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _key, _value in {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "YOLO_OFFLINE": "1",
    "YOLO_AUTOINSTALL": "0",
}.items():
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402

from evaluation.finetune.config import FinetuneConfig  # noqa: E402
from infra.config import load_config  # noqa: E402

# The fine-tune recipe compared here (on top of configs/finetune_tiny.yaml; --set goes on top):
# horizontal flips only (left/right classes, normals and points mirrored); why: the recipe study
# in docs/results/finetune_vs_probe.md.
RECIPE = ["augment.rotation_prob=0", "augment.scale=[1.0,1.0]", "augment.photometric_prob=0"]
# One evaluation protocol for the three runs: the probe's pose evaluator has no flip test, so the
# fine-tunes are scored without it too (the fine-tune stage's default is flip_test=true).
PROTOCOL = ["flip_test=false"]
# Depth's other two metrics, beside its AbsRel. (The metric-Z target's split of AbsRel into the
# figure's distance and its shape, abs_rel_aligned / log_scale_err, was dropped with that target:
# the relative target has no distance, and abs_rel_aligned came out within 3% of AbsRel.)
DEPTH_METRICS = {"rmse": "lower", "delta1": "higher"}
HEADLINE = {
    "seg": ("mIoU", "higher"),
    "normal": ("mean_angle", "lower"),
    "pointmap": ("l2", "lower"),
    "albedo": ("mae", "lower"),
    "depth": ("abs_rel", "lower"),
    "pose": ("AP", "higher"),
}


# The label-free stand-ins (``evaluation.warmup.ssl_warmup`` settings): "ssl" is the Sapiens2-like
# objective (MAE + contrastive); "mae" is MAE alone, the Sapiens v1 objective, with the visible
# patches reconstructed at full weight (why: the pose section of docs/results/finetune_vs_probe.md).
STANDINS = {"ssl": {}, "mae": {"contrastive_weight": 0.0, "visible_weight": 1.0}}


def ssl_backbone(out: Path, steps: int, hw: tuple[int, int], kind: str = "ssl", images: int = 512) -> Path:
    from evaluation.warmup import ssl_warmup, synthetic_stream
    from models import build_backbone, save_state_dict_file

    torch.manual_seed(0)
    backbone = build_backbone("sapiens2_tiny")
    t0 = time.time()
    losses = ssl_warmup(
        backbone,
        synthetic_stream(images, hw, seed=1000)["images"],
        steps=steps,
        batch_size=16,
        lr=1.5e-3,
        **STANDINS[kind],
    )
    print(
        f"{kind} stand-in: {steps} steps in {time.time() - t0:.0f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}",
        flush=True,
    )
    return save_state_dict_file(
        backbone, out / f"{kind}_backbone.safetensors", metadata={"standin": kind, "steps": steps}
    )


def finetune(cfg: FinetuneConfig, task: str, inputs, out: Path) -> dict[str, float]:
    from evaluation.finetune.data import train_loader
    from evaluation.finetune.engine import build_finetuner, evaluate, train_step

    torch.manual_seed(cfg.seed)
    ft = build_finetuner(cfg, task, inputs, device=torch.device("cpu"))
    t0 = time.time()
    for step, batch in enumerate(
        train_loader(
            ft.train_set,
            global_batch=cfg.batch_size_per_worker,
            seed=cfg.seed,
            start=0,
            stop=cfg.steps,
            rank=0,
            world=1,
            workers=0,
        )
    ):
        train_step(ft, batch, step)
    return {**evaluate(ft).compute(), "seconds": time.time() - t0}


def probe(cfg: FinetuneConfig, task: str, inputs, out: Path) -> dict[str, float]:
    from evaluation.features import FrozenBackbone, load_frozen_backbone
    from evaluation.finetune.engine import task_settings
    from evaluation.probe_trainer import run_probe

    backbone = load_frozen_backbone(cfg.backbone.name, cfg.backbone.checkpoint, seed=cfg.seed)
    s = dataclasses.replace(
        task_settings(cfg, task, inputs),
        steps=cfg.steps,
        lr=cfg.optim.lr,
        batch_size=cfg.batch_size_per_worker,
        warmup_steps=cfg.optim.warmup_steps,
    )
    extractor = FrozenBackbone(backbone, [cfg.feature_block])
    return run_probe(task, s, inputs.data, extractor, out / f"probe_{task}", seed=cfg.seed)


def _stats(values: list[float]) -> tuple[float, float]:
    """Mean and half the range (max - min) / 2 over seeds."""
    return sum(values) / len(values), (max(values) - min(values)) / 2


def verdict(values: list[float], refs: list[float], better: str) -> str:
    """On the seed means, and how many seeds (paired: same seed, same data order) win; "clear"
    when every fine-tune seed beats every baseline seed (the ranges do not overlap; 2+ seeds)."""
    sign = 1 if better == "higher" else -1
    mean, ref = _stats(values)[0], _stats(refs)[0]
    wins = sum(sign * (v - r) > 0 for v, r in zip(values, refs))
    word = "better" if sign * (mean - ref) > 0 else ("same" if mean == ref else "WORSE")
    clear = sign * (min(values) - max(refs)) > 0 if sign > 0 else sign * (max(values) - min(refs)) > 0
    clear_worse = sign * (max(values) - min(refs)) < 0 if sign > 0 else sign * (min(values) - max(refs)) < 0
    tag = " (clear)" if len(values) > 1 and ((word == "better" and clear) or (word == "WORSE" and clear_worse)) else ""
    return f"{word}{tag}, {wins}/{len(values)} seeds"


def table(results: dict) -> str:
    """``results[task][run]``: the headline metric per seed."""

    def cell(v: list[float]) -> str:
        m, h = _stats(v)
        return f"{m:.4f} ± {h:.4f}"

    lines = [
        "| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, r in results.items():
        for name, better in [HEADLINE[task], *(DEPTH_METRICS.items() if task == "depth" else [])]:
            p, f, rnd = ([m[name] for m in r[k]] for k in ("probe", "finetune", "finetune_random"))
            lines.append(
                f"| {task} | {name} ({better}) | {cell(p)} | {cell(f)} | {cell(rnd)} | "
                f"{verdict(f, p, better)} | {verdict(f, rnd, better)} |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench/finetune_vs_probe")
    ap.add_argument("--tasks", default="seg,normal,pointmap,albedo,depth")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument(
        "--task-steps",
        nargs="*",
        default=[],
        metavar="TASK=STEPS",
        help="another step count for a task's three runs (e.g. pose=1000)",
    )
    ap.add_argument("--pretrain", choices=[*STANDINS, "synthetic", "demo"], default="ssl")
    ap.add_argument("--pretrain-steps", type=int, default=1500)
    ap.add_argument("--pretrain-images", type=int, default=512, help="figures rendered for the pretraining")
    ap.add_argument(
        "--pretrain-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="--pretrain synthetic/demo: settings over configs/pretrain_tiny.yaml",
    )
    ap.add_argument("--seeds", default="0,1,2", help="every run once per seed (head init, data order, augmentation)")
    ap.add_argument("--checkpoint", default="", help="an official-layout backbone to use instead of pretraining one")
    ap.add_argument("--set", nargs="*", default=[], help="key=value overrides of configs/finetune_tiny.yaml")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    tasks = args.tasks.split(",")
    cfg = load_config(
        FinetuneConfig,
        REPO / "configs" / "finetune_tiny.yaml",
        [f"output_dir={out}", f"tasks=[{', '.join(tasks)}]", f"steps={args.steps}", *RECIPE, *PROTOCOL, *args.set],
    )
    hw = (cfg.synthetic.height, cfg.synthetic.width)
    cfg = dataclasses.replace(cfg, **{t: dataclasses.replace(cfg.task(t), image_size=list(hw)) for t in tasks})
    steps = {t: cfg.steps for t in tasks}
    for item in args.task_steps:
        task, _, n = item.partition("=")
        if task not in steps or not n.isdigit() or int(n) < 1:
            ap.error(f"--task-steps {item!r}: expected TASK=STEPS with TASK one of --tasks ({', '.join(tasks)})")
        steps[task] = int(n)
    checkpoint = args.checkpoint or _pretrained(args, out, hw)
    return _compare(cfg, checkpoint, steps, out, [int(x) for x in args.seeds.split(",")])


def _pretrained(args, out: Path, hw: tuple[int, int]) -> str:
    """The pretrained backbone's file: the SSL stand-in, or the platform's pretraining stage on
    curated shards (of rendered figures, or of the demo corpus)."""
    if args.pretrain in STANDINS:
        return str(ssl_backbone(out, args.pretrain_steps, hw, args.pretrain, args.pretrain_images))
    from probe_trained_vs_random import pretrain_on_demo, pretrain_on_synthetic

    if args.pretrain == "demo":
        return pretrain_on_demo(out / "demo", args.pretrain_steps, args.pretrain_set)["student_weights"]
    return pretrain_on_synthetic(out / "synthetic", args.pretrain_steps, args.pretrain_images, hw, args.pretrain_set)[
        "student_weights"
    ]


def _compare(cfg: FinetuneConfig, checkpoint: str, steps: dict[str, int], out: Path, seeds: list[int]) -> int:
    """``steps``: each task's step count (the same for its three runs)."""
    from evaluation.finetune.tasks import resolve_inputs

    pretrained = dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, checkpoint=checkpoint))
    inputs = resolve_inputs(cfg, out)
    runs = {"probe": (probe, pretrained), "finetune": (finetune, pretrained), "finetune_random": (finetune, cfg)}
    results = {}
    for task, n in steps.items():
        results[task] = {k: [] for k in runs}
        for seed in seeds:
            for kind, (fn, c) in runs.items():
                results[task][kind].append(fn(dataclasses.replace(c, seed=seed, steps=n), task, inputs[task], out))
            print(
                f"{task} seed {seed}: "
                + "  ".join(
                    f"{k} {HEADLINE[task][0]}={v[-1][HEADLINE[task][0]]:.4f}" for k, v in results[task].items()
                ),
                flush=True,
            )
    o = cfg.optim
    print(
        f"\nsteps per run {steps}, batch {cfg.batch_size_per_worker}, {cfg.synthetic.height}x{cfg.synthetic.width}, "
        f"seeds {seeds} (mean ± half-range), "
        f"backbone {cfg.backbone.name} ({checkpoint})\nfine-tune: lr {o.lr} (the probe's too), backbone x"
        f"{o.backbone_lr_scale}, layer decay {o.layer_decay}, backbone frozen for {o.freeze_backbone_steps} steps, "
        f"warm-up {o.warmup_steps}, augment {'on' if cfg.augment.enabled else 'off'} (rotation p "
        f"{cfg.augment.rotation_prob}, scale {list(cfg.augment.scale)}), flip test {cfg.flip_test}\n" + table(results)
    )
    if "depth" in results:
        for kind, runs_ in results["depth"].items():
            print(
                f"depth {kind} per seed: "
                + "; ".join(", ".join(f"{k} {m[k]:.4f}" for k in ("rmse", "abs_rel", "delta1")) for m in runs_)
            )
    (out / "bench.json").write_text(
        json.dumps(
            {
                "steps": steps,
                "seeds": seeds,
                "checkpoint": checkpoint,
                "synthetic": dataclasses.asdict(cfg.synthetic),
                "optim": dataclasses.asdict(o),
                "results": results,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
