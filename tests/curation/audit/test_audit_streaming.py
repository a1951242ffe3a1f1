"""The audit streams the manifest: its per-batch aggregates equal the whole-table computation, and
what it holds does not grow with the manifest.

Versions are small finished outputs written here: the synthetic ones of ``benchmarks/audit_scale.py``
(the real manifest schema, person boxes, derived scores) and handmade ones for the diff's corner
cases. The whole-table side is computed here from all rows at once, as the audit did before.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from curation import output, schema
from curation.audit import charts, counts, diff, images, load_version, render_diff, render_report, report
from curation.stats import compute_stats
from infra import storage

REPO = Path(__file__).resolve().parents[3]
ROWS_PER_PART = 300


def bench():
    spec = importlib.util.spec_from_file_location("audit_scale", REPO / "benchmarks" / "audit_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """``(parts, tars) -> (A, B)``: the benchmark's two versions of ``parts`` manifest parts (their
    inputs in a tar per part, or in ``tars`` tars)."""
    gen, root, made = bench(), tmp_path_factory.mktemp("audit-streaming"), {}

    def versions(parts: int, tars: int | None = None):
        if (parts, tars) not in made:
            corpus, a, b = (str(root / f"{parts}-{tars}-{x}") for x in ("corpus", "a", "b"))
            gen.write_version(a, corpus, list(range(parts)), ROWS_PER_PART, gen.MIN_SIDE_A, False, tars)
            gen.write_version(b, corpus, [*range(parts - 1), parts], ROWS_PER_PART, gen.MIN_SIDE_B, True, tars)
            made[parts, tars] = (load_version(a), load_version(b))
        return made[parts, tars]

    return versions


# ---- the report: counts, histograms and samples equal the whole table's -------------------------


def whole_histogram(rows: list[dict], value, own: set[str], threshold, integer: bool) -> list[np.ndarray]:
    series: list[list[float]] = [[], [], []]
    for r in rows:
        x = value(r)
        if x is not None:
            series[0 if r["status"] == schema.KEPT else 1 if r["reason"] in own else 2].append(float(x))
    everything = np.concatenate([np.asarray(s) for s in series])
    bins = charts.bin_edges(everything.min(), everything.max(), threshold=threshold, integer=integer)
    return [np.histogram(s, bins)[0] for s in series]


def test_report_aggregates_equal_the_whole_table(synthetic):
    v, _ = synthetic(5)
    rows = v.rows  # the whole manifest, the reference
    assert len(v.parts) == 5 and len(rows) == 5 * ROWS_PER_PART
    t, samples, scores, people = report.profile(v, per_reason=7, kept=9)

    recounted = counts.recount(v, t)
    whole = compute_stats(
        pa.Table.from_pylist(rows),
        counts.funnel_spec(v.stats),
        samples_in_shards=0,
        shards=0,
        descriptions=v.stats["steps"],
    )
    assert recounted == whole and recounted["inputs"] == len(rows)
    assert t.removed == Counter((r["status"], r["reason"]) for r in rows if r["status"] != schema.KEPT)
    root = v.setting("input.uri", "")
    groups = Counter((counts.source_group(r["source"], root), r["status"]) for r in rows)
    assert {(g["group"], s): g[s] for g in t.by_source() for s in schema.STATUSES if g[s]} == dict(groups)

    owned = {s["step"]: set(s["removed"]) for s in v.stats["funnel"]}
    for (step, score), chart in zip(report.scores_of(v), scores):
        m = chart.measure
        want = whole_histogram(rows, score.value, owned.get(step, set()), m.threshold, score.integer)
        assert [c.tolist() for c in m.counts] == [c.tolist() for c in want], score.column
    assert {c.measure.name for c in scores} >= {"short_side", "aspect_ratio", "sharpness", "text_coverage"}
    count = people[0].measure
    assert [c.tolist() for c in count.counts] == [
        c.tolist() for c in whole_histogram(rows, lambda r: r["person_count"], {schema.NO_SALIENT_PERSON}, None, True)
    ]

    by_group: dict[tuple, list[dict]] = {}
    for r in rows:
        by_group.setdefault((r["status"], r["reason"]), []).append(r)
    assert len(by_group) >= 6
    for label, members in by_group.items():
        n = 9 if label[0] == schema.KEPT else 7
        assert [r["key"] for r in samples.rows(label)] == [r["key"] for r in images.sample(members, n)], label
        assert samples.rows(label)[0] == images.sample(members, 1)[0]  # whole rows, every column


def test_box_size_histogram_equals_the_whole_table(synthetic):
    from curation.filters.person import box_size

    v, _ = synthetic(3)
    _, _, _, people = report.profile(v, per_reason=1, kept=1)
    m = people[1].measure
    rule = images.box_rule(v.config, v.stats)
    sizes: list[list[float]] = [[], []]
    for r in v.rows:
        for box, score in zip(r["person_boxes"] or [], r["person_scores"] or []):
            if score >= rule.threshold:
                sizes[r["status"] != schema.KEPT].append(box_size(box, rule.measure))
    everything = np.asarray(sizes[0] + sizes[1])
    bins = charts.bin_edges(everything.min(), everything.max(), threshold=rule.min_box_size)
    assert np.array_equal(m.bins, bins) and sum(sizes, []) and m.threshold == rule.min_box_size
    assert [c.tolist() for c in m.counts] == [np.histogram(s, bins)[0].tolist() for s in sizes]


def test_binned_histogram_draws_what_the_values_histogram_draws():
    values = [("kept", [1.0, 2.5, 2.5, 7.0], "#2e7d32"), ("removed", [0.2, 9.0], "#ef6c00")]
    a = charts.histogram(values, title="t", xlabel="x", threshold=3.0, threshold_label="th")
    bins = charts.bin_edges(0.2, 9.0, threshold=3.0)
    counted = [(n, np.histogram(v, bins)[0], c) for n, v, c in values]
    assert charts.binned_histogram(counted, bins, title="t", xlabel="x", threshold=3.0, threshold_label="th") == a


# ---- the diff: a key-partitioned join equal to the whole-table diff ------------------------------


def whole_diff(a, b) -> dict:
    """The diff computed from both manifests whole (the audit's algorithm before it streamed)."""
    a_kept = {r["key"]: r for r in a.rows if r["status"] == schema.KEPT}
    b_kept = {r["key"]: r for r in b.rows if r["status"] == schema.KEPT}
    removed, added = sorted(set(a_kept) - set(b_kept)), sorted(set(b_kept) - set(a_kept))
    added_by_sha = {b_kept[k]["sha256"]: k for k in added if b_kept[k].get("sha256")}
    renamed = [(k, added_by_sha[a_kept[k]["sha256"]]) for k in removed if a_kept[k].get("sha256") in added_by_sha]
    gone = {x for pair in renamed for x in pair}

    def verdicts(keys, kept, other):
        by_key = {r["key"]: r for r in other.rows}
        by_sha: dict[str, dict] = {}
        for r in other.rows:
            if r.get("sha256"):
                by_sha.setdefault(r["sha256"], r)
        out = {}
        for k in keys:
            seen = by_key.get(k) or by_sha.get(kept[k].get("sha256") or "")
            out[k] = (seen["status"], seen["reason"]) if seen else (diff.ABSENT, None)
        return out

    return {
        "removed": verdicts([k for k in removed if k not in gone], a_kept, b),
        "added": verdicts([k for k in added if k not in gone], b_kept, a),
        "renamed": renamed,
        "both": len(set(a_kept) & set(b_kept)),
    }


def assert_diff_equals_whole(d: diff.VersionDiff, want: dict, per_reason: int) -> None:
    assert d.kept_in_both == want["both"] and d.renamed == want["renamed"] and d.renamed_total == len(want["renamed"])
    for side, rows_of in ((d.removals, d.a), (d.additions, d.b)):
        name = "removed" if side is d.removals else "added"
        expected = want[name]
        assert side.total == len(expected) and [c.key for c in side.listed] == sorted(expected)[: diff.TABLE_LIMIT]
        assert {c.key: (c.other_status, c.other_reason) for c in side.listed} == expected
        members: dict[tuple, list[str]] = {}
        for k, (status, reason) in expected.items():
            members.setdefault((status, reason or diff.NOT_IN_INPUT), []).append(k)
        assert {(g.status, g.reason): g.count for g in side.groups} == {g: len(ks) for g, ks in members.items()}
        kept_rows = {r["key"]: r for r in rows_of.rows}
        for g in side.groups:
            keys = sorted(members[(g.status, g.reason)])
            assert g.keys == keys[: diff.SUMMARY_KEYS]
            want_sample = images.sample([kept_rows[k] for k in keys], per_reason)
            assert [c.row for c in g.sample] == want_sample


def test_the_diff_of_the_synthetic_versions_equals_the_whole_table_diff(synthetic):
    a, b = synthetic(5)
    d = diff.diff_versions(a, b, per_reason=5, bucket_rows=40)  # 1,500 rows a side: two levels of buckets
    want = whole_diff(a, b)
    assert want["renamed"] and want["removed"] and want["added"]
    assert_diff_equals_whole(d, want, per_reason=5)
    gen = bench()
    planted = gen.planted_diff(list(range(5)), 5, ROWS_PER_PART)
    assert (d.removals.total, d.additions.total, d.renamed_total, d.kept_in_both) == (
        planted["removed"],
        planted["added"],
        planted["renamed"],
        planted["both"],
    )


def write_output(root: Path, rows: list[dict], parts: int, config: dict) -> str:
    """A finished output of handmade ``rows`` in ``parts`` manifest parts."""
    fs, base = storage.resolve(str(root))
    funnel = [("geometry", (schema.TOO_SMALL, schema.BAD_ASPECT_RATIO)), ("dedup.exact", (schema.EXACT_DUPLICATE,))]
    table = pa.Table.from_pylist(rows)
    for i, at in enumerate(np.array_split(np.arange(len(rows)), parts)):
        storage.write_parquet(fs, output.manifest_part_path(base, f"{i:06d}"), table.take(pa.array(at)))
    stats = compute_stats(table, funnel, samples_in_shards=0, shards=0, descriptions=[])
    done = {"dataset_id": root.name, "dataset_name": root.name, "job_digest": "x", "kept": stats["kept"]}
    storage.atomic_write_bytes(fs, output.path(base, output.STATS_FILE), json.dumps(stats).encode())
    storage.atomic_write_bytes(fs, output.path(base, output.CONFIG_FILE), json.dumps(config).encode())
    storage.atomic_write_bytes(fs, output.path(base, output.SUCCESS_FILE), json.dumps(done).encode())
    return str(root)


def row(key: str, status: str, reason: str | None = None, sha: str | None = "auto") -> dict:
    return {
        "partition": "p",
        "key": key,
        "source": f"/nowhere/{key}.jpg",
        "sha256": f"sha-of-{key}" if sha == "auto" else sha,
        "status": status,
        "reason": reason,
        "notes": [],
        "shard": "p.tar" if status == schema.KEPT else None,
    }


def handmade(tmp_path) -> tuple:
    k, d, e = schema.KEPT, schema.DROPPED, schema.ERROR
    a = [row(f"both{i:03d}", k) for i in range(120)] + [row(f"gone{i:03d}", k) for i in range(40)]
    b = [row(f"both{i:03d}", k) for i in range(120)]
    a += [row(f"small{i:03d}", k) for i in range(30)]
    b += [row(f"small{i:03d}", d, schema.TOO_SMALL) for i in range(30)]
    a += [row("moved", k, sha="S1"), row("copied", k, sha="S2"), row("nosha", k, sha=None), row("twice", k, sha="S3")]
    b += [row("moved-new", k, sha="S1"), row("copy-of-copied", d, schema.EXACT_DUPLICATE, sha="S2")]
    b += [row("twice-a", k, sha="S3"), row("twice-b", k, sha="S3")]  # A's "twice" renamed to the larger key
    a += [row("wide", d, schema.BAD_ASPECT_RATIO), row("broken", e, "not_an_image", sha=None)]
    b += [row("wide", k), row("broken", k), row("fresh", k), row("empty-sha", k, sha="")]
    config_a = {"geometry": {"min_short_side": 256}, "input": {"uri": "/nowhere"}}
    config_b = {"geometry": {"min_short_side": 400}, "input": {"uri": "/nowhere"}}
    return (
        load_version(write_output(tmp_path / "a", a, 4, config_a)),
        load_version(write_output(tmp_path / "b", b, 3, config_b)),
    )


@pytest.mark.parametrize("bucket_rows", [1_000_000, 10, 3])
def test_handmade_diff_corner_cases_equal_the_whole_table_diff(tmp_path, bucket_rows):
    a, b = handmade(tmp_path)
    d = diff.diff_versions(a, b, per_reason=4, bucket_rows=bucket_rows)
    want = whole_diff(a, b)
    assert want["renamed"] == [("moved", "moved-new"), ("twice", "twice-b")]
    assert want["removed"]["copied"] == (schema.DROPPED, schema.EXACT_DUPLICATE)  # B's verdict for its bytes
    assert want["removed"]["nosha"] == (diff.ABSENT, None) and want["added"]["twice-a"] == (schema.KEPT, None)
    assert_diff_equals_whole(d, want, per_reason=4)
    explained = {c.key: c.explained_by for c in d.removed}
    assert explained["small000"] == ("geometry.min_short_side",) and d.removals.total == 72
    page = render_diff(d, per_reason=4)
    assert 'data-name="renamed" data-value="2"' in page and 'id="renamed-table" data-total="2"' in page
    assert diff.diff_summary(d).count("    small0") == diff.SUMMARY_KEYS


# ---- memory: what the report and the diff hold does not grow with the manifest ------------------


POOLS: list = []  # every proxy pool made, kept alive: Arrow buffers it allocated may outlive the measure


def peak_bytes(fn) -> int:
    """Peak memory of ``fn()``: Python allocations (tracemalloc) plus Arrow buffers (a proxy pool).
    The cycle collector is off meanwhile, so cyclic garbage (matplotlib's figures) is the same in
    every measure instead of depending on when a collection happens to run."""
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    POOLS.append(pool)
    previous = pa.default_memory_pool()
    gc.collect()
    gc.disable()
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        fn()
        python = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(previous)
        gc.enable()
    return python + pool.max_memory()


def whole_rows(v) -> list[dict]:
    return pa.Table.from_batches(list(v.batches())).to_pylist()


@pytest.mark.slow  # ~20 s: four renders and four diffs under tracemalloc
def test_report_and_diff_memory_stays_flat_as_the_manifest_grows(synthetic, monkeypatch):
    """From 3 to 9 parts a version (inputs in 3 tars either way: the same source groups, so the same
    page) the peak grows by a small share of what holding the rows would add. The diff's per-image
    table (bounded by TABLE_LIMIT) is cut to fewer rows than the small diff lists."""
    monkeypatch.setattr(diff, "TABLE_LIMIT", 20)
    small, large = synthetic(3, 3), synthetic(9, 3)
    render_report(small[0], per_reason=3, kept=3)  # warm: fonts, imports, caches
    rows_growth = peak_bytes(lambda: whole_rows(large[0])) - peak_bytes(lambda: whole_rows(small[0]))

    def run_diff(a, b):
        return render_diff(diff.diff_versions(a, b, per_reason=3, bucket_rows=50), per_reason=3)

    report_growth = peak_bytes(lambda: render_report(large[0], per_reason=3, kept=3)) - peak_bytes(
        lambda: render_report(small[0], per_reason=3, kept=3)
    )
    diff_growth = peak_bytes(lambda: run_diff(*large)) - peak_bytes(lambda: run_diff(*small))
    assert rows_growth > 2_000_000  # 1,800 more rows, held whole
    assert report_growth < 0.1 * rows_growth and diff_growth < 0.1 * rows_growth, (
        report_growth,
        diff_growth,
        rows_growth,
    )


def test_the_synthetic_manifest_has_the_real_manifests_columns_and_row_size(run_a, synthetic):
    """The benchmark's versions against a real curation's manifest: same columns and types, and
    Arrow bytes per row of the columns the audit reads within a factor of 3."""
    real = load_version(run_a.output)
    fake, _ = synthetic(3)
    assert {f.name: f.type for f in fake.schema} == {f.name: f.type for f in real.schema}

    def per_row(v):
        table = pa.Table.from_batches(list(v.batches()))
        return table.nbytes / table.num_rows

    assert 1 / 3 < per_row(fake) / per_row(real) < 3, (per_row(fake), per_row(real))


def test_join_buckets_hold_at_most_max_rows_and_every_row_once(tmp_path):
    """Rows spilled by hash come back bucket by bucket, each row once, with the same key on both
    sides in the same bucket, at most ``max_rows`` a side, except rows of one key (never split)."""
    from curation.audit import join

    keys = [f"k{i}" for i in range(3000)] + ["hot"] * 200  # one key with more rows than a bucket
    schema = pa.schema([("key", pa.string()), (join.HASH, pa.uint64())])
    spilled = {}
    for side, ks in (("a", keys), ("b", keys[::2])):
        spill = join.Spill(tmp_path / side, schema)
        for i in range(0, len(ks), 500):
            spill.write(join.with_hash(pa.table({"key": ks[i : i + 500]}), ks[i : i + 500]))
        spilled[side] = spill.close()
    seen: dict[str, Counter] = {"a": Counter(), "b": Counter()}
    sizes = []
    for bucket in join.buckets(spilled, {"a": schema, "b": schema}, tmp_path / "b-work", max_rows=60):
        a_keys, b_keys = (set(bucket[s].column("key").to_pylist()) for s in ("a", "b"))
        assert b_keys <= a_keys  # a key's rows of both sides meet in one bucket
        for s in ("a", "b"):
            seen[s].update(bucket[s].column("key").to_pylist())
        sizes.append((bucket["a"].num_rows, "hot" in a_keys))
    assert seen["a"] == Counter(keys) and seen["b"] == Counter(keys[::2])
    assert max(n for n, hot in sizes if not hot) <= 60 and len(sizes) > 3000 // 60
    assert [n for n, hot in sizes if hot][0] >= 200  # the one key's rows stay together
    assert not any(tmp_path.joinpath("b-work").rglob("*.arrow"))  # each bucket's files deleted once read
