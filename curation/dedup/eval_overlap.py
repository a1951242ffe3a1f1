"""Decontamination: the run's images that copy an evaluation image are dropped as ``eval_overlap``.

``dedup.decontaminate.eval_images`` is read and hashed with the recipe's own reader and decode step
(``curation.eval_set``). A row overlaps it on an equal SHA-256, a hash value within
``dedup.near.max_distance`` bits (``incremental.cross_edges``) or, with semantic dedup, an embedding
within ``dedup.semantic.threshold`` cosine. No chains: ``duplicate_of`` is the row's own best match
(``_matches``), ``duplicate_group`` ``eval:<kind>``; both engines decide partition by partition.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA, decision_rows
from curation.dedup.decisions import clear_step, with_partitions, write_step_decisions
from curation.dedup.distributed import candidates_dataset
from curation.dedup.earlier import best_matches, best_per_row
from curation.dedup.hashing import hamming
from curation.dedup.incremental import NearDupIndex, cross_edges
from curation.dedup.near import DedupNearConfig, row_values
from curation.dedup.semantic import embeddings
from infra import storage

EVAL_OVERLAP = "eval_overlap"  # the reason (owned by the dedup.decontaminate step)
GROUP = "eval:"


@dataclasses.dataclass(kw_only=True)
class DedupDecontaminateConfig:
    """``dedup.decontaminate``: ``eval_images``, images the dataset must not contain (a folder,
    WebDataset tars or Parquet, read as ``input`` is; empty: off), entering the job's identity by
    content; near and semantic copies judged with ``dedup.near`` and ``dedup.semantic``."""

    eval_images: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.eval_images)


MATCHES = pa.schema([("row", pa.int64()), ("score", pa.float64()), ("source", pa.string()), ("kind", pa.string())])


def _matches(rows, score, source, kind: str) -> pa.Table:
    """Candidate matches (``MATCHES``): higher ``score`` is better (exact 1, near minus the bits)."""
    return pa.table({"row": rows, "score": score, "source": source, "kind": [kind] * len(rows)}).cast(MATCHES)


@dataclasses.dataclass
class EvalSet:
    """The evaluation images' rows (``curation.eval_set.EVAL_COLUMNS``, maybe an embedding column)."""

    rows: pa.Table

    def near_index(self, cfg: DedupNearConfig) -> NearDupIndex:
        """The set's hash values, indexed for the banded search (their ``representative``: the source)."""
        table = self.rows.select(["source", *cfg.hash_columns(), "width", "height"]).rename_columns(
            ["key", *cfg.hash_columns(), "width", "height"]
        )
        return NearDupIndex.build(table, dataclasses.replace(cfg, index_num_blocks=None))


def _exact(table: pa.Table, ev: pa.Table) -> pa.Table:
    ev = ev.sort_by("source")  # of equal digests, the smallest source
    where = pc.index_in(table.column("sha256"), value_set=ev.column("sha256"))
    rows = np.flatnonzero(pc.is_valid(where).to_numpy(zero_copy_only=False))
    source = ev.column("source").take(where.take(pa.array(rows, pa.int64())))
    return _matches(rows, np.full(len(rows), 1.0), source, "exact")


def _near(table: pa.Table, index: NearDupIndex, cfg: DedupNearConfig) -> pa.Table:
    """(row, bits, eval source) of every row value within t bits of an evaluation value."""
    rows, values = row_values(table, cfg)
    distinct, inverse = np.unique(values, return_inverse=True)
    ea, eb = cross_edges(distinct, index, cfg.max_distance, cfg.max_pairs_per_chunk)
    ev_rows, ev_values = row_values(index.rows, cfg)
    pairs = pa.table({"v": ea, "w": eb, "bits": hamming(distinct[ea], index.values[eb]).astype(np.float64)})
    held = pa.table({"v": inverse.astype(np.int64), "row": rows})
    held_by = np.searchsorted(index.values, ev_values).astype(np.int64)
    holders = pa.table({"w": held_by, "source": index.rows.column("key").take(pa.array(ev_rows))})
    found = pairs.join(held, "v", join_type="inner").join(holders, "w", join_type="inner")
    return _matches(found.column("row"), pc.negate(found.column("bits")), found.column("source"), "near")


