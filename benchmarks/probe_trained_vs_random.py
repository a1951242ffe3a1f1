"""Does the platform's own pretraining beat a random backbone? The whole probe suite, same settings.

    python benchmarks/probe_trained_vs_random.py                      # 300 pretraining steps, configs/probe_tiny.yaml
    python benchmarks/probe_trained_vs_random.py --quick              # 150 steps, short probe schedules (a look)
    python benchmarks/probe_trained_vs_random.py --standins ssl,supervised   # + the stand-ins' table (separate)
    python benchmarks/probe_trained_vs_random.py --checkpoint runs/x/export/student_backbone.safetensors
    python benchmarks/probe_trained_vs_random.py --dataset runs/demo/curated   # pretrain on a curated version

Headline (only backbones this platform pretrained, all ``sapiens2_tiny``):

- "pretrained": the demo corpus (``pipelines.demo_corpus``) curated by the real pipeline
  (``configs/curate_demo.yaml``: CenterNet person detector; OCR off, as the pretraining tests
  do), then ``--pretrain-steps`` steps of ``configs/pretrain_tiny.yaml`` (the objective and code
  path of ``pipelines/pretrain.py``: Ray Train, FSDP2 over gloo) on those curated shards, in
  this process through the stage facades (``curation.stage.CurateStage``, ``training.stage.PretrainStage``). The
  exported student is probed (``--teacher`` probes the EMA teacher too).
- "random": the same architecture, randomly initialised.

Both go through ``run_probes`` (Ray Train, MLflow) with identical probe settings
(``configs/probe_tiny.yaml`` plus ``--quick`` and ``--set``), and the script prints each
metric, the difference pretrained - random, and whether it is better in the metric's own
direction. At this scale (16 curated demo images, tens to hundreds of CPU steps) the
pretrained backbone need not win every task; the table says where it does not. Each backbone
is probed once (no repeated seeds), so differences of a few percent are within run-to-run
noise; with ``--quick`` the pose probe (150 steps) stays at AP 0 for every backbone (its heads
need ~1000+ steps, see ``configs/probe_tiny.yaml``).

Built-in advantage (not the headline; only with ``--standins``): the stand-ins of
``evaluation.warmup``, trained on images from the same generator as the probe tasks:
"supervised" on two of the probe labels themselves (part shares, pose category), "ssl"
(MAE + contrastive, no labels) on the probe set's image distribution. Their table is
printed apart and says so. ``--checkpoint`` adds any official-layout file to the headline.

Writes ``table.md`` and ``bench.json`` under ``--out``; every run is in ``<out>/mlflow.db``.
Results: docs/results/pretraining.md.
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

for _key, _value in {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "YOLO_OFFLINE": "1",
    "YOLO_AUTOINSTALL": "0",
}.items():
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402

from evaluation import ProbeConfig, run_probes  # noqa: E402
from infra import tracking  # noqa: E402
from infra.config import load_config  # noqa: E402
from infra.digests import sha256_file  # noqa: E402

ROWS = [
    ("pose", "AP", "higher"),
    ("pose", "AP50", "higher"),
    ("pose", "AR", "higher"),
    ("seg", "mIoU", "higher"),
    ("seg", "mAcc", "higher"),
    ("pointmap", "l2", "lower"),
    ("pointmap", "rmse", "lower"),
    ("normal", "mean_angle", "lower"),
    ("normal", "median_angle", "lower"),
    ("normal", "within_11.25", "higher"),
    ("normal", "within_30", "higher"),
    ("albedo", "mae", "lower"),
    ("albedo", "psnr", "higher"),
    ("knn", "top1_k10", "higher"),
    ("knn", "top1_k20", "higher"),
]
# Short probe schedules for --quick (the demo DAG's probe settings).
QUICK_PROBE = [
    "synthetic.train_images=96",
    "synthetic.val_images=32",
    "pose.steps=150",
    "seg.steps=150",
    "pointmap.steps=150",
    "normal.steps=150",
    "albedo.steps=150",
]
CENTERNET = REPO.parent / "shared" / "assets" / "models" / "person_centernet_512.onnx"


def pretrain_on_demo(out: Path, steps: int, overrides: list[str]) -> dict:
    """Curate the demo corpus (CenterNet person detector, OCR off), pretrain on it; returns the
    pretraining stage's result."""
    from pipelines.demo_corpus import build_demo_corpus

    t0 = time.time()
    build_demo_corpus(out / "raw")
    return curate_and_pretrain(
        out, steps, [f"detector.weights={CENTERNET}", "content.text.enabled=false"], overrides, since=t0
    )


