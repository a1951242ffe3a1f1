"""Numerical parity of the released task heads and the UDP decode with the official modules,
on the reference test vectors (``shared/reference/sapiens2_heads_parity_tiny.safetensors``).

Every head is built from our own tiny configuration (``sapiens2_tiny_<task>``), which must equal
the file's ``meta``, loads the file's weights strictly and reproduces its outputs within 1e-4.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from models.io import load_weights
from models.sapiens_heads import DeconvHeadConfig, DenseHeadConfig
from models.sapiens_processing import udp_decode
from models.task_models import TASK_MODELS

ATOL = 1e-4
FILE = "sapiens2_heads_parity_tiny.safetensors"
HEADS = ("pose", "seg", "normal", "pointmap", "albedo")


def _parity_file() -> Path:
    repo = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("SAPIENS2_REFERENCE_DIR"), repo / "shared/reference", repo.parent / "shared/reference"]
    for c in candidates:
        if c and (Path(c) / FILE).exists():
            return Path(c) / FILE
    pytest.fail(f"{FILE} not found in shared/reference; set SAPIENS2_REFERENCE_DIR")


@pytest.fixture(scope="module")
def parity() -> tuple[dict[str, torch.Tensor], dict]:
    path = _parity_file()
    with safe_open(path, "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    return load_file(path), meta


def _official_args(config: DeconvHeadConfig | DenseHeadConfig) -> dict:
    """Our head configuration in the official head's argument names."""
    if isinstance(config, DeconvHeadConfig):
        args = {"deconv_out_channels": config.deconv_out_channels, "deconv_kernel_sizes": config.deconv_kernels}
    else:
        args = {"upsample_channels": config.upsample_channels}
    args |= {"in_channels": config.in_channels, "conv_out_channels": config.conv_out_channels}
    args["conv_kernel_sizes"] = config.conv_kernels
    if isinstance(config, DenseHeadConfig) and config.scale_conv_out_channels:
        n = len(config.scale_conv_out_channels)
        args |= {
            "scale_conv_out_channels": config.scale_conv_out_channels,
            "scale_conv_kernel_sizes": config.scale_conv_kernel_sizes or (1,) * n,
            "scale_final_layer": config.scale_final_layer,
        }
    return {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}


@pytest.mark.parametrize("task", HEADS)
def test_tiny_head_configuration_is_the_parity_files(task, parity):
    _, meta = parity
    want = dict(meta["cases"][task]["head_args"])
    want.pop("type")
    spec = TASK_MODELS[f"sapiens2_tiny_{task}"]
    outputs = {"pose": want.pop("out_channels", None), "seg": want.pop("num_classes", None)}.get(task) or 3
    assert spec.head.out_channels == outputs
    assert _official_args(spec.head) == want
    assert spec.head_class.__name__ == meta["cases"][task]["head_args"]["type"]
    grid = meta["cases"][task]["input_shape_BCHW"][2:]
    assert [s // 16 for s in spec.image_hw] == grid  # the tiny task model runs at the case's token grid


@pytest.mark.parametrize("task", HEADS)
def test_head_reproduces_the_official_outputs(task, parity):
    tensors, _ = parity
    spec = TASK_MODELS[f"sapiens2_tiny_{task}"]
    head = load_weights(spec.head_class(spec.head), tensors, prefix=f"{task}/model/decode_head.").eval()
    x = tensors[f"{task}/input"]
    tokens = tensors[f"{task}/input_tokens"]  # the same values as patch tokens: row-major (h, w)
    B, _, h, w = x.shape
    assert torch.equal(tokens.reshape(B, h, w, -1).permute(0, 3, 1, 2), x)
    with torch.no_grad():
        out = head(x)
    outputs = out if isinstance(out, tuple) else (out,)
    refs = [tensors[f"{task}/output"]] + ([tensors["pointmap/output_scale"]] if task == "pointmap" else [])
    for name, got, ref in zip(spec.outputs, outputs, refs):
        assert got.shape == ref.shape
        err = (got - ref).abs().max().item()
        print(f"{task}.{name}: max abs error {err:.3g} (outputs up to {ref.abs().max().item():.3g})")
        assert err <= ATOL


def test_udp_decode_reproduces_the_official_decode(parity):
    tensors, meta = parity
    args = meta["cases"]["pose_decode"]["args"]
    heatmaps = tensors["pose_decode/heatmaps"].numpy()
    assert list(heatmaps.shape[1:][::-1]) == args["heatmap_size"]
    keypoints, scores = udp_decode(heatmaps, tuple(args["input_size"]), blur_kernel=args["blur_kernel_size"])
    kp_err = np.abs(keypoints - tensors["pose_decode/keypoints"].numpy()).max()
    score_err = np.abs(scores - tensors["pose_decode/scores"].numpy()).max()
    print(f"pose_decode: keypoints max abs error {kp_err:.3g} px, scores {score_err:.3g}")
    assert keypoints.shape == (1, 17, 2) and scores.shape == (1, 17)
    assert kp_err <= ATOL and score_err <= ATOL
