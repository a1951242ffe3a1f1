"""The near-dup index stored partitioned, so a new batch dedups against an earlier version
without loading it whole.

Layout (under an output's ``_dedup/near_index/``; any pyarrow filesystem)::

    index.json                             header: format, settings (``SETTINGS``: the hash, the
                                           band plan of ``incremental.index_plan``, P) and parts
    parts/<part id>/rows/<b>.parquet       one part's rows (key, hashes, the rule's columns,
                                           representative), bucketed by crc32(key) % P
    parts/<part id>/bands/<j>/<b>.parquet  postings (value, key) of band j, bucketed by
                                           mix64(value & mask_j) % P, sorted by value

A part holds the rows one version added; the next version's header lists the earlier parts and
adds one (append-only, the settings kept). ``<part id>`` is an order-free digest of the part's keys
(``keys_sum``), which the distributed writer sums from partial digests.

**Relocatable.** A header names its own parts relative to its folder (``parts/<id>``), an earlier
version's part by its ``origin`` (version id, index URI), its ``path`` in its owner's index folder
and two hints from write time: ``relative`` (from this folder) and ``uri`` (absolute). Opening an
index resolves every part under each location passed now (``DedupNearConfig.index_locations``), then
the hints; when none holds it, the open fails in one line naming the missing version.

A search (``PartitionedNearIndex.sub_index``) reads, per band, only the buckets the batch's band
keys hash to, then the rows those postings reach and their representatives: a small
``NearDupIndex`` on which ``incremental_decisions`` equals the whole index's decisions.
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
from curation.dedup.incremental import NearDupIndex, check_settings, incremental_decisions, refuse_reused_keys
from curation.dedup.near import DedupNearConfig, row_values
from curation.dedup.shuffle import slices
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


def band_buckets(values: np.ndarray, masks, num_buckets: int) -> np.ndarray:
    """Each value's postings bucket ``j * P + value bucket`` in every band j, band after band."""
    return np.concatenate([j * num_buckets + value_buckets(values, int(m), num_buckets) for j, m in enumerate(masks)])


def rows_file(part: str, b: int) -> str:
    return storage.join(part, "rows", f"{b:05d}.parquet")


def band_file(part: str, j: int, b: int) -> str:
    return storage.join(part, "bands", f"{j:04d}", f"{b:05d}.parquet")


def keys_sum(keys: list[str]) -> int:
    """An order-free digest of a multiset of keys: the sum of their 128-bit BLAKE2b hashes mod 2^128.
    Partial sums of any split of the keys add up to it, so a distributed writer never gathers them."""
    return sum(int.from_bytes(hashlib.blake2b(k.encode(), digest_size=16).digest(), "big") for k in keys) % 2**128


def part_id(num_rows: int, key_sum: int) -> str:
    """A part's id: a digest of its keys (``keys_sum``) and their number (content, not paths)."""
    return hashlib.sha256(f"{num_rows}:{key_sum:032x}".encode()).hexdigest()[:16]


def relative_part(pid: str) -> str:
    """How the header names a part under its own index folder (relative: the output may be moved)."""
    return storage.join("parts", pid)


def row_records(rows: pa.Table, num_buckets: int) -> pa.Table:
    """Index rows with ``_b``: their key bucket."""
    return rows.append_column("_b", pa.array(key_buckets(rows.column("key").to_pylist(), num_buckets)))


def band_records(rows: pa.Table, cfg: DedupNearConfig, masks: np.ndarray, num_buckets: int) -> pa.Table:
    """Per band j and distinct hash value of a row: (value, key, ``_b`` = j * P + value bucket)."""
    r, v = row_values(rows, cfg)
    post = pa.table({"value": pa.array(v, pa.uint64()), "key": rows.column("key").take(pa.array(r))})
    return pa.concat_tables([post] * len(masks)).append_column("_b", pa.array(band_buckets(v, masks, num_buckets)))