def _decisions(table: pa.Table, matches: pa.Table) -> pa.Table:
    """One decision per row with a match: its best (``earlier.best_per_row``: highest score, then
    smallest source)."""
    best = best_per_row(matches, key="source")
    keys = table.column("key").take(best.column("row"))
    return decision_rows(keys, EVAL_OVERLAP, best.column("source"), GROUP, best.column("kind")).sort_by("key")


def hash_overlap(table: pa.Table, ev: EvalSet, cfg: DedupNearConfig, index: NearDupIndex | None = None) -> pa.Table:
    """Decisions for the rows of ``table`` (key, sha256, the hash columns) with an exact or near
    copy in the evaluation set."""
    if not table.num_rows or not ev.rows.num_rows:
        return DECISION_SCHEMA.empty_table()
    matches = [_exact(table, ev.rows)]
    if cfg.enabled:
        matches.append(_near(table, index or ev.near_index(cfg), cfg))
    return _decisions(table, pa.concat_tables(matches))


def semantic_overlap(table: pa.Table, ev: EvalSet, column: str, threshold: float) -> pa.Table:
    """Decisions for the rows of ``table`` (key, ``column``) within ``threshold`` cosine of an
    evaluation image's embedding."""
    if not table.num_rows or column not in ev.rows.column_names or not ev.rows.num_rows:
        return DECISION_SCHEMA.empty_table()
    best = best_matches(embeddings(table, column), embeddings(ev.rows, column), ev.rows.column("source"), threshold)
    return _decisions(table, _matches(best.column("row"), best.column("score"), best.column("key"), "semantic"))


def _hash_part(batch: pa.Table, ev_ref, cfg: DedupNearConfig, out: str, step: str) -> pa.Table:
    """A batch of candidates' exact and near overlaps, written as their partitions' decisions files."""
    import ray

    ev, index = ray.get(ev_ref)
    decisions = with_partitions(hash_overlap(batch, ev, cfg, index), batch)
    return pa.table({"dropped": [write_step_decisions(*storage.resolve(out), step, decisions, clear=False)]})


def decontaminate(inp, ev: EvalSet, cfg: DedupNearConfig, step: str) -> int:
    """Every partition's exact and near overlaps with the evaluation set, decided and written by
    the task reading the partition (no shuffle); rows dropped."""
    import ray

    clear_step(*storage.resolve(inp.out), step)
    kw = {"ev_ref": ray.put((ev, ev.near_index(cfg) if cfg.enabled else None)), "cfg": cfg, "out": inp.out}
    ds = candidates_dataset(inp, ["key", "partition", "sha256", *cfg.hash_columns()])
    written = ds.map_batches(_hash_part, batch_size=None, batch_format="pyarrow", fn_kwargs={**kw, "step": step})
    return sum(int(r["dropped"]) for r in written.take_all())


def _semantic_part(batch: pa.Table, ev_ref, column: str, threshold: float) -> pa.Table:
    import ray

    return with_partitions(semantic_overlap(batch, ray.get(ev_ref), column, threshold), batch)


def semantic_overlap_dataset(inp, ev: EvalSet, column: str, threshold: float):
    """The partitioned semantic-overlap decisions of every partition (a lazy Ray dataset)."""
    import ray

    kw = {"ev_ref": ray.put(ev), "column": column, "threshold": threshold}
    ds = candidates_dataset(inp, ["key", "partition", column])
    return ds.map_batches(_semantic_part, batch_size=None, batch_format="pyarrow", fn_kwargs=kw)
