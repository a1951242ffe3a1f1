"""Steps: the unit the curation recipe is written in, their adapter onto Ray Data, and ``Recipe``.

A **step** holds the settings of its own config section (``section``, a dataclass ``Config``)
and is named by it: its ``name`` is that section's dotted path as a user writes it in YAML and on
the command line (``content.nsfw``), in stats.json, the audit and MLflow alike, and its class name
is the path's words in CamelCase (``ContentNsfw``: ``curation.recipe_config.section_class_name``).
It declares the columns it ``reads``, the typed columns it writes (``fields``; ``writes`` is
their names), the drop/error ``reasons`` it may set and the ``scores`` the audit charts, and
describes itself for stats.json and MLflow. A disabled step stays in the recipe and reports
itself as not applied. A step that writes an integer column named ``rank_<what>`` (lower is
better) ranks the copies of a duplicate family: the representative rule compares it after
"original over converted" (``curation.dedup.representative_sort_key``). Kinds of step:

- the **reader** and the **writer** (``Reader``, ``Writer``: ``curation.readers.Input``,
  ``curation.writer.Shards``), one of each per recipe, which ``BuiltRecipe.reader`` and
  ``BuiltRecipe.writer`` name; the writer owns the output's layout;
- a **row step** (``RowStep``): maps a ``pyarrow.Table`` batch of rows to the same rows with its
  columns added (``process``). Filters annotate: they record scores and set ``reason`` on the
  pending rows they would drop (``curation.schema.set_reasons``); the writer's one decision
  point turns reasons into statuses. Model steps (``curation.filters.model.ModelStep``) run on
  actor pools so weights load once per actor;
- a **global step** (``curation.dedup.steps``): decides over the whole run's metadata;
- an **attribute step** (``AttributeStep``): a global step that decides nothing but adds columns to the
  rows the dedup steps before it left (cluster ids, ``curation.clusters``): per-partition files
  the writer joins by key onto the kept rows.

**Passes.** Global steps are the recipe's pass boundaries. The row steps before the first
global step are pass 1: they run on every input, inside each partition's read task, so they
must be cheap (no model step: ``Recipe`` refuses one there). The global steps after them
(exact and near dedup) decide which rows survive; the row steps up to the next global step are
pass 2 and see only the survivors (person detection, the content filters); and so on. A
global step that is disabled is no boundary (``BuiltRecipe.passes``).

``Recipe`` is an ordered list of step classes. It derives the job's config class (one section
per step), builds the steps from a config, refuses an order in which a step reads a column no
earlier enabled step writes, and gives the funnel and the step descriptions.

(A *stage* is something else: one stage of the curate -> pretrain -> probe chain, ``infra.stage``;
curation as a whole is one, ``curation.stage``.)
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import pyarrow as pa

from curation import schema
from curation.dedup import RANK_PREFIX


@dataclasses.dataclass(kw_only=True)
class Resources:
    """Where a row step runs: CPUs/GPUs per task or actor, batch size, actor pool size."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int = 16
    num_actors: int = 1  # model steps only: size of the actor pool

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must be >= 0")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {self.num_actors}")


@dataclasses.dataclass(frozen=True)
class Score:
    """A per-image value a step decides on, which the audit charts against its threshold.

    ``column``: the manifest column holding it, or the name of the value ``derive`` computes
    from the columns in ``needs`` (a manifest row -> value, or None). ``setting``: the key of the
    step's description (stats.json) that holds the threshold, if any."""

    column: str
    setting: str | None
    label: str  # what the value is, in words (the chart's x axis)
    integer: bool = False
    derive: Callable[[dict], float | None] | None = None
    needs: tuple[str, ...] = ()

    def value(self, row: dict) -> float | None:
        return self.derive(row) if self.derive is not None else row.get(self.column)

    def columns(self) -> tuple[str, ...]:
        """The manifest columns the value is read from."""
        return self.needs or (self.column,)


