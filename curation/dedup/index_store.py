"""The near-dup index stored partitioned, so a new batch dedups against an earlier version
without loading it whole.

Layout (under an output's ``_dedup/near_index/``; any pyarrow filesystem)::

    index.json                          header: format, hash, match_mirrored, max_distance,
                                        num_blocks, masks (the index's band plan:
                                        ``incremental.index_plan`` or ``index_num_blocks``,
                                        kept by every later part), num_buckets, parts
    parts/<part id>/rows/<b>.parquet    one part's rows (key, hashes, size, quality, representative),
                                        bucketed by crc32(key) % P
    parts/<part id>/bands/<j>/<b>.parquet  postings (value, key) of band j, bucketed by
                                        mix64(value & mask_j) % P, sorted by value

A part holds the rows one version added (the first version: all its candidates). The next
version's header lists the earlier parts and adds one new part: the index grows append-only,
nothing already written is rewritten. ``<part id>`` is a digest of the part's keys (content,
not paths), order-free so that a distributed writer
(``curation.dedup.distributed.write_near_index``) sums it from partial digests.

**Relocatable.** A header names its own parts relative to its folder (``uri``: ``parts/<id>``:
a copied or moved output keeps working). A part of an earlier version (another output or
bucket) is named by what does not move with a path: ``origin`` (the dataset version id of
the output that wrote it, from its ``_SUCCESS``, and that output's index URI at the time),
``path`` (``parts/<id>``, relative to its owner's index folder), plus two hints: ``relative``
(the path from this index's folder at write time: found again when a whole tree of versions
is moved or copied together) and ``uri`` (the absolute URI at write time). Opening an index
resolves every part, in order: under each location the user passes now (the searched output
itself and ``NearDupConfig.index_locations``: where earlier outputs lie now), then the
relative hint, then the absolute one; the first that exists wins (the part id names its
content). When none does, the open fails with one line naming the missing version and what
to pass.

A search (``PartitionedNearIndex.sub_index``) reads, per band, only the buckets the new batch's
band keys hash to, keeps the postings whose band key equals a new one, then reads the rows
of those keys and of their representatives (their key buckets only). The result is a small
in-memory ``NearDupIndex`` holding every existing row a new value can reach, so
``incremental_decisions`` on it equals the whole-index decisions row for row.

Driver memory scales with the new batch and what it reaches, not with the earlier corpus:
each bucket file is filtered as it is read, so the driver holds the batch, one bucket file
(about N / P postings or rows) and the reached rows (the batch's near matches and their
representatives). I/O is per band min(P, b) of P bucket files for a batch of b distinct
values, i.e. about min(1, b / P) x N postings per band: reads are partial when b << P, and
approach the whole index (streamed, never held) when the batch has more values than P.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation import output
from curation.dedup import DECISION_SCHEMA
from curation.dedup.bands import mix64
from curation.dedup.incremental import NearDupIndex, check_settings, incremental_decisions
from curation.dedup.near import NearDupConfig, row_values
from curation.output import NEAR_INDEX_HEADER as HEADER
from infra import storage

FORMAT = 2
MAX_BUCKETS = 4096


def is_relative(uri: str) -> bool:
    """A part named relative to its index folder (not a URI, not an absolute path)."""
    return "://" not in uri and not uri.startswith("/")


def default_buckets(num_rows: int) -> int:
    """P for a new index: ~4096 rows per bucket file, 8..4096 buckets (fixed for every later part)."""
    return int(min(MAX_BUCKETS, max(8, num_rows // 4096)))


def key_buckets(keys: list[str], num_buckets: int) -> np.ndarray:
    return np.array([zlib.crc32(k.encode()) % num_buckets for k in keys], dtype=np.int64)


def value_buckets(values: np.ndarray, mask: int, num_buckets: int) -> np.ndarray:
    return (mix64(values & np.uint64(mask)) % np.uint64(num_buckets)).astype(np.int64)


def _rows_file(part: str, b: int) -> str:
    return storage.join(part, "rows", f"{b:05d}.parquet")


def _band_file(part: str, j: int, b: int) -> str:
    return storage.join(part, "bands", f"{j:04d}", f"{b:05d}.parquet")


def bucket_slices(buckets: np.ndarray) -> dict[int, np.ndarray]:
    """Row positions per non-empty bucket, each in the rows' order."""
    order = np.argsort(buckets, kind="stable")
    ids, starts = np.unique(buckets[order], return_index=True)
    return {int(b): order[lo:hi] for b, lo, hi in zip(ids, starts, [*starts[1:], len(order)])}


