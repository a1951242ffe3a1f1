"""The audit report of one dataset version: one self-contained HTML page.

Sections: totals; the funnel (inputs -> each step -> kept); removals by reason and by
source; the steps that ran and their settings; score distributions per filter with the
threshold marked (the scores each step of the recipe declares, ``curation.steps.Score``);
person counts and box sizes; galleries of removed images per reason and of
kept images (deterministic samples); the MLflow runs that produced and used the version; the
resolved config. Every count is recomputed from the manifest, streamed part by part (``profile``):
the page holds counts, bins and bounded samples, never the manifest.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import yaml

import curation.audit.charts as charts
import curation.audit.counts as counts
import curation.audit.distributions as dist
import curation.audit.images as images
import curation.audit.page as page
from curation import schema
from curation.audit.loading import AuditedVersion
from curation.audit.record import RunRef, explore_command
from curation.filters.person import Detector, box_size
from curation.recipe import HUMANS1B
from curation.steps import Recipe, Score


def step_description(v: AuditedVersion, name: str) -> dict | None:
    """The step's description in stats.json (its ``steps`` list)."""
    return next((s for s in v.stats.get("steps", []) if s["name"] == name), None)


def scores_of(v: AuditedVersion, recipe: Recipe = HUMANS1B) -> list[tuple[str, Score]]:
    """(step, score) for the scores the recipe's steps declare, of steps the run applied whose
    columns the manifest holds; then any other ``*_score`` column, with no step or threshold."""
    names = set(v.columns)
    declared = [(step.name, s) for step in recipe.steps for s in step.scores]
    found = [
        (step, s)
        for step, s in declared
        if (step_description(v, step) or {}).get("applied") and set(s.columns()) <= names
    ]
    known = {s.column for _, s in declared}
    for f in v.schema:
        if f.name.endswith("_score") and f.name not in known and str(f.type) in ("float", "double"):
            found.append(("", Score(f.name, None, f.name)))
    return found


@dataclasses.dataclass
class Chart:
    """A histogram of the report: its measure and how the page shows it."""

    measure: dist.Measure
    alt: str
    labels: dict  # title, xlabel, threshold_label (``charts.binned_histogram``)
    data: dict  # the image's data-* attributes
    always: bool = False  # drawn even when no row has a value

    def html(self) -> str:
        return page.chart(self.measure.draw(**self.labels), self.alt, **self.data)


def _score_columns(step: str, s: Score, recipe: Recipe) -> tuple[str, ...]:
    """What a derived score reads: its ``needs`` and the columns its step writes (e.g. geometry's
    original sizes)."""
    cls = next((c for c in recipe.steps if c.name == step), None)
    return (*s.columns(), *(cls.writes if cls else ()))


def _score_values(batch, s: Score, own: set[str], columns: tuple[str, ...]) -> list:
    if s.derive is None:
        values, present = dist.column_values(batch, s.column)
    else:
        values, present = dist.row_values(batch, s.value, columns)
    return dist.split_by_outcome(values, present, dist.outcomes(batch, own))


def score_charts(v: AuditedVersion, recipe: Recipe = HUMANS1B) -> list[Chart]:
    owned = {s["step"]: set(s["removed"]) for s in v.stats["funnel"]}
    out = []
    for step, s in scores_of(v, recipe):
        threshold = (step_description(v, step) or {}).get(s.setting) if s.setting else None
        threshold = float(threshold) if isinstance(threshold, (int, float)) else None
        columns = _score_columns(step, s, recipe)
        values = functools.partial(_score_values, s=s, own=owned.get(step, set()), columns=columns)
        measure = dist.Measure(
            s.column, (*columns, "status", "reason"), values, dist.OUTCOME_SERIES, s.integer, threshold
        )
        labels = {
            "title": f"{step or 'score'}: {s.column}",
            "xlabel": s.label,
            "threshold_label": f"{s.setting} = {threshold:g}" if threshold is not None else "",
        }
        out.append(
            Chart(measure, f"{s.column} distribution", labels, {"data-score": s.column, "data-threshold": threshold})
        )
    return out


def _person_counts(batch) -> list:
    values, present = dist.column_values(batch, "person_count")
    return dist.split_by_outcome(values, present, dist.outcomes(batch, {schema.NO_SALIENT_PERSON}))


