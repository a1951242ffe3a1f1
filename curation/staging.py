"""Staging: the scored rows of each input partition, kept until the global steps have run.

Layout under ``<output>/_staging/<partition>/``:

- ``_listing.json``: the partition's keys, written by its read task before any of its rows
  go downstream.
- ``part-<digest>.parquet``: scored rows (image bytes included) as the sink received them;
  rows of one partition may arrive in several blocks, so a partition has one or more parts.

A partition is *complete* when its listing exists and every listed key is in its parts.
Completeness is derived from the files, so a job killed at any point restarts by deleting
the staging folders of incomplete partitions and processing only those again.
"""
from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq

from curation.output import LISTING_FILE as LISTING
from curation.schema import PAYLOAD_COLUMNS
from curation.output import STAGING_DIR as STAGING
from infra import storage


def partition_dir(output: str, pid: str) -> str:
    return storage.join(output, STAGING, pid)


def write_listing(fs, output: str, pid: str, keys: list[str]) -> None:
    storage.atomic_write_bytes(fs, storage.join(partition_dir(output, pid), LISTING),
                               json.dumps(sorted(keys)).encode())


def write_parts(fs, output: str, table: pa.Table) -> int:
    """Write one part file per partition present in ``table``; returns rows written."""
    parts = table.column("partition").to_pylist()
    for pid in sorted(set(parts)):
        rows = table.filter(pa.compute.equal(table.column("partition"), pid))
        rows = rows.sort_by("key")
        digest = hashlib.sha1("\n".join(rows.column("key").to_pylist()).encode()).hexdigest()[:16]
        storage.write_parquet(fs, storage.join(partition_dir(output, pid), f"part-{digest}.parquet"), rows,
                              stored=PAYLOAD_COLUMNS)
    return table.num_rows


def part_paths(fs, output: str, pid: str) -> list[str]:
    d = partition_dir(output, pid)
    if not storage.exists(fs, d):
        return []
    return [f.path for f in storage.list_files(fs, d, (".parquet",), recursive=False)
            if f.base_name.startswith("part-")]


def is_complete(fs, output: str, pid: str) -> bool:
    listing_path = storage.join(partition_dir(output, pid), LISTING)
    if not storage.exists(fs, listing_path):
        return False
    expected = set(json.loads(storage.read_bytes(fs, listing_path)))
    staged: set[str] = set()
    for path in part_paths(fs, output, pid):
        with fs.open_input_file(path) as fh:
            staged.update(pq.read_table(fh, columns=["key"]).column("key").to_pylist())
    return expected <= staged


def clear_partition(fs, output: str, pid: str) -> None:
    d = partition_dir(output, pid)
    if storage.exists(fs, d):
        fs.delete_dir(d)


def read_partition_rows(fs, output: str, pid: str, columns: list[str] | None = None) -> pa.Table | None:
    """All staged rows of a partition, one per key (a retried block may have been written twice), by key."""
    tables = []
    for path in sorted(part_paths(fs, output, pid)):
        with fs.open_input_file(path) as fh:
            tables.append(pq.read_table(fh, columns=columns))
    if not tables:
        return None  # a partition whose input held no image (e.g. an empty tar)
    table = pa.concat_tables(tables, promote_options="default").sort_by("key")
    keys = table.column("key").to_pylist()
    first = [i for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    return table.take(first) if len(first) != len(keys) else table


class StagingSink:
    """Ray Data datasink writing scored rows into staging part files."""

    def __new__(cls, output: str):
        from ray.data import Datasink

        class _Sink(Datasink):
            def __init__(self, output: str) -> None:
                self.output = output

            def write(self, blocks, ctx):
                fs, root = storage.resolve(self.output)
                n = 0
                for block in blocks:
                    table = block if isinstance(block, pa.Table) else pa.Table.from_pandas(block)
                    n += write_parts(fs, root, table)
                return n

            def get_name(self) -> str:
                return "CurationStaging"

        return _Sink(output)

