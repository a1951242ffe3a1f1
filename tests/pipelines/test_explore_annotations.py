"""The explorer's annotation lookup on an annotation output in the real layout (``evaluation.annotate.layout``):
written here with two shards' tables, as the annotate job names them, and a ``_SUCCESS`` record."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evaluation.annotate import layout
from pipelines.explorer.annotations import AnnotationLookup


@pytest.fixture
def annotations(tmp_path):
    root = tmp_path / "annotations-out"
    for shard, keys in (("000000-aa", ["a1", "a2"]), ("000001-bb", ["b1"])):
        path = layout.table_path(str(root), shard)
        (root / layout.ANNOTATIONS).mkdir(parents=True, exist_ok=True)
        table = pa.table(
            {
                "key": keys,
                "status": ["ok"] * len(keys),
                "pose_keypoints": [[[[1.0, 2.0]] * 17] for _ in keys],
                "seg_png": [b"\x89PNG" + b"0" * 10 for _ in keys],
            }
        )
        pq.write_table(table, path)
    (root / "_SUCCESS").write_text(json.dumps({"annotation_version_id": "ann1", "dataset_id": "ds1"}))
    return root


def test_a_kept_images_annotation_row_is_found_by_its_shard_and_key(annotations):
    lookup = AnnotationLookup(str(annotations), "ds1")
    assert lookup.version_id == "ann1"
    row = lookup.row("b1", "000001-bb.tar")
    assert row == {"key": "b1", "status": "ok", "pose_keypoints": "<list of 1 of 17>", "seg_png": "<14 bytes>"}
    assert lookup.row("a1", "000001-bb.tar") is None  # not in that shard's table
    assert lookup.row("a1", None) is None and lookup.row("a1", "999999-zz.tar") is None


def test_an_annotation_output_of_another_version_or_unfinished_is_refused(annotations, tmp_path):
    with pytest.raises(ValueError, match="annotates dataset version 'ds1', not 'other'"):
        AnnotationLookup(str(annotations), "other")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a finished annotation output"):
        AnnotationLookup(str(tmp_path / "empty"), "ds1")
