"""A step's rank column (``rank_*``) orders a duplicate family's copies after "original over
converted" and before resolution, in the Python rule and in the Arrow sort alike."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from curation.dedup import representative_sort_key
from curation.dedup.components import decisions_from_labels, meta_columns
from curation.dedup.steps import DedupContext, DedupNear, candidate_columns, run_dedup
from curation.recipe import CurationConfig
from curation.steps import Step


def _row(key: str, **kw) -> dict:
    return {"key": key, "width": 100, "height": 100, "converted": False, "input_bytes": 1000, **kw}


def test_a_rank_column_comes_after_converted_and_before_resolution():
    flawed_big = _row("a", width=400, height=400, input_bytes=90_000, rank_quality=1)
    fine = _row("z", rank_quality=0)
    assert representative_sort_key(fine) < representative_sort_key(flawed_big)
    converted_fine = {**fine, "key": "b", "converted": True}
    assert representative_sort_key(flawed_big) < representative_sort_key(converted_fine)
    unknown = {**flawed_big, "rank_quality": None}  # a null rank counts as 0
    assert representative_sort_key(unknown) < representative_sort_key(fine)
    assert representative_sort_key(unknown) == representative_sort_key({**flawed_big, "rank_quality": 0})


def test_arrow_ranking_equals_the_rule_with_two_rank_columns_and_nulls():
    rng = np.random.default_rng(1)
    n = 1500

    def maybe_null(values, share):
        return [None if rng.random() < share else int(v) for v in values]

    meta = pa.table(
        {
            "key": [f"r{i:05d}" for i in rng.permutation(n)],
            "width": pa.array(rng.choice([10, 20], n).astype(np.int32)),
            "height": pa.array(rng.choice([10, 20], n).astype(np.int32)),
            "converted": pa.array([bool(v) for v in rng.random(n) < 0.2]),
            "rank_b": pa.array(maybe_null(rng.integers(0, 3, n), 0.1), pa.int8()),
            "rank_a": pa.array(maybe_null(rng.integers(0, 2, n), 0.1), pa.int8()),
        }
    )
    assert meta_columns(meta.column_names)[-2:] == ["rank_a", "rank_b"]
    labels = rng.integers(0, 200, n)
    groups: dict[int, list[dict]] = {}
    for label, row in zip(labels, meta.to_pylist()):
        groups.setdefault(int(label), []).append(row)
    expected = []
    for members in groups.values():
        rep = min(members, key=representative_sort_key)["key"]
        expected += [
            {"key": m["key"], "reason": "near_duplicate", "duplicate_of": rep, "duplicate_group": "g:" + rep}
            for m in members
            if m["key"] != rep
        ]
    got = decisions_from_labels(meta, labels, "near_duplicate", "g:").to_pylist()
    assert got == sorted(expected, key=lambda d: d["key"])


def test_near_dedup_reads_the_rank_columns_earlier_steps_wrote():
    steps = [DedupNear.from_config(CurationConfig())]
    written = {"phash", "phash_mirror", "width", "height", "converted", "input_bytes", "rank_quality", "other"}
    columns, absent = candidate_columns(steps, written)
    assert "rank_quality" in columns and "other" not in columns and not absent
    same_hash = "8f0f0f0f0f0f0f0f"
    table = pa.table(
        {
            "key": ["a_big_blurred", "z_sharp"],
            "partition": ["p", "p"],
            "phash": [same_hash, same_hash],
            "phash_mirror": [same_hash, same_hash],
            "width": pa.array([800, 400], pa.int32()),
            "height": pa.array([600, 300], pa.int32()),
            "rank_quality": pa.array([1, 0], pa.int8()),
        }
    )
    decisions = run_dedup(steps, table, DedupContext()).to_pylist()
    assert [(d["key"], d["duplicate_of"]) for d in decisions] == [("a_big_blurred", "z_sharp")]


def test_a_rank_column_must_be_an_integer():
    with pytest.raises(TypeError, match=r"rank column 'rank_quality' must be an integer type, not float"):
        type("FloatRank", (Step,), {"section": "x", "fields": [pa.field("rank_quality", pa.float32())]})
