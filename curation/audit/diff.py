"""The difference between two dataset versions: images added and removed, why, and which settings did it.

Added = kept in B, not kept in A; removed = kept in A, not kept in B. Images are matched by
key; an image kept in both under different keys but with the same SHA-256 of its input bytes
(e.g. the input was moved) counts as *renamed*, neither added nor removed. Each removed image
carries its status and reason in B (each added one, its status and reason in A: why A did not
keep it), and the changed settings that own that reason (``settings.explaining``): e.g. a
removal for ``too_small`` is explained by a change of ``geometry.min_short_side``.

Neither manifest is held whole. One streamed pass per version counts it (``counts.Tally``) and
spills its narrow rows (key, SHA-256, status, reason) to local temporary files by a hash of the
key, and per SHA-256 its first row by key by a hash of the SHA-256 (``join.Spill``). The versions
are joined by key bucket by bucket (``join.buckets``: at most ``bucket_rows`` rows of a version
at once), giving the images kept on one side only with the other side's verdict; those are
spilled by SHA-256 and joined a second time, by SHA-256, with each other (renamed: an image kept
only in A whose bytes B kept only, under its largest such key) and with the other side's first
row of those bytes (the verdict of a key the other side never saw). What stays in memory is
bounded: per (status, reason) of the other side a count, the first ``SUMMARY_KEYS`` keys and
``per_reason`` gallery samples (smallest SHA-1 of the key, as ``images.sample``), and overall the
first ``TABLE_LIMIT`` changes and renames by key; a last pass per version reads those rows whole.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

import curation.audit.counts as counts
import curation.audit.images as images
import curation.audit.join as join
import curation.audit.settings as settings
from curation import schema
from curation.audit.loading import AuditedVersion

ABSENT = "absent"  # status of an image the other version never saw (not in its input)
TABLE_LIMIT = 500  # rows of the per-image tables in the page (counts and galleries cover the rest)
SUMMARY_KEYS = 20  # keys per reason in the terminal summary
BUCKET_ROWS = 50_000  # the most rows of one version a join bucket holds (``join.buckets``)
NOT_IN_INPUT = "not in the input"

_S, _H = pa.string(), pa.uint64()
BY_KEY = pa.schema([("key", _S), ("order", _S), ("sha256", _S), ("status", _S), ("reason", _S), (join.HASH, _H)])
BY_SHA = pa.schema([("sha256", _S), ("key", _S), ("status", _S), ("reason", _S), (join.HASH, _H)])
ONE_SIDED = pa.schema([("key", _S), ("order", _S), ("sha256", _S), ("o_status", _S), ("o_reason", _S), (join.HASH, _H)])
NARROW = ["key", "sha256", "status", "reason"]


@dataclasses.dataclass(frozen=True)
class ImageChange:
    """One image that was kept on one side only, with the other side's verdict."""

    key: str
    row: dict  # the manifest row on the side that kept it
    other_status: str  # dropped / error / absent on the other side
    other_reason: str | None
    other_step: str | None
    explained_by: tuple[str, ...]

    @property
    def why(self) -> str:
        return self.other_reason or NOT_IN_INPUT


@dataclasses.dataclass(frozen=True)
class ChangeGroup:
    """The changes of one side with one verdict on the other side."""

    status: str  # the other side's
    reason: str  # the other side's, or NOT_IN_INPUT
    step: str
    count: int
    explained_by: list[str]  # the changed settings that own the reason, sorted
    keys: list[str]  # the first SUMMARY_KEYS, by key
    sample: list[ImageChange]  # the gallery's: smallest SHA-1 of the key first

    @property
    def explanation(self) -> str:
        return ", ".join(self.explained_by) or "no change of a setting that owns this reason"


@dataclasses.dataclass(frozen=True)
class OneSided:
    """The images kept on one side only: how many, the first TABLE_LIMIT by key, and by verdict."""

    total: int
    listed: list[ImageChange]
    groups: list[ChangeGroup]  # the largest first


@dataclasses.dataclass(frozen=True)
class VersionDiff:
    a: AuditedVersion
    b: AuditedVersion
    removals: OneSided  # kept in A, not in B (B's verdict)
    additions: OneSided  # kept in B, not in A (A's verdict)
    renamed: list[tuple[str, str]]  # (key in A, key in B): same bytes, new key; the first TABLE_LIMIT by A's key
    renamed_total: int
    kept_in_both: int
    config_changes: list[settings.Change]
    tallies: tuple[counts.Tally, counts.Tally]  # A's and B's counts

    @property
    def removed(self) -> list[ImageChange]:
        """The first TABLE_LIMIT removed images by key (``removals.total`` in all)."""
        return self.removals.listed

    @property
    def added(self) -> list[ImageChange]:
        return self.additions.listed

    @property
    def code_changed(self) -> bool:
        return self.a.code_version != self.b.code_version


