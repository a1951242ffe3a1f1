"""Queries of the explorer over a version's partitioned manifest, without loading it: DuckDB.

``ManifestQuery(version, config)`` opens an in-memory DuckDB whose view ``manifest`` reads the
version's Parquet parts in place (``read_parquet``: only the columns a query names, its filter
pushed into the scan, row groups pruned by their statistics, and a LIMIT that stops the scan);
nothing of the manifest is loaded when it opens. It answers:

- ``page(query)``: one page of a gallery (``explore_filters.GalleryQuery``) with one row more
  than the page to know whether another follows. In the manifest's own order (parts by path,
  rows as written: DuckDB keeps insertion order) the scan stops once the page is found, so page
  1 and page 1,000 read only the rows up to them; a sort by a score or ``random`` reads every row
  the filters let through (a top-k, never a full sort in memory).
- ``count(query)``: from stats.json when only status, step and reason filter (exact, no scan),
  else counted up to ``count_limit`` (a scan that stops there).
- A gallery of one source reads only the parts whose source range meets it (the index's).
- ``row(key)``, ``rows(keys)``, ``family(row)``, ``neighbours(row)``: through the version's
  ``ExploreIndex`` (key ranges per part, duplicate families sorted), so one image or one family
  reads the parts that may hold it, not the manifest.

Memory is bounded by ``ExploreConfig.memory_limit`` (DuckDB spills sorts to the cache folder).
The index and thumbnails live in the cache folder (``cache_folder``): ``cache_dir`` or the user's
cache, one folder per version id and output URI; the version's own folder is never written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections import Counter
from pathlib import Path

from curation import schema
from curation.audit.explore_filters import BULKY, GalleryQuery, Vocabulary, order_by, quoted, source_range, where
from curation.audit.explore_index import ExploreIndex, scan
from curation.audit.loading import AuditedVersion

GALLERY_COLUMNS = ("key", "status", "reason", "source", "shard", "width", "height", "duplicate_of")
FAMILY_COLUMNS = (
    *GALLERY_COLUMNS,
    "duplicate_group",
    "converted",
    "rank_quality",
    "input_bytes",
    "sha256",
    "phash",
)
THUMB_COLUMNS = ("key", "status", "reason", "error_message", "source", "shard", "person_boxes", "person_scores")


@dataclasses.dataclass(kw_only=True)
class ExploreConfig:
    """Settings of the explorer (``pipelines/explore.py``'s flags of the same names)."""

    page_size: int = 48  # images per gallery page unless the request says otherwise
    max_page_size: int = 480
    count_limit: int = 100_000  # a gallery filtered by source or a range is counted up to here
    family_limit: int = 200  # members of a duplicate family shown (the count covers all)
    neighbour_scan_rows: int = 100_000  # rows with embeddings a neighbour search reads (no vector index)
    neighbours: int = 12
    threads: int = 2  # DuckDB's
    memory_limit: str = "1GB"  # DuckDB's; sorts past it spill into the cache folder
    cache_dir: str = ""  # "": $XDG_CACHE_HOME/humanvision/explore (or ~/.cache/...)

    def __post_init__(self) -> None:
        for name in (
            "page_size",
            "max_page_size",
            "count_limit",
            "family_limit",
            "neighbour_scan_rows",
            "neighbours",
            "threads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"explore.{name} must be >= 1, got {getattr(self, name)}")
        if self.page_size > self.max_page_size:
            raise ValueError(f"explore.page_size ({self.page_size}) is above explore.max_page_size")


def cache_folder(v: AuditedVersion, cfg: ExploreConfig) -> Path:
    """Where the explorer keeps what it builds for ``v``: one folder per version id and output URI."""
    base = cfg.cache_dir or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "humanvision", "explore")
    return Path(base).expanduser() / f"{v.id}-{hashlib.sha1(v.uri.encode()).hexdigest()[:10]}"


def connect(cfg: ExploreConfig, folder: Path):
    """An in-memory DuckDB with the explorer's limits; its spill files under ``folder``."""
    try:
        import duckdb
    except ImportError as err:  # pragma: no cover - a dependency of the project
        raise ImportError("the explorer needs duckdb: pip install duckdb==2.0.1") from err
    (folder / "spill").mkdir(parents=True, exist_ok=True)
    db = duckdb.connect(
        config={
            "threads": cfg.threads,
            "memory_limit": cfg.memory_limit,
            "temp_directory": str(folder / "spill"),
        }
    )
    db.execute("SET parquet_metadata_cache = true")
    return db


def _dicts(cursor) -> list[dict]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _summarise(row: dict) -> dict:
    """``row`` with its bulky values (embeddings) replaced by what they are."""
    return {k: (f"<{len(v)} values>" if k in BULKY and v is not None else v) for k, v in row.items()}


@dataclasses.dataclass(frozen=True)
class Page:
    rows: list[dict]
    has_next: bool


@dataclasses.dataclass(frozen=True)
class Family:
    """A duplicate family: its representative (the row every member names in ``duplicate_of``)
    and members; ``total`` counts every member, ``members`` holds at most ``family_limit``."""

    representative: dict | None  # None when its row is missing from the manifest
    members: list[dict]
    total: int


class ManifestQuery:
    """The explorer's queries over one version (see the module doc). Thread-safe: each call
    runs on a cursor of its own."""

    def __init__(self, v: AuditedVersion, cfg: ExploreConfig | None = None) -> None:
        if type(v.output.fs).__name__ != "LocalFileSystem":
            raise ValueError(f"the explorer reads local versions only; {v.uri!r} is on {type(v.output.fs).__name__}")
        self.v, self.cfg = v, cfg or ExploreConfig()
        self.vocab = Vocabulary.of(v)
        self.folder = cache_folder(v, self.cfg)
        self.db = connect(self.cfg, self.folder)
        self.index = ExploreIndex.open(self.db, v.parts, "duplicate_of" in self.vocab.columns, self.folder / "index")
        self.db.execute(f"CREATE VIEW manifest AS SELECT * FROM {scan(v.parts, union=not self.index.same_schema)}")

    def _select(self, columns) -> str:
        return ", ".join(quoted(c) for c in columns if c in self.vocab.columns)

    def _run(self, sql: str, params: list) -> list[dict]:
        return _dicts(self.db.cursor().execute(sql, params))

    def _table(self, q: GalleryQuery) -> str | None:
        """What ``q`` reads: the manifest, or for one source the parts whose sources may hold it
        (``ExploreIndex.parts_with_sources``); None when no part can."""
        if q.source is None:
            return "manifest"
        parts = self.index.parts_with_sources(*source_range(self.vocab, q.source))
        return scan(parts, union=not self.index.same_schema) if parts else None

    def page(self, q: GalleryQuery) -> Page:
        """Page ``q.page`` of the gallery ``q``: its rows (``GALLERY_COLUMNS`` and the values it
        ranges over or sorts by, as ``value.<name>``)."""
        table = self._table(q)
        if table is None:
            return Page([], False)
        condition, params = where(q, self.vocab)
        shown = dict.fromkeys([c for c, _, _ in q.ranges] + ([q.sort.removeprefix("-")] if q.sort else []))
        values = "".join(
            f", {self.vocab.ranges[c].sql} AS {quoted('value.' + c)}" for c in shown if c in self.vocab.ranges
        )
        sql = (
            f"SELECT {self._select(GALLERY_COLUMNS)}{values} FROM {table} WHERE {condition} "
            f"{order_by(q, self.vocab)} LIMIT ? OFFSET ?"
        )
        rows = self._run(sql, [*params, q.page_size + 1, q.offset])
        return Page(rows[: q.page_size], len(rows) > q.page_size)

    def stats_removed(self) -> Counter:
        """(status, reason) -> rows, for the rows not kept, as stats.json records them."""
        s = self.v.stats
        return Counter(
            {(schema.DROPPED, r): n for r, n in s.get("dropped_by_reason", {}).items()}
            | {(schema.ERROR, r): n for r, n in s.get("errors_by_reason", {}).items()}
        )

    def stats_count(self, q: GalleryQuery) -> int:
        """How many rows ``q``'s status, step and reason filters let through, from stats.json."""
        groups = [((schema.KEPT, None), self.v.stats.get("kept", 0)), *self.stats_removed().items()]
        owned = set(self.vocab.reasons_of(q.step)) if q.step is not None else None
        return sum(
            n
            for (status, reason), n in groups
            if q.status in (None, status) and q.reason in (None, reason) and (owned is None or reason in owned)
        )

    def count(self, q: GalleryQuery) -> tuple[int, bool]:
        """(rows the filters of ``q`` let through, exact): from stats.json when it holds the
        count, else counted up to ``count_limit`` (not exact when the limit was reached)."""
        if q.counted_by_stats:
            return self.stats_count(q), True
        table = self._table(q)
        if table is None:
            return 0, True
        condition, params = where(q, self.vocab)
        limit = self.cfg.count_limit
        sql = f"SELECT count(*) AS n FROM (SELECT 1 FROM {table} WHERE {condition} LIMIT ?)"
        n = self._run(sql, [*params, limit + 1])[0]["n"]
        return min(n, limit), n <= limit

    def _rows(self, keys) -> list[dict]:
        """Whole manifest rows of ``keys``, read from the parts the index says may hold them."""
        keys = sorted(set(keys))
        parts = self.index.parts_holding(keys)
        if not keys or not parts:
            return []
        return self._run(f"SELECT * FROM {scan(parts)} WHERE key IN ({', '.join('?' * len(keys))})", keys)

    def rows(self, keys, columns=None) -> dict[str, dict]:
        """The manifest rows of ``keys``: ``columns`` of them (all when None; a column a part
        lacks is None), bulky values summarised."""
        wanted = self.vocab.columns if columns is None else [c for c in columns if c in self.vocab.columns]
        return {r["key"]: _summarise({c: r.get(c) for c in wanted}) for r in self._rows(keys)}

    def row(self, key: str, columns=None) -> dict | None:
        """One image's manifest row (every column but the bulky ones, summarised), or None."""
        return self.rows([key], columns).get(key)

    def family(self, row: dict) -> Family | None:
        """The duplicate family ``row`` belongs to (as a member or as the representative), or
        None when it has none."""
        rep = row.get("duplicate_of") or row["key"]
        families = self.index.families
        (total,) = self.db.cursor().execute(f"SELECT count(*) FROM {families} WHERE duplicate_of = ?", [rep]).fetchone()
        if not total:
            return None
        sql = f"SELECT key FROM {families} WHERE duplicate_of = ? ORDER BY key LIMIT ?"
        members = [r["key"] for r in self._run(sql, [rep, self.cfg.family_limit])]
        found = self.rows([rep, *members], FAMILY_COLUMNS)
        return Family(found.get(rep), [found[k] for k in members if k in found], total)

    def neighbours(self, row: dict) -> list[dict] | None:
        """The images nearest ``row`` by cosine of the version's embedding (``schema.EMBEDDING_COLUMNS``:
        CLIP's where it has one, else the backbone's), among the first ``neighbour_scan_rows`` rows
        holding one (a bounded scan: no vector index); None when the version holds no embeddings or
        ``row`` has none."""
        column = next((c for c in schema.EMBEDDING_COLUMNS if c in self.v.dataset.schema.names), None)
        if column is None:
            return None
        mine = next((r.get(column) for r in self._rows([row["key"]])), None)
        if mine is None:
            return None
        vector = f"FLOAT[{len(mine)}]"  # fixed-size arrays: DuckDB's list_cosine_similarity refuses Parquet's lists
        sql = (
            f"SELECT key, status, reason, array_cosine_similarity({column}::{vector}, ?::{vector}) AS cosine "
            f"FROM (SELECT key, status, reason, {column} FROM manifest "
            f"WHERE {column} IS NOT NULL AND key <> ? LIMIT ?) ORDER BY cosine DESC, key LIMIT ?"
        )
        return self._run(sql, [list(mine), row["key"], self.cfg.neighbour_scan_rows, self.cfg.neighbours])
