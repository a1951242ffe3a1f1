import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dedup_fixtures import BASE, flip_bits, planted_table, rows, shuffled

from curation.dedup.incremental import NearDupIndex, incremental_decisions
from curation.dedup.near import DedupNearConfig, near_duplicate_decisions


def split(table: pa.Table, seed: int, new_fraction: float = 0.3) -> tuple[pa.Table, pa.Table]:
    """An existing version and a new batch, with duplicates inside each and across them."""
    is_new = np.random.default_rng(seed).random(table.num_rows) < new_fraction
    return table.filter(pa.array(~is_new)), table.filter(pa.array(is_new))


def restricted(decisions: pa.Table, keys: pa.Table) -> pa.Table:
    return decisions.filter(pc.is_in(decisions.column("key"), value_set=keys.column("key")))


@pytest.mark.parametrize("seed, t", [(0, 4), (1, 6), (2, 2)])
def test_incremental_equals_full_recomputation_with_existing_rows_preferred(seed, t):
    cfg = DedupNearConfig(max_distance=t)
    old, new = split(planted_table(2500, seed=seed, max_flips=t + 1), seed)
    index = NearDupIndex.build(old, cfg, near_duplicate_decisions(old, cfg))
    inc = incremental_decisions(new, index, cfg)
    full = near_duplicate_decisions(pa.concat_tables([old, new]), cfg, prefer=set(old.column("key").to_pylist()))
    assert inc.num_rows > 100
    assert inc.equals(restricted(full, new))
    # some new rows were matched to existing ones, and existing rows are never dropped
    assert set(inc.column("duplicate_of").to_pylist()) & set(old.column("key").to_pylist())
    assert not set(inc.column("key").to_pylist()) & set(old.column("key").to_pylist())


def test_incremental_equals_plain_full_recomputation_when_old_copies_are_larger():
    cfg = DedupNearConfig()
    table = planted_table(2500, seed=5)
    old, new = split(table, 5)
    old = old.set_column(old.schema.get_field_index("width"), "width", pa.array(np.full(old.num_rows, 4000, np.int32)))
    inc = incremental_decisions(new, old, cfg, existing_decisions=near_duplicate_decisions(old, cfg))
    full = near_duplicate_decisions(pa.concat_tables([old, new]), cfg)
    assert inc.equals(restricted(full, new))


def test_index_save_load_and_extension(tmp_path):
    import pyarrow.fs as pafs

    from curation.dedup.index_store import PartitionedNearIndex, decide_against, save_index

    cfg = DedupNearConfig()
    fs = pafs.LocalFileSystem()
    table = planted_table(3000, seed=7)
    v1, rest = split(table, 7, new_fraction=0.5)
    b1, b2 = split(rest, 8, new_fraction=0.5)
    index = NearDupIndex.build(v1, cfg, near_duplicate_decisions(v1, cfg))
    save_index(index, fs, str(tmp_path / "v1"))
    loaded = PartitionedNearIndex.open(fs, str(tmp_path / "v1")).load()
    assert loaded.rows.equals(index.rows)
    d1 = incremental_decisions(b1, loaded, cfg)
    assert d1.equals(incremental_decisions(shuffled(b1, 3), index, cfg))
    # version 2 = v1 + b1 (one more part); b2 against it equals b2 against an index built from scratch
    _, extension = decide_against(b1, PartitionedNearIndex.open(fs, str(tmp_path / "v1")), cfg)
    extension.write(fs, str(tmp_path / "v2"))
    v2 = PartitionedNearIndex.open(fs, str(tmp_path / "v2"))
    assert len(v2.header["parts"]) == 2
    scratch = NearDupIndex.build(
        pa.concat_tables([v1, b1]), cfg, pa.concat_tables([near_duplicate_decisions(v1, cfg), d1])
    )
    assert v2.load().rows.equals(scratch.rows)
    assert v2.decisions(b2, cfg).equals(incremental_decisions(b2, scratch, cfg))


def test_index_settings_must_match():
    table = planted_table(200, seed=1)
    index = NearDupIndex.build(table, DedupNearConfig(max_distance=4))
    other = planted_table(50, seed=2, key_prefix="n")
    incremental_decisions(other, index, DedupNearConfig(max_distance=2))  # a smaller distance stays exact
    with pytest.raises(ValueError, match="rebuild"):
        incremental_decisions(other, index, DedupNearConfig(max_distance=6))
    with pytest.raises(ValueError, match="match_mirrored"):
        incremental_decisions(other, index, DedupNearConfig(match_mirrored=False))
    with pytest.raises(ValueError, match="reuse keys"):
        incremental_decisions(table.slice(0, 5), index, DedupNearConfig())


def test_a_new_row_bridging_two_old_groups_joins_the_better_one():
    o1, o2 = BASE, flip_bits(BASE, [0, 1, 2, 3, 4, 5, 6, 7])  # 8 bits apart: two old groups
    old = rows(("o1", o1, 100, 100, None), ("o2", o2, 300, 300, None), ("o1b", flip_bits(o1, [60]), 50, 50, None))
    new = rows(("n", flip_bits(BASE, [0, 1, 2, 3]), 999, 999, 0.9), ("m", BASE ^ 0xFFFF_FFFF, 10, 10, None))
    cfg = DedupNearConfig()
    old_decisions = near_duplicate_decisions(old, cfg)
    assert [(d["key"], d["duplicate_of"]) for d in old_decisions.to_pylist()] == [("o1b", "o1")]
    inc = incremental_decisions(new, old, cfg, existing_decisions=old_decisions).to_pylist()
    assert inc == [{"key": "n", "reason": "near_duplicate", "duplicate_of": "o2", "duplicate_group": "phash:o2"}]
    full = near_duplicate_decisions(pa.concat_tables([old, new]), cfg, prefer={"o1", "o2", "o1b"}).to_pylist()
    assert [(d["key"], d["duplicate_of"]) for d in full] == [("n", "o2"), ("o1", "o2"), ("o1b", "o2")]


def test_an_earlier_version_without_a_saved_index_is_refused(tmp_path):
    """An output with no saved near-dup index (curated without near dedup) is not searched for near
    duplicates: the run is refused in one line naming what to do, never rebuilt from its manifest."""
    import pyarrow.parquet as pq

    from curation import output, schema
    from curation.config import DedupConfig
    from curation.dedup.steps import DedupContext

    (tmp_path / output.MANIFEST).mkdir()
    manifest = pa.table({"key": ["a"], "sha256": ["0" * 64], "status": [schema.KEPT]})
    pq.write_table(manifest, tmp_path / output.MANIFEST / "p0.parquet")
    (tmp_path / output.SUCCESS_FILE).write_text("{}")
    with pytest.raises(ValueError, match=r"has no near-dup index .*dedup\.near\.enabled=false") as err:
        DedupContext.open(DedupConfig(against=str(tmp_path)), DedupNearConfig())
    assert "\n" not in str(err.value)
