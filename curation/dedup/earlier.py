"""An earlier dataset version (``dedup.against``), read manifest part by part, never whole: the
kept rows sharing a new row's SHA-256 (``kept_with_sha``) and each new row's best kept match in its
k-means cluster (``best_semantic_matches``). ``distributed`` and ``distributed_semantic`` run the
same in Ray Data.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation import output, schema
from curation.dedup import DECISION_SCHEMA, decision_rows
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

    def kept_with_sha(self, digests: pa.Array | pa.ChunkedArray) -> pa.Table:
        """(key, sha256) of the earlier kept rows whose digest is in ``digests``."""
        wanted = pc.unique(digests)
        parts = (self.kept_part(path, ["key", "sha256"]) for path in self.parts)
        found = [t.filter(pc.is_in(t.column("sha256"), value_set=wanted)).cast(KEY_SHA) for t in parts]
        return pa.concat_tables([KEY_SHA.empty_table(), *found])


BEST = pa.schema([("row", pa.int64()), ("score", pa.float64()), ("key", pa.string())])


def best_per_row(pairs: pa.Table, row: str = "row", key: str = "key") -> pa.Table:
    """Of (``row``, score, ``key``) candidates, each row's best: the highest score, then the smallest key."""
    pairs = pairs.sort_by([(row, "ascending"), ("score", "descending"), (key, "ascending")])
    rows = pairs.column(row).to_numpy()
    return pairs.take(pa.array(np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if len(rows) else [], pa.int64()))


def best_matches(x_new: np.ndarray, x_old: np.ndarray, old_keys, threshold: float) -> pa.Table:
    """(row, score, key): for each new unit row with a cosine >= ``threshold`` to a row of ``x_old``
    (keys ``old_keys``, a pyarrow array), its best one (``best_per_row``). Cosines come from
    ``semantic.similar_pairs`` (rechecked per pair), so any blocking of the rows gives the same."""
    if len(x_old) and len(x_new) and x_old.shape[1] != x_new.shape[1]:
        raise ValueError(
            f"earlier embeddings have {x_old.shape[1]} dimensions, the new ones {x_new.shape[1]}: "
            "they come from different models"
        )
    if not len(x_new) or not len(x_old):
        return BEST.empty_table()
    i, j, score = similar_pairs(x_new, x_old, threshold)
    return best_per_row(
        pa.table({"row": i, "score": score, "key": old_keys.take(pa.array(j, pa.int64()))}, schema=BEST)
    )


def best_semantic_matches(
    earlier: EarlierVersion, x_new: np.ndarray, centroids: Centroids, column: str, threshold: float
) -> pa.Table:
    """(row, score, key): each new unit row's best earlier kept match (cosine >= ``threshold``) in its
    cluster of ``centroids``, over every manifest part, one part at a time."""
    best, clusters = BEST.empty_table(), centroids.assign(x_new)
    for part in (earlier.kept_part(path, ["key", column]) for path in earlier.parts):
        if not part.num_rows or not len(x_new):
            continue
        x_old = embeddings(part, column)
        old_clusters = centroids.assign(x_old)
        found = [best]
        for c in np.intersect1d(clusters, old_clusters):
            new_rows, old_rows = np.flatnonzero(clusters == c), np.flatnonzero(old_clusters == c)
            top = best_matches(x_new[new_rows], x_old[old_rows], part.column("key").take(old_rows), threshold)
            found.append(top.set_column(0, "row", pa.array(new_rows[top.column("row").to_numpy()], pa.int64())))
        best = best_per_row(pa.concat_tables(found))
    return best


def semantic_against(new: pa.Table, earlier: EarlierVersion, cfg) -> pa.Table:
    """Decisions dropping the new rows within ``cfg.threshold`` cosine of an image the earlier version
    kept in the same cluster (``duplicate_of``: the best), centroids fitted on ``new`` as in
    ``semantic.sample_centroids``; empty when the earlier version has no ``cfg.embedding_column``."""
    if not new.num_rows or cfg.embedding_column not in earlier.columns:
        return DECISION_SCHEMA.empty_table()
    x = embeddings(new, cfg.embedding_column)
    centroids = sample_centroids(new.select(["key", cfg.embedding_column]), new.num_rows, cfg)
    best = best_semantic_matches(earlier, x, centroids, cfg.embedding_column, cfg.threshold)
    keys = new.column("key").take(best.column("row"))
    return decision_rows(keys, schema.SEMANTIC_DUPLICATE, best.column("key"), GROUP_PREFIX).sort_by("key")
