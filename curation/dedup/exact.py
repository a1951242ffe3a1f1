"""Exact dedup across the whole run: identical input bytes (SHA-256) keep one copy."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA
from curation.dedup.components import decisions_from_labels
from curation.schema import EXACT_DUPLICATE


def _group_ids(digests: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.binary_join_element_wise("sha256:", pc.utf8_slice_codeunits(digests, 0, 16), "")


def exact_duplicate_decisions(candidates: pa.Table) -> pa.Table:
    """Decisions among candidate rows (key, sha256 and the rule's columns): rows sharing a digest
    are one group, group id ``sha256:`` + the digest's first 16 characters. Both engines call it
    (the distributed one per shuffle group of digests)."""
    candidates = candidates.filter(pc.is_valid(candidates.column("sha256")))
    if candidates.num_rows < 2:
        return DECISION_SCHEMA.empty_table()
    sha = candidates.column("sha256")
    codes = pc.index_in(sha, value_set=pc.unique(sha)).to_numpy()
    out = decisions_from_labels(candidates, codes, EXACT_DUPLICATE, "sha256:")
    digest = sha.take(pc.index_in(out.column("key"), value_set=candidates.column("key")))
    out = out.set_column(out.schema.get_field_index("duplicate_group"), "duplicate_group", _group_ids(digest))
    return out.cast(DECISION_SCHEMA)


def exact_against(candidates: pa.Table, existing_kept: pa.Table) -> pa.Table:
    """Rows whose input bytes equal an image the earlier version kept (``existing_kept``: key, sha256
    of those kept images, or only of the ones sharing a digest with ``candidates``); ``duplicate_of``
    is the smallest earlier key with that digest."""
    kept = existing_kept.filter(pc.is_valid(existing_kept.column("sha256"))).sort_by("key")
    where = pc.index_in(candidates.column("sha256"), value_set=kept.column("sha256"))  # the first: smallest key
    hit = pc.is_valid(where)
    reps = kept.column("key").take(where.filter(hit))
    out = pa.table(
        {
            "key": candidates.column("key").filter(hit),
            "reason": pa.array([EXACT_DUPLICATE] * len(reps), pa.string()),
            "duplicate_of": reps,
            "duplicate_group": _group_ids(candidates.column("sha256").filter(hit)),
        }
    )
    return out.cast(DECISION_SCHEMA)
