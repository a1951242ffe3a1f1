"""Readers: one raw row per input image of a partition (``curation.partitions``), in input order.

Supported inputs (local paths or object-store URIs through pyarrow.fs):

- ``folder``: the partition's image files.
- ``webdataset``: a WebDataset / img2dataset tar shard. Members are grouped by key (basename
  up to the first dot) across the whole tar, so members of one sample need not be contiguous;
  ``<key>.json`` / ``<key>.txt`` become ``source_meta``. img2dataset's output (``NNNNN.tar`` +
  ``NNNNN.parquet`` + ``NNNNN_stats.json``) records its failed downloads only in the Parquet:
  each becomes one ``download_failed`` error row of the tar's partition, so the funnel starts at
  what was attempted (``img2dataset_failures``). Tar members are only read into memory, never
  extracted, so hostile member names (``../x``, absolute paths) cannot write anywhere; they are
  sanitised into keys.
- ``parquet``: the partition's row groups, image bytes in a column or read from a path column.

A file that cannot be read becomes a ``read_failed`` row (one for the rest of a container),
and the run goes on; a record of failed downloads that cannot be read fails the partition.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import tarfile
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from curation.config import InputConfig
from curation.output import split_member
from curation.partitions import Partition, parquet_columns, plan_partitions
from curation.schema import DOWNLOAD_FAILED, EMPTY_FILE, FILE_TOO_LARGE, RAW_FIELDS, RAW_SCHEMA, READ_FAILED
from curation.steps import Reader
from infra import storage

ROWS_PER_BLOCK = 64  # raw rows per yielded table: keeps read tasks streaming
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def make_key(name: str, source: str) -> str:
    """Stable, unique, WebDataset-safe key: readable stem plus a digest of the full source URI."""
    stem = _KEY_UNSAFE.sub("_", name).strip("_")[-40:] or "img"
    return f"{stem}-{hashlib.sha1(source.encode()).hexdigest()[:12]}"


class _RowBuffer:
    """Collects raw rows and hands them out as RAW_SCHEMA tables of ROWS_PER_BLOCK rows."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self.rows: list[dict] = []

    def add(
        self,
        key: str,
        source: str,
        raw: bytes | None,
        *,
        size: int | None = None,
        meta: str | None = None,
        reason: str | None = None,
        error: str | None = None,
        at: tuple[str, int] | None = None,
    ) -> None:
        """``at``: (uri, offset) where ``raw`` can be read again, when it can (``schema``'s ``bytes_uri``)."""
        if raw is not None and len(raw) == 0 and reason is None:
            reason = EMPTY_FILE
        ok = reason is None and raw is not None and at is not None and (size is None or size == len(raw))
        self.rows.append(
            {
                "partition": self.partition.id,
                "key": key,
                "source": source,
                "source_meta": meta,
                "input_bytes": size if size is not None else (len(raw) if raw is not None else None),
                "raw": raw if reason is None else None,
                "reason": reason,
                "error_message": error,
                "bytes_uri": at[0] if ok else None,
                "bytes_offset": at[1] if ok else None,
            }
        )

    def full(self) -> bool:
        return len(self.rows) >= ROWS_PER_BLOCK

    def flush(self) -> pa.Table:
        table = pa.Table.from_pylist(self.rows, schema=RAW_SCHEMA)
        self.rows = []
        return table


class _Resolver:
    """``storage.resolve`` for many files, each local folder's real path computed once (a file's
    real path is its folder's real path joined with its name, unless the file is a link itself)."""

    def __init__(self) -> None:
        self.folders: dict[str, str] = {}

    def __call__(self, uri: str):
        if "://" in uri or not posixpath.isabs(uri) or "/." in uri or "//" in uri:
            return storage.resolve(uri)
        folder, name = posixpath.split(uri)
        real = self.folders.get(folder)
        if real is None:
            real = self.folders[folder] = storage.resolve(folder)[1]
        if os.path.islink(uri):
            return storage.resolve(uri)
        return pafs.LocalFileSystem(), posixpath.join(real, name)