def _box_sizes(batch, rule: images.BoxRule) -> list:
    """Sizes of the boxes scoring >= the threshold: in kept images, in the others."""
    sizes: tuple[list, list] = ([], [])
    columns = (batch.column(c).to_pylist() for c in ("person_boxes", "person_scores", "status"))
    for boxes, scores, status in zip(*columns):
        for box, score in zip(boxes or [], scores or []):
            if score >= rule.threshold:
                sizes[status != schema.KEPT].append(box_size(box, rule.measure))
    return [a[np.isfinite(a)] for a in (np.asarray(x, dtype=float) for x in sizes)]


def people_charts(v: AuditedVersion) -> list[Chart]:
    step = step_description(v, Detector.name)
    if not step or not step.get("applied") or "person_count" not in v.columns:
        return []
    count = dist.Measure(
        "person_count", ("person_count", "status", "reason"), _person_counts, dist.OUTCOME_SERIES, True
    )
    title = "people per image (boxes scoring >= the detector threshold)"
    out = [
        Chart(
            count,
            "person count distribution",
            {"title": title, "xlabel": "person_count"},
            {"data-score": "person_count"},
            always=True,
        )
    ]
    rule = images.box_rule(v.config, v.stats)
    series = (("boxes in kept images", charts.COLOURS["kept"]), ("boxes in removed images", charts.COLOURS["dropped"]))
    values = functools.partial(_box_sizes, rule=rule)
    sizes = dist.Measure(
        "box_size", ("person_boxes", "person_scores", "status"), values, series, threshold=rule.min_box_size
    )
    labels = {
        "title": f"person box size ({rule.measure}, boxes scoring >= {rule.threshold:g})",
        "xlabel": f"box {rule.measure} (px)",
        "threshold_label": f"min_box_size = {rule.min_box_size:g}",
    }
    data = {"data-score": "box_size", "data-threshold": rule.min_box_size}
    return [*out, Chart(sizes, "person box size distribution", labels, data)]


def _caption_scores(recipe: Recipe = HUMANS1B) -> list[str]:
    """The ``*_score`` columns the recipe's steps declare as scores: what a gallery tile shows."""
    return [s.column for step in recipe.steps for s in step.scores if s.column.endswith("_score") and not s.derive]


def caption(r: dict, input_root: str) -> list[str]:
    lines = [r["reason"] or r["status"], r["key"]]
    facts = []
    if r.get("width"):
        facts.append(f"{r['width']}x{r['height']}")
    if r.get("person_count") is not None:
        facts.append(f"people {r['person_count']} (salient {r.get('salient_person_count')})")
    if r.get("person_score_max") is not None:
        facts.append(f"best {r['person_score_max']:.2f}")
    if r.get("text_coverage") is not None:
        facts.append(f"text {r['text_coverage']:.3f}")
    for name in _caption_scores():
        if r.get(name) is not None:
            facts.append(f"{name.removesuffix('_score')} {r[name]:.2f}")
    if facts:
        lines.append(" · ".join(facts))
    if r.get("duplicate_of"):
        lines.append(f"duplicate of {r['duplicate_of']}")
    lines.append(f"from {counts.source_group(r['source'], input_root)}")
    return lines


def _status_reason(batch) -> list[tuple]:
    return list(zip(batch.column("status").to_pylist(), batch.column("reason").to_pylist()))


def sampler(per_reason: int, kept: int) -> images.Samples:
    """The galleries' samples: ``kept`` kept rows, ``per_reason`` rows of each (status, reason)."""
    return images.Samples(lambda label: kept if label[0] == schema.KEPT else per_reason, _status_reason)


def galleries(v: AuditedVersion, t: counts.Tally, samples: images.Samples) -> tuple[list[str], str]:
    root = v.setting("input.uri", "")
    cap = lambda r: caption(r, root)  # noqa: E731
    removed = []
    for e in counts.reason_entries(t.removed, v.stats):
        chosen = samples.rows((e["status"], e["reason"]))
        tiles = images.tiles(chosen, cap, config=v.config, stats=v.stats)
        removed.append(
            f"<h3>{page.esc(e['reason'])} <span class=note>({page.esc(e['status'])} by "
            f"{page.esc(e['step'])}; showing {len(chosen)} of {e['count']})</span></h3>"
            + page.gallery(tiles, **{"data-reason": e["reason"], "data-total": e["count"]})
        )
    chosen = samples.rows((schema.KEPT, None))
    kept_html = f"<p class=note>showing {len(chosen)} of {t.kept} kept images</p>" + page.gallery(
        images.tiles(chosen, cap, config=v.config, stats=v.stats, output_uri=v.uri),
        **{"data-kept-total": t.kept},
    )
    return removed, kept_html


