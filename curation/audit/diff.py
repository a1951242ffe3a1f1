"""The difference between two dataset versions: images added and removed, why, and which settings did it.

Added = kept in B, not kept in A; removed = kept in A, not kept in B. Images are matched by
key; an image kept in both under different keys but with the same SHA-256 of its input bytes
(e.g. the input was moved) counts as *renamed*, neither added nor removed. Each removed image
carries its status and reason in B (each added one, its status and reason in A: why A did not
keep it), and the changed settings that own that reason (``settings.explaining``): e.g. a
removal for ``too_small`` is explained by a change of ``geometry.min_short_side``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import curation.audit.charts as charts
import curation.audit.counts as counts
import curation.audit.images as images
import curation.audit.page as page
import curation.audit.settings as settings
from curation import schema
from curation.audit.loading import AuditedVersion

ABSENT = "absent"  # status of an image the other version never saw (not in its input)
TABLE_LIMIT = 500  # rows of the per-image tables in the page (counts and galleries cover the rest)


@dataclasses.dataclass(frozen=True)
class Change:
    """One image that was kept on one side only, with the other side's verdict."""

    key: str
    row: dict  # the manifest row on the side that kept it
    other_status: str  # dropped / error / absent on the other side
    other_reason: str | None
    other_step: str | None
    explained_by: tuple[str, ...]

    @property
    def why(self) -> str:
        return self.other_reason or "not in the input"


@dataclasses.dataclass(frozen=True)
class VersionDiff:
    a: AuditedVersion
    b: AuditedVersion
    removed: list[Change]  # kept in A, not in B (B's verdict)
    added: list[Change]  # kept in B, not in A (A's verdict)
    renamed: list[tuple[str, str]]  # (key in A, key in B): same bytes, new key
    kept_in_both: int
    config_changes: list[settings.Change]

    @property
    def code_changed(self) -> bool:
        return self.a.code_version != self.b.code_version


def _verdicts(
    kept: dict[str, dict], keys: list[str], other: AuditedVersion, changes: list[settings.Change], code_changed: bool
) -> list[Change]:
    by_key = {r["key"]: r for r in other.rows}
    by_sha: dict[str, dict] = {}
    for r in other.rows:
        if r.get("sha256"):
            by_sha.setdefault(r["sha256"], r)
    steps = counts.step_of_reason(other.stats)
    order = [name for name, _ in counts.funnel_spec(other.stats)]
    out = []
    for k in keys:
        row = kept[k]
        seen = by_key.get(k) or by_sha.get(row.get("sha256") or "")
        status, reason = (seen["status"], seen["reason"]) if seen else (ABSENT, None)
        step = steps.get(reason) if reason else None
        owners = (
            settings.explain(reason, step, order, changes)
            if seen
            else [c.key for c in changes if not c.bookkeeping and settings.matches(c.key, ("input.",))]
        )
        if not owners and code_changed:
            owners = ["code version"]
        out.append(Change(k, row, status, reason, step, tuple(owners)))
    return out


def diff_versions(a: AuditedVersion, b: AuditedVersion) -> VersionDiff:
    """What changed from version ``a`` to version ``b``."""
    a_kept = {r["key"]: r for r in a.rows if r["status"] == schema.KEPT}
    b_kept = {r["key"]: r for r in b.rows if r["status"] == schema.KEPT}
    removed = sorted(set(a_kept) - set(b_kept))
    added = sorted(set(b_kept) - set(a_kept))
    added_by_sha = {b_kept[k]["sha256"]: k for k in added if b_kept[k].get("sha256")}
    renamed = [(k, added_by_sha[a_kept[k]["sha256"]]) for k in removed if a_kept[k].get("sha256") in added_by_sha]
    gone = {x for pair in renamed for x in pair}
    removed = [k for k in removed if k not in gone]
    added = [k for k in added if k not in gone]
    changes = settings.config_changes(a.config, b.config)
    code_changed = a.code_version != b.code_version
    return VersionDiff(
        a,
        b,
        _verdicts(a_kept, removed, b, changes, code_changed),
        _verdicts(b_kept, added, a, changes, code_changed),
        renamed,
        len(set(a_kept) & set(b_kept)),
        changes,
    )


def by_reason(items: list[Change]) -> list[dict]:
    """Changes grouped by the other side's (status, reason), with the settings that explain them."""
    groups: dict[tuple[str, str], list[Change]] = {}
    for c in items:
        groups.setdefault((c.other_status, c.why), []).append(c)
    out = []
    for (status, why), members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        explained = Counter(k for c in members for k in c.explained_by)
        out.append(
            {
                "status": status,
                "reason": why,
                "count": len(members),
                "members": members,
                "explained_by": sorted(explained),
                "step": members[0].other_step or "-",
            }
        )
    return out


def _explained(entry: dict) -> str:
    return ", ".join(entry["explained_by"]) or "no change of a setting that owns this reason"


