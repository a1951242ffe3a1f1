"""The demo: build the demo corpus (real photos + planted bad cases), run the whole
curate -> pretrain -> finetune -> probe -> annotate DAG on it with tiny settings (the fine-tune:
LP-FT, see configs/dag_demo.yaml; the fine-tuned models then label the curated version, with a
gallery page of their predictions), probe a randomly initialised backbone with the
same settings as the baseline, write the curation audit page, and end with one table of what
came out and where it is (fine-tuned metrics beside the frozen probes').

    make demo          # or: python pipelines/demo.py [--verbose] [key=value overrides of configs/dag_demo.yaml]

The terminal gets one line per stage (a bar while a long stage runs). Everything Ray, MLflow
and the stages print goes to ``<workspace>/logs/demo-<time>.log`` (``--verbose``: to the
terminal instead); Ray's own session logs stay in its session folder, named at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from curation.audit.record import explore_command
from curation.stage import CurateResult
from evaluation.annotate.stage import AnnotateResult
from evaluation.finetune.stage import FinetuneResult
from infra.config import load_config
from pipelines.chain import DagConfig, DagInputs, DagResult, StageOutcome, run_dag
from pipelines.chain.stages import StagePlan
from pipelines.demo_corpus import NO_PERSON_DIR, build_demo_corpus
from training.stage import DistillResult, PretrainResult

REPO = Path(__file__).resolve().parents[1]

HEADLINE = {
    "pose": ("AP", "higher"),
    "seg": ("mIoU", "higher"),
    "pointmap": ("l2", "lower"),
    "normal": ("mean_angle", "lower"),
    "albedo": ("mae", "lower"),
    "knn": ("top1_k20", "higher"),
}
TITLES = {
    "curate": "curate  ",
    "pretrain": "pretrain",
    "distill": "distill ",
    "finetune": "finetune",
    "probe": "probe   ",
    "annotate": "annotate",
    "baseline": "baseline",
}


# ------------------------------------------------------------------ where the output goes
class Console:
    """The terminal, kept aside while file descriptors 1 and 2 (Python's prints, Ray's
    driver-side logs, C++ warnings) point at the log file."""

    def __init__(self, log_file: Path | None) -> None:
        self.log_file = log_file
        self._saved: list[int] = []
        self.out: TextIO = sys.stdout

    def __enter__(self) -> Console:
        if self.log_file is None:
            return self
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = [os.dup(1), os.dup(2)]
        self.out = io.TextIOWrapper(
            os.fdopen(os.dup(self._saved[0]), "wb", buffering=0), write_through=True, encoding="utf-8", errors="replace"
        )
        log_fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        return self

    def __exit__(self, *exc) -> None:
        if not self._saved:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._saved = []

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


# ------------------------------------------------------------------ progress per stage
def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 90 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class Progress:
    """A ``StageObserver`` for ``run_dag``: a bar while a stage runs (its progress read from
    the files and runs it writes), one line when it ends."""

    def __init__(self, console: Console, label: str | None = None) -> None:
        self.console, self.label = console, label
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._t0 = 0.0

    def _title(self, stage: str) -> str:
        return TITLES[self.label or stage]

    def stage_started(self, plan: StagePlan, reused: bool, tracking_uri: str) -> None:
        self._t0 = time.time()
        if reused or not self.console.out.isatty():  # a log file gets the closing line only
            return
        from tqdm import tqdm

        total, poll, unit = _watch(plan, tracking_uri, self._t0)
        self._bar = tqdm(
            total=total,
            desc=self._title(plan.stage),
            unit=unit,
            file=self.console.out,
            leave=False,
            dynamic_ncols=True,
            mininterval=0.5,
            bar_format="{desc}  {bar:24} {n_fmt}/{total_fmt} {unit}  {elapsed}"
            if total
            else "{desc}  running  {elapsed}",
        )
        self._stop.clear()
        self._thread = threading.Thread(target=self._follow, args=(poll,), daemon=True)
        self._thread.start()

    def _follow(self, poll: Callable[[], int]) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):  # a half-written file or a busy store: next time
                n = poll()
                if self._bar.total:
                    n = min(n, self._bar.total)
                if n != self._bar.n:
                    self._bar.n = n
                self._bar.refresh()

    def stage_finished(self, outcome: StageOutcome) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        how = "reused  " if outcome.reused else f"ran {_fmt_s(time.time() - self._t0):>5s}"
        self.console.print(f"{self._title(outcome.stage)}  {how}  {_headline(outcome)}")


def _watch(plan: StagePlan, uri: str, since: float) -> tuple[int | None, Callable[[], int], str]:
    """(total, how many are done now, unit) for a stage about to run."""
    cfg, folder = plan.cfg, Path(plan.folder)
    if plan.stage == "pretrain":
        return cfg.steps, lambda: _pretrain_step(uri, since), "steps"
    if plan.stage == "probe":
        return len(cfg.tasks), lambda: len(list(folder.glob("ray/*/probe_*"))), "probes"
    if plan.stage == "finetune":
        return cfg.steps * len(cfg.tasks), lambda: _finetune_steps(folder, cfg.tasks), "steps"
    return None, lambda: 0, ""


def _pretrain_step(uri: str, since: float) -> int:
    """The newest step the running pretraining run logged (rank 0 logs every ``metrics.log_every``)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(
        exps,
        "tags.`humanvision.stage` = 'pretrain' and attributes.status = 'RUNNING'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs or runs[0].info.start_time < since * 1000 - 5000:
        return 0
    history = client.get_metric_history(runs[0].info.run_id, "step_time_s")
    return max((m.step for m in history), default=0)


def _finetune_steps(folder: Path, tasks: list[str]) -> int:
    """Steps the fine-tune has logged so far, over its tasks (``<task>/history.jsonl``)."""
    from evaluation.finetune.run import task_losses

    return sum(len(task_losses(folder / t)) for t in tasks)


def _headline(o: StageOutcome) -> str:
    r = o.result
    if isinstance(r, CurateResult):
        return f"dataset {r.dataset_id}  {o.folder}"
    if isinstance(r, (PretrainResult, DistillResult)):
        return f"{r.final_step} steps  {r.student_weights}"
    if isinstance(r, FinetuneResult):
        return f"{len(r.metrics)} tasks fine-tuned  {o.folder}"
    if isinstance(r, AnnotateResult):
        return f"{r.ok}/{r.samples} samples labelled ({', '.join(r.models)})  {r.gallery}"
    return f"{len(r.metrics)} probes  {o.folder}"


# ------------------------------------------------------------------ the closing table
def experiment_url(base: str, experiment_id: str) -> str:
    """The experiment's page in ``mlflow ui``, on its runs (model-training) view: MLflow 3.17's
    UI picks the view from its GenAI / Model training switch (this parameter, else the
    browser's saved choice, else GenAI), not from the experiment's ``mlflow.experimentKind``."""
    return f"{base}/#/experiments/{experiment_id}?workflowType=machine_learning"


def _experiment_id(result: DagResult) -> str:
    from mlflow import MlflowClient

    return MlflowClient(result.tracking_uri).get_run(result.parent_run_id).info.experiment_id


def funnel_lines(curated: str) -> list[str]:
    from curation.output import CuratedOutput

    stats = CuratedOutput.at(curated).stats()
    rows = [f"  {'inputs':24s} {stats['inputs']:>5d}"]
    for step in stats["funnel"]:
        removed = ", ".join(f"{k} {v}" for k, v in sorted(step.get("removed", {}).items()))
        rows.append(
            f"  {step['step']:24s} {step['out']:>5d}"
            + (f"   (-{step['in'] - step['out']}: {removed})" if removed else "")
        )
    rows.append(
        f"  {'kept (in shards)':24s} {stats['kept']:>5d}   errors {stats['errors']}, dropped {stats['dropped']}"
    )
    return rows


def loss_line(pretrain: StageOutcome) -> str:
    trend = pretrain.result.loss_trend
    # "4.3904 (mean of the first 10 steps) -> 4.2963 (last 10)"
    parts = [p.split("(")[0].strip() for p in trend.split("->")]
    if len(parts) == 2:
        return (
            f"  total loss {parts[0]} -> {parts[1]}   (mean of the first and last 10 of "
            f"{pretrain.result.final_step} steps)"
        )
    return f"  {trend}"


def probe_rows(trained: dict, baseline: dict | None, finetuned: dict | None = None) -> list[str]:
    """Frozen probes of the pretrained and the random-init backbone, and the pretrained
    backbone fine-tuned end to end (same synthetic set, sizes and heads) where it was."""
    rows = [f"  {'probe':9s} {'metric':11s} {'pretrained':>11s} {'random init':>12s} {'fine-tuned':>11s}"]
    for task, m in trained.items():
        name, better = HEADLINE.get(task, (next(iter(m)), "higher"))
        if name not in m:
            continue
        base = (baseline or {}).get(task, {}).get(name)
        tuned = (finetuned or {}).get(task, {}).get(name)
        base_text = f"{base:12.4f}" if base is not None else f"{'-':>12s}"
        tuned_text = f"{tuned:11.4f}" if tuned is not None else f"{'-':>11s}"
        rows.append(f"  {task:9s} {name:11s} {m[name]:11.4f} {base_text} {tuned_text}   ({better} is better)")
    return rows


def _probe_lines(outcomes: dict, baseline: DagResult | None) -> list[str]:
    """The probe table (pretrained, random-init baseline, fine-tuned) and where each run lies."""
    base = baseline.outcomes[-1].result.metrics if baseline else None
    tuned = outcomes["finetune"].result.metrics if "finetune" in outcomes else None
    lines = [
        "frozen-backbone probes (synthetic probe set; the baseline: the same probes on a random-init backbone;",
        " fine-tuned: the pretrained backbone + the same head trained end to end)",
        *probe_rows(outcomes["probe"].result.metrics, base, tuned),
        f"  pretrained: {outcomes['probe'].folder}",
    ]
    if tuned:
        ft = outcomes["finetune"]
        lines.append(
            f"  fine-tuned: {ft.folder}  ({ft.result.steps} steps per task, LP-FT as "
            "configs/dag_demo.yaml says; exports: backbone. + decode_head., sha256 in MLflow)"
        )
    if baseline:
        lines += [
            f"  random init: {baseline.outcomes[-1].folder}",
            "  (40 tiny steps on a few images do not make a better backbone than random init: the demo shows the loop;",
            "  the recipe needs the data and steps of configs/pretrain_*.yaml)",
        ]
    return lines


def _annotate_lines(a) -> list[str]:
    """The pseudo-label models, counts and folder of the annotate stage's result ``a``."""
    return [
        "pseudo-labels (" + ", ".join(f"{t}: {m['name']}" for t, m in a.models.items()) + ")",
        f"  {a.ok} of {a.samples} samples of dataset version {a.dataset_id}: annotation version {a.version_id}",
        f"  annotations: {a.output_dir}",
    ]


def summary(
    result: DagResult,
    baseline: DagResult | None,
    audit_page: str | None,
    log_file: Path | None,
    ray_logs: str | None,
    wall_s: float,
) -> str:
    outcomes = {o.stage: o for o in result.outcomes}
    lines = ["", "=" * 78, f"demo finished in {_fmt_s(wall_s)}", ""]
    if "curate" in outcomes:
        lines += [
            "curation funnel (images left after each step)",
            *funnel_lines(outcomes["curate"].result.dataset_uri),
            f"  dataset version {outcomes['curate'].result.dataset_id}: {outcomes['curate'].result.dataset_uri}",
            "",
        ]
    if "pretrain" in outcomes:
        lines += [
            "pretraining (sapiens2_tiny, MAE + DINO + KoLeo)",
            loss_line(outcomes["pretrain"]),
            f"  student backbone: {outcomes['pretrain'].result.student_weights}",
            "",
        ]
    if "probe" in outcomes:
        lines += [*_probe_lines(outcomes, baseline), ""]
    if "annotate" in outcomes:
        lines += [*_annotate_lines(outcomes["annotate"].result), ""]
    if audit_page:
        lines += [f"audit page:   {audit_page}"]
    if "annotate" in outcomes and outcomes["annotate"].result.gallery:
        lines += [f"gallery:      {outcomes['annotate'].result.gallery}"]
    if "curate" in outcomes:
        lines += [f"explore:      {explore_command(outcomes['curate'].result.dataset_uri, '.venv/bin/python')}"]
    lines += [
        f"mlflow:       .venv/bin/mlflow ui --backend-store-uri {result.tracking_uri}",
        f"              then open {experiment_url('http://127.0.0.1:5000', _experiment_id(result))}",
    ]
    if log_file:
        lines.append(f"logs:         {log_file}" + (f"   (Ray's session logs: {ray_logs})" if ray_logs else ""))
    lines.append("=" * 78)
    return "\n".join(lines)


# ------------------------------------------------------------------ the demo
def write_audit_page(curated: str, uri: str, regenerate: bool) -> str | None:
    """The curation audit page (``pipelines/audit.py``), logged to the curation run; kept
    when the curation stage was reused and the page is already there."""
    from pipelines import audit

    page = Path(curated) / "audit" / "report.html"
    if page.is_file() and not regenerate:
        return str(page)
    code = audit.main([curated, "--tracking-uri", uri])
    return str(page) if code == 0 and page.is_file() else None


def ray_session_logs() -> str | None:
    try:
        import ray

        if ray.is_initialized():
            return ray._private.worker.global_worker.node.get_logs_dir_path()  # noqa: SLF001 - only to say where
    except Exception:  # noqa: BLE001 - a hint, never a failure
        return None
    return None


def baseline_config(cfg: DagConfig) -> DagConfig:
    """The probe stage alone on a randomly initialised backbone (an empty checkpoint), same settings."""
    return dataclasses.replace(cfg, name=f"{cfg.name}-random-init", stages=["probe"], inputs=DagInputs())


def demo_config(raw: Path, overrides: list[str]) -> DagConfig:
    """``configs/dag_demo.yaml`` on the corpus at ``raw`` with ``overrides``; a relative
    workspace is made absolute under the repository."""
    cfg = load_config(
        DagConfig,
        REPO / "configs" / "dag_demo.yaml",
        [f"curate.input.uri={raw}", f"finetune.augment.backgrounds={raw / NO_PERSON_DIR}", *overrides],
    )
    cfg.validate()
    workspace = Path(cfg.workspace) if Path(cfg.workspace).is_absolute() else REPO / cfg.workspace
    return dataclasses.replace(cfg, workspace=str(workspace))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="Ray's, MLflow's and the stages' logs on the terminal")
    parser.add_argument("--no-baseline", action="store_true", help="skip probing the random-init backbone")
    parser.add_argument("--corpus", default=str(REPO / "runs" / "demo" / "raw"), help="where the demo corpus is built")
    parser.add_argument("overrides", nargs="*", help="key=value settings of configs/dag_demo.yaml")
    args = parser.parse_args(argv)
    t0 = time.time()
    raw = Path(args.corpus).resolve()
    try:
        cfg = demo_config(raw, args.overrides)
    except ValueError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    workspace = Path(cfg.workspace)
    log_file = None if args.verbose else workspace / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.log"
    with Console(log_file) as console:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr, force=True
        )
        if log_file:
            console.print(f"logs      {log_file}  (--verbose: on the terminal)")
        try:
            expected = build_demo_corpus(raw)  # deterministic: rebuilding gives the same files, so stages are reused
            console.print(f"corpus    {len(expected)} images in {raw}")
            result = run_dag(cfg, Progress(console))
            baseline = None
            if "probe" in cfg.stages and not args.no_baseline:
                baseline = run_dag(baseline_config(cfg), Progress(console, "baseline"))
            audit_page = None
            curate = next((o for o in result.outcomes if o.stage == "curate"), None)
            if curate is not None:
                audit_page = write_audit_page(curate.result.dataset_uri, result.tracking_uri, not curate.reused)
                console.print(f"{'audit':8s}  {'wrote' if not curate.reused else 'ready':9s} {audit_page}")
            ray_logs = ray_session_logs()
        except Exception as err:  # the log file has the traceback; the terminal says where
            logging.getLogger("demo").exception("demo failed")
            console.print(f"\ndemo failed: {type(err).__name__}: {str(err)[:500]}")
            if log_file:
                console.print(f"the full log: {log_file}")
            return 1
        console.print(summary(result, baseline, audit_page, log_file, ray_logs, time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
