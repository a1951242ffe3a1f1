"""What a query of the explorer may ask for, checked against the version's own vocabulary.

The vocabulary comes from the version, never from a list written here: the steps and the
reasons each owns from stats.json's funnel (``counts.funnel_spec``), more reasons from its
counts and the recipe's steps (``Step.reasons``), and the range columns from the scores the
recipe's applied steps declare (``report.scores_of``: their step and threshold) plus every
other numeric column the manifest holds, and one derived measure: the largest confident
person box under the run's own box rule (``images.box_rule``). A derived score of the recipe
(``Score.derive``, e.g. geometry's short side) has no SQL form and is not offered.

``parse_gallery(params, vocab)`` turns request parameters (strings) into a ``GalleryQuery``;
any bad value is a ``QueryError`` (a ``ValueError``) naming the parameter, and so is a value
that looks like a path leaving the version (``check_value``: ``..``, absolute, a URI, control
characters), whatever the parameter. ``where(query, vocab)`` gives the SQL condition and its
bound parameters: values are never spliced into SQL, and column names come from the manifest's
own schema only.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

import pyarrow as pa

from curation import schema
from curation.audit import counts, images, report
from curation.audit.loading import AuditedVersion
from curation.filters.person import Detector
from curation.recipe import HUMANS1B
from curation.steps import Recipe

MAX_VALUE_CHARS = 1024
RANDOM = "random"  # sort: deterministic random order, the SHA-1 of the key (``images.sample_order``)
BOX_SIZE = "person_box_size"
# Bulky columns no query selects (embeddings and pixels are not for tables).
BULKY = frozenset({*schema.EMBEDDING_COLUMNS, *schema.PAYLOAD_COLUMNS})
GALLERY_PARAMS = ("status", "step", "reason", "source", "sort", "page", "page_size")
_DRIVE = re.compile(r"^[A-Za-z]:")
# The SQL of one box's size under each ``detector.box_size_measure`` (``person.box_size``), box
# ``b`` = [x1, y1, x2, y2] (1-based).
_BOX_SQL = {
    "height": "(b[4] - b[2])",
    "long_side": "greatest(b[3] - b[1], b[4] - b[2])",
    "short_side": "least(b[3] - b[1], b[4] - b[2])",
}


class QueryError(ValueError):
    """A request parameter the version cannot answer: the message names the parameter."""


@dataclasses.dataclass(frozen=True)
class RangeColumn:
    """A value a gallery can be limited to a range of and sorted by."""

    name: str
    sql: str  # a quoted column, or the SQL of a derived measure
    label: str
    step: str = ""  # the step that decides on it, when the recipe says so
    setting: str | None = None  # the step's threshold setting
    threshold: float | None = None
    integer: bool = False


def quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


def box_size_sql(measure: str, threshold: float) -> str:
    """SQL of the largest person box scoring >= ``threshold``, measured as ``person.box_size`` does."""
    size = _BOX_SQL[measure].replace("b[", "person_boxes[i][")
    return (
        "list_max(list_transform(range(1, len(person_boxes) + 1), "
        f"lambda i: CASE WHEN person_scores[i] >= {float(threshold)!r} THEN {size} END))"
    )


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _declared(v: AuditedVersion, recipe: Recipe) -> dict[str, RangeColumn]:
    """The stored scores the recipe's applied steps declare, with their thresholds."""
    out = {}
    for step, s in report.scores_of(v, recipe):
        if s.derive is not None:
            continue
        value = (report.step_description(v, step) or {}).get(s.setting) if s.setting else None
        threshold = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        out[s.column] = RangeColumn(s.column, quoted(s.column), s.label, step, s.setting, threshold, s.integer)
    return out


