"""One real demo run for the pipeline tests: ``pipelines/demo.py`` as the README runs it, with
short settings, into a workspace the DAG tests then reuse, re-run and resume in (each later run
plans against the stages this one finished)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CENTERNET, REPO, TINY_REFERENCE

# Every stage of the demo, each as short as it can be and still produce its figures.
DEMO_FAST = [
    "pretrain.steps=4",
    "pretrain.checkpoint.every=2",
    "pretrain.metrics.log_every=1",
    "pretrain.metrics.images_every=4",
    "probe.tasks=[pose, seg, knn]",
    "probe.pose.steps=20",
    "probe.seg.steps=10",
    "probe.synthetic.train_images=24",
    "probe.synthetic.val_images=8",
    f"curate.detector.weights={CENTERNET}",
    f"curate.backbone_embedding.weights={TINY_REFERENCE}",
    "curate.ray.num_cpus=null",
    "curate.ray.progress_bars=off",
    "probe.ray.num_cpus=null",
    "finetune.tasks=[seg]",
    "finetune.steps=4",
    "finetune.checkpoint.every=2",
    "finetune.synthetic.train_images=24",
    "finetune.synthetic.val_images=8",
    "finetune.ray.num_cpus=null",
]


@dataclasses.dataclass(frozen=True)
class DemoRun:
    raw: Path  # the demo corpus
    workspace: Path
    stdout: str
    stderr: str
    returncode: int

    def overrides(self, *more: str) -> list[str]:
        """The demo's settings (``configs/dag_demo.yaml`` plus these), then ``more``."""
        return [f"workspace={self.workspace}", *DEMO_FAST, *more]

    def config(self, *more: str):
        """The demo's DAG configuration, as ``pipelines/demo.py`` builds it, with ``more``."""
        from pipelines.demo import demo_config

        return demo_config(self.raw, self.overrides(*more))

    def dag_command(self, *more: str) -> list[str]:
        """``pipelines/dag.py`` with the demo's configuration and ``more``."""
        from pipelines.demo_corpus import NO_PERSON_DIR

        return [
            sys.executable,
            str(REPO / "pipelines" / "dag.py"),
            "--config",
            str(REPO / "configs" / "dag_demo.yaml"),
            f"curate.input.uri={self.raw}",
            f"finetune.augment.backgrounds={self.raw / NO_PERSON_DIR}",
            *self.overrides(*more),
        ]


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    """``pipelines/demo.py`` in its own process (its own local Ray), as a user runs it."""
    root = tmp_path_factory.mktemp("demo")
    raw, ws = root / "raw", root / "ws"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run(
        [sys.executable, "pipelines/demo.py", "--corpus", str(raw), f"workspace={ws}", *DEMO_FAST],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    return DemoRun(raw, ws, done.stdout, done.stderr, done.returncode)


@pytest.fixture(scope="session")
def demo_done(demo_run) -> DemoRun:
    """The demo run, which must have succeeded."""
    assert demo_run.returncode == 0, demo_run.stdout[-3000:] + demo_run.stderr[-3000:]
    return demo_run
