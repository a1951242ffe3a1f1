"""Stage identities (what decides reuse) through the stage facades (``infra.stage.Stage``), the
digest they are made with, the results' round trip through DONE.json, the DAG's config checks and
its choice of MLflow store: fast, no Ray."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from infra.config import load_config
from infra.stage import stage_digest
from pipelines.chain import DagConfig
from pipelines.chain.run import tracking_uri
from tests.conftest import REPO


@pytest.fixture(scope="module")
def demo() -> DagConfig:
    return load_config(DagConfig, REPO / "configs" / "dag_demo.yaml")


def test_pretraining_identity_is_its_trajectory_and_dataset_not_where_it_runs(demo):
    from training.stage import PretrainStage

    stage = PretrainStage()
    cfg = demo.pretrain
    base = stage.identity(cfg, "dataset-a")
    elsewhere = stage.place(stage.with_dataset(cfg, "/some/curated/output", "sqlite:///x.db"), Path("/tmp/ws/p/x"))
    elsewhere = dataclasses.replace(elsewhere, tracking=dataclasses.replace(cfg.tracking, experiment="other"))
    assert stage.identity(elsewhere, "dataset-a") == base
    assert (elsewhere.storage_path, elsewhere.run_name) == ("/tmp/ws/p", "x")
    assert stage.identity(cfg, "dataset-b") != base
    assert stage.identity(dataclasses.replace(cfg, steps=cfg.steps + 1), "dataset-a") != base


def test_probing_identity_is_its_settings_and_the_checkpoint_digest_not_the_file(demo):
    from evaluation.stage import ProbeStage

    stage = ProbeStage()
    cfg = demo.probe
    base = stage.identity(cfg, "digest-1")
    moved = stage.place(stage.with_backbone(cfg, "/elsewhere/student.safetensors", "run-9"), Path("/tmp/ws/probe/y"))
    assert stage.identity(moved, "digest-1") == base and moved.output_dir == "/tmp/ws/probe/y"
    assert stage.identity(cfg, "digest-2") != base
    assert stage.identity(dataclasses.replace(cfg, seg=dataclasses.replace(cfg.seg, steps=1)), "digest-1") != base
    random_init = stage.identity(cfg, "")
    assert random_init != base
    assert stage.identity(dataclasses.replace(cfg, seed=cfg.seed + 1), "") != random_init


def test_curation_identity_follows_the_input_listing_not_the_output_folder(demo, tmp_path):
    from curation.stage import CurateStage

    stage = CurateStage()
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jpg").write_bytes(b"x" * 10)
    cfg = dataclasses.replace(demo.curate, input=dataclasses.replace(demo.curate.input, uri=str(raw)))
    base = stage.identity(cfg, "")
    placed = stage.place(cfg, tmp_path / "ws" / "curate" / base)
    assert stage.identity(placed, "") == base and placed.output_dir == str(tmp_path / "ws" / "curate" / base)
    (raw / "b.jpg").write_bytes(b"y" * 10)
    assert stage.identity(cfg, "") != base


def test_the_identity_digest_is_the_one_existing_workspaces_were_named_with():
    """sha256 of the parts as sorted-key JSON (``default=str``), its first 16 hex digits: a
    workspace folder made before is found again only while this recipe holds."""
    parts = ("probe", {"b": 1, "a": [1.5, "x"]}, Path("/p"))
    expected = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert stage_digest(*parts) == expected
    assert stage_digest("pretrain", "abc", "dataset-a") == "57981e2e4858a389"


def test_results_round_trip_through_done_json(tmp_path):
    from curation.stage import CurateResult
    from training.stage import PretrainResult, PretrainStage

    curated = CurateResult(run_id="r1", dataset_id="d", dataset_uri="/o", shards=["/o/a.tar"], kept=3, inputs=5)
    assert CurateResult.from_json(json.loads(json.dumps(curated.to_json()))) == curated
    done = {  # a pretraining DONE.json as a Ray job's run wrote it: no loss trend
        "student_weights": "/w/s.safetensors",
        "teacher_weights": None,
        "checkpoint_digest": "c",
        "run_id": "r2",
        "dataset_id": "d",
        "final_step": 40,
    }
    assert PretrainStage().recorded(done) == PretrainResult(**done, loss_trend="")


def test_a_dag_without_tracking_is_refused():
    with pytest.raises(ValueError, match="tracking.enabled"):
        load_config(DagConfig, None, ["tracking.enabled=false"]).validate()


def test_the_store_is_the_configured_one_else_a_server_from_the_environment_else_the_workspace(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    named = load_config(DagConfig, None, ["tracking.uri=http://mlflow:5000"])
    assert tracking_uri(named, ws) == "http://mlflow:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env-server:5000")
    assert tracking_uri(DagConfig(), ws) == "http://env-server:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    assert tracking_uri(DagConfig(), ws) == f"sqlite:///{ws / 'mlflow.db'}"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri(DagConfig(), ws) == f"sqlite:///{ws / 'mlflow.db'}"


def test_finetuning_identity_is_its_settings_the_checkpoint_digest_and_the_data(demo, tmp_path):
    from evaluation.config import SplitPaths
    from evaluation.finetune.stage import FinetuneStage

    stage = FinetuneStage()
    cfg = demo.finetune
    base = stage.identity(cfg, "digest-1")
    moved = stage.place(stage.with_backbone(cfg, "/elsewhere/student.safetensors", "run-9"), tmp_path / "ft" / "y")
    assert stage.identity(moved, "digest-1") == base and moved.output_dir == str(tmp_path / "ft" / "y")
    assert stage.identity(cfg, "digest-2") != base
    assert stage.identity(dataclasses.replace(cfg, steps=cfg.steps + 1), "digest-1") != base
    assert stage.identity(cfg, "") != base
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(b"x" * 10)
    labels = tmp_path / "seg"
    labels.mkdir()
    real = dataclasses.replace(
        cfg,
        tasks=["seg"],
        seg=dataclasses.replace(
            cfg.seg,
            train=SplitPaths(images=str(images), labels=str(labels)),
            val=SplitPaths(images=str(images), labels=str(labels)),
        ),
    )
    before = stage.identity(real, "digest-1")
    (images / "b.png").write_bytes(b"y" * 10)  # the data changed: a new identity
    assert stage.identity(real, "digest-1") != before


@pytest.mark.parametrize(
    "stages, ok",
    [
        (["curate", "pretrain", "probe"], True),
        (["curate", "pretrain", "finetune", "probe"], True),
        (["pretrain", "finetune"], True),
        (["finetune", "probe"], True),
        (["finetune"], True),
        (["curate", "finetune"], False),
        (["probe", "finetune"], False),
        (["curate", "probe"], False),
    ],
)
def test_the_finetune_stage_sits_between_pretraining_and_probing_and_may_be_left_out(stages, ok):
    cfg = load_config(DagConfig, None, [f"stages=[{', '.join(stages)}]", "inputs.dataset=x"])
    if ok:
        cfg.validate()
    else:
        with pytest.raises(ValueError, match="stages must be a contiguous run"):
            cfg.validate()


def test_distillation_identity_is_its_settings_the_dataset_and_the_teachers_content(demo, tmp_path):
    import shutil

    from tests.training.conftest import released_tiny_backbone
    from training.stage import DistillStage

    stage = DistillStage()
    teacher = released_tiny_backbone(tmp_path / "a" / "teacher.safetensors")
    moved = shutil.copy(teacher, tmp_path / "moved.safetensors")
    other = released_tiny_backbone(tmp_path / "b" / "teacher.safetensors", prefix="backbone.")  # other bytes
    cfg = stage.with_teacher(demo.distill, str(teacher))
    base = stage.identity(cfg, "dataset-a")
    placed = stage.place(stage.with_teacher(demo.distill, str(moved)), tmp_path / "ws" / "distill" / "z")
    assert stage.identity(placed, "dataset-a") == base and placed.teacher.checkpoint == str(Path(moved).resolve())
    assert stage.identity(stage.with_teacher(demo.distill, str(other)), "dataset-a") != base
    assert stage.identity(cfg, "dataset-b") != base
    assert stage.identity(dataclasses.replace(cfg, steps=cfg.steps + 1), "dataset-a") != base
    # the teacher the chain hands on is taken only when the config names none
    assert stage.with_teacher(cfg, "/the/pretrained.safetensors").teacher.checkpoint == str(teacher)


def test_the_dag_takes_distill_after_pretrain_and_checks_what_follows_it(demo):
    with_distill = ["stages=[curate,pretrain,distill,finetune,probe]"]
    students = ["finetune.backbone.name=sapiens2_nano", "probe.backbone.name=sapiens2_nano"]
    load_config(DagConfig, REPO / "configs" / "dag_demo.yaml", [*with_distill, *students]).validate()
    with pytest.raises(ValueError, match=r"^probe.backbone.name=sapiens2_tiny: after distill .* sapiens2_nano"):
        load_config(DagConfig, REPO / "configs" / "dag_demo.yaml", [*with_distill, students[0]]).validate()
    with pytest.raises(ValueError, match="stages must be a contiguous run"):
        load_config(DagConfig, None, ["stages=[curate,distill,pretrain]"]).validate()
    with pytest.raises(ValueError, match="distill needs its teacher: inputs.checkpoint or distill.teacher.checkpoint"):
        load_config(DagConfig, None, ["stages=[distill]", "inputs.dataset=v1"]).validate()
    load_config(
        DagConfig, None, ["stages=[distill]", "inputs.dataset=v1", "inputs.checkpoint=t.safetensors"]
    ).validate()


def test_weight_files_and_the_distilled_student_reach_the_lineage():
    from pipelines.chain.stages import Handoff, hand_on
    from training.stage import DistillResult, DistillStage, PretrainResult, PretrainStage

    pretrained = PretrainResult(
        run_id="p",
        student_weights="/p/student.safetensors",
        teacher_weights="/p/teacher.safetensors",
        checkpoint_digest="s1",
        dataset_id="d",
        final_step=4,
        weights={"init.backbone": "f" * 64},
    )
    distilled = DistillResult(
        run_id="q",
        student_weights="/q/student.safetensors",
        student_model="sapiens2_nano",
        checkpoint_digest="s2",
        dataset_id="d",
        final_step=6,
        weights={"teacher.checkpoint": "s1full"},
    )
    for facade, result in ((PretrainStage(), pretrained), (DistillStage(), distilled)):
        assert facade.recorded(json.loads(json.dumps(result.to_json()))) == result
    handoff = Handoff(dataset="d", checkpoint="", pretrain_run_id="")
    hand_on(handoff, pretrained)
    assert handoff.lineage["init_backbone_sha256"] == "f" * 64 and handoff.checkpoint == "/p/student.safetensors"
    hand_on(handoff, distilled)
    assert (handoff.checkpoint, handoff.checkpoint_digest, handoff.pretrain_run_id) == (
        "/q/student.safetensors",
        "s2",
        "q",
    )
    assert handoff.lineage["distill_teacher_checkpoint_sha256"] == "s1full"
    assert handoff.lineage["pretrain_run_id"] == "p" and handoff.lineage["distill_run_id"] == "q"
    # a DONE.json written before the weights were recorded still reads
    old = {k: v for k, v in pretrained.to_json().items() if k not in ("weights", "loss_trend")}
    assert PretrainStage().recorded(old).weights == {}
