"""The run's global dedup step: exact, then near-duplicate, then semantic, on metadata only.

Each method sees only the rows the previous ones kept, so every dropped row has exactly one
reason. With ``dedup.against`` (an earlier curation output) the step is incremental: this
run's images are deduplicated against that version's kept images (exact by content hash,
near-duplicates through its saved index) and the earlier version is not recomputed; its
images are never dropped. Every run saves its near-dup index under ``_dedup/near_index``
so a later run can build on it.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import DECISION_SCHEMA
from curation.dedup.exact import exact_duplicate_decisions, exact_duplicate_decisions_ray
from curation.dedup.incremental import NearDupIndex, incremental_decisions
from curation.dedup.near import near_duplicate_decisions, near_duplicate_decisions_ray
from curation.dedup.semantic import semantic_duplicate_decisions, semantic_duplicate_decisions_ray
from curation.schema import EXACT_DUPLICATE

NEAR_INDEX_DIR = "near_index"


def _without(table: pa.Table, decisions: pa.Table) -> pa.Table:
    if decisions.num_rows == 0:
        return table
    return table.filter(pc.invert(pc.is_in(table.column("key"), value_set=decisions.column("key"))))


def exact_against(candidates: pa.Table, existing_kept: pa.Table) -> pa.Table:
    """Rows whose input bytes equal an image the earlier version kept."""
    first_key = {}
    for key, sha in sorted(zip(existing_kept.column("key").to_pylist(), existing_kept.column("sha256").to_pylist())):
        first_key.setdefault(sha, key)
    rows = [{"key": k, "reason": EXACT_DUPLICATE, "duplicate_of": first_key[s], "duplicate_group": f"sha256:{s[:16]}"}
            for k, s in zip(candidates.column("key").to_pylist(), candidates.column("sha256").to_pylist())
            if s in first_key]
    return pa.Table.from_pylist(rows, schema=DECISION_SCHEMA)


def global_decisions(candidates: pa.Table, cfg, *, engine: str = "local", against_kept: pa.Table | None = None,
                     against_index: NearDupIndex | None = None) -> tuple[pa.Table, NearDupIndex | None]:
    """(decisions for this run's rows, the near-dup index to save for later runs)."""
    import ray.data

    parts = [DECISION_SCHEMA.empty_table()]
    remaining = candidates
    if cfg.exact and remaining.num_rows:
        if against_kept is not None:
            parts.append(exact_against(remaining, against_kept))
            remaining = _without(remaining, parts[-1])
        parts.append(exact_duplicate_decisions_ray(ray.data.from_arrow(remaining)) if engine == "ray"
                     else exact_duplicate_decisions(remaining))
        remaining = _without(remaining, parts[-1])
    index = None
    if cfg.near.enabled:
        if against_index is not None:
            near = incremental_decisions(remaining, against_index, cfg.near)
            index = against_index.extended(remaining, near, cfg.near)
        else:
            near = (near_duplicate_decisions_ray(ray.data.from_arrow(remaining), cfg.near) if engine == "ray"
                    else near_duplicate_decisions(remaining, cfg.near))
            index = NearDupIndex.build(remaining, cfg.near, near)
        parts.append(near)
        remaining = _without(remaining, near)
    if cfg.semantic.enabled and remaining.num_rows:
        parts.append(semantic_duplicate_decisions_ray(ray.data.from_arrow(remaining), cfg.semantic) if engine == "ray"
                     else semantic_duplicate_decisions(remaining, cfg.semantic))
    return pa.concat_tables(parts).sort_by("key"), index
