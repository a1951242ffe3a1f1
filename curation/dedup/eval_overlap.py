"""Decontamination: the run's images that copy an evaluation image are dropped as ``eval_overlap``.

``dedup.decontaminate.eval_images`` is a set of evaluation images (``curation.eval_set`` reads
and hashes them with the recipe's own reader and decode step). A candidate row overlaps it when

- **exact**: its SHA-256 equals an evaluation image's;
- **near**: one of its hash values (the PHash and, with ``dedup.near.match_mirrored``, the
  mirror's) lies within ``dedup.near.max_distance`` bits of one of an evaluation image's values
  (the banded search of ``incremental._cross_edges``, over an in-memory index of the set);
- **semantic** (pass 2, when semantic dedup runs): its embedding is within
  ``dedup.semantic.threshold`` cosine of an evaluation image's (``earlier.best_matches``, over
  the whole set: no clusters, the set is small).

No chains: a row is dropped for its own match, never for resembling another row that matches.
``duplicate_of`` names the evaluation image (its source within the set) that matched best:
exact first, then the fewest differing bits, or the highest cosine, then the smallest source;
``duplicate_group`` is ``eval:exact``, ``eval:near`` or ``eval:semantic``. A decision depends on
the row and the set alone, so both engines decide partition by partition (Ray tasks with
``dedup.engine=ray``, one per partition writing its own decisions file; the driver's loop
otherwise), with no shuffle: the set, bounded by its own size, goes to the tasks.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA
from curation.dedup.hashing import hamming
from curation.dedup.incremental import NearDupIndex, _cross_edges
from curation.dedup.near import NearDupConfig, row_values

EVAL_OVERLAP = "eval_overlap"  # the reason (owned by the decontaminate step)
GROUP = "eval:"


@dataclasses.dataclass(kw_only=True)
class DecontaminateConfig:
    """Settings of decontamination (``dedup.decontaminate``).

    ``eval_images``: evaluation images the curated dataset must not contain: a folder, WebDataset
    tars or Parquet, local or object store, read as ``input`` is; empty (the default): off. Its
    content (not its path) enters the job's identity. Near and semantic copies are judged with
    the ``dedup.near`` and ``dedup.semantic`` settings (hash, distance, mirror; threshold).
    """

    eval_images: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.eval_images)


MATCHES = pa.schema([("row", pa.int64()), ("rank", pa.float64()), ("source", pa.string()), ("kind", pa.string())])


@dataclasses.dataclass
class EvalSet:
    """The evaluation images' rows (``curation.eval_set.EVAL_COLUMNS``, maybe an embedding column)."""

    rows: pa.Table

    def near_index(self, cfg: NearDupConfig) -> NearDupIndex:
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
    return pa.table({"row": rows, "rank": np.full(len(rows), -1.0), "source": source, "kind": ["exact"] * len(rows)})


def _near(table: pa.Table, index: NearDupIndex, cfg: NearDupConfig) -> pa.Table:
    """(row, bits, eval source) of every row value within t bits of an evaluation value."""
    rows, values = row_values(table, cfg)
    distinct, inverse = np.unique(values, return_inverse=True)
    ea, eb = _cross_edges(distinct, index, cfg.max_distance, cfg.max_pairs_per_chunk)
    ev_rows, ev_values = row_values(index.rows, cfg)
    pairs = pa.table({"v": ea, "w": eb, "bits": hamming(distinct[ea], index.values[eb]).astype(np.float64)})
    held = pa.table({"v": inverse.astype(np.int64), "row": rows})
    holders = pa.table(
        {
            "w": np.searchsorted(index.values, ev_values).astype(np.int64),
            "source": index.rows.column("key").take(pa.array(ev_rows)),
        }
    )
    found = pairs.join(held, "v", join_type="inner").join(holders, "w", join_type="inner")
    return pa.table(
        {
            "row": found.column("row"),
            "rank": found.column("bits"),
            "source": found.column("source"),
            "kind": ["near"] * found.num_rows,
        }
    )


def _decisions(table: pa.Table, matches: pa.Table) -> pa.Table:
    """One decision per row with a match: its best (lowest rank, then smallest source)."""
    if not matches.num_rows:
        return DECISION_SCHEMA.empty_table()
    best = matches.cast(MATCHES).sort_by([("row", "ascending"), ("rank", "ascending"), ("source", "ascending")])
    r = best.column("row").to_numpy()
    best = best.take(pa.array(np.flatnonzero(np.r_[True, r[1:] != r[:-1]])))
    return (
        pa.table(
            {
                "key": table.column("key").take(best.column("row")),
                "reason": pa.array([EVAL_OVERLAP] * best.num_rows, pa.string()),
                "duplicate_of": best.column("source"),
                "duplicate_group": pc.binary_join_element_wise(GROUP, best.column("kind"), ""),
            }
        )
        .cast(DECISION_SCHEMA)
        .sort_by("key")
    )