def diff_summary(d: VersionDiff) -> str:
    """Terminal text of the diff: counts, setting changes, and each removal/addition's reason."""
    lines = [
        f"A {d.a.id}  kept {sum(r['status'] == schema.KEPT for r in d.a.rows)}  {d.a.uri}",
        f"B {d.b.id}  kept {sum(r['status'] == schema.KEPT for r in d.b.rows)}  {d.b.uri}",
        f"added {len(d.added)}  removed {len(d.removed)}  kept in both {d.kept_in_both}  "
        f"renamed (same bytes, new key) {len(d.renamed)}",
        "",
    ]
    content = [c for c in d.config_changes if not c.bookkeeping]
    lines.append("setting changes:" if content else "setting changes: none")
    lines += [f"  {c}" for c in content]
    if d.code_changed:
        lines.append(f"  code version: {d.a.code_version} -> {d.b.code_version}")
    bookkeeping = [c.key for c in d.config_changes if c.bookkeeping]
    if bookkeeping:
        lines.append(f"  (bookkeeping only, no effect on content: {', '.join(bookkeeping)})")
    moved = [e for e in reason_shifts(d) if e["a"] != e["b"]]
    if moved:
        lines += ["", "removals by reason, A -> B (all inputs):"]
        lines += [
            f"  {e['status']}/{e['reason']}: {e['a']} -> {e['b']}  <- {', '.join(e['explained_by']) or '-'}"
            for e in moved
        ]
    for title, items in (
        ("removed (kept in A, not in B), by B's verdict", d.removed),
        ("added (kept in B, not in A), by A's verdict", d.added),
    ):
        lines += ["", f"{title}:" if items else f"{title}: none"]
        for e in by_reason(items):
            lines.append(f"  {e['status']}/{e['reason']}: {e['count']}  <- {_explained(e)}")
            lines += [f"    {c.key}" for c in e["members"][:20]]
            if e["count"] > 20:
                lines.append(f"    ... and {e['count'] - 20} more")
    return "\n".join(lines)


def _funnel_rows(d: VersionDiff) -> tuple[list[list], list[dict]]:
    fa = {s["stage"]: s for s in counts.recount(d.a)["funnel"]}
    fb = {s["stage"]: s for s in counts.recount(d.b)["funnel"]}
    steps = list(fa) + [s for s in fb if s not in fa]
    rows, attrs = [], []
    for s in steps:
        a_out, b_out = fa.get(s, {}).get("out"), fb.get(s, {}).get("out")
        delta = b_out - a_out if a_out is not None and b_out is not None else "-"
        rows.append([s, "-" if a_out is None else a_out, "-" if b_out is None else b_out, delta])
        attrs.append({"data-stage": s, "data-a-out": a_out, "data-b-out": b_out})
    return rows, attrs


def reason_shifts(d: VersionDiff) -> list[dict]:
    """Per (status, reason): how many inputs ended there in A and in B, and the changed settings owning it."""
    ca = Counter((r["status"], r["reason"]) for r in d.a.rows if r["status"] != schema.KEPT)
    cb = Counter((r["status"], r["reason"]) for r in d.b.rows if r["status"] != schema.KEPT)
    steps = {**counts.step_of_reason(d.a.stats), **counts.step_of_reason(d.b.stats)}
    order = [name for name, _ in counts.funnel_spec(d.b.stats)]
    return [
        {
            "status": st,
            "reason": reason,
            "a": ca[(st, reason)],
            "b": cb[(st, reason)],
            "explained_by": settings.explain(reason, steps.get(reason), order, d.config_changes),
        }
        for st, reason in sorted(set(ca) | set(cb))
    ]


def _change_section(
    id_: str, title: str, items: list[Change], side: AuditedVersion, verdict_side: str, per_reason: int
) -> str:
    if not items:
        return page.section(id_, f"{title}: 0", page.Markup("<p class=note>none</p>"))
    groups = by_reason(items)
    summary = page.table(
        ["count", f"{verdict_side}'s status", f"{verdict_side}'s reason", "step", "explained by"],
        [[e["count"], e["status"], e["reason"], e["step"], _explained(e)] for e in groups],
        numeric={0},
        table_attrs={"id": f"{id_}-by-reason"},
        row_attrs=[
            {
                "data-reason": e["reason"],
                "data-status": e["status"],
                "data-count": e["count"],
                "data-explained-by": ",".join(e["explained_by"]),
            }
            for e in groups
        ],
    )
    shown = items[:TABLE_LIMIT]
    listing = page.table(
        ["key", f"{verdict_side}'s status", f"{verdict_side}'s reason", "explained by", "source"],
        [[c.key, c.other_status, c.why, ", ".join(c.explained_by) or "-", c.row["source"]] for c in shown],
        table_attrs={"id": f"{id_}-table", "data-total": len(items)},
        row_attrs=[
            {
                "data-key": c.key,
                "data-status": c.other_status,
                "data-reason": c.why,
                "data-explained-by": ",".join(c.explained_by),
            }
            for c in shown
        ],
    )
    more = f"<p class=note>first {TABLE_LIMIT} of {len(items)} listed</p>" if len(items) > TABLE_LIMIT else ""
    galleries = []
    for e in groups:
        chosen = images.sample([c.row for c in e["members"]], per_reason)
        verdicts = {c.key: c for c in e["members"]}

        def cap(r, verdicts=verdicts):
            v = verdicts[r["key"]]
            return [f"{v.why} in {verdict_side}", r["key"], f"<- {', '.join(v.explained_by) or '?'}"]

        tiles = images.tiles(chosen, cap, config=side.config, stats=side.stats, output_uri=side.uri)
        galleries.append(
            f"<h3>{page.esc(e['reason'])} <span class=note>(showing {len(chosen)} of "
            f"{e['count']})</span></h3>" + page.gallery(tiles, **{"data-reason": e["reason"]})
        )
    return page.section(id_, f"{title}: {len(items)}", summary, listing, page.Markup(more), *galleries)