class Step(abc.ABC):
    """One step of the recipe, built from its config section and named by it: ``name`` is
    ``section`` (derived, never written twice). ``writes`` is derived from ``fields`` (set on each
    subclass); a step whose columns depend on its settings overrides ``columns_written``."""

    name: ClassVar[str]  # its section (set for each subclass, never declared)
    section: ClassVar[str] = ""  # dotted path of its settings in the job config, e.g. "content.text"
    Config: ClassVar[type | None] = None  # the settings dataclass of that section
    group: ClassVar[type | None] = None  # settings the steps of a section group share (e.g. dedup.engine)
    reasons: ClassVar[tuple[str, ...]] = ()  # drop/error reasons it may set, in funnel order
    reads: ClassVar[tuple[str, ...]] = ()
    fields: ClassVar[Sequence[pa.Field]] = ()  # the typed columns it writes
    writes: ClassVar[tuple[str, ...]] = ()  # their names (derived)
    scores: ClassVar[tuple[Score, ...]] = ()  # what the audit charts for it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "writes" in vars(cls):
            raise TypeError(f"{cls.__name__}: declare the columns it writes as ``fields``; ``writes`` is derived")
        if "name" in vars(cls):
            raise TypeError(f"{cls.__name__}: declare its config ``section``; a step's ``name`` is its section")
        cls.name = cls.section
        cls.writes = tuple(f.name for f in cls.fields)
        for f in cls.fields:
            if f.name.startswith(RANK_PREFIX) and not pa.types.is_integer(f.type):
                raise TypeError(f"{cls.__name__}: rank column {f.name!r} must be an integer type, not {f.type}")

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg

    @classmethod
    def from_config(cls, job: Any) -> Step:
        return cls(section_of(job, cls.section) if cls.section else None)

    @property
    def enabled(self) -> bool:
        return bool(getattr(self.cfg, "enabled", True))

    def columns_read(self) -> tuple[str, ...]:
        """Columns it needs from earlier steps (may depend on its settings)."""
        return self.reads

    def columns_written(self) -> tuple[str, ...]:
        return self.writes

    def check(self) -> None:  # noqa: B027  (a hook with nothing to check by default)
        """Start-up checks on the driver, before any Ray work (weights present, settings in range)."""

    def weight_files(self) -> dict[str, str]:
        """Model files by setting name: checked at start-up, digested by content in the job digest."""
        return {}

    def settings(self) -> dict:
        """What ran, with what thresholds (stats.json and MLflow)."""
        return {}

    def not_applied(self) -> dict:
        return {"disabled_by": f"{self.section}.enabled=false"}

    def describe(self) -> dict:
        if not self.enabled:
            return {"name": self.name, "applied": False, **self.not_applied()}
        return {"name": self.name, "applied": True, **self.settings()}


def section_of(job: Any, dotted: str) -> Any:
    node = job
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


class Reader(Step):
    """The recipe's first step: plans the input into partitions (on the driver) and reads each
    into raw rows (in its task)."""

    @abc.abstractmethod
    def plan(self) -> list:
        """The input's partitions, with deterministic ids (``curation.partitions.Partition``)."""

    @abc.abstractmethod
    def read(self, partition: Any) -> Iterator[pa.Table]:
        """One partition's raw rows, in input order."""


class Writer(Step):
    """The recipe's last step and its one decision point: it turns reasons and dedup decisions
    into statuses and writes the output in a layout it alone knows."""

    @abc.abstractmethod
    def write_all(
        self,
        output: str,
        partitions: list[str],
        pending: list[str],
        decisions: Callable[[str], pa.Table],
        staged_at: str | None = None,
        read_cpus: float = 1.0,
        attributes: Callable[[str], pa.Table | None] | None = None,
    ) -> list[dict]:
        """Write the output of ``pending`` (of all ``partitions``) from the rows staged at
        ``staged_at`` (default ``output``); ``decisions(pid)``: a partition's dedup decisions;
        ``read_cpus``: the CPUs of a task that reads input bytes (``input.num_cpus``);
        ``attributes(pid)``: the annotators' columns of a partition's kept rows (key + columns)."""

    @abc.abstractmethod
    def check_shard_sizes(self, sizes: list[int]) -> None:
        """Raise ``RuntimeError`` unless the written shards' sample counts fit the layout."""


