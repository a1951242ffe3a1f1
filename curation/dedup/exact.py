"""Exact dedup across the whole run: identical input bytes (SHA-256) keep one copy."""

from __future__ import annotations

import pyarrow as pa

from curation.dedup import DECISION_SCHEMA, group_decisions
from curation.dedup.components import meta_columns
from curation.schema import EXACT_DUPLICATE


def exact_duplicate_decisions(candidates: pa.Table) -> pa.Table:
    """Decisions for a table of candidate rows (one process; fine up to tens of millions of rows)."""
    groups: dict[str, list[dict]] = {}
    for row in candidates.select(["sha256", *meta_columns(candidates.column_names)]).to_pylist():
        groups.setdefault(row["sha256"], []).append(row)
    rows: list[dict] = []
    for digest in sorted(groups):
        members = groups[digest]
        if len(members) > 1:
            rows.extend(group_decisions(members, EXACT_DUPLICATE, f"sha256:{digest[:16]}"))
    return pa.Table.from_pylist(rows, schema=DECISION_SCHEMA)


def exact_against(candidates: pa.Table, existing_kept: pa.Table) -> pa.Table:
    """Rows whose input bytes equal an image the earlier version kept (``existing_kept``: key, sha256
    of those kept images, or only of the ones sharing a digest with ``candidates``)."""
    first_key = {}
    for key, sha in sorted(zip(existing_kept.column("key").to_pylist(), existing_kept.column("sha256").to_pylist())):
        if sha is not None:
            first_key.setdefault(sha, key)
    rows = [
        {"key": k, "reason": EXACT_DUPLICATE, "duplicate_of": first_key[s], "duplicate_group": f"sha256:{s[:16]}"}
        for k, s in zip(candidates.column("key").to_pylist(), candidates.column("sha256").to_pylist())
        if s in first_key
    ]
    return pa.Table.from_pylist(rows, schema=DECISION_SCHEMA)


def _decide_group(group: pa.Table) -> pa.Table:
    rows = group.to_pylist()
    if len(rows) < 2:
        return DECISION_SCHEMA.empty_table()
    return pa.Table.from_pylist(
        group_decisions(rows, EXACT_DUPLICATE, f"sha256:{rows[0]['sha256'][:16]}"), schema=DECISION_SCHEMA
    )


def exact_duplicate_decisions_ray(candidates_ds) -> pa.Table:
    """The same decisions computed with Ray Data (a shuffle by digest), for cluster-sized runs."""
    out = (
        candidates_ds.select_columns(["sha256", *meta_columns(candidates_ds.schema().names)])
        .groupby("sha256")
        .map_groups(_decide_group, batch_format="pyarrow")
    )
    tables = [
        pa.Table.from_pylist(b.to_pylist() if hasattr(b, "to_pylist") else [], schema=DECISION_SCHEMA)
        for b in out.iter_batches(batch_format="pyarrow", batch_size=None)
    ]
    return pa.concat_tables([DECISION_SCHEMA.empty_table(), *tables]).sort_by("key")
