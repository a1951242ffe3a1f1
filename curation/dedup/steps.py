"""The recipe's global dedup steps, on metadata only: decontamination, exact, near, then semantic.

Each step sees only the rows the ones before it kept, so every dropped row has one reason. With
``dedup.against`` (an earlier output) the run is incremental: its images are deduplicated against
that version's kept images (exact by digest, near through its saved index, semantic by the best
cosine in the same cluster), never loading it whole and never dropping its images; every run saves
its near-dup index for the next. Two engines (``dedup.engine``): ``local`` decides in this process
(``decide``), ``ray`` in Ray Data with nothing corpus-sized on the driver (``decide_distributed``);
both write the same decision files (``curation.dedup.decisions``).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from curation import output, schema
from curation.config import DedupConfig
from curation.dedup import DECISION_SCHEMA, rank_columns
from curation.dedup.components import QUALITY_COLUMNS
from curation.dedup.decisions import (
    PARTITIONED_DECISION_SCHEMA,
    GlobalDedupInput,
    clear_step,
    read_candidates,
    with_partitions,
    write_step_decisions,
)
from curation.dedup.distributed import exact_decisions, near_decisions, write_near_index
from curation.dedup.distributed_incremental import near_against_decisions
from curation.dedup.distributed_semantic import semantic_decisions
from curation.dedup.earlier import EarlierVersion, semantic_against
from curation.dedup.eval_overlap import (
    EVAL_OVERLAP,
    DedupDecontaminateConfig,
    EvalSet,
    decontaminate,
    hash_overlap,
    semantic_overlap,
    semantic_overlap_dataset,
)
from curation.dedup.exact import exact_duplicate_decisions
from curation.dedup.incremental import NearDupIndex
from curation.dedup.index_store import IndexExtension, PartitionedNearIndex, decide_against, save_index
from curation.dedup.near import DedupNearConfig, near_duplicate_decisions
from curation.dedup.semantic import DedupSemanticConfig, semantic_duplicate_decisions
from curation.steps import Step, section_of
from infra import storage


@dataclasses.dataclass(kw_only=True)
class DedupExactConfig:
    """Exact dedup (``dedup.exact``): identical input bytes (SHA-256) keep one copy across the whole
    run (and, with ``dedup.against``, against the earlier version's kept samples)."""

    enabled: bool = True  # identical input bytes keep one copy, across the whole run


@dataclasses.dataclass
class DedupContext:
    """What the dedup steps of one run share: the engine and, incrementally, the earlier version."""

    engine: str = "local"
    against: str | None = None
    earlier: EarlierVersion | None = None  # the earlier version, read part by part (never whole)
    against_index: PartitionedNearIndex | None = None  # its near-dup index, opened by its header only
    index: NearDupIndex | IndexExtension | None = None  # the near-dup index this run saves
    eval_set: EvalSet | None = None  # dedup.decontaminate: the evaluation images, hashed (curation.eval_set)

    @classmethod
    def open(cls, settings: DedupConfig, near: DedupNearConfig | bool | None) -> DedupContext:
        """``near``: the near-dedup settings when that step runs (True: the defaults), else None/False."""
        ctx = cls(engine=settings.engine, against=settings.against)
        if settings.against:
            ctx.earlier = EarlierVersion.open(settings.against)
            if near:
                ctx.against_index = earlier_index(
                    ctx.earlier, near if isinstance(near, DedupNearConfig) else DedupNearConfig()
                )
        return ctx

    def save_index(self, fs, path: str) -> None:
        """Write this run's near-dup index (partitioned, ``curation.dedup.index_store``) if it has one."""
        if self.index is not None:
            save_index(self.index, fs, path)


def earlier_index(earlier: EarlierVersion, cfg: DedupNearConfig) -> PartitionedNearIndex:
    """The near-dup index an earlier version saved (every run with near dedup saves one), opened by
    its header only: searches read the buckets a new batch touches."""
    out = earlier.output
    root = output.path(out.root, output.DEDUP_DIR, output.NEAR_INDEX_DIR)
    if not storage.exists(out.fs, output.path(root, output.NEAR_INDEX_HEADER)):
        raise ValueError(
            f"dedup.against={earlier.uri!r} has no near-dup index (it was curated without near dedup): "
            "curate it again with dedup.near enabled, or set dedup.near.enabled=false"
        )
    return PartitionedNearIndex.open(out.fs, root, cfg.index_locations)


class DedupStep(Step):
    """A global step: decisions (``DECISION_SCHEMA``) for the rows no earlier dedup step dropped."""

    group = DedupConfig
    prefers: ClassVar[tuple[str, ...]] = QUALITY_COLUMNS  # the representative rule reads them when written

    def __init__(self, cfg: Any, settings: DedupConfig | None = None) -> None:
        super().__init__(cfg)
        self.dedup = settings or DedupConfig()

    @classmethod
    def from_config(cls, job) -> DedupStep:
        return cls(section_of(job, cls.section), job.dedup)

    def describe(self) -> dict:
        return {"name": self.name, "applied": self.enabled, **self.settings()}

    @abc.abstractmethod
    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        """Decisions for ``remaining`` (rows no earlier dedup step dropped)."""

    @abc.abstractmethod
    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int:
        """Decide in Ray Data, writing the decisions partitioned; rows dropped."""


class DedupDecontaminate(DedupStep):
    """Drops the run's exact and near copies of an evaluation set as ``eval_overlap`` (semantic copies:
    ``DedupSemantic``, under this step's reason). First, so such a copy is recorded as one."""

    section = "dedup.decontaminate"
    Config = DedupDecontaminateConfig
    reasons = (EVAL_OVERLAP,)
    reads = ("sha256", "phash", "phash_mirror", "width", "height")  # with the default hash (``columns_read``)

    @property
    def near(self) -> DedupNearConfig:
        return getattr(self.dedup, "near", None) or DedupNearConfig()

    def columns_read(self) -> tuple[str, ...]:
        return ("sha256", *self.near.hash_columns(), "width", "height")

    def settings(self) -> dict:
        return {"eval_images": self.cfg.eval_images, "max_distance": self.near.max_distance}

    def not_applied(self) -> dict:
        return {"disabled_by": f"{self.section}.eval_images unset"}

    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        return hash_overlap(remaining, _eval_set(ctx), self.near)

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int:
        return decontaminate(inp, _eval_set(ctx), self.near, self.name)


def _eval_set(ctx: DedupContext) -> EvalSet:
    if ctx.eval_set is None:
        raise ValueError(
            "dedup.decontaminate.eval_images is set but the evaluation set was not read (DedupContext.eval_set)"
        )
    return ctx.eval_set


class DedupExact(DedupStep):
    section = "dedup.exact"
    Config = DedupExactConfig
    reasons = (schema.EXACT_DUPLICATE,)
    reads = ("sha256", "width", "height")

    def settings(self) -> dict:
        return {"against": self.dedup.against}

    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        if not remaining.num_rows:
            return DECISION_SCHEMA.empty_table()
        kept = ctx.earlier.kept_with_sha(remaining.column("sha256")) if ctx.earlier is not None else None
        return exact_duplicate_decisions(remaining, kept)

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int:
        return exact_decisions(inp, self.name, ctx.earlier)


class DedupNear(DedupStep):
    section = "dedup.near"
    Config = DedupNearConfig
    reasons = (schema.NEAR_DUPLICATE,)

    def columns_read(self) -> tuple[str, ...]:
        return (*self.cfg.hash_columns(), "width", "height")

    def settings(self) -> dict:
        return {"hash": self.cfg.hash, "max_distance": self.cfg.max_distance, "match_mirrored": self.cfg.match_mirrored}

    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        if ctx.against_index is not None:
            near, ctx.index = decide_against(remaining, ctx.against_index, self.cfg)
            return near
        near = near_duplicate_decisions(remaining, self.cfg)
        ctx.index = NearDupIndex.build(remaining, self.cfg, near)
        return near

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int:
        base = ctx.against_index
        if base is not None:
            dropped = near_against_decisions(inp, self.cfg, base, self.name)
        else:
            dropped = near_decisions(inp, self.cfg, self.name)
        write_near_index(inp, self.cfg, self.name, base)  # written by Ray tasks: nothing left for save_index
        ctx.index = None
        return dropped


class DedupSemantic(DedupStep):
    section = "dedup.semantic"
    Config = DedupSemanticConfig
    reasons = (schema.SEMANTIC_DUPLICATE, EVAL_OVERLAP)

    def columns_read(self) -> tuple[str, ...]:
        return (self.cfg.embedding_column, "width", "height")  # and the representative rule's columns

    def _eval(self, ctx: DedupContext) -> EvalSet | None:
        """The evaluation set when it carries embeddings (``dedup.decontaminate`` with this step on)."""
        ev = ctx.eval_set
        return ev if ev is not None and self.cfg.embedding_column in ev.rows.column_names else None

    def settings(self) -> dict:
        return {"threshold": self.cfg.threshold}

    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        if not remaining.num_rows or not self.cfg.enabled:
            return DECISION_SCHEMA.empty_table()
        parts = []
        if (ev := self._eval(ctx)) is not None:
            parts.append(semantic_overlap(remaining, ev, self.cfg.embedding_column, self.cfg.threshold))
            remaining = without(remaining, parts[-1])
        if ctx.earlier is not None:
            parts.append(semantic_against(remaining, ctx.earlier, self.cfg))
            remaining = without(remaining, parts[-1])
        parts.append(semantic_duplicate_decisions(remaining, self.cfg))
        return pa.concat_tables(parts).sort_by("key")

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int:
        if not self.cfg.enabled:
            clear_step(*storage.resolve(inp.out), self.name)
            return 0
        before = ()
        if (ev := self._eval(ctx)) is not None:
            col, threshold = self.cfg.embedding_column, self.cfg.threshold
            before = (lambda i: semantic_overlap_dataset(i, ev, col, threshold),)
        return semantic_decisions(inp, self.cfg, self.name, ctx.earlier, before)


# The order the dedup steps run in (each sees the rows the ones before it kept).
DEDUP_ORDER = tuple(cls.name for cls in (DedupDecontaminate, DedupExact, DedupNear, DedupSemantic))


def steps_before(steps: list[DedupStep], decided: list[str]) -> list[str]:
    """Of the steps with decisions on disk (``decided``), those that run before ``steps``: their
    drops are not candidates. Later steps' files (e.g. of a killed run's second pass) are ignored."""
    first = min(DEDUP_ORDER.index(s.name) for s in steps) if steps else len(DEDUP_ORDER)
    return [name for name in DEDUP_ORDER[:first] if name in decided]


def without(table: pa.Table, decisions: pa.Table) -> pa.Table:
    if decisions.num_rows == 0:
        return table
    return table.filter(pc.invert(pc.is_in(table.column("key"), value_set=decisions.column("key"))))


def candidate_columns(steps: list[DedupStep], available: set[str]) -> tuple[list[str], list[str]]:
    """(columns to read for the dedup steps, preferred columns no step wrote: filled with nulls).
    The representative rule also reads every rank column (``rank_*``) an earlier step wrote."""
    needed = ["key", "partition"]
    for step in steps:
        needed += [c for c in step.columns_read() if c not in needed]
    prefers = [c for s in steps for c in s.prefers] + rank_columns(available)
    present = [c for c in dict.fromkeys(prefers) if c in available and c not in needed]
    absent = [c for c in dict.fromkeys(prefers) if c not in available]
    return needed + present, absent


def run_global_dedup(steps: list[DedupStep], inp: GlobalDedupInput, ctx: DedupContext) -> dict[str, int]:
    """Run the steps in order over the staged candidates, each on the rows the earlier ones kept,
    writing decisions per step and partition; rows dropped per step. ``dedup.engine=ray``: each step
    in Ray Data (``decide_distributed``); ``local``: in this process (``decide_on_driver``)."""
    dropped: dict[str, int] = {}
    for step in steps:
        step_inp = dataclasses.replace(inp, earlier_steps=tuple(dropped))
        if ctx.engine == "ray":
            dropped[step.name] = step.decide_distributed(step_inp, ctx)
        else:
            dropped[step.name] = decide_on_driver(step, step_inp, ctx)
    return dropped


def decide_on_driver(step: DedupStep, inp: GlobalDedupInput, ctx: DedupContext) -> int:
    """One step in this process: candidates read into one table, decisions written per partition."""
    tables = [read_candidates(inp, i) for i in range(len(inp.pids))]
    candidates = pa.concat_tables(tables, promote_options="default").sort_by("key") if tables else None
    decisions = PARTITIONED_DECISION_SCHEMA.empty_table()
    if candidates is not None and candidates.num_rows:
        decisions = with_partitions(step.decide(candidates, ctx), candidates)
    return write_step_decisions(*storage.resolve(inp.out), step.name, decisions)


def run_dedup(steps: list[DedupStep], candidates: pa.Table, ctx: DedupContext) -> pa.Table:
    """Decisions of the steps in order, each on the rows the previous ones kept, sorted by key."""
    parts = [DECISION_SCHEMA.empty_table()]
    remaining = candidates
    for step in steps:
        parts.append(step.decide(remaining, ctx))
        remaining = without(remaining, parts[-1])
    return pa.concat_tables(parts).sort_by("key")
