"""Why does the DINO CLS term (``loss_cl``) stay near ln K? One-process diagnostics of pretraining.

    python benchmarks/dino_diagnostics.py                                  # configs/pretrain_tiny.yaml, 400 steps
    python benchmarks/dino_diagnostics.py --steps 600 --every 25 --set loss.num_prototypes=1024
    python benchmarks/dino_diagnostics.py --set teacher.momentum=0.996 --set loss.koleo_weight=0

Trains ``SSLMetaArch`` in this process (no Ray, no FSDP), fp32, torch with ``--threads``
threads (default 1), with the real ``train_step`` / ``values_at`` / ``ResumableLoader`` on
``--images`` synthetic figures (``evaluation.synthetic.render_sample``, seed stream [1000, 2, i],
as ``benchmarks/probe_trained_vs_random.py`` renders them) written as WebDataset shards in the
curated layout (``<key>.jpg`` + ``<key>.json``; cached under ``--shards``). ``--set key=value``
overrides ``configs/pretrain_tiny.yaml`` (``infra.config.load_config``); the script itself sets
fp32, no activation checkpointing, ``batch_size_per_worker=--batch`` (8 = the tiny run's 2
workers x 4) and ``steps=--steps`` (so the lr / momentum cosines span this run).

Every ``--every`` steps (and at step 1) it prints one row of THAT step's batch: the loss parts,
the teacher's and student's entropies, the spread of the teacher CLS, collapse indicators and
gradient norms (``LEGEND``, also in ``--help``). At the end: the mean over the last ``--every``
steps for mae and cl against ln K, the wall time, and (``--json``) every row written as JSON.
``--head-init-std``, ``--head-frozen-bias`` and ``--layerscale`` are experiments on the modules
(not settings of any config). Results: docs/results/dino_diagnostics.md.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
# What each printed column is (values of the reported step's batch).
LEGEND = {
    "mae, cl, koleo": "the loss parts train_step returned (cl is in nats; ln K is printed in the header)",
    "H_t": "mean over the batch of the teacher's entropy H(p_t), p_t = softmax((t - c) / T_t) with the "
    "centre c as the loss used it (ln K = a uniform teacher)",
    "H_s": "mean over the batch of the student's entropy H(softmax(s / T_s)) (all views)",
    "H_mean_t": "entropy of the batch-mean teacher distribution (ln K = prototypes used evenly; low = every "
    "sample on the same few prototypes)",
    "pmax_t": "mean over the batch of the teacher's largest probability",
    "cls_std": "std over the batch of the L2-normalised teacher CLS (backbone output), mean over dimensions, "
    "times sqrt(D): ~1 = spread like random directions, -> 0 = one constant CLS",
    "logit_sd": "std over the batch of the teacher's head logits (cosines), mean over prototypes: what "
    "survives centring (sharpened by 1 / T_t)",
    "|c|": "L2 norm of the DINO centre",
    "z_mean": "norm of the batch mean of the teacher's L2-normalised bottleneck vectors (1 = every sample "
    "maps to the same point before the prototypes)",
    "proto_mean": "norm of the mean of the student's L2-normalised prototypes (~1/sqrt(bottleneck) at init; "
    "1 = all prototypes one direction, so every logit is the same and q is uniform)",
    "g_head, g_bb": "gradient norms (before clipping) of the student's dino_head and backbone",
    "gcl_bb, gmae_bb": "(--per-loss-grads) backbone gradient norm of the weighted CL term alone and of the "
    "MAE term alone (one extra forward/backward on the same batch, no update)",
}


def write_figure_shards(folder: Path, count: int, hw: tuple[int, int], per_shard: int = 128) -> list[str]:
    """``count`` rendered figures as JPEG WebDataset shards in the curated layout, written by the
    curation writer's ``write_tar`` (cached: a folder that already holds a ``done.json`` for the
    same count and size is reused)."""
    from PIL import Image

    from curation.writer import write_tar
    from evaluation.synthetic import render_sample
    from infra import storage

    marker = folder / "done.json"
    want = {"count": count, "hw": list(hw), "per_shard": per_shard}
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return sorted(str(p) for p in folder.glob("*.tar"))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.tar"):
        old.unlink()
    fs, root = storage.resolve(str(folder))
    H, W = hw
    paths = []
    for s, start in enumerate(range(0, count, per_shard)):
        rows = []
        for i in range(start, min(count, start + per_shard)):
            buf = io.BytesIO()
            Image.fromarray(render_sample(np.random.default_rng([1000, 2, i]), hw)["image"]).save(
                buf, format="JPEG", quality=95
            )
            rows.append(
                {"key": f"figure_{i:06d}", "image_ext": "jpg", "image": buf.getvalue(), "width": W, "height": H}
            )
        path = f"{root}/{s:06d}-figures.tar"
        write_tar(fs, path, rows)
        paths.append(str(folder / f"{s:06d}-figures.tar"))
    marker.write_text(json.dumps(want))
    return paths


def entropy(p_BK: torch.Tensor) -> torch.Tensor:
    return -(p_BK * torch.log(p_BK.clamp_min(1e-30))).sum(dim=-1)


def grad_norm(module: torch.nn.Module) -> float:
    grads = [p.grad.detach().flatten() for p in module.parameters() if p.grad is not None]
    return float(torch.cat(grads).norm()) if grads else 0.0


def per_loss_backbone_grads(arch, batch, teacher_temp: float) -> tuple[float, float]:
    """Backbone gradient norms of the weighted CL term and of the MAE term, separately (no
    update): one forward with hooks that keep each loss module's output (with its graph)."""
    w = arch.cfg.loss
    terms: dict[str, torch.Tensor] = {}
    hooks = [
        arch.dino_loss.register_forward_hook(lambda _m, _i, o: terms.__setitem__("cl", o)),
        arch.mae_loss.register_forward_hook(lambda _m, _i, o: terms.__setitem__("mae", o)),
    ]
    try:
        arch(batch.global_crops, batch.local_crops, batch.masks, teacher_temp=teacher_temp)
    finally:
        for h in hooks:
            h.remove()
    params = [p for p in arch.student["backbone"].parameters() if p.requires_grad]
    norms = []
    for name, weight in (("cl", w.cl_weight), ("mae", w.mae_weight)):
        grads = torch.autograd.grad(weight * terms[name], params, allow_unused=True, retain_graph=True)
        norms.append(float(torch.cat([g.flatten() for g in grads if g is not None]).norm()))
    return norms[0], norms[1]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="columns:\n" + "\n".join(f"  {k:16s} {v}" for k, v in LEGEND.items()),
    )
    ap.add_argument("--config", default=str(REPO / "configs" / "pretrain_tiny.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--image-hw", type=int, nargs=2, default=(128, 96))
    ap.add_argument("--shards", default="/tmp/dino_diag_shards")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loader-workers", type=int, default=0)
    ap.add_argument("--per-loss-grads", action="store_true")
    ap.add_argument(
        "--head-init-std",
        type=float,
        default=0.0,
        help="experiment: re-initialise the DINO head's MLP weights with this std (0 = as built)",
    )
    ap.add_argument(
        "--head-frozen-bias",
        action="store_true",
        help="experiment: the DINO head's MLP biases stay at zero (not trained)",
    )
    ap.add_argument(
        "--layerscale",
        type=float,
        default=0.0,
        help="experiment: re-initialise the backbone's LayerScale weights to this value (0 = as built)",
    )
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    from infra.config import load_config
    from training.config import PretrainConfig
    from training.data import RankSpec, ResumableLoader
    from training.meta_arch import SSLMetaArch
    from training.optim import build_optimizer
    from training.schedules import values_at
    from training.step import train_step

    torch.set_num_threads(args.threads)
    shards = write_figure_shards(Path(args.shards), args.images, tuple(args.image_hw))
    overrides = [
        "parallel.precision=fp32",
        "parallel.activation_checkpointing=false",
        f"batch_size_per_worker={args.batch}",
        f"steps={args.steps}",
        f"data.loader_workers={args.loader_workers}",
        f"data.dataset={args.shards}",
        *args.set,
    ]
    cfg = load_config(PretrainConfig, args.config, overrides)
    torch.manual_seed(cfg.seed)
    arch = SSLMetaArch(cfg)
    for m in arch.student["dino_head"].mlp.modules():
        if isinstance(m, torch.nn.Linear):
            if args.head_init_std > 0:
                torch.nn.init.trunc_normal_(
                    m.weight, std=args.head_init_std, a=-2 * args.head_init_std, b=2 * args.head_init_std
                )
            if args.head_frozen_bias:
                m.bias.requires_grad_(False)
    if args.layerscale > 0:
        from models.layers import LayerScale

        for m in arch.student["backbone"].modules():
            if isinstance(m, LayerScale):
                torch.nn.init.constant_(m.weight, args.layerscale)
    arch.materialize_teacher("cpu")
    opt = build_optimizer(arch.student, cfg.optim)
    loader = ResumableLoader(tuple(shards), cfg.data, RankSpec.of(cfg, rank=0, world_size=1, patch_stride=arch.stride))

    K = cfg.loss.num_prototypes
    D = arch.student["backbone"].embed_dim
    knobs = " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k, v in (("head_init_std", args.head_init_std), ("layerscale", args.layerscale))
        if v
    )
    knobs += " --head-frozen-bias" if args.head_frozen_bias else ""
    print(
        f"# {args.config} {' '.join(args.set)} {knobs} | steps {cfg.steps} batch {cfg.batch_size_per_worker} "
        f"K {K} (ln K = {math.log(K):.3f}) T_s {cfg.loss.student_temp} T_t {cfg.loss.warmup_teacher_temp}->"
        f"{cfg.loss.teacher_temp}/{cfg.loss.teacher_temp_warmup_steps} m_t {cfg.teacher.momentum} "
        f"lr {cfg.optim.lr} | {len(shards)} shards, {args.images} images",
        flush=True,
    )

    seen: dict = {}
    hooks = [
        arch.teacher["backbone"].register_forward_hook(lambda _m, _i, o: seen.__setitem__("t_cls", o.cls.detach())),
        arch.student["dino_head"].register_forward_hook(lambda _m, _i, o: seen.__setitem__("s_logits", o.detach())),
        # runs inside forward, before train_step updates the centre: the centre the loss used
        arch.register_forward_hook(lambda m, _i, o: seen.__setitem__("center", m.dino_loss.center.clone())),
        arch.teacher["dino_head"].register_forward_hook(lambda _m, _i, o: seen.__setitem__("t_logits", o.detach())),
        arch.teacher["dino_head"].mlp.register_forward_hook(lambda _m, _i, o: seen.__setitem__("t_z", o.detach())),
    ]
    cols = [
        "step",
        "mae",
        "cl",
        "koleo",
        "H_t",
        "H_s",
        "H_mean_t",
        "pmax_t",
        "cls_std",
        "logit_sd",
        "|c|",
        "z_mean",
        "proto_mean",
        "g_head",
        "g_bb",
    ] + (["gcl_bb", "gmae_bb"] if args.per_loss_grads else [])
    print(" ".join(f"{c:>8}" for c in cols), flush=True)
    rows, t0 = [], time.time()
    for step in range(cfg.steps):
        batch = next(loader)
        values = values_at(cfg, step)
        report = step == 0 or (step + 1) % args.every == 0 or step == cfg.steps - 1
        extra = per_loss_backbone_grads(arch, batch, values.teacher_temp) if report and args.per_loss_grads else ()
        res = train_step(arch, opt, batch, values, step=step + 1, clip_grad=cfg.optim.clip_grad).values
        row = {"step": step + 1, "mae": res["loss_mae"], "cl": res["loss_cl"], "koleo": res["loss_koleo"]}
        if report:
            with torch.no_grad():
                t = seen["t_logits"].float()
                p_t = F.softmax((t - seen["center"]) / values.teacher_temp, dim=-1)
                q_s = F.softmax(seen["s_logits"].float() / cfg.loss.student_temp, dim=-1)
                cls = F.normalize(seen["t_cls"].float(), dim=-1)
                row.update(
                    {
                        "H_t": float(entropy(p_t).mean()),
                        "H_s": float(entropy(q_s).mean()),
                        "H_mean_t": float(entropy(p_t.mean(0, keepdim=True))),
                        "pmax_t": float(p_t.max(-1).values.mean()),
                        "cls_std": float(cls.std(0).mean() * math.sqrt(D)),
                        "logit_sd": float(t.std(0).mean()),
                        "|c|": float(seen["center"].norm()),
                        "z_mean": float(F.normalize(seen["t_z"].float(), dim=-1).mean(0).norm()),
                        "proto_mean": float(
                            F.normalize(arch.student["dino_head"].last_layer.weight.detach(), dim=1).mean(0).norm()
                        ),
                        "g_head": grad_norm(arch.student["dino_head"]),
                        "g_bb": grad_norm(arch.student["backbone"]),
                    }
                )
                # train_step clipped the gradients in place: scale back to the pre-clip norms
                clip = min(1.0, cfg.optim.clip_grad / (res["grad_norm"] + 1e-6)) if cfg.optim.clip_grad > 0 else 1.0
                row["g_head"] /= clip
                row["g_bb"] /= clip
                if extra:
                    row["gcl_bb"], row["gmae_bb"] = extra
            print(" ".join(f"{row[c]:>8.4g}" if c != "step" else f"{row[c]:>8d}" for c in cols), flush=True)
        rows.append(row)
    for h in hooks:
        h.remove()
    tail = rows[-args.every :]
    mean = {k: float(np.mean([r[k] for r in tail])) for k in ("mae", "cl", "koleo")}
    print(
        f"# last {len(tail)} steps: mae {mean['mae']:.4f} cl {mean['cl']:.4f} (ln K {math.log(K):.4f}) "
        f"koleo {mean['koleo']:.4f}; {time.time() - t0:.0f}s",
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
