"""Counts recomputed from the manifest: funnel, reasons, source groups, and the terminal summary.

The manifest is the source of truth: the audit recounts it (with ``curation.stats``, the
code that wrote stats.json) and reports any disagreement with the stats.json on disk. The
recount streams the manifest (``Tally``: four narrow columns, batch by batch); what it holds is
the counts, one entry per (status, reason) and one per source group, whatever the row count.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections import Counter

import pyarrow as pa

from curation import schema
from curation.audit.loading import AuditedVersion
from curation.output import CuratedOutput
from curation.stats import format_summary, manifest_counts, merge_counts, stats_from_counts

_TAR = ".tar#"
_PARQUET_ROW = "#row="


def funnel_entries(stats: dict) -> list[dict]:
    """stats.json's funnel in pipeline order: per entry its ``step``, rows ``in`` and ``out`` and the
    ``removed`` counts by reason (the last entry may be ``other``: reasons no step owns)."""
    return [{"step": s["step"], "in": s["in"], "out": s["out"], "removed": s["removed"]} for s in stats["funnel"]]


def funnel_spec(stats: dict) -> list[tuple[str, tuple[str, ...]]]:
    """(step, reasons it owns) in pipeline order, as the run recorded them."""
    return [(e["step"], tuple(e["removed"])) for e in funnel_entries(stats) if e["step"] != "other"]


@dataclasses.dataclass
class Tally:
    """A manifest's counts, merged batch by batch: what stats.json is made of (``curation.stats``)
    and, per source group, its inputs, statuses and removal reasons."""

    input_root: str
    counts: dict = dataclasses.field(default_factory=lambda: merge_counts([]))
    groups: dict[str, dict] = dataclasses.field(default_factory=dict)

    columns = ("status", "reason", "notes", "source")  # what ``add`` reads

    def add(self, batch: pa.RecordBatch) -> None:
        self.counts = merge_counts([self.counts, manifest_counts(pa.Table.from_batches([batch]))])
        for source, status, reason in zip(*(batch.column(c).to_pylist() for c in ("source", "status", "reason"))):
            add_to_group(self.groups, source_group(source, self.input_root), status, reason)

    @property
    def removed(self) -> Counter:
        """(status, reason) -> rows, for the rows not kept."""
        c = self.counts
        return Counter(
            {(schema.DROPPED, r): n for r, n in c["dropped_by_reason"].items()}
            | {(schema.ERROR, r): n for r, n in c["errors_by_reason"].items()}
        )

    @property
    def kept(self) -> int:
        return self.counts["status"].get(schema.KEPT, 0)

    def by_source(self) -> list[dict]:
        return [{"group": name, **g} for name, g in sorted(self.groups.items())]


def tally(v: AuditedVersion) -> Tally:
    """The counts of ``v``'s manifest, in one streamed pass."""
    t = Tally(v.setting("input.uri", ""))
    v.scan(t)
    return t


def recount(v: AuditedVersion, t: Tally) -> dict:
    """stats.json's structure, recomputed from the manifest's counts ``t`` and the shards' sidecars."""
    return stats_from_counts(
        t.counts,
        funnel_spec(v.stats),
        samples_in_shards=CuratedOutput.at(v.uri).samples_in_shards(),
        shards=len(v.version.shards),
        descriptions=v.stats.get("steps", []),
    )


def disagreements(counted: dict, recorded: dict) -> list[str]:
    """Where stats.json on disk differs from the recount (empty when they agree)."""
    keys = (
        "inputs",
        "kept",
        "dropped",
        "errors",
        "dropped_by_reason",
        "errors_by_reason",
        "funnel",
        "samples_in_shards",
        "shards",
    )
    return [
        f"{k}: stats.json has {recorded.get(k)!r}, the manifest gives {counted.get(k)!r}"
        for k in keys
        if counted.get(k) != recorded.get(k)
    ]


def split_source(source: str) -> tuple[str, str | None]:
    """(container or file URI, member) of a manifest ``source``: ``tar#member``, ``parquet#row=N`` or a file."""
    if _PARQUET_ROW in source:
        uri, _, row = source.rpartition(_PARQUET_ROW)
        if row.isdigit():
            return uri, f"row={row}"
    cut = source.lower().find(_TAR)
    if cut >= 0:
        return source[: cut + len(".tar")], source[cut + len(_TAR) :]
    return source, None


