"""The global dedup steps of the recipe: decontamination, exact, near-duplicate, then semantic, on metadata only.

Each step sees only the rows the previous ones kept, so every dropped row has exactly one
reason. With ``dedup.decontaminate.eval_images`` the run's copies of evaluation images go first,
as ``eval_overlap`` (``curation.dedup.eval_overlap``). With ``dedup.against`` (an earlier
curation output) the run is incremental: this run's images are deduplicated against that
version's kept images (exact by content hash, near-duplicates through its saved partitioned
index, semantic by the best cosine match to its kept embeddings in the same k-means cluster),
read part by part (``curation.dedup.earlier``), never whole on the driver; the earlier version
is not recomputed and its images are never dropped. Every run saves its near-dup index so a
later run can build on it (``dedup.engine=ray``: written by the Ray tasks,
``distributed.write_near_index``, extending the earlier version's with ``dedup.against``).

With ``dedup.engine=ray`` every step runs in Ray Data with nothing corpus-sized on the driver:
exact and near dedup (``distributed``), near dedup against an earlier version's index
(``distributed_incremental``), semantic dedup with or without one (``distributed_semantic``),
decontamination as one task per partition. Only near dedup against an index built in memory
from an old output's manifest (written before runs saved their index) still runs on the driver.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from curation import output, schema
from curation.config import DedupConfig
from curation.dedup import DECISION_SCHEMA, rank_columns
from curation.dedup.components import QUALITY_COLUMNS
from curation.dedup.distributed import (
    GlobalDedupInput,
    clear_step,
    exact_decisions,
    near_decisions,
    read_candidates,
    with_partitions,
    write_near_index,
)
from curation.dedup.distributed_incremental import near_against_decisions
from curation.dedup.distributed_semantic import semantic_decisions
from curation.dedup.earlier import EarlierVersion, semantic_against
from curation.dedup.eval_overlap import (
    EVAL_OVERLAP,
    DecontaminateConfig,
    EvalSet,
    decontaminate,
    hash_overlap,
    semantic_overlap,
    semantic_overlap_dataset,
)
from curation.dedup.exact import exact_against, exact_duplicate_decisions, exact_duplicate_decisions_ray
from curation.dedup.incremental import NearDupIndex
from curation.dedup.index_store import FORMAT, IndexExtension, PartitionedNearIndex, decide_against, save_any
from curation.dedup.near import GROUP_PREFIX, NearDupConfig, near_duplicate_decisions, near_duplicate_decisions_ray
from curation.dedup.semantic import SemanticDupConfig, semantic_duplicate_decisions, semantic_duplicate_decisions_ray
from curation.steps import Step, section_of
from infra import storage


@dataclasses.dataclass(kw_only=True)
class ExactDupConfig:
    enabled: bool = True  # identical input bytes keep one copy, across the whole run


@dataclasses.dataclass
class DedupContext:
    """What the dedup steps of one run share: the engine and, incrementally, the earlier version."""

    engine: str = "local"
    against: str | None = None
    earlier: EarlierVersion | None = None  # the earlier version, read part by part (never whole)
    against_index: PartitionedNearIndex | NearDupIndex | None = None  # opened by its header only
    index: NearDupIndex | IndexExtension | None = None  # the near-dup index this run saves
    eval_set: EvalSet | None = None  # dedup.decontaminate: the evaluation images, hashed (curation.eval_set)

    @classmethod
    def open(cls, settings: DedupConfig, near: NearDupConfig | bool | None) -> DedupContext:
        """``near``: the near-dedup settings when that step runs (True: the defaults), else None/False."""
        ctx = cls(engine=settings.engine, against=settings.against)
        if settings.against:
            ctx.earlier = EarlierVersion.open(settings.against)
            if near:
                ctx.against_index = earlier_index(
                    ctx.earlier.output, near if isinstance(near, NearDupConfig) else NearDupConfig()
                )
        return ctx

    def save_index(self, fs, path: str) -> None:
        """Write this run's near-dup index (partitioned, ``curation.dedup.index_store``) if it has one."""
        if self.index is not None:
            save_any(self.index, fs, path)

    def dataset(self, table: pa.Table):
        import ray.data

        return ray.data.from_arrow(table)


