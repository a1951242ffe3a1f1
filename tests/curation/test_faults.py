"""Faults: a model actor SIGKILLed with a batch in flight is restarted, the batch runs again and no
output byte changes; an input (a file, a Parquet file, a WebDataset tar) that vanishes between
planning and reading is one ``read_failed`` row and nothing else is lost."""

from __future__ import annotations

import io
import os
import shutil
import signal
import tarfile
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
from curation.partitions import plan_partitions
from curation.pipeline import run_curation
from curation.readers import read_partition
from curation.recipe import CurationConfig, weightless_content_filters
from infra.tracking import TrackingConfig
from pipelines.demo_corpus import build_demo_corpus
from tests.conftest import IMAGES
from tests.curation.counting_step import COUNTED, CountingConfig, chunks, counted_config
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


def _tars(folder: Path, per_tar: int = 2) -> list[Path]:
    """The shared photos as WebDataset tars of ``per_tar`` samples each (``<key>.<ext>`` + ``<key>.json``)."""
    folder.mkdir()
    photos, tars = sorted(IMAGES.iterdir()), []
    for t in range(0, len(photos), per_tar):
        tars.append(folder / f"{t // per_tar:05d}.tar")
        with tarfile.open(tars[-1], "w") as tar:
            for photo in photos[t : t + per_tar]:
                for name, data in ((photo.name, photo.read_bytes()), (f"{photo.stem}.json", b'{"url": null}')):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return tars


@pytest.mark.slow
def test_a_tar_removed_after_planning_is_one_read_failed_row_and_nothing_else_is_lost(tmp_path, ray_local, monkeypatch):
    tars = _tars(tmp_path / "raw")
    assert len(tars) == 3

    def config(out: str) -> CurationConfig:
        return CurationConfig(
            input=InputConfig(uri=str(tmp_path / "raw"), format="webdataset"),
            output_dir=str(tmp_path / out),
            geometry=GeometryConfig(min_short_side=256),
            detector=DetectorConfig(backend="none"),
            content=weightless_content_filters(text=False),
            tracking=TrackingConfig(enabled=False),
        )

    run_curation(config("ref"))
    vanished, planned = tars[1], curation.pipeline.plan

    def plan_then_lose_one(job):
        out = planned(job)
        assert len(out[0]) == 3  # one partition per tar, all planned
        vanished.unlink()  # after the partitions are listed, before any is read
        return out

    monkeypatch.setattr(curation.pipeline, "plan", plan_then_lose_one)
    result = run_curation(config("out"))
    ref, out = manifest(tmp_path / "ref"), manifest(tmp_path / "out")
    lost = {s for s in ref if s.startswith(f"{vanished}#")}
    assert len(lost) == 2 and len(ref) == 6
    (failed,) = [s for s in out if s.startswith(f"{vanished}#")]  # exactly one row for the whole tar
    assert failed == f"{vanished}#unreadable"
    row = out.pop(failed)
    assert (row["status"], row["reason"]) == ("error", "read_failed") and row["error_message"]
    facts = ("key", "status", "reason", "sha256", "duplicate_of", "width", "height")
    assert {s: tuple(r[f] for f in facts) for s, r in out.items()} == {
        s: tuple(r[f] for f in facts) for s, r in ref.items() if s not in lost
    }  # every input of the other tars accounted for once, as in the run without the fault
    assert result.stats["reconciled"] and result.stats["errors"] == 1 and result.stats["inputs"] == 5


def _own_process(pid: int) -> bool:
    """Whether ``pid`` is one of this test's own Ray processes (a descendant of this process)."""
    import psutil

    return any(p.pid == pid for p in psutil.Process(os.getpid()).children(recursive=True))


def _kill_a_batch_in_flight(job: threading.Thread, markers: Path, out: Path):
    """SIGKILL the counting step's actor while it holds a started, unfinished chunk; that chunk."""
    deadline = time.time() + 300
    while job.is_alive() and time.time() < deadline:
        in_flight = [c for c in chunks(markers) if not c.done and _own_process(c.pid)]
        if in_flight:
            assert (out / "_staging" / "pass2").is_dir() and not (out / "_SUCCESS").exists()
            os.kill(in_flight[0].pid, signal.SIGKILL)
            return in_flight[0]
        time.sleep(0.02)
    return None


@pytest.mark.slow
def test_a_model_actor_killed_mid_batch_is_restarted_and_changes_no_output(tmp_path, ray_local, centernet_path):
    """The counting step (a model step first in pass 2, ``tests/curation/counting_step.py``) marks
    each chunk it starts and finishes and pauses between the two, so the kill lands on a batch in
    flight: that batch must be scored again by another process (the restarted actor)."""
    raw = tmp_path / "raw"
    build_demo_corpus(raw)

    def config(name: str):
        (tmp_path / f"{name}-markers").mkdir()
        counting = CountingConfig(folder=str(tmp_path / f"{name}-markers"), batch_size=2, pause_s=1.0)
        cfg = counted_config(COUNTED, demo_config(raw, tmp_path / name, centernet_path, name="faults"), counting)
        cfg.input.images_per_partition = 2  # more blocks: pass 2 lasts longer
        return cfg

    ref = run_curation(config("ref"), recipe=COUNTED)
    out, markers, cfg = tmp_path / "out", tmp_path / "out-markers", config("out")
    job = threading.Thread(target=lambda: run_curation(cfg, recipe=COUNTED), daemon=True)
    job.start()
    killed = _kill_a_batch_in_flight(job, markers, out)
    job.join(timeout=600)
    assert killed, "no batch of the counting step was seen in flight before the job ended"
    assert not job.is_alive() and (out / "_SUCCESS").exists()
    assert not (markers / f"{killed.stem}.done").exists()  # it died mid-batch
    reruns = [c for c in chunks(markers) if c.done and c.pid != killed.pid and set(killed.keys) <= set(c.keys)]
    assert reruns, f"the batch in flight {killed.keys} was not scored again"
    print(f"\nkilled pid {killed.pid} scoring {killed.keys}; scored again by pid {reruns[0].pid}")
    started = [k for c in chunks(markers) for k in c.keys]
    assert all(started.count(k) >= 2 for k in killed.keys)  # once in the killed actor, once after
    assert {k for c in chunks(markers) if c.done for k in c.keys} == {
        k for c in chunks(tmp_path / "ref-markers") for k in c.keys
    }
    assert output_files(out) == output_files(Path(ref.output_dir)) and output_files(out)