def _read_files(p: Partition, max_bytes: int) -> Iterator[pa.Table]:
    buf = _RowBuffer(p)
    root = storage.resolve(p.root)[1] if p.root else None
    resolve = _Resolver()
    for uri, size in zip(p.uris, p.sizes):
        fs, path = resolve(uri)
        rel = posixpath.relpath(path, root) if root is not None else uri
        key = make_key(posixpath.splitext(rel)[0], uri)
        if size > max_bytes:
            buf.add(key, uri, None, size=size, reason=FILE_TOO_LARGE, error=_too_large(size, max_bytes))
        else:
            try:
                buf.add(key, uri, storage.read_bytes(fs, path), size=size, at=(storage.to_uri(fs, path), 0))
            except OSError as err:
                buf.add(key, uri, None, size=size, reason=READ_FAILED, error=f"{type(err).__name__}: {err}")
        if buf.full():
            yield buf.flush()
    if buf.rows:
        yield buf.flush()


def _collect_tar_samples(uri: str, max_bytes: int, image_exts: tuple[str, ...]) -> tuple[dict[str, dict], str | None]:
    """Sample key -> {"image": (ext, bytes or None when too large, size, offset of the bytes in
    the tar or None when it is compressed), "json"/"txt": text}, in first-seen order, grouped by
    WebDataset's member-name rule across the whole tar; and the error that cut the tar short, if
    any (what was read before it is kept)."""
    samples: dict[str, dict] = {}
    try:
        fs, path = storage.resolve(uri)
        with fs.open_input_stream(path) as stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
            plain = getattr(tar.fileobj, "comptype", None) == "tar"  # member offsets are file offsets
            for member in tar:
                # Directories, links and devices carry no image bytes; a name without a key and an
                # extension (README, .hidden) is no sample member for WebDataset either.
                split = split_member(member.name) if member.isfile() else None
                if split is not None:
                    _add_tar_member(
                        samples.setdefault(split[0], {}), split[1], tar, member, max_bytes, image_exts, plain
                    )
    except (tarfile.TarError, OSError, EOFError) as err:
        return samples, f"{type(err).__name__}: {err}"
    return samples, None


def _add_tar_member(
    entry: dict,
    ext: str,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    max_bytes: int,
    image_exts: tuple[str, ...],
    plain: bool = False,
) -> None:
    """The sample's first image member (bytes unless over ``max_bytes``) and its json/txt metadata."""
    if ext in image_exts and "image" not in entry:
        offset = member.offset_data if plain and not member.sparse else None
        if member.size > max_bytes:
            entry["image"] = (ext, None, member.size, None)
        else:
            fh = tar.extractfile(member)
            entry["image"] = (ext, fh.read() if fh else b"", member.size, offset)
    elif ext in ("json", "txt") and member.size <= 1 << 20:
        fh = tar.extractfile(member)
        entry[ext] = (fh.read() if fh else b"").decode("utf-8", "replace")


def _read_tar(p: Partition, max_bytes: int, image_exts: tuple[str, ...]) -> Iterator[pa.Table]:
    uri = p.uris[0]
    tar_stem = posixpath.splitext(posixpath.basename(storage.resolve(uri)[1]))[0]
    samples, failure = _collect_tar_samples(uri, max_bytes, image_exts)
    buf = _RowBuffer(p)
    for sample_key, entry in samples.items():
        if "image" not in entry:
            continue  # e.g. img2dataset's records of failed downloads: no image, not an input image
        ext, raw, size, offset = entry["image"]
        source = f"{uri}#{sample_key}.{ext}"
        key = make_key(f"{tar_stem}_{sample_key}", source)
        meta = entry.get("json", entry.get("txt"))
        if raw is None:
            buf.add(
                key,
                source,
                None,
                size=size,
                meta=meta,
                reason=FILE_TOO_LARGE,
                error=_too_large(size, max_bytes),
            )
        else:
            buf.add(key, source, raw, size=size, meta=meta, at=None if offset is None else (uri, offset))
        if buf.full():
            yield buf.flush()
    if failure is not None:
        _add_unreadable(buf, failure)  # the container broke: what was read is kept, the rest is one error
    for row_no, record in img2dataset_failures(uri, set(samples)):
        if buf.full():
            yield buf.flush()
        _add_failed_download(buf, tar_stem, row_no, record)
    if buf.rows:
        yield buf.flush()