def earlier_index(earlier: output.CuratedOutput, cfg: NearDupConfig) -> PartitionedNearIndex | NearDupIndex:
    """An earlier version's near-dup index: the partitioned one it saved, opened by its header only
    (searches read the buckets a new batch touches; both engines save one), else built in memory
    from its manifest (an output written before runs saved their index, or an older index
    format): its near-dedup candidates are the rows kept or dropped by near or semantic dedup,
    represented by ``duplicate_of``."""
    header = output.path(earlier.root, output.DEDUP_DIR, output.NEAR_INDEX_DIR, output.NEAR_INDEX_HEADER)
    if (
        storage.exists(earlier.fs, header)
        and json.loads(storage.read_bytes(earlier.fs, header)).get("format") == FORMAT
    ):
        return PartitionedNearIndex.open(
            earlier.fs, output.path(earlier.root, output.DEDUP_DIR, output.NEAR_INDEX_DIR), cfg.index_locations
        )
    names = earlier.manifest_schema().names
    wanted = [
        "key",
        *cfg.hash_columns(),
        "width",
        "height",
        "converted",
        "input_bytes",
        "status",
        "reason",
        "duplicate_of",
    ]
    rows = earlier.read_manifest([c for c in wanted if c in names])
    later = pa.array([schema.NEAR_DUPLICATE, schema.SEMANTIC_DUPLICATE])
    candidates = rows.filter(
        pc.or_(
            pc.equal(rows.column("status"), schema.KEPT),
            pc.fill_null(pc.is_in(rows.column("reason"), value_set=later), False),
        )
    )
    near = candidates.filter(pc.equal(candidates.column("reason"), schema.NEAR_DUPLICATE))
    decisions = pa.table({"key": near.column("key"), "duplicate_of": near.column("duplicate_of")})
    return NearDupIndex.build(candidates.drop_columns(["status", "reason", "duplicate_of"]), cfg, decisions)


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

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int | None:
        """Decide in Ray Data, writing the decisions partitioned; rows dropped, or None when this
        step (with these settings) has no distributed form: then ``decide`` runs on the driver."""
        return None


class Decontaminate(DedupStep):
    """Drops the run's exact and near copies of an evaluation set as ``eval_overlap`` (and, with
    semantic dedup on embeddings, ``SemanticDedup`` drops its semantic copies under the same
    reason, which this step owns in the funnel): ``curation.dedup.eval_overlap``. First of the
    global steps, so a copy of an evaluation image is recorded as such, not as a duplicate of
    another copy, and a near-duplicate family keeps its clean members."""

    name = "decontaminate"
    section = "dedup.decontaminate"
    Config = DecontaminateConfig
    reasons = (EVAL_OVERLAP,)
    reads = ("sha256", "phash", "phash_mirror", "width", "height")  # with the default hash (``columns_read``)

    @property
    def near(self) -> NearDupConfig:
        return getattr(self.dedup, "near", None) or NearDupConfig()

    def columns_read(self) -> tuple[str, ...]:
        return ("sha256", *self.near.hash_columns(), "width", "height")

    def settings(self) -> dict:
        return {"eval_images": self.cfg.eval_images, "max_distance": self.near.max_distance}

    def not_applied(self) -> dict:
        return {"disabled_by": f"{self.section}.eval_images unset"}

    def decide(self, remaining: pa.Table, ctx: DedupContext) -> pa.Table:
        return hash_overlap(remaining, _eval_set(ctx), self.near)

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int | None:
        return decontaminate(inp, _eval_set(ctx), self.near, self.name)


def _eval_set(ctx: DedupContext) -> EvalSet:
    if ctx.eval_set is None:
        raise ValueError(
            "dedup.decontaminate.eval_images is set but the evaluation set was not read (DedupContext.eval_set)"
        )
    return ctx.eval_set


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
        if ctx.earlier is not None:
            parts.append(exact_against(remaining, ctx.earlier.kept_with_sha(remaining.column("sha256"))))
            remaining = without(remaining, parts[-1])
        parts.append(
            exact_duplicate_decisions_ray(ctx.dataset(remaining))
            if ctx.engine == "ray"
            else exact_duplicate_decisions(remaining)
        )
        return pa.concat_tables(parts)

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int | None:
        return exact_decisions(inp, schema.EXACT_DUPLICATE, self.name, ctx.earlier)


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
            near, ctx.index = decide_against(remaining, ctx.against_index, self.cfg)
            return near
        near = (
            near_duplicate_decisions_ray(ctx.dataset(remaining), self.cfg)
            if ctx.engine == "ray"
            else near_duplicate_decisions(remaining, self.cfg)
        )
        ctx.index = NearDupIndex.build(remaining, self.cfg, near)
        return near

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int | None:
        base = ctx.against_index
        if isinstance(base, NearDupIndex):  # built from an old output's manifest: searched on the driver
            return None
        if base is not None:
            dropped = near_against_decisions(inp, self.cfg, base, schema.NEAR_DUPLICATE, GROUP_PREFIX, self.name)
        else:
            dropped = near_decisions(inp, self.cfg, schema.NEAR_DUPLICATE, GROUP_PREFIX, self.name)
        write_near_index(inp, self.cfg, self.name, base)  # written by Ray tasks: nothing left for save_index
        ctx.index = None
        return dropped