class AttributeStep(Step):
    """A global step that adds its columns (``columns_written``) to every row the dedup steps
    before it left, after them; it drops nothing. It writes one file per partition
    (``curation.output.attributes_path``: key + its columns), which the writer joins onto the
    kept rows of the sidecars and the manifest."""

    @abc.abstractmethod
    def annotate(self, inp: Any, sources: dict[str, str]) -> None:
        """Write the files for the candidates of ``inp`` (``curation.dedup.distributed.GlobalDedupInput``:
        the rows no earlier dedup step dropped); ``sources``: for each column it reads, what wrote
        it (the step and its weights' digests)."""


class RowStep(Step):
    """A step over batches of rows. Subclasses set ``section`` and ``reasons`` and implement ``process``."""

    uses_model: ClassVar[bool] = False

    def resources(self) -> Resources:
        return Resources()

    def setup(self) -> None:
        """Load models or other per-worker state (called once per worker before ``process``)."""

    @abc.abstractmethod
    def process(self, batch: pa.Table) -> pa.Table:
        """Return ``batch`` with this step's columns set; never raise for one bad row."""


class _StepWorker:
    """Ray Data callable class: sets its step up once, then processes batches."""

    def __init__(self, step: RowStep) -> None:
        self.step = step
        self.step.setup()

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.step.process(batch)


def _ready(step: RowStep) -> RowStep:
    if not getattr(step, "_ready", False):
        step.setup()
        step._ready = True  # cached per worker process: steps are pickled once per task
    return step


def _run_task(batch: pa.Table, step: RowStep) -> pa.Table:
    return _ready(step).process(batch)


def apply_step(ds, step: RowStep, autoscale: bool = False):
    """Append ``step`` to a Ray Dataset pipeline with the step's declared resources. A model
    step's pool is ``num_actors`` actors from the start, or (``autoscale``) 1 growing to it.

    Worker faults: an actor whose process dies is restarted (its constructor loads the model
    again) and the batch it held is re-sent: Ray Data gives its actor pools ``max_restarts=-1``
    and ``max_task_retries=-1`` when not told otherwise (Ray 2.60; passing them is deprecated in
    favour of those defaults). A task whose worker dies is retried by Ray (``max_retries``, 3).
    Steps are deterministic, so a retried batch gives the same rows (tests/curation/test_faults.py)."""
    import ray.data

    res = step.resources()
    common = dict(batch_size=res.batch_size, batch_format="pyarrow", zero_copy_batch=True, num_cpus=res.num_cpus)
    if res.num_gpus:
        common["num_gpus"] = res.num_gpus
    if step.uses_model:
        pool = ray.data.ActorPoolStrategy(min_size=1 if autoscale else res.num_actors, max_size=res.num_actors)
        return ds.map_batches(_StepWorker, fn_constructor_args=(step,), compute=pool, **common)
    return ds.map_batches(_run_task, fn_kwargs={"step": step}, **common)


def run_steps_locally(batch: pa.Table, steps: list[RowStep]) -> pa.Table:
    """Apply row steps in order in this process (tests, benchmarks and small inputs)."""
    for step in steps:
        batch = _ready(step).process(batch)
    return batch


