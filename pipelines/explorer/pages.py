"""What each page of the explorer shows, as template values (``templates/``: the markup).

Every value here comes from the version: the funnel and its reasons from stats.json
(``counts.funnel_entries``), galleries and images from ``ManifestQuery``, changes from
``FateChanges``. Links are plain URLs with query parameters (``url``), so every view can be
bookmarked and shared.
"""

from __future__ import annotations

from urllib.parse import urlencode

from curation import schema
from curation.audit import counts, images
from curation.audit.explore_diff import ABSENT, OUTCOME_COLUMNS, FateGroup, known_status, outcome
from curation.audit.explore_filters import (
    QueryError,
    check_params,
    parse_gallery,
    positive_int,
)
from curation.audit.explore_query import FAMILY_COLUMNS, GALLERY_COLUMNS
from pipelines.explorer.session import ExploreSession, Side

REPRESENTATIVE_RULE = (
    "the copy a family keeps is its representative (curation.dedup.representative_sort_key): an original "
    "encoding over a conversion, then fewer quality flaws, then the larger resolution, then more input bytes "
    "per pixel, then the smallest key; the representative then went through the later steps like any image"
)
WHY = {
    schema.EXACT_DUPLICATE: "identical input bytes (SHA-256)",
    schema.NEAR_DUPLICATE: "perceptual hash within dedup.near.max_distance bits",
    schema.SEMANTIC_DUPLICATE: "CLIP embeddings within dedup.semantic's cosine threshold",
}


def url(path: str, params: dict | None = None) -> str:
    return f"{path}?{urlencode(params)}" if params else path


def source_link(s: ExploreSession, source: str) -> str | None:
    """The gallery of the inputs of ``source``'s group, when that group can be named in a request."""
    group = counts.source_group(source, s.version.setting("input.uri", ""))
    if group == "(top level)" or group.startswith("/") or "://" in group:
        return None
    return url("/images", {"source": group})


def tile(s: ExploreSession, row: dict, of: str = "", lines: tuple[str, ...] = ()) -> dict:
    """A gallery tile: the image's links, its thumbnail (none for an error row) and caption."""
    key = row["key"]
    side = {"of": of} if of else {}
    values = [f"{k.removeprefix('value.')} {v:.4g}" for k, v in row.items() if k.startswith("value.") and v is not None]
    size = f"{row['width']}x{row['height']}" if row.get("width") else ""
    return {
        "key": key,
        "status": row["status"],
        "reason": row.get("reason"),
        "href": url("/image", {"key": key, **side}),
        "thumb": None if row["status"] == schema.ERROR else url("/thumb", {"key": key, **side}),
        "lines": [*lines, row.get("reason") or row["status"], key, " · ".join(x for x in [size, *values] if x)],
        "source": source_link(s, row["source"]) if row.get("source") else None,
    }


def funnel_page(s: ExploreSession) -> dict:
    stats, root = s.version.stats, s.version.setting("input.uri", "")
    steps = set(s.explored.query.vocab.steps)
    funnel = [
        {**e, "link": url("/images", {"step": e["step"]}) if e["step"] in steps else None}
        for e in counts.funnel_entries(stats)
    ]
    reasons = counts.reason_entries(s.explored.query.stats_removed(), stats)
    for e in reasons:
        e["link"] = url("/images", {"status": e["status"], "reason": e["reason"]})
    return {
        "title": f"Dataset version {s.version.id}",
        "totals": [
            ("inputs", stats.get("inputs", 0), url("/images")),
            ("kept", stats.get("kept", 0), url("/images", {"status": schema.KEPT})),
            ("dropped", stats.get("dropped", 0), url("/images", {"status": schema.DROPPED})),
            ("errors", stats.get("errors", 0), url("/images", {"status": schema.ERROR})),
        ],
        "funnel": funnel,
        "reasons": reasons,
        "steps": [dict(d) for d in stats.get("steps", [])],
        "ranges": list(s.explored.query.vocab.ranges.values()),
        "input_root": root,
    }