# ---- the streamed join ----------------------------------------------------------------------


def _has_sha(column) -> pa.ChunkedArray:
    return pc.fill_null(pc.and_(pc.is_valid(column), pc.not_equal(column, "")), False)


def _first_by(table: pa.Table, key_order: str = "ascending") -> pa.Table:
    """Per SHA-256, the row of the smallest (or largest) key."""
    return join.first_per(table.sort_by([("sha256", "ascending"), ("key", key_order)]), "sha256")


class Spiller:
    """A version's first pass: its narrow rows by a hash of the key; per SHA-256 (within a batch)
    the row of the smallest key, by a hash of the SHA-256."""

    columns = tuple(NARROW)

    def __init__(self, folder: Path) -> None:
        self.by_key, self.by_sha = join.Spill(folder / "key", BY_KEY), join.Spill(folder / "sha", BY_SHA)

    def add(self, batch: pa.RecordBatch) -> None:
        t = pa.Table.from_batches([batch]).select(NARROW)
        order = [images.sample_order(k) for k in t.column("key").to_pylist()]
        self.by_key.write(join.with_hash(t.append_column("order", pa.array(order, _S)), t.column("key").to_pylist()))
        firsts = _first_by(t.filter(_has_sha(t.column("sha256"))))
        self.by_sha.write(join.with_hash(firsts, firsts.column("sha256").to_pylist()))

    def close(self) -> tuple[list, list]:
        return self.by_key.close(), self.by_sha.close()


def _kept(column) -> pa.ChunkedArray:
    return pc.fill_null(pc.equal(column, schema.KEPT), False)


def _full_join(a: pa.Table, b: pa.Table) -> pa.Table:
    def side(t: pa.Table, p: str) -> pa.Table:
        t = t.drop_columns([join.HASH])
        return t.rename_columns([c if c == "key" else f"{p}_{c}" for c in t.column_names])

    return side(a, "a").join(side(b, "b"), keys="key", join_type="full outer", coalesce_keys=True)


def _one_sided(j: pa.Table, side: str, other: str) -> pa.Table:
    rows = j.filter(pc.and_(_kept(j.column(f"{side}_status")), pc.invert(_kept(j.column(f"{other}_status")))))
    return pa.table(
        {
            "key": rows.column("key"),
            "order": rows.column(f"{side}_order"),
            "sha256": rows.column(f"{side}_sha256"),
            "o_status": rows.column(f"{other}_status"),
            "o_reason": rows.column(f"{other}_reason"),
        }
    )


def _verdicts(rows: pa.Table, status, reason) -> pa.Table:
    return pa.table({"key": rows.column("key"), "order": rows.column("order"), "status": status, "reason": reason})


def key_join(parts: dict[str, list], work: Path, max_rows: int, spills: dict, changes: dict) -> int:
    """The join by key, bucket by bucket: returns how many images both kept; the images kept on
    one side only go to ``spills`` (by SHA-256), or with no SHA-256 straight to ``changes``."""
    both = 0
    for bucket in join.buckets(parts, {"a": BY_KEY, "b": BY_KEY}, work, max_rows):
        j = _full_join(bucket["a"], bucket["b"])
        both += pc.sum(pc.and_(_kept(j.column("a_status")), _kept(j.column("b_status")))).as_py() or 0
        for side, other in (("a", "b"), ("b", "a")):
            t = _one_sided(j, side, other)
            has = _has_sha(t.column("sha256"))
            bare = t.filter(pc.invert(has))
            changes[side].add(_verdicts(bare, pc.fill_null(bare.column("o_status"), ABSENT), bare.column("o_reason")))
            t = t.filter(has)
            spills[side].write(join.with_hash(t, t.column("sha256").to_pylist()))
    return both


def _by_sha_verdicts(rows: pa.Table, other_firsts: pa.Table) -> pa.Table:
    """Each row's verdict: the other side's for its key; else for its bytes (that side's row of the
    same SHA-256 with the smallest key); else ABSENT."""
    firsts = _first_by(other_firsts).select(["sha256", "status", "reason"]).rename_columns(["sha256", "f_s", "f_r"])
    j = rows.drop_columns([join.HASH]).join(firsts, keys="sha256", join_type="left outer")
    by_key = pc.is_valid(j.column("o_status"))
    status = pc.if_else(by_key, j.column("o_status"), pc.fill_null(j.column("f_s"), ABSENT))
    return _verdicts(j, status, pc.if_else(by_key, j.column("o_reason"), j.column("f_r")))


