"""The global dedup steps of the recipe: exact, then near-duplicate, then semantic, on metadata only.

Each step sees only the rows the previous ones kept, so every dropped row has exactly one
reason. With ``dedup.against`` (an earlier curation output) the run is incremental: this
run's images are deduplicated against that version's kept images (exact by content hash,
near-duplicates through its saved index) and the earlier version is not recomputed; its
images are never dropped. Every run saves its near-dup index so a later run can build on it.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from curation import output, schema
from curation.config import DedupSettings
from curation.dedup import DECISION_SCHEMA
from curation.dedup.components import QUALITY_COLUMNS
from curation.dedup.exact import exact_duplicate_decisions, exact_duplicate_decisions_ray
from curation.dedup.incremental import NearDupIndex, incremental_decisions
from curation.dedup.near import NearDupConfig, near_duplicate_decisions, near_duplicate_decisions_ray
from curation.dedup.semantic import SemanticDupConfig, semantic_duplicate_decisions, semantic_duplicate_decisions_ray
from curation.stages import Step, section_of
from infra import storage


@dataclasses.dataclass(kw_only=True)
class ExactDupConfig:
    enabled: bool = True               # identical input bytes keep one copy, across the whole run


@dataclasses.dataclass
class DedupContext:
    """What the dedup steps of one run share: the engine and, incrementally, the earlier version."""

    engine: str = "local"
    against: str | None = None
    against_kept: pa.Table | None = None      # key, sha256 of the earlier version's kept images
    against_index: NearDupIndex | None = None
    index: NearDupIndex | None = None         # the near-dup index this run saves

    @classmethod
    def open(cls, settings: DedupSettings, near_enabled: bool) -> DedupContext:
        ctx = cls(engine=settings.engine, against=settings.against)
        if settings.against:
            earlier = output.CuratedOutput.at(settings.against)
            if not earlier.finished:
                raise ValueError(f"dedup.against={settings.against!r} is not a finished curation output "
                                 f"(no {output.SUCCESS_FILE})")
            manifest = earlier.read_manifest(["key", "sha256", "status"])
            ctx.against_kept = manifest.filter(pc.equal(manifest.column("status"), schema.KEPT)).select(["key", "sha256"])
            if near_enabled:
                ctx.against_index = NearDupIndex.load(output.path(earlier.root, output.DEDUP_DIR, output.NEAR_INDEX_DIR))
        return ctx

    def dataset(self, table: pa.Table):
        import ray.data

        return ray.data.from_arrow(table)


class DedupStep(Step):
    """A global step: decisions (``DECISION_SCHEMA``) for the rows no earlier dedup step dropped."""

    group = DedupSettings
    prefers: ClassVar[tuple[str, ...]] = QUALITY_COLUMNS  # the representative rule reads them when written

    def __init__(self, cfg: Any, settings: DedupSettings | None = None) -> None:
        super().__init__(cfg)
        self.dedup = settings or DedupSettings()

    @classmethod
    def from_config(cls, job) -> DedupStep:
        return cls(section_of(job, cls.section), job.dedup)

    def describe(self) -> dict:
        return {"name": self.name, "applied": self.enabled, **self.settings()}

    @abc.abstractmethod
    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        """Decisions for ``remaining`` (rows no earlier dedup step dropped)."""


class ExactDedup(DedupStep):
    name = "exact_dedup"
    section = "dedup.exact"
    Config = ExactDupConfig
    reasons = (schema.EXACT_DUPLICATE,)
    reads = ("sha256", "width", "height")

    def settings(self) -> dict:
        return {"against": self.dedup.against}

    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        if not remaining.num_rows:
            return DECISION_SCHEMA.empty_table()
        parts = []
        if ctx.against_kept is not None:
            parts.append(exact_against(remaining, ctx.against_kept))
            remaining = without(remaining, parts[-1])
        parts.append(exact_duplicate_decisions_ray(ctx.dataset(remaining)) if ctx.engine == "ray"
                     else exact_duplicate_decisions(remaining))
        return pa.concat_tables(parts)


class NearDedup(DedupStep):
    name = "near_dedup"
    section = "dedup.near"
    Config = NearDupConfig
    reasons = (schema.NEAR_DUPLICATE,)

    def columns_read(self) -> tuple[str, ...]:
        return (*self.cfg.hash_columns(), "width", "height")

    def settings(self) -> dict:
        return {"hash": self.cfg.hash, "max_distance": self.cfg.max_distance, "match_mirrored": self.cfg.match_mirrored}

    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        if ctx.against_index is not None:
            near = incremental_decisions(remaining, ctx.against_index, self.cfg)
            ctx.index = ctx.against_index.extended(remaining, near, self.cfg)
            return near
        near = (near_duplicate_decisions_ray(ctx.dataset(remaining), self.cfg) if ctx.engine == "ray"
                else near_duplicate_decisions(remaining, self.cfg))
        ctx.index = NearDupIndex.build(remaining, self.cfg, near)
        return near


class SemanticDedup(DedupStep):
    name = "semantic_dedup"
    section = "dedup.semantic"
    Config = SemanticDupConfig
    reasons = (schema.SEMANTIC_DUPLICATE,)

    def columns_read(self) -> tuple[str, ...]:
        return (self.cfg.embedding_column,)

    def settings(self) -> dict:
        return {"threshold": self.cfg.threshold}

    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        if not remaining.num_rows:
            return DECISION_SCHEMA.empty_table()
        return (semantic_duplicate_decisions_ray(ctx.dataset(remaining), self.cfg) if ctx.engine == "ray"
                else semantic_duplicate_decisions(remaining, self.cfg))


def without(table: pa.Table, decisions: pa.Table) -> pa.Table:
    if decisions.num_rows == 0:
        return table
    return table.filter(pc.invert(pc.is_in(table.column("key"), value_set=decisions.column("key"))))


def exact_against(candidates: pa.Table, existing_kept: pa.Table) -> pa.Table:
    """Rows whose input bytes equal an image the earlier version kept."""
    first_key = {}
    for key, sha in sorted(zip(existing_kept.column("key").to_pylist(), existing_kept.column("sha256").to_pylist())):
        first_key.setdefault(sha, key)
    rows = [{"key": k, "reason": schema.EXACT_DUPLICATE, "duplicate_of": first_key[s],
             "duplicate_group": f"sha256:{s[:16]}"}
            for k, s in zip(candidates.column("key").to_pylist(), candidates.column("sha256").to_pylist())
            if s in first_key]
    return pa.Table.from_pylist(rows, schema=DECISION_SCHEMA)


def candidate_columns(steps: list[DedupStep], available: set[str]) -> tuple[list[str], list[str]]:
    """(columns to read for the dedup steps, preferred columns no step wrote: filled with nulls)."""
    needed = ["key", "partition"]
    for step in steps:
        needed += [c for c in step.columns_read() if c not in needed]
    prefers = [c for s in steps for c in s.prefers]
    present = [c for c in dict.fromkeys(prefers) if c in available and c not in needed]
    absent = [c for c in dict.fromkeys(prefers) if c not in available]
    return needed + present, absent


def run_dedup(steps: list[DedupStep], candidates: pa.Table, ctx: DedupContext) -> pa.Table:
    """Decisions of the steps in order, each on the rows the previous ones kept, sorted by key."""
    parts = [DECISION_SCHEMA.empty_table()]
    remaining = candidates
    for step in steps:
        parts.append(step.decide(remaining, ctx))
        remaining = without(remaining, parts[-1])
    return pa.concat_tables(parts).sort_by("key")
