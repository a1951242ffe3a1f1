"""A curation job killed mid-run (SIGKILL, no clean-up) resumes to byte-identical outputs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.local_cluster import pids_naming
from pipelines.demo_corpus import build_demo_corpus
from tests.conftest import REPO, kill_when

pytestmark = pytest.mark.slow


def curate_cmd(raw: Path, out: Path, centernet: Path, ray_tmp: str) -> list[str]:
    return [sys.executable, str(REPO / "pipelines" / "curate.py"), "--config", str(REPO / "configs" / "curate_demo.yaml"),
            f"input.uri={raw}", f"output_dir={out}", f"detector.weights={centernet}", "input.images_per_partition=2",
            f"ray.temp_dir={ray_tmp}", "ray.progress_bars=off", f"tracking.uri=sqlite:///{out.parent / 'mlflow.db'}"]


def output_files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes()
            for p in sorted(out.rglob("*")) if p.is_file() and p.parts[len(out.parts)] in ("shards", "manifest")}


def test_kill_and_resume_gives_identical_shards_and_manifest(tmp_path, centernet_path):
    raw = tmp_path / "raw"
    build_demo_corpus(raw)
    env = dict(os.environ)
    ray_a, ray_b = f"/tmp/hvr-{os.getpid()}-a", f"/tmp/hvr-{os.getpid()}-b"

    # Uninterrupted reference run.
    ref = tmp_path / "ref"
    subprocess.run(curate_cmd(raw, ref, centernet_path, ray_a), check=True, env=env, capture_output=True, timeout=600)

    # Interrupted run: killed (whole process group, SIGKILL) once some partitions are staged.
    out = tmp_path / "out"
    proc = subprocess.Popen(curate_cmd(raw, out, centernet_path, ray_b), env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(proc, lambda: len(list((out / "_staging").glob("*/part-*.parquet"))) >= 3, timeout=300,
              leftovers=ray_b)
    assert not (out / "_SUCCESS").exists()
    staged_before = {p.parent.name for p in (out / "_staging").glob("*/part-*.parquet")}
    assert staged_before, "nothing was staged before the kill"

    done = subprocess.run(curate_cmd(raw, out, centernet_path, ray_b), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "_SUCCESS").exists()
    assert output_files(out) == output_files(ref)          # byte-identical shards, sidecars and manifest
    assert output_files(ref)                                # (and there is something to compare)
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    # The resumed run must skip partitions the killed one finished. Parse the number: a substring
    # test for "0 already done" would also reject "10 already done".
    plan = re.search(r"(\d+) partitions: (\d+) to score, (\d+) already done", done.stderr)
    assert plan, f"the resumed run logged no partition plan:\n{done.stderr[-3000:]}"
    assert int(plan[3]) >= 1, f"the resumed run redid every partition: {plan[0]!r}"
    assert not pids_naming(ray_a) and not pids_naming(ray_b)
