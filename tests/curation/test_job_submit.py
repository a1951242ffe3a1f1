"""`ray job submit --working-dir . -- python pipelines/curate.py ...` against a head on 127.0.0.1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.local_cluster import LocalRayHead
from pipelines.demo_corpus import build_demo_corpus
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_curate_runs_as_a_ray_job(tmp_path, centernet_path):
    raw, out = tmp_path / "raw", tmp_path / "curated"
    expected = build_demo_corpus(raw)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `python` in the entrypoint is this venv's
    with LocalRayHead(num_cpus=2, env=env) as head:
        cmd = [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", head.dashboard_url,
               "--working-dir", ".", "--", "python", "pipelines/curate.py", "--config", "configs/curate_demo.yaml",
               f"input.uri={raw}", f"output_dir={out}", f"detector.weights={centernet_path}",
               f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
        done = subprocess.run(cmd, cwd=REPO, env=head.client_env(env), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "succeeded" in done.stdout and "reconciled=True" in done.stdout
        pids_while_up = head.pids()
    assert pids_while_up and not head.pids()  # the head we started is gone, by PID
    stats = json.loads((out / "stats.json").read_text())
    assert stats["inputs"] == len(expected) and stats["reconciled"]
    assert stats["kept"] == sum(1 for s, _ in expected.values() if s == "kept")
