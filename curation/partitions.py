"""Input partitions: the input listed and cut into units of work and of resume, with deterministic ids.

Planning runs on the driver and reads metadata only (listings, Parquet footers):

- ``folder``: image files under a folder, recursively, cut into partitions of
  ``images_per_partition`` files in path order.
- ``webdataset``: WebDataset / img2dataset tar shards, one partition per tar.
- ``parquet``: files with an image-bytes column or a path/URI column, partitioned by row
  groups of about ``images_per_partition`` rows; a file whose columns cannot work is refused
  here, before any task runs.

A partition id is ``<ordinal>-<digest of its members>``; it names the partition's staging
folder and its output shard, so a re-run of the same job maps to the same names. Reading a
partition into rows is ``curation.readers``; ``partition_datasource`` gives Ray Data one read
task per partition.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath

import pyarrow as pa
import pyarrow.parquet as pq

from curation.config import InputConfig
from curation.schema import RAW_SCHEMA
from infra import storage

IMAGE_BYTES_COLUMNS = ("image", "jpg", "jpeg", "png", "webp", "bytes", "image_bytes")
PATH_COLUMNS = ("path", "uri", "url", "file", "filepath", "image_path")


@dataclasses.dataclass(frozen=True)
class Partition:
    """A unit of work and of resume: its rows become one output shard."""

    id: str
    kind: str  # "files" | "tar" | "parquet" | "staged" (a later pass: rows read back from staging)
    uris: tuple[str, ...]  # files: the image files; tar/parquet: the one container file
    root: str = ""  # files: the folder keys are made relative to
    sizes: tuple[int, ...] = ()  # files: byte sizes from the listing
    row_groups: tuple[int, ...] = ()  # parquet: the row groups of this partition


def _partition_id(ordinal: int, kind: str, members: list[str]) -> str:
    digest = hashlib.sha1("\n".join([kind, *members]).encode()).hexdigest()[:10]
    return f"{ordinal:06d}-{digest}"


def detect_format(cfg: InputConfig) -> str:
    if cfg.format != "auto":
        return cfg.format
    fs, root = storage.resolve(cfg.uri)
    files = storage.list_files(fs, root)
    if any(f.base_name.lower().endswith(".tar") for f in files):
        return "webdataset"
    if any(f.base_name.lower().endswith(".parquet") for f in files):
        return "parquet"
    return "folder"


def plan_partitions(cfg: InputConfig) -> list[Partition]:
    """List the input and cut it into partitions (on the driver; listing is metadata only)."""
    kind = detect_format(cfg)
    planners = {"folder": _plan_folder, "webdataset": _plan_tars, "parquet": _plan_parquet}
    if kind not in planners:
        raise ValueError(f"input.format must be folder, webdataset or parquet, got {kind!r}")
    fs, root = storage.resolve(cfg.uri)
    return planners[kind](cfg, fs, root)


def _plan_folder(cfg: InputConfig, fs, root: str) -> list[Partition]:
    """Image files in path order, ``images_per_partition`` to a partition."""
    files = storage.list_files(fs, root, tuple(cfg.extensions))
    base = root if fs.get_file_info(root).type.name == "Directory" else posixpath.dirname(root)
    parts = []
    for ordinal, start in enumerate(range(0, len(files), cfg.images_per_partition)):
        chunk = files[start : start + cfg.images_per_partition]
        uris = tuple(storage.to_uri(fs, f.path) for f in chunk)
        parts.append(
            Partition(
                id=_partition_id(ordinal, "files", list(uris)),
                kind="files",
                uris=uris,
                root=storage.to_uri(fs, base),
                sizes=tuple(int(f.size) for f in chunk),
            )
        )
    return parts


def _plan_tars(cfg: InputConfig, fs, root: str) -> list[Partition]:
    """One partition per tar."""
    uris = [storage.to_uri(fs, t.path) for t in storage.list_files(fs, root, (".tar",))]
    return [Partition(id=_partition_id(i, "tar", [uri]), kind="tar", uris=(uri,)) for i, uri in enumerate(uris)]


def _plan_parquet(cfg: InputConfig, fs, root: str) -> list[Partition]:
    """Each file's row groups, gathered until a partition holds ``images_per_partition`` rows."""
    parts: list[Partition] = []
    for f in storage.list_files(fs, root, (".parquet",)):
        uri = storage.to_uri(fs, f.path)
        with fs.open_input_file(f.path) as fh:
            pf = pq.ParquetFile(fh)
            meta = pf.metadata
            parquet_columns(pf.schema_arrow.names, cfg, uri)  # fail on the driver, before any work
        group: list[int] = []
        rows = 0
        for rg in range(meta.num_row_groups):
            group.append(rg)
            rows += meta.row_group(rg).num_rows
            if rows >= cfg.images_per_partition or rg == meta.num_row_groups - 1:
                members = [f"{uri}#rg={g}" for g in group]
                pid = _partition_id(len(parts), "parquet", members)
                parts.append(Partition(id=pid, kind="parquet", uris=(uri,), row_groups=tuple(group)))
                group, rows = [], 0
    return parts


def _pick_column(names: list[str], wanted: str | None, candidates: tuple[str, ...], what: str) -> str | None:
    if wanted:
        if wanted not in names:
            raise ValueError(
                f"input.parquet_{what}_column={wanted!r} is not a column of the parquet input; its columns: {names}"
            )
        return wanted
    return next((c for c in candidates if c in names), None)


def parquet_columns(names: list[str], cfg: InputConfig, uri: str) -> tuple[str | None, str | None, str | None]:
    """(image-bytes column, path column, key column) of a parquet input; a clear error when unusable."""
    image_col = _pick_column(names, cfg.parquet_image_column, IMAGE_BYTES_COLUMNS, "image")
    path_col = None if image_col else _pick_column(names, cfg.parquet_path_column, PATH_COLUMNS, "path")
    if image_col is None and path_col is None:
        raise ValueError(
            f"parquet input {uri} has neither an image-bytes column {IMAGE_BYTES_COLUMNS} nor a "
            f"path column {PATH_COLUMNS}; set input.parquet_image_column or input.parquet_path_column"
        )
    return image_col, path_col, _pick_column(names, cfg.parquet_key_column, ("key",), "key")


def partition_to_json(p: Partition) -> str:
    return json.dumps(dataclasses.asdict(p), sort_keys=True)


def partition_datasource(partitions: list[Partition], read_fn, schema: pa.Schema | None = RAW_SCHEMA):
    """A Ray Data datasource with one read task per partition; ``read_fn(p)`` yields its tables
    (of ``schema``, or of a schema known only when read: None)."""
    from ray.data import Datasource, ReadTask
    from ray.data.block import BlockMetadata

    class _PartitionDatasource(Datasource):
        def estimate_inmemory_data_size(self):
            return sum(sum(p.sizes) for p in partitions) or None

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            tasks = []
            for p in partitions:
                meta = BlockMetadata(
                    num_rows=len(p.uris) if p.kind == "files" else None,
                    size_bytes=sum(p.sizes) or None,
                    exec_stats=None,
                    input_files=p.uris,
                )
                tasks.append(ReadTask(lambda p=p: read_fn(p), meta, schema=schema))
            return tasks

        def get_name(self):
            return "CurationInput"

    return _PartitionDatasource()
