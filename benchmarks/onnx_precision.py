"""How far the fp16 ONNX graph of a task model is from the fp32 graph and from the eager fp32
model: the measured spread behind ``models.onnx_export.TOLERANCE``.

    python benchmarks/onnx_precision.py                                   # every tiny task, seeds 0-2
    python benchmarks/onnx_precision.py --models sapiens2_0.4b_pose --hw 256 192 --seeds 1

Per model (random weights in the released layout from ``torch.manual_seed(seed)``: no weights
are released for the tiny size, none can be downloaded here) and seed, both graphs are exported
by ``models.onnx_export.export_onnx`` (as ``pipelines/export.py`` does) and run with
onnxruntime on the CPU on the same inputs:

  - against eager fp32 (``onnx_errors``, random normal inputs at batch 1 and 3): the fp32
    graph's max abs error and the fp16 graph's max relative error (each output's max abs
    difference over its largest magnitude), the measures ``TOLERANCE`` bounds;
  - fp16 graph against fp32 graph on real photos (``pipelines.demo_corpus.person_photos``,
    resized to the input and normalised as annotate does): the max relative difference per
    output, and what a user sees: for heatmaps the share of keypoints whose heatmap maximum
    is at the same pixel and the largest distance between the two maxima (heatmap px); for
    seg logits the share of pixels with the same label.

Random weights make no trained model's outputs: near-ties of a random head flip under fp16
more than a trained one's would. Results: docs/results/annotate.md (fp16 export).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

TINY = ("sapiens2_tiny_pose", "sapiens2_tiny_seg", "sapiens2_tiny_normal", "sapiens2_tiny_pointmap")
TINY += ("sapiens_tiny_depth", "sapiens2_tiny_albedo")


def photo_batch(hw: tuple[int, int]) -> np.ndarray:
    """The demo corpus' photos of people resized to ``hw`` and normalised, (B, 3, H, W) float32."""
    import cv2
    from PIL import Image

    from models.sapiens_processing import normalize_image
    from pipelines.demo_corpus import person_photos

    out = []
    for photo in person_photos().values():
        rgb = np.asarray((Image.open(photo) if isinstance(photo, Path) else photo).convert("RGB"))
        small = cv2.resize(rgb, (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
        out.append(normalize_image(small, bgr=False).numpy())
    return np.stack(out).astype(np.float32)


def agreement(name: str, fp32: list[np.ndarray], fp16: list[np.ndarray], names) -> str:
    """The fp16 graph's outputs against the fp32 graph's, one line."""
    parts = []
    for n, a, b in zip(names, fp32, fp16):
        parts.append(f"{n} rel {np.abs(a - b).max() / max(np.abs(a).max(), 1e-12):.2e}")
        if n == "heatmaps":
            ia = a.reshape(*a.shape[:2], -1).argmax(-1)
            ib = b.reshape(*b.shape[:2], -1).argmax(-1)
            w = a.shape[-1]
            dist = np.hypot(ia // w - ib // w, ia % w - ib % w)
            parts.append(f"same maximum {np.mean(ia == ib):.1%} of keypoints, furthest {dist.max():.1f} px")
        if n == "logits":
            parts.append(f"same label {np.mean(a.argmax(1) == b.argmax(1)):.3%} of pixels")
    return "; ".join(parts)


def measure(name: str, seed: int, hw, work: Path) -> None:
    import onnxruntime as ort

    from models.io import save_state_dict_file
    from models.onnx_export import INPUT_NAME, export_onnx, onnx_errors
    from models.task_checkpoints import load_task_checkpoint
    from models.task_models import build_task_model

    ckpt = work / f"{name}-{seed}.safetensors"
    torch.manual_seed(seed)
    save_state_dict_file(build_task_model(name).state_dict(), ckpt)
    loaded = load_task_checkpoint(ckpt)
    hw = tuple(hw or loaded.image_hw)
    outputs, runs, errors = list(loaded.outputs), {}, {}
    photos = photo_batch(hw)
    for precision in ("fp32", "fp16"):
        path = export_onnx(
            loaded.model,
            work / f"{name}-{seed}.{precision}.onnx",
            input_hw=hw,
            output_names=outputs,
            precision=precision,
        )
        errors[precision] = onnx_errors(path, loaded.model, input_hw=hw, output_names=outputs, seed=seed)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        runs[precision] = session.run(outputs, {INPUT_NAME: photos})
    fp32_abs = max(errors["fp32"]["max_abs_error"].values())
    fp16_rel = max(errors["fp16"]["max_rel_error"].values())
    print(
        f"{name:24s} {'x'.join(map(str, hw)):8s} seed {seed}: vs eager fp32: fp32 graph abs {fp32_abs:.2e}, "
        f"fp16 graph rel {fp16_rel:.2e} | fp16 vs fp32 graph on {len(photos)} photos: "
        f"{agreement(name, runs['fp32'], runs['fp16'], outputs)}",
        flush=True,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(TINY))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--hw", type=int, nargs=2, help="input size (default: the model's)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="onnx-precision-") as tmp:
        for name in args.models.split(","):
            for seed in range(args.seeds):
                measure(name, seed, args.hw, Path(tmp))
                for f in Path(tmp).iterdir():
                    f.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
