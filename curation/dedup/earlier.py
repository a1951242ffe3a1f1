"""An earlier dataset version (``dedup.against``) read manifest part by part, never whole.

- **Exact** (``kept_with_sha``): the earlier kept rows whose SHA-256 is one of the new batch's.
- **Semantic** (``best_semantic_matches``): each new row's best earlier kept match (highest cosine,
  then smallest key) in its k-means cluster (centroids fitted on the batch, the earlier rows
  assigned to them), merged over the parts. The driver holds the batch and one match per row.

With ``dedup.engine=ray`` the same runs in Ray Data (``distributed``, ``distributed_semantic``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation import output, schema
from curation.dedup import DECISION_SCHEMA
from curation.dedup.semantic import GROUP_PREFIX, Centroids, embeddings, sample_centroids, similar_pairs

KEY_SHA = pa.schema([("key", pa.string()), ("sha256", pa.string())])


@dataclasses.dataclass(frozen=True)
class EarlierVersion:
    """A finished curation output that a new batch is deduplicated against."""

    uri: str
    parts: tuple[str, ...]  # its manifest parts (paths on its filesystem), sorted
    columns: tuple[str, ...]  # its manifest's columns

    @classmethod
    def open(cls, uri: str) -> EarlierVersion:
        out = output.CuratedOutput.at(uri)
        if not out.finished:
            raise ValueError(f"dedup.against={uri!r} is not a finished curation output (no {output.SUCCESS_FILE})")
        files = tuple(sorted(out.manifest_files()))
        return cls(out.uri, files, tuple(out.manifest_schema().names) if files else ())

    @property
    def output(self) -> output.CuratedOutput:
        return output.CuratedOutput.at(self.uri)

    def kept_part(self, path: str, columns: list[str]) -> pa.Table:
        """One manifest part's kept rows, ``columns`` only."""
        table = self.output.read_part(path, [*columns, "status"])
        return table.filter(pc.equal(table.column("status"), schema.KEPT)).select(columns)

    def kept_parts(self, columns: list[str]) -> Iterator[pa.Table]:
        return (self.kept_part(path, columns) for path in self.parts)

    def kept_with_sha(self, digests: pa.Array | pa.ChunkedArray) -> pa.Table:
        """(key, sha256) of the earlier kept rows whose digest is in ``digests``."""
        wanted = pc.unique(digests)
        found = [
            t.filter(pc.is_in(t.column("sha256"), value_set=wanted)).cast(KEY_SHA)
            for t in self.kept_parts(["key", "sha256"])
        ]
        return pa.concat_tables([KEY_SHA.empty_table(), *found])


def best_per_row(pairs: pa.Table) -> pa.Table:
    """Of (row, score, key) candidates, each row's best: the highest cosine, then the smallest key."""
    pairs = pairs.sort_by([("row", "ascending"), ("score", "descending"), ("key", "ascending")])
    rows = pairs.column("row").to_numpy()
    return pairs.take(pa.array(np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if len(rows) else [], pa.int64()))


def best_matches(x_new: np.ndarray, x_old: np.ndarray, old_keys, threshold: float) -> pa.Table:
    """(row, score, key): for each new unit row with a cosine >= ``threshold`` to a row of ``x_old``
    (keys ``old_keys``), its best one (highest cosine, then smallest key). Cosines come from
    ``semantic.similar_pairs`` (rechecked per pair), so any blocking of the rows gives the same."""
    if len(x_old) and len(x_new) and x_old.shape[1] != x_new.shape[1]:
        raise ValueError(
            f"earlier embeddings have {x_old.shape[1]} dimensions, the new ones {x_new.shape[1]}: "
            "they come from different models"
        )
    i, j, score = similar_pairs(x_new, x_old, threshold) if len(x_new) and len(x_old) else (np.zeros(0, int),) * 3
    keys = _array(old_keys).take(pa.array(j, pa.int64()))
    return best_per_row(pa.table({"row": pa.array(i, pa.int64()), "score": pa.array(score, pa.float64()), "key": keys}))


def _array(keys) -> pa.Array:
    return keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else pa.array(keys, pa.string())


def top1_in_part(
    x_new: np.ndarray, clusters: np.ndarray, centroids: Centroids, part: pa.Table, column: str, threshold: float
) -> pa.Table:
    """(row, score, key): for each new row with a cosine >= ``threshold`` to a row of ``part`` in the
    same cluster (``part`` assigned to ``centroids``; ``clusters``: the new rows'), its best one there
    (highest cosine, then smallest key). ``x_new``: unit rows (``semantic.embeddings``)."""
    found = [best_matches(x_new[:0], x_new[:0], pa.array([], pa.string()), threshold)]
    if not part.num_rows or not len(x_new):
        return found[0]
    x_old = embeddings(part, column)
    old_clusters = centroids.assign(x_old)
    for c in np.intersect1d(clusters, old_clusters):
        new_rows, old_rows = np.flatnonzero(clusters == c), np.flatnonzero(old_clusters == c)
        best = best_matches(x_new[new_rows], x_old[old_rows], part.column("key").take(pa.array(old_rows)), threshold)
        found.append(best.set_column(0, "row", pa.array(new_rows[best.column("row").to_numpy()], pa.int64())))
    return pa.concat_tables(found)


def best_semantic_matches(
    earlier: EarlierVersion,
    x_new: np.ndarray,
    clusters: np.ndarray,
    centroids: Centroids,
    column: str,
    threshold: float,
) -> pa.Table:
    """(row, score, key): each new row's best earlier kept match (cosine >= ``threshold``, in its
    cluster) over every manifest part, one part at a time."""
    best = best_matches(x_new[:0], x_new[:0], pa.array([], pa.string()), threshold)
    for part in earlier.kept_parts(["key", column]):
        best = best_per_row(pa.concat_tables([best, top1_in_part(x_new, clusters, centroids, part, column, threshold)]))
    return best


def semantic_against(new: pa.Table, earlier: EarlierVersion, cfg) -> pa.Table:
    """Decisions dropping the new rows within ``cfg.threshold`` cosine of an image the earlier version
    kept in the same cluster (``duplicate_of``: the best), centroids fitted on ``new`` as in
    ``semantic.sample_centroids``; empty when the earlier version has no ``cfg.embedding_column``."""
    if not new.num_rows or cfg.embedding_column not in earlier.columns:
        return DECISION_SCHEMA.empty_table()
    x = embeddings(new, cfg.embedding_column)
    centroids = sample_centroids(new.select(["key", cfg.embedding_column]), new.num_rows, cfg)
    best = best_semantic_matches(earlier, x, centroids.assign(x), centroids, cfg.embedding_column, cfg.threshold)
    reps = best.column("key")
    decisions = {
        "key": new.column("key").take(best.column("row")),
        "reason": pa.array([schema.SEMANTIC_DUPLICATE] * len(reps), pa.string()),
        "duplicate_of": reps,
        "duplicate_group": pc.binary_join_element_wise(GROUP_PREFIX, reps, ""),
    }
    return pa.table(decisions).cast(DECISION_SCHEMA).sort_by("key")
