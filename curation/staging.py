"""Staging: the scored rows of each input partition, kept until the global steps have run.

Layout under ``<output>/_staging/<partition>/``:

- ``_listing.json``: the partition's keys, written by its read task before any of its rows
  go downstream.
- ``part-<digest>.parquet``: scored rows as the sink received them; rows of one partition may
  arrive in several blocks, so a partition has one or more parts. Image bytes that can be read
  again from the input (``bytes_uri``/``bytes_offset``: a file, an uncompressed tar member) are
  not copied here: pass 2 and the shard writer read them by reference (``load_image_bytes``),
  checked against the row's SHA-256. Only re-encoded images and bytes from Parquet byte columns
  or compressed tars are staged.

A partition is *complete* when its listing exists and every listed key is in its parts.
Completeness is derived from the files, so a job killed at any point restarts by deleting
the staging folders of incomplete partitions and processing only those again.
"""

from __future__ import annotations

import hashlib
import json
import posixpath

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from curation.output import LISTING_FILE as LISTING
from curation.output import STAGING_DIR as STAGING
from curation.schema import PAYLOAD_COLUMNS, TRANSIENT_COLUMNS
from infra import storage


def partition_dir(output: str, pid: str) -> str:
    return storage.join(output, STAGING, pid)


def write_listing(fs, output: str, pid: str, keys: list[str]) -> None:
    storage.atomic_write_bytes(fs, storage.join(partition_dir(output, pid), LISTING), json.dumps(sorted(keys)).encode())


def by_reference(table: pa.Table) -> pa.Table:
    """``table`` without the image bytes of rows that can read them again from the input."""
    if "image" not in table.column_names or "bytes_uri" not in table.column_names:
        return table
    image = table.column("image")
    return table.set_column(
        table.schema.get_field_index("image"),
        "image",
        pc.if_else(pc.is_valid(table.column("bytes_uri")), pa.nulls(table.num_rows, image.type), image),
    )


def _read_references(refs: list[tuple[int, str, int, int]]) -> dict[int, bytes]:
    """Bytes of (row, uri, offset, length) references, each container opened once."""
    out: dict[int, bytes] = {}
    by_uri: dict[str, list[tuple[int, int, int]]] = {}
    for row, uri, offset, length in refs:
        by_uri.setdefault(uri, []).append((offset, length, row))
    for uri, wanted in by_uri.items():
        # the readers record local files by their resolved absolute path: no need to resolve again
        local = "://" not in uri and posixpath.isabs(uri)
        fs, path = (pafs.LocalFileSystem(), uri) if local else storage.resolve(uri)
        with fs.open_input_file(path) as fh:
            for offset, length, row in sorted(wanted):
                out[row] = fh.read_at(length, offset)
    return out


def referenced_bytes(table: pa.Table, rows: list[bool]) -> dict[int, bytes]:
    """Row index -> image bytes read back from the input, for the ``rows`` staged by reference.

    The bytes must have the SHA-256 pass 1 recorded: an input that changed or vanished since is
    a ``RuntimeError`` naming it (the passes would disagree otherwise)."""
    if "bytes_uri" not in table.column_names or table.num_rows == 0:
        return {}
    uris, offsets = table.column("bytes_uri").to_pylist(), table.column("bytes_offset").to_pylist()
    sizes, digests = table.column("input_bytes").to_pylist(), table.column("sha256").to_pylist()
    keys, staged = table.column("key").to_pylist(), table.column("image").is_valid().to_pylist()
    refs = [
        (i, uris[i], offsets[i], sizes[i])
        for i, wanted in enumerate(rows)
        if wanted and not staged[i] and uris[i] is not None
    ]
    if not refs:
        return {}
    try:
        loaded = _read_references(refs)
    except OSError as err:
        raise RuntimeError(
            f"an input read in pass 1 can no longer be read ({type(err).__name__}: {err}); "
            "inputs must stay in place until the run completes"
        ) from None
    for i, data in loaded.items():
        if hashlib.sha256(data).hexdigest() != digests[i]:
            raise RuntimeError(
                f"input {uris[i]} (offset {offsets[i]}, key {keys[i]}) changed since pass 1 read it "
                "(SHA-256 differs); inputs must stay unchanged until the run completes"
            )
    return loaded


def load_image_bytes(table: pa.Table, rows: list[bool]) -> pa.Table:
    """``table`` with the image bytes of the ``rows`` staged by reference read back from the
    input (``referenced_bytes``)."""
    loaded = referenced_bytes(table, rows)
    if not loaded:
        return table
    image = table.column("image").to_pylist()
    for i, data in loaded.items():
        image[i] = data
    return table.set_column(table.schema.get_field_index("image"), "image", pa.array(image, pa.binary()))


def write_parts(fs, output: str, table: pa.Table) -> int:
    """Write one part file per partition present in ``table`` (image bytes by reference where
    they can be read again, ``by_reference``; without the transient columns of pass 1's read
    task, ``TRANSIENT_COLUMNS``); returns rows written."""
    table = by_reference(table.drop_columns([c for c in TRANSIENT_COLUMNS if c in table.column_names]))
    parts = table.column("partition").to_pylist()
    for pid in sorted(set(parts)):
        rows = table.filter(pa.compute.equal(table.column("partition"), pid))
        rows = rows.sort_by("key")
        digest = hashlib.sha1("\n".join(rows.column("key").to_pylist()).encode()).hexdigest()[:16]
        storage.write_parquet(
            fs, storage.join(partition_dir(output, pid), f"part-{digest}.parquet"), rows, stored=PAYLOAD_COLUMNS
        )
    return table.num_rows


def part_paths(fs, output: str, pid: str) -> list[str]:
    d = partition_dir(output, pid)
    if not storage.exists(fs, d):
        return []
    return [
        f.path for f in storage.list_files(fs, d, (".parquet",), recursive=False) if f.base_name.startswith("part-")
    ]


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