def check_fits(steps: list[RowStep], read_cpus: float, total_cpus: float, autoscale: bool) -> None:
    """On a cluster of known size (a local one): fixed actor pools hold their CPUs for the whole
    run, so the largest task (the read, or a cheap step) must still fit beside them, or the
    job would wait forever. Raises ``ValueError`` naming what to change."""
    if autoscale:
        return
    models = [s for s in steps if s.uses_model]
    held = sum(s.resources().num_cpus * s.resources().num_actors for s in models)
    tasks = [("input.num_cpus", read_cpus)] + [
        (f"{s.section}.num_cpus", s.resources().num_cpus) for s in steps if not s.uses_model
    ]
    name, largest = max(tasks, key=lambda t: t[1])
    if held + largest > total_cpus + 1e-9:
        pools = ", ".join(f"{s.name} {s.resources().num_actors} x {s.resources().num_cpus:g}" for s in models)
        raise ValueError(
            f"the model steps' actor pools hold {held:g} of {total_cpus:g} CPUs ({pools}), leaving "
            f"too little for {name}={largest:g}: lower their num_actors or num_cpus, lower {name}, "
            "or set ray.actor_pools=autoscaling"
        )


# ---- the recipe --------------------------------------------------------------------------------


def _check_ends(steps: tuple[type[Step], ...]) -> None:
    """One reader, first, and one writer, last: what comes between reads the reader's columns and
    the writer writes what it leaves."""
    readers, writers = [s for s in steps if issubclass(s, Reader)], [s for s in steps if issubclass(s, Writer)]
    if len(readers) != 1 or len(writers) != 1 or steps[0] is not readers[0] or steps[-1] is not writers[0]:
        raise ValueError(
            f"recipe: needs one reader first and one writer last, got readers {[s.name for s in readers]} "
            f"and writers {[s.name for s in writers]} in {[s.name for s in steps]}"
        )


def _check_first_pass(steps: tuple[type[Step], ...]) -> None:
    """Pass 1 (the row steps before the first global step) runs on every input: no model step there."""
    for cls in steps:
        if issubclass(cls, (Reader, Writer)):
            continue
        if not issubclass(cls, RowStep):
            return
        if cls.uses_model:
            raise ValueError(
                f"recipe: model step {cls.name!r} comes before the first global (dedup) step, so it "
                "would score every duplicate; move it after the dedup steps"
            )


@dataclasses.dataclass
class Pass:
    """One pass over the rows: row steps, then the global steps that decide on their output."""

    index: int  # 1: the first pass, over every input
    row_steps: list[RowStep]
    global_steps: list[Step]


class Recipe:
    """An ordered list of step classes, each configured by its own section of the job config."""

    def __init__(self, steps: list[type[Step]], *, job: type) -> None:
        names = [s.name for s in steps]
        sections = [s.section for s in steps if s.Config is not None]
        for label, values in (("name", names), ("config section", sections)):
            dup = sorted({v for v in values if values.count(v) > 1})
            if dup:
                raise ValueError(f"recipe: two steps share the {label} {dup[0]!r}")
        self.steps = tuple(steps)
        self.job = job
        _check_ends(self.steps)
        _check_first_pass(self.steps)

    def config_class(self, name: str = "CurationConfig", module: str | None = None) -> type:
        """The job's config dataclass: the job settings plus one section per configurable step."""
        from curation.recipe_config import config_class

        return config_class(self, name, module)

    def build(self, cfg: Any) -> BuiltRecipe:
        """The steps built from ``cfg``, their column order checked, each step's start-up checks run."""
        built = BuiltRecipe([s.from_config(cfg) for s in self.steps])
        built.check_columns()
        for step in built.steps:
            if step.enabled:
                step.check()
        return built


