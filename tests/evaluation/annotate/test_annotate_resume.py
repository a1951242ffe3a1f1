"""An annotation job killed mid-run (SIGKILL of its process group, no clean-up) after its first
shard committed resumes to outputs byte-identical to an undisturbed run's. Only the killed run is a
job process of its own: the undisturbed run and the re-run run the same command through the
script's ``main`` in the test process, on the session's Ray (what the re-run resumes from is on
disk; ``tests/conftest.py: in_process``)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.local_cluster import pids_naming
from tests.conftest import REPO, in_process, kill_when

pytestmark = pytest.mark.slow


def annotate_cmd(dataset: str, out: Path, models: dict, ray_tmp: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "pipelines" / "annotate.py"),
        "--config",
        str(REPO / "configs" / "annotate_demo.yaml"),
        f"data.dataset={dataset}",
        f"output_dir={out}",
        *(f"tasks.{t}.checkpoint={models[t]}" for t in ("pose", "seg", "normal", "pointmap")),
        "actors.num_actors=1",  # one shard at a time: the kill lands between two commits
        f"ray.temp_dir={ray_tmp}",
        "ray.progress_bars=off",
        f"tracking.uri=sqlite:///{out.parent / 'mlflow.db'}",
    ]


def annotation_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "annotations").glob("*")) if p.is_file()}


def test_kill_after_the_first_shard_and_resume_gives_identical_annotations(
    demo_curated, tiny_models, tmp_path, ray_local, caplog
):
    dataset = demo_curated[2].output_dir
    ray_tmp = f"/tmp/hva-{os.getpid()}"
    ref, out = tmp_path / "reference" / "out", tmp_path / "killed" / "out"
    ref.parent.mkdir()
    out.parent.mkdir()
    in_process(annotate_cmd(dataset, ref, tiny_models, f"{ray_tmp}-ref"))
    cmd = annotate_cmd(dataset, out, tiny_models, ray_tmp)
    committed = lambda: list((out / "annotations").glob("*.parquet"))  # noqa: E731
    with (tmp_path / "run1.log").open("w") as log:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=log)
        kill_when(proc, lambda: len(committed()) >= 1, timeout=300, leftovers=ray_tmp)
    shards = len(list(Path(dataset, "shards").glob("*.tar")))
    assert 1 <= len(committed()) < shards and not (out / "_SUCCESS").exists()
    caplog.set_level(logging.INFO)  # the re-run's log (it runs in this process, on the session's Ray)
    caplog.clear()
    in_process(cmd)
    found = re.search(r"(\d+) shards: (\d+) to annotate, (\d+) already done", caplog.text)
    assert found and int(found[1]) == shards and int(found[3]) >= 1, caplog.text[-3000:]  # resumed, not redone
    assert (out / "_SUCCESS").exists() and annotation_files(out) == annotation_files(ref)
    assert len(annotation_files(ref)) == 2 * shards  # a tar and a table per source shard
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    ids = [(d / "annotation_id").read_text() for d in (out, ref)]
    assert ids[0] == ids[1]
    assert not pids_naming(ray_tmp)