def pretrain_on_synthetic(out: Path, steps: int, count: int, hw: tuple[int, int], overrides: list[str]) -> dict:
    """Render ``count`` synthetic figures (``evaluation.synthetic``, a stream apart from the probe
    splits: seed 1000, as the stand-ins) as JPEG files, curate them with the real pipeline
    (decode, hashes, geometry, exact + near dedup, shards; no person detector: the renders are
    not photos of people) and pretrain on the curated shards; returns the pretraining stage's
    result."""
    import numpy as np
    from PIL import Image

    from evaluation.synthetic import render_sample

    t0 = time.time()
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        image = render_sample(np.random.default_rng([1000, 2, i]), hw)["image"]
        Image.fromarray(image).save(raw / f"figure_{i:06d}.jpg", quality=95)
    return curate_and_pretrain(
        out,
        steps,
        [
            "detector.backend=none",
            "content.text.enabled=false",
            "geometry.min_short_side=0",
            "input.images_per_partition=128",
        ],
        overrides,
        since=t0,
    )


def curate_and_pretrain(
    out: Path, steps: int, curation_overrides: list[str], pretrain_overrides: list[str], *, since: float
) -> dict:
    """``out/raw`` curated into ``out/curated`` (``configs/curate_demo.yaml`` + overrides), then
    ``steps`` of ``configs/pretrain_tiny.yaml`` on those shards, through the stage facades."""
    from curation.recipe import CurationConfig
    from curation.stage import CurateStage

    ccfg = load_config(
        CurationConfig,
        REPO / "configs" / "curate_demo.yaml",
        [f"input.uri={out / 'raw'}", f"output_dir={out / 'curated'}", *curation_overrides],
    )
    curated = CurateStage().run(ccfg).to_json()
    print(
        f"curated {out / 'raw'}: {curated['kept']} of {curated['inputs']} images kept in "
        f"{len(curated['shards'])} shards, dataset {curated['dataset_id']} ({time.time() - since:.0f}s)",
        flush=True,
    )
    return pretrain(out, steps, str(out / "curated"), pretrain_overrides, kept=curated["kept"])


def pretrain(out: Path, steps: int, dataset: str, overrides: list[str], *, kept: int | None = None) -> dict:
    """``steps`` of ``configs/pretrain_tiny.yaml`` on ``dataset`` (a curated folder, version id or
    name) through the pretraining stage's facade; returns its result."""
    from curation.output import CuratedOutput, resolve_dataset
    from training.config import PretrainConfig
    from training.stage import PretrainStage

    t1 = time.time()
    pcfg = load_config(
        PretrainConfig,
        REPO / "configs" / "pretrain_tiny.yaml",
        [
            f"data.dataset={dataset}",
            f"storage_path={out / 'pretrain'}",
            f"run_name=tiny-{steps}steps",
            f"steps={steps}",
            *overrides,
        ],
    )
    res = PretrainStage().run(pcfg).to_json()
    res["seconds"] = time.time() - t1
    if kept is None:
        kept = CuratedOutput.at(resolve_dataset(dataset, pcfg.data.tracking_uri).uri).stats()["kept"]
    res["kept"] = kept
    print(
        f"pretrained {steps} steps in {res['seconds']:.0f}s, loss {res['loss_trend']}; run {res['run_id']}", flush=True
    )
    return res