def keys_sum(keys: list[str]) -> int:
    """An order-free digest of a multiset of keys: the sum of their 128-bit BLAKE2b hashes mod 2^128.
    Partial sums of any split of the keys add up to it, so a distributed writer never gathers them."""
    return sum(int.from_bytes(hashlib.blake2b(k.encode(), digest_size=16).digest(), "big") for k in keys) % 2**128


def part_id(num_rows: int, key_sum: int) -> str:
    """A part's id: a digest of its keys (``keys_sum``) and their number (content, not paths)."""
    return hashlib.sha256(f"{num_rows}:{key_sum:032x}".encode()).hexdigest()[:16]


def part_dir(index_root: str, pid: str) -> str:
    return storage.join(index_root, "parts", pid)


def relative_part(pid: str) -> str:
    """How the header names a part under its own index folder (relative: the output may be moved)."""
    return storage.join("parts", pid)


def postings(rows: pa.Table, cfg: NearDupConfig) -> pa.Table:
    """(value, key) per distinct hash value of each row, sorted by value then key (the same order
    whatever the row order, so both writers give the same files)."""
    r, v = row_values(rows, cfg)
    return pa.table({"value": pa.array(v, pa.uint64()), "key": rows.column("key").take(pa.array(r))}).sort_by(
        [("value", "ascending"), ("key", "ascending")]
    )


def write_row_bucket(fs, part: str, b: int, rows: pa.Table) -> None:
    storage.write_parquet(fs, _rows_file(part, b), rows.sort_by("key"))


def write_band_bucket(fs, part: str, j: int, b: int, band_postings: pa.Table) -> None:
    order = [("value", "ascending"), ("key", "ascending")]
    storage.write_parquet(fs, _band_file(part, j, b), band_postings.sort_by(order))


def write_part(fs, index_root: str, rows: pa.Table, cfg: NearDupConfig, masks: np.ndarray, num_buckets: int) -> dict:
    """One part (``rows`` carry ``representative``) under ``index_root/parts/<id>``; its header entry.
    (``curation.dedup.distributed.write_near_index`` writes the same files from Ray tasks.)"""
    rows = rows.sort_by("key")
    keys = rows.column("key").to_pylist()
    by_key = bucket_slices(key_buckets(keys, num_buckets))
    pid = part_id(len(keys), keys_sum(keys))
    part = part_dir(index_root, pid)
    for b, idx in by_key.items():
        write_row_bucket(fs, part, b, rows.take(idx))
    post = postings(rows, cfg)
    v = post.column("value").to_numpy()
    band_b = []
    for j, m in enumerate(masks):
        by_value = bucket_slices(value_buckets(v, int(m), num_buckets))
        for b, idx in by_value.items():
            write_band_bucket(fs, part, j, b, post.take(idx))
        band_b.append(list(by_value))
    return part_entry(pid, len(keys), list(by_key), band_b, postings=post.num_rows * len(masks))


def part_entry(
    pid: str, num_rows: int, row_buckets: list[int], band_buckets: list[list[int]], *, postings: int
) -> dict:
    """A part's header entry; ``postings``: (value, key) records written over all its bands."""
    return {
        "id": pid,
        "uri": relative_part(pid),
        "rows": int(num_rows),
        "postings": int(postings),
        "row_buckets": sorted(int(b) for b in row_buckets),
        "band_buckets": [sorted(int(b) for b in band) for band in band_buckets],
    }


def write_header(
    fs,
    index_root: str,
    cfg: NearDupConfig,
    *,
    masks: np.ndarray,
    num_blocks: int,
    max_distance: int,
    num_buckets: int,
    parts: list[dict],
) -> dict:
    header = {
        "format": FORMAT,
        "hash": cfg.hash,
        "match_mirrored": cfg.match_mirrored,
        "max_distance": max_distance,
        "num_blocks": num_blocks,
        "masks": [str(int(m)) for m in masks],
        "num_buckets": num_buckets,
        "parts": parts,
    }
    storage.atomic_write_bytes(
        fs, storage.join(index_root, HEADER), json.dumps(header, indent=2, sort_keys=True).encode()
    )
    return header


