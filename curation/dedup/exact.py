"""Exact dedup across the whole run: identical input bytes (SHA-256) keep one copy."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA, decision_rows
from curation.dedup.components import decisions_from_labels
from curation.schema import EXACT_DUPLICATE


def _group_ids(digests: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.utf8_slice_codeunits(digests, 0, 16)


def exact_duplicate_decisions(candidates: pa.Table, earlier_kept: pa.Table | None = None) -> pa.Table:
    """Decisions among candidate rows (key, sha256 and the rule's columns): rows sharing a digest
    are one group, group id ``sha256:`` + the digest's first 16 characters. ``earlier_kept``: an
    earlier version's kept (key, sha256); the rows ``exact_against`` drops for it come first and
    leave the groups. Both engines call it (the distributed one per shuffle group of digests)."""
    against = DECISION_SCHEMA.empty_table()
    if earlier_kept is not None:
        against = exact_against(candidates, earlier_kept)
        candidates = candidates.filter(pc.invert(pc.is_in(candidates.column("key"), value_set=against.column("key"))))
    candidates = candidates.filter(pc.is_valid(candidates.column("sha256")))
    if candidates.num_rows < 2:
        return against
    sha = candidates.column("sha256")
    codes = pc.index_in(sha, value_set=pc.unique(sha)).to_numpy()
    out = decisions_from_labels(candidates, codes, EXACT_DUPLICATE, "sha256:")
    digest = sha.take(pc.index_in(out.column("key"), value_set=candidates.column("key")))
    out = decision_rows(out.column("key"), EXACT_DUPLICATE, out.column("duplicate_of"), "sha256:", _group_ids(digest))
    return pa.concat_tables([against, out])


def exact_against(candidates: pa.Table, existing_kept: pa.Table) -> pa.Table:
    """Rows whose input bytes equal an image the earlier version kept (``existing_kept``: key, sha256
    of those kept images, or only of the ones sharing a digest with ``candidates``); ``duplicate_of``
    is the smallest earlier key with that digest."""
    kept = existing_kept.filter(pc.is_valid(existing_kept.column("sha256"))).sort_by("key")
    where = pc.index_in(candidates.column("sha256"), value_set=kept.column("sha256"))  # the first: smallest key
    hit = pc.is_valid(where)
    keys, reps = candidates.column("key").filter(hit), kept.column("key").take(where.filter(hit))
    return decision_rows(keys, EXACT_DUPLICATE, reps, "sha256:", _group_ids(candidates.column("sha256").filter(hit)))
