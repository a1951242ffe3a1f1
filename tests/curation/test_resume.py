"""A curation job killed mid-run (SIGKILL, no clean-up) resumes to byte-identical outputs, here with
mixed shards of 3 samples (``shards.samples_per_shard``; the per-partition layout's kill and resume,
in pass 1 and on S3, is ``tests/curation/test_object_store.py``'s). OCR is off: it is the slowest
step on CPU and resumes like any other pass-2 step (the demo tests run it)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.local_cluster import pids_naming
from pipelines.demo_corpus import build_demo_corpus
from tests.conftest import REPO, SHARED, in_process, kill_when

pytestmark = pytest.mark.slow


SAMPLES_PER_SHARD = 3


def curate_cmd(raw: Path, out: Path, centernet: Path, ray_tmp: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "pipelines" / "curate.py"),
        "--config",
        str(REPO / "configs" / "curate_demo.yaml"),
        f"input.uri={raw}",
        f"output_dir={out}",
        f"detector.weights={centernet}",
        "input.images_per_partition=2",
        f"shards.samples_per_shard={SAMPLES_PER_SHARD}",
        f"ray.temp_dir={ray_tmp}",
        "ray.progress_bars=off",
        f"tracking.uri=sqlite:///{out.parent / 'mlflow.db'}",
        "content.text.enabled=false",
        f"backbone_embedding.weights={SHARED / 'reference' / 'sapiens2_parity_tiny.safetensors'}",
    ]


def output_files(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.parts[len(out.parts)] in ("shards", "manifest", "shardindex.json")
    }


def _killed(cmd: list[str], ready, ray_tmp: str, log: Path) -> str:
    """Run ``cmd`` until ``ready()``, SIGKILL its process group; returns what it logged."""
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=dict(os.environ), start_new_session=True, stdout=subprocess.DEVNULL, stderr=fh)
        kill_when(proc, ready, timeout=300, leftovers=ray_tmp)
    return log.read_text()


def _done(text: str, pattern: str) -> int:
    found = re.search(pattern, text)
    assert found, f"no {pattern!r} in the log:\n{text[-3000:]}"
    return int(found[1])


def test_kill_and_resume_gives_identical_shards_and_manifest(tmp_path, centernet_path, ray_local, caplog):
    """Killed once the global dedup between the passes has decided, again in pass 2 (the models
    over the survivors), again once mixed shards are on disk; each re-run picks up where the last
    stopped. The three killed runs are job processes; the last re-run and the reference run the
    same command in this process."""
    raw = tmp_path / "raw"
    build_demo_corpus(raw)
    ray_tmp = f"/tmp/hvr-{os.getpid()}"

    # The uninterrupted reference: the same command in this process, on the session's Ray (its own
    # folder, so its own MLflow store). The kills wait on files, not on timing.
    ref = tmp_path / "reference" / "out"
    ref.parent.mkdir()
    in_process(curate_cmd(raw, ref, centernet_path, f"{ray_tmp}-ref"))
    out = tmp_path / "out"
    cmd = curate_cmd(raw, out, centernet_path, ray_tmp)
    pass2 = lambda: list((out / "_staging" / "pass2" / "_staging").glob("*/part-*.parquet"))  # noqa: E731
    decided = lambda: (out / "_dedup").is_dir() and any((out / "_dedup").rglob("*.parquet"))  # noqa: E731
    _killed(cmd, decided, ray_tmp, tmp_path / "run1.log")
    assert not (out / "_SUCCESS").exists()
    second = _killed(cmd, lambda: len(pass2()) >= 2, ray_tmp, tmp_path / "run2.log")
    assert _done(second, r"\d+ partitions: \d+ to score, (\d+) already done") >= 1  # pass 1 resumed, not redone
    assert not (out / "_SUCCESS").exists()
    # Run 3 resumes pass 2 and is killed once two mixed shards are complete (a sidecar is written
    # after its tar); one of them then loses its sidecar, the state a kill between the two leaves.
    sidecars = lambda: sorted((out / "shards").glob("*.parquet"))  # noqa: E731
    third = _killed(cmd, lambda: len(sidecars()) >= 2, ray_tmp, tmp_path / "run3.log")
    assert _done(third, r"pass 2: \d+ partitions to score, (\d+) already done") >= 1  # pass 2 resumed
    assert not (out / "_SUCCESS").exists()
    sidecars()[-1].unlink()

    # The last re-run in this process, on the session's Ray (what it resumes from is on disk): its log is caplog's.
    caplog.set_level(logging.INFO)
    caplog.clear()
    in_process(cmd)
    last = caplog.text
    assert (out / "_SUCCESS").exists()
    assert output_files(out) == output_files(ref)  # byte-identical shards, sidecars and manifest
    assert output_files(ref)  # (and there is something to compare)
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    # Parse the numbers: a substring test for "0 already done" would also reject "10 already done".
    assert _done(last, r"\d+ partitions: \d+ to score, (\d+) already done") >= 1
    todo = re.search(r"mixed shards: (\d+) of (\d+) to write", last)
    assert todo and 1 <= int(todo[1]) < int(todo[2]), last[-3000:]  # only the missing shards written
    assert not pids_naming(ray_tmp)
