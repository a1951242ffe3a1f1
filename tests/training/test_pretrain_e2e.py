"""The tiny configuration on Ray Train: 2 workers, FSDP2 over gloo, real curated demo shards.

Checks on the session's uninterrupted reference run (``pretrain_reference``,
tests/training/conftest.py): training, exports, checkpoints, MLflow. Resuming it after a crash is
``test_pretrain_crash_resume``'s (the same settings through ``pipelines/pretrain.py``); a clean
stop at ``max_steps_this_session`` and its resume are ``test_v1_pretrain_e2e``'s.
"""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from infra import jsonl
from models.registry import build_backbone
from tests.training.conftest import REFERENCE_EVERY as EVERY
from tests.training.conftest import REFERENCE_STEPS as STEPS
from tests.training.conftest import tiny_config
from training.run import run_pretraining

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(pretrain_reference):
    return {**pretrain_reference, "full": pretrain_reference["run"]}


def batch_keys(run_dir: str) -> dict[tuple[int, int], list[str]]:
    out = {}
    for path in sorted(Path(run_dir, "batch_keys").glob("rank_*.jsonl")):
        rank = int(path.stem.split("_")[1])
        for record in jsonl.read(path):
            if "step" in record:  # not a {"session_start": step} marker
                out[(record["step"], rank)] = record["keys"]  # a replayed step keeps its latest keys
    return out


def test_tiny_config_trains_on_curated_shards_with_two_fsdp2_workers(runs):
    full = runs["full"]
    assert full.completed and full.final_step == STEPS and len(full.losses) == STEPS
    assert all(torch.isfinite(torch.tensor(full.losses)))
    first, last, _ = full.loss_trend(window=3)["loss_mae"]
    assert last < first  # the reconstruction loss goes down (mean of the last 3 steps vs the first 3)
    keys = batch_keys(full.run_dir)
    assert {rank for _, rank in keys} == {0, 1} and len(keys) == 2 * STEPS
    curated_keys = set()
    for shard in runs["curated"].shards:
        import tarfile

        with tarfile.open(shard) as tar:
            curated_keys |= {n.rsplit(".", 1)[0] for n in tar.getnames()}
    assert set().union(*keys.values()) <= curated_keys
    # the two ranks read different samples at the same step
    assert keys[(1, 0)] != keys[(1, 1)]


def test_exported_backbones_are_official_layout_and_digested(runs):
    full = runs["full"]
    data = Path(full.student_weights).read_bytes()
    assert hashlib.sha256(data).hexdigest() == full.checkpoint_digest
    student = build_backbone("sapiens2_tiny", weights=full.student_weights)
    teacher = build_backbone("sapiens2_tiny", weights=full.teacher_weights)
    x = torch.randn(1, 3, 96, 64)
    with torch.no_grad():
        assert student(x).cls.shape == (1, 64)
        assert not torch.equal(student(x).cls, teacher(x).cls)  # the teacher is an average, not a copy


def test_checkpoints_are_sharded_kept_n_and_resumable(runs):
    run_dir = Path(runs["full"].run_dir)
    kept = sorted(p.name for p in run_dir.glob("checkpoint_0*"))
    assert kept == [f"checkpoint_{s:08d}" for s in (STEPS - EVERY, STEPS)]  # keep=2: the first one rotated out
    ckpt = run_dir / f"checkpoint_{STEPS:08d}"
    assert {p.name for p in ckpt.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}  # one shard file per rank
    assert json.loads((ckpt / "train_state.json").read_text())["step"] == STEPS
    assert {p.name for p in (ckpt / "data").iterdir()} == {"rank_00000.json", "rank_00001.json"}
    assert runs["full"].checkpoint_uri == str(ckpt)