def render_diff(d: VersionDiff, *, per_reason: int = 12) -> str:
    """The diff page (HTML text) from version ``d.a`` to version ``d.b``."""
    kept_a = sum(r["status"] == schema.KEPT for r in d.a.rows)
    kept_b = sum(r["status"] == schema.KEPT for r in d.b.rows)
    totals = page.cards(
        [
            ("kept in A", kept_a, ""),
            ("kept in B", kept_b, ""),
            ("added", len(d.added), "kept"),
            ("removed", len(d.removed), "dropped"),
            ("kept in both", d.kept_in_both, ""),
            ("renamed", len(d.renamed), ""),
        ],
        id="diff-totals",
    )
    change_rows = [
        [c.key, settings._show(c.old), settings._show(c.new), "bookkeeping" if c.bookkeeping else "content"]
        for c in d.config_changes
    ]
    change_attrs = [
        {
            "data-key": c.key,
            "data-old": json.dumps(c.old),
            "data-new": json.dumps(c.new),
            "data-bookkeeping": str(c.bookkeeping).lower(),
        }
        for c in d.config_changes
    ]
    if d.code_changed:
        change_rows.append(["code version", d.a.code_version, d.b.code_version, "content"])
        change_attrs.append({"data-key": "code_version", "data-bookkeeping": "false"})
    funnel_rows, funnel_attrs = _funnel_rows(d)
    shifts = reason_shifts(d)
    sections = [
        page.section("summary", "Totals", totals),
        page.section(
            "settings",
            "Setting changes",
            page.table(
                ["setting", "A", "B", "kind"], change_rows, table_attrs={"id": "config-changes"}, row_attrs=change_attrs
            ),
            note="bookkeeping settings (tracking, Ray, output folder, name) cannot change the content",
        ),
        page.section(
            "funnel",
            "Funnel, side by side",
            page.table(
                ["step", "A passed on", "B passed on", "B - A"],
                funnel_rows,
                numeric={1, 2, 3},
                table_attrs={"id": "funnel-compare"},
                row_attrs=funnel_attrs,
            ),
            page.chart(
                charts.compare(
                    [r[0] for r in funnel_rows],
                    [a.get("data-a-out") for a in funnel_attrs],
                    [a.get("data-b-out") for a in funnel_attrs],
                ),
                "passed on per step, A and B",
            ),
        ),
        page.section(
            "reason-shifts",
            "Removals by reason, A vs B",
            page.table(
                ["status", "reason", "A", "B", "B - A", "changed settings owning the reason"],
                [
                    [
                        e["status"],
                        e["reason"],
                        e["a"],
                        e["b"],
                        e["b"] - e["a"],
                        ", ".join(e["explained_by"]) if e["a"] != e["b"] and e["explained_by"] else "-",
                    ]
                    for e in shifts
                ],
                numeric={2, 3, 4},
                table_attrs={"id": "reason-shifts"},
                row_attrs=[
                    {
                        "data-reason": e["reason"],
                        "data-a": e["a"],
                        "data-b": e["b"],
                        "data-explained-by": ",".join(e["explained_by"]),
                    }
                    for e in shifts
                ],
            ),
            note="all inputs, not only kept ones: an image can move from one reason to another",
        ),
        _change_section("removed", "Removed (kept in A, not in B)", d.removed, d.a, "B", per_reason),
        _change_section("added", "Added (kept in B, not in A)", d.added, d.b, "A", per_reason),
    ]
    if d.renamed:
        sections.append(
            page.section(
                "renamed",
                f"Renamed: {len(d.renamed)}",
                page.table(
                    ["key in A", "key in B"],
                    [list(p) for p in d.renamed[:TABLE_LIMIT]],
                    table_attrs={"id": "renamed-table"},
                ),
            )
        )
    header = [f"A {d.a.id} · {d.a.uri}", f"B {d.b.id} · {d.b.uri}"]
    return page.document(f"Dataset versions {d.a.id} -> {d.b.id}", header, sections)