def sha_join(parts: dict[str, list], work: Path, max_rows: int, changes: dict, renamed: Renamed) -> None:
    """The join by SHA-256 of the images kept on one side only: renames, then the verdicts."""
    schemas = {"a": ONE_SIDED, "b": ONE_SIDED, "a_all": BY_SHA, "b_all": BY_SHA}
    for bucket in join.buckets(parts, schemas, work, max_rows):
        a, b = bucket["a"], bucket["b"]
        b_last = _first_by(b, "descending").select(["sha256", "key"]).rename_columns(["sha256", "b_key"])
        pairs = a.select(["key", "sha256"]).join(b_last, keys="sha256", join_type="inner")
        renamed.add(pairs)
        a = a.filter(pc.invert(pc.is_in(a.column("key"), value_set=pairs.column("key").combine_chunks())))
        b = b.filter(pc.invert(pc.is_in(b.column("key"), value_set=pairs.column("b_key").combine_chunks())))
        changes["a"].add(_by_sha_verdicts(a, bucket["b_all"]))
        changes["b"].add(_by_sha_verdicts(b, bucket["a_all"]))


# ---- what stays in memory: bounded selections ----------------------------------------------------


def _smallest(t: pa.Table, column: str, k: int) -> pa.Table:
    """The ``k`` rows of smallest ``column`` (unique values), in no order."""
    if k <= 0 or not t.num_rows:
        return t.slice(0, 0)
    return t.take(pc.bottom_k_unstable(t, k=min(k, t.num_rows), sort_keys=[column], null_placements=["at_end"]))


class Changes:
    """One side's changes (key, order, status, reason: the other side's verdict), table by table."""

    def __init__(self, samples: int) -> None:
        self.total, self.samples = 0, samples
        self.listed = images.Smallest(TABLE_LIMIT)  # (key, (key, status, reason))
        self.groups: dict[tuple[str, str | None], dict] = {}

    def add(self, t: pa.Table) -> None:
        if not t.num_rows:
            return
        self.total += t.num_rows
        first = _smallest(t, "key", TABLE_LIMIT).to_pylist()
        self.listed.offer([(r["key"], (r["key"], r["status"], r["reason"])) for r in first])
        found = t.group_by(["status", "reason"]).aggregate([])
        for status, reason in zip(found.column("status").to_pylist(), found.column("reason").to_pylist()):
            same = pc.is_null(t.column("reason")) if reason is None else pc.equal(t.column("reason"), reason)
            sub = t.filter(pc.and_(pc.equal(t.column("status"), status), pc.fill_null(same, False)))
            g = self.groups.setdefault(
                (status, reason),
                {"count": 0, "keys": images.Smallest(SUMMARY_KEYS), "sample": images.Smallest(self.samples)},
            )
            g["count"] += sub.num_rows
            g["keys"].offer([(k, k) for k in _smallest(sub, "key", SUMMARY_KEYS).column("key").to_pylist()])
            picked = _smallest(sub, "order", self.samples)
            g["sample"].offer(list(zip(picked.column("order").to_pylist(), picked.column("key").to_pylist())))


class Renamed:
    def __init__(self) -> None:
        self.total, self.listed = 0, images.Smallest(TABLE_LIMIT)

    def add(self, pairs: pa.Table) -> None:
        self.total += pairs.num_rows
        first = _smallest(pairs, "key", TABLE_LIMIT)
        keys = zip(first.column("key").to_pylist(), first.column("b_key").to_pylist())
        self.listed.offer([(a, (a, b)) for a, b in keys])


# ---- the diff ---------------------------------------------------------------------------------


def rows_of(v: AuditedVersion, keys: set[str]) -> dict[str, dict]:
    """The manifest rows of ``keys`` (every column but ``MANIFEST_SKIP``), in one streamed pass."""
    if not keys:
        return {}
    return {r["key"]: r for b in v.batches(None, pc.field("key").isin(sorted(keys))) for r in b.to_pylist()}


@dataclasses.dataclass(frozen=True)
class Explainer:
    """The other side's step and the changed settings behind a verdict (status, reason) there."""

    other: AuditedVersion
    changes: list[settings.Change]
    code_changed: bool

    def __call__(self, status: str, reason: str | None) -> tuple[str | None, tuple[str, ...]]:
        step = counts.step_of_reason(self.other.stats).get(reason) if reason else None
        if status == ABSENT:
            owners = [c.key for c in self.changes if not c.bookkeeping and settings.matches(c.key, ("input.",))]
        else:
            order = [name for name, _ in counts.funnel_spec(self.other.stats)]
            owners = settings.explain(reason, step, order, self.changes)
        if not owners and self.code_changed:
            owners = ["code version"]
        return step, tuple(owners)


