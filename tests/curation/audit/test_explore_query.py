"""The explorer's query layer on a version of 1e5 rows (10 manifest parts of 10,000).

The version is written by ``benchmarks/audit_scale.py``'s generator (the real manifest schema,
stats.json, config.yaml and _SUCCESS of a finished output; no pixels). Every answer of
``ManifestQuery`` is checked against the same rows read here with pyarrow and filtered, sorted
and paged in Python, independently of the SQL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import pyarrow.dataset as pads
import pytest

from benchmarks.audit_scale import MIN_SIDE_A, MIN_SIDE_B, write_version
from curation.audit.explore_diff import FateChanges
from curation.audit.explore_filters import BOX_SIZE, RANDOM, QueryError, parse_gallery
from curation.audit.explore_index import HEADER_FILE
from curation.audit.explore_query import ExploreConfig, ManifestQuery
from curation.audit.loading import load_version
from curation.filters.person import box_size

ROWS, PART_ROWS = 100_000, 10_000
PAGE = 48


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore-1e5")
    corpus = str(root / "corpus")
    write_version(str(root / "a"), corpus, list(range(ROWS // PART_ROWS)), PART_ROWS, MIN_SIDE_A, renamed=False)
    return load_version(str(root / "a")), root


@pytest.fixture(scope="module")
def mq(version) -> ManifestQuery:
    v, root = version
    return ManifestQuery(v, ExploreConfig(cache_dir=str(root / "cache"), count_limit=5_000))


@pytest.fixture(scope="module")
def rows(version) -> list[dict]:
    """The manifest in its own order: parts by path, rows as written (read here with pyarrow)."""
    v, _ = version
    columns = ["key", "status", "reason", "source", "sharpness", "person_boxes", "person_scores", "duplicate_of"]
    return [r for part in v.parts for r in pads.dataset(part).to_table(columns=columns).to_pylist()]


def ask(mq: ManifestQuery, **params) -> tuple[list[str], tuple[int, bool], bool]:
    q = parse_gallery({k.replace("__", "."): str(v) for k, v in params.items()}, mq.vocab, PAGE, 480)
    page = mq.page(q)
    return [r["key"] for r in page.rows], mq.count(q), page.has_next


def test_the_vocabulary_is_the_versions_own(mq, version, rows):
    v, _ = version
    assert list(mq.vocab.steps) == [e["step"] for e in v.stats["funnel"] if e["step"] != "other"]
    assert {r["reason"] for r in rows if r["reason"]} <= mq.vocab.reasons
    ranges = mq.vocab.ranges
    thresholds = {d["name"]: d for d in v.stats["steps"]}
    assert ranges["sharpness"].threshold == thresholds["quality"]["min_sharpness"]
    assert ranges["text_coverage"].step == "content.text" and ranges["person_count"].integer
    assert ranges[BOX_SIZE].threshold == thresholds["detector"]["min_box_size"]
    assert "short_side" not in ranges and "aspect_ratio" not in ranges  # derived in Python only: not offered
    assert {"width", "height", "input_bytes"} <= set(ranges)


def test_a_reasons_page_1_and_page_1000_are_its_rows_in_manifest_order(mq, rows):
    expected = [r["key"] for r in rows if r["reason"] == "no_salient_person"]
    assert len(expected) > 1000 * 10
    keys, (n, exact), more = ask(mq, reason="no_salient_person")
    assert keys == expected[:PAGE] and more and (n, exact) == (len(expected), True)
    keys, _, more = ask(mq, reason="no_salient_person", page=1000, page_size=10)
    assert keys == expected[9990:10000] and more
    last = math.ceil(len(expected) / 10)
    keys, _, more = ask(mq, reason="no_salient_person", page=last, page_size=10)
    assert keys == expected[(last - 1) * 10 :] and not more
    assert ask(mq, reason="no_salient_person", page=last + 1, page_size=10)[:3:2] == ([], False)


def test_a_step_is_the_reasons_it_set_and_status_filters_combine(mq, rows, version):
    v, _ = version
    owned = next(set(e["removed"]) for e in v.stats["funnel"] if e["step"] == "geometry")
    expected = [r["key"] for r in rows if r["reason"] in owned]
    keys, (n, exact), _ = ask(mq, step="geometry", page_size=480)
    assert keys == expected[:480] and (n, exact) == (len(expected), True)
    errors = [r["key"] for r in rows if r["status"] == "error"]
    keys, (n, _), _ = ask(mq, status="error", page_size=480)
    assert keys == errors[:480] and n == len(errors)
    assert ask(mq, status="kept", reason="too_small")[:2] == ([], (0, True))


def test_a_score_range_from_one_source(mq, rows, version):
    v, _ = version
    prefix = v.setting("input.uri") + "/00003.tar#"
    expected = [r["key"] for r in rows if r["source"].startswith(prefix) and 10 <= (r["sharpness"] or -1) <= 12]
    keys, (n, exact), _ = ask(mq, source="00003.tar", min__sharpness=10, max__sharpness=12, page_size=480)
    assert 0 < len(expected) and keys == expected[:480] and (n, exact) == (len(expected), True)
    low, high = prefix[:-1] + "#", prefix[:-1] + "0"
    assert mq.index.parts_with_sources(low, high) == [v.parts[3]]  # only the part holding that tar is read
    assert ask(mq, source="00003.ta")[:2] == ([], (0, True))  # a source is a folder or file, not a string prefix
    below = [r["key"] for r in rows if r["sharpness"] is not None and r["sharpness"] <= 0.5]
    keys, _, _ = ask(mq, max__sharpness=0.5)  # an open range
    assert keys == below[:PAGE]


def test_counts_beyond_count_limit_say_so(mq, rows):
    kept = sum(r["status"] == "kept" and (r["sharpness"] or 0) >= 1 for r in rows)
    assert kept > 5_000
    _, (n, exact), _ = ask(mq, status="kept", min__sharpness=1)
    assert (n, exact) == (5_000, False)


def test_sorted_by_a_score_and_at_random(mq, rows):
    dropped = [r for r in rows if r["status"] == "dropped" and r["sharpness"] is not None]
    by_score = sorted(dropped, key=lambda r: (-r["sharpness"], r["key"]))
    keys, _, _ = ask(mq, status="dropped", sort="-sharpness", page=3, page_size=20)
    assert keys == [r["key"] for r in by_score[40:60]]
    at_random = sorted(
        (r["key"] for r in rows if r["reason"] == "text"), key=lambda k: hashlib.sha1(k.encode()).digest()
    )
    keys, _, _ = ask(mq, reason="text", sort=RANDOM)
    assert keys == at_random[:PAGE]


def test_the_largest_person_box_is_measured_as_the_detector_rule_does(mq, rows, version):
    v, _ = version
    rule = next(d for d in v.stats["steps"] if d["name"] == "detector")

    def largest(r):
        boxes = zip(r["person_boxes"] or [], r["person_scores"] or [])
        sizes = [box_size(b, rule["box_size_measure"]) for b, s in boxes if s >= rule["score_threshold"]]
        return max(sizes) if sizes else None

    expected = [r["key"] for r in rows if (largest(r) or -1) >= 1100]
    keys, (n, _), _ = ask(mq, **{"min__" + BOX_SIZE: 1100, "page_size": 480})
    assert 0 < len(expected) < 5_000 and keys == expected[:480] and n == len(expected)


def test_one_image_and_its_family_read_only_the_parts_that_hold_them(mq, rows):
    member = next(r for r in rows if r["duplicate_of"] and r["status"] == "dropped")
    assert len(mq.index.parts_holding([member["key"]])) == 1  # the generator's parts hold disjoint key ranges
    got = mq.row(member["key"])
    assert got["key"] == member["key"] and got["source"] == member["source"] and "clip_embedding" not in got
    assert mq.row("no-such-key") is None
    rep = member["duplicate_of"]
    family = mq.family(got)
    expected = sorted(r["key"] for r in rows if r["duplicate_of"] == rep)
    assert family.representative["key"] == rep and [m["key"] for m in family.members] == expected
    assert family.total == len(expected)
    assert mq.family(mq.row(rep)) == family  # the same family seen from its representative
    named = {r["duplicate_of"] for r in rows if r["duplicate_of"]}
    loner = next(r for r in rows if not r["duplicate_of"] and r["key"] not in named)
    assert mq.family(mq.row(loner["key"])) is None


def test_the_index_is_built_once_and_again_when_the_parts_change(version):
    v, root = version
    cfg = ExploreConfig(cache_dir=str(root / "cache-rebuilt"))
    first = ManifestQuery(v, cfg)
    header = first.index.folder / HEADER_FILE
    stamp = header.stat().st_mtime_ns
    again = ManifestQuery(v, cfg)
    assert again.index.header == first.index.header and header.stat().st_mtime_ns == stamp
    assert again.index.header["rows"] == ROWS and again.index.header["parts"] == ROWS // PART_ROWS
    fewer = ManifestQuery(dataclasses.replace(v, parts=v.parts[:-1]), cfg)
    assert fewer.index.header["rows"] == ROWS - PART_ROWS and header.stat().st_mtime_ns != stamp


@pytest.mark.parametrize(
    "params, message",
    [
        ({"reason": "nope"}, "reason: 'nope' is not a reason"),
        ({"reason": "x' OR 1=1 --"}, "is not a reason"),
        ({"step": "nope"}, "step: 'nope' is not a step"),
        ({"status": "gone"}, "status: 'gone' is not a status"),
        ({"min.sharpness": "abc"}, "min.sharpness: 'abc' is not a number"),
        ({"min.sharpness": "nan"}, "not a finite number"),
        ({"min.sharpness": "5", "max.sharpness": "1"}, "min.sharpness = 5 is above max.sharpness = 1"),
        ({"min.no_such_column": "1"}, "'no_such_column' is not a score or numeric column"),
        ({"page": "abc"}, "page: 'abc' is not a whole number"),
        ({"page": "0"}, "page: '0' is not a whole number"),
        ({"page_size": "100000"}, "page_size: 100000 is more than 480"),
        ({"sort": "-nope"}, "sort: '-nope' is neither"),
        ({"source": "../../etc"}, "is a path outside the version"),
        ({"source": "/etc/passwd"}, "is a path outside the version"),
        ({"source": "file:///etc/passwd"}, "is a path outside the version"),
        ({"source": "a\x00b"}, "control characters"),
        ({"reason": "..\\..\\windows"}, "is a path outside the version"),
        ({"colour": "red"}, "unknown parameter 'colour'"),
        ({"source": "x" * 2000}, "longer than 1024 characters"),
    ],
)
def test_bad_parameters_are_refused_with_the_reason(mq, params, message):
    with pytest.raises(QueryError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_gallery(params, mq.vocab, PAGE, 480)


def test_a_source_is_a_literal_never_sql(mq):
    keys, (n, _), _ = ask(mq, source="a' OR '1'='1")
    assert keys == [] and n == 0


def test_fate_changes_between_two_versions_and_why(version, tmp_path):
    v, root = version
    parts = list(range(ROWS // PART_ROWS))
    write_version(str(tmp_path / "b"), str(root / "corpus"), parts, PART_ROWS, MIN_SIDE_B, renamed=False)
    b = load_version(str(tmp_path / "b"))
    mq = ManifestQuery(b, ExploreConfig(cache_dir=str(tmp_path / "cache")))
    changes = FateChanges(mq.db, v, b, mq.folder)

    def fates(x):
        t = pads.dataset(list(x.parts)).to_table(columns=["key", "status", "reason"]).to_pylist()
        return {r["key"]: (r["status"], r["reason"]) for r in t}

    fa, fb = fates(v), fates(b)
    expected = {k for k in fa if fa[k] != fb[k]}
    assert changes.total == len(expected) > 0
    group = changes.group("kept", None, "dropped", "too_small")
    kept_then_small = sorted(k for k in expected if fa[k] == ("kept", None) and fb[k] == ("dropped", "too_small"))
    assert group.count == len(kept_then_small) and group.explained_by == ("geometry.min_short_side",)
    assert changes.keys(group, 0, 100) == kept_then_small[:100]
    assert changes.fate(kept_then_small[0]) == ("kept", None, "dropped", "too_small")
    assert changes.fate(next(k for k in fa if k not in expected)) is None
