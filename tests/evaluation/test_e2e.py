"""The whole suite through Ray Train and MLflow: on a pretraining-stage checkpoint (an
official-layout .safetensors, found in MLflow by its digest) and on a random backbone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation import ProbeConfig, run_probes
from infra import tracking
from infra.config import load_config
from infra.digests import sha256_file

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "probe_tiny.yaml"
TASKS = ["pose", "seg", "pointmap", "normal", "albedo", "knn"]
SMALL = [
    "synthetic.train_images=12",
    "synthetic.val_images=6",
    "synthetic.height=64",
    "synthetic.width=48",
    "knn.k=[3]",
]
for _t in TASKS:
    SMALL += [
        f"{_t}.steps=3",
        f"{_t}.batch_size=4",
        f"{_t}.image_size=[64,48]",
        f"{_t}.head_hidden_dim=16",
        f"{_t}.num_visuals=2",
    ]
HEADLINE = {"pose": "AP", "seg": "mIoU", "pointmap": "l2", "normal": "mean_angle", "albedo": "mae", "knn": "top1_k3"}


def _record_pretraining_run(uri: str, checkpoint: Path) -> str:
    """What the pretraining stage records for its exported student."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp = tracking.get_experiment_id("pretraining", uri)
    tags = {
        "humanvision.stage": "pretrain",
        "dataset.id": "humans-test-v1",
        "dataset.uri": "/data/humans-test-v1",
        "checkpoint.student": str(checkpoint),
        "checkpoint.digest": sha256_file(checkpoint),
    }
    with mlflow.start_run(experiment_id=exp, tags=tags) as run:
        return run.info.run_id


@pytest.fixture(scope="module")
def trained_run(ray_local, pretrain_checkpoint, tmp_path_factory):
    workspace = tmp_path_factory.mktemp("probe-ws")
    out = workspace / "probe-trained"
    pretrain_id = _record_pretraining_run(tracking.resolve_tracking_uri(None, str(out)), pretrain_checkpoint)
    cfg = load_config(ProbeConfig, TINY, [f"output_dir={out}", f"backbone.checkpoint={pretrain_checkpoint}", *SMALL])
    return run_probes(cfg), pretrain_id, pretrain_checkpoint


def test_suite_on_a_pretraining_checkpoint(trained_run):
    import mlflow

    result, pretrain_id, ckpt = trained_run
    out = Path(result.output_dir)
    assert list(result.metrics) == TASKS
    for task in TASKS:
        assert HEADLINE[task] in result.metrics[task]
    for task in TASKS[:-1]:
        assert (out / task / "head.safetensors").is_file() and len(list((out / task / "overlays").glob("*.png"))) == 2
    saved = json.loads((out / "results.json").read_text())
    assert (
        all(saved["metrics"][t] == pytest.approx(result.metrics[t]) for t in TASKS) and (out / "config.yaml").is_file()
    )

    # Lineage: the checkpoint's digest led to the pretraining run and its dataset.
    digest = sha256_file(ckpt)
    assert (result.lineage.pretrain_run_id, result.lineage.source) == (pretrain_id, "digest")
    client = mlflow.MlflowClient()
    parent = client.get_run(result.parent_run_id)
    expected_tags = {
        "humanvision.stage": "probe",
        "lineage.checkpoint_path": str(Path(ckpt).resolve()),
        "lineage.checkpoint_digest": digest,
        "lineage.pretrain_run_id": pretrain_id,
        "lineage.dataset_id": "humans-test-v1",
        "lineage.dataset_uri": "/data/humans-test-v1",
    }
    assert expected_tags.items() <= parent.data.tags.items()
    assert parent.data.metrics["seg.mIoU"] == pytest.approx(result.metrics["seg"]["mIoU"])

    # One child run per probe: metrics, settings, loss curve, overlays, data versions.
    children = mlflow.search_runs(
        [parent.info.experiment_id],
        output_format="list",
        filter_string=f"tags.`mlflow.parentRunId` = '{result.parent_run_id}'",
    )
    assert sorted(r.data.tags["probe.task"] for r in children) == sorted(TASKS)
    assert {r.info.run_id for r in children} == set(result.child_run_ids.values())
    for run in children:
        task = run.data.tags["probe.task"]
        assert expected_tags.items() <= run.data.tags.items()
        assert run.data.metrics[HEADLINE[task]] == pytest.approx(result.metrics[task][HEADLINE[task]])
        assert run.data.params[f"{task}.steps"] == "3"
        if task != "knn":
            assert len(client.list_artifacts(run.info.run_id, "overlays")) == 2
            assert len(client.get_metric_history(run.info.run_id, "train_loss")) == 1
        assert {i.dataset.name for i in run.inputs.dataset_inputs} == {f"probe-{task}-train", f"probe-{task}-val"}


def test_cli_on_a_random_backbone_gives_other_numbers(trained_run, tmp_path):
    from pipelines.probe import main

    out = tmp_path / "probe-random"
    assert main(["--config", str(TINY), f"output_dir={out}", *SMALL]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["lineage"]["checkpoint_path"] == "random-init"
    assert saved["lineage"]["checkpoint_digest"] == "random-init:seed=0" and not saved["lineage"]["pretrain_run_id"]
    trained = trained_run[0].metrics
    for task in TASKS[:-1]:  # k-NN on 6 images can tie; pose AP is 0 for both after 3 steps
        key = "final_loss" if task == "pose" else HEADLINE[task]
        assert saved["metrics"][task][key] != trained[task][key], task


def test_cli_reports_user_errors(tmp_path, capsys):
    from pipelines.probe import main

    assert main(["--config", str(TINY), "seg.stepz=3"]) == 2
    assert "did you mean 'steps'" in capsys.readouterr().err
    assert (
        main(["--config", str(TINY), f"output_dir={tmp_path / 'o'}", "backbone.checkpoint=/no/such.safetensors"]) == 2
    )
    assert "does not exist" in capsys.readouterr().err
