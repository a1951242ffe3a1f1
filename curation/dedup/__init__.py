"""Global deduplication on metadata (hashes, embeddings), never on re-read images.

Every dedup method produces the same thing: duplicate *groups* over candidate rows and one
kept *representative* per group, chosen by ``representative_sort_key``. Dropped rows record
their group id and their representative's key (``DECISION_SCHEMA``).
"""

from __future__ import annotations

import pyarrow as pa

# One row per dropped duplicate.
DECISION_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("duplicate_of", pa.string(), nullable=False),
        pa.field("duplicate_group", pa.string(), nullable=False),
    ]
)


# A step ranks the copies of a duplicate family by writing an integer column named ``rank_<what>``
# (lower first; ``curation.steps.Step``): the dedup steps see only columns, in whichever process
# runs them, so the name is what tells them. Several rank the copies in the order of their names.
RANK_PREFIX = "rank_"


def rank_columns(names) -> list[str]:
    """The rank columns among ``names``, in the order the rule compares them."""
    return sorted(c for c in names if c.startswith(RANK_PREFIX))


def representative_sort_key(row: dict) -> tuple:
    """The documented rule, quality first: an original encoding over a deliberate conversion
    (``converted``: palette, greyscale, 16-bit scaled, CMYK, alpha-composited, animated frame 0),
    then the steps' rank columns (``rank_*``, lower first: e.g. a sharp, well-exposed copy before a
    blurred one), then larger resolution, then more input bytes per pixel, then the smallest key.
    A column the row lacks counts as unknown: not converted, rank 0, 0 bytes per pixel."""
    pixels = (row.get("width") or 0) * (row.get("height") or 0)
    per_pixel = (row.get("input_bytes") or 0) / pixels if pixels else 0.0
    ranks = tuple(row.get(c) or 0 for c in rank_columns(row))  # nested: rows of any columns compare
    return (bool(row.get("converted")), ranks, -pixels, -per_pixel, row["key"])


def group_decisions(members: list[dict], reason: str, group_id: str) -> list[dict]:
    """Decision rows for one duplicate group: every member but the representative is dropped."""
    ordered = sorted(members, key=representative_sort_key)
    rep = ordered[0]["key"]
    return [{"key": m["key"], "reason": reason, "duplicate_of": rep, "duplicate_group": group_id} for m in ordered[1:]]
