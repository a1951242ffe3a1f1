"""stats.json: counts per step and reason, derived from the manifest (so they always reconcile).

The pipeline never reads the manifest whole: each part is summarised where it lies
(``manifest_counts`` over ``SUMMARY_COLUMNS``, never the embeddings), and the small per-part
counts are summed (``merge_counts``) into ``stats_from_counts``.

The file carries its ``format``. Format 2 (what this code writes): ``funnel`` entries name their
recipe step under ``step``, and ``steps`` holds the steps' descriptions, each step named by its
config section (``content.nsfw``, ``curation.steps``). Format 1 (no ``format`` key) said
``stage``/``stages`` for them and named the steps differently; ``upgrade`` reads it as format 2
(the names through ``FORMAT1_STEP_NAMES``), and ``curation.output.CuratedOutput.stats`` reads every
stats.json through it, so audits, version diffs and the explorer read finished outputs of either.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from curation import schema

SUMMARY_COLUMNS = ["key", "sha256", "status", "reason", "notes"]  # what stats and the version id read
STATS_FORMAT = 2

# Until the next release: format 1's step names (stats.json without ``format``) -> their sections.
FORMAT1_STEP_NAMES = {
    "read": "input",
    "image_quality": "quality",
    "decontaminate": "dedup.decontaminate",
    "exact_dedup": "dedup.exact",
    "near_dedup": "dedup.near",
    "person_detection": "detector",
    "clip_embedding": "content.embedding",
    "nsfw_filter": "content.nsfw",
    "artistic_filter": "content.artistic",
    "watermark_filter": "content.watermark",
    "aesthetic_filter": "content.aesthetic",
    "text_filter": "content.text",
    "semantic_dedup": "dedup.semantic",
    "write_shards": "shards",
}


def upgrade(stats: dict) -> dict:
    """A stats.json of any format as the current one (a format 1 file: ``stage`` -> ``step``,
    ``stages`` -> ``steps``, step names through ``FORMAT1_STEP_NAMES``); a newer format is a
    ``ValueError``."""
    version = stats.get("format", 1)
    if version == STATS_FORMAT:
        return stats
    if version != 1:
        raise ValueError(f"stats.json has format {version!r}, newer than this code reads (1 to {STATS_FORMAT})")
    named = FORMAT1_STEP_NAMES.get
    out = {k: v for k, v in stats.items() if k not in ("funnel", "stages")}
    out["funnel"] = [
        {"step": named(e["stage"], e["stage"]), **{k: v for k, v in e.items() if k != "stage"}} for e in stats["funnel"]
    ]
    out["steps"] = [{**d, "name": named(d["name"], d["name"])} for d in stats.get("stages", [])]
    out["format"] = STATS_FORMAT
    return out


def manifest_counts(manifest: pa.Table) -> dict:
    """The counts stats are made of, for one manifest part (or a whole manifest): small, and
    summed across parts by ``merge_counts``."""
    status = manifest.column("status").to_pylist()
    reasons = manifest.column("reason").to_pylist()
    notes = manifest.column("notes").to_pylist() if "notes" in manifest.column_names else []
    return {
        "inputs": manifest.num_rows,
        "status": Counter(status),
        "reasons": Counter(r for r in reasons if r is not None),
        "notes": Counter(n for ns in notes if ns for n in ns),
        "dropped_by_reason": Counter(r for r, s in zip(reasons, status) if s == schema.DROPPED),
        "errors_by_reason": Counter(r for r, s in zip(reasons, status) if s == schema.ERROR),
    }


def merge_counts(parts) -> dict:
    total = {
        "inputs": 0,
        "status": Counter(),
        "reasons": Counter(),
        "notes": Counter(),
        "dropped_by_reason": Counter(),
        "errors_by_reason": Counter(),
    }
    for part in parts:
        total["inputs"] += part["inputs"]
        for k in ("status", "reasons", "notes", "dropped_by_reason", "errors_by_reason"):
            total[k].update(part[k])
    return total


def compute_stats(
    manifest: pa.Table,
    funnel: list[tuple[str, tuple[str, ...]]],
    *,
    samples_in_shards: int,
    shards: int,
    descriptions: list[dict],
) -> dict:
    """Stats of a whole manifest table (audits; the pipeline sums per-part counts instead)."""
    return stats_from_counts(
        manifest_counts(manifest), funnel, samples_in_shards=samples_in_shards, shards=shards, descriptions=descriptions
    )


def stats_from_counts(
    counts: dict,
    funnel: list[tuple[str, tuple[str, ...]]],
    *,
    samples_in_shards: int,
    shards: int,
    descriptions: list[dict],
) -> dict:
    """Per-step funnel (in, out, dropped by reason), totals and the accounting check.

    ``funnel`` lists (step name, reasons it may set) in pipeline order; a row ended by a
    reason leaves the funnel at the step owning that reason. ``descriptions``: the steps'.
    """
    status, reasons = counts["status"], counts["reasons"]
    inputs = counts["inputs"]
    steps, remaining, seen = [], inputs, set()
    for name, owned in funnel:
        removed_counts = {r: reasons[r] for r in owned if reasons.get(r)}
        seen.update(owned)
        removed = sum(removed_counts.values())
        steps.append({"step": name, "in": remaining, "out": remaining - removed, "removed": removed_counts})
        remaining -= removed
    unknown = {r: c for r, c in reasons.items() if r not in seen}
    if unknown:
        steps.append({"step": "other", "in": remaining, "out": remaining - sum(unknown.values()), "removed": unknown})
        remaining -= sum(unknown.values())
    kept, dropped, errors = status.get(schema.KEPT, 0), status.get(schema.DROPPED, 0), status.get(schema.ERROR, 0)
    return {
        "format": STATS_FORMAT,
        "inputs": inputs,
        "kept": kept,
        "dropped": dropped,
        "errors": errors,
        "dropped_by_reason": dict(sorted(counts["dropped_by_reason"].items())),
        "errors_by_reason": dict(sorted(counts["errors_by_reason"].items())),
        "decode_notes": dict(sorted(counts["notes"].items())),
        "funnel": steps,
        "shards": shards,
        "samples_in_shards": samples_in_shards,
        "reconciled": inputs == kept + dropped + errors and kept == samples_in_shards and remaining == kept,
        "steps": descriptions,
    }


def format_summary(stats: dict) -> str:
    """Terminal summary: the funnel, then totals."""
    lines = [f"{'step':<22}{'in':>10}{'out':>10}  removed"]
    for step in stats["funnel"]:
        removed = ", ".join(f"{r}={c}" for r, c in step["removed"].items()) or "-"
        lines.append(f"{step['step']:<22}{step['in']:>10}{step['out']:>10}  {removed}")
    lines.append(
        f"inputs={stats['inputs']} kept={stats['kept']} dropped={stats['dropped']} errors={stats['errors']} "
        f"shards={stats['shards']} samples_in_shards={stats['samples_in_shards']} "
        f"reconciled={stats['reconciled']}"
    )
    return "\n".join(lines)


def tracking_record(stats: dict) -> tuple[dict[str, float], dict[str, str], dict]:
    """(metrics, tags, dataset profile) of a curation run's MLflow record, from its stats."""
    totals = ("inputs", "kept", "dropped", "errors", "shards")
    metrics = {k: stats[k] for k in (*totals, "samples_in_shards")}
    metrics.update({f"dropped.{r}": c for r, c in stats["dropped_by_reason"].items()})
    metrics.update({f"errors.{r}": c for r, c in stats["errors_by_reason"].items()})
    metrics.update({f"funnel.{step['step']}.out": step["out"] for step in stats["funnel"]})
    tags = {f"step.{step['name']}.applied": str(step["applied"]).lower() for step in stats["steps"]}
    return metrics, tags, {k: stats[k] for k in totals}
