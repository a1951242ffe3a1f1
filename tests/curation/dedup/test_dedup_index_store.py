"""The partitioned near-dup index: decisions equal the in-memory index and a brute-force reference
across a chain of versions, and a small batch reads only the buckets its band keys fall into."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from dedup_fixtures import planted_table
from test_dedup_near import reference_decisions

from curation.dedup.incremental import NearDupIndex, incremental_decisions
from curation.dedup.index_store import PartitionedNearIndex, decide_against, save_index, value_buckets
from curation.dedup.near import DedupNearConfig, near_duplicate_decisions, row_values
from tests.curation.test_object_store import BUCKET, s3  # noqa: F401  (the moto S3 fixture)


def with_width(table: pa.Table, width: int) -> pa.Table:
    return table.set_column(
        table.schema.get_field_index("width"), "width", pa.array(np.full(table.num_rows, width, np.int32))
    )


def three_batches(seed: int) -> tuple[pa.Table, pa.Table, pa.Table]:
    """v1, b1, b2: a planted table split at random in three; older rows larger, so the rule keeps them."""
    table = planted_table(900, seed=seed, max_flips=5)
    part = np.random.default_rng(seed).integers(0, 3, table.num_rows)
    v1, b1, b2 = (table.filter(pa.array(part == i)) for i in range(3))
    return with_width(v1, 4000), with_width(b1, 2000), b2


def only(decisions, keys: pa.Table) -> list[dict]:
    return decisions.filter(pc.is_in(decisions.column("key"), value_set=keys.column("key"))).to_pylist()


def in_memory(new: pa.Table, index: NearDupIndex, cfg: DedupNearConfig) -> tuple[pa.Table, NearDupIndex]:
    """The in-memory reference: the batch's decisions against ``index``, and the next version's index
    (``index``'s rows, then the batch's with their representatives, under ``index``'s plan)."""
    decisions = incremental_decisions(new, index, cfg)
    rows = pa.concat_tables([index.rows, NearDupIndex.build(new, cfg, decisions).rows], promote_options="default")
    plan = {"masks": index.masks, "num_blocks": index.num_blocks, "max_distance": index.max_distance}
    return decisions, NearDupIndex.from_rows(rows.select(index.rows.column_names), cfg, **plan)


def test_chain_of_two_versions_partitioned_equals_in_memory_equals_brute_force(tmp_path):
    """v1, then b1 against v1 (version 2 = one more part), then b2 against version 2. Older rows
    are larger, so the brute-force reference over everything picks the same representatives."""
    cfg = DedupNearConfig(max_distance=4)
    fs = pafs.LocalFileSystem()
    v1, b1, b2 = three_batches(21)
    memory = NearDupIndex.build(v1, cfg, near_duplicate_decisions(v1, cfg))
    save_index(memory, fs, str(tmp_path / "v1"), num_buckets=8)
    d1, ext = decide_against(b1, PartitionedNearIndex.open(fs, str(tmp_path / "v1")), cfg)
    m1, memory2 = in_memory(b1, memory, cfg)
    ext.write(fs, str(tmp_path / "v2"))
    d2, _ = decide_against(b2, PartitionedNearIndex.open(fs, str(tmp_path / "v2")), cfg)
    m2, _ = in_memory(b2, memory2, cfg)
    assert d1.equals(m1) and d2.equals(m2)
    assert d1.to_pylist() == only(pa.Table.from_pylist(reference_decisions(pa.concat_tables([v1, b1]), 4)), b1)
    everything = pa.Table.from_pylist(reference_decisions(pa.concat_tables([v1, b1, b2]), 4))
    assert d2.to_pylist() == only(everything, b2)
    # the chain matched across versions: b2 rows joined b1 rows' and v1 rows' groups
    targets = set(d2.column("duplicate_of").to_pylist())
    assert targets & set(v1.column("key").to_pylist()) and targets & set(b1.column("key").to_pylist())


def test_a_small_batch_opens_only_the_buckets_its_band_keys_fall_into(tmp_path):
    cfg = DedupNearConfig(max_distance=4)
    fs = pafs.LocalFileSystem()
    table = planted_table(4000, seed=3)
    copies = near_duplicate_decisions(table, cfg).column("key").to_pylist()[-3:]  # planted copies, late keys
    is_new = pc.is_in(table.column("key"), value_set=pa.array(copies))
    old, new = table.filter(pc.invert(is_new)), table.filter(is_new)
    save_index(
        NearDupIndex.build(old, cfg, near_duplicate_decisions(old, cfg)), fs, str(tmp_path / "v1"), num_buckets=64
    )
    index = PartitionedNearIndex.open(fs, str(tmp_path / "v1"))
    got = index.decisions(new, cfg)
    assert got.num_rows >= 1
    assert got.equals(incremental_decisions(new, PartitionedNearIndex.open(fs, str(tmp_path / "v1")).load(), cfg))
    _, values = row_values(new, cfg)
    band_files = {p for p in index.opened if "/bands/" in p}
    allowed = {
        f"{j:04d}/{b:05d}"
        for j, m in enumerate(index.masks)
        for b in value_buckets(np.unique(values), int(m), 64).tolist()
    }
    assert {"/".join(p.rsplit("/", 2)[-2:]).removesuffix(".parquet") for p in band_files} <= allowed
    assert len(set(index.opened)) < index.num_files / 4, (len(set(index.opened)), index.num_files)


def finished_output(root, table: pa.Table, decisions: pa.Table) -> None:
    """A minimal finished curation output: a manifest (near-dup drops marked) and ``_SUCCESS``."""
    import pyarrow.parquet as pq

    from curation import output, schema

    dropped = set(decisions.column("key").to_pylist())
    keys = table.column("key").to_pylist()
    (root / output.MANIFEST).mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "key": keys,
                "sha256": [f"sha-{k}" for k in keys],
                "status": [schema.DROPPED if k in dropped else schema.KEPT for k in keys],
            }
        ),
        root / output.MANIFEST / "p0.parquet",
    )
    (root / output.SUCCESS_FILE).write_text("{}")


