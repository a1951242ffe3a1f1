"""Settings of the annotation job: a bad key, value or file is one line naming the setting,
before any Ray work."""

from __future__ import annotations

import pytest
import torch

from evaluation.annotate.config import AnnotateConfig, TaskSettings
from evaluation.annotate.models import describe
from infra.config import load_config
from pipelines.annotate import main
from tests.conftest import REPO


def _cfg(*overrides: str) -> AnnotateConfig:
    return load_config(AnnotateConfig, None, ["data.dataset=x", *overrides])


def test_a_misspelt_key_is_one_line_naming_it(capsys):
    with pytest.raises(ValueError, match=r"unknown setting 'tasks.segg'; did you mean 'seg'\?"):
        _cfg("tasks.segg.checkpoint=a.safetensors")
    assert main(["--config", str(REPO / "configs" / "annotate_demo.yaml"), "actors.num_actor=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown setting 'actors.num_actor'" in err


@pytest.mark.parametrize(
    "overrides, message",
    [
        ([], "no task has a checkpoint"),
        (["tasks.seg.onnx=s.onnx"], "tasks.seg.onnx needs tasks.seg.checkpoint"),
        (["tasks.seg.checkpoint=s.safetensors", "actors.device=cuda"], "actors.device=cuda needs actors.num_gpus"),
        (["tasks.pose.checkpoint=p.safetensors", "tasks.pose.max_people=-1"], "tasks.pose.max_people must be >= 0"),
        (["tasks.pose.checkpoint=p.safetensors", "tasks.pose.nms_iou=0"], r"tasks.pose.nms_iou must be in \(0, 1\]"),
        (["tasks.seg.checkpoint=s.safetensors", "tasks.seg.map_dtype=float16"], "tasks.seg.map_dtype applies to"),
        (["tasks.normal.checkpoint=n.safetensors", "tasks.normal.map_dtype=float64"], "tasks.normal.map_dtype"),
        (["tasks.seg.checkpoint=s.safetensors", "max_error_share=1.5"], "max_error_share must be between 0 and 1"),
    ],
)
def test_settings_that_cannot_work_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        _cfg(*overrides).validate()
    with pytest.raises(ValueError, match="data.dataset is empty"):
        load_config(AnnotateConfig, None, ["tasks.seg.checkpoint=s.safetensors"]).validate()


def test_the_demo_config_loads_and_names_four_tasks():
    cfg = load_config(AnnotateConfig, REPO / "configs" / "annotate_demo.yaml")
    cfg.validate()
    assert cfg.tasks.enabled() == ["pose", "seg", "normal", "pointmap"] and cfg.tasks.pose.flip_test
    assert cfg.max_error_share == 0.05


def test_a_checkpoint_of_another_task_or_a_missing_file_is_refused(tiny_models, tmp_path):
    with pytest.raises(ValueError, match=r"tasks.seg.checkpoint=.*is a pose model \(sapiens2_tiny_pose\)"):
        describe("seg", TaskSettings(checkpoint=str(tiny_models["pose"])))
    with pytest.raises(ValueError, match=r"tasks.normal.checkpoint='nope.safetensors': no such file"):
        describe("normal", TaskSettings(checkpoint="nope.safetensors"))
    info = describe("seg", TaskSettings(checkpoint=str(tiny_models["seg"]), input_hw=(128, 96)))
    assert (info.name, info.layout, info.input_hw, info.vocab) == (
        "sapiens2_tiny_seg",
        "released",
        (128, 96),
        "seg_sapiens2_29",
    )


def test_a_fine_tune_export_needs_its_input_size(tmp_path):
    from evaluation.finetune.tasks import FinetuneModel
    from models import build_backbone, build_task_head
    from training.checkpoint import export_backbone

    torch.manual_seed(0)
    backbone = build_backbone("sapiens2_tiny")
    model = FinetuneModel(backbone, build_task_head("seg", backbone.embed_dim, hidden_dim=16, num_classes=7)).eval()
    path = tmp_path / "model.safetensors"
    export_backbone(
        model, path, rank=0, metadata={"task": "seg", "backbone": "sapiens2_tiny", "vocab": "seg_synthetic_7"}
    )
    with pytest.raises(
        ValueError, match=r"is a fine-tune export, which does not record its input size: set tasks.seg.input_hw"
    ):
        describe("seg", TaskSettings(checkpoint=str(path)))
    with pytest.raises(ValueError, match="is a fine-tune export for seg, not normal"):
        describe("normal", TaskSettings(checkpoint=str(path), input_hw=(64, 48)))
    info = describe("seg", TaskSettings(checkpoint=str(path), input_hw=(64, 48)))
    assert (info.layout, info.family, info.vocab, info.outputs) == (
        "platform",
        "sapiens2",
        "seg_synthetic_7",
        ("logits",),
    )
