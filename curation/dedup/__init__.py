"""Global deduplication on metadata (hashes, embeddings), never on re-read images.

Every method gives duplicate *groups* over candidate rows, each keeping one *representative* chosen
by one rule (``representative_order``); a dropped row records its group id and its representative's
key (``DECISION_SCHEMA``). Two engines run every method, in one process (``steps.run_dedup``) and in
Ray Data (``distributed`` and its siblings), on the same decision files (``decisions``).
"""

from __future__ import annotations

from collections.abc import Collection

import pyarrow as pa
import pyarrow.compute as pc

# One row per dropped duplicate.
DECISION_SCHEMA = pa.schema(
    [pa.field(name, pa.string(), nullable=False) for name in ("key", "reason", "duplicate_of", "duplicate_group")]
)


# A step ranks the copies of a duplicate family by writing an integer column named ``rank_<what>``
# (lower first; ``curation.steps.Step``): the dedup steps see only columns, in whichever process
# runs them, so the name is what tells them. Several rank the copies in the order of their names.
RANK_PREFIX = "rank_"


def decision_rows(keys, reason: str, duplicate_of, group_prefix: str, group_of=None) -> pa.Table:
    """``DECISION_SCHEMA`` rows: ``keys`` dropped for ``reason`` as copies of ``duplicate_of``, in the
    group ``group_prefix`` + ``group_of`` (default: the representative's key)."""
    group_of = duplicate_of if group_of is None else group_of
    return pa.table(
        {
            "key": keys,
            "reason": pa.array([reason] * len(keys), pa.string()),
            "duplicate_of": duplicate_of,
            "duplicate_group": pc.binary_join_element_wise(group_prefix, group_of, ""),
        }
    ).cast(DECISION_SCHEMA)


def rank_columns(names) -> list[str]:
    """The rank columns among ``names``, in the order the rule compares them."""
    return sorted(c for c in names if c.startswith(RANK_PREFIX))


def _int_column(table: pa.Table, name: str) -> pa.ChunkedArray:
    """An integer column with nulls (and a missing column) as 0."""
    column = table.column(name) if name in table.column_names else pa.nulls(table.num_rows)
    return pc.fill_null(column.cast(pa.int64()), 0)


def representative_order(meta: pa.Table, prefer: Collection[str] = ()) -> pa.Table:
    """The rule choosing a family's representative, as columns to sort ascending (every engine's): a
    key in ``prefer`` first, an original encoding before a conversion (``converted``), then the steps'
    rank columns (``rank_*``, lower first), larger resolution, more input bytes per pixel, the
    smallest key. A column ``meta`` lacks counts as unknown: not converted, rank 0, 0 bytes."""
    n = meta.num_rows
    pixels = pc.multiply(_int_column(meta, "width"), _int_column(meta, "height"))
    nbytes = meta.column("input_bytes") if "input_bytes" in meta.column_names else pa.nulls(n)
    per_pixel = pc.divide(
        pc.fill_null(nbytes.cast(pa.float64()), 0.0), pc.max_element_wise(pixels, 1).cast(pa.float64())
    )
    converted = meta.column("converted") if "converted" in meta.column_names else pa.nulls(n)
    keys = meta.column("key")
    return pa.table(
        {
            "other": pc.invert(pc.is_in(keys, value_set=pa.array(sorted(prefer), pa.string()))),
            "converted": pc.fill_null(converted.cast(pa.bool_()), False),
            **{c: _int_column(meta, c) for c in rank_columns(meta.column_names)},
            "fewer_pixels": pc.negate(pixels),
            "fewer_bytes": pc.negate(pc.if_else(pc.equal(pixels, 0), 0.0, per_pixel)),
            "key": keys,
        }
    )


def representative_sort_key(row: dict, prefer: Collection[str] = ()) -> tuple:
    """``representative_order`` of one row as a tuple (the smallest tuple of a family is its
    representative); rows with different rank columns still compare."""
    order = representative_order(pa.Table.from_pylist([row]), prefer).to_pylist()[0]
    ranks = tuple(order[c] for c in rank_columns(order))
    return (order["other"], order["converted"], ranks, order["fewer_pixels"], order["fewer_bytes"], order["key"])
