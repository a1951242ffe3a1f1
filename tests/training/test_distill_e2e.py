"""Distillation on Ray Train (2 workers, FSDP2 over gloo, bf16) from the curated demo shards, as the
DAG's ``distill`` stage: the session's reference run (``distill_reference``,
tests/training/conftest.py; its crash-and-resume twin is ``test_distill_crash_resume``). The
teacher is the official module's ``sapiens2_tiny`` in the released layout, the student
``sapiens2_nano``. What a user does next with the student is checked here too: the chain's
lineage, an ONNX export and an annotation job over the curated version, each taking the student
in a task checkpoint (the platform's fine-tune export layout), and the benchmark's table."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.io import load_state_dict_file
from models.registry import build_backbone, check_weights_file, count_params
from tests.training.conftest import DISTILL_EVERY, DISTILL_STEPS, REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(distill_reference):
    from training.run import RUN_RECORD

    outcome = distill_reference["outcome"]
    run_dir = Path(outcome.folder)
    return {**distill_reference, "run_dir": run_dir, "record": json.loads((run_dir / RUN_RECORD).read_text())}


def test_the_dag_stage_distils_into_a_smaller_student_in_the_official_layout(run):
    outcome = run["outcome"]
    result = outcome.result
    assert outcome.stage == "distill" and not outcome.reused and result.final_step == DISTILL_STEPS
    assert result.student_model == "sapiens2_nano" and Path(result.student_weights).parent.name == "export"
    assert Path(result.student_weights).name == "student_backbone.safetensors"
    assert hashlib.sha256(Path(result.student_weights).read_bytes()).hexdigest() == result.checkpoint_digest
    check_weights_file("sapiens2_nano", result.student_weights)  # every official key at its shape, nothing else
    student = load_state_dict_file(result.student_weights)
    assert student.keys() == build_backbone("sapiens2_nano", device="meta").state_dict().keys()
    assert count_params("sapiens2_nano") * 5 < count_params("sapiens2_tiny")
    print("loss trend:", result.loss_trend)
    first, last = (float(x) for x in re.findall(r"(\d+\.\d+) \(", result.loss_trend))
    assert last < first  # the mean loss of the last steps is below the first ones'


def test_the_teacher_is_recorded_by_content_and_left_out_of_checkpoints(run):
    from mlflow import MlflowClient
    from torch.distributed.checkpoint import FileSystemReader

    sha = hashlib.sha256(run["teacher"].read_bytes()).hexdigest()
    assert run["record"]["weights"] == {"teacher.checkpoint": sha}
    dag = run["dag"]
    client = MlflowClient(dag.tracking_uri)
    stage_run = client.get_run(run["outcome"].run_id).data
    assert stage_run.params["teacher.checkpoint_sha256"] == sha and stage_run.params["teacher.model"] == "sapiens2_tiny"
    assert (
        stage_run.tags["humanvision.stage"] == "distill" and stage_run.tags["mlflow.parentRunId"] == dag.parent_run_id
    )
    parent = client.get_run(dag.parent_run_id).data.tags
    assert parent["lineage.distill_teacher_checkpoint_sha256"] == sha
    assert parent["lineage.checkpoint_digest"] == run["outcome"].result.checkpoint_digest
    kept = sorted(p.name for p in run["run_dir"].glob("checkpoint_0*"))
    assert kept == [f"checkpoint_{s:08d}" for s in (DISTILL_STEPS - DISTILL_EVERY, DISTILL_STEPS)]
    saved = FileSystemReader(str(run["run_dir"] / kept[-1])).read_metadata().state_dict_metadata
    assert any(k.startswith("model.student.cls_proj.") for k in saved)
    assert not any(k.startswith("model.teacher.") for k in saved)


@pytest.fixture(scope="module")
def student_task_checkpoint(run, tmp_path_factory):
    """The student with a seg head, written as the platform's fine-tune export is
    (``evaluation.finetune``): ``backbone.`` + ``decode_head.`` keys, task and backbone in its metadata."""
    from evaluation.finetune.tasks import FinetuneModel
    from models import build_task_head
    from training.checkpoint import export_backbone

    torch.manual_seed(0)
    backbone = build_backbone("sapiens2_nano", weights=run["outcome"].result.student_weights)
    head = build_task_head("seg", backbone.embed_dim, hidden_dim=16, upsample=backbone.feature_stride)
    path = tmp_path_factory.mktemp("student-task") / "export" / "model.safetensors"
    path.parent.mkdir()
    meta = {"task": "seg", "backbone": "sapiens2_nano", "format": "released-task-layout"}
    export_backbone(FinetuneModel(backbone, head).eval(), path, rank=0, metadata=meta)
    return path


def test_export_and_annotate_take_the_student(run, student_task_checkpoint, tmp_path, capsys):
    import pyarrow.parquet as pq

    from pipelines.annotate import main as annotate_main
    from pipelines.export import main as export_main

    onnx = tmp_path / "student_seg.onnx"
    assert (
        export_main(["--checkpoint", str(student_task_checkpoint), "--output", str(onnx), "--image-size", "64", "48"])
        == 0
    )
    info = json.loads(capsys.readouterr().out)
    print("student seg ONNX max abs error per batch size:", info["max_abs_error"])
    assert info["layout"] == "platform" and max(info["max_abs_error"].values()) <= 1e-4 and onnx.is_file()
    out = tmp_path / "annotations"
    args = [
        "--config",
        str(REPO / "configs" / "annotate_demo.yaml"),
        f"data.dataset={run['curated'].output_dir}",
        f"output_dir={out}",
        "tasks.pose.checkpoint=",
        "tasks.normal.checkpoint=",
        "tasks.pointmap.checkpoint=",
        f"tasks.seg.checkpoint={student_task_checkpoint}",
        "tasks.seg.input_hw=[64,48]",
        "actors.num_actors=1",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
    ]
    assert annotate_main(args) == 0
    rows = pq.read_table(sorted((out / "annotations").glob("*.parquet"))).to_pylist()
    assert len(rows) == run["curated"].stats["kept"] > 0 and all(r["status"] == "ok" for r in rows)


def test_the_benchmark_prints_cost_and_cosine_for_teacher_and_student(run, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "distill_student.py"), "--run", str(run["run_dir"])]
    done = subprocess.run(
        [*cmd, "--images", "8", "--repeats", "2", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    assert "| forward FLOPs per image |" in done.stdout and "| CPU ms per image |" in done.stdout
    report = json.loads(out.read_text())
    assert report["models"] == {"teacher": "sapiens2_tiny", "student": "sapiens2_nano"} and report["images"] == 8
    assert report["flops_per_image"]["student"] < report["flops_per_image"]["teacher"]
    cos = report["cosine"]
    assert all(-1 <= v <= 1 for part in cos.values() for v in part.values())
    assert cos["after"]["patch"] > cos["before"]["patch"]  # what the run's own loss optimised


def test_the_probe_suite_takes_the_student_and_finds_the_distillation_run(run, tmp_path):
    from mlflow import MlflowClient

    from evaluation import ProbeConfig, run_probes
    from infra.config import load_config

    result = run["outcome"].result
    cfg = load_config(
        ProbeConfig,
        REPO / "configs" / "probe_tiny.yaml",
        [
            f"output_dir={tmp_path / 'probe'}",
            "backbone.name=sapiens2_nano",
            f"backbone.checkpoint={result.student_weights}",
            f"tracking.uri={run['dag'].tracking_uri}",
            "tasks=[knn]",
            "synthetic.train_images=8",
            "synthetic.val_images=4",
            "synthetic.height=64",
            "synthetic.width=48",
            "knn.k=[3]",
            "knn.image_size=[64,48]",
        ],
    )
    probed = run_probes(cfg)
    assert set(probed.metrics) == {"knn"}
    # found by the student's digest: the run that produced the checkpoint is the distillation's
    assert probed.lineage.pretrain_run_id == result.run_id and probed.lineage.source == "digest"
    tags = MlflowClient(run["dag"].tracking_uri).get_run(probed.parent_run_id).data.tags
    assert tags["lineage.checkpoint_digest"] == result.checkpoint_digest
