"""Stats and the dataset version id from per-part summaries equal those of the whole manifest, and
the version id depends on content and partitioning only, not on the order parts are read in."""

import numpy as np
import pyarrow as pa

from curation import schema
from curation.stats import compute_stats, manifest_counts, merge_counts, stats_from_counts
from curation.versions import combine_digests, dataset_version_id, partition_digest

FUNNEL = [("decode", ("decode_failed",)), ("geometry", ("too_small",)), ("dedup.exact", ("exact_duplicate",))]


def manifest(n: int = 500, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    reason = rng.choice(np.array([None, None, None, "too_small", "exact_duplicate", "decode_failed"], dtype=object), n)
    status = [schema.ERROR if r == "decode_failed" else schema.DROPPED if r else schema.KEPT for r in reason]
    return pa.table(
        {
            "key": [f"k{i:05d}" for i in rng.permutation(n)],
            "sha256": [f"{int(x):064x}" for x in rng.integers(0, 2**62, n)],
            "status": status,
            "reason": pa.array(reason.tolist(), pa.string()),
            "notes": [["converted"] if rng.random() < 0.1 else None for _ in range(n)],
            "partition": [f"p{int(p)}" for p in rng.integers(0, 7, n)],
        }
    )


def parts_of(table: pa.Table) -> dict[str, pa.Table]:
    return {
        pid: table.filter(pa.compute.equal(table.column("partition"), pid))
        for pid in sorted(set(table.column("partition").to_pylist()))
    }


def test_stats_from_part_counts_equal_the_whole_manifest_stats():
    table = manifest()
    kept = table.column("status").to_pylist().count(schema.KEPT)
    whole = compute_stats(table, FUNNEL, samples_in_shards=kept, shards=3, descriptions=[])
    summed = stats_from_counts(
        merge_counts(manifest_counts(p) for p in parts_of(table).values()),
        FUNNEL,
        samples_in_shards=kept,
        shards=3,
        descriptions=[],
    )
    assert summed == whole
    assert whole["reconciled"] and whole["dropped_by_reason"]["too_small"] > 0 and whole["decode_notes"]


def test_version_id_from_part_digests_is_order_free_and_follows_content():
    table = manifest()
    digests = {pid: partition_digest(p) for pid, p in parts_of(table).items()}
    vid = combine_digests(digests, "job", "code")
    assert vid == dataset_version_id(table, "job", "code")
    reversed_parts = {pid: partition_digest(p.take(np.arange(p.num_rows)[::-1])) for pid, p in parts_of(table).items()}
    assert combine_digests(dict(reversed(list(reversed_parts.items()))), "job", "code") == vid
    dropped = table.filter(pa.compute.not_equal(table.column("status"), schema.KEPT))
    first_kept = table.filter(pa.compute.equal(table.column("status"), schema.KEPT)).slice(1)
    assert dataset_version_id(pa.concat_tables([dropped, first_kept]), "job", "code") != vid  # one sample less
    assert combine_digests(digests, "other-job", "code") != vid
