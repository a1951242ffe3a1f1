"""A job's settings and identity in any checkout layout: ``config.yaml`` records the paths as the
user gave them (made absolute, links kept), the job digest takes every local location by its real
path and the weights by their bytes, so a link and its target are the same job."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from curation.job import absolutize, job_digest, prepare
from curation.recipe import HUMANS1B
from tests.curation.test_pipeline import demo_config


def test_config_records_paths_as_given_and_the_digest_takes_real_ones(tmp_path, centernet_path, monkeypatch):
    real = tmp_path / "real"
    (real / "raw").mkdir(parents=True)
    shutil.copyfile(centernet_path, real / "detector.onnx")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    via_link = demo_config(link / "raw", tmp_path / "out", link / "detector.onnx")
    via_real = demo_config(real / "raw", tmp_path / "out", real / "detector.onnx")
    assert job_digest(via_link) == job_digest(via_real)
    job = prepare(via_link, HUMANS1B)
    written = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert (written["input"]["uri"], written["detector"]["weights"]) == (str(link / "raw"), str(link / "detector.onnx"))
    assert job.digest == job_digest(via_real)
    # relative paths: from the working directory, and nothing else changes
    monkeypatch.chdir(tmp_path)
    relative = absolutize(demo_config(Path("link/raw"), Path("out"), Path("link/detector.onnx")))
    assert (relative.input.uri, relative.output_dir) == (str(link / "raw"), str(tmp_path / "out"))
    assert relative.detector.weights == str(link / "detector.onnx")
    assert job_digest(relative) == job.digest


def test_a_calibration_record_is_no_new_job_but_its_threshold_is(tmp_path, centernet_path):
    """``calibration`` says where a threshold was measured: recording one keeps the job (and its
    output folder); the threshold itself decides outputs."""
    cfg = demo_config(tmp_path / "raw", tmp_path / "out", centernet_path)
    before = job_digest(cfg)
    cfg.detector.calibration = "measured on 40 labelled photos, weights sha256 abc"
    assert job_digest(cfg) == before
    cfg.detector.score_threshold = 0.55
    assert job_digest(cfg) != before
