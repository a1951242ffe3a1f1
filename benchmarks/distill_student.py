"""A distilled student against its teacher, on the same images.

CPU mode (``--run``, a finished distillation run): for the teacher and the student of the run,
on the same images (the first ``--images`` samples of the run's own dataset shards, resized and
centre-cropped to the run's ``crops.global_size``):

- forward cost: FLOPs per image (``models.registry.count_flops``, the project's FLOP counter)
  and CPU time per image (``--threads`` torch threads, the median of ``--repeats`` passes, teacher
  and student interleaved so both see the same machine load; CPU seconds and wall seconds);
- the student's features against the teacher's, before distillation (the run's step-0 student
  and projection heads: the same seed rebuilds them exactly) and after (the run's newest
  checkpoint; its backbone is checked to equal the exported student): the mean cosine of
  the projected CLS and patch tokens to the teacher's, and, so that a random-init student is
  not judged by untrained heads, the cosine of its patch tokens mapped by a ridge-regression
  linear map fitted on half the images and measured on the other half.

GPU mode (``--device cuda``): teacher and student sizes with random weights (speed does not
depend on the weights) at ``--hw`` in bf16 autocast: images/s, forward TFLOP/s and the
student/teacher speed-up, measured in the same run.

    python benchmarks/distill_student.py --run runs/demo/distill/<run>
    python benchmarks/distill_student.py --run <run dir> --images 32 --threads 1 --repeats 7 --out bench.json
    python benchmarks/distill_student.py --device cuda --teacher-model sapiens2_1b --student-model sapiens2_0.1b

Results: docs/results/distillation.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")

import torch  # noqa: E402  (after the environment)

RIDGE = 1e-2  # the linear map's ridge, relative to the mean feature energy


# ----------------------------------------------------------------------------- the run


def load_run(run_dir: Path):
    """(config, run record, export manifest, newest checkpoint folder) of a finished distillation run."""
    from infra.config import load_config
    from training.distill_config import DistillConfig
    from training.loop import EXPORT_DIR, EXPORT_MANIFEST
    from training.run import RUN_RECORD

    record = json.loads((run_dir / RUN_RECORD).read_text())
    cfg = load_config(DistillConfig, run_dir / "config.yaml")
    manifest_path = run_dir / EXPORT_DIR / EXPORT_MANIFEST
    if not manifest_path.is_file():
        sys.exit(f"{run_dir}: no export yet ({manifest_path}); run the distillation to its end first")
    checkpoints = sorted(run_dir.glob("checkpoint_0*"))
    if not checkpoints:
        sys.exit(f"{run_dir}: no checkpoint")
    return cfg, record, json.loads(manifest_path.read_text()), checkpoints[-1]


def images(shards: list[str], n: int, hw: tuple[int, int]) -> torch.Tensor:
    """The first ``n`` images of the shards (tar order), cover-resized and centre-cropped to
    ``hw`` (H, W), normalised as training normalises them: (n, 3, H, W)."""
    import numpy as np
    from PIL import Image

    from curation.output import split_member
    from training.augment import MEAN, STD

    out = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            for member in tar:
                parsed = split_member(member.name) if member.isfile() else None
                if parsed is None or parsed[1] not in ("jpg", "jpeg", "png", "webp"):
                    continue
                im = Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB")
                H, W = hw
                scale = max(H / im.height, W / im.width)
                im = im.resize((max(W, round(im.width * scale)), max(H, round(im.height * scale))), Image.BILINEAR)
                left, top = (im.width - W) // 2, (im.height - H) // 2
                x = np.asarray(im.crop((left, top, left + W, top + H)), dtype=np.float32) / 255.0
                out.append(
                    (torch.from_numpy(x).permute(2, 0, 1) - torch.tensor(MEAN)[:, None, None])
                    / torch.tensor(STD)[:, None, None]
                )
                if len(out) == n:
                    return torch.stack(out)
    if not out:
        sys.exit("no images in the run's shards")
    return torch.stack(out)


def student_states(cfg, checkpoint_dir: Path, export: str):
    """(arch before distillation, arch after): the step-0 student and heads rebuilt from the
    run's seed, and the same with the newest checkpoint's student loaded."""
    import copy

    import torch.distributed.checkpoint as dcp

    from models.io import load_state_dict_file
    from training.meta_arch import DistillMetaArch

    torch.manual_seed(cfg.seed)
    after = DistillMetaArch(cfg).eval()  # loads the frozen teacher from its file
    before = copy.deepcopy(after)
    state = {f"student.{k}": v for k, v in after.student.state_dict().items()}
    dcp.load({"model": state}, checkpoint_id=str(checkpoint_dir), no_dist=True)
    exported = load_state_dict_file(export)
    ours = after.student["backbone"].state_dict()
    if not all(torch.equal(ours[k], v) for k, v in exported.items()):
        sys.exit(f"{checkpoint_dir} is not the state the run exported ({export})")
    return before, after


# ----------------------------------------------------------------------------- measures


@torch.no_grad()
def features(arch, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Teacher tokens and the student's projected tokens (CLS and patches) and raw patch tokens."""
    t, s = arch.teacher["backbone"](x), arch.student["backbone"](x)
    return {
        "t_cls": t.cls,
        "t_patch": t.patch_tokens,
        "s_cls": arch.student["cls_proj"](s.cls),
        "s_patch": arch.student["patch_proj"](s.patch_tokens),
        "s_raw": s.patch_tokens,
    }


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean cosine of matching tokens: the report the distillation loss module defines."""
    from training.losses.feature_distill_loss import token_cosine

    return token_cosine(a, b)


def fitted_cosine(student_NPd: torch.Tensor, teacher_NPD: torch.Tensor) -> float:
    """Patch tokens: a ridge linear map (with bias) fitted on the first half of the images,
    the cosine of its predictions on the second half."""
    n = student_NPd.shape[0] // 2
    fit_s, fit_t = student_NPd[:n].flatten(0, 1).double(), teacher_NPD[:n].flatten(0, 1).double()
    X = torch.cat((fit_s, torch.ones(len(fit_s), 1, dtype=fit_s.dtype)), 1)
    lam = RIDGE * float((X * X).sum(1).mean())
    W = torch.linalg.solve(X.T @ X + lam * torch.eye(X.shape[1], dtype=X.dtype), X.T @ fit_t)
    test_s = student_NPd[n:].flatten(0, 1).double()
    pred = torch.cat((test_s, torch.ones(len(test_s), 1, dtype=test_s.dtype)), 1) @ W
    return cosine(pred, teacher_NPD[n:].flatten(0, 1))


def timed(models: dict[str, torch.nn.Module], x: torch.Tensor, repeats: int) -> dict[str, dict[str, float]]:
    """Per model: median CPU seconds and wall seconds per image over ``repeats`` interleaved passes."""
    runs = {name: {"cpu": [], "wall": []} for name in models}
    with torch.no_grad():
        for m in models.values():
            m(x[:2])  # warm-up
        for _ in range(repeats):
            for name, m in models.items():
                c0, w0 = time.process_time(), time.perf_counter()
                m(x)
                runs[name]["cpu"].append((time.process_time() - c0) / len(x))
                runs[name]["wall"].append((time.perf_counter() - w0) / len(x))
    return {name: {k: statistics.median(v) for k, v in r.items()} for name, r in runs.items()}


def cpu_report(args) -> dict:
    from models.registry import count_flops, count_params

    run_dir = Path(args.run).resolve()
    cfg, record, manifest, newest = load_run(run_dir)
    torch.set_num_threads(args.threads)
    hw = tuple(cfg.crops.global_size)
    x = images(record["dataset"]["shards"], args.images, hw)
    before, after = student_states(cfg, newest, manifest["export_student"])
    fb, fa = features(before, x), features(after, x)
    names = {"teacher": cfg.teacher.model, "student": cfg.student.model}
    times = timed({"teacher": after.teacher["backbone"], "student": after.student["backbone"]}, x, args.repeats)
    flops = {role: count_flops(name, hw) for role, name in names.items()}
    return {
        "run": str(run_dir),
        "step": manifest["step"],
        "models": names,
        "params": {role: count_params(name) for role, name in names.items()},
        "images": len(x),
        "hw": list(hw),
        "threads": args.threads,
        "load_avg_1min": os.getloadavg()[0],
        "flops_per_image": flops,
        "cpu_s_per_image": {r: t["cpu"] for r, t in times.items()},
        "wall_s_per_image": {r: t["wall"] for r, t in times.items()},
        "cosine": {
            "before": {"cls": cosine(fb["s_cls"], fb["t_cls"]), "patch": cosine(fb["s_patch"], fb["t_patch"])},
            "after": {"cls": cosine(fa["s_cls"], fa["t_cls"]), "patch": cosine(fa["s_patch"], fa["t_patch"])},
        },
        "fitted_patch_cosine": {
            "random_init": fitted_cosine(fb["s_raw"], fb["t_patch"]),
            "distilled": fitted_cosine(fa["s_raw"], fa["t_patch"]),
        },
    }


def print_cpu(r: dict) -> None:
    t, s = r["models"]["teacher"], r["models"]["student"]
    print(f"distillation run {r['run']} (step {r['step']}): teacher {t}, student {s}")
    print(
        f"{r['images']} images of the run's shards at {r['hw'][0]}x{r['hw'][1]}, {r['threads']} torch thread(s), "
        f"load average {r['load_avg_1min']:.1f}"
    )
    print()
    print("| | teacher | student | student / teacher |")
    print("|---|---|---|---|")
    rows = [
        ("parameters", r["params"], "{:,}"),
        ("forward FLOPs per image", r["flops_per_image"], "{:,}"),
        ("CPU ms per image", {k: v * 1e3 for k, v in r["cpu_s_per_image"].items()}, "{:.3f}"),
        ("wall ms per image", {k: v * 1e3 for k, v in r["wall_s_per_image"].items()}, "{:.3f}"),
    ]
    for label, v, fmt in rows:
        print(
            f"| {label} | {fmt.format(v['teacher'])} | {fmt.format(v['student'])} | {v['student'] / v['teacher']:.3f} |"
        )
    print()
    print("| student's features vs the teacher's | before distillation (random init) | after |")
    print("|---|---|---|")
    c = r["cosine"]
    for kind in ("cls", "patch"):
        print(
            f"| cosine, {kind} tokens through the run's projection head | {c['before'][kind]:.4f} | {c['after'][kind]:.4f} |"
        )
    f = r["fitted_patch_cosine"]
    print(
        f"| cosine, patch tokens through a linear map fitted on half the images (other half) | "
        f"{f['random_init']:.4f} | {f['distilled']:.4f} |"
    )


# ----------------------------------------------------------------------------- GPU mode


def gpu_report(args) -> dict:
    from models.registry import build_backbone, count_flops

    device = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(device), "hw": list(args.hw), "batch": args.batch, "models": {}}
    x = torch.randn(args.batch, 3, *args.hw, device=device)
    for role, name in (("teacher", args.teacher_model), ("student", args.student_model)):
        model = build_backbone(name, device=device).eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(args.warmup):
                model(x)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.steps):
                model(x)
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / args.steps
        flops = count_flops(name, tuple(args.hw))
        out["models"][role] = {
            "name": name,
            "images_per_s": args.batch / seconds,
            "tflops_per_s": flops * args.batch / seconds / 1e12,
        }
        del model
        torch.cuda.empty_cache()
    return out


def print_gpu(r: dict) -> None:
    print(f"{r['device']}, {r['hw'][0]}x{r['hw'][1]}, batch {r['batch']}, bf16 autocast, forward only")
    for role, m in r["models"].items():
        print(f"{role:8s} {m['name']:15s} {m['images_per_s']:9.1f} images/s  {m['tflops_per_s']:7.1f} TFLOP/s")
    speed = r["models"]["student"]["images_per_s"] / r["models"]["teacher"]["images_per_s"]
    print(f"student / teacher images/s: {speed:.2f}x (same run)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="a finished distillation run folder (<storage_path>/<run_name>)")
    parser.add_argument("--images", type=int, default=16, help="images from the run's shards (CPU mode)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU mode)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per model (CPU mode)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--teacher-model", default="sapiens2_1b", help="GPU mode")
    parser.add_argument("--student-model", default="sapiens2_0.1b", help="GPU mode")
    parser.add_argument("--hw", type=int, nargs=2, default=(1024, 768), metavar=("H", "W"), help="GPU mode")
    parser.add_argument("--batch", type=int, default=8, help="GPU mode")
    parser.add_argument("--steps", type=int, default=10, help="GPU mode: timed forwards")
    parser.add_argument("--warmup", type=int, default=3, help="GPU mode")
    parser.add_argument("--out", help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
            return 2
        report = gpu_report(args)
        print_gpu(report)
    else:
        if not args.run:
            parser.error("CPU mode needs --run (a finished distillation run folder)")
        if args.images < 4:
            parser.error("--images must be >= 4 (half of them fit the linear map)")
        report = cpu_report(args)
        print_cpu(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
