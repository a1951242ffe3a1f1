"""A fine-tune SIGKILLed between two checkpoints resumes to the uninterrupted result.

The whole process group of a running ``pipelines/finetune.py`` (driver, local Ray cluster,
two FSDP2 Ray Train workers) is SIGKILLed while a step after a checkpoint runs. Re-running
the same command resumes from the newest checkpoint and gives exactly the uninterrupted
run's per-step losses (``history.jsonl``, replayed steps keeping their latest value) and
exported weights: the batches are a function of the step (no loader state), the model and
AdamW state come back from the DCP checkpoint.

Only the killed run is a job process of its own: the uninterrupted reference and the re-run run
the same command through the script's ``main`` in the test process, on the session's Ray (what
the re-run resumes from is on disk; ``tests/conftest.py: in_process``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infra import jsonl
from infra.local_cluster import pids_naming
from models.io import load_state_dict_file
from tests.conftest import REPO, in_process, kill_when

pytestmark = pytest.mark.slow
STEPS, EVERY = 20, 5


def cmd(out: Path, root: Path, ray_tmp: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "pipelines" / "finetune.py"),
        "--config",
        str(REPO / "configs" / "finetune_tiny.yaml"),
        f"output_dir={out}",
        "tasks=[seg]",
        f"steps={STEPS}",
        f"checkpoint.every={EVERY}",
        "checkpoint.keep=2",
        "batch_size_per_worker=2",
        "synthetic.train_images=16",
        "synthetic.val_images=4",
        "synthetic.height=64",
        "synthetic.width=48",
        "seg.image_size=[64, 48]",
        "deterministic=true",
        "ray.num_workers=2",
        "ray.cpus_per_worker=0.5",
        f"ray.temp_dir={ray_tmp}",
        f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
    ]


def history(task_dir: Path) -> list[dict]:
    """The step records (``{"step": s, "loss": ...}``) of all sessions, in order."""
    return [row for row in jsonl.read(task_dir / "history.jsonl") if "step" in row]


def session_starts(task_dir: Path) -> list[int]:
    """The step each session started from (0 for the first), as rank 0 recorded it after restoring."""
    return [row["session_start"] for row in jsonl.read(task_dir / "history.jsonl") if "session_start" in row]


def checkpoints(task_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (task_dir / "train").glob("checkpoint_0*") if p.is_dir())


def past_a_checkpoint(task_dir: Path) -> bool:
    steps, ckpts = history(task_dir), checkpoints(task_dir)
    return bool(ckpts and steps) and steps[-1]["step"] > ckpts[-1]


def losses(task_dir: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in history(task_dir)}


def test_sigkilled_finetune_resumes_to_the_uninterrupted_result(tmp_path, ray_local):
    ray_tmp = f"/tmp/hvf-{os.getpid()}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    # The uninterrupted reference: the same command in this process (its own MLflow store), on the
    # session's Ray. The killed run's numbers are a function of the step, not of the cluster.
    (tmp_path / "ref-store").mkdir()
    in_process(cmd(tmp_path / "reference", tmp_path / "ref-store", f"{ray_tmp}-ref"))
    task_dir = tmp_path / "crashed" / "seg"
    proc = subprocess.Popen(
        cmd(tmp_path / "crashed", tmp_path, ray_tmp),
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    kill_when(proc, lambda: past_a_checkpoint(task_dir), timeout=1200, leftovers=ray_tmp)
    killed_at, ckpts = history(task_dir)[-1]["step"], checkpoints(task_dir)
    assert killed_at < STEPS and not (task_dir / "export" / "export.json").exists(), "the run finished before the kill"
    assert not pids_naming(ray_tmp), "a process of the killed job survived"

    in_process(cmd(tmp_path / "crashed", tmp_path, ray_tmp))  # the same command again: it resumes
    starts = session_starts(task_dir)
    print(f"killed after step {killed_at} (checkpoints {ckpts}); sessions started at {starts}")
    assert len(starts) == 2 and starts[0] == 0, starts
    assert starts[1] in ckpts and starts[1] < killed_at  # resumed from a checkpoint written before the kill

    ref_losses, got = losses(tmp_path / "reference" / "seg"), losses(task_dir)
    assert sorted(got) == sorted(ref_losses) == list(range(1, STEPS + 1))
    assert got == ref_losses  # bit-identical floats, every step
    ref_w = load_state_dict_file(tmp_path / "reference" / "seg" / "export" / "model.safetensors")
    w = load_state_dict_file(task_dir / "export" / "model.safetensors")
    assert w.keys() == ref_w.keys() and all(torch.equal(w[k], ref_w[k]) for k in w)
    assert not pids_naming(ray_tmp)
