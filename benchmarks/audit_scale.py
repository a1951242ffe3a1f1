"""Peak memory of the audit (report and version diff) as the manifest grows: 1e5 and 1e6 rows.

    python benchmarks/audit_scale.py --sizes 1e5 1e6      # the issue's two sizes
    python benchmarks/audit_scale.py --smallest           # 2e3 rows only (the smoke test's run)

Per size n, two finished curation outputs are written with metadata only (no shard, no input
file): version A, n rows in Parquet manifest parts of ``--rows-per-part`` rows with the real
manifest schema (the columns the recipe's decode, geometry, quality, person, text and clusters
steps write, then the decision's: ``manifest_schema``) and stats.json / config.yaml / _SUCCESS as the pipeline
writes them (funnel and step descriptions from ``curation.recipe.HUMANS1B``); and version B, the
same corpus with ``geometry.min_short_side`` raised from 256 to 400, its last part's inputs gone,
a new part of inputs and 1% of A's kept images under a new key (same SHA-256). Outcomes are
drawn per row: ~1% errors, drops by size, aspect, exact and near duplicate, person and text.

Then each measured step runs in a fresh process of its own, so each peak RSS (``ru_maxrss``) is
its own: the report of A (``render_report``: HTML written, galleries of placeholders since no
pixels exist), the diff A -> B (``diff_versions`` + ``render_diff`` + ``diff_summary``), and the
fair baseline, what the audit did before whatever came next: read the whole manifest into one
table (``CuratedOutput.read_manifest``, the columns the audit reads; the old audit then also made
Python rows of it, so its real peak was higher). Each line checks the page against the planted
counts (totals, and the diff's added / removed / renamed) and prints wall time, peak RSS, and
the RSS right after imports (the floor every process pays). Between sizes: the growth of each
peak RSS, against the growth of n. Results: docs/results/scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

STEPS = ("decode", "geometry", "quality", "detector", "content.text")  # the demo run's column writers
CLUSTER_LEVELS = 2  # the demo's clusters step: cluster_l0 and cluster_l1 on every kept sample
MIN_SIDE_A, MIN_SIDE_B = 256, 400
RENAMED_SHARE = 0.01


def manifest_schema():
    """The manifest's columns for a run of ``STEPS``: what those steps write, less what never reaches
    the manifest (pixels, byte references, transient columns), then the decision's columns."""
    import pyarrow as pa

    from curation import schema
    from curation.clusters import level_column
    from curation.recipe import HUMANS1B

    left_out = {*schema.PAYLOAD_COLUMNS, *schema.REFERENCE_COLUMNS, *schema.TRANSIENT_COLUMNS}
    by_name = {c.name: c for c in HUMANS1B.steps}
    fields = [f for step in STEPS for f in by_name[step].fields if f.name not in left_out]
    fields += [pa.field(level_column(i), pa.int32()) for i in range(CLUSTER_LEVELS)]
    return pa.schema(fields + [f for f in schema.DECISION_FIELDS if f.name not in {g.name for g in fields}])


def _hex(rng: np.random.Generator, n: int, width: int) -> list[str]:
    return [f"{x:0{width}x}" for x in rng.integers(0, 1 << 62, size=(n,), dtype=np.int64)]


def outcome_draws(part: int, rows: int) -> dict[str, np.ndarray]:
    """Per row of a part, the same in both versions: sizes, scores and which step would drop it."""
    rng = np.random.default_rng(1000 + part)
    draw = rng.random(rows)
    w, h = rng.integers(180, 2400, rows), rng.integers(180, 2400, rows)
    return {
        "error": draw < 0.01,
        "aspect": (draw >= 0.01) & (draw < 0.03),
        "exact": (draw >= 0.03) & (draw < 0.06),
        "near": (draw >= 0.06) & (draw < 0.08),
        "person": (draw >= 0.08) & (draw < 0.2),
        "text": (draw >= 0.2) & (draw < 0.23),
        "width": np.where((draw >= 0.01) & (draw < 0.03), w * 4, w),
        "height": h,
        "sha_seed": rng.integers(0, 1 << 62, rows, dtype=np.int64),
        "rng": rng,
    }