def hash_overlap(table: pa.Table, ev: EvalSet, cfg: NearDupConfig, index: NearDupIndex | None = None) -> pa.Table:
    """Decisions for the rows of ``table`` (key, sha256, the hash columns) with an exact or near
    copy in the evaluation set."""
    if not table.num_rows or not ev.rows.num_rows:
        return DECISION_SCHEMA.empty_table()
    matches = [_exact(table, ev.rows)]
    if cfg.enabled:
        matches.append(_near(table, index or ev.near_index(cfg), cfg))
    return _decisions(table, pa.concat_tables([m.cast(MATCHES) for m in matches]))


def semantic_overlap(table: pa.Table, ev: EvalSet, column: str, threshold: float) -> pa.Table:
    """Decisions for the rows of ``table`` (key, ``column``) within ``threshold`` cosine of an
    evaluation image's embedding."""
    from curation.dedup.earlier import best_matches
    from curation.dedup.semantic import embeddings

    if not table.num_rows or column not in ev.rows.column_names or not ev.rows.num_rows:
        return DECISION_SCHEMA.empty_table()
    best = best_matches(embeddings(table, column), embeddings(ev.rows, column), ev.rows.column("source"), threshold)
    n = best.num_rows
    matches = pa.table(
        {
            "row": best.column("row"),
            "rank": pc.negate(best.column("score")),
            "source": best.column("key"),
            "kind": ["semantic"] * n,
        }
    )
    return _decisions(table, matches)


# ---- partition by partition ------------------------------------------------------------------------


def _partition_overlap(pidx: int, inp, ev_ref, cfg: NearDupConfig, step: str) -> int:
    """One partition's exact and near overlaps, written as its decisions file; rows dropped."""
    import ray

    from curation import output
    from curation.dedup.distributed import read_candidates
    from infra import storage

    ev, index = ray.get(ev_ref)
    table = read_candidates(inp, pidx, ["key", "sha256", *cfg.hash_columns()])
    decisions = hash_overlap(table, ev, cfg, index)
    if decisions.num_rows:
        fs, root = storage.resolve(inp.out)
        storage.write_parquet(fs, output.decisions_path(root, step, inp.pids[pidx]), decisions)
    return decisions.num_rows


def decontaminate(inp, ev: EvalSet, cfg: NearDupConfig, step: str) -> int:
    """Every partition's exact and near overlaps with the evaluation set, one Ray task per
    partition writing that partition's decisions file; rows dropped."""
    import functools

    import ray

    from curation.dedup.distributed import clear_step
    from infra import storage
    from infra.ray_runtime import map_tasks

    clear_step(*storage.resolve(inp.out), step)
    ref = ray.put((ev, ev.near_index(cfg) if cfg.enabled else None))
    fn = functools.partial(_partition_overlap, inp=inp, ev_ref=ref, cfg=cfg, step=step)
    return sum(map_tasks(fn, range(len(inp.pids)), name="curation.decontaminate"))


def _semantic_part(batch: dict, inp, ev_ref, column: str, threshold: float) -> pa.Table:
    import ray

    from curation.dedup.distributed import read_candidates, with_partitions

    ev = ray.get(ev_ref)
    out = []
    for pidx in batch["pidx"]:
        table = read_candidates(inp, int(pidx), ["key", "partition", column])
        out.append(with_partitions(semantic_overlap(table, ev, column, threshold), table))
    return pa.concat_tables(out)


def semantic_overlap_dataset(inp, ev: EvalSet, column: str, threshold: float):
    """The partitioned semantic-overlap decisions of every partition (a lazy Ray dataset)."""
    import ray
    import ray.data

    items = ray.data.from_items(
        [{"pidx": i} for i in range(len(inp.pids))], override_num_blocks=max(1, min(len(inp.pids), 200))
    )
    kw = {"inp": inp, "ev_ref": ray.put(ev), "column": column, "threshold": threshold}
    return items.map_batches(_semantic_part, batch_size=1, batch_format="numpy", fn_kwargs=kw)