def gallery_page(s: ExploreSession, params) -> dict:
    query = s.explored.query
    q = parse_gallery(params, query.vocab, s.cfg.page_size, s.cfg.max_page_size)
    page = query.page(q)
    total, exact = query.count(q)
    pages = -(-total // q.page_size) if exact else None
    return {
        "title": "Images",
        "q": q,
        "form": {**q.params(page=1)},
        "tiles": [tile(s, r) for r in page.rows],
        "total": total,
        "exact": exact,
        "pages": pages,
        "prev": url("/images", q.params(page=q.page - 1)) if q.page > 1 else None,
        "next": url("/images", q.params(page=q.page + 1)) if page.has_next else None,
        "vocab": query.vocab,
        "statuses": schema.STATUSES,
    }


def _box_rows(s: ExploreSession, row: dict) -> list[dict]:
    rule = images.box_rule(s.version.config, s.version.stats)
    out = []
    for box, score in zip(row.get("person_boxes") or [], row.get("person_scores") or []):
        colour = rule.colour(box, score)[0] if rule else "#9e9e9e"
        verdict = {"#00c853": "salient", "#ff9100": "confident, too small", "#9e9e9e": "below threshold"}[colour]
        out.append({"box": [round(float(c), 1) for c in box], "score": round(float(score), 3), "verdict": verdict})
    return out


def _family(s: ExploreSession, side: Side, row: dict, of: str) -> dict | None:
    fam = side.query.family(row)
    if fam is None:
        return None
    rep = fam.representative
    members = [
        {**tile(s, m, of), "row": m, "why": WHY.get(m.get("reason"), m.get("reason") or "-")} for m in fam.members
    ]
    return {
        "representative": {**tile(s, rep, of), "row": rep} if rep else None,
        "members": members,
        "total": fam.total,
        "kept": rep is not None and rep["status"] == schema.KEPT,
        "columns": [c for c in FAMILY_COLUMNS if c in side.query.vocab.columns and c not in GALLERY_COLUMNS],
        "rule": REPRESENTATIVE_RULE,
    }


def image_page(s: ExploreSession, params) -> dict:
    check_params(params, lambda name: name in ("key", "of"))
    of = params.get("of") or ""
    side = s.side(of)
    key = params.get("key") or ""
    row = side.query.row(key) if key else None
    if row is None:
        raise LookupError(f"key: {key!r} is not an image of version {side.version.id}")
    fate = s.changes.fate(key) if s.changes is not None else None
    annotation = s.annotations.row(key, row.get("shard")) if s.annotations and not of else None
    return {
        "title": f"Image {key}",
        "row": row,
        "of": of,
        "thumb": None if row["status"] == schema.ERROR else url("/thumb", {"key": key, "side": 640, **_of(of)}),
        "boxes": _box_rows(s, row),
        "family": _family(s, side, row, of),
        "neighbours": side.query.neighbours(row),
        "fate": dict(zip(OUTCOME_COLUMNS, fate)) if fate else None,
        "annotation": annotation,
        "source": source_link(s, row["source"]) if not of else None,
        "version_id": side.version.id,
    }


def _of(of: str) -> dict:
    return {"of": of} if of else {}


def _group_params(s: ExploreSession, params) -> tuple | None:
    """The (A status, A reason, B status, B reason) a changes page names, checked; None for none."""
    if not any(params.get(c) for c in OUTCOME_COLUMNS):
        return None
    vocab = {"a": s.against.query.vocab, "b": s.explored.query.vocab}
    values = []
    for side in ("a", "b"):
        status, reason = params.get(f"{side}_status") or "", params.get(f"{side}_reason") or None
        if not known_status(status):
            raise QueryError(f"{side}_status: {status!r} is not kept, dropped, error or {ABSENT}")
        if reason is not None and reason not in vocab[side].reasons:
            raise QueryError(f"{side}_reason: {reason!r} is not a reason of version {vocab_id(s, side)}")
        values += [status, reason]
    return tuple(values)


def vocab_id(s: ExploreSession, side: str) -> str:
    return (s.against if side == "a" else s.explored).version.id


def _change_tiles(s: ExploreSession, g: FateGroup, keys: list[str]) -> list[dict]:
    """Tiles of changed images: from B when B holds the image, else from A."""
    side, of = (s.against, "against") if g.b_status == ABSENT else (s.explored, "")
    found = side.query.rows(keys, GALLERY_COLUMNS)
    line = f"{outcome(g.a_status, g.a_reason)} -> {outcome(g.b_status, g.b_reason)}"
    return [tile(s, found[k], of, (line,)) for k in keys if k in found]


def changes_page(s: ExploreSession, params) -> dict:
    if s.changes is None:
        raise LookupError("no --against version: start the explorer with --against <version> to compare")
    check_params(params, lambda name: name in (*OUTCOME_COLUMNS, "page", "page_size"))
    wanted = _group_params(s, params)
    page = positive_int(params, "page", 1)
    size = positive_int(params, "page_size", s.cfg.page_size, s.cfg.max_page_size)
    group = s.changes.group(*wanted) if wanted else None
    keys = s.changes.keys(group, (page - 1) * size, size + 1) if group else []
    base = group.params() if group else {}
    return {
        "title": f"Changes from {s.against.version.id} to {s.version.id}",
        "groups": [
            {
                "g": g,
                "link": url("/changes", g.params()),
                "from": outcome(g.a_status, g.a_reason),
                "to": outcome(g.b_status, g.b_reason),
            }
            for g in s.changes.groups
        ],
        "total": s.changes.total,
        "config_changes": s.changes.config_changes,
        "code": (s.against.version.code_version, s.version.code_version),
        "wanted": wanted,
        "group": group,
        "tiles": _change_tiles(s, group, keys[:size]) if group else [],
        "page": page,
        "prev": url("/changes", {**base, "page": page - 1, "page_size": size}) if page > 1 else None,
        "next": url("/changes", {**base, "page": page + 1, "page_size": size}) if len(keys) > size else None,
        "a": s.against.version,
    }
