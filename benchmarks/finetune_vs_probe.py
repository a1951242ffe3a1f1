"""Does end-to-end fine-tuning beat the frozen probe of the same backbone, and does pretraining
matter end to end? Three runs per dense task at equal steps, same data, heads and batch size:

- "probe": the pretrained backbone frozen, the task's head trained (``evaluation.probe_trainer.run_probe``);
- "fine-tune": the pretrained backbone + the same head trained end to end (``evaluation.finetune``:
  layer-wise lr decay, the reference's recipe, its augmentations);
- "fine-tune (random init)": the same fine-tune from a randomly initialised backbone.

    python benchmarks/finetune_vs_probe.py                        # 200 steps, SSL stand-in backbone
    python benchmarks/finetune_vs_probe.py --pretrain demo        # the platform's own pretraining on the demo corpus
    python benchmarks/finetune_vs_probe.py --checkpoint x.safetensors --steps 400

Image size: the synthetic set's (``--set synthetic.height=64 synthetic.width=48`` for a faster
look). The pretrained backbone: ``--pretrain ssl`` (default) trains ``evaluation.warmup.ssl_warmup``
(MAE + contrastive, no labels) for ``--pretrain-steps`` on freshly rendered synthetic images (the
probe tasks' image distribution, not their splits: a built-in advantage, say so when quoting);
``--pretrain demo`` curates the demo corpus and runs ``configs/pretrain_tiny.yaml``
(``benchmarks/probe_trained_vs_random.pretrain_on_demo``; 16 curated images: at this scale the
platform's pretraining need not beat random init, see that benchmark). Everything runs in this
process on the CPU (the Ray Train / FSDP2 path is the same code, tested in
tests/evaluation/finetune/); one seed per run, so differences of a few percent are noise.
Writes ``bench.json`` under ``--out``.
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
sys.path.insert(0, str(REPO))
for _key, _value in {"MLFLOW_DISABLE_TELEMETRY": "true", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
                     "YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "0"}.items():
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402

from evaluation.finetune.config import FinetuneConfig  # noqa: E402
from infra.config import load_config  # noqa: E402

HEADLINE = {"seg": ("mIoU", "higher"), "normal": ("mean_angle", "lower"), "pointmap": ("l2", "lower"),
            "albedo": ("mae", "lower"), "depth": ("abs_rel", "lower"), "pose": ("AP", "higher")}


def ssl_backbone(out: Path, steps: int, hw: tuple[int, int]) -> Path:
    from evaluation.warmup import ssl_warmup, synthetic_stream
    from models import build_backbone, save_state_dict_file

    torch.manual_seed(0)
    backbone = build_backbone("sapiens2_tiny")
    t0 = time.time()
    losses = ssl_warmup(backbone, synthetic_stream(512, hw, seed=1000)["images"], steps=steps, batch_size=16,
                        lr=1.5e-3)
    print(f"SSL stand-in: {steps} steps in {time.time() - t0:.0f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    return save_state_dict_file(backbone, out / "ssl_backbone.safetensors", metadata={"standin": "ssl", "steps": steps})


def finetune(cfg: FinetuneConfig, task: str, inputs, out: Path) -> dict[str, float]:
    from evaluation.finetune.data import train_loader
    from evaluation.finetune.engine import build_finetuner, evaluate, train_step

    torch.manual_seed(cfg.seed)
    ft = build_finetuner(cfg, task, inputs, device=torch.device("cpu"))
    t0 = time.time()
    for step, batch in enumerate(train_loader(ft.train_set, global_batch=cfg.batch_size_per_worker, seed=cfg.seed,
                                              start=0, stop=cfg.steps, rank=0, world=1, workers=0)):
        train_step(ft, batch, step)
    return {**evaluate(ft).compute(), "seconds": time.time() - t0}


def probe(cfg: FinetuneConfig, task: str, inputs, out: Path) -> dict[str, float]:
    from evaluation.features import FrozenBackbone, load_frozen_backbone
    from evaluation.finetune.engine import task_settings
    from evaluation.probe_trainer import run_probe

    backbone = load_frozen_backbone(cfg.backbone.name, cfg.backbone.checkpoint, seed=cfg.seed)
    s = dataclasses.replace(task_settings(cfg, task, inputs), steps=cfg.steps, lr=cfg.optim.lr,
                            batch_size=cfg.batch_size_per_worker, warmup_steps=cfg.optim.warmup_steps)
    return run_probe(task, s, inputs.data, FrozenBackbone(backbone, [cfg.feature_block]), out / f"probe_{task}",
                     seed=cfg.seed)


def verdict(value: float, ref: float, better: str) -> str:
    wins = value > ref if better == "higher" else value < ref
    return "better" if wins else ("same" if value == ref else "WORSE")


def table(results: dict) -> str:
    lines = [f"| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |",
             "|---|---|---|---|---|---|---|"]
    for task, r in results.items():
        name, better = HEADLINE[task]
        p, f, rnd = r["probe"][name], r["finetune"][name], r["finetune_random"][name]
        lines.append(f"| {task} | {name} ({better}) | {p:.4f} | {f:.4f} | {rnd:.4f} | {verdict(f, p, better)} | "
                     f"{verdict(f, rnd, better)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench/finetune_vs_probe")
    ap.add_argument("--tasks", default="seg,normal,pointmap,albedo,depth")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pretrain", choices=["ssl", "demo"], default="ssl")
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--checkpoint", default="", help="an official-layout backbone to use instead of pretraining one")
    ap.add_argument("--set", nargs="*", default=[], help="key=value overrides of configs/finetune_tiny.yaml")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    tasks = args.tasks.split(",")
    cfg = load_config(FinetuneConfig, REPO / "configs" / "finetune_tiny.yaml",
                      [f"output_dir={out}", f"tasks=[{', '.join(tasks)}]", f"steps={args.steps}", *args.set])
    hw = (cfg.synthetic.height, cfg.synthetic.width)
    cfg = dataclasses.replace(cfg, **{t: dataclasses.replace(cfg.task(t), image_size=list(hw)) for t in tasks})
    checkpoint = args.checkpoint or (str(ssl_backbone(out, args.pretrain_steps, hw)) if args.pretrain == "ssl" else
                                     _demo_backbone(out, args.pretrain_steps))
    return _compare(cfg, checkpoint, tasks, out)


def _demo_backbone(out: Path, steps: int) -> str:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from probe_trained_vs_random import pretrain_on_demo

    return pretrain_on_demo(out / "demo", steps, [])["student_weights"]


def _compare(cfg: FinetuneConfig, checkpoint: str, tasks: list[str], out: Path) -> int:
    from evaluation.finetune.tasks import resolve_inputs

    pretrained = dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, checkpoint=checkpoint))
    inputs = resolve_inputs(cfg, out)
    results = {}
    for task in tasks:
        results[task] = {"probe": probe(pretrained, task, inputs[task], out),
                         "finetune": finetune(pretrained, task, inputs[task], out),
                         "finetune_random": finetune(cfg, task, inputs[task], out)}
        print(f"{task}: " + "  ".join(f"{k} {HEADLINE[task][0]}={v[HEADLINE[task][0]]:.4f}"
                                     for k, v in results[task].items()), flush=True)
    print(f"\n{cfg.steps} steps each, batch {cfg.batch_size_per_worker}, backbone {cfg.backbone.name} "
          f"({checkpoint})\n" + table(results))
    (out / "bench.json").write_text(json.dumps({"steps": cfg.steps, "checkpoint": checkpoint, "results": results},
                                               indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
