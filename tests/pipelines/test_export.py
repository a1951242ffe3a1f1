"""ONNX export (``pipelines/export.py``) of tiny task checkpoints made here with random weights:
released layouts (a Sapiens2 ``.safetensors``, a Sapiens v1 ``.pth``) and a fine-tune export
with the platform's light head, in fp32 and fp16. One export each, run by onnxruntime at batch
sizes 1 and 3 and compared with the eager fp32 model at its precision's tolerance
(``models.onnx_export.TOLERANCE``: fp32 1e-4 absolute, fp16 2e-2 of each output's largest
magnitude)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from evaluation.finetune.tasks import FinetuneModel
from models import build_backbone, build_task_head, build_task_model
from models.io import save_state_dict_file
from models.onnx_export import TOLERANCE, export_checkpoint, graph_precision
from models.task_checkpoints import load_task_checkpoint
from pipelines.export import main
from training.checkpoint import export_backbone

MAX_ABS_ERROR = 1e-4


def _batch_dim(path) -> str:
    return onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type.shape.dim[0].dim_param


@pytest.mark.slow
def test_cli_exports_a_sapiens2_pointmap_checkpoint(tmp_path, capsys):
    torch.manual_seed(0)
    checkpoint = save_state_dict_file(build_task_model("sapiens2_tiny_pointmap"), tmp_path / "pointmap.safetensors")
    output = tmp_path / "pointmap.onnx"
    assert main(["--checkpoint", str(checkpoint), "--output", str(output)]) == 0
    info = json.loads(capsys.readouterr().out)
    print("sapiens2_tiny_pointmap ONNX max abs error per batch size:", info["max_abs_error"])
    assert info["model"] == "sapiens2_tiny_pointmap" and info["outputs"] == ["pointmap", "scale"]
    assert info["image_hw"] == [256, 192] and set(info["max_abs_error"]) == {"1", "3"}
    assert max(info["max_abs_error"].values()) <= MAX_ABS_ERROR
    assert _batch_dim(output)  # a named, dynamic batch axis


def test_a_sapiens1_pth_exports_within_tolerance(tmp_path):
    torch.manual_seed(0)
    checkpoint = save_state_dict_file(build_task_model("sapiens_tiny_seg_goliath"), tmp_path / "seg.pth")
    info = export_checkpoint(checkpoint, tmp_path / "seg.onnx")
    print("sapiens_tiny_seg_goliath ONNX max abs error per batch size:", info["max_abs_error"])
    assert info["model"] == "sapiens_tiny_seg_goliath" and info["outputs"] == ["logits"]
    assert max(info["max_abs_error"].values()) <= MAX_ABS_ERROR and _batch_dim(tmp_path / "seg.onnx")


def test_a_finetune_export_with_the_platform_head_exports(tmp_path):
    torch.manual_seed(0)
    backbone = build_backbone("sapiens_tiny")
    head = build_task_head("pointmap", backbone.embed_dim, hidden_dim=16, upsample=backbone.feature_stride)
    finetuned = FinetuneModel(backbone, head).eval()
    path = tmp_path / "export" / "model.safetensors"
    path.parent.mkdir()
    meta = {"task": "pointmap", "step": "10", "backbone": "sapiens_tiny", "format": "released-task-layout"}
    export_backbone(finetuned, path, rank=0, metadata=meta)  # what evaluation.finetune writes

    with pytest.raises(ValueError, match="does not record its input size; pass --image-size H W"):
        export_checkpoint(path, tmp_path / "no-size.onnx")
    info = export_checkpoint(path, tmp_path / "pointmap.onnx", image_hw=(64, 48))
    print("platform pointmap head ONNX max abs error per batch size:", info["max_abs_error"])
    assert info["layout"] == "platform" and info["outputs"] == ["xyz", "scale"]
    assert max(info["max_abs_error"].values()) <= MAX_ABS_ERROR
    loaded = load_task_checkpoint(path).model
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        want, got = finetuned(x), loaded(x)
    assert all(torch.equal(want[k], got[k]) for k in ("xyz", "scale"))


def test_cli_refuses_a_checkpoint_of_another_model_in_one_line(tmp_path, capsys):
    checkpoint = save_state_dict_file(build_task_model("sapiens_tiny_depth"), tmp_path / "depth.pth")
    code = main(
        ["--checkpoint", str(checkpoint), "--output", str(tmp_path / "x.onnx"), "--model", "sapiens_tiny_normal"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"error: {checkpoint} looks like sapiens_tiny depth, not sapiens_tiny normal"
    assert not (tmp_path / "x.onnx").exists()


def _weight_shares(path) -> dict[str, float]:
    """The share of the graph's floating-point weight values (initializers) per element type."""
    names = {
        onnx.TensorProto.FLOAT: "float32",
        onnx.TensorProto.FLOAT16: "float16",
        onnx.TensorProto.BFLOAT16: "bfloat16",
    }
    counts: dict[str, int] = {}
    for t in onnx.load(str(path), load_external_data=False).graph.initializer:
        if t.data_type in names:
            counts[names[t.data_type]] = counts.get(names[t.data_type], 0) + int(np.prod(t.dims))
    return {k: v / sum(counts.values()) for k, v in counts.items()}