IMG2DATASET_SUCCESS = "success"  # its ``status`` of a sample that is in the tar


def img2dataset_failures(uri: str, in_tar: set[str]) -> list[tuple[int, dict]]:
    """(row number, record) of each download img2dataset's Parquet beside the tar ``uri`` records as
    not successful. Its layout: ``<stem>.parquet`` with ``key`` and ``status`` columns next to
    ``<stem>_stats.json``. Keys with a sample in the tar (``in_tar``) are skipped: every input
    counts once.

    Without both files there is no such record and none: the tar is a plain WebDataset shard (a
    curated output's sidecar beside its tar is no record of failures either), and every image it
    holds is read; what no record names, no reader could count. A record that is there but cannot
    be read (a transient object-store error, a truncated file, not img2dataset's columns) raises
    ``RuntimeError``: its failed downloads would vanish from the funnel, so the partition fails
    and a re-run redoes it (``curation.pipeline``: finished partitions are kept)."""
    fs, path = storage.resolve(uri)
    stem = path.removesuffix(".tar")
    record = f"{stem}.parquet"
    if not (storage.exists(fs, record) and storage.exists(fs, f"{stem}_stats.json")):
        return []
    try:
        with fs.open_input_file(record) as fh:
            table = pq.read_table(fh)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise _unreadable_record(storage.to_uri(fs, record), f"{type(err).__name__}: {err}") from err
    if not {"key", "status"} <= set(table.column_names):
        raise _unreadable_record(storage.to_uri(fs, record), f"no 'key' and 'status' columns in {table.column_names}")
    return [
        (i, r)
        for i, r in enumerate(table.to_pylist())
        if r["status"] != IMG2DATASET_SUCCESS and str(r["key"]) not in in_tar
    ]


def _unreadable_record(uri: str, why: str) -> RuntimeError:
    return RuntimeError(
        f"img2dataset's record of failed downloads {uri} cannot be read ({why}); re-run to resume once "
        "it reads, or remove it to read the tar without its failed downloads"
    )


def _add_failed_download(buf: _RowBuffer, tar_stem: str, row_no: int, record: dict) -> None:
    """One ``download_failed`` row for img2dataset's Parquet row ``row_no`` (its record: source_meta)."""
    uri = buf.partition.uris[0]
    source = f"{uri.removesuffix('.tar')}.parquet#row={row_no}"
    buf.add(
        make_key(f"{tar_stem}_{record['key']}", source),
        source,
        None,
        meta=json.dumps(record, sort_keys=True, default=str),
        reason=DOWNLOAD_FAILED,
        error=f"{record['status']}: {record.get('error_message') or ''}"[:500],
    )


def _add_unreadable(buf: _RowBuffer, error: str) -> None:
    """One ``read_failed`` row standing for (the rest of) a container (tar, parquet) that could not
    be read, e.g. removed between planning and reading: recorded, and the rest of the run goes on."""
    uri = buf.partition.uris[0]
    stem = posixpath.splitext(posixpath.basename(storage.resolve(uri)[1]))[0]
    buf.add(
        make_key(f"{stem}_unreadable", uri + "#unreadable"), uri + "#unreadable", None, reason=READ_FAILED, error=error
    )


def _parquet_rows(p: Partition, cfg: InputConfig) -> tuple[pa.Table, str | None, str | None, str | None, int]:
    uri = p.uris[0]
    fs, path = storage.resolve(uri)
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        image_col, path_col, key_col = parquet_columns(pf.schema_arrow.names, cfg, uri)
        first_row = sum(pf.metadata.row_group(g).num_rows for g in range(p.row_groups[0]))
        columns = [c for c in (image_col, path_col, key_col) if c]
        return pf.read_row_groups(list(p.row_groups), columns=columns), image_col, path_col, key_col, first_row


