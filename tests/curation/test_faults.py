"""Faults: a Ray worker SIGKILLed mid-run changes no output byte; an input that vanishes between
planning and reading is one ``read_failed`` row and nothing else is lost."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import curation.pipeline
from curation.config import InputConfig
from curation.filters.geometry import GeometryConfig
from curation.filters.person import DetectorConfig
from curation.pipeline import run_curation
from curation.readers import plan_partitions, read_partition
from curation.recipe import CurationConfig, weightless_content_filters
from infra.tracking import TrackingConfig
from pipelines.demo_corpus import build_demo_corpus
from tests.conftest import IMAGES
from tests.curation.test_pipeline import demo_config
from tests.curation.test_resume import output_files


def manifest(out: Path) -> dict[str, dict]:
    rows = pads.dataset(sorted(str(p) for p in (out / "manifest").glob("*.parquet"))).to_table().to_pylist()
    return {r["source"]: r for r in rows}


def test_a_parquet_input_removed_after_planning_is_one_read_failed_row(tmp_path):
    path = tmp_path / "in" / "images.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"image": [(IMAGES / "obama.jpg").read_bytes()] * 3}), path)
    cfg = InputConfig(uri=str(path.parent))
    (partition,) = plan_partitions(cfg)
    path.unlink()  # gone before the read task runs
    rows = pa.concat_tables(list(read_partition(partition, cfg, 2**26))).to_pylist()
    assert [(r["reason"], r["source"].endswith("#unreadable")) for r in rows] == [("read_failed", True)]
    assert "FileNotFoundError" in rows[0]["error_message"] or "No such file" in rows[0]["error_message"]


@pytest.mark.slow
def test_an_input_removed_after_planning_is_read_failed_and_nothing_else_is_lost(tmp_path, ray_local, monkeypatch):
    raw = tmp_path / "raw"
    raw.mkdir()
    for src in sorted(IMAGES.iterdir()):
        shutil.copyfile(src, raw / src.name)

    def config(out: str) -> CurationConfig:
        return CurationConfig(
            input=InputConfig(uri=str(raw), images_per_partition=2),
            output_dir=str(tmp_path / out),
            geometry=GeometryConfig(min_short_side=256),
            detector=DetectorConfig(backend="none"),
            content=weightless_content_filters(text=False),
            tracking=TrackingConfig(enabled=False),
        )

    run_curation(config("ref"))
    vanished = raw / "obama2.jpg"
    planned = curation.pipeline.plan

    def plan_then_lose_one(job):
        out = planned(job)
        vanished.unlink()  # after the partitions are listed, before any is read
        return out

    monkeypatch.setattr(curation.pipeline, "plan", plan_then_lose_one)
    result = run_curation(config("out"))
    ref, out = manifest(tmp_path / "ref"), manifest(tmp_path / "out")
    assert set(out) == set(ref)  # every planned input is accounted for once
    lost = out.pop(str(vanished))
    assert (lost["status"], lost["reason"]) == ("error", "read_failed") and lost["error_message"]
    ref.pop(str(vanished))
    facts = ("key", "status", "reason", "sha256", "duplicate_of", "width", "height")
    assert {s: tuple(r[f] for f in facts) for s, r in out.items()} == {
        s: tuple(r[f] for f in facts) for s, r in ref.items()
    }
    assert result.stats["reconciled"] and result.stats["errors"] == 1


def _actor_processes(marker: str) -> list:
    """Ray worker processes of this test's own cluster (descendants of this process) running ``marker``."""
    import psutil

    found = []
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if marker in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_a_worker_killed_mid_run_changes_no_output(tmp_path, ray_local, centernet_path):
    raw = tmp_path / "raw"
    build_demo_corpus(raw)
    out = tmp_path / "out"
    cfg, ref_cfg = (demo_config(raw, folder, centernet_path, name="faults") for folder in (out, tmp_path / "ref"))
    cfg.input.images_per_partition = ref_cfg.input.images_per_partition = 2  # more blocks: pass 2 lasts longer
    ref = run_curation(ref_cfg)
    job = threading.Thread(target=lambda: run_curation(cfg), daemon=True)
    job.start()
    killed = []
    deadline = time.time() + 300
    while not killed and job.is_alive() and time.time() < deadline:
        workers = _actor_processes("MapWorker(MapBatches(_StageWorker))")
        if workers and (out / "_staging" / "pass2").is_dir():  # a model actor is scoring pass 2
            os.kill(workers[0].pid, signal.SIGKILL)
            killed.append(workers[0].pid)
            assert not (out / "_SUCCESS").exists()
        time.sleep(0.05)
    job.join(timeout=600)
    assert killed, "no model actor was seen working before the job ended"
    assert not job.is_alive() and (out / "_SUCCESS").exists()
    assert output_files(out) == output_files(Path(ref.output_dir)) and output_files(out)
