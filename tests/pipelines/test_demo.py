"""`make demo`'s terminal: one line per stage and a closing table; everything Ray, MLflow and
the stages print goes to the log file (checked on a real, shortened demo run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from pipelines.chain import StageOutcome
from pipelines.demo import loss_line, probe_rows
from training.stage import PretrainResult


def test_console_sends_every_writer_to_the_log_and_keeps_the_terminal_for_the_demo(tmp_path):
    """Python prints, raw fd 2 writes (what Ray's C++ core and child processes do) and logging all
    land in the log file; only ``console.print`` reaches the terminal."""
    log = tmp_path / "demo.log"
    code = textwrap.dedent(f"""
        import logging, os, subprocess, sys
        from pipelines.demo import Console
        with Console(__import__("pathlib").Path({str(log)!r})) as console:
            logging.basicConfig(stream=sys.stderr, force=True)
            print("python print")
            os.write(2, b"raw stderr from C++\\n")
            logging.getLogger("ray").warning("a ray warning")
            subprocess.run(["echo", "a child process"])
            console.print("curate    ran  12s")
        print("after the demo")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "curate    ran  12s\nafter the demo\n" and done.stderr == ""
    text = log.read_text()
    for line in ("python print", "raw stderr from C++", "a ray warning", "a child process"):
        assert line in text


def test_probe_table_puts_the_random_init_baseline_beside_each_metric():
    rows = probe_rows(
        {"pose": {"AP": 0.12, "AR": 0.2}, "normal": {"mean_angle": 31.5}},
        {"pose": {"AP": 0.01}, "normal": {"mean_angle": 44.0}},
        {"normal": {"mean_angle": 20.25}},
    )
    assert re.search(r"pose\s+AP\s+0\.1200\s+0\.0100\s+-\s+\(higher is better\)", rows[1])
    assert re.search(r"normal\s+mean_angle\s+31\.5000\s+44\.0000\s+20\.2500\s+\(lower is better\)", rows[2])
    assert "fine-tuned" in rows[0]


def test_loss_line_reads_the_pretraining_window_means():
    result = PretrainResult(
        run_id="run",
        student_weights="/f/student.safetensors",
        teacher_weights=None,
        checkpoint_digest="c",
        dataset_id="d",
        final_step=40,
        loss_trend="4.3904 (mean of the first 10 steps) -> 4.2963 (last 10)",
    )
    o = StageOutcome("pretrain", "id", "/f", False, result)
    assert "4.3904 -> 4.2963" in loss_line(o) and "40 steps" in loss_line(o)


@pytest.mark.slow
def test_a_demo_run_prints_stages_and_the_closing_table_only(demo_run):
    out = demo_run.stdout
    assert demo_run.returncode == 0, out[-3000:] + demo_run.stderr[-3000:]
    assert demo_run.stderr == ""
    for stage in ("curate", "pretrain", "finetune", "probe", "baseline"):  # a new workspace: every stage runs
        assert re.search(rf"^{stage}\s+ran\b", out, re.M), (stage, out)
    assert re.search(r"^audit\s+wrote\b", out, re.M), out
    for noise in (
        "TrainingReport",
        "Checkpoint successfully created",
        "PreemptionWatcher",
        "core_worker",
        "INFO",
        "WARNING",
    ):
        assert noise not in out, (noise, out)
    assert "curation funnel" in out and re.search(r"kept \(in shards\)\s+\d+", out)
    assert re.search(r"total loss [\d.]+ -> [\d.]+", out)
    assert re.search(r"seg\s+mIoU\s+[\d.]+\s+[\d.]+\s+[\d.]+", out)  # pretrained, random init, fine-tuned
    assert re.search(r"pose\s+AP\s+[\d.]+\s+[\d.]+", out) and re.search(r"knn\s+top1_k20\s+[\d.]+\s+[\d.]+", out)
    assert re.search(r"mlflow ui --backend-store-uri sqlite:///\S+mlflow\.db", out)
    assert re.search(r"^explore:\s+\.venv/bin/python pipelines/explore\.py \S+", out, re.M)
    assert "workflowType=machine_learning" in out
    audit = re.search(r"^audit page:\s+(\S+)", out, re.M)
    assert audit and os.path.isfile(audit.group(1))
    log = re.search(r"^logs:\s+(\S+)", out, re.M)
    assert log and "TrainingReport" in open(log.group(1)).read()  # Ray Train's chatter: in the file