def write_index(
    fs,
    index_root: str,
    rows: pa.Table,
    cfg: NearDupConfig,
    *,
    masks: np.ndarray,
    num_blocks: int,
    max_distance: int,
    earlier: PartitionedNearIndex | None = None,
    num_buckets: int = 8,
) -> dict:
    """Write ``rows`` as a new part and the header listing ``earlier``'s parts (if any) before it."""
    parts = []
    if earlier is not None:
        num_buckets = earlier.header["num_buckets"]
        parts = [earlier.listed_from(p, fs, index_root) for p in earlier.header["parts"]]
    if rows.num_rows:
        parts.append(write_part(fs, index_root, rows, cfg, masks, num_buckets))
    return write_header(
        fs,
        index_root,
        cfg,
        masks=masks,
        num_blocks=num_blocks,
        max_distance=max_distance,
        num_buckets=num_buckets,
        parts=parts,
    )


@dataclasses.dataclass
class PartitionedNearIndex:
    """An index on disk, opened by its header only; ``opened`` lists the bucket files read."""

    fs: object
    root: str
    header: dict
    opened: list[str] = dataclasses.field(default_factory=list)
    rows_read: int = 0  # rows (postings and index rows) of the files read
    largest_file: int = 0  # rows of the largest file read (the most held before filtering)
    reached: int = 0  # rows of the last sub_index
    locations: tuple[str, ...] = ()  # outputs (or index folders) where earlier versions lie now
    where: dict[str, tuple[object, str]] = dataclasses.field(default_factory=dict)  # part id -> (fs, path)

    @classmethod
    def open(cls, fs, root: str, locations: tuple[str, ...] | list[str] = ()) -> PartitionedNearIndex:
        """The index at ``root``, every part resolved (module docstring); ``locations``: where
        earlier versions' outputs lie now, searched before the hints a header records."""
        header = json.loads(storage.read_bytes(fs, storage.join(root, HEADER)))
        if header.get("format") != FORMAT:
            raise ValueError(f"{root}: near-dup index format is not {FORMAT}; rebuild it (NearDupIndex.build)")
        index = cls(fs, root, header, locations=tuple(locations))
        for part in header["parts"]:
            index.locate(part)
        return index

    @property
    def owner(self) -> dict:
        """Who this index belongs to: the dataset version id of the finished output holding it
        (None when it is not in one) and its URI now."""
        version = None
        suffix = "/" + storage.join(output.DEDUP_DIR, output.NEAR_INDEX_DIR)
        if self.root.rstrip("/").endswith(suffix):
            success = storage.join(self.root.rstrip("/")[: -len(suffix)], output.SUCCESS_FILE)
            if storage.exists(self.fs, success):
                version = json.loads(storage.read_bytes(self.fs, success)).get("dataset_id")
        return {"version": version, "index": storage.to_uri(self.fs, self.root)}

    def _index_folders(self) -> list[tuple[object, str]]:
        """This index's folder, then each location's: an index folder itself, or an output's."""
        folders = [(self.fs, self.root)]
        for location in self.locations:
            fs, path = storage.resolve(location)
            if not storage.exists(fs, storage.join(path, HEADER)):
                path = output.path(path, output.DEDUP_DIR, output.NEAR_INDEX_DIR)
            folders.append((fs, path))
        return folders

    def locate(self, part: dict) -> tuple[object, str]:
        """(filesystem, path) of a part, resolved once (module docstring)."""
        if part["id"] in self.where:
            return self.where[part["id"]]
        if is_relative(part["uri"]):  # one of this index's own parts
            tried = [(self.fs, storage.join(self.root, part["uri"]))]
        else:
            rel = part.get("path") or relative_part(part["id"])
            tried = [(fs, storage.join(root, rel)) for fs, root in self._index_folders()]
            if part.get("relative"):
                tried.append((self.fs, posixpath.normpath(storage.join(self.root, part["relative"]))))
            tried.append(self._from_uri(part["uri"]))
        for fs, path in tried:
            if storage.exists(fs, path):
                self.where[part["id"]] = (fs, path)
                return fs, path
        origin = part.get("origin") or {}
        raise ValueError(
            f"near-dup index {storage.to_uri(self.fs, self.root)}: part {part['id']} of earlier version "
            f"{origin.get('version') or '(no version id)'} (written at {origin.get('index') or part['uri']}) is not "
            f"at {', '.join(storage.to_uri(fs, p) for fs, p in tried)}; pass where that output lies now in "
            "dedup.near.index_locations"
        )

    @property
    def masks(self) -> np.ndarray:
        return np.array([int(m) for m in self.header["masks"]], dtype=np.uint64)

    @property
    def num_files(self) -> int:
        """Bucket files of the whole index (what a full load would open)."""
        return sum(len(p["row_buckets"]) + sum(len(b) for b in p["band_buckets"]) for p in self.header["parts"])

    def check(self, cfg: NearDupConfig) -> None:
        h = self.header
        check_settings(h["hash"], h["match_mirrored"], h["max_distance"], cfg)

    def _read(self, path_of, wanted: set[int], listed: str, j: int | None = None, keep=None) -> list[pa.Table]:
        """The files of buckets ``wanted`` in every part, each one filtered by ``keep`` as it is read
        (so at most one whole bucket file is held at a time)."""
        tables = []
        for part in self.header["parts"]:
            fs, root = self.locate(part)
            present = part[listed] if j is None else part[listed][j]
            for b in sorted(wanted.intersection(present)):
                path = path_of(root, b)
                self.opened.append(path)
                with fs.open_input_file(path) as fh:
                    table = pq.read_table(fh)
                self.rows_read += table.num_rows
                self.largest_file = max(self.largest_file, table.num_rows)
                tables.append(keep(table) if keep is not None else table)
        return tables

    def _from_uri(self, uri: str) -> tuple[object, str]:
        """(filesystem, path) of an absolute part URI: this index's filesystem when the part is on
        the same kind (keeping its endpoint and credentials), else the one its URI names."""
        prefix = f"{self.fs.type_name}://"
        if uri.startswith(prefix):
            return self.fs, uri[len(prefix) :]
        return storage.resolve(uri) if "://" in uri else (self.fs, uri)

    def listed_from(self, part: dict, fs, index_root: str) -> dict:
        """How an index written at ``index_root`` (on ``fs``) lists this index's ``part``: relative
        when the part lies under that folder; else as an earlier version's part (module
        docstring: origin, path in its owner's folder, the relative and absolute hints)."""
        part_fs, path = self.locate(part)
        root = index_root.rstrip("/")
        same_kind = part_fs.type_name == fs.type_name
        if same_kind and path.startswith(root + "/"):
            return dict(part, uri=path[len(root) + 1 :])
        origin = part.get("origin") or (
            self.owner
            if is_relative(part["uri"])
            # an older header: its URI
            else {"version": None, "index": part["uri"].rsplit("/parts/", 1)[0]}
        )
        entry = dict(
            part, uri=storage.to_uri(part_fs, path), path=part.get("path") or relative_part(part["id"]), origin=origin
        )
        if same_kind:
            entry["relative"] = posixpath.relpath(path, root)
        else:
            entry.pop("relative", None)
        return entry

    def read_rows(self, keys: list[str]) -> pa.Table | None:
        """The stored rows with these keys (their key buckets only), or None when none is stored."""
        wanted = set(key_buckets(keys, self.header["num_buckets"]).tolist())
        key_set = pa.array(sorted(set(keys)), pa.string())
        tables = self._read(
            _rows_file, wanted, "row_buckets", keep=lambda t: t.filter(pc.is_in(t.column("key"), value_set=key_set))
        )
        return pa.concat_tables(tables, promote_options="default") if tables else None

    def reachable_keys(self, new_values: np.ndarray) -> list[str]:
        """Keys of stored rows sharing a band key with a new value in some band."""
        found: set[str] = set()
        p = self.header["num_buckets"]
        for j, mask in enumerate(self.masks):
            wanted = set(value_buckets(new_values, int(mask), p).tolist())
            band_keys = np.unique(new_values & mask)

            def keep(t: pa.Table, mask=mask, band_keys=band_keys) -> pa.Table:
                same = np.isin(t.column("value").to_numpy() & mask, band_keys)
                return t.select(["key"]).filter(pa.array(same))

            for t in self._read(lambda root, b, j=j: _band_file(root, j, b), wanted, "band_buckets", j, keep):
                found.update(t.column("key").to_pylist())
        return sorted(found)

    def sub_index(self, new: pa.Table, cfg: NearDupConfig) -> NearDupIndex:
        """A small in-memory index: every stored row a new value can reach, and their representatives."""
        self.check(cfg)
        clash = self.read_rows(new.column("key").to_pylist())
        if clash is not None and clash.num_rows:
            raise ValueError(f"new rows reuse keys of the existing version: {clash.column('key')[0].as_py()!r}")
        _, values = row_values(new, cfg)
        rows = self.read_rows(self.reachable_keys(np.unique(values))) if len(values) else None
        if rows is not None and rows.num_rows:
            reps = sorted(set(rows.column("representative").to_pylist()) - set(rows.column("key").to_pylist()))
            more = self.read_rows(reps) if reps else None
            rows = pa.concat_tables([rows, more], promote_options="default") if more is not None else rows
        h = self.header
        self.reached = 0 if rows is None else rows.num_rows
        return NearDupIndex.from_rows(
            rows, cfg, masks=self.masks, num_blocks=h["num_blocks"], max_distance=h["max_distance"], like=new
        )

    def decisions(self, new: pa.Table, cfg: NearDupConfig) -> pa.Table:
        """``incremental_decisions`` of ``new`` against this index, reading only touched buckets."""
        if not cfg.enabled or new.num_rows == 0:
            return DECISION_SCHEMA.empty_table()
        return incremental_decisions(new, self.sub_index(new, cfg), cfg)

    def load(self) -> NearDupIndex:
        """The whole index in memory (every bucket file: for tests and small versions only)."""
        h = self.header
        cfg = NearDupConfig(hash=h["hash"], match_mirrored=h["match_mirrored"], max_distance=h["max_distance"])
        tables = self._read(_rows_file, set(range(h["num_buckets"])), "row_buckets")
        rows = pa.concat_tables(tables, promote_options="default") if tables else None
        if rows is None:
            raise ValueError(f"{self.root}: the near-dup index holds no rows")
        return NearDupIndex.from_rows(
            rows, cfg, masks=self.masks, num_blocks=h["num_blocks"], max_distance=h["max_distance"]
        )


