"""The explorer's ``--against``: the images whose fate differs between two versions, and why.

A is the earlier version (``--against``), B the one explored. An image's fate in a version is
its (status, reason), ``absent`` where that version's input did not hold its key. The two
manifests are joined by key once, by DuckDB reading both sets of Parquet parts (a hash join
that spills to disk past the memory limit), and the rows whose fate differs are written, sorted
by (A's fate, B's fate, key), to ``changes-<A id>-<A uri digest>.parquet`` in B's cache folder:
later pages read that file only, pruned by its row groups' statistics.

Each (A's fate -> B's fate) group is explained as ``audit --diff`` explains a verdict
(``diff.Explainer``: the changed settings that own the reason, else those upstream of its step,
else the code version): by B's verdict when B did not keep the image, else by A's (why A had
not kept it). Images kept under another key with the same bytes count here as two changes
(kept -> absent and absent -> kept); ``audit --diff`` reports them as renamed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from curation import schema
from curation.audit import settings
from curation.audit.diff import ABSENT, Explainer
from curation.audit.explore_index import scan, sql_string
from curation.audit.loading import AuditedVersion

OUTCOME_COLUMNS = ("a_status", "a_reason", "b_status", "b_reason")


def outcome(status: str, reason: str | None) -> str:
    """A fate in words: ``kept``, ``absent`` or ``<status>: <reason>``."""
    return status if reason is None else f"{status}: {reason}"


@dataclasses.dataclass(frozen=True)
class FateGroup:
    """The images that went from one fate in A to one fate in B."""

    a_status: str
    a_reason: str | None
    b_status: str
    b_reason: str | None
    count: int
    step: str  # the step whose verdict explains it ("-" when none)
    explained_by: tuple[str, ...]

    def params(self) -> dict[str, str]:
        values = dict(zip(OUTCOME_COLUMNS, (self.a_status, self.a_reason, self.b_status, self.b_reason)))
        return {k: v for k, v in values.items() if v is not None}


def _changes_sql(a: AuditedVersion, b: AuditedVersion) -> str:
    narrow = "SELECT key, status, reason FROM {}"
    return (
        "SELECT coalesce(b.key, a.key) AS key, coalesce(a.status, 'absent') AS a_status, a.reason AS a_reason, "
        "coalesce(b.status, 'absent') AS b_status, b.reason AS b_reason "
        f"FROM ({narrow.format(scan(a.parts))}) a FULL OUTER JOIN ({narrow.format(scan(b.parts))}) b "
        "ON a.key = b.key WHERE a.status IS DISTINCT FROM b.status OR a.reason IS DISTINCT FROM b.reason "
        "ORDER BY a_status, a_reason NULLS FIRST, b_status, b_reason NULLS FIRST, key"
    )


class FateChanges:
    """The changes from version ``a`` to ``b`` (see the module doc), through DuckDB ``db``."""

    def __init__(self, db, a: AuditedVersion, b: AuditedVersion, folder: Path) -> None:
        self.db, self.a, self.b = db, a, b
        digest = hashlib.sha1(a.uri.encode()).hexdigest()[:10]
        self.path = folder / f"changes-{a.id}-{digest}.parquet"
        if not self.path.is_file():
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            db.execute(f"COPY ({_changes_sql(a, b)}) TO {sql_string(str(tmp))} (FORMAT parquet)")
            os.replace(tmp, self.path)
        self.config_changes = settings.config_changes(a.config, b.config)
        code_changed = a.code_version != b.code_version
        self._explain = {side: Explainer(v, self.config_changes, code_changed) for side, v in (("a", a), ("b", b))}
        self.groups = self._groups()

    @property
    def table(self) -> str:
        return f"read_parquet({sql_string(str(self.path))})"

    def _groups(self) -> list[FateGroup]:
        rows = self.db.cursor().execute(
            f"SELECT a_status, a_reason, b_status, b_reason, count(*) FROM {self.table} "
            "GROUP BY ALL ORDER BY count(*) DESC, a_status, a_reason, b_status, b_reason"
        )
        out = []
        for a_status, a_reason, b_status, b_reason, n in rows.fetchall():
            if b_status != schema.KEPT:
                step, owners = self._explain["b"](b_status, b_reason)
            else:
                step, owners = self._explain["a"](a_status, a_reason)
            out.append(FateGroup(a_status, a_reason, b_status, b_reason, n, step or "-", owners))
        return out

    @property
    def total(self) -> int:
        return sum(g.count for g in self.groups)

    def group(self, a_status: str, a_reason: str | None, b_status: str, b_reason: str | None) -> FateGroup | None:
        wanted = (a_status, a_reason, b_status, b_reason)
        return next((g for g in self.groups if (g.a_status, g.a_reason, g.b_status, g.b_reason) == wanted), None)

    def keys(self, g: FateGroup, offset: int, limit: int) -> list[str]:
        """Keys of group ``g``'s images, by key, from ``offset``."""
        sql = (
            f"SELECT key FROM {self.table} WHERE a_status = ? AND a_reason IS NOT DISTINCT FROM ? "
            "AND b_status = ? AND b_reason IS NOT DISTINCT FROM ? ORDER BY key LIMIT ? OFFSET ?"
        )
        params = [g.a_status, g.a_reason, g.b_status, g.b_reason, limit, offset]
        return [k for (k,) in self.db.cursor().execute(sql, params).fetchall()]

    def fate(self, key: str) -> tuple[str, str | None, str, str | None] | None:
        """(A's status, A's reason, B's status, B's reason) of ``key`` when its fate changed."""
        sql = f"SELECT a_status, a_reason, b_status, b_reason FROM {self.table} WHERE key = ?"
        return self.db.cursor().execute(sql, [key]).fetchone()


def known_status(value: str) -> bool:
    return value in (*schema.STATUSES, ABSENT)
