"""The near-dup index's own band plan (``incremental.index_plan``): chosen for storage and a
later batch's query cost, apart from the in-run search's; any plan keeps the index search exact,
and an index appended to keeps the plan its header records."""

import math

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from test_dedup_index_store import only, three_batches
from test_dedup_near import reference_decisions

from curation.dedup.incremental import NearDupIndex, index_plan, index_workload
from curation.dedup.index_store import PartitionedNearIndex, decide_against, save_index
from curation.dedup.near import DedupNearConfig, near_duplicate_decisions, row_values


def test_the_index_plan_grows_with_the_index_and_stays_bounded():
    sizes = [10**k for k in range(3, 12)]
    plans = [index_plan(n, DedupNearConfig(max_distance=4)) for n in sizes]
    shapes = [(len(p.masks()), min(bin(int(m)).count("1") for m in p.masks())) for p in plans]
    assert [bits for _, bits in shapes] == sorted(bits for _, bits in shapes)  # longer bands as it grows
    assert all(bands <= 126 for bands, _ in shapes)  # bounded: <= C(9, 4) bands up to 1e11
    # covering designs store fewer postings than all subsets of the same band length at every size
    for p in plans:
        assert p.bands is not None and len(p.masks()) < math.comb(p.num_blocks, 4)
    # the chosen plan is the cheapest under the stated model, of every plan with the same design search
    for n in sizes:
        workload = index_workload(n)
        cost = workload.cost(index_plan(n, DedupNearConfig(max_distance=4)), None)
        for b in range(5, 12):
            assert cost <= workload.cost(index_plan(n, DedupNearConfig(max_distance=4, index_num_blocks=b)), None)


def test_an_index_stores_its_covering_design_and_keeps_it_when_extended(tmp_path):
    """The default plan is a covering design (fewer postings than all subsets); the header records
    its masks, and an extension keeps them; decisions against it equal brute force."""
    cfg = DedupNearConfig(max_distance=4)
    fs = pafs.LocalFileSystem()
    v1, b1, b2 = three_batches(37)
    memory = NearDupIndex.build(v1, cfg, near_duplicate_decisions(v1, cfg))
    expected = index_plan(len(row_values(memory.rows, cfg)[1]), cfg).masks()
    np.testing.assert_array_equal(memory.masks, expected)
    assert len(expected) < math.comb(memory.num_blocks, 4)
    header = save_index(memory, fs, str(tmp_path / "v1"), num_buckets=8)
    assert header["masks"] == [str(int(m)) for m in expected]
    d1, ext = decide_against(b1, PartitionedNearIndex.open(fs, str(tmp_path / "v1")), cfg)
    assert ext.write(fs, str(tmp_path / "v2"))["masks"] == header["masks"]
    assert d1.num_rows > 10
    assert d1.to_pylist() == only(pa.Table.from_pylist(reference_decisions(pa.concat_tables([v1, b1]), 4)), b1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_distance": 4, "index_num_blocks": 4}, "index_num_blocks"),
        ({"max_distance": 8, "index_num_blocks": 40}, "bands"),
        ({"index_num_blocks": 6.0}, "index_num_blocks"),
    ],
)
def test_invalid_index_plans_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DedupNearConfig(**kwargs)


@pytest.mark.parametrize("blocks", [5, 9])
def test_decisions_through_an_index_with_a_non_default_plan_equal_brute_force(tmp_path, blocks):
    """v1 indexed with B = ``blocks``; b1 against it; the extension (asked for another plan) keeps
    v1's plan; b2 against version 2 equals the whole-table brute force."""
    cfg = DedupNearConfig(max_distance=4, index_num_blocks=blocks)
    fs = pafs.LocalFileSystem()
    v1, b1, b2 = three_batches(31)
    memory = NearDupIndex.build(v1, cfg, near_duplicate_decisions(v1, cfg))
    header = save_index(memory, fs, str(tmp_path / "v1"), num_buckets=8)
    assert header["num_blocks"] == blocks and len(header["masks"]) == math.comb(blocks, 4)
    assert header["parts"][0]["postings"] == math.comb(blocks, 4) * len(
        set(zip(v1.column("key").to_pylist(), v1.column("phash").to_pylist()))
        | set(zip(v1.column("key").to_pylist(), v1.column("phash_mirror").to_pylist()))
    )
    other = DedupNearConfig(max_distance=4, index_num_blocks=6 if blocks != 6 else 7)
    d1, ext = decide_against(b1, PartitionedNearIndex.open(fs, str(tmp_path / "v1")), other)
    v2 = ext.write(fs, str(tmp_path / "v2"))
    assert v2["num_blocks"] == blocks and v2["masks"] == header["masks"]
    d2, _ = decide_against(b2, PartitionedNearIndex.open(fs, str(tmp_path / "v2")), cfg)
    assert d1.to_pylist() == only(pa.Table.from_pylist(reference_decisions(pa.concat_tables([v1, b1]), 4)), b1)
    assert d2.to_pylist() == only(pa.Table.from_pylist(reference_decisions(pa.concat_tables([v1, b1, b2]), 4)), b2)
    assert d1.num_rows > 10 and d2.num_rows > 10