def save_index(index: NearDupIndex, fs, path: str, num_buckets: int | None = None) -> dict:
    """An in-memory index written partitioned, as one part (``num_buckets`` None: ``default_buckets``)."""
    cfg = NearDupConfig(hash=index.hash, match_mirrored=index.match_mirrored, max_distance=index.max_distance)
    return write_index(
        fs,
        path,
        index.rows,
        cfg,
        masks=index.masks,
        num_blocks=index.num_blocks,
        max_distance=index.max_distance,
        num_buckets=num_buckets or default_buckets(index.rows.num_rows),
    )


@dataclasses.dataclass
class IndexExtension:
    """The index a run saves after deciding a batch against ``base``: ``base``'s parts plus one part
    of the batch's rows (``representative``: their ``duplicate_of`` or themselves)."""

    base: PartitionedNearIndex
    rows: pa.Table

    def write(self, fs, path: str) -> dict:
        h = self.base.header
        cfg = NearDupConfig(hash=h["hash"], match_mirrored=h["match_mirrored"], max_distance=h["max_distance"])
        return write_index(
            fs,
            path,
            self.rows,
            cfg,
            masks=self.base.masks,
            num_blocks=h["num_blocks"],
            max_distance=h["max_distance"],
            earlier=self.base,
        )

    def save(self, path: str) -> dict:
        return self.write(*storage.resolve(path))


def decide_against(
    new: pa.Table, index: NearDupIndex | PartitionedNearIndex, cfg: NearDupConfig
) -> tuple[pa.Table, NearDupIndex | IndexExtension]:
    """A new batch's near-dup decisions against an earlier version's index, and the index the run
    saves: a partitioned index grows by one part (the batch's rows); an in-memory one (built from a
    manifest) is extended whole."""
    if isinstance(index, NearDupIndex):
        decisions = incremental_decisions(new, index, cfg)
        return decisions, index.extended(new, decisions, cfg)
    decisions = index.decisions(new, cfg)
    rows = NearDupIndex.build(new, cfg, decisions).rows if new.num_rows else new.slice(0, 0)
    return decisions, IndexExtension(index, rows)


def save_any(index: NearDupIndex | IndexExtension, fs, path: str) -> dict:
    """Write the index a run built (whole, as one part) or extended (one new part)."""
    return save_index(index, fs, path) if isinstance(index, NearDupIndex) else index.write(fs, path)
