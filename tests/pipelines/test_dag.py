"""The staged DAG: reuse what did not change, re-run what did, resume what was killed,
record parent/child runs with lineage in MLflow, and run stages as real Ray jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import load_config
from pipelines.chain import DagConfig, run_dag
from pipelines.demo_corpus import build_demo_corpus
from tests.conftest import CENTERNET, REPO, kill_when

FAST = [
    "stages=[curate, pretrain, probe]",
    "pretrain.steps=4",
    "pretrain.checkpoint.every=2",
    "pretrain.metrics.log_every=1",
    "pretrain.metrics.images_every=4",
    "probe.tasks=[seg, knn]",
    "probe.seg.steps=10",
    "probe.synthetic.train_images=24",
    "probe.synthetic.val_images=8",
    "probe.ray.num_cpus=null",
]


def dag_config(raw: Path, workspace: Path, *overrides: str) -> DagConfig:
    return load_config(
        DagConfig,
        REPO / "configs" / "dag_demo.yaml",
        [
            f"curate.input.uri={raw}",
            f"workspace={workspace}",
            f"curate.detector.weights={CENTERNET}",
            "curate.ray.num_cpus=null",
            "curate.ray.progress_bars=off",
            *FAST,
            *overrides,
        ],
    )


def stage_runs(uri: str, stage: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, filter_string=f"tags.`dag.stage` = '{stage}'")


@pytest.fixture(scope="module")
def first(tmp_path_factory, ray_local):
    root = tmp_path_factory.mktemp("dag")
    build_demo_corpus(root / "raw")
    cfg = dag_config(root / "raw", root / "ws")
    return root, cfg, run_dag(cfg)


def test_first_run_runs_every_stage_and_links_them_in_mlflow(first):
    from mlflow import MlflowClient

    root, cfg, result = first
    assert [(o.stage, o.reused) for o in result.outcomes] == [("curate", False), ("pretrain", False), ("probe", False)]
    curate, pretrain, probe = result.outcomes
    client = MlflowClient(result.tracking_uri)
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["humanvision.stage"] == "dag"
    for o in result.outcomes:
        run = client.get_run(o.run_id)
        assert run.data.tags["mlflow.parentRunId"] == result.parent_run_id
        assert run.data.tags["dag.identity"] == o.identity == Path(o.folder).name
    # lineage: the probe's metric -> checkpoint -> pretraining run -> dataset version -> curation run
    probe_tags = client.get_run(probe.run_id).data.tags
    assert probe_tags["lineage.checkpoint_digest"] == pretrain.result.checkpoint_digest
    assert probe_tags["lineage.pretrain_run_id"] == pretrain.run_id
    assert probe_tags["lineage.dataset_id"] == curate.result.dataset_id == pretrain.result.dataset_id
    assert probe_tags["lineage.curation_run_id"] == curate.run_id
    assert client.get_run(pretrain.run_id).data.tags["lineage.dataset_id"] == curate.result.dataset_id
    assert parent.data.tags["lineage.checkpoint_digest"] == pretrain.result.checkpoint_digest
    assert "mIoU" in probe.result.metrics["seg"] and "top1_k10" in probe.result.metrics["knn"]


def test_second_run_with_nothing_changed_reruns_nothing(first):
    root, cfg, result = first
    before = {s: len(stage_runs(result.tracking_uri, s)) for s in ("curate", "pretrain", "probe")}
    again = run_dag(cfg)
    assert [o.reused for o in again.outcomes] == [True, True, True]
    assert [o.identity for o in again.outcomes] == [o.identity for o in result.outcomes]
    from mlflow import MlflowClient

    client = MlflowClient(result.tracking_uri)
    for o, prev in zip(again.outcomes, result.outcomes):
        assert o.run_id == prev.run_id  # the result's run is the one that produced it
    reused = [
        r
        for s in ("curate", "pretrain", "probe")
        for r in stage_runs(result.tracking_uri, s)
        if r.data.tags.get("dag.reused") == "true"
    ]
    assert len(reused) == 3 and all(r.data.tags["mlflow.parentRunId"] == again.parent_run_id for r in reused)
    assert {r.data.tags["dag.reused_run_id"] for r in reused} == {o.run_id for o in result.outcomes}
    after = {
        s: len([r for r in stage_runs(result.tracking_uri, s) if r.data.tags.get("dag.reused") != "true"])
        for s in ("curate", "pretrain", "probe")
    }
    assert after == before
    assert client.get_run(again.parent_run_id).data.tags["dag.curate.reused"] == "true"


def test_changing_a_probe_setting_reruns_only_probing(first):
    root, _, result = first
    changed = run_dag(dag_config(root / "raw", root / "ws", "probe.seg.steps=12"))
    assert [o.reused for o in changed.outcomes] == [True, True, False]
    assert changed.outcomes[2].identity != result.outcomes[2].identity


def test_changing_a_curation_threshold_reruns_all_three(first):
    root, _, result = first
    changed = run_dag(dag_config(root / "raw", root / "ws", "curate.geometry.min_short_side=300"))
    assert [o.reused for o in changed.outcomes] == [False, False, False]
    assert changed.outcomes[0].result.dataset_id != result.outcomes[0].result.dataset_id
    assert changed.outcomes[1].result.dataset_id == changed.outcomes[0].result.dataset_id


def test_bad_stage_lists_are_refused():
    with pytest.raises(ValueError, match="contiguous"):
        DagConfig(stages=["curate", "probe"]).validate()
    with pytest.raises(ValueError, match="inputs.dataset"):
        DagConfig(stages=["pretrain", "probe"]).validate()


@pytest.mark.slow
def test_a_stage_killed_mid_run_resumes(tmp_path):
    raw, ws = tmp_path / "raw", tmp_path / "ws"
    build_demo_corpus(raw)
    args = [
        f"curate.input.uri={raw}",
        f"workspace={ws}",
        f"curate.detector.weights={CENTERNET}",
        "curate.ray.progress_bars=off",
        *FAST,
        "pretrain.steps=10",
        "pretrain.checkpoint.every=2",
        f"curate.ray.temp_dir=/tmp/hvdag-{os.getpid()}",
    ]
    cmd = [
        sys.executable,
        str(REPO / "pipelines" / "dag.py"),
        "--config",
        str(REPO / "configs" / "dag_demo.yaml"),
        *args,
    ]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(
        proc,
        lambda: bool(list((ws / "pretrain").glob("*/checkpoint_*"))),
        timeout=600,
        poll=0.5,
        leftovers=f"/tmp/hvdag-{os.getpid()}",
    )
    killed_checkpoints = sorted(p.name for p in (ws / "pretrain").glob("*/checkpoint_*"))
    assert killed_checkpoints and not list((ws / "pretrain").glob("*/DONE.json"))
    result = run_dag(dag_config(raw, ws, "pretrain.steps=10", "pretrain.checkpoint.every=2"))
    assert [o.reused for o in result.outcomes] == [True, False, False]  # curation was done; pretraining resumed
    pretrain = result.outcomes[1]
    assert pretrain.result.final_step == 10
    from mlflow import MlflowClient

    history = MlflowClient(result.tracking_uri).get_metric_history(pretrain.run_id, "loss")
    assert sorted({m.step for m in history}) == list(range(1, 11))  # one MLflow run across both sessions


@pytest.mark.slow
def test_stages_run_as_ray_jobs_against_a_head(tmp_path):
    from infra.local_cluster import LocalRayHead

    raw, ws = tmp_path / "raw", tmp_path / "ws"
    build_demo_corpus(raw)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    with LocalRayHead(num_cpus=2, env=env) as head:
        # The DAG driver runs as its own process with this head's token (Ray caches a process's token).
        cmd = [
            sys.executable,
            str(REPO / "pipelines" / "dag.py"),
            "--config",
            str(REPO / "configs" / "dag_demo.yaml"),
            f"curate.input.uri={raw}",
            f"workspace={ws}",
            f"curate.detector.weights={CENTERNET}",
            *FAST,
            "submit=ray_job",
            f"job_address={head.dashboard_url}",
        ]
        done = subprocess.run(cmd, env=head.client_env(env), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        listing = subprocess.run(
            [str(Path(sys.executable).with_name("ray")), "job", "list", "--address", head.dashboard_url],
            env=head.client_env(env),
            capture_output=True,
            text=True,
        ).stdout
    assert listing.count("SUCCEEDED") >= 3
    for script in ("pipelines/curate.py", "pipelines/pretrain.py", "pipelines/probe.py"):
        assert script in listing, script
    assert "ran" in done.stdout and "reused" not in done.stdout
    result = run_dag(dag_config(raw, ws))  # same workspace, in process: every stage's result is found and reused
    assert [o.reused for o in result.outcomes] == [True, True, True]
    assert result.outcomes[2].result.metrics["seg"]["mIoU"] > 0
    assert not head.pids()


def test_the_finetune_stage_runs_between_pretraining_and_probing_with_lineage(first):
    """Adding the fine-tune stage to a finished chain runs only it; its run carries the lineage
    (checkpoint digest, pretraining run, dataset version) and its export is in the released
    layout with the recorded sha256."""
    from mlflow import MlflowClient

    from evaluation.io import sha256_file
    from models.io import load_state_dict_file

    root, _, result = first
    ft = [
        "stages=[curate, pretrain, finetune, probe]",
        "finetune.tasks=[seg]",
        "finetune.steps=4",
        "finetune.checkpoint.every=2",
        "finetune.synthetic.train_images=24",
        "finetune.synthetic.val_images=8",
        "finetune.ray.num_cpus=null",
    ]
    out = run_dag(dag_config(root / "raw", root / "ws", *ft))
    assert [(o.stage, o.reused) for o in out.outcomes] == [
        ("curate", True),
        ("pretrain", True),
        ("finetune", False),
        ("probe", True),
    ]
    curate, pretrain = result.outcomes[0], result.outcomes[1]
    fine = out.outcomes[2]
    tags = MlflowClient(out.tracking_uri).get_run(fine.run_id).data.tags
    assert tags["mlflow.parentRunId"] == out.parent_run_id and tags["humanvision.stage"] == "finetune"
    assert tags["lineage.checkpoint_digest"] == pretrain.result.checkpoint_digest
    assert tags["lineage.pretrain_run_id"] == pretrain.run_id
    assert tags["lineage.dataset_id"] == curate.result.dataset_id
    export = fine.result.exports["seg"]
    assert sha256_file(export["export"]) == export["export_sha256"] == tags["finetune.seg.export_sha256"]
    weights = load_state_dict_file(export["export"])
    pretrained = load_state_dict_file(pretrain.result.student_weights)
    assert {k.removeprefix("backbone.") for k in weights if k.startswith("backbone.")} == set(pretrained)
    assert all(k.startswith(("backbone.", "decode_head.")) for k in weights)
    assert "mIoU" in fine.result.metrics["seg"]
    again = run_dag(dag_config(root / "raw", root / "ws", *ft))
    assert [o.reused for o in again.outcomes] == [True, True, True, True]