def test_mlflow_ties_the_run_to_its_dataset_version_and_checkpoints(runs):
    from mlflow import MlflowClient

    full, curated = runs["full"], runs["curated"]
    client = MlflowClient(full.tracking_uri)
    run = client.get_run(full.mlflow_run_id)
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    assert tags["humanvision.stage"] == "pretrain"
    assert tags["dataset.id"] == curated.dataset_id and tags["dataset.uri"] == curated.output_dir
    assert tags["checkpoint.student"] == full.student_weights and tags["checkpoint.digest"] == full.checkpoint_digest
    assert tags["checkpoint.latest"].endswith(f"checkpoint_{STEPS:08d}")
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.digest == curated.dataset_id and inp.tags[0].value == "training"
    for key in (
        "loss",
        "loss_mae",
        "loss_cl",
        "loss_koleo",
        "lr",
        "momentum",
        "teacher_temp",
        "grad_norm",
        "images_per_s",
        "tokens_per_s",
        "data_wait_s",
    ):
        assert len(client.get_metric_history(full.mlflow_run_id, key)) == STEPS, key
    assert run.data.params["model"] == "sapiens2_tiny" and run.data.params["loss.cl_weight"] == "0.4"
    artifacts = {a.path for a in client.list_artifacts(full.mlflow_run_id)}
    assert "config.yaml" in artifacts
    images = [a.path for a in client.list_artifacts(full.mlflow_run_id, "reconstructions")]
    assert images == [f"reconstructions/step_{s:08d}.png" for s in range(EVERY, STEPS + 1, EVERY)]
    assert run.data.tags["training.state"] == "completed"


def test_resuming_with_different_settings_is_refused(runs):
    with pytest.raises(ValueError, match=r"different settings \(optim.lr\)"):
        run_pretraining(tiny_config(*runs["common"], "run_name=reference", "optim.lr=0.5"))


def test_balanced_sampling_trains_the_tiny_model_on_the_demos_own_clusters(runs, tmp_path_factory):
    """``pipelines/pretrain.py ... data.sampling.policy=balanced`` on the session's curated demo, whose
    ``clusters`` step (configs/curate_demo.yaml) wrote ``cluster_l0``/``cluster_l1`` and clusters.json:
    in this process on the session's Ray, it trains, draws only the version's samples, and records
    the policy and its acceptance. It also runs the real sizes' parallel settings (bf16, activation
    checkpointing, one FSDP unit per block over the two ranks), which the CPU configs turn off."""
    import json
    import sys

    from mlflow import MlflowClient

    from curation.output import CLUSTERS_FILE
    from tests.conftest import REPO, in_process
    from tests.training.conftest import TINY
    from tests.training.versions import tar_keys

    version = Path(runs["curated"].output_dir)
    levels = json.loads((version / CLUSTERS_FILE).read_text())["levels"]
    assert len(levels) == 2 and sum(levels[-1]["counts"].values()) == runs["curated"].stats["kept"]
    tmp = tmp_path_factory.mktemp("balanced")
    steps = 4
    settings = [f"data.dataset={version}", f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", f"storage_path={tmp}"]
    settings += [f"steps={steps}", f"checkpoint.every={steps}", "metrics.log_every=1", "metrics.images_every=0"]
    settings += ["record_batch_keys=true", "run_name=balanced", "data.sampling.policy=balanced"]
    settings += ["parallel.precision=bf16", "parallel.activation_checkpointing=true", "parallel.shard_blocks=true"]
    in_process([sys.executable, str(REPO / "pipelines" / "pretrain.py"), "--config", str(TINY), *settings])
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.tags["training.final_step"] == str(steps)
    assert run.data.tags["data.sampling"].startswith("data.sampling.policy=balanced, reading cluster_l1")
    acceptance = [m.value for m in client.get_metric_history(run.info.run_id, "data_acceptance")]
    assert len(acceptance) == steps and all(0 < a <= 1 for a in acceptance)
    keys = set().union(*(tar_keys(s) for s in runs["curated"].shards))
    drawn = set().union(*batch_keys(str(tmp / "balanced")).values())
    assert drawn and drawn <= keys
