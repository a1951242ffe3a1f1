"""Annotation as one stage of the chain (``infra.stage``, ``pipelines.chain``), after fine-tuning:
the chain calls ``AnnotateStage`` and never spells the annotation job's config fields or files.

By default the fine-tuned exports label the curated version (pseudo-labelling): every task the
fine-tune exported whose ``annotate.tasks.<task>.checkpoint`` is empty gets the export, at the
input size it was fine-tuned at (``with_inputs``); a checkpoint named in the config (a released
one) is used instead. Its identity is the annotation version id (``job.annotation_version_id``):
a digest of its settings, the dataset version id (``upstream``) and the checkpoints' sha256.
Its result is read back from the output's ``_SUCCESS``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from evaluation.annotate.config import AnnotateConfig
from infra.stage import Stage, StageResult, stage_digest


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnnotateResult(StageResult):
    """The annotation version: its id, where it is, its page and what labelled it."""

    version_id: str
    dataset_id: str
    output_dir: str
    gallery: str | None
    samples: int
    ok: int
    models: dict[str, dict[str, str]]  # task -> name, checkpoint_sha256 (and onnx_sha256)
    shown = ("version_id", "gallery")


class AnnotateStage(Stage[AnnotateConfig, AnnotateResult]):
    name = "annotate"
    script = "annotate.py"
    Result = AnnotateResult

    def identity(self, cfg: AnnotateConfig, upstream: str) -> str:
        """``upstream``: the id of the dataset version annotated."""
        from evaluation.annotate.job import absolutize, annotation_version_id
        from evaluation.annotate.models import describe

        cfg = absolutize(cfg)
        infos = {t: describe(t, cfg.tasks.of(t)) for t in cfg.tasks.enabled()}
        return stage_digest("annotate", annotation_version_id(upstream, cfg, infos))

    def with_inputs(
        self, cfg: AnnotateConfig, dataset: str, tracking_uri: str, exports: dict[str, dict[str, Any]]
    ) -> AnnotateConfig:
        """``dataset``: the version to annotate (id, name or folder, looked up in ``tracking_uri``);
        ``exports``: the fine-tune's, task -> {"export": path, "input_hw": [H, W]}, used for every
        task with no checkpoint of its own."""
        tasks = {}
        for task, export in exports.items():
            s = getattr(cfg.tasks, task, None)
            if s is None or s.checkpoint:
                continue
            hw = s.input_hw or (tuple(export["input_hw"]) if export.get("input_hw") else None)
            tasks[task] = dataclasses.replace(s, checkpoint=export["export"], input_hw=hw)
        data = dataclasses.replace(cfg.data, dataset=dataset, tracking_uri=tracking_uri)
        return dataclasses.replace(cfg, data=data, tasks=dataclasses.replace(cfg.tasks, **tasks))

    def place(self, cfg: AnnotateConfig, folder: Path) -> AnnotateConfig:
        from evaluation.annotate.job import absolutize

        return dataclasses.replace(absolutize(cfg), output_dir=str(folder))

    def run(self, cfg: AnnotateConfig) -> AnnotateResult:
        """Annotate (or resume) in this process."""
        from evaluation.annotate.job import run_annotation

        run_annotation(cfg)
        return self.result(cfg)

    def result(self, cfg: AnnotateConfig) -> AnnotateResult:
        import evaluation.annotate.layout as layout
        from infra import storage

        fs, root = storage.resolve(cfg.output_dir)
        done = layout.read_success(fs, root)
        if done is None:
            raise RuntimeError(f"annotation in {cfg.output_dir} has not finished")
        return AnnotateResult(
            run_id=done.get("mlflow_run_id"),
            version_id=done["annotation_version_id"],
            dataset_id=done["dataset_id"],
            output_dir=storage.to_uri(fs, root),
            gallery=done.get("gallery"),
            samples=done["samples"],
            ok=done["ok"],
            models=done["models"],
        )