def profile(
    v: AuditedVersion, per_reason: int, kept: int
) -> tuple[counts.Tally, images.Samples, list[Chart], list[Chart]]:
    """What the report shows of the manifest, from two streamed passes: the counts, the gallery
    samples and each histogram's range; then the histograms' counts in bins fixed by those ranges."""
    t, samples = counts.Tally(v.setting("input.uri", "")), sampler(per_reason, kept)
    scores, people = score_charts(v), people_charts(v)
    measures = [c.measure for c in (*scores, *people)]
    v.scan(t, samples, dist.Ranges(measures))
    v.scan(dist.Counts(measures))
    return t, samples, scores, people


def _settings_text(step: dict) -> str:
    shown = {k: v for k, v in step.items() if k not in ("name", "applied")}
    text = json.dumps(shown, sort_keys=True)
    return text if len(text) <= 400 else text[:400] + " ..."


def runs_section(runs: tuple[list[RunRef], list[RunRef]] | None) -> str:
    if runs is None:
        return page.section("runs", "MLflow runs", note="MLflow was not consulted (--no-mlflow or no tracking store).")
    produced, used = runs
    header = ["run id", "experiment", "run name", "stage", "status"]
    row = lambda r: [r.run_id, r.experiment, r.name, r.stage or "-", r.status]  # noqa: E731
    return page.section(
        "runs",
        "MLflow runs",
        "<h3>produced by (curation runs)</h3>",
        page.table(header, [row(r) for r in produced], table_attrs={"id": "produced-by"}),
        "<h3>used by (runs that logged this version as an input)</h3>",
        page.table(header, [row(r) for r in used], table_attrs={"id": "used-by"})
        if used
        else page.Markup("<p class=note>no run has logged this version as an input yet</p>"),
    )


def totals_section(v: AuditedVersion, counted: dict) -> str:
    problems = counts.disagreements(counted, v.stats)
    cards = page.cards(
        [
            ("inputs", counted["inputs"], ""),
            ("kept", counted["kept"], "kept"),
            ("dropped", counted["dropped"], "dropped"),
            ("errors", counted["errors"], "error"),
            ("shards", counted["shards"], ""),
            ("samples in shards", counted["samples_in_shards"], ""),
        ],
        id="totals",
    )
    warn = (
        page.Markup(
            "<div class=warn>stats.json disagrees with the manifest (the page shows the manifest's "
            "counts): " + "; ".join(page.esc(p) for p in problems) + "</div>"
        )
        if problems
        else ""
    )
    return page.section("summary", "Totals", cards, warn)


def funnel_section(counted: dict) -> str:
    steps = counted["funnel"]
    rows = [
        [
            s["step"],
            s["in"],
            s["out"],
            s["in"] - s["out"],
            ", ".join(f"{r}={n}" for r, n in s["removed"].items()) or "-",
        ]
        for s in steps
    ]
    attrs = [
        {
            "data-step": s["step"],
            "data-in": s["in"],
            "data-out": s["out"],
            "data-removed": s["in"] - s["out"],
            "data-reasons": json.dumps(s["removed"], sort_keys=True),
        }
        for s in steps
    ]
    return page.section(
        "funnel",
        "Funnel",
        page.chart(charts.funnel(steps), "funnel"),
        page.table(
            ["step", "in", "out", "removed", "by reason"],
            rows,
            numeric={1, 2, 3},
            table_attrs={"id": "funnel-table"},
            row_attrs=attrs,
        ),
    )


def reasons_section(v: AuditedVersion, t: counts.Tally) -> str:
    reasons = counts.reason_entries(t.removed, v.stats)
    return page.section(
        "reasons",
        "Removed, by reason",
        page.chart(charts.removed_by_reason(reasons), "removed by reason") if reasons else "",
        page.table(
            ["status", "reason", "step", "count"],
            [[e["status"], e["reason"], e["step"], e["count"]] for e in reasons],
            numeric={3},
            table_attrs={"id": "reasons-table"},
            row_attrs=[
                {"data-status": e["status"], "data-reason": e["reason"], "data-count": e["count"]} for e in reasons
            ],
        ),
    )


