"""The Sapiens v1 tiny recipe (configs/pretrain_v1_tiny.yaml) through the real pretraining
entry point: Ray Train, 2 workers, FSDP2 over gloo, the curated demo shards, MLflow. MAE
only; the export is the released pretrain ``*_clean`` layout."""
import hashlib
import json
from pathlib import Path

import pytest
import torch

from infra.config import load_config
from models import build_backbone, check_weights_file, get_config
from models.io import load_state_dict_file
from models.sapiens1 import sincos_pos_embed
from training.config import PretrainConfig
from training.run import run_pretraining

pytestmark = pytest.mark.slow
TINY_V1 = Path(__file__).resolve().parents[2] / "configs" / "pretrain_v1_tiny.yaml"
STEPS, EVERY = 10, 5


@pytest.fixture(scope="module")
def v1_run(curated_demo, tmp_path_factory):
    root, curated = curated_demo
    storage = tmp_path_factory.mktemp("pretrain-v1-runs")
    cfg = load_config(PretrainConfig, TINY_V1, [
        f"data.dataset={curated.dataset_id}", f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
        f"storage_path={storage}", f"steps={STEPS}", f"checkpoint.every={EVERY}", "metrics.log_every=3",
        f"metrics.images_every={EVERY}", "run_name=v1"])
    result = run_pretraining(cfg)
    print(f"run seconds: {result.seconds}")
    return result


def test_v1_tiny_trains_mae_only_on_curated_shards(v1_run):
    assert v1_run.completed and v1_run.final_step == STEPS and len(v1_run.losses) == STEPS
    assert all(torch.isfinite(torch.tensor(v1_run.losses)))
    assert all("loss_mae" in v and "loss_cl" not in v and "momentum" not in v for v in v1_run.history.values())
    first, last, _ = v1_run.loss_trend(window=3)["loss_mae"]
    assert last < first
    assert v1_run.losses == [v1_run.history[s]["loss_mae"] for s in range(1, STEPS + 1)]  # MAE is the whole loss


def test_export_is_the_released_pretrain_layout(v1_run):
    assert v1_run.teacher_weights is None
    assert hashlib.sha256(Path(v1_run.student_weights).read_bytes()).hexdigest() == v1_run.checkpoint_digest
    state = load_state_dict_file(v1_run.student_weights)
    layout = get_config("sapiens_tiny").as_pretrain((64, 64))
    want = {k: v.shape for k, v in build_backbone(layout, device="meta").state_dict().items()}
    assert {k: v.shape for k, v in state.items()} == want and "cls_token" in state
    # The frozen sin-cos table came through FSDP training untouched, CLS slot zero.
    assert torch.equal(state["pos_embed"][0, 1:], sincos_pos_embed((4, 4), 64)) and not state["pos_embed"][0, 0].any()
    from safetensors import safe_open

    with safe_open(v1_run.student_weights, "pt") as f:
        assert json.loads(f.metadata()["meta"])["format"] == "sapiens1-pretrain-clean"
    # It loads as released pretrain weights do: as is, and into the fine-tune layout (CLS dropped, table resized).
    check_weights_file("sapiens_tiny", v1_run.student_weights)
    finetune = build_backbone("sapiens_tiny", weights=v1_run.student_weights, img_size=(64, 48), with_cls_token=False)
    assert finetune.pos_embed.shape == (1, 12, 64)


def test_mlflow_records_the_student_only(v1_run):
    from mlflow import MlflowClient

    tags = MlflowClient(v1_run.tracking_uri).get_run(v1_run.mlflow_run_id).data.tags
    assert tags["checkpoint.student"] == v1_run.student_weights and tags["checkpoint.digest"] == v1_run.checkpoint_digest
    assert "checkpoint.teacher" not in tags and tags["training.state"] == "completed"
