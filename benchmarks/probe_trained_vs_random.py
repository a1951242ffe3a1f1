"""Trained versus random backbones through the whole probe suite on the synthetic probe set.

    python benchmarks/probe_trained_vs_random.py                  # ~45-60 min on 2 busy CPU cores
    python benchmarks/probe_trained_vs_random.py --standins ssl --warmup-steps 50 --set pose.steps=100   # a quick look
    python benchmarks/probe_trained_vs_random.py --standins none --checkpoint runs/x/export/student_backbone.safetensors

Backbones (all ``sapiens2_tiny``): "random", randomly initialised (seed 0); and the trained
stand-ins of ``evaluation.warmup`` (``--standins``), each trained from the same seed on
1024 synthetic images that are not in the probe splits, saved as an official-layout
``.safetensors`` and recorded as a pretraining run in the workspace's MLflow store (so the
probe finds it by digest): "ssl" (MAE + contrastive CLS, no labels) and "supervised"
(patch part-class shares + CLS pose category). ``--checkpoint`` adds any official-layout
file, e.g. the pretraining stage's export. Every backbone goes through ``run_probes`` (Ray
Train, MLflow) with the same probe settings (``configs/probe_tiny.yaml`` plus ``--set``);
the script prints the metric table and writes ``table.md`` and ``bench.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

for _key, _value in {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "0"}.items():
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402

from evaluation import ProbeConfig, run_probes  # noqa: E402
from evaluation.io import sha256_file  # noqa: E402
from evaluation.warmup import ssl_warmup, supervised_warmup, synthetic_stream  # noqa: E402
from infra import tracking  # noqa: E402
from infra.config import load_config  # noqa: E402
from models import build_backbone, save_state_dict_file  # noqa: E402

ROWS = [("pose", "AP", "higher"), ("pose", "AP50", "higher"), ("pose", "AR", "higher"),
        ("seg", "mIoU", "higher"), ("seg", "mAcc", "higher"),
        ("pointmap", "l2", "lower"), ("pointmap", "rmse", "lower"),
        ("normal", "mean_angle", "lower"), ("normal", "median_angle", "lower"), ("normal", "within_11.25", "higher"),
        ("normal", "within_30", "higher"),
        ("albedo", "mae", "lower"), ("albedo", "psnr", "higher"),
        ("knn", "top1_k10", "higher"), ("knn", "top1_k20", "higher")]


def record_pretrain_run(workspace: Path, checkpoint: Path, kind: str, steps: int, losses: list[float]) -> str:
    """An MLflow run with the tags the pretraining stage records, for a stand-in."""
    import mlflow

    uri = tracking.resolve_tracking_uri(None, str(workspace / "probe"))
    exp = tracking.get_experiment_id("pretraining-standins", uri)
    tags = {"humanvision.stage": "pretrain", "pretrain.kind": f"{kind}-warmup-standin",
            "dataset.id": f"synthetic-figures-seed1000-{kind}-{steps}steps",
            "dataset.uri": "generated:evaluation.synthetic",
            "checkpoint.student": str(checkpoint), "checkpoint.digest": sha256_file(checkpoint)}
    with mlflow.start_run(experiment_id=exp, run_name=f"{kind}-warmup-standin", tags=tags) as run:
        for step, loss in enumerate(losses):
            mlflow.log_metric("loss", loss, step=step)
        return run.info.run_id


def train_standin(kind: str, stream: dict, steps: int, out: Path) -> tuple[Path, float]:
    torch.manual_seed(0)
    backbone = build_backbone("sapiens2_tiny")
    t0 = time.time()
    if kind == "ssl":
        losses = ssl_warmup(backbone, stream["images"], steps=steps, batch_size=16, lr=1.5e-3)
    else:
        losses = supervised_warmup(backbone, stream, steps=steps, batch_size=16, lr=1e-3)
    seconds = time.time() - t0
    ckpt = save_state_dict_file(backbone, out / f"sapiens2_tiny_{kind}.safetensors",
                                metadata={"standin": kind, "steps": steps})
    run_id = record_pretrain_run(out, ckpt, kind, steps, losses)
    print(f"{kind} warm-up: {steps} steps in {seconds:.0f}s, loss {losses[0]:.3f} -> "
          f"{sum(losses[-10:]) / min(10, len(losses)):.3f}; pretraining run {run_id}", flush=True)
    return ckpt, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / "runs" / "bench-probe"))
    p.add_argument("--standins", default="ssl,supervised", help="comma list of ssl, supervised; or none")
    p.add_argument("--checkpoint", default="", help="also probe this official-layout file")
    p.add_argument("--warmup-steps", type=int, default=300)
    p.add_argument("--warmup-images", type=int, default=1024)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="probe settings over configs/probe_tiny.yaml, e.g. --set pose.steps=100 seg.steps=50")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    backbones, warm_seconds = {}, {}
    standins = [k for k in args.standins.split(",") if k and k != "none"]
    if standins:
        stream = synthetic_stream(args.warmup_images, (128, 96), seed=1000)
        for kind in standins:
            backbones[kind], warm_seconds[kind] = train_standin(kind, stream, args.warmup_steps, out)
    if args.checkpoint:
        backbones["checkpoint"] = Path(args.checkpoint)
    backbones["random"] = ""

    results, seconds = {}, {}
    for name, checkpoint in backbones.items():
        cfg = load_config(ProbeConfig, REPO / "configs" / "probe_tiny.yaml",
                          [f"output_dir={out / ('probe-' + name)}", f"backbone.checkpoint={checkpoint}", *args.set])
        t1 = time.time()
        results[name] = run_probes(cfg)
        seconds[name] = time.time() - t1
        print(results[name].summary(), flush=True)

    names = list(results)
    lines = ["| task | metric | better | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for task, metric, better in ROWS:
        values = [results[k].metrics[task][metric] for k in names]
        best = max(values) if better == "higher" else min(values)
        cells = [f"{v:.4g}{' *' if v == best and values.count(best) == 1 else ''}" for v in values]
        lines.append(f"| {task} | {metric} | {better} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(f"\n{table}\n(* = the best of the row)")
    for name in names:
        lin = results[name].lineage
        print(f"{name}: checkpoint {lin.checkpoint_path} -> pretraining run {lin.pretrain_run_id or '-'} "
              f"(found by {lin.source}), dataset {lin.dataset_id or '-'}; probes {seconds[name]:.0f}s")
    (out / "table.md").write_text(table + "\n")
    (out / "bench.json").write_text(json.dumps({
        "warmup_steps": args.warmup_steps, "warmup_seconds": warm_seconds, "probe_overrides": args.set,
        "seconds": seconds,
        "metrics": {k: r.metrics for k, r in results.items()},
        "lineage": {k: dataclasses.asdict(r.lineage) for k, r in results.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
