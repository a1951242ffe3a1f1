"""An earlier dataset version (``dedup.against``) read partition by partition, never whole.

An incremental run dedups its new batch against the images the earlier version kept. The
earlier version may be corpus-sized, so nothing here loads it on the driver: its manifest is
read one part at a time, only the columns a lookup needs, and each part is reduced at once to
what concerns the new batch.

- **Exact** (``kept_with_sha``): the earlier kept rows whose SHA-256 is one of the new batch's;
  the driver holds the batch's digest set, one part's (key, sha256, status) and the matches.
  With ``dedup.engine=ray`` exact dedup instead joins the earlier kept rows to the new ones in
  its Ray Data shuffle by digest (``curation.dedup.distributed.exact_decisions``).
- **Semantic** (``best_semantic_matches``): a top-1 cosine search of the new embeddings in each
  part's kept embeddings (columns key, embedding only), merged into the best match per new row
  (highest cosine, then smallest key); one part at a time on the driver, or one Ray task per
  part with ``dedup.engine=ray``. The driver holds the batch and per new row one score and key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation import output, schema
from curation.dedup import DECISION_SCHEMA

KEY_SHA = pa.schema([("key", pa.string()), ("sha256", pa.string())])
_BLOCK = 2048  # new rows x earlier rows of one similarity block: 2048 x 2048 float64 (32 MB)


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


# ---- semantic: top-1 per new row, part by part ---------------------------------------------------


@dataclasses.dataclass
class BestMatch:
    """Per new row the best earlier match so far: cosine (-inf: none at or above the threshold) and key."""

    score: np.ndarray
    key: np.ndarray  # object array of str (None: no match)

    @classmethod
    def none(cls, n: int) -> BestMatch:
        return cls(np.full(n, -np.inf), np.full(n, None, dtype=object))

    def merge(self, rows: np.ndarray, score: np.ndarray, key: np.ndarray) -> None:
        """Take (row, score, key) candidates where they beat the current best (higher cosine, then smaller key)."""
        for r, s, k in zip(rows.tolist(), score.tolist(), key.tolist()):
            if s > self.score[r] or (s == self.score[r] and self.key[r] is not None and k < self.key[r]):
                self.score[r], self.key[r] = s, k


def top1_in_part(x_new: np.ndarray, part: pa.Table, column: str, threshold: float) -> pa.Table:
    """(row, score, key): for each new row with a cosine >= ``threshold`` to a row of ``part``, its
    best one there (highest cosine, then smallest key). ``x_new``: unit rows (``semantic.embeddings``)."""
    from curation.dedup.semantic import embeddings

    empty = pa.table(
        {"row": pa.array([], pa.int64()), "score": pa.array([], pa.float64()), "key": pa.array([], pa.string())}
    )
    if not part.num_rows or not len(x_new):
        return empty
    part = part.sort_by("key")  # argmax takes the first maximum: the smallest key on ties
    x_old = embeddings(part, column)
    if x_old.shape[1] != x_new.shape[1]:
        raise ValueError(
            f"earlier {column!r} embeddings have {x_old.shape[1]} dimensions, the new ones "
            f"{x_new.shape[1]}: they come from different models"
        )
    best = BestMatch.none(len(x_new))
    keys = np.array(part.column("key").to_pylist(), dtype=object)
    for lo in range(0, len(x_old), _BLOCK):
        block = x_old[lo : lo + _BLOCK]
        for start in range(0, len(x_new), _BLOCK):
            sim = x_new[start : start + _BLOCK] @ block.T
            j = np.argmax(sim, axis=1)
            s = sim[np.arange(len(j)), j]
            hit = np.flatnonzero(s >= threshold)
            best.merge(start + hit, s[hit], keys[lo + j[hit]])
    rows = np.flatnonzero(best.key != None)  # noqa: E711  (elementwise on an object array)
    return pa.table(
        {
            "row": pa.array(rows, pa.int64()),
            "score": pa.array(best.score[rows], pa.float64()),
            "key": pa.array(best.key[rows].tolist(), pa.string()),
        }
    )


def _part_top1(batch: dict, uri: str, column: str, threshold: float, x_ref) -> pa.Table:
    import ray

    earlier, x_new = EarlierVersion.open(uri), ray.get(x_ref)
    tables = [top1_in_part(x_new, earlier.kept_part(str(p), ["key", column]), column, threshold) for p in batch["path"]]
    return pa.concat_tables(tables)


def best_semantic_matches(
    earlier: EarlierVersion, x_new: np.ndarray, column: str, threshold: float, engine: str = "local"
) -> BestMatch:
    """The best earlier kept match (cosine >= ``threshold``) of each new row, over every manifest part."""
    best = BestMatch.none(len(x_new))
    if engine == "ray" and earlier.parts:
        import ray
        import ray.data

        items = ray.data.from_items(
            [{"path": p} for p in earlier.parts], override_num_blocks=max(1, min(len(earlier.parts), 200))
        )
        found = items.map_batches(
            _part_top1,
            batch_size=1,
            batch_format="numpy",
            fn_kwargs={"uri": earlier.uri, "column": column, "threshold": threshold, "x_ref": ray.put(x_new)},
        )
        tables = (b for b in found.iter_batches(batch_format="pyarrow", batch_size=None))
    else:
        tables = (top1_in_part(x_new, t, column, threshold) for t in earlier.kept_parts(["key", column]))
    for t in tables:
        best.merge(
            t.column("row").to_numpy(),
            t.column("score").to_numpy(),
            np.array(t.column("key").to_pylist(), dtype=object),
        )
    return best


def semantic_against(new: pa.Table, earlier: EarlierVersion, cfg, engine: str = "local") -> pa.Table:
    """Decisions dropping the new rows whose embedding is within ``cfg.threshold`` cosine of an image
    the earlier version kept (``duplicate_of``: the best match). Empty when the earlier version
    stored no ``cfg.embedding_column``."""
    from curation.dedup.semantic import GROUP_PREFIX, embeddings

    if not new.num_rows or cfg.embedding_column not in earlier.columns:
        return DECISION_SCHEMA.empty_table()
    best = best_semantic_matches(
        earlier, embeddings(new, cfg.embedding_column), cfg.embedding_column, cfg.threshold, engine
    )
    rows = np.flatnonzero(best.key != None)  # noqa: E711
    reps = pa.array(best.key[rows].tolist(), pa.string())
    return (
        pa.table(
            {
                "key": new.column("key").take(pa.array(rows, pa.int64())),
                "reason": pa.array([schema.SEMANTIC_DUPLICATE] * len(rows), pa.string()),
                "duplicate_of": reps,
                "duplicate_group": pc.binary_join_element_wise(GROUP_PREFIX, reps, ""),
            }
        )
        .cast(DECISION_SCHEMA)
        .sort_by("key")
    )
