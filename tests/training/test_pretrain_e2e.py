"""The tiny configuration on Ray Train: 2 workers, FSDP2 over gloo, real curated demo shards.

Three runs share the fixture: ``full`` (10 steps uninterrupted) and ``split`` (the same
settings, stopped after 4 steps by ``max_steps_this_session`` and resumed by re-running
with the same run name). With deterministic CPU kernels the resumed run must reproduce the
uninterrupted one exactly: same batches, same losses, same exported weights.
"""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from infra import jsonl
from models.registry import build_backbone
from tests.training.conftest import tiny_config
from training.run import run_pretraining

pytestmark = pytest.mark.slow
STEPS, EVERY, STOP = 10, 5, 4


@pytest.fixture(scope="module")
def runs(curated_demo, tmp_path_factory):
    root, curated = curated_demo
    storage = tmp_path_factory.mktemp("pretrain-runs")
    common = [
        f"data.dataset={curated.dataset_id}",
        f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
        f"storage_path={storage}",
        f"steps={STEPS}",
        f"checkpoint.every={EVERY}",
        "record_batch_keys=true",
        f"metrics.images_every={EVERY}",
        "metrics.log_every=3",
    ]
    full = run_pretraining(tiny_config(*common, "run_name=full"))
    part1 = run_pretraining(tiny_config(*common, "run_name=split", f"max_steps_this_session={STOP}"))
    part2 = run_pretraining(tiny_config(*common, "run_name=split"))
    print(f"run seconds: full {full.seconds}, split {part1.seconds} + {part2.seconds}")
    return {
        "full": full,
        "part1": part1,
        "part2": part2,
        "storage": storage,
        "root": root,
        "curated": curated,
        "common": common,
    }


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


def test_a_stopped_and_resumed_run_repeats_the_uninterrupted_one_exactly(runs):
    full, part1, part2 = runs["full"], runs["part1"], runs["part2"]
    assert not part1.completed and part1.final_step == STOP and part1.losses == full.losses[:STOP]
    assert part2.completed and part2.final_step == STEPS
    assert part2.losses == full.losses  # bit-identical floats, steps 1..10 (5..10 after the resume)
    for key in ("loss_mae", "loss_cl", "loss_koleo", "lr", "momentum", "grad_norm"):
        assert [part2.history[s][key] for s in range(1, STEPS + 1)] == [
            full.history[s][key] for s in range(1, STEPS + 1)
        ]
    assert batch_keys(part2.run_dir) == batch_keys(full.run_dir)  # same batches, per step and rank
    # identical exported weights (the files differ only in their metadata: the run name)
    from models.io import load_state_dict_file

    a, b = load_state_dict_file(part2.student_weights), load_state_dict_file(full.student_weights)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert part2.mlflow_run_id == part1.mlflow_run_id != full.mlflow_run_id  # one MLflow run per training run


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
    run_dir = Path(runs["part2"].run_dir)
    kept = sorted(p.name for p in run_dir.glob("checkpoint_0*"))
    assert kept == ["checkpoint_00000005", "checkpoint_00000010"]  # keep=2: step 4 (session end) rotated out
    ckpt = run_dir / "checkpoint_00000010"
    assert {p.name for p in ckpt.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}  # one shard file per rank
    assert json.loads((ckpt / "train_state.json").read_text())["step"] == STEPS
    assert {p.name for p in (ckpt / "data").iterdir()} == {"rank_00000.json", "rank_00001.json"}
    assert runs["part2"].checkpoint_uri == str(ckpt)


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
    assert tags["checkpoint.latest"].endswith("checkpoint_00000010")
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
    assert images == ["reconstructions/step_00000005.png", "reconstructions/step_00000010.png"]
    # the split run: paused after session 1, finished after session 2, one record
    split = client.get_run(runs["part2"].mlflow_run_id)
    assert split.info.status == "FINISHED" and split.data.tags["training.state"] == "completed"


def test_resuming_with_different_settings_is_refused(runs):
    with pytest.raises(ValueError, match=r"different settings \(optim.lr\)"):
        run_pretraining(tiny_config(*runs["common"], "run_name=full", "optim.lr=0.5"))
