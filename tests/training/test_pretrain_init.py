"""Continued pretraining: a run started from a released-layout backbone file (``init.backbone``)
on Ray Train, 2 FSDP2 workers, the curated demo shards.

The file is the official module's own ``sapiens2_tiny`` weights (the reference parity vectors,
group ``plain``). The run stops after step 1 (a clean session end with a checkpoint), the file is
deleted, and the same command resumes it to step 2: a resumed run takes its state from its
checkpoint and must not need (or re-read) the file. The session's reference run
(``pretrain_reference``: the same settings without ``init``) is the run without init."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from models.io import load_state_dict_file
from tests.training.conftest import reference_settings, released_tiny_backbone, tiny_config
from tests.training.test_pretrain_crash_resume import session_starts
from training.run import run_pretraining

pytestmark = pytest.mark.slow
STEPS = 2


def relative_distance(weights: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """Median over tensors of ||w - w0|| / ||w0||."""
    ratios = [float((weights[k].float() - v.float()).norm() / v.float().norm()) for k, v in start.items()]
    return float(torch.tensor(ratios).median())


@pytest.fixture(scope="module")
def init_run(pretrain_reference, tmp_path_factory):
    folder = tmp_path_factory.mktemp("init-run")
    released = released_tiny_backbone(folder / "released" / "sapiens2_tiny.safetensors")
    given = shutil.copy(released, folder / "given.safetensors")  # the copy the run is pointed at
    root, curated = pretrain_reference["root"], pretrain_reference["curated"]
    common = [
        *reference_settings(curated.dataset_id, root, folder / "runs"),
        f"steps={STEPS}",
        f"init.backbone={given}",
        "run_name=continued",
    ]
    first = run_pretraining(tiny_config(*common, "max_steps_this_session=1"))
    (folder / "given.safetensors").unlink()  # a resumed run must not need it
    second = run_pretraining(tiny_config(*common))
    return {"first": first, "second": second, "released": released, "reference": pretrain_reference["run"]}


def test_a_run_continued_from_released_weights_stays_near_them(init_run):
    first, second = init_run["first"], init_run["second"]
    assert not first.completed and first.final_step == 1
    assert second.completed and second.final_step == STEPS and len(second.losses) == STEPS
    assert all(torch.isfinite(torch.tensor(second.losses)))
    released = load_state_dict_file(init_run["released"])
    continued = load_state_dict_file(second.student_weights)
    assert continued.keys() == released.keys()  # the released key layout, every key
    near = relative_distance(continued, released)
    far = relative_distance(load_state_dict_file(init_run["reference"].student_weights), released)
    print(f"median relative L2 to the released file: continued {near:.4f}, without init {far:.4f}")
    assert near < 0.10 and far > 0.50


def test_the_run_records_the_file_by_content_and_resumed_without_it(init_run):
    from mlflow import MlflowClient

    first, second = init_run["first"], init_run["second"]
    sha = hashlib.sha256(init_run["released"].read_bytes()).hexdigest()
    assert first.mlflow_run_id == second.mlflow_run_id  # one MLflow run, both sessions
    params = MlflowClient(second.tracking_uri).get_run(second.mlflow_run_id).data.params
    assert params["init.backbone_sha256"] == sha
    assert second.weights == {"init.backbone": sha}
    # the second session restored step 1 on every rank (the file was gone by then)
    starts = session_starts(Path(second.run_dir))
    assert starts == {0: [0, 1], 1: [0, 1]}
