"""The explorer's index of a version: where each key lies and each duplicate family, built once.

A query that names one key (an image, its family) must not read every manifest part: at 1e9
rows that is a full scan per click. The index, built into the version's cache folder the first
time it is explored (one pass over the parts' footers, one over two columns), answers them:

- ``parts.parquet``: per manifest part its path, rows and smallest and largest key and source,
  from the Parquet footers' statistics (DuckDB's ``parquet_metadata``): a key is looked up only
  in the parts whose key range holds it, and a gallery of one source reads only the parts whose
  source range meets it (the pipeline writes each part from one input partition, so ranges
  barely overlap; where they do, more parts are read, never fewer than needed).
- ``families.parquet``: ``(duplicate_of, key)`` of every row recorded as a duplicate, sorted by
  ``duplicate_of`` in row groups of ``FAMILY_ROW_GROUP`` rows: a family is read from the row
  groups whose statistics hold its representative (DuckDB prunes the others).
- ``index.json``: written last, what the index was built from (the parts, their rows), whether
  every part has the same schema (then queries read the parts as one table without comparing
  their schemas each time) and how long it took. An index that does not match the version's
  parts is built again.

Files are written to a temporary name and renamed, so a killed build leaves no half index.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

INDEX_VERSION = 3
FAMILY_ROW_GROUP = 16_384
PARTS_FILE, FAMILIES_FILE, HEADER_FILE = "parts.parquet", "families.parquet", "index.json"


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def sql_list(paths) -> str:
    return "[" + ", ".join(sql_string(str(p)) for p in paths) + "]"


def scan(paths, union: bool = True) -> str:
    """The SQL table of Parquet files ``paths``; with ``union`` the columns a file lacks are nulls
    (DuckDB then reads every file's schema at each query: only for parts whose schemas differ)."""
    return f"read_parquet({sql_list(paths)}{', union_by_name = true' * union})"


def same_schema(db, parts) -> bool:
    """Whether every part holds the same columns, of the same types, in the same order."""
    rows = db.execute(
        f"SELECT file_name, name, duckdb_type FROM parquet_schema({sql_list(parts)}) "
        "WHERE duckdb_type IS NOT NULL ORDER BY file_name, column_id"
    ).fetchall()
    columns: dict[str, list] = {}
    for file, name, kind in rows:
        columns.setdefault(file, []).append((name, kind))
    return len({tuple(c) for c in columns.values()}) <= 1


@dataclasses.dataclass(frozen=True)
class ExploreIndex:
    """A built index: the parts' key ranges (in memory: one entry per part) and the families file."""

    folder: Path
    parts: list[tuple[str, str | None, str | None, str | None, str | None]]  # path, key and source ranges
    header: dict

    @classmethod
    def open(cls, db, parts: tuple[str, ...], has_families: bool, folder: Path) -> ExploreIndex:
        """The index of manifest ``parts`` in ``folder``, built there first when missing or stale."""
        folder.mkdir(parents=True, exist_ok=True)
        header = _read_header(folder)
        if header is None or header.get("parts") != len(parts) or header.get("version") != INDEX_VERSION:
            header = build(db, parts, has_families, folder)
        found = _key_ranges(db, folder)
        if set(found) != set(parts):  # the version's parts moved or changed: index them again
            header = build(db, parts, has_families, folder)
            found = _key_ranges(db, folder)
        missing = set(parts) - set(found)
        if missing:
            raise RuntimeError(f"the explorer's index in {folder} lacks {len(missing)} manifest parts")
        return cls(folder, [(p, *found[p]) for p in parts], header)

    def parts_holding(self, keys) -> list[str]:
        """The parts whose key range may hold one of ``keys`` (a part without statistics always may)."""
        return [p for p, lo, hi, _, _ in self.parts if lo is None or hi is None or any(lo <= k <= hi for k in keys)]

    def parts_with_sources(self, low: str, high: str) -> list[str]:
        """The parts whose source range meets [``low``, ``high``), in path order (a part without
        statistics always does)."""
        return [p for p, _, _, lo, hi in self.parts if lo is None or hi is None or (lo < high and hi >= low)]

    @property
    def same_schema(self) -> bool:
        return bool(self.header.get("same_schema"))

    @property
    def families(self) -> str:
        return f"read_parquet({sql_string(str(self.folder / FAMILIES_FILE))})"


def _key_ranges(db, folder: Path) -> dict[str, tuple]:
    """path -> (smallest key, largest key, smallest source, largest source) of each indexed part."""
    rows = db.execute(
        f"SELECT path, key_min, key_max, source_min, source_max FROM read_parquet({sql_string(str(folder / PARTS_FILE))})"
    )
    return {p: tuple(ranges) for p, *ranges in rows.fetchall()}


def _read_header(folder: Path) -> dict | None:
    try:
        return json.loads((folder / HEADER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _copy(db, select: str, final: Path, params: list | None = None, row_group: int | None = None) -> None:
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    options = "FORMAT parquet" + (f", ROW_GROUP_SIZE {row_group}" if row_group else "")
    db.execute(f"COPY ({select}) TO {sql_string(str(tmp))} ({options})", params or [])
    os.replace(tmp, final)


def build(db, parts: tuple[str, ...], has_families: bool, folder: Path) -> dict:
    """Index ``parts`` into ``folder`` (see the module doc); returns the header written last."""
    t0 = time.perf_counter()
    column = lambda c, f, s: f"{f}(stats_{s}_value) FILTER (WHERE path_in_schema = '{c}') AS {c}_{s}"  # noqa: E731
    ranges = (
        "SELECT file_name AS path, (sum(row_group_num_rows) FILTER (WHERE path_in_schema = 'key'))::BIGINT AS rows, "
        f"{column('key', 'min', 'min')}, {column('key', 'max', 'max')}, "
        f"{column('source', 'min', 'min')}, {column('source', 'max', 'max')} "
        f"FROM parquet_metadata({sql_list(parts)}) GROUP BY file_name"
    )
    _copy(db, ranges, folder / PARTS_FILE)
    t1 = time.perf_counter()
    if has_families:
        families = (
            f"SELECT duplicate_of, key FROM {scan(parts)} WHERE duplicate_of IS NOT NULL ORDER BY duplicate_of, key"
        )
    else:
        families = "SELECT NULL::VARCHAR AS duplicate_of, NULL::VARCHAR AS key WHERE FALSE"
    _copy(db, families, folder / FAMILIES_FILE, row_group=FAMILY_ROW_GROUP)
    (rows,) = db.execute(f"SELECT sum(rows) FROM read_parquet({sql_string(str(folder / PARTS_FILE))})").fetchone()
    header = {
        "version": INDEX_VERSION,
        "parts": len(parts),
        "rows": int(rows or 0),
        "same_schema": same_schema(db, parts),
        "key_ranges_s": round(t1 - t0, 3),
        "families_s": round(time.perf_counter() - t1, 3),
    }
    tmp = folder / f".{HEADER_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(header, indent=1))
    os.replace(tmp, folder / HEADER_FILE)
    return header