def range_columns(v: AuditedVersion, recipe: Recipe = HUMANS1B) -> dict[str, RangeColumn]:
    """Every value a gallery can range over: declared scores, the largest confident person box,
    then the manifest's other numeric columns (labelled with the step that writes them)."""
    out = _declared(v, recipe)
    rule = images.box_rule(v.config, v.stats)
    if rule is not None and {"person_boxes", "person_scores"} <= set(v.columns) and rule.measure in _BOX_SQL:
        out[BOX_SIZE] = RangeColumn(
            BOX_SIZE,
            box_size_sql(rule.measure, rule.threshold),
            f"largest person box scoring >= {rule.threshold:g} ({rule.measure}, px)",
            Detector.name,
            "min_box_size",
            rule.min_box_size,
        )
    writer = {name: step.name for step in recipe.steps for name in step.writes}
    for f in v.schema:
        if f.name not in out and _numeric(f.type):
            integer = pa.types.is_integer(f.type)
            out[f.name] = RangeColumn(f.name, quoted(f.name), f.name, writer.get(f.name, ""), integer=integer)
    return out


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """What this version's queries may name: its steps, reasons, columns and range columns."""

    steps: tuple[str, ...]  # funnel order
    owned: dict[str, tuple[str, ...]]  # step -> the reasons it set in this version
    reasons: frozenset[str]
    ranges: dict[str, RangeColumn]
    columns: tuple[str, ...]  # the manifest's, less BULKY
    input_root: str

    @classmethod
    def of(cls, v: AuditedVersion, recipe: Recipe = HUMANS1B) -> Vocabulary:
        spec = counts.funnel_spec(v.stats)
        recorded = {*v.stats.get("dropped_by_reason", {}), *v.stats.get("errors_by_reason", {})}
        declared = {r for step in recipe.steps for r in step.reasons} | set(schema.ERROR_REASONS)
        reasons = frozenset(recorded | declared | {r for _, rs in spec for r in rs})
        columns = tuple(n for n in v.dataset.schema.names if n not in BULKY)
        return cls(
            tuple(s for s, _ in spec),
            dict(spec),
            reasons,
            range_columns(v, recipe),
            columns,
            v.setting("input.uri", ""),
        )

    def reasons_of(self, step: str) -> tuple[str, ...]:
        return self.owned.get(step, ())


@dataclasses.dataclass(frozen=True)
class GalleryQuery:
    """One gallery: which rows (every given filter holds), in which order, which page."""

    status: str | None = None
    step: str | None = None
    reason: str | None = None
    source: str | None = None  # a folder, tar or Parquet file relative to input.uri: every input under it
    ranges: tuple[tuple[str, float | None, float | None], ...] = ()  # (column, min, max), both inclusive
    sort: str = ""  # "": manifest order; RANDOM; "<column>" ascending; "-<column>" descending
    page: int = 1
    page_size: int = 48

    @property
    def counted_by_stats(self) -> bool:
        """Whether stats.json holds this gallery's count (status, step and reason filters only)."""
        return self.source is None and not self.ranges

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.page_size

    def params(self, **changes) -> dict[str, str]:
        """The request parameters of this query (with ``changes``), for links."""
        q = dataclasses.replace(self, **changes)
        out = {k: str(getattr(q, k)) for k in ("status", "step", "reason", "source") if getattr(q, k) is not None}
        for column, lo, hi in q.ranges:
            out |= {f"min.{column}": f"{lo:g}"} if lo is not None else {}
            out |= {f"max.{column}": f"{hi:g}"} if hi is not None else {}
        out |= {"sort": q.sort} if q.sort else {}
        return out | {"page": str(q.page), "page_size": str(q.page_size)}


