"""The sweep's comparison page: self-contained HTML (the curation audit's page kit,
``curation.audit.page``: inline CSS, no script), every figure also in a ``data-*`` attribute so a
browser test reads it through the DOM.

Sections: the variants (status, dataset size, what they change, stages run or reused), each
probe metric per variant (per-seed values, mean, spread, difference to the baseline, the noise it
must exceed, the verdict), each variant's dataset against the baseline's (the audit diff: the
settings that changed, the images that changed fate and why, a link to the full diff page), and
the failures with their errors.
"""

from __future__ import annotations

from curation.audit import page
from pipelines.sweeper.compare import WITHIN_NOISE, MetricStats, VariantSummary, Versus
from pipelines.sweeper.config import SweepConfig

PAGE_FILE = "comparison.html"
KEYS_SHOWN = 5  # first keys of each group of images that changed fate


def _num(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _kept(v: VariantSummary) -> int | None:
    data = v.dataset
    return data.kept if data is not None else None


def _stages(v: VariantSummary) -> str:
    ran = sum(st == "ran" for s in v.seeds for st in s.stages.values())
    reused = sum(st == "reused" for s in v.seeds for st in s.stages.values())
    return f"{ran} ran, {reused} reused"


def variants_section(variants: list[VariantSummary]) -> str:
    base_kept = _kept(variants[0])
    rows, attrs = [], []
    for v in variants:
        kept = _kept(v)
        delta = kept - base_kept if kept is not None and base_kept is not None else None
        changed = "; ".join(f"{k}: {a} -> {b}" for k, a, b in v.settings) or "(the baseline)"
        data = v.dataset
        rows.append(
            [v.name, v.status, f"{len(v.finished)}/{len(v.seeds)}", data.dataset_id if data else "-",
             "-" if kept is None else kept, "-" if delta is None else f"{delta:+d}", changed, _stages(v),
             f"{sum(s.seconds for s in v.seeds):.0f}"]
        )  # fmt: skip
        attrs.append(
            {"data-variant": v.name, "data-status": v.status, "data-kept": kept, "data-delta-kept": delta,
             "data-dataset": data.dataset_id if data else None, "data-stages": _stages(v),
             "data-settings": ",".join(k for k, _, _ in v.settings)}
        )  # fmt: skip
    header = ["variant", "status", "seeds finished", "dataset version", "kept images", "vs baseline"]
    table = page.table(
        [*header, "settings changed (vs baseline)", "stages", "seconds"],
        rows,
        numeric={4, 5, 8},
        table_attrs={"id": "variants"},
        row_attrs=attrs,
    )
    return page.section("variants-section", "Variants", table, note="the first row is the baseline")


def _metric_row(v: VariantSummary, key: str, baseline: bool) -> tuple[list, dict]:
    s: MetricStats | None = v.stats.get(key)
    d: Versus | None = v.versus.get(key)
    if s is None:
        reason = "no finished seed" if not v.finished else "not reported"
        return [v.name, "-", "-", "-", "-", "-", reason], {"data-variant": v.name, "data-verdict": reason}
    verdict = "baseline" if baseline else d.verdict if d else "not in the baseline"
    row = [v.name, ", ".join(_num(x) for x in s.values), _num(s.mean), _num(s.spread)]
    row += ["-" if d is None else f"{d.delta:+.4f}", _num(d.noise) if d else "-", verdict]
    attrs = {"data-variant": v.name, "data-mean": s.mean, "data-spread": s.spread, "data-n": len(s.values)}
    attrs |= {"data-delta": d.delta if d else None, "data-noise": d.noise if d else None, "data-verdict": verdict}
    return row, attrs


def metrics_section(variants: list[VariantSummary], noise_factor: float) -> str:
    keys = list(dict.fromkeys(k for v in variants for k in v.stats))
    parts = []
    for key in keys:
        stats = next(v.stats[key] for v in variants if key in v.stats)
        better = f" ({stats.better} is better)" if stats.better else ""
        rows, attrs = zip(*(_metric_row(v, key, i == 0) for i, v in enumerate(variants)))
        table = page.table(
            ["variant", "per seed", "mean", "spread (sd)", "vs baseline", "noise", "verdict"],
            list(rows),
            numeric={2, 3, 4, 5},
            table_attrs={"id": f"metric-{key}", "data-metric": key, "class": "metric"},
            row_attrs=[{**a, "data-metric": key} for a in attrs],
        )
        parts.append(page.Markup(f"<h3>{page.esc(key)}{page.esc(better)}</h3>") + table)
    note = (
        f"spread: standard deviation over seeds; a difference counts only when it exceeds {noise_factor:g} "
        f"standard errors of the difference of the means (noise), else it is '{WITHIN_NOISE}'; with one seed on "
        "either side no claim is made. With two seeds the spread itself is rough: a screen, not a test."
    )
    if not parts:
        parts = [page.Markup("<p class=note>no probe metrics (no variant ran the probe stage)</p>")]
    return page.section("metrics", "Probe metrics over seeds", *parts, note=note)


def _fate_part(v: VariantSummary) -> str:
    title = page.Markup(f'<h3 id="fate-{page.esc(v.name)}">{page.esc(v.name)}</h3>')
    f = v.fate
    if f is None:
        text = "no dataset to compare: this variant or the baseline did not curate"
        return title + page.Markup(f'<p class="note" data-fate="none" data-variant="{page.esc(v.name)}">{text}</p>')
    if f.same:
        text = "the baseline's dataset version: no image changed fate (what differs is training or probing)"
        return title + page.Markup(f'<p data-fate="same" data-variant="{page.esc(v.name)}">{page.esc(text)}</p>')
    cards = page.cards(
        [("added", f.added, "kept"), ("removed", f.removed, "dropped"), ("kept in both", f.kept_in_both, ""),
         ("renamed", f.renamed, "")],
        **{"data-variant": v.name, "data-fate": "changed"},
    )  # fmt: skip
    settings = ", ".join(f.settings) or "none (code version or input)"
    groups = page.table(
        ["images", "the other side's status", "reason", "step", "count", "explained by", "first keys"],
        [[g["direction"], g["status"], g["reason"], g["step"], g["count"], ", ".join(g["explained_by"]) or "-",
          ", ".join(g["keys"][:KEYS_SHOWN])] for g in f.groups],
        numeric={4},
        table_attrs={"id": f"fate-groups-{v.name}", "data-variant": v.name},
        row_attrs=[{"data-direction": g["direction"], "data-reason": g["reason"], "data-count": g["count"],
                    "data-explained-by": ",".join(g["explained_by"])} for g in f.groups],
    )  # fmt: skip
    link = page.Markup(f'<p><a class="diff-page" href="{page.esc(f.page)}">the full audit diff (galleries)</a></p>')
    text = page.Markup(f"<p>content settings changed: {page.esc(settings)}</p>")
    return title + text + cards + groups + link


def datasets_section(variants: list[VariantSummary]) -> str:
    parts = [_fate_part(v) for v in variants[1:]] or [page.Markup("<p class=note>only the baseline</p>")]
    note = "the curation audit's diff of each variant's dataset version against the baseline's"
    return page.section("datasets", "Datasets against the baseline", *parts, note=note)


def failures_section(variants: list[VariantSummary]) -> str:
    failed = [(v, s) for v in variants for s in v.seeds if s.status == "failed"]
    if not failed:
        return page.section("failures", "Failures: none", page.Markup("<p class=note>every run finished</p>"))
    items = "".join(
        f'<div class="warn" data-variant="{page.esc(v.name)}" data-seed="{s.seed}"><b>{page.esc(v.name)}, seed '
        f'{s.seed}</b><pre style="white-space:pre-wrap">{page.esc(s.error)}</pre></div>'
        for v, s in failed
    )
    return page.section("failures", f"Failures: {len(failed)}", page.Markup(items))


def render_page(cfg: SweepConfig, variants: list[VariantSummary], budget: list[str], uri: str, run_id: str) -> str:
    """The whole page (HTML text); ``variants`` baseline first; ``budget``: lines saying what every
    variant shares."""
    header = [
        f"baseline: {variants[0].name} · seeds {', '.join(map(str, cfg.seeds))} · DAG config {cfg.dag}",
        *budget,
        f"MLflow: {uri} · sweep run {run_id}",
    ]
    sections = [
        variants_section(variants),
        metrics_section(variants, cfg.noise_factor),
        datasets_section(variants),
        failures_section(variants),
    ]
    return page.document(f"Sweep {cfg.name}: which data makes a better model", header, sections)