def record_standin_run(workspace: Path, checkpoint: Path, kind: str, steps: int, losses: list[float]) -> str:
    """An MLflow run with the tags the pretraining stage records, for a stand-in."""
    import mlflow

    uri = tracking.resolve_tracking_uri(None, str(workspace / "probe"))
    exp = tracking.get_experiment_id("pretraining-standins", uri)
    tags = {
        "humanvision.stage": "pretrain",
        "pretrain.kind": f"{kind}-warmup-standin",
        "dataset.id": f"synthetic-figures-seed1000-{kind}-{steps}steps",
        "dataset.uri": "generated:evaluation.synthetic",
        "checkpoint.student": str(checkpoint),
        "checkpoint.digest": sha256_file(checkpoint),
    }
    with mlflow.start_run(experiment_id=exp, run_name=f"{kind}-warmup-standin", tags=tags) as run:
        for step, loss in enumerate(losses):
            mlflow.log_metric("loss", loss, step=step)
        return run.info.run_id


def train_standin(kind: str, stream: dict, steps: int, out: Path) -> tuple[Path, float]:
    from evaluation.warmup import ssl_warmup, supervised_warmup
    from models import build_backbone, save_state_dict_file

    torch.manual_seed(0)
    backbone = build_backbone("sapiens2_tiny")
    t0 = time.time()
    if kind == "ssl":
        losses = ssl_warmup(backbone, stream["images"], steps=steps, batch_size=16, lr=1.5e-3)
    else:
        losses = supervised_warmup(backbone, stream, steps=steps, batch_size=16, lr=1e-3)
    seconds = time.time() - t0
    ckpt = save_state_dict_file(
        backbone, out / f"sapiens2_tiny_{kind}.safetensors", metadata={"standin": kind, "steps": steps}
    )
    run_id = record_standin_run(out, ckpt, kind, steps, losses)
    print(
        f"stand-in {kind}: {steps} steps in {seconds:.0f}s, loss {losses[0]:.3f} -> "
        f"{sum(losses[-10:]) / min(10, len(losses)):.3f}; run {run_id}",
        flush=True,
    )
    return ckpt, seconds


def is_better(value: float, ref: float, better: str) -> str:
    if value == ref:
        return "tie"
    return "yes" if (value > ref) == (better == "higher") else "NO"


