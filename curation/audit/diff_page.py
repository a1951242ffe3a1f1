"""The diff page: a self-contained HTML document of the difference between two dataset versions.

``render_diff`` lays out what ``curation.audit.diff.diff_versions`` computed: totals, the changed
settings (content or bookkeeping), the two funnels side by side, removals by reason in A and B,
and per side the images kept there only, by the other side's verdict, with the settings that
explain it and a gallery per verdict.
"""

from __future__ import annotations

import json

import curation.audit.charts as charts
import curation.audit.counts as counts
import curation.audit.images as images
import curation.audit.page as page
import curation.audit.settings as settings
from curation.audit.diff import TABLE_LIMIT, ChangeGroup, OneSided, VersionDiff, reason_shifts
from curation.audit.loading import AuditedVersion


def _funnel_rows(d: VersionDiff) -> tuple[list[list], list[dict]]:
    fa = {s["step"]: s for s in counts.recount(d.a, d.tallies[0])["funnel"]}
    fb = {s["step"]: s for s in counts.recount(d.b, d.tallies[1])["funnel"]}
    steps = list(fa) + [s for s in fb if s not in fa]
    rows, attrs = [], []
    for s in steps:
        a_out, b_out = fa.get(s, {}).get("out"), fb.get(s, {}).get("out")
        delta = b_out - a_out if a_out is not None and b_out is not None else "-"
        rows.append([s, "-" if a_out is None else a_out, "-" if b_out is None else b_out, delta])
        attrs.append({"data-step": s, "data-a-out": a_out, "data-b-out": b_out})
    return rows, attrs


def _galleries(groups: list[ChangeGroup], side: AuditedVersion, verdict_side: str, per_reason: int) -> list[str]:
    out = []
    for e in groups:
        chosen = e.sample[:per_reason]
        verdicts = {c.key: c for c in chosen}

        def cap(r, verdicts=verdicts):
            v = verdicts[r["key"]]
            return [f"{v.why} in {verdict_side}", r["key"], f"<- {', '.join(v.explained_by) or '?'}"]

        tiles = images.tiles([c.row for c in chosen], cap, config=side.config, stats=side.stats, output_uri=side.uri)
        out.append(
            f"<h3>{page.esc(e.reason)} <span class=note>(showing {len(chosen)} of "
            f"{e.count})</span></h3>" + page.gallery(tiles, **{"data-reason": e.reason})
        )
    return out


def _change_section(
    id_: str, title: str, items: OneSided, side: AuditedVersion, verdict_side: str, per_reason: int
) -> str:
    if not items.total:
        return page.section(id_, f"{title}: 0", page.Markup("<p class=note>none</p>"))
    summary = page.table(
        ["count", f"{verdict_side}'s status", f"{verdict_side}'s reason", "step", "explained by"],
        [[e.count, e.status, e.reason, e.step, e.explanation] for e in items.groups],
        numeric={0},
        table_attrs={"id": f"{id_}-by-reason"},
        row_attrs=[
            {
                "data-reason": e.reason,
                "data-status": e.status,
                "data-count": e.count,
                "data-explained-by": ",".join(e.explained_by),
            }
            for e in items.groups
        ],
    )
    shown = items.listed
    listing = page.table(
        ["key", f"{verdict_side}'s status", f"{verdict_side}'s reason", "explained by", "source"],
        [[c.key, c.other_status, c.why, ", ".join(c.explained_by) or "-", c.row["source"]] for c in shown],
        table_attrs={"id": f"{id_}-table", "data-total": items.total},
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
    more = f"<p class=note>first {TABLE_LIMIT} of {items.total} listed</p>" if items.total > TABLE_LIMIT else ""
    galleries = _galleries(items.groups, side, verdict_side, per_reason)
    return page.section(id_, f"{title}: {items.total}", summary, listing, page.Markup(more), *galleries)


def render_diff(d: VersionDiff, *, per_reason: int = 12) -> str:
    """The diff page (HTML text) from version ``d.a`` to version ``d.b`` (``per_reason``: gallery
    images per verdict, at most the ``per_reason`` the diff was computed with)."""
    totals = page.cards(
        [
            ("kept in A", d.tallies[0].kept, ""),
            ("kept in B", d.tallies[1].kept, ""),
            ("added", d.additions.total, "kept"),
            ("removed", d.removals.total, "dropped"),
            ("kept in both", d.kept_in_both, ""),
            ("renamed", d.renamed_total, ""),
        ],
        id="diff-totals",
    )
    sections = [
        page.section("summary", "Totals", totals),
        _settings_section(d),
        _funnel_section(d),
        _shifts_section(d),
        _change_section("removed", "Removed (kept in A, not in B)", d.removals, d.a, "B", per_reason),
        _change_section("added", "Added (kept in B, not in A)", d.additions, d.b, "A", per_reason),
    ]
    if d.renamed_total:
        sections.append(
            page.section(
                "renamed",
                f"Renamed: {d.renamed_total}",
                page.table(
                    ["key in A", "key in B"],
                    [list(p) for p in d.renamed],
                    table_attrs={"id": "renamed-table", "data-total": d.renamed_total},
                ),
            )
        )
    header = [f"A {d.a.id} · {d.a.uri}", f"B {d.b.id} · {d.b.uri}"]
    return page.document(f"Dataset versions {d.a.id} -> {d.b.id}", header, sections)


def _settings_section(d: VersionDiff) -> str:
    """Every changed setting (and the code version), each marked content or bookkeeping."""
    change_rows = [
        [c.key, settings.show_value(c.old), settings.show_value(c.new), "bookkeeping" if c.bookkeeping else "content"]
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
    return page.section(
        "settings",
        "Setting changes",
        page.table(
            ["setting", "A", "B", "kind"], change_rows, table_attrs={"id": "config-changes"}, row_attrs=change_attrs
        ),
        note="bookkeeping settings (tracking, Ray, output folder, name) cannot change the content",
    )


def _funnel_section(d: VersionDiff) -> str:
    """The two funnels side by side, as a table and a chart."""
    funnel_rows, funnel_attrs = _funnel_rows(d)
    return page.section(
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
    )


def _shifts_section(d: VersionDiff) -> str:
    """Removals per (status, reason) in A and B, with the changed settings that own each reason."""
    shifts = reason_shifts(d)
    return page.section(
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
    )
