"""A distillation job SIGKILLed between two checkpoints resumes to the uninterrupted weights.

The whole process group of a running ``pipelines/distill.py`` (driver, local Ray, Ray Train
workers) is SIGKILLed once every rank has recorded a step past a checkpoint; re-running the same
command resumes from that checkpoint (the frozen teacher, which checkpoints leave out, is
reloaded from its file) and must give exactly the uninterrupted run's per-step values and
exported student. The uninterrupted run is the session's reference (``distill_reference``: the
same settings through the DAG's distill stage, in the test process). One Ray Train start per
session: the killed one and its resumption.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infra.local_cluster import pids_naming
from infra.tracking import metric_history
from models.io import load_state_dict_file
from tests.conftest import REPO, kill_when
from tests.training.conftest import DISTILL_STEPS, DISTILL_TINY
from tests.training.test_pretrain_crash_resume import (
    checkpoint_steps,
    past_a_checkpoint,
    recorded_steps,
    session_starts,
)
from training.distill_config import DistillConfig
from training.loop import EXPORT_DIR, EXPORT_MANIFEST
from training.run import RUN_RECORD, history_keys

pytestmark = pytest.mark.slow


def outcome(run_dir: Path) -> tuple[dict[int, dict[str, float]], dict[str, torch.Tensor]]:
    """Per-step logged values (from MLflow) and the exported student weights."""
    record = json.loads((run_dir / RUN_RECORD).read_text())
    history = metric_history(record["tracking_uri"], record["mlflow_run_id"], history_keys(DistillConfig))
    manifest = json.loads((run_dir / EXPORT_DIR / EXPORT_MANIFEST).read_text())
    assert manifest["step"] == DISTILL_STEPS
    return history, load_state_dict_file(manifest["export_student"])


def test_sigkilled_distillation_resumes_to_the_uninterrupted_weights(distill_reference):
    ray_tmp = f"/tmp/hvd-{os.getpid()}"  # short: Ray's socket paths
    run_dir = distill_reference["folder"] / "runs" / "crashed"
    cmd = [
        sys.executable,
        str(REPO / "pipelines" / "distill.py"),
        "--config",
        str(DISTILL_TINY),
        *distill_reference["common"],
        "run_name=crashed",
        f"ray.temp_dir={ray_tmp}",
        "ray.progress_bars=off",
    ]
    env = dict(os.environ)
    log = distill_reference["folder"] / "crashed.log"  # a pipe could fill and stall the job
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
    try:
        kill_when(proc, lambda: past_a_checkpoint(run_dir), timeout=1200, leftovers=ray_tmp)
    except AssertionError as failed:
        raise AssertionError(f"{failed}\n{log.read_text()[-3000:]}") from None
    at_kill, ckpts_at_kill = recorded_steps(run_dir), checkpoint_steps(run_dir)
    assert not (run_dir / EXPORT_DIR / EXPORT_MANIFEST).exists(), "the run finished before the kill"
    assert not pids_naming(ray_tmp), "a process of the killed job survived"

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    starts = session_starts(run_dir)
    print(f"killed after steps {at_kill}, checkpoints then {ckpts_at_kill}; sessions started at {starts}")
    assert all(len(s) == 2 and s[0] == 0 for s in starts.values()), starts
    resumed_from = {s[1] for s in starts.values()}
    assert len(resumed_from) == 1 and resumed_from.pop() in ckpts_at_kill

    reference = Path(distill_reference["outcome"].folder)
    (ref_history, ref_weights), (history, weights) = outcome(reference), outcome(run_dir)
    assert sorted(history) == sorted(ref_history) == list(range(1, DISTILL_STEPS + 1))
    assert history == ref_history  # bit-identical floats of every logged value, every step
    assert weights.keys() == ref_weights.keys() and all(torch.equal(weights[k], ref_weights[k]) for k in weights)
    # the same run by identity: the DAG placed it elsewhere, the teacher is the same content
    ours, theirs = (json.loads((d / RUN_RECORD).read_text()) for d in (run_dir, reference))
    assert (ours["identity_digest"], ours["weights"]) == (theirs["identity_digest"], theirs["weights"])
    assert not pids_naming(ray_tmp)
