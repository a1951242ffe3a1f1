"""ONNX export (``pipelines/export.py``) of tiny task checkpoints made here with random weights:
released layouts (a Sapiens2 ``.safetensors``, a Sapiens v1 ``.pth``) and a fine-tune export
with the platform's light head. One export each, run by onnxruntime at batch sizes 1 and 3
and compared with the eager model."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

from evaluation.finetune.tasks import FinetuneModel
from models import build_backbone, build_task_head, build_task_model
from models.io import save_state_dict_file
from models.onnx_export import export_checkpoint
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
