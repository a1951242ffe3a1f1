"""The chain's ``annotate`` stage (``AnnotateStage``): what its identity digests, the fine-tune's
exports as its default checkpoints, its place in the chain; and a chain of that stage alone,
run, then reused."""

from __future__ import annotations

import dataclasses

import pytest

from evaluation.annotate.stage import AnnotateResult, AnnotateStage
from infra.config import load_config
from models.random_checkpoints import save_random_task_checkpoint
from pipelines.chain import DagConfig
from tests.evaluation.annotate.conftest import annotate_config, sample, write_version

STAGE = AnnotateStage()


def test_the_identity_digests_settings_dataset_and_checkpoint_contents_not_paths_or_resources(tiny_models, tmp_path):
    cfg = annotate_config("d", tmp_path / "out", tiny_models, tasks=("seg", "normal"))
    base = STAGE.identity(cfg, "dataset-1")
    assert STAGE.identity(cfg, "dataset-2") != base
    moved = tmp_path / "elsewhere.safetensors"
    moved.write_bytes(tiny_models["seg"].read_bytes())
    same = [
        dataclasses.replace(cfg, output_dir=str(tmp_path / "other"), name="x"),
        dataclasses.replace(cfg, actors=dataclasses.replace(cfg.actors, num_actors=7, num_cpus=3)),
        dataclasses.replace(
            cfg, tasks=dataclasses.replace(cfg.tasks, seg=dataclasses.replace(cfg.tasks.seg, checkpoint=str(moved)))
        ),
    ]
    assert all(STAGE.identity(c, "dataset-1") == base for c in same)
    other = [
        dataclasses.replace(cfg, actors=dataclasses.replace(cfg.actors, precision="bf16")),
        dataclasses.replace(
            cfg, tasks=dataclasses.replace(cfg.tasks, seg=dataclasses.replace(cfg.tasks.seg, input_hw=(128, 96)))
        ),
        dataclasses.replace(
            cfg,
            tasks=dataclasses.replace(
                cfg.tasks, pose=dataclasses.replace(cfg.tasks.pose, checkpoint=str(tiny_models["pose"]))
            ),
        ),
    ]
    assert len({base, *(STAGE.identity(c, "dataset-1") for c in other)}) == 4
    save_random_task_checkpoint("sapiens2_tiny_seg", moved, seed=1)  # the same path, other weights
    assert STAGE.identity(same[2], "dataset-1") != base


def test_the_fine_tunes_exports_label_every_task_the_config_leaves_open(tiny_models, tmp_path):
    cfg = annotate_config("d", tmp_path / "out", tiny_models, tasks=("seg",))
    exports = {
        "seg": {"export": "/ft/seg/export/model.safetensors", "input_hw": [128, 96]},
        "normal": {"export": "/ft/normal/export/model.safetensors", "input_hw": [128, 96]},
        "knn": {"export": "/nothing"},
    }
    placed = STAGE.with_inputs(cfg, "/curated", "sqlite:///m.db", exports)
    assert placed.tasks.seg.checkpoint == str(tiny_models["seg"])  # named in the config: kept
    assert placed.tasks.normal.checkpoint == "/ft/normal/export/model.safetensors"
    assert placed.tasks.normal.input_hw == (128, 96) and placed.data.dataset == "/curated"
    assert placed.data.tracking_uri == "sqlite:///m.db"


@pytest.mark.parametrize(
    "stages, ok",
    [
        (["curate", "pretrain", "finetune", "probe", "annotate"], True),
        (["curate", "pretrain", "probe", "annotate"], True),
        (["annotate"], True),
        (["probe", "annotate"], True),
        (["annotate", "probe"], False),
        (["curate", "annotate"], False),
    ],
)
def test_annotate_ends_the_chain_and_may_be_left_out(stages, ok):
    cfg = load_config(DagConfig, None, [f"stages=[{', '.join(stages)}]", "inputs.dataset=x"])
    if ok:
        cfg.validate()
    else:
        with pytest.raises(ValueError, match="stages must be a contiguous run"):
            cfg.validate()
    with pytest.raises(ValueError, match="needs inputs.dataset"):
        load_config(DagConfig, None, ["stages=[probe, annotate]"]).validate()


@pytest.mark.slow
def test_a_chain_of_the_annotate_stage_runs_it_then_reuses_it(tiny_models, tmp_path, ray_local):
    from pipelines.chain import run_dag

    dataset = write_version(tmp_path / "curated", [[sample("a", "obama.jpg", [(0.1, 0.1, 0.7, 0.95)], [0.9])]])
    settings = [f"tasks.{t}.checkpoint={tiny_models[t]}" for t in ("pose", "seg")]
    cfg = load_config(
        DagConfig,
        None,
        [
            "stages=[annotate]",
            f"workspace={tmp_path / 'ws'}",
            f"inputs.dataset={dataset}",
            *(f"annotate.{s}" for s in settings),
            "annotate.actors.num_actors=1",
            "annotate.gallery.samples=1",
        ],
    )
    first, second = run_dag(cfg), run_dag(cfg)
    (a,), (b,) = first.outcomes, second.outcomes
    assert not a.reused and b.reused and a.identity == b.identity and a.folder == b.folder
    assert isinstance(b.result, AnnotateResult) and b.result == a.result
    assert (a.result.samples, a.result.ok, a.result.dataset_id) == (1, 1, "handmade-1")
    assert set(a.result.models) == {"pose", "seg"} and a.result.gallery.endswith("gallery.html")