def reasons(d: dict, min_side: int) -> list:
    """The reason each row ends with (None: kept), in the pipeline's order."""
    short = np.minimum(d["width"], d["height"])
    out = np.full(len(short), None, dtype=object)
    for mask, reason in (
        (d["text"], "text"),
        (d["person"], "no_salient_person"),
        (d["near"], "near_duplicate"),
        (d["exact"], "exact_duplicate"),
        (d["aspect"], "aspect_ratio"),
        (short < min_side, "too_small"),
        (d["error"], "not_an_image"),
    ):
        out[mask] = reason
    return list(out)


def _boxes(rng: np.random.Generator, decoded: np.ndarray, weak: np.ndarray, w, h) -> tuple[list, list]:
    """0-3 person boxes per decoded row (1-3 and larger, better-scored ones unless ``weak``)."""
    k = np.where(decoded, rng.integers(0, 4, len(decoded)) + ~weak, 0).clip(0, 3)
    row = np.repeat(np.arange(len(k)), k)
    x1, y1 = rng.random(len(row)) * w[row] * 0.5, rng.random(len(row)) * h[row] * 0.5
    bh = rng.random(len(row)) * h[row] * np.where(weak[row], 0.2, 0.5) + 10
    score = rng.random(len(row)) * np.where(weak[row], 0.4, 0.7) + np.where(weak[row], 0.0, 0.3)
    flat = np.stack([x1, y1, x1 + bh * 0.4, y1 + bh], axis=1).astype(np.float32).tolist()
    scores = score.astype(np.float32).tolist()
    ends = np.cumsum(k)
    starts = ends - k
    boxes = [flat[s:e] if ok else None for s, e, ok in zip(starts, ends, decoded)]
    return boxes, [scores[s:e] if ok else None for s, e, ok in zip(starts, ends, decoded)]


def part_columns(
    corpus: str, part: int, rows: int, min_side: int, renamed: np.ndarray | None, tars: int | None = None
) -> dict:
    """One manifest part's values (version B passes ``renamed``: rows kept under a new key), read from
    the part's own input tar (or, given ``tars``, from one of that many)."""
    tar = part if tars is None else part % tars
    d = outcome_draws(part, rows)
    rng, why = d["rng"], reasons(d, min_side)
    decoded = ~d["error"]
    sha = [f"{s:016x}" * 4 for s in d["sha_seed"]]
    for i in np.flatnonzero(d["exact"])[1:]:
        sha[i] = sha[i - 1]  # an exact duplicate carries its original's bytes
    ids = [f"p{part:05d}_{i:06d}" for i in range(rows)]
    keys = [f"{x}-{s[:12]}" for x, s in zip(ids, sha)]
    names = [f"{x}.jpg" for x in ids]
    if renamed is not None:
        for i in np.flatnonzero(renamed):
            keys[i], names[i] = f"{ids[i]}m-{sha[i][:12]}", f"moved/{names[i]}"
    status = ["error" if e else "kept" if r is None else "dropped" for e, r in zip(d["error"], why)]
    boxes, scores = _boxes(rng, decoded, d["person"], d["width"], d["height"])
    w = [int(x) if ok else None for x, ok in zip(d["width"], decoded)]
    h = [int(x) if ok else None for x, ok in zip(d["height"], decoded)]
    dup = [keys[i - 1] if r in ("exact_duplicate", "near_duplicate") else None for i, r in enumerate(why)]
    return {
        "partition": [f"{part:06d}-{sha[0][:10]}"] * rows,
        "key": keys,
        "source": [f"{corpus}/{tar:05d}.tar#{n}" for n in names],
        "source_meta": [f'{{"url": "https://example.org/{n}", "caption": "a photo"}}' for n in names],
        "input_bytes": rng.integers(20_000, 900_000, rows),
        "sha256": sha,
        "decode_ok": decoded,
        "reason": why,
        "error_message": ["cannot identify image file" if e else None for e in d["error"]],
        "width": w,
        "height": h,
        "format": ["JPEG" if ok else None for ok in decoded],
        "mode": ["RGB" if ok else None for ok in decoded],
        "notes": [["exif_rotated"] if x < 0.05 else [] for x in rng.random(rows)],
        "converted": [False if ok else None for ok in decoded],
        "image_ext": ["jpg" if ok else None for ok in decoded],
        "phash": [s[16:32] if ok else None for s, ok in zip(sha, decoded)],
        "phash_mirror": [s[32:48] if ok else None for s, ok in zip(sha, decoded)],
        "sharpness": np.where(decoded, rng.random(rows) * 40, np.nan),
        "clipped_dark": np.where(decoded, rng.random(rows) * 0.2, np.nan),
        "clipped_bright": np.where(decoded, rng.random(rows) * 0.2, np.nan),
        "rank_quality": np.where(decoded, rng.integers(0, 3, rows), 0),
        "duplicate_of": dup,
        "duplicate_group": dup,
        "person_boxes": boxes,
        "person_scores": scores,
        "person_count": [None if b is None else sum(x >= 0.3 for x in s) for b, s in zip(boxes, scores)],
        "salient_person_count": [
            None if b is None else 0 if r == "no_salient_person" else 1 for b, r in zip(boxes, why)
        ],
        "person_score_max": [None if not s else max(s) for s in scores],
        "text_coverage": np.where(decoded, rng.random(rows) * np.where(d["text"], 0.9, 0.1), np.nan),
        "text_box_count": np.where(decoded, rng.integers(0, 12, rows), 0),
        "text_watermark": [bool(x < 0.01) if ok else None for x, ok in zip(rng.random(rows), decoded)],
        "status": status,
        "shard": [f"{part:06d}.tar" if s == "kept" else None for s in status],
        **_clusters(rng, status),
    }