class SemanticDedup(DedupStep):
    name = "semantic_dedup"
    section = "dedup.semantic"
    Config = SemanticDupConfig
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
            parts.append(semantic_against(remaining, ctx.earlier, self.cfg, ctx.engine))
            remaining = without(remaining, parts[-1])
        parts.append(
            semantic_duplicate_decisions_ray(ctx.dataset(remaining), self.cfg)
            if ctx.engine == "ray"
            else semantic_duplicate_decisions(remaining, self.cfg)
        )
        return pa.concat_tables(parts).sort_by("key")

    def decide_distributed(self, inp: GlobalDedupInput, ctx: DedupContext) -> int | None:
        if not self.cfg.enabled:
            return None
        before = ()
        if (ev := self._eval(ctx)) is not None:
            col, threshold = self.cfg.embedding_column, self.cfg.threshold
            before = (lambda i: semantic_overlap_dataset(i, ev, col, threshold),)
        return semantic_decisions(inp, self.cfg, self.name, ctx.earlier, before)


# The order the dedup steps run in (each sees the rows the ones before it kept).
DEDUP_ORDER = tuple(cls.name for cls in (Decontaminate, ExactDedup, NearDedup, SemanticDedup))


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
    """Run the steps in order over the staged candidates, each on the rows the earlier ones kept;
    decisions are written per step and partition (``output.decisions_path``). Returns rows
    dropped per step. With ``dedup.engine=ray`` every step that has a distributed form runs in
    Ray Data (nothing corpus-sized on the driver: the module docstring); the others
    (``engine=local``, near dedup against an in-memory index) read their candidates into the
    driver and decide there. An earlier version (``dedup.against``) is never loaded whole: exact
    dedup joins its kept digests in the Ray shuffle (or streams its manifest parts on the
    driver), near dedup joins the batch's band keys with its index buckets (or reads the buckets
    the batch touches on the driver), semantic dedup searches its parts' kept embeddings cluster
    by cluster (``curation.dedup.distributed_semantic``, ``curation.dedup.earlier``)."""
    dropped: dict[str, int] = {}
    for step in steps:
        step_inp = dataclasses.replace(inp, earlier_steps=tuple(dropped))
        n = step.decide_distributed(step_inp, ctx) if ctx.engine == "ray" else None
        dropped[step.name] = n if n is not None else decide_on_driver(step, step_inp, ctx)
    return dropped


def decide_on_driver(step: DedupStep, inp: GlobalDedupInput, ctx: DedupContext) -> int:
    """One step in the driver's process: candidates read into one table, decisions written per partition."""
    fs, root = storage.resolve(inp.out)
    tables = [read_candidates(inp, i) for i in range(len(inp.pids))]
    candidates = pa.concat_tables(tables, promote_options="default").sort_by("key") if tables else None
    decisions = (
        step.decide(candidates, ctx)
        if candidates is not None and candidates.num_rows
        else DECISION_SCHEMA.empty_table()
    )
    clear_step(fs, root, step.name)
    if decisions.num_rows:
        decisions = with_partitions(decisions, candidates)
        for pid in pc.unique(decisions.column("partition")).to_pylist():
            rows = decisions.filter(pc.equal(decisions.column("partition"), pid)).drop_columns(["partition"])
            storage.write_parquet(fs, output.decisions_path(root, step.name, pid), rows.sort_by("key"))
    return decisions.num_rows


def run_dedup(steps: list[DedupStep], candidates: pa.Table, ctx: DedupContext) -> pa.Table:
    """Decisions of the steps in order, each on the rows the previous ones kept, sorted by key."""
    parts = [DECISION_SCHEMA.empty_table()]
    remaining = candidates
    for step in steps:
        parts.append(step.decide(remaining, ctx))
        remaining = without(remaining, parts[-1])
    return pa.concat_tables(parts).sort_by("key")