def test_dedup_against_goes_through_the_saved_partitioned_index(tmp_path):
    """The steps' path: a run saves its index (DedupContext.save_index), the next run with
    dedup.against opens it by its header, decides, and saves one more part; a third run against
    that equals the in-memory chain."""
    from curation import output
    from curation.config import DedupConfig
    from curation.dedup.steps import DedupContext, DedupNear

    cfg = DedupNearConfig(max_distance=4)
    fs = pafs.LocalFileSystem()
    table = planted_table(1500, seed=9)
    part = np.random.default_rng(9).integers(0, 3, table.num_rows)
    batches = [table.filter(pa.array(part == i)) for i in range(3)]
    memory, decided, against = None, [], None
    for i, batch in enumerate(batches):
        settings = DedupConfig(against=against)
        ctx = DedupContext.open(settings, cfg)
        assert (ctx.against_index is None) == (i == 0)
        assert i == 0 or isinstance(ctx.against_index, PartitionedNearIndex)
        got = DedupNear(cfg, settings).decide(batch, ctx)
        want, memory = (
            in_memory(batch, memory, cfg)
            if memory is not None
            else (near_duplicate_decisions(batch, cfg), NearDupIndex.build(batch, cfg, got))
        )
        assert got.equals(want)
        decided.append(got.num_rows)
        out = tmp_path / f"v{i}"
        ctx.save_index(fs, output.path(str(out), output.DEDUP_DIR, output.NEAR_INDEX_DIR))
        finished_output(out, batch, got)
        against = str(out)
    assert min(decided) > 20
    last = PartitionedNearIndex.open(fs, output.path(against, output.DEDUP_DIR, output.NEAR_INDEX_DIR))
    assert len(last.header["parts"]) == 3 and last.load().rows.equals(memory.rows)


def test_the_index_lives_on_s3(s3):  # noqa: F811  (the imported fixture)
    """Written to and searched on S3 (moto's server through pyarrow); the earlier version's part named by
    its s3:// URI, the index's own part relative to its folder."""
    cfg = DedupNearConfig()
    table = planted_table(1200, seed=4)
    part = np.random.default_rng(4).integers(0, 3, table.num_rows)
    v1, b1, b2 = (table.filter(pa.array(part == i)) for i in range(3))
    memory = NearDupIndex.build(v1, cfg, near_duplicate_decisions(v1, cfg))
    save_index(memory, s3, f"{BUCKET}/v1/near_index")
    d1, ext = decide_against(b1, PartitionedNearIndex.open(s3, f"{BUCKET}/v1/near_index"), cfg)
    m1, memory = in_memory(b1, memory, cfg)
    ext.write(s3, f"{BUCKET}/v2/near_index")
    v2 = PartitionedNearIndex.open(s3, f"{BUCKET}/v2/near_index")
    v1_part, v2_part = (p["uri"] for p in v2.header["parts"])  # the earlier output's by URI, its own relative
    assert v1_part.split("/")[:4] == ["s3:", "", BUCKET, "v1"] and v2_part == f"parts/{v2.header['parts'][1]['id']}"
    d2 = v2.decisions(b2, cfg)
    assert d1.equals(m1) and d2.equals(in_memory(b2, memory, cfg)[0]) and d2.num_rows > 20