def _clusters(rng: np.random.Generator, status: list[str]) -> dict[str, list]:
    """Cluster ids per level for the kept rows (8 then 32 clusters, each fine one in one coarse)."""
    fine = rng.integers(0, 32, len(status))
    ids = [fine // 4, fine][:CLUSTER_LEVELS]
    kept = [s == "kept" for s in status]
    return {f"cluster_l{i}": [int(x) if k else None for x, k in zip(level, kept)] for i, level in enumerate(ids)}


def _array(values, field, rows: int, decoded: np.ndarray):
    import pyarrow as pa

    if values is None:
        return pa.nulls(rows, field.type)
    if isinstance(values, np.ndarray) and field.name != "input_bytes":
        return pa.array(values, mask=~decoded).cast(field.type)
    return (
        pa.array(values, type=field.type) if not isinstance(values, np.ndarray) else pa.array(values).cast(field.type)
    )


def plan(part: int, rows: int) -> dict[str, np.ndarray]:
    """Which rows of a part A keeps, B keeps, and B keeps under a new key."""
    d = outcome_draws(part, rows)
    kept_a = np.array([r is None for r in reasons(d, MIN_SIDE_A)])
    kept_b = np.array([r is None for r in reasons(d, MIN_SIDE_B)])
    renamed = kept_a & kept_b & (np.random.default_rng(7 + part).random(rows) < RENAMED_SHARE)
    return {"kept_a": kept_a, "kept_b": kept_b, "renamed": renamed}


def curation_config(root: str, corpus: str, min_side: int):
    """The run's configuration: the demo's steps; the detector's weights an empty stand-in file
    next to the output (the recipe is only described here, never run)."""
    from curation.config import InputConfig
    from curation.filters.geometry import GeometryConfig
    from curation.filters.person import DetectorConfig
    from curation.recipe import CurationConfig, weightless_content_filters
    from infra.tracking import TrackingConfig

    weights = os.path.join(os.path.dirname(root), "centernet-stand-in.onnx")
    open(weights, "ab").close()
    return CurationConfig(
        input=InputConfig(uri=corpus),
        output_dir=root,
        geometry=GeometryConfig(min_short_side=min_side),
        detector=DetectorConfig(backend="centernet_onnx", weights=weights, score_threshold=0.3),
        content=weightless_content_filters(),
        tracking=TrackingConfig(enabled=False),
    )


def write_version(
    root: str, corpus: str, parts: list[int], rows: int, min_side: int, renamed: bool, tars: int | None = None
) -> dict:
    """A finished output of ``parts`` (manifest parts, stats.json, config.yaml, _SUCCESS); returns its
    status counts as drawn here (``tars``: as ``part_columns``)."""
    import pyarrow as pa

    from curation import output
    from curation.recipe import HUMANS1B
    from curation.stats import manifest_counts, merge_counts, stats_from_counts
    from infra import storage
    from infra.config import dump_config

    fs, base = storage.resolve(root)
    sch, tallies, status = manifest_schema(), [], {"kept": 0, "dropped": 0, "error": 0}
    for part in parts:
        cols = part_columns(corpus, part, rows, min_side, plan(part, rows)["renamed"] if renamed else None, tars)
        table = pa.Table.from_arrays([_array(cols.get(f.name), f, rows, cols["decode_ok"]) for f in sch], schema=sch)
        storage.write_parquet(fs, output.manifest_part_path(base, cols["partition"][0]), table)
        tallies.append(manifest_counts(table))
        for s in cols["status"]:
            status[s] += 1
    cfg = curation_config(root, corpus, min_side)
    built = HUMANS1B.build(cfg)
    stats = stats_from_counts(
        merge_counts(tallies), built.funnel(), samples_in_shards=0, shards=0, descriptions=built.describe()
    )
    done = {"dataset_id": f"{len(parts) * rows:x}{min_side}", "dataset_name": "bench", "job_digest": f"{min_side}"}
    for name, text in (
        (output.STATS_FILE, json.dumps(stats, indent=2, sort_keys=True)),
        (output.CONFIG_FILE, dump_config(cfg)),
        (output.SUCCESS_FILE, json.dumps({**done, "code_version": "bench", "kept": status["kept"]})),
    ):
        storage.atomic_write_bytes(fs, output.path(base, name), text.encode())
    return status


def planted_diff(parts_a: list[int], new_part: int, rows: int) -> dict:
    """The diff A -> B as drawn: B has A's parts but the last, and ``new_part``."""
    plans = {p: plan(p, rows) for p in (*parts_a, new_part)}
    common = parts_a[:-1]
    return {
        "removed": sum(int((plans[p]["kept_a"] & ~plans[p]["kept_b"]).sum()) for p in common)
        + int(plans[parts_a[-1]]["kept_a"].sum()),
        "added": int(plans[new_part]["kept_b"].sum()),
        "renamed": sum(int(plans[p]["renamed"].sum()) for p in common),
        "both": sum(int((plans[p]["kept_a"] & plans[p]["kept_b"] & ~plans[p]["renamed"]).sum()) for p in common),
    }


# ---- the measured processes ---------------------------------------------------------------------


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _card(html: str, name: str) -> int:
    return int(re.search(rf'data-name="{name}" data-value="(\d+)"', html).group(1))


def measure(kind: str, paths: list[str]) -> dict:
    """One measured step, in this (fresh) process: its result's counts, wall time and peak RSS."""
    from curation.audit import diff_summary, diff_versions, load_version, render_diff, render_report
    from curation.audit.loading import MANIFEST_SKIP
    from curation.output import CuratedOutput

    floor, t0 = _rss_now_mb(), time.perf_counter()
    if kind == "report":
        html = render_report(load_version(paths[0]))
        got = {"inputs": _card(html, "inputs"), "kept": _card(html, "kept"), "page_mb": len(html) / 2**20}
    elif kind == "diff":
        d = diff_versions(load_version(paths[0]), load_version(paths[1]))
        html, text = render_diff(d), diff_summary(d)
        got = {k: _card(html, k) for k in ("added", "removed", "renamed")}
        got.update(both=_card(html, "kept in both"), summary_lines=text.count("\n") + 1)
    else:
        table = CuratedOutput.at(paths[0]).read_manifest(skip=MANIFEST_SKIP)
        got = {"rows": table.num_rows, "table_mb": table.nbytes / 2**20}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**got, "wall_s": time.perf_counter() - t0, "peak_mb": peak, "floor_mb": floor}