def sources_section(t: counts.Tally) -> str:
    groups = t.by_source()
    rows = [
        [
            g["group"],
            g["inputs"],
            g["kept"],
            g["dropped"],
            g["error"],
            ", ".join(f"{r}={n}" for r, n in sorted(g["reasons"].items())) or "-",
        ]
        for g in groups
    ]
    attrs = [
        {
            "data-group": g["group"],
            "data-inputs": g["inputs"],
            "data-kept": g["kept"],
            "data-dropped": g["dropped"],
            "data-errors": g["error"],
        }
        for g in groups
    ]
    return page.section(
        "sources",
        "By source",
        page.chart(charts.by_source(groups), "outcome by source"),
        page.table(
            ["source", "inputs", "kept", "dropped", "errors", "reasons"],
            rows,
            numeric={1, 2, 3, 4},
            table_attrs={"id": "sources-table"},
            row_attrs=attrs,
        ),
        note="grouped by input folder, tar file or parquet file, relative to input.uri",
    )


def steps_section(v: AuditedVersion) -> str:
    steps = v.stats.get("steps", [])
    return page.section(
        "filters",
        "Steps and their settings",
        page.table(
            ["step", "applied", "settings"],
            [[s["name"], "yes" if s.get("applied") else "NO", _settings_text(s)] for s in steps],
            table_attrs={"id": "steps-table"},
            row_attrs=[{"data-step": s["name"], "data-applied": str(bool(s.get("applied"))).lower()} for s in steps],
        ),
    )


def charts_section(id_: str, title: str, drawn: list, note: str) -> str:
    """A section of charts: those with something to show, and those drawn even when empty."""
    html = "".join(c.html() for c in drawn if c.always or not c.measure.empty)
    return page.section(id_, title, page.Markup('<div class="charts">' + html + "</div>"), note=note)


def config_section(v: AuditedVersion) -> str:
    yaml_text = page.esc(yaml.safe_dump(v.config, sort_keys=False))
    return page.section(
        "config",
        "Resolved configuration",
        page.Markup("<details><summary>config.yaml</summary><pre>" + yaml_text + "</pre></details>"),
    )


def render_report(
    v: AuditedVersion, *, per_reason: int = 12, kept: int = 24, runs: tuple[list[RunRef], list[RunRef]] | None = None
) -> str:
    """The report page (HTML text) of version ``v`` (``profile``: two streamed passes over its manifest)."""
    t, samples, scores, people = profile(v, per_reason, kept)
    counted = counts.recount(v, t)
    removed_galleries, kept_gallery = galleries(v, t, samples)
    sections = [
        totals_section(v, counted),
        funnel_section(counted),
        reasons_section(v, t),
        sources_section(t),
        steps_section(v),
        charts_section(
            "scores",
            "Score distributions per filter",
            scores,
            "each histogram stacks kept images, images this step removed and images removed by "
            "another step; the dashed line is the step's threshold",
        ),
        charts_section(
            "people",
            "People",
            people,
            "box colours in the galleries: green = salient (kept by the rule), orange = confident "
            "but too small, grey = below the score threshold",
        ),
        page.section(
            "removed-gallery",
            "Removed images, by reason",
            *removed_galleries,
            note="deterministic samples (by SHA-1 of the key); dropped images are read from their "
            "sources, inputs that were errors are shown as their reason",
        ),
        page.section("kept-gallery", "Kept images", kept_gallery),
        runs_section(runs),
        config_section(v),
    ]
    header = [
        f"name {v.version.name} · output {v.uri}",
        f"job digest {v.job_digest} · code version {v.code_version} · "
        f"mlflow run {v.version.run_id or '-'} · {len(v.version.shards)} shards",
        f"explore it interactively (any filter, every image, its duplicate family): {explore_command(v.uri)}",
    ]
    return page.document(f"Dataset version {v.id}", header, sections)


def version_summary(v: AuditedVersion) -> str:
    """The terminal summary of ``v`` (counts by step, reason and source)."""
    return counts.summary_text(v)