def source_group(source: str, input_root: str) -> str:
    """Where an input came from, for "drops by source": its tar or parquet file, else its folder,
    relative to the run's ``input.uri``."""
    container, member = split_source(source)
    target = container if member is not None else posixpath.dirname(container)
    root = input_root.rstrip("/")
    if root and (target == root or target.startswith(root + "/")):
        rel = target[len(root) :].lstrip("/")
        return rel or "(top level)"
    return target or "(top level)"


def step_of_reason(stats: dict) -> dict[str, str]:
    return {r: s["step"] for s in stats["funnel"] for r in s["removed"]}


def reason_entries(removed: Counter, stats: dict) -> list[dict]:
    """One entry per (status, reason) of removed rows (``removed``: their counts): count and the
    step that removed them; dropped before errors, then the largest first."""
    steps = step_of_reason(stats)
    order = {schema.DROPPED: 0, schema.ERROR: 1}
    return [
        {"status": st, "reason": reason, "count": n, "step": steps.get(reason, "other")}
        for (st, reason), n in sorted(removed.items(), key=lambda kv: (order.get(kv[0][0], 2), -kv[1], kv[0][1] or ""))
    ]


def by_reason(rows: list[dict], stats: dict) -> list[dict]:
    """``reason_entries`` of a list of rows."""
    return reason_entries(Counter((r["status"], r["reason"]) for r in rows if r["status"] != schema.KEPT), stats)


def add_to_group(groups: dict[str, dict], group: str, status: str, reason: str | None) -> None:
    g = groups.get(group)
    if g is None:
        g = groups[group] = {"inputs": 0, schema.KEPT: 0, schema.DROPPED: 0, schema.ERROR: 0, "reasons": Counter()}
    g["inputs"] += 1
    g[status] += 1
    if reason is not None:
        g["reasons"][reason] += 1


def by_source(rows: list[dict], input_root: str) -> list[dict]:
    """Per source group: inputs, kept, dropped, errors and the removal reasons."""
    groups: dict[str, dict] = {}
    for r in rows:
        add_to_group(groups, source_group(r["source"], input_root), r["status"], r["reason"])
    return [{"group": name, **g} for name, g in sorted(groups.items())]


def _table(header: list[str], rows: list[list], right: set[int]) -> list[str]:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def fmt(row):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return [fmt(r) for r in cells]


def summary_text(v: AuditedVersion) -> str:
    """The terminal summary: funnel, counts by reason and by source (for users who do not open HTML)."""
    t = tally(v)
    counted = recount(v, t)
    lines = [
        f"dataset version {v.id} ({v.version.name})  output {v.uri}",
        f"job digest {v.job_digest}  code version {v.code_version}  mlflow run {v.version.run_id or '-'}",
        "",
        format_summary(counted),
        "",
    ]
    reasons = reason_entries(t.removed, v.stats)
    if reasons:
        total = max(1, counted["inputs"])
        lines.append("removed, by reason:")
        lines += [
            "  " + s
            for s in _table(
                ["status", "reason", "count", "share", "step"],
                [
                    [e["status"], e["reason"], e["count"], f"{100 * e['count'] / total:.1f}%", e["step"]]
                    for e in reasons
                ],
                {2, 3},
            )
        ]
        lines.append("")
    lines.append("by source:")
    lines += [
        "  " + s
        for s in _table(
            ["source", "inputs", "kept", "dropped", "errors", "reasons"],
            [
                [
                    g["group"],
                    g["inputs"],
                    g["kept"],
                    g["dropped"],
                    g["error"],
                    ", ".join(f"{r}={n}" for r, n in sorted(g["reasons"].items())) or "-",
                ]
                for g in t.by_source()
            ],
            {1, 2, 3, 4},
        )
    ]
    problems = disagreements(counted, v.stats)
    if problems:
        lines += ["", "WARNING: stats.json disagrees with the manifest:"] + [f"  {p}" for p in problems]
    return "\n".join(lines)