def run_child(kind: str, *paths: str) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--measure", kind, *paths],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        sys.exit(f"{kind} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def one_size(n: int, rows_per_part: int) -> dict:
    rows = min(rows_per_part, n)
    count = max(2, n // rows)
    with tempfile.TemporaryDirectory(prefix="audit-scale-") as tmp:
        corpus = os.path.join(tmp, "corpus")  # never written: sources and shards are absent
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        t0 = time.perf_counter()
        drawn = write_version(a, corpus, list(range(count)), rows, MIN_SIDE_A, renamed=False)
        write_version(b, corpus, [*range(count - 1), count], rows, MIN_SIDE_B, renamed=True)
        made = time.perf_counter() - t0
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(a) for f in fs) / 2**20
        out = {"n": count * rows, "parts": count, "write_s": made, "disk_mb": disk, "drawn": drawn}
        out["planted"] = planted_diff(list(range(count)), count, rows)
        out.update(report=run_child("report", a), diff=run_child("diff", a, b), baseline=run_child("baseline", a))
    return out


def check(r: dict) -> str:
    """The page's counts against the ones drawn: a mismatch ends the run."""
    rep, diff, planted, drawn = r["report"], r["diff"], r["planted"], r["drawn"]
    if (rep["inputs"], rep["kept"]) != (r["n"], drawn["kept"]) or r["baseline"]["rows"] != r["n"]:
        sys.exit(f"report counts {rep} != drawn {drawn} (n={r['n']})")
    if any(diff[k] != planted[k] for k in planted):
        sys.exit(f"diff counts {diff} != planted {planted}")
    return (
        f"page == drawn: inputs {r['n']:,} kept {rep['kept']:,}; diff == planted: added {diff['added']:,} "
        f"removed {diff['removed']:,} renamed {diff['renamed']:,} kept in both {diff['both']:,}"
    )


