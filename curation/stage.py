"""Curation as one stage of the chain (``infra.stage``, ``pipelines.chain``): the chain calls
``CurateStage`` and never spells curation's config fields or output files itself.

Its identity is the job digest + the curation code version + the digest of the input's listing
(curation starts the chain: its input is ``input.uri``, not an upstream stage); its result is
the finished output's dataset version, read back from the output (``curation.output``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from curation.job import absolutize, job_digest
from curation.output import CuratedOutput
from curation.pipeline import run_curation
from curation.recipe import CurationConfig
from curation.versions import code_version
from infra import storage
from infra.stage import Stage, StageResult, stage_digest


@dataclasses.dataclass(frozen=True, kw_only=True)
class CurateResult(StageResult):
    """The dataset version: what pretraining reads and the lineage names."""

    dataset_id: str
    dataset_uri: str
    shards: list[str]
    kept: int
    inputs: int
    shown = ("dataset_id", "shards")


def input_listing_digest(uri: str) -> str:
    """Digest of the raw input's listing (paths and sizes): new, removed or changed files change it."""
    fs, root = storage.resolve(uri)
    return stage_digest([(f.path, f.size) for f in storage.list_files(fs, root)])


class CurateStage(Stage[CurationConfig, CurateResult]):
    name = "curate"
    script = "curate.py"
    Result = CurateResult

    def identity(self, cfg: CurationConfig, upstream: str = "") -> str:
        """``upstream`` is unused: the input enters the identity through its listing."""
        cfg = absolutize(cfg)
        return stage_digest("curate", job_digest(cfg), code_version(), input_listing_digest(cfg.input.uri))

    def place(self, cfg: CurationConfig, folder: Path) -> CurationConfig:
        return dataclasses.replace(absolutize(cfg), output_dir=str(folder))

    def run(self, cfg: CurationConfig) -> CurateResult:
        """Curate (or resume) in this process."""
        run_curation(cfg)
        return self.result(cfg)

    def result(self, cfg: CurationConfig) -> CurateResult:
        out = CuratedOutput.at(cfg.output_dir)
        version, stats = out.version(), out.stats()
        return CurateResult(
            dataset_id=version.id,
            dataset_uri=version.uri,
            shards=list(version.shards),
            run_id=version.run_id,
            kept=stats["kept"],
            inputs=stats["inputs"],
        )