def _too_large(size: int, max_bytes: int) -> str:
    return f"{size} bytes > decode.max_bytes={max_bytes}"


def _add_parquet_bytes(buf: _RowBuffer, source: str, name: str, raw: bytes | None, max_bytes: int) -> None:
    """A row whose image bytes are in the Parquet (a null cell is an empty file)."""
    key = make_key(name, source)
    if raw is None:
        buf.add(key, source, b"", meta=None)
    elif len(raw) > max_bytes:
        buf.add(key, source, None, size=len(raw), reason=FILE_TOO_LARGE, error=_too_large(len(raw), max_bytes))
    else:
        buf.add(key, source, raw)


def _add_parquet_path(buf: _RowBuffer, target, name: str | None, max_bytes: int) -> None:
    """A row whose image is read from the path or URI ``target`` the Parquet names."""
    source = str(target)
    key = make_key(name if name is not None else posixpath.splitext(posixpath.basename(source))[0], source)
    try:
        tfs, tpath = storage.resolve(source)
        size = tfs.get_file_info(tpath).size
        if size is not None and size > max_bytes:
            buf.add(key, source, None, size=size, reason=FILE_TOO_LARGE, error=_too_large(size, max_bytes))
        else:
            buf.add(key, source, storage.read_bytes(tfs, tpath), at=(storage.to_uri(tfs, tpath), 0))
    except (OSError, ValueError, TypeError) as err:
        buf.add(key, source, None, reason=READ_FAILED, error=f"{type(err).__name__}: {err}")


def _read_parquet(p: Partition, cfg: InputConfig, max_bytes: int) -> Iterator[pa.Table]:
    uri = p.uris[0]
    buf = _RowBuffer(p)
    try:
        table, image_col, path_col, key_col, first_row = _parquet_rows(p, cfg)
    except OSError as err:
        _add_unreadable(buf, f"{type(err).__name__}: {err}")
        yield buf.flush()
        return
    for i, row in enumerate(table.to_pylist()):
        row_no = first_row + i
        name = str(row[key_col]) if key_col and row.get(key_col) is not None else f"row{row_no}"
        if image_col:
            _add_parquet_bytes(buf, f"{uri}#row={row_no}", name, row[image_col], max_bytes)
        else:
            _add_parquet_path(buf, row[path_col], name if key_col else None, max_bytes)
        if buf.full():
            yield buf.flush()
    if buf.rows:
        yield buf.flush()


def read_partition(p: Partition, cfg: InputConfig, max_bytes: int) -> Iterator[pa.Table]:
    """Raw rows (RAW_SCHEMA) of one partition, in input order."""
    exts = tuple(e.lstrip(".").lower() for e in cfg.extensions)
    if p.kind == "files":
        yield from _read_files(p, max_bytes)
    elif p.kind == "tar":
        yield from _read_tar(p, max_bytes, exts)
    elif p.kind == "parquet":
        yield from _read_parquet(p, cfg, max_bytes)
    else:
        raise ValueError(f"unknown partition kind {p.kind!r}")


class Input(Reader):
    """The recipe's first step: plan the input into partitions, read each into raw rows."""

    section = "input"
    Config = InputConfig
    reasons = (DOWNLOAD_FAILED, READ_FAILED, EMPTY_FILE, FILE_TOO_LARGE)
    fields = RAW_FIELDS

    def __init__(self, cfg: InputConfig, max_bytes: int = 64 * 2**20) -> None:
        super().__init__(cfg)
        self.max_bytes = max_bytes  # decode.max_bytes: larger files are recorded, never read

    @classmethod
    def from_config(cls, job) -> Input:
        return cls(job.input, job.decode.max_bytes)

    def plan(self) -> list[Partition]:
        return plan_partitions(self.cfg)

    def read(self, p: Partition) -> Iterator[pa.Table]:
        return read_partition(p, self.cfg, self.max_bytes)