def write_buckets(fs, part: str, records: pa.Table, num_buckets: int, kind: str) -> list[int]:
    """The bucket files of ``records`` (``row_records`` for ``kind`` "rows", else ``band_records``),
    each sorted (by key; postings by value, then key: the same files whatever the row order);
    returns the ``_b`` written."""
    written = []
    for b, bucket in slices(records, "_b"):
        body = bucket.drop_columns(["_b"])
        if kind == "rows":
            storage.write_parquet(fs, rows_file(part, b), body.sort_by("key"))
        else:
            path = band_file(part, b // num_buckets, b % num_buckets)
            storage.write_parquet(fs, path, body.sort_by([("value", "ascending"), ("key", "ascending")]))
        written.append(b)
    return written


def write_part(fs, index_root: str, rows: pa.Table, settings: dict) -> dict:
    """One part (``rows`` carry ``representative``) under ``index_root/parts/<id>``; its header entry.
    (``curation.dedup.distributed.write_near_index`` writes the same files from Ray tasks.)"""
    masks, p = settings_masks(settings), settings["num_buckets"]
    keys = rows.column("key").to_pylist()
    pid = part_id(len(keys), keys_sum(keys))
    part = storage.join(index_root, relative_part(pid))
    row_b = write_buckets(fs, part, row_records(rows, p), p, "rows")
    post = band_records(rows, settings_config(settings), masks, p)
    band_b = write_buckets(fs, part, post, p, "bands")
    return part_entry(pid, len(keys), row_b, band_b, settings, postings=post.num_rows)


def part_entry(pid: str, num_rows: int, row_b: list[int], band_b: list[int], settings: dict, *, postings: int) -> dict:
    """A part's header entry from the ``_b`` written (``row_records``, ``band_records``); ``postings``:
    (value, key) records written over all its bands."""
    p, w = settings["num_buckets"], np.asarray(band_b, dtype=np.int64)
    return {
        "id": pid,
        "uri": relative_part(pid),
        "rows": int(num_rows),
        "postings": int(postings),
        "row_buckets": sorted(int(b) for b in row_b),
        "band_buckets": [sorted((w[w // p == j] % p).tolist()) for j in range(len(settings["masks"]))],
    }


SETTINGS = ("hash", "match_mirrored", "max_distance", "num_blocks", "masks", "num_buckets")


def index_settings(near, num_blocks: int, masks, num_buckets: int) -> dict:
    """A header's settings (``SETTINGS``): ``near``'s hash, match_mirrored and max_distance (of a
    ``DedupNearConfig`` or ``NearDupIndex``), the band plan and P."""
    values = (near.hash, near.match_mirrored, near.max_distance, num_blocks, [str(int(m)) for m in masks], num_buckets)
    return dict(zip(SETTINGS, values))


def settings_config(settings: dict) -> DedupNearConfig:
    """The near-dedup settings an index's rows were prepared with (their hash columns)."""
    return DedupNearConfig(**{k: settings[k] for k in ("hash", "match_mirrored", "max_distance")})


def settings_masks(settings: dict) -> np.ndarray:
    return np.array([int(m) for m in settings["masks"]], dtype=np.uint64)


def write_header(fs, index_root: str, settings: dict, parts: list[dict], earlier=None) -> dict:
    """The header of an index of ``earlier``'s parts (a ``PartitionedNearIndex``, listed from here),
    then ``parts``."""
    listed = [earlier.listed_from(p, fs, index_root) for p in earlier.header["parts"]] if earlier else []
    header = {"format": FORMAT, **{k: settings[k] for k in SETTINGS}, "parts": [*listed, *parts]}
    storage.atomic_write_bytes(
        fs, storage.join(index_root, HEADER), json.dumps(header, indent=2, sort_keys=True).encode()
    )
    return header


def write_index(
    fs, index_root: str, rows: pa.Table, settings: dict, earlier: PartitionedNearIndex | None = None
) -> dict:
    """Write ``rows`` as a new part and the header listing ``earlier``'s parts (if any) before it."""
    return write_header(
        fs, index_root, settings, [write_part(fs, index_root, rows, settings)] if rows.num_rows else [], earlier
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
        """The index at ``root``, every part resolved; ``locations``: where earlier outputs lie now."""
        header = json.loads(storage.read_bytes(fs, storage.join(root, HEADER)))
        if header.get("format") != FORMAT:
            raise ValueError(f"{root}: near-dup index format is not {FORMAT}: curate that version again")
        index = cls(fs, root, header, locations=tuple(locations))
        for part in header["parts"]:
            index.locate(part)
        return index

    @property
    def owner(self) -> dict:
        """The dataset version id of the finished output holding this index (or None), its URI now."""
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
        return settings_masks(self.header)

    def in_memory(self, rows: pa.Table | None, cfg: DedupNearConfig, like: pa.Table | None = None) -> NearDupIndex:
        """``rows`` (``NearDupIndex.from_rows``) under this index's band plan."""
        h = self.header
        return NearDupIndex.from_rows(
            rows, cfg, masks=self.masks, num_blocks=h["num_blocks"], max_distance=h["max_distance"], like=like
        )

    @property
    def num_files(self) -> int:
        """Bucket files of the whole index (what a full load would open)."""
        return sum(len(p["row_buckets"]) + sum(len(b) for b in p["band_buckets"]) for p in self.header["parts"])

    def check(self, cfg: DedupNearConfig) -> None:
        check_settings(settings_config(self.header), cfg)

    def _read(self, path_of, wanted: set[int], listed: str, j: int | None = None, keep=None) -> list[pa.Table]:
        """The files of buckets ``wanted`` in every part, each filtered by ``keep`` as it is read."""
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
        """(filesystem, path) of an absolute part URI: this index's filesystem when of the same kind
        (keeping its endpoint and credentials), else the one the URI names."""
        prefix = f"{self.fs.type_name}://"
        if uri.startswith(prefix):
            return self.fs, uri[len(prefix) :]
        return storage.resolve(uri) if "://" in uri else (self.fs, uri)

    def listed_from(self, part: dict, fs, index_root: str) -> dict:
        """How an index written at ``index_root`` (on ``fs``) lists this index's ``part``: relative when
        under that folder, else as an earlier version's (origin, path, the two hints)."""
        part_fs, path = self.locate(part)
        root = index_root.rstrip("/")
        same_kind = part_fs.type_name == fs.type_name
        if same_kind and path.startswith(root + "/"):
            return dict(part, uri=path[len(root) + 1 :])
        entry = dict(part, uri=storage.to_uri(part_fs, path), origin=part.get("origin") or self.owner)
        entry.update(path=part.get("path") or relative_part(part["id"]), relative=posixpath.relpath(path, root))
        if not same_kind:
            del entry["relative"]
        return entry

    def read_rows(self, keys: list[str]) -> pa.Table | None:
        """The stored rows with these keys (their key buckets only), or None when none is stored."""
        wanted = set(key_buckets(keys, self.header["num_buckets"]).tolist())
        key_set = pa.array(sorted(set(keys)), pa.string())
        tables = self._read(
            rows_file, wanted, "row_buckets", keep=lambda t: t.filter(pc.is_in(t.column("key"), value_set=key_set))
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

            for t in self._read(lambda root, b, j=j: band_file(root, j, b), wanted, "band_buckets", j, keep):
                found.update(t.column("key").to_pylist())
        return sorted(found)

    def sub_index(self, new: pa.Table, cfg: DedupNearConfig) -> NearDupIndex:
        """A small in-memory index: every stored row a new value can reach, and their representatives."""
        self.check(cfg)
        clash = self.read_rows(new.column("key").to_pylist())
        if clash is not None:
            refuse_reused_keys(new.column("key"), clash.column("key"))
        _, values = row_values(new, cfg)
        rows = self.read_rows(self.reachable_keys(np.unique(values))) if len(values) else None
        if rows is not None and rows.num_rows:
            reps = sorted(set(rows.column("representative").to_pylist()) - set(rows.column("key").to_pylist()))
            more = self.read_rows(reps) if reps else None
            rows = pa.concat_tables([rows, more], promote_options="default") if more is not None else rows
        self.reached = 0 if rows is None else rows.num_rows
        return self.in_memory(rows, cfg, like=new)

    def decisions(self, new: pa.Table, cfg: DedupNearConfig) -> pa.Table:
        """``incremental_decisions`` of ``new`` against this index, reading only touched buckets."""
        if not cfg.enabled or new.num_rows == 0:
            return DECISION_SCHEMA.empty_table()
        return incremental_decisions(new, self.sub_index(new, cfg), cfg)

    def load(self) -> NearDupIndex:
        """The whole index in memory (every bucket file: for tests and small versions only)."""
        tables = self._read(rows_file, set(range(self.header["num_buckets"])), "row_buckets")
        if not tables:
            raise ValueError(f"{self.root}: the near-dup index holds no rows")
        rows = pa.concat_tables(tables, promote_options="default")
        return self.in_memory(rows, settings_config(self.header))


@dataclasses.dataclass
class IndexExtension:
    """The index a run saves after deciding a batch against ``base``: ``base``'s parts plus one part
    of the batch's rows (``representative``: their ``duplicate_of`` or themselves)."""

    base: PartitionedNearIndex
    rows: pa.Table

    def write(self, fs, path: str) -> dict:
        return write_index(fs, path, self.rows, self.base.header, earlier=self.base)


def decide_against(new: pa.Table, index: PartitionedNearIndex, cfg: DedupNearConfig) -> tuple[pa.Table, IndexExtension]:
    """A new batch's near-dup decisions against an earlier version's index, and the index the run
    saves: the earlier one grown by one part (the batch's rows)."""
    decisions = index.decisions(new, cfg)
    rows = NearDupIndex.build(new, cfg, decisions).rows if new.num_rows else new.slice(0, 0)
    return decisions, IndexExtension(index, rows)


def save_index(index: NearDupIndex | IndexExtension, fs, path: str, num_buckets: int | None = None) -> dict:
    """Write the index a run built (whole, as one part; ``num_buckets`` None: ``default_buckets``) or
    extended (``IndexExtension``: its base's parts, then one new part)."""
    if isinstance(index, IndexExtension):
        return index.write(fs, path)
    p = num_buckets or default_buckets(index.rows.num_rows)
    return write_index(fs, path, index.rows, index_settings(index, index.num_blocks, index.masks, p))