def check_value(name: str, value: str) -> str:
    """``value`` when it is a plain value; a QueryError when it is too long, holds control
    characters, or reads as a path leaving the version (absolute, a URI, a drive, a ``..``)."""
    if len(value) > MAX_VALUE_CHARS:
        raise QueryError(f"parameter {name!r} is longer than {MAX_VALUE_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise QueryError(f"parameter {name!r} holds control characters")
    segments = value.replace("\\", "/").split("/")
    if ".." in segments or value.startswith(("/", "\\", "~")) or _DRIVE.match(value) or "://" in value:
        raise QueryError(f"parameter {name!r}: {value!r} is a path outside the version (absolute, a URI or '..')")
    return value


def check_params(params: Mapping[str, str], allowed) -> None:
    """Every parameter is one ``allowed(name)`` accepts, with a plain value (``check_value``)."""
    for name, value in params.items():
        check_value(name, name)
        check_value(name, value)
        if not allowed(name):
            raise QueryError(f"unknown parameter {name!r}")


def _choice(params: Mapping[str, str], name: str, known, what: str) -> str | None:
    value = params.get(name) or None
    if value is not None and value not in known:
        raise QueryError(f"{name}: {value!r} is not a {what} of this version (known: {', '.join(sorted(known))})")
    return value


def positive_int(params: Mapping[str, str], name: str, default: int, most: int | None = None) -> int:
    raw = params.get(name) or str(default)
    if not raw.isdigit() or int(raw) < 1:
        raise QueryError(f"{name}: {raw!r} is not a whole number >= 1")
    if most is not None and int(raw) > most:
        raise QueryError(f"{name}: {raw} is more than {most}")
    return int(raw)


def _number(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise QueryError(f"{name}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise QueryError(f"{name}: {raw!r} is not a finite number")
    return value


def _ranges(params: Mapping[str, str], vocab: Vocabulary) -> tuple[tuple[str, float | None, float | None], ...]:
    bounds: dict[str, list] = {}
    for name, raw in params.items():
        side, _, column = name.partition(".")
        if side not in ("min", "max") or not raw:
            continue
        if column not in vocab.ranges:
            raise QueryError(f"{name}: {column!r} is not a score or numeric column of this version")
        bounds.setdefault(column, [None, None])[side == "max"] = _number(name, raw)
    for column, (lo, hi) in bounds.items():
        if lo is not None and hi is not None and lo > hi:
            raise QueryError(f"min.{column} = {lo:g} is above max.{column} = {hi:g}: an empty range")
    return tuple((c, lo, hi) for c, (lo, hi) in sorted(bounds.items()))


def _sort(params: Mapping[str, str], vocab: Vocabulary) -> str:
    value = params.get("sort") or ""
    if value and value != RANDOM and value.removeprefix("-") not in vocab.ranges:
        raise QueryError(f"sort: {value!r} is neither {RANDOM!r} nor a score or numeric column (- for descending)")
    return value


def is_gallery_param(name: str) -> bool:
    return name in GALLERY_PARAMS or name.partition(".")[0] in ("min", "max")


def parse_gallery(params: Mapping[str, str], vocab: Vocabulary, page_size: int, max_page_size: int) -> GalleryQuery:
    """The gallery ``params`` ask for; a QueryError naming the first bad parameter."""
    check_params(params, is_gallery_param)
    source = params.get("source") or None
    return GalleryQuery(
        status=_choice(params, "status", schema.STATUSES, "status"),
        step=_choice(params, "step", vocab.steps, "step"),
        reason=_choice(params, "reason", vocab.reasons, "reason"),
        source=source.strip("/") if source else None,
        ranges=_ranges(params, vocab),
        sort=_sort(params, vocab),
        page=positive_int(params, "page", 1),
        page_size=positive_int(params, "page_size", page_size, max_page_size),
    )


def source_prefix(vocab: Vocabulary, source: str) -> str:
    """The URI prefix of the inputs under ``source`` (relative to the run's input.uri)."""
    root = vocab.input_root.rstrip("/")
    return f"{root}/{source}" if root else source


def source_range(vocab: Vocabulary, source: str) -> tuple[str, str]:
    """[low, high): every source under ``source`` lies in it, as ``#`` < ``/`` < ``0``."""
    prefix = source_prefix(vocab, source)
    return prefix + "#", prefix + "0"


def where(q: GalleryQuery, vocab: Vocabulary) -> tuple[str, list]:
    """The SQL condition of ``q``'s filters and its bound parameters (``TRUE`` with none)."""
    terms, params = [], []
    for column, value in (("status", q.status), ("reason", q.reason)):
        if value is not None:
            terms.append(f"{column} = ?")
            params.append(value)
    if q.step is not None:
        owned = vocab.reasons_of(q.step)
        terms.append(f"reason IN ({', '.join('?' * len(owned))})" if owned else "FALSE")
        params += owned
    if q.source is not None:
        # ``source_range`` lets the scan prune row groups by their statistics; starts_with says exactly.
        prefix = source_prefix(vocab, q.source)
        terms.append("source >= ? AND source < ? AND (starts_with(source, ?) OR starts_with(source, ?))")
        params += [*source_range(vocab, q.source), prefix + "/", prefix + "#"]
    for column, lo, hi in q.ranges:
        sql = vocab.ranges[column].sql
        for bound, op in ((lo, ">="), (hi, "<=")):
            if bound is not None:
                terms.append(f"{sql} {op} ?")
                params.append(bound)
    return (" AND ".join(terms) or "TRUE"), params


def order_by(q: GalleryQuery, vocab: Vocabulary) -> str:
    """The ORDER BY clause (empty: the manifest's own order, parts by path, rows as written)."""
    if not q.sort:
        return ""
    if q.sort == RANDOM:
        return "ORDER BY sha1(key)"
    column = q.sort.removeprefix("-")
    direction = "DESC" if q.sort.startswith("-") else "ASC"
    return f"ORDER BY {vocab.ranges[column].sql} {direction} NULLS LAST, key"