def line(r: dict) -> str:
    rep, diff, base = r["report"], r["diff"], r["baseline"]
    return (
        f"n={r['n']:>11,} ({r['parts']} parts, {r['disk_mb']:.1f} MB of Parquet per version, written in "
        f"{r['write_s']:.1f} s): report {rep['wall_s']:.1f} s, peak RSS {rep['peak_mb']:.0f} MB "
        f"(after imports {rep['floor_mb']:.0f} MB); diff {diff['wall_s']:.1f} s, peak RSS {diff['peak_mb']:.0f} MB "
        f"(after imports {diff['floor_mb']:.0f} MB); baseline whole-table load {base['wall_s']:.1f} s, peak RSS "
        f"{base['peak_mb']:.0f} MB (table {base['table_mb']:.0f} MB); {check(r)}"
    )


def growth(r1: dict, r2: dict) -> str:
    ratio = lambda k: r2[k]["peak_mb"] / r1[k]["peak_mb"]  # noqa: E731
    return (
        f"growth n x{r2['n'] / r1['n']:.1f} ({r1['n']:,} -> {r2['n']:,}): report peak RSS x{ratio('report'):.2f}, "
        f"diff peak RSS x{ratio('diff'):.2f}, baseline whole-table load peak RSS x{ratio('baseline'):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6])
    parser.add_argument("--rows-per-part", type=int, default=10_000)
    parser.add_argument("--smallest", action="store_true", help="2e3 rows in parts of 500 (the smoke test)")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)  # a child: KIND PATH...
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1:])))
        return
    sizes, per_part = ([2e3], 500) if args.smallest else (args.sizes, args.rows_per_part)
    print(
        f"audit at scale: manifest parts of {per_part:,} rows, {len(manifest_schema())} columns; B = A with "
        f"min_short_side {MIN_SIDE_A} -> {MIN_SIDE_B}, its last part gone, one new part, "
        f"{RENAMED_SHARE:.1%} of kept images under a new key",
        flush=True,
    )
    done = []
    for n in sizes:
        done.append(one_size(int(n), per_part))
        print(line(done[-1]), flush=True)
    for r1, r2 in zip(done, done[1:]):
        print(growth(r1, r2), flush=True)


if __name__ == "__main__":
    main()
