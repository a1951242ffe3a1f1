"""What the dedup steps read and write, whichever engine runs them.

The input is the run's staging: partition i's candidate rows (decoded, no reason yet, not dropped
by an earlier dedup step), each with a *row id* ``i << 32 | position in the partition``. The
output is one Parquet file of decisions per step and partition (``output.decisions_path``), the
rows dropped there; the shard writer reads its partition's files.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation import output, staging
from curation.dedup import DECISION_SCHEMA
from curation.dedup.components import meta_columns
from infra import storage

ROWS_PER_SHUFFLE_PARTITION = 2_000_000
MAX_SHUFFLE_PARTITIONS = 256
PARTITIONED_DECISION_SCHEMA = DECISION_SCHEMA.append(pa.field("partition", pa.string(), nullable=False))


@dataclasses.dataclass(frozen=True)
class GlobalDedupInput:
    """Where the candidates are and which columns to read (``steps.candidate_columns``)."""

    uri: str  # the curation output (its _staging holds the candidates)
    pids: tuple[str, ...]  # every partition of the run, in plan order
    columns: tuple[str, ...]  # read from staging
    absent: tuple[str, ...] = ()  # preferred columns no step wrote: nulls
    earlier_steps: tuple[str, ...] = ()  # their decisions remove rows before this step
    decisions_uri: str = ""  # the output whose _dedup holds the decisions (default: ``uri``)
    shuffle_partitions: int | None = None  # groups of every Ray shuffle (None: one per ~2M records)

    @property
    def out(self) -> str:
        return self.decisions_uri or self.uri

    def meta(self, *extra: str) -> list[str]:
        """The representative rule's columns this run has, the partition and ``extra``."""
        return list(dict.fromkeys([*meta_columns(self.columns), *extra, "partition"]))

    def partitions_by_input(self) -> int:
        """Shuffle groups when the row count is not known yet: one per 4 input partitions."""
        return self.shuffle_partitions or max(1, min(MAX_SHUFFLE_PARTITIONS, len(self.pids) // 4))

    def num_partitions(self, records: int) -> int:
        if self.shuffle_partitions:
            return self.shuffle_partitions
        return max(1, min(MAX_SHUFFLE_PARTITIONS, math.ceil(records / ROWS_PER_SHUFFLE_PARTITION)))


def read_candidates(inp: GlobalDedupInput, pidx: int, columns: list[str] | None = None) -> pa.Table:
    """Partition ``pidx``'s candidate rows with ``row_id``, less rows earlier steps dropped."""
    fs, root = storage.resolve(inp.uri)
    pid = inp.pids[pidx]
    need = list(dict.fromkeys(["key", *(columns or inp.columns), "decode_ok", "reason"]))
    table = staging.read_partition_rows(fs, root, pid, [c for c in need if c not in (*inp.absent, "row_id")])
    names = list(dict.fromkeys([*(columns or inp.columns), "row_id"]))
    if table is None:
        return pa.table({c: pa.array([], pa.string()) for c in names if c != "row_id"}).append_column(
            "row_id", pa.array([], pa.int64())
        )
    table = table.append_column("row_id", pa.array((np.int64(pidx) << 32) + np.arange(table.num_rows)))
    ok = pc.and_(pc.fill_null(table.column("decode_ok"), False), pc.is_null(table.column("reason")))
    out_fs, out_root = storage.resolve(inp.out)
    for step in inp.earlier_steps:
        dropped = read_decisions(out_fs, out_root, pid, step).column("key")
        ok = pc.and_(ok, pc.invert(pc.is_in(table.column("key"), value_set=dropped)))
    table = table.filter(ok)
    for column in inp.absent:
        if column in names:
            table = table.append_column(column, pa.nulls(table.num_rows, pa.float32()))
    return table.select(names)


def read_decisions(fs, root: str, pid: str, step: str) -> pa.Table:
    """One step's decisions for one partition (empty when it dropped nothing there)."""
    path = output.decisions_path(root, step, pid)
    if not storage.exists(fs, path):
        return DECISION_SCHEMA.empty_table()
    import pyarrow.parquet as pq

    with fs.open_input_file(path) as fh:
        return pq.read_table(fh).cast(DECISION_SCHEMA)


def decided_steps(fs, root: str) -> list[str]:
    """The dedup steps that have written decisions into the output at ``root``."""
    d = output.path(root, output.DEDUP_DIR, output.DECISIONS_DIR)
    if not storage.exists(fs, d):
        return []
    from pyarrow.fs import FileSelector, FileType

    return sorted(i.base_name for i in fs.get_file_info(FileSelector(d)) if i.type == FileType.Directory)


def partition_decisions(fs, root: str, pid: str) -> pa.Table:
    """Every step's decisions for one partition, by key (what its shard writer applies)."""
    parts = [read_decisions(fs, root, pid, s) for s in decided_steps(fs, root)]
    return pa.concat_tables([DECISION_SCHEMA.empty_table(), *parts]).sort_by("key")


def clear_step(fs, root: str, step: str) -> None:
    d = output.path(root, output.DEDUP_DIR, output.DECISIONS_DIR, step)
    if storage.exists(fs, d):
        fs.delete_dir(d)


def with_partitions(decisions: pa.Table, meta: pa.Table) -> pa.Table:
    """Decision rows with the dropped row's partition (from ``meta``: key, partition)."""
    where = pc.index_in(decisions.column("key"), value_set=meta.column("key"))
    return decisions.append_column("partition", meta.column("partition").take(where)).cast(PARTITIONED_DECISION_SCHEMA)


def write_partition_decisions(fs, root: str, step: str, pid: str, decisions: pa.Table) -> None:
    """One partition's decisions of ``step`` (``DECISION_SCHEMA``, with or without ``partition``)."""
    rows = decisions.drop_columns([c for c in ("partition",) if c in decisions.column_names])
    storage.write_parquet(fs, output.decisions_path(root, step, pid), rows.cast(DECISION_SCHEMA).sort_by("key"))


def write_step_decisions(fs, root: str, step: str, decisions: pa.Table, *, clear: bool = True) -> int:
    """Write ``decisions`` (``PARTITIONED_DECISION_SCHEMA``) of ``step``, one file per partition with
    drops, replacing every file of the step (``clear``) or only those partitions'; returns rows written."""
    if clear:
        clear_step(fs, root, step)
    for pid in pc.unique(decisions.column("partition")).to_pylist():
        write_partition_decisions(fs, root, step, pid, decisions.filter(pc.equal(decisions.column("partition"), pid)))
    return decisions.num_rows