def compare(results: dict, names: list[str], ref: str, title: str) -> tuple[str, dict]:
    """A markdown table of ``names`` with, for each, the difference to ``ref`` and whether it is better."""
    others = [n for n in names if n != ref]
    head = ["task", "metric", "better", *names] + [h for n in others for h in (f"{n} - {ref}", f"{n} better?")]
    lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    wins = {n: {"better": [], "worse": [], "tie": []} for n in others}
    for task, metric, better in ROWS:
        if not all(task in results[n].metrics and metric in results[n].metrics[task] for n in names):
            continue
        values = {n: float(results[n].metrics[task][metric]) for n in names}
        cells = [f"{values[n]:.4g}" for n in names]
        for n in others:
            verdict = is_better(values[n], values[ref], better)
            wins[n]["better" if verdict == "yes" else "worse" if verdict == "NO" else "tie"].append(f"{task}.{metric}")
            cells += [f"{values[n] - values[ref]:+.4g}", verdict]
        lines.append(f"| {task} | {metric} | {better} | " + " | ".join(cells) + " |")
    for n in others:
        w = wins[n]
        lines.append("")
        lines.append(
            f"{n} vs {ref}: better on {len(w['better'])} of {sum(len(v) for v in w.values())} metrics; "
            f"worse on: {', '.join(w['worse']) or 'none'}" + (f"; tied: {', '.join(w['tie'])}" if w["tie"] else "")
        )
    return "\n".join(lines), wins


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / "runs" / "bench-probe"))
    p.add_argument("--pretrain-steps", type=int, default=0, help="default 300 (150 with --quick)")
    p.add_argument(
        "--pretrain-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="pretraining settings over configs/pretrain_tiny.yaml",
    )
    p.add_argument(
        "--dataset",
        default="",
        help="pretrain on this curated version (folder, id or name) instead of curating the demo corpus",
    )
    p.add_argument("--teacher", action="store_true", help="probe the pretrained EMA teacher as well")
    p.add_argument("--quick", action="store_true", help="short probe schedules (150 steps a task, 96 train images)")
    p.add_argument(
        "--standins", default="none", help="comma list of ssl, supervised: the built-in-advantage table (default none)"
    )
    p.add_argument("--checkpoint", default="", help="also probe this official-layout file (headline table)")
    p.add_argument("--warmup-steps", type=int, default=300, help="stand-ins' training steps")
    p.add_argument("--warmup-images", type=int, default=1024)
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="probe settings over configs/probe_tiny.yaml, e.g. --set pose.steps=100 seg.steps=50",
    )
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = args.pretrain_steps or (150 if args.quick else 300)
    probe_set = [*(QUICK_PROBE if args.quick else []), *args.set]

    if args.dataset:
        pre = pretrain(out, steps, args.dataset, args.pretrain_set)
    else:
        pre = pretrain_on_demo(out, steps, args.pretrain_set)
    headline = {"pretrained": pre["student_weights"]}
    if args.teacher:
        headline["pretrained-teacher"] = pre["teacher_weights"]
    if args.checkpoint:
        headline["checkpoint"] = str(Path(args.checkpoint).resolve())
    headline["random"] = ""
    standin_paths, warm_seconds = {}, {}
    standins = [k for k in args.standins.split(",") if k and k != "none"]
    if standins:
        from evaluation.warmup import synthetic_stream

        stream = synthetic_stream(args.warmup_images, (128, 96), seed=1000)
        for kind in standins:
            standin_paths[f"standin-{kind}"], warm_seconds[kind] = train_standin(kind, stream, args.warmup_steps, out)

    results, seconds = {}, {}
    for name, checkpoint in {**headline, **standin_paths}.items():
        cfg = load_config(
            ProbeConfig,
            REPO / "configs" / "probe_tiny.yaml",
            [f"output_dir={out / ('probe-' + name)}", f"backbone.checkpoint={checkpoint}", *probe_set],
        )
        t1 = time.time()
        results[name] = run_probes(cfg)
        seconds[name] = time.time() - t1
        print(results[name].summary(), flush=True)

    print(
        f"\nprobe settings: configs/probe_tiny.yaml {' '.join(probe_set) or '(as shipped)'}; "
        f"pretraining: {steps} steps of configs/pretrain_tiny.yaml on {pre['kept']} curated demo images"
    )
    table, wins = compare(
        results,
        list(headline),
        "random",
        "Headline: backbones this platform pretrained vs random init (same probe settings)",
    )
    print("\n" + table)
    tables = [table]
    if standin_paths:
        st_table, _ = compare(
            results,
            [*standin_paths, "random"],
            "random",
            "BUILT-IN ADVANTAGE, not evidence for pretraining: stand-ins trained on the probe "
            "generator's own images (supervised: on two of the probe labels)",
        )
        print("\n" + st_table)
        tables.append(st_table)
    for name in results:
        lin = results[name].lineage
        print(
            f"{name}: checkpoint {lin.checkpoint_path} -> pretraining run {lin.pretrain_run_id or '-'} "
            f"(found by {lin.source}), dataset {lin.dataset_id or '-'}; probes {seconds[name]:.0f}s"
        )
    (out / "table.md").write_text("\n\n".join(tables) + "\n")
    (out / "bench.json").write_text(
        json.dumps(
            {
                "pretrain_steps": steps,
                "pretrain": pre,
                "probe_overrides": probe_set,
                "standin_warmup_steps": args.warmup_steps if standins else 0,
                "standin_seconds": warm_seconds,
                "seconds": seconds,
                "wins": wins,
                "metrics": {k: r.metrics for k, r in results.items()},
                "lineage": {k: dataclasses.asdict(r.lineage) for k, r in results.items()},
            },
            indent=1,
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