def test_a_sapiens1_pth_exports_in_fp16_within_its_tolerance(tmp_path):
    torch.manual_seed(0)
    checkpoint = save_state_dict_file(build_task_model("sapiens_tiny_seg_goliath"), tmp_path / "seg.pth")
    info = export_checkpoint(checkpoint, tmp_path / "seg.fp16.onnx", precision="fp16")
    print("sapiens_tiny_seg_goliath fp16 ONNX errors per batch size:", info["max_abs_error"], info["max_rel_error"])
    assert info["precision"] == "fp16" and info["tolerance"] == {"max_rel_error": TOLERANCE["fp16"]}
    assert info["within_tolerance"] and max(info["max_rel_error"].values()) <= TOLERANCE["fp16"]
    assert max(info["max_abs_error"].values()) > TOLERANCE["fp32"]  # it does compute in fp16
    path = tmp_path / "seg.fp16.onnx"
    assert graph_precision(path) == "fp16" and _weight_shares(path)["float16"] > 0.999 and _batch_dim(path)
    graph = onnx.load(str(path), load_external_data=False).graph
    assert (
        graph.input[0].type.tensor_type.elem_type
        == graph.output[0].type.tensor_type.elem_type
        == onnx.TensorProto.FLOAT
    )


@pytest.mark.slow
def test_cli_exports_a_sapiens2_pose_checkpoint_in_fp16(tmp_path, capsys):
    """The Sapiens2 backbone's bf16 RoPE tables stay bf16 (emulated) inside the fp16 graph, and
    torch's RMSNorm upcasts half inputs, so a few norm constants are float32."""
    torch.manual_seed(0)
    checkpoint = save_state_dict_file(build_task_model("sapiens2_tiny_pose"), tmp_path / "pose.safetensors")
    output = tmp_path / "pose.fp16.onnx"
    assert main(["--checkpoint", str(checkpoint), "--output", str(output), "--precision", "fp16"]) == 0
    info = json.loads(capsys.readouterr().out)
    print("sapiens2_tiny_pose fp16 ONNX errors per batch size:", info["max_abs_error"], info["max_rel_error"])
    assert info["precision"] == "fp16" and info["within_tolerance"] and set(info["max_rel_error"]) == {"1", "3"}
    assert max(info["max_rel_error"].values()) <= TOLERANCE["fp16"]
    shares = _weight_shares(output)
    print("sapiens2_tiny_pose fp16 graph weight shares:", shares)
    assert graph_precision(output) == "fp16" and shares["float16"] > 0.99 and shares["bfloat16"] > 0


def test_cli_fails_a_graph_outside_its_tolerance(tmp_path, capsys, monkeypatch):
    import models.onnx_export as onnx_export

    checkpoint = save_state_dict_file(build_task_model("sapiens_tiny_depth"), tmp_path / "depth.pth")
    monkeypatch.setitem(onnx_export.TOLERANCE, "fp16", 1e-9)  # no fp16 graph is that close
    assert main(["--checkpoint", str(checkpoint), "--output", str(tmp_path / "d.onnx"), "--precision", "fp16"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the fp16 graph's max_rel_error is ") and err.endswith("(> 1e-09)")
