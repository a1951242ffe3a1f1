"""The DAG: reuse what did not change, re-run what did, resume what was killed, record
parent/child runs with lineage in MLflow, and run stages as real Ray jobs.

Every test works in the workspace of one real demo run (``demo_done``, tests/pipelines/conftest.py),
whose first run ran every stage (``test_demo`` checks its terminal): the chain here plans against
the stages that run finished, as a user's second invocation does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.chain import DagConfig, run_dag
from pipelines.chain.run import DONE, tracking_uri
from pipelines.chain.stages import Handoff, hand_on, plan, with_store
from tests.conftest import kill_when


def stage_runs(uri: str, stage: str, reused: bool) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, filter_string=f"tags.`dag.stage` = '{stage}'")
    return [r for r in runs if (r.data.tags.get("dag.reused") == "true") == reused]


def by_stage(result) -> dict:
    return {o.stage: o for o in result.outcomes}


def downstream_plan(cfg: DagConfig, stage: str, *finished) -> object:
    """The plan ``run_dag(cfg)`` would make for ``stage`` after the ``finished`` outcomes."""
    ws = Path(cfg.workspace)
    uri = tracking_uri(cfg, ws)
    handoff = Handoff.from_inputs(cfg.inputs)
    for outcome in finished:
        hand_on(handoff, outcome.result)
    return plan(stage, with_store(getattr(cfg, stage), uri, cfg.tracking.experiment), ws, handoff, uri)


@pytest.fixture(scope="module")
def first(demo_done, ray_local):
    """The demo's configuration run again, in this process: (demo, config, result, runs per stage
    before it)."""
    cfg = demo_done.config()
    uri = tracking_uri(cfg, Path(cfg.workspace))
    before = {s: len(stage_runs(uri, s, reused=False)) for s in cfg.stages}
    return demo_done, cfg, run_dag(cfg), before


@pytest.mark.slow
def test_the_demo_runs_stages_are_linked_in_mlflow_with_lineage(first):
    from mlflow import MlflowClient

    _, cfg, result, _ = first
    assert [o.stage for o in result.outcomes] == cfg.stages
    client = MlflowClient(result.tracking_uri)
    produced = {o.stage: client.get_run(o.run_id) for o in result.outcomes}  # the runs that made the results
    (demo_parent,) = {r.data.tags["mlflow.parentRunId"] for r in produced.values()}  # one invocation made all
    parent = client.get_run(demo_parent)
    assert demo_parent != result.parent_run_id
    assert parent.info.status == "FINISHED" and parent.data.tags["humanvision.stage"] == "dag"
    for o in result.outcomes:
        assert produced[o.stage].data.tags["dag.identity"] == o.identity == Path(o.folder).name
    # lineage: the probe's metric -> checkpoint -> pretraining run -> dataset version -> curation run
    o = by_stage(result)
    curate, pretrain, probe = o["curate"], o["pretrain"], o["probe"]
    probe_tags = produced["probe"].data.tags
    assert probe_tags["lineage.checkpoint_digest"] == pretrain.result.checkpoint_digest
    assert probe_tags["lineage.pretrain_run_id"] == pretrain.run_id
    assert probe_tags["lineage.dataset_id"] == curate.result.dataset_id == pretrain.result.dataset_id
    assert probe_tags["lineage.curation_run_id"] == curate.run_id
    assert produced["pretrain"].data.tags["lineage.dataset_id"] == curate.result.dataset_id
    assert parent.data.tags["lineage.checkpoint_digest"] == pretrain.result.checkpoint_digest
    assert "mIoU" in probe.result.metrics["seg"] and "top1_k10" in probe.result.metrics["knn"]


@pytest.mark.slow
def test_a_second_run_with_nothing_changed_reruns_nothing(first):
    from mlflow import MlflowClient

    _, cfg, result, before = first
    assert all(o.reused for o in result.outcomes)
    reused = [r for s in cfg.stages for r in stage_runs(result.tracking_uri, s, reused=True)]
    ours = [r for r in reused if r.data.tags["mlflow.parentRunId"] == result.parent_run_id]
    assert len(ours) == len(cfg.stages)  # one small pointer run per reused stage, children of this run
    assert {r.data.tags["dag.reused_run_id"] for r in ours} == {o.run_id for o in result.outcomes}
    assert {s: len(stage_runs(result.tracking_uri, s, reused=False)) for s in cfg.stages} == before
    assert MlflowClient(result.tracking_uri).get_run(result.parent_run_id).data.tags["dag.curate.reused"] == "true"


@pytest.mark.slow
def test_changing_a_probe_setting_reruns_only_probing(first):
    demo, _, result, _ = first
    changed = run_dag(demo.config("probe.seg.steps=12"))
    assert {o.stage: o.reused for o in changed.outcomes} == {o.stage: o.stage != "probe" for o in result.outcomes}
    assert by_stage(changed)["probe"].identity != by_stage(result)["probe"].identity


@pytest.mark.slow
def test_changing_a_curation_threshold_recurates_and_moves_every_later_stage(first):
    """Curation runs again (a new dataset version); pretraining then has a new identity, with no
    finished result, and every stage after it digests the checkpoint that run will export
    (tests/pipelines/test_stage_identity.py)."""
    demo, _, result, _ = first
    cfg = demo.config("curate.geometry.min_short_side=300", "stages=[curate]")
    (curate,) = run_dag(cfg).outcomes
    assert not curate.reused and curate.result.dataset_id != by_stage(result)["curate"].result.dataset_id
    pretrain = downstream_plan(demo.config("curate.geometry.min_short_side=300"), "pretrain", curate)
    assert pretrain.identity != by_stage(result)["pretrain"].identity and not (pretrain.folder / DONE).exists()


@pytest.mark.slow
def test_the_finetune_stage_between_pretraining_and_probing_carries_the_lineage(first):
    """The demo's fine-tune run carries the lineage (checkpoint digest, pretraining run, dataset
    version) and its export is in the released layout with the recorded sha256."""
    from mlflow import MlflowClient

    from infra.digests import sha256_file
    from models.io import load_state_dict_file

    _, cfg, result, _ = first
    assert cfg.stages.index("pretrain") < cfg.stages.index("finetune") < cfg.stages.index("probe")
    o = by_stage(result)
    curate, pretrain, fine = o["curate"], o["pretrain"], o["finetune"]
    tags = MlflowClient(result.tracking_uri).get_run(fine.run_id).data.tags
    assert tags["humanvision.stage"] == "finetune"
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


def test_bad_stage_lists_are_refused():
    with pytest.raises(ValueError, match="contiguous"):
        DagConfig(stages=["curate", "probe"]).validate()
    with pytest.raises(ValueError, match="inputs.dataset"):
        DagConfig(stages=["pretrain", "probe"]).validate()


@pytest.mark.slow
def test_a_stage_killed_mid_run_resumes(first):
    """``pipelines/dag.py`` SIGKILLed (its whole process group) once the new pretraining stage has
    written a checkpoint; the next invocation reuses curation and resumes that stage in its folder,
    into the same MLflow run."""
    demo, _, result, _ = first
    ray_tmp = f"/tmp/hvdag-{os.getpid()}"
    longer = ("stages=[curate, pretrain]", "pretrain.steps=10", "pretrain.checkpoint.every=2")
    target = downstream_plan(demo.config(*longer), "pretrain", by_stage(result)["curate"]).folder
    cmd = demo.dag_command(*longer, f"curate.ray.temp_dir={ray_tmp}", f"pretrain.ray.temp_dir={ray_tmp}")
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(proc, lambda: bool(list(target.glob("checkpoint_*"))), timeout=600, poll=0.5, leftovers=ray_tmp)
    assert list(target.glob("checkpoint_*")) and not (target / DONE).exists()
    resumed = run_dag(demo.config(*longer))
    assert [o.reused for o in resumed.outcomes] == [True, False]  # curation was done; pretraining resumed
    pretrain = resumed.outcomes[1]
    assert Path(pretrain.folder) == target and pretrain.result.final_step == 10
    from mlflow import MlflowClient

    history = MlflowClient(resumed.tracking_uri).get_metric_history(pretrain.run_id, "loss")
    assert sorted({m.step for m in history}) == list(range(1, 11))  # one MLflow run across both sessions


@pytest.mark.slow
def test_stages_run_as_ray_jobs_against_a_head(first):
    """Pretraining and probing submitted as Ray jobs (``pipelines/pretrain.py``, ``probe.py``) to a
    head of this test's own; their results are then found and reused in this process."""
    from infra.local_cluster import LocalRayHead

    demo, _, result, _ = first
    dataset = by_stage(result)["curate"].result.dataset_id
    as_jobs = ("stages=[pretrain, probe]", f"inputs.dataset={dataset}", "pretrain.steps=2", "probe.tasks=[knn]")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    with LocalRayHead(num_cpus=2, env=env) as head:
        # The DAG driver runs as its own process with this head's token (Ray caches a process's token).
        cmd = demo.dag_command(*as_jobs, "submit=ray_job", f"job_address={head.dashboard_url}")
        done = subprocess.run(cmd, env=head.client_env(env), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        listing = subprocess.run(
            [str(Path(sys.executable).with_name("ray")), "job", "list", "--address", head.dashboard_url],
            env=head.client_env(env),
            capture_output=True,
            text=True,
        ).stdout
    assert listing.count("SUCCEEDED") >= 2
    for script in ("pipelines/pretrain.py", "pipelines/probe.py"):
        assert script in listing, script
    assert "ran" in done.stdout and "reused" not in done.stdout
    again = run_dag(demo.config(*as_jobs))  # same workspace, in process: every stage's result is found and reused
    assert [o.reused for o in again.outcomes] == [True, True]
    assert again.outcomes[1].result.metrics["knn"]["top1_k10"] >= 0
    assert not head.pids()