def one_sided(ch: Changes, kept_by: AuditedVersion, explain: Explainer) -> OneSided:
    """``ch`` with each listed and sampled change's manifest row (read from ``kept_by``)."""
    wanted = {k for k, _, _ in ch.listed.values()} | {k for g in ch.groups.values() for k in g["sample"].values()}
    rows = rows_of(kept_by, wanted)

    def change(key: str, status: str, reason: str | None) -> ImageChange:
        return ImageChange(key, rows[key], status, reason, *explain(status, reason))

    groups = []
    for (status, reason), g in ch.groups.items():
        step, owners = explain(status, reason)
        sample = [change(k, status, reason) for k in g["sample"].values()]
        groups.append(
            ChangeGroup(
                status, reason or NOT_IN_INPUT, step or "-", g["count"], sorted(set(owners)), g["keys"].values(), sample
            )
        )
    groups.sort(key=lambda e: (-e.count, (e.status, e.reason)))
    return OneSided(ch.total, [change(*x) for x in ch.listed.values()], groups)


def first_pass(v: AuditedVersion, folder: Path) -> tuple[counts.Tally, list, list]:
    """``v``'s counts, and its rows spilled by key and by SHA-256."""
    t, spiller = counts.Tally(v.setting("input.uri", "")), Spiller(folder)
    v.scan(t, spiller)
    return (t, *spiller.close())


def diff_versions(
    a: AuditedVersion, b: AuditedVersion, *, per_reason: int = 12, bucket_rows: int = BUCKET_ROWS
) -> VersionDiff:
    """What changed from version ``a`` to version ``b`` (``per_reason``: gallery samples kept per
    verdict; ``bucket_rows``: the most rows of a version one join bucket holds)."""
    changed = settings.config_changes(a.config, b.config)
    code_changed = a.code_version != b.code_version
    changes, renamed = {"a": Changes(per_reason), "b": Changes(per_reason)}, Renamed()
    with tempfile.TemporaryDirectory(prefix="audit-diff-") as tmp:
        work = Path(tmp)
        (ta, a_key, a_sha), (tb, b_key, b_sha) = first_pass(a, work / "a"), first_pass(b, work / "b")
        spills = {s: join.Spill(work / f"{s}-only", ONE_SIDED) for s in ("a", "b")}
        both = key_join({"a": a_key, "b": b_key}, work / "by-key", bucket_rows, spills, changes)
        parts = {"a": spills["a"].close(), "b": spills["b"].close(), "a_all": a_sha, "b_all": b_sha}
        sha_join(parts, work / "by-sha", bucket_rows, changes, renamed)
    return VersionDiff(
        a,
        b,
        one_sided(changes["a"], a, Explainer(b, changed, code_changed)),
        one_sided(changes["b"], b, Explainer(a, changed, code_changed)),
        renamed.listed.values(),
        renamed.total,
        both,
        changed,
        (ta, tb),
    )


def diff_summary(d: VersionDiff) -> str:
    """Terminal text of the diff: counts, setting changes, and each removal/addition's reason."""
    ta, tb = d.tallies
    lines = [
        f"A {d.a.id}  kept {ta.kept}  {d.a.uri}",
        f"B {d.b.id}  kept {tb.kept}  {d.b.uri}",
        f"added {d.additions.total}  removed {d.removals.total}  kept in both {d.kept_in_both}  "
        f"renamed (same bytes, new key) {d.renamed_total}",
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
    for title, side in (
        ("removed (kept in A, not in B), by B's verdict", d.removals),
        ("added (kept in B, not in A), by A's verdict", d.additions),
    ):
        lines += ["", f"{title}:" if side.total else f"{title}: none"]
        for e in side.groups:
            lines.append(f"  {e.status}/{e.reason}: {e.count}  <- {e.explanation}")
            lines += [f"    {k}" for k in e.keys]
            if e.count > SUMMARY_KEYS:
                lines.append(f"    ... and {e.count - SUMMARY_KEYS} more")
    return "\n".join(lines)


def reason_shifts(d: VersionDiff) -> list[dict]:
    """Per (status, reason): how many inputs ended there in A and in B, and the changed settings owning it."""
    ca, cb = d.tallies[0].removed, d.tallies[1].removed
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