@dataclasses.dataclass
class BuiltRecipe:
    """Steps ready to run; what the pipeline, stats and the job digest derive from."""

    steps: list[Step]

    def check_columns(self) -> None:
        """Refuse a step that reads a column no earlier enabled step writes, naming both; the
        transient columns (``schema.TRANSIENT_COLUMNS``) end with the first pass."""
        written: dict[str, Step] = {}
        for i, step in enumerate(self.steps):
            if not step.enabled:
                continue
            if i and not isinstance(step, RowStep):  # a global step (or the writer) ends a pass
                written = {c: s for c, s in written.items() if c not in schema.TRANSIENT_COLUMNS}
            for column in step.columns_read():
                if column not in written:
                    raise ValueError(
                        f"recipe: step {step.name!r} reads column {column!r}, which no earlier "
                        f"enabled step writes{self._who_writes(column, i)}"
                    )
            written.update(dict.fromkeys(step.columns_written(), step))

    def _who_writes(self, column: str, index: int) -> str:
        if column in schema.TRANSIENT_COLUMNS and any(column in s.columns_written() for s in self.steps[:index]):
            return (
                f": {column!r} lives only in the first pass (the steps before the first dedup step); "
                f"move {self.steps[index].name!r} there"
            )
        for j, other in enumerate(self.steps):
            if column in type(other).writes or column in other.columns_written():
                if j < index:
                    return (
                        f": {other.name!r} writes it but is disabled; set {other.section}.enabled=true or "
                        f"{self.steps[index].section}.enabled=false"
                    )
                return f": {other.name!r} writes it later in the recipe; move {self.steps[index].name!r} after it"
        return ""

    @property
    def reader(self) -> Reader:
        return self._one(Reader)

    @property
    def writer(self) -> Writer:
        return self._one(Writer)

    def _one(self, kind: type) -> Any:
        found = [s for s in self.steps if isinstance(s, kind)]
        if len(found) != 1:
            raise ValueError(f"recipe: {len(found)} {kind.__name__.lower()} steps, one expected")
        return found[0]

    @property
    def between(self) -> list[Step]:
        """The steps between the reader and the writer, in order."""
        return [s for s in self.steps if not isinstance(s, (Reader, Writer))]

    def passes(self) -> list[Pass]:
        """The enabled steps between the reader and the writer, cut after each run of global steps."""
        passes = [Pass(1, [], [])]
        for step in self.between:
            if not step.enabled:
                continue
            if isinstance(step, RowStep):
                if passes[-1].global_steps:
                    passes.append(Pass(len(passes) + 1, [], []))
                passes[-1].row_steps.append(step)
            else:
                passes[-1].global_steps.append(step)
        return passes

    def up_to(self, p: Pass) -> BuiltRecipe:
        """The steps whose columns exist when ``p``'s global steps run, and those global steps only."""
        earlier = [step for q in self.passes() if q.index <= p.index for step in q.row_steps]
        return BuiltRecipe([self.reader, *earlier, *p.global_steps])

    def of_kind(self, kind: type) -> list:
        return [s for s in self.steps if isinstance(s, kind) and s.enabled]

    @property
    def row_steps(self) -> list[RowStep]:
        return self.of_kind(RowStep)

    def available(self) -> set[str]:
        """The columns staged rows hold (transient ones never are)."""
        staged = [
            s for s in self.steps if s.enabled and not isinstance(s, AttributeStep)
        ]  # annotators' go to the writer
        return {c for s in staged for c in s.columns_written()} - set(schema.TRANSIENT_COLUMNS)

    def funnel(self) -> list[tuple[str, tuple[str, ...]]]:
        """(step, reasons it owns) of every enabled step that can remove rows, in order. A reason
        belongs to the first step that declares it (decode re-declares the reader's)."""
        seen: set[str] = set()
        funnel = []
        for step in self.steps:
            if step.enabled and step.reasons:
                owned = tuple(r for r in step.reasons if r not in seen)
                seen.update(owned)
                funnel.append((step.name, owned))
        return funnel

    def describe(self) -> list[dict]:
        """Every step between the reader and the writer, applied or not, for stats.json and MLflow."""
        return [s.describe() for s in self.between]

    def weight_files(self) -> dict[str, str]:
        return {k: v for s in self.steps if s.enabled for k, v in s.weight_files().items()}
