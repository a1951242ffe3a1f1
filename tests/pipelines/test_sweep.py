"""``pipelines/sweep.py``: variants of a DAG configuration at several seeds, a fixed budget, reuse
of shared stages, the comparison page (checked in headless Chromium) and the MLflow record.

The end-to-end sweep here runs the curation stage of the demo DAG only (its real detector and
OCR on the demo corpus): three variants (the baseline, no near dedup, and a sampling policy that
changes nothing curation does) and one that fails, two seeds each; then the same sweep again,
which must reuse every stage. The probe metrics' statistics and their part of the page are
checked on given numbers (``compare``): a sweep with pretraining and probing costs minutes per
run (``docs/results/sweep.md`` has the demo sweep's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infra.config import load_config
from pipelines.sweeper import SweepConfig, run_sweep
from pipelines.sweeper.compare import (
    NO_SPREAD,
    WITHIN_NOISE,
    MetricStats,
    SeedOutcome,
    VariantSummary,
    compare_metrics,
    versus,
)
from pipelines.sweeper.config import plan_runs
from pipelines.sweeper.page import render_page
from tests.conftest import CENTERNET, REPO, TINY_REFERENCE

SWEEP_DEMO = REPO / "configs" / "sweep_demo.yaml"
CURATE_ONLY = [
    "stages=[curate]",
    f"curate.detector.weights={CENTERNET}",
    f"curate.backbone_embedding.weights={TINY_REFERENCE}",
    "curate.ray.num_cpus=null",
    "curate.ray.progress_bars=off",
]


def sweep_config(tmp: Path, *more: str) -> SweepConfig:
    """configs/sweep_demo.yaml, curation only, into ``tmp``, with a fourth variant that fails."""
    cfg = load_config(SweepConfig, SWEEP_DEMO, [f"output_dir={tmp / 'sweep'}", f"corpus={tmp / 'raw'}", *more])
    failing = {"name": "missing-detector", "overrides": [f"curate.detector.weights={tmp / 'no-such-model.onnx'}"]}
    variants = [*cfg.variants, type(cfg.variants[0])(**failing)]
    return dataclasses.replace(
        cfg, dag=str(REPO / cfg.dag), overrides=[*cfg.overrides, *CURATE_ONLY], variants=variants
    )


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, ray_local):
    """The sweep run twice in this process (on the session's Ray): (config, first, second)."""
    tmp = tmp_path_factory.mktemp("sweep")
    cfg = sweep_config(tmp)
    return cfg, run_sweep(cfg), run_sweep(cfg)


def by_name(result) -> dict:
    return {v.name: v for v in result.variants}


@pytest.mark.slow
def test_variants_reuse_shared_stages_and_a_second_sweep_reuses_everything(sweeps):
    _, first, second = sweeps
    v = by_name(first)
    assert [s.stages for s in v["baseline"].seeds] == [{"curate": "ran"}, {"curate": "reused"}]  # seeds share it
    assert v["weighted-sharpness"].seeds[0].stages == {"curate": "reused"}  # sampling only: the baseline's
    assert v["weighted-sharpness"].dataset.dataset_id == v["baseline"].dataset.dataset_id
    assert v["balanced"].seeds[0].stages == {"curate": "reused"}
    assert v["no-near-dedup"].seeds[0].stages == {"curate": "ran"}
    assert v["no-near-dedup"].dataset.dataset_id != v["baseline"].dataset.dataset_id
    again = by_name(second)
    for name in ("baseline", "no-near-dedup", "weighted-sharpness", "balanced"):
        assert all(st == "reused" for s in again[name].seeds for st in s.stages.values()), name
        assert again[name].dataset.dataset_id == v[name].dataset.dataset_id


@pytest.mark.slow
def test_a_failing_variant_is_recorded_failed_and_the_others_finish(sweeps):
    _, first, _ = sweeps
    v = by_name(first)
    assert [x.status for x in first.variants] == ["finished", "finished", "finished", "finished", "failed"]
    failed = v["missing-detector"]
    assert all(s.status == "failed" and "no-such-model.onnx" in s.error for s in failed.seeds)
    assert failed.dataset is None and failed.fate is None


@pytest.mark.slow
def test_the_dataset_diff_says_which_settings_and_images_changed(sweeps):
    _, first, _ = sweeps
    v = by_name(first)
    fate = v["no-near-dedup"].fate
    assert not fate.same and fate.removed == 0 and fate.added > 0
    assert any("dedup.near.enabled" in s for s in fate.settings)
    near = [g for g in fate.groups if g["reason"] == "near_duplicate"]
    assert near and near[0]["direction"] == "added" and "dedup.near.enabled" in ",".join(near[0]["explained_by"])
    assert sum(g["count"] for g in fate.groups if g["direction"] == "added") == fate.added
    assert fate.added == v["no-near-dedup"].dataset.kept - v["baseline"].dataset.kept
    assert v["weighted-sharpness"].fate.same
    settings = {k for k, _, _ in v["weighted-sharpness"].settings}
    assert "pretrain.data.sampling.policy" in settings and not any(k.startswith("curate.") for k in settings)


@pytest.mark.slow
def test_the_comparison_page_in_a_browser(sweeps, open_html):
    _, first, _ = sweeps
    loaded = open_html(Path(first.page))
    assert loaded.errors == [] and loaded.requests == []
    rows = {r["variant"]: r for r in loaded.rows("#variants tbody tr")}
    v = by_name(first)
    assert list(rows) == ["baseline", "no-near-dedup", "weighted-sharpness", "balanced", "missing-detector"]
    assert rows["missing-detector"]["status"] == "failed"
    assert int(rows["no-near-dedup"]["deltaKept"]) == v["no-near-dedup"].fate.added
    assert "curate.dedup.near.enabled" in rows["no-near-dedup"]["settings"].split(",")
    fates = {r["variant"]: r["fate"] for r in loaded.rows("[data-fate]")}
    assert fates == {
        "no-near-dedup": "changed",
        "weighted-sharpness": "same",
        "balanced": "same",
        "missing-detector": "none",
    }
    assert [r["variant"] for r in loaded.rows("#failures .warn")] == ["missing-detector", "missing-detector"]
    (href,) = loaded.page.eval_on_selector_all("a.diff-page", "els => els.map(e => e.getAttribute('href'))")
    diff = open_html(Path(first.page).parent / href)
    assert diff.errors == [] and diff.images()["total"] == diff.images()["loaded"] > 0
    added = {r["reason"] for r in diff.rows("#added-by-reason tbody tr")}
    assert "near_duplicate" in added


@pytest.mark.slow
def test_mlflow_has_a_sweep_run_with_one_child_per_variant_and_the_dags_under_them(sweeps):
    from mlflow import MlflowClient

    _, first, _ = sweeps
    client = MlflowClient(first.tracking_uri)
    parent = client.get_run(first.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["humanvision.stage"] == "sweep"
    assert {a.path for a in client.list_artifacts(first.run_id)} >= {"comparison.html", "sweep.json", "sweep.yaml"}
    exp = parent.info.experiment_id
    children = client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{first.run_id}'")
    status = {r.data.tags["sweep.variant"]: r.info.status for r in children}
    assert status == {
        "baseline": "FINISHED",
        "no-near-dedup": "FINISHED",
        "weighted-sharpness": "FINISHED",
        "balanced": "FINISHED",
        "missing-detector": "FAILED",
    }
    for run in children:
        dags = client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
        assert sorted(d.data.tags["sweep.seed"] for d in dags) == ["0", "1"]
        assert all(d.data.tags["humanvision.stage"] == "dag" for d in dags)
    kept = {r.data.tags["sweep.variant"]: r.data.metrics.get("dataset.kept") for r in children}
    assert kept["no-near-dedup"] == by_name(first)["no-near-dedup"].dataset.kept


# ---- without running anything --------------------------------------------------------------------


def test_the_demo_sweep_plans_one_budget_for_every_variant(tmp_path):
    cfg = load_config(SweepConfig, SWEEP_DEMO, [f"output_dir={tmp_path}"])
    cfg = dataclasses.replace(cfg, dag=str(REPO / cfg.dag))
    plans = plan_runs(cfg)
    assert list(plans) == ["baseline", "no-near-dedup", "weighted-sharpness", "balanced"]
    for runs in plans.values():
        assert [(r.seed, r.dag.pretrain.seed, r.dag.probe.seed) for r in runs] == [(0, 0, 0), (1, 1, 1)]
        assert {r.dag.workspace for r in runs} == {str(tmp_path / "dag")}  # one workspace: stages are shared
    assert plans["weighted-sharpness"][0].dag.pretrain.data.sampling.policy == "weighted"
    assert not plans["no-near-dedup"][0].dag.curate.dedup.near.enabled


def test_a_variant_that_changes_the_budget_is_refused_before_anything_runs(tmp_path):
    cfg = sweep_config(tmp_path)
    bigger = type(cfg.variants[0])(name="longer", overrides=["pretrain.steps=40"])
    with pytest.raises(ValueError, match=r"variant 'longer' changes pretrain.steps \(20 in the baseline, 40 here\)"):
        plan_runs(dataclasses.replace(cfg, variants=[*cfg.variants, bigger]))
    probe = type(cfg.variants[0])(name="other-probe", overrides=["probe.seg.steps=5"])
    with pytest.raises(ValueError, match="variant 'other-probe' changes probe.seg.steps"):
        plan_runs(dataclasses.replace(cfg, variants=[*cfg.variants, probe]))
    typo = type(cfg.variants[0])(name="typo", overrides=["pretrain.data.sampling.policy=balance"])
    with pytest.raises(ValueError, match=r"variant 'typo': pretrain\.data\.sampling\.policy"):
        plan_runs(dataclasses.replace(cfg, variants=[*cfg.variants, typo]))
    assert not (tmp_path / "sweep").exists()


def stats(values: list[float], better: str = "higher") -> MetricStats:
    import statistics

    spread = statistics.stdev(values) if len(values) > 1 else None
    return MetricStats("seg", "mIoU", better, tuple(values), statistics.fmean(values), spread)


def test_a_difference_counts_only_beyond_the_seed_spread():
    base = stats([0.50, 0.52])  # sd 0.0141
    # noise = 2 * sqrt(sd_b^2 / 2 + sd_v^2 / 2) = 2 * sqrt(0.0001 + 0.0001) = 0.0283
    assert versus(base, stats([0.52, 0.54]), 2.0).verdict == WITHIN_NOISE  # +0.02
    assert versus(base, stats([0.52, 0.54]), 2.0).noise == pytest.approx(0.02828, abs=1e-4)
    assert versus(base, stats([0.53, 0.55]), 2.0).verdict == "better"  # +0.03
    assert versus(base, stats([0.58, 0.60]), 2.0).verdict == "better"
    assert versus(base, stats([0.40, 0.42]), 2.0).verdict == "worse"
    assert versus(stats([1.0, 1.1], "lower"), stats([0.5, 0.6], "lower"), 2.0).verdict == "better"
    assert versus(base, stats([0.9]), 2.0).verdict == NO_SPREAD  # one seed: no claim
    assert versus(stats([0.5, 0.5], ""), stats([0.6, 0.6], ""), 2.0).verdict == "differs"


def seed(s: int, miou: float | None, knn: float = 0.3) -> SeedOutcome:
    if miou is None:
        return SeedOutcome(seed=s, status="failed", error="RuntimeError: pretraining stopped")
    return SeedOutcome(
        seed=s, status="finished", metrics={"seg": {"mIoU": miou, "aAcc": 0.7}, "knn": {"top1_k20": knn}}
    )


@pytest.mark.slow  # headless Chromium
def test_the_metrics_part_of_the_page_in_a_browser(tmp_path, open_html):
    variants = [
        VariantSummary("baseline", [], [seed(0, 0.50), seed(1, 0.52)], []),
        VariantSummary("clear-gain", ["x=1"], [seed(0, 0.60, 0.31), seed(1, 0.62, 0.29)], [("x", "0", "1")]),
        VariantSummary("one-seed", ["x=2"], [seed(0, 0.70), seed(1, None)], [("x", "0", "2")]),
        VariantSummary("all-failed", ["x=3"], [seed(0, None), seed(1, None)], [("x", "0", "3")]),
    ]
    compare_metrics(variants, 2.0)
    cfg = SweepConfig(name="t", variants=[], seeds=[0, 1])
    path = tmp_path / "comparison.html"
    path.write_text(render_page(cfg, variants, ["every run: test"], "sqlite:///x.db", "run0"))
    loaded = open_html(path)
    assert loaded.errors == []
    seg = {r["variant"]: r for r in loaded.rows("#metric-seg\\.mIoU tbody tr")}
    assert seg["baseline"]["verdict"] == "baseline" and float(seg["baseline"]["mean"]) == pytest.approx(0.51)
    assert seg["clear-gain"]["verdict"] == "better" and float(seg["clear-gain"]["delta"]) == pytest.approx(0.10)
    assert seg["one-seed"]["verdict"] == NO_SPREAD and seg["one-seed"]["n"] == "1"
    assert seg["all-failed"]["verdict"] == "no finished seed"
    knn = {r["variant"]: r["verdict"] for r in loaded.rows("#metric-knn\\.top1_k20 tbody tr")}
    assert knn["clear-gain"] == WITHIN_NOISE
    assert not loaded.rows("#metric-seg\\.aAcc")  # the task's headline metric only
    assert [r["variant"] for r in loaded.rows("#failures .warn")] == ["one-seed", "all-failed", "all-failed"]
    assert [r["status"] for r in loaded.rows("#variants tbody tr")] == [
        "finished",
        "finished",
        "partly failed",
        "failed",
    ]


def test_the_cluster_sweep_plans_a_fixed_number_of_images_seen(tmp_path):
    """configs/sweep_0.4b.yaml: every variant valid and on one budget, the images seen its cost is computed for."""
    from pipelines.sweeper.config import describe_budget

    cfg = load_config(SweepConfig, REPO / "configs" / "sweep_0.4b.yaml", [f"output_dir={tmp_path}"])
    plans = plan_runs(dataclasses.replace(cfg, dag=str(REPO / cfg.dag)))
    assert len(plans) * len(cfg.seeds) == 8  # the 8 runs its comment prices
    (line,) = describe_budget(plans["baseline"][0].dag)
    assert "sapiens2_0.4b, 20000 steps x 32 images x 64 workers = 40960000 images seen" in line
    assert "40,960,000 images" in (REPO / "configs" / "sweep_0.4b.yaml").read_text()


@pytest.mark.slow  # counts the 0.4B model's FLOPs on the meta device
def test_the_cluster_sweeps_cost_is_the_scale_plans_formula():
    """The GPU-hours in configs/sweep_0.4b.yaml's comment: images seen x FLOPs per sample
    (training.flops.step_cost) / (989 TFLOP/s x MFU) / 3600, as docs/scale_plan.md computes them."""
    from training.config import PretrainConfig
    from training.flops import step_cost

    text = (REPO / "configs" / "sweep_0.4b.yaml").read_text()
    pretrain = load_config(PretrainConfig, REPO / "configs" / "pretrain_0.4b.yaml", ["data.dataset=x"])
    per_sample = step_cost(pretrain, 1).flops
    assert f"FLOPs per sample {per_sample / 1e12:.2f} TFLOP" in text
    hours = [40_960_000 * per_sample / (989e12 * mfu) / 3600 for mfu in (0.25, 0.33, 0.39)]
    assert " / ".join(f"{h:.0f}" for h in hours) + " GPU-hours at 25 / 33 / 39% MFU" in text
    assert " / ".join(f"{8 * h:,.0f}" for h in hours) + " GPU-hours" in text
    assert " / ".join(f"{8 * h / 64:.0f}" for h in hours) + " hours" in text


def test_a_stopped_sweep_leaves_no_variant_run_open(tmp_path):
    """What ``run_sweep``'s ``finally`` does when the sweep stops before comparing (a Ctrl-C, a
    crash): the parent ends FAILED and each variant run still open ends KILLED, tagged."""
    from mlflow import MlflowClient

    from pipelines.sweeper.record import SweepRecord

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    record = SweepRecord(uri, "stopped", "stopped-sweep", "name: stopped-sweep\n")
    variants = [record.variant(name, [], name == "baseline") for name in ("baseline", "other")]
    record.finish([], {}, "FAILED")
    client = MlflowClient(uri)
    assert client.get_run(record.run_id).info.status == "FAILED"
    for run_id in variants:
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and run.data.tags["sweep.status"] == "interrupted"
