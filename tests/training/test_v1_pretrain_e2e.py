"""The Sapiens v1 tiny recipe (configs/pretrain_v1_tiny.yaml) through the real pretraining
entry point: Ray Train, 2 workers, FSDP2 over gloo, the curated demo shards, MLflow. MAE
only; the export is the released pretrain ``*_clean`` layout. A second run stopped after
4 steps and resumed must repeat the uninterrupted one exactly (the frozen tables are in
the DCP checkpoint but not in the optimiser), and the probe suite takes the export with
its lineage to the v1 run."""

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
PROBE_TINY = TINY_V1.parent / "probe_tiny.yaml"
STEPS, EVERY, STOP = 10, 5, 4


@pytest.fixture(scope="module")
def v1_runs(curated_demo, tmp_path_factory):
    root, curated = curated_demo
    storage = tmp_path_factory.mktemp("pretrain-v1-runs")

    def run(*extra):
        return run_pretraining(
            load_config(
                PretrainConfig,
                TINY_V1,
                [
                    f"data.dataset={curated.dataset_id}",
                    f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
                    f"storage_path={storage}",
                    f"steps={STEPS}",
                    f"checkpoint.every={EVERY}",
                    "metrics.log_every=3",
                    f"metrics.images_every={EVERY}",
                    *extra,
                ],
            )
        )

    full = run("run_name=v1")
    part1 = run("run_name=v1-split", f"max_steps_this_session={STOP}")
    part2 = run("run_name=v1-split")
    print(f"run seconds: full {full.seconds}, split {part1.seconds} + {part2.seconds}")
    return {"full": full, "part1": part1, "part2": part2}


@pytest.fixture(scope="module")
def v1_run(v1_runs):
    return v1_runs["full"]


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
    assert (
        tags["checkpoint.student"] == v1_run.student_weights and tags["checkpoint.digest"] == v1_run.checkpoint_digest
    )
    assert "checkpoint.teacher" not in tags and tags["training.state"] == "completed"


def test_a_stopped_and_resumed_v1_run_repeats_the_uninterrupted_one(v1_runs):
    full, part1, part2 = v1_runs["full"], v1_runs["part1"], v1_runs["part2"]
    assert not part1.completed and part1.losses == full.losses[:STOP]
    assert part2.completed and part2.losses == full.losses  # bit-identical, steps 1..10 (5..10 after the resume)
    assert [part2.history[s]["grad_norm"] for s in range(1, STEPS + 1)] == [
        full.history[s]["grad_norm"] for s in range(1, STEPS + 1)
    ]
    a, b = load_state_dict_file(part2.student_weights), load_state_dict_file(full.student_weights)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_probe_suite_takes_the_v1_export_with_its_lineage(v1_run, tmp_path):
    from mlflow import MlflowClient

    from evaluation import ProbeConfig, run_probes

    small = [
        "tasks=[seg,knn]",
        "synthetic.train_images=8",
        "synthetic.val_images=4",
        "synthetic.height=64",
        "synthetic.width=48",
        "knn.k=[3]",
        "seg.steps=3",
        "seg.batch_size=4",
        "seg.image_size=[64,48]",
        "seg.head_hidden_dim=16",
        "seg.num_visuals=1",
        "knn.image_size=[64,48]",
    ]
    cfg = load_config(
        ProbeConfig,
        PROBE_TINY,
        [
            f"output_dir={tmp_path / 'probe'}",
            "backbone.name=sapiens_tiny",
            f"backbone.checkpoint={v1_run.student_weights}",
            f"tracking.uri={v1_run.tracking_uri}",
            *small,
        ],
    )
    result = run_probes(cfg)
    assert set(result.metrics) == {"seg", "knn"} and "mIoU" in result.metrics["seg"]
    assert result.lineage.pretrain_run_id == v1_run.mlflow_run_id and result.lineage.source == "digest"
    tags = MlflowClient(v1_run.tracking_uri).get_run(result.parent_run_id).data.tags
    assert tags["probe.backbone_family"] == "sapiens1"
    assert tags["lineage.checkpoint_digest"] == v1_run.checkpoint_digest
