"""A pretraining job SIGKILLed between two checkpoints resumes to the uninterrupted result.

``test_v1_pretrain_e2e`` pauses a run at a planned step (a clean session end, checkpoint
written on purpose). Here the whole process group of a running
``pipelines/pretrain.py`` (driver, local Ray cluster, Ray Train workers) is SIGKILLed while
a step after a checkpoint is running: no clean-up, no final checkpoint. Re-running the same
command must resume from the last checkpoint and give exactly the uninterrupted run's
per-step losses (as logged to MLflow, replayed steps keeping their latest value) and
exported weights. The uninterrupted run is the session's reference (``pretrain_reference``,
tests/training/conftest.py: the same settings, trained in the test process).

Synchronisation is on files only: each rank appends ``{"step": s}`` to
``<run>/batch_keys/rank_<r>.jsonl`` after step ``s`` (``record_batch_keys``), and a rank
starts step ``k + 1`` only after its ``checkpoint_<k>`` report returned, so "every rank has
recorded a step past the newest checkpoint" means that checkpoint is on disk and a later
step is running. However slow the machine, the kill lands between two checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infra import jsonl
from infra.local_cluster import pids_naming
from infra.tracking import metric_history
from models.io import load_state_dict_file
from tests.conftest import REPO, kill_when
from tests.training.conftest import REFERENCE_STEPS
from training.loop import EXPORT_DIR, EXPORT_MANIFEST
from training.run import HISTORY_KEYS, RUN_RECORD

pytestmark = pytest.mark.slow
STEPS, WORKERS = REFERENCE_STEPS, 2


def pretrain_cmd(common: list[str], run_name: str, ray_tmp: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "pipelines" / "pretrain.py"),
        "--config",
        str(REPO / "configs" / "pretrain_tiny.yaml"),
        *common,
        f"run_name={run_name}",
        f"ray.temp_dir={ray_tmp}",
        "ray.progress_bars=off",
    ]


def records(run_dir: Path) -> dict[int, list[dict]]:
    """Each rank's records in order (all sessions): ``{"step": s, ...}`` after step s and
    ``{"session_start": s}`` when a session began at step s; lines torn by the kill skipped."""
    return {int(p.stem.split("_")[1]): jsonl.read(p) for p in sorted((run_dir / "batch_keys").glob("rank_*.jsonl"))}


def recorded_steps(run_dir: Path) -> dict[int, list[int]]:
    """Steps each rank has finished, in the order it recorded them (all sessions)."""
    return {rank: [r["step"] for r in recs if "step" in r] for rank, recs in records(run_dir).items()}


def session_starts(run_dir: Path) -> dict[int, list[int]]:
    """The step each session of each rank started from (0 for the first)."""
    return {rank: [r["session_start"] for r in recs if "session_start" in r] for rank, recs in records(run_dir).items()}


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in run_dir.glob("checkpoint_0*") if p.is_dir())


def past_a_checkpoint(run_dir: Path) -> bool:
    steps, ckpts = recorded_steps(run_dir), checkpoint_steps(run_dir)
    return (
        len(steps) == WORKERS
        and bool(ckpts)
        and all(s for s in steps.values())
        and min(s[-1] for s in steps.values()) > ckpts[-1]
    )


def outcome(run_dir: Path) -> tuple[dict[int, dict[str, float]], dict[str, torch.Tensor]]:
    """Per-step logged values (from MLflow) and the exported student weights."""
    record = json.loads((run_dir / RUN_RECORD).read_text())
    history = metric_history(record["tracking_uri"], record["mlflow_run_id"], HISTORY_KEYS)
    manifest = json.loads((run_dir / EXPORT_DIR / EXPORT_MANIFEST).read_text())
    assert manifest["step"] == STEPS
    return history, load_state_dict_file(manifest["export_student"])


def test_sigkilled_pretraining_resumes_to_the_uninterrupted_result(pretrain_reference):
    storage, common = pretrain_reference["storage"], pretrain_reference["common"]
    env = dict(os.environ)
    ray_tmp = f"/tmp/hvp-{os.getpid()}"  # short: Ray's socket paths
    # The same settings as the session's uninterrupted reference run, SIGKILLed (whole process
    # group) while a step after a checkpoint runs. The kill waits on files, not on timing.
    run_dir = storage / "crashed"
    cmd = pretrain_cmd(common, "crashed", ray_tmp)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(proc, lambda: past_a_checkpoint(run_dir), timeout=1200, leftovers=ray_tmp)
    at_kill = recorded_steps(run_dir)
    ckpts_at_kill = checkpoint_steps(run_dir)
    assert not (run_dir / EXPORT_DIR / EXPORT_MANIFEST).exists(), "the run finished before the kill"
    assert max(s[-1] for s in at_kill.values()) < STEPS
    assert not pids_naming(ray_tmp), "a process of the killed job survived"

    # Re-run the very same command: it resumes from a checkpoint and finishes.
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    starts = session_starts(run_dir)
    print(f"killed after steps {at_kill}, checkpoints then {ckpts_at_kill}; sessions started at {starts}")
    # every rank restarted from one and the same checkpoint written before the kill (not from
    # scratch): the second session's start, as the rank itself recorded it after restoring
    assert all(len(s) == 2 and s[0] == 0 for s in starts.values()), starts
    resumed_from = {s[1] for s in starts.values()}
    assert len(resumed_from) == 1 and resumed_from.pop() in ckpts_at_kill

    (ref_history, ref_weights), (history, weights) = outcome(storage / "reference"), outcome(run_dir)
    assert sorted(history) == sorted(ref_history) == list(range(1, STEPS + 1))  # one MLflow run, both sessions
    assert history == ref_history  # bit-identical floats of every logged value, every step
    assert weights.keys() == ref_weights.keys() and all(torch.equal(weights[k], ref_weights[k]) for k in weights)
    assert not pids_naming(ray_tmp)
