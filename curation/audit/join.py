"""Joins of manifests larger than memory: rows spilled to local files by hash, then joined bucket by bucket.

Every row carries a 64-bit hash of its join key (``HASH``: ``hash_of`` the key's text). A
``Spill`` writes a stream of batches to 2^bits Arrow IPC files by the hash's next ``bits`` bits
(``FANOUT_BITS`` at first); ``buckets`` then yields, for inputs spilled with the same hash (e.g.
two versions' rows by key), one bucket at a time: each input's rows whose hash falls in it, as a
table. A bucket with more than ``max_rows`` rows of some input is spilled again by the hash's
next bits, as many as it takes (up to ``FANOUT_BITS``), so that what a bucket holds stays under
``max_rows`` rows per input whatever the inputs' size: a Grace hash join. Only rows of a single
hash value cannot be split (many rows with one join key): such a bucket holds them all. A
bucket's files are deleted once the consumer has moved on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HASH = "_hash"
FANOUT_BITS = 4  # the most files one spill writes: 16


def hash_of(values: list[str]) -> pa.Array:
    """A 64-bit hash of each value (BLAKE2b), for ``HASH``: uniform whatever the values look like."""
    return pa.array(
        [int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "big") for v in values], pa.uint64()
    )


def with_hash(batch: pa.RecordBatch | pa.Table, values: list[str]):
    """``batch`` with ``HASH`` of ``values`` (its join key, one per row) appended."""
    return batch.append_column(HASH, hash_of(values))


@dataclasses.dataclass(frozen=True)
class Spilled:
    """One spill file: its rows and the range of their hashes."""

    path: Path
    rows: int
    lo: int
    hi: int


class Spill:
    """One input's rows in 2^bits files by the ``bits`` bits of their hash after the first ``used``;
    ``close`` gives each file (None for one with no row)."""

    def __init__(self, folder: Path, schema: pa.Schema, used: int = 0, bits: int = FANOUT_BITS) -> None:
        self.folder, self.schema, self.used, self.fanout = folder, schema, used, 1 << bits
        self.shift = 64 - used - bits
        self.writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
        self.stats: dict[int, list[int]] = {}
        folder.mkdir(parents=True, exist_ok=True)

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        if not batch.num_rows:
            return
        batch = batch.select(self.schema.names).cast(self.schema)
        hashes = batch.column(HASH).to_numpy()
        child = ((hashes >> np.uint64(self.shift)) & np.uint64(self.fanout - 1)).astype(np.int64)
        order = np.argsort(child, kind="stable")
        ranked = batch.take(pa.array(order))
        edges = np.searchsorted(child[order], np.arange(self.fanout + 1))
        for c in range(self.fanout):
            if edges[c + 1] > edges[c]:
                self._write(c, ranked.slice(edges[c], edges[c + 1] - edges[c]), hashes[order[edges[c] : edges[c + 1]]])

    def _write(self, child: int, part, hashes: np.ndarray) -> None:
        if child not in self.writers:
            self.writers[child] = pa.ipc.new_file(str(self.folder / f"{child:02d}.arrow"), self.schema)
            self.stats[child] = [0, int(hashes.min()), int(hashes.max())]
        for batch in part.to_batches() if isinstance(part, pa.Table) else [part]:
            self.writers[child].write_batch(batch)
        s = self.stats[child]
        s[0], s[1], s[2] = s[0] + part.num_rows, min(s[1], int(hashes.min())), max(s[2], int(hashes.max()))

    def close(self) -> list[Spilled | None]:
        for w in self.writers.values():
            w.close()
        return [
            Spilled(self.folder / f"{c:02d}.arrow", *self.stats[c]) if c in self.writers else None
            for c in range(self.fanout)
        ]


def read(spilled: Spilled | None, schema: pa.Schema) -> pa.Table:
    if spilled is None:
        return schema.empty_table()
    with pa.OSFile(str(spilled.path)) as f:
        return pa.ipc.open_file(f).read_all()


def _respill(spilled: Spilled | None, folder: Path, schema: pa.Schema, used: int, bits: int) -> list[Spilled | None]:
    out = Spill(folder, schema, used, bits)
    if spilled is not None:
        with pa.OSFile(str(spilled.path)) as f:
            reader = pa.ipc.open_file(f)
            for i in range(reader.num_record_batches):
                out.write(reader.get_batch(i))
    return out.close()


def _remove(parts) -> None:
    for p in parts:
        if p is not None:
            p.path.unlink(missing_ok=True)


def _split_bits(parts: dict[str, Spilled | None], max_rows: int, used: int) -> int:
    """How many more bits of the hash split a bucket under ``max_rows`` rows per input (0: it fits,
    or its inputs over ``max_rows`` each hold a single hash value, or the hash is used up)."""
    over = [p.rows for p in parts.values() if p is not None and p.rows > max_rows and p.lo < p.hi]
    if not over or used >= 64:
        return 0
    return min(FANOUT_BITS, max(1, math.ceil(math.log2(max(over) / max_rows))), 64 - used)


def buckets(
    spilled: dict[str, list[Spilled | None]],
    schemas: dict[str, pa.Schema],
    folder: Path,
    max_rows: int,
    used: int = FANOUT_BITS,
) -> Iterator[dict[str, pa.Table]]:
    """Per bucket, each input's rows (``spilled``: each input's ``Spill.close()``, made with the
    same bits of the hash; ``used``: how many of its bits were used then)."""
    for child in range(len(next(iter(spilled.values())))):
        parts = {name: files[child] for name, files in spilled.items()}
        if all(p is None for p in parts.values()):
            continue
        bits = _split_bits(parts, max_rows, used)
        if bits:
            sub = folder / f"{used}-{child:02d}"
            again = {name: _respill(p, sub / name, schemas[name], used, bits) for name, p in parts.items()}
            _remove(parts.values())
            yield from buckets(again, schemas, sub, max_rows, used + bits)
            continue
        yield {name: read(p, schemas[name]) for name, p in parts.items()}
        _remove(parts.values())


def first_per(table: pa.Table, column: str) -> pa.Table:
    """The first row of each run of equal ``column`` values (a table sorted by ``column`` first)."""
    n = table.num_rows
    if n < 2:
        return table
    values = table.column(column)
    changed = pc.not_equal(values.slice(1), values.slice(0, n - 1))
    return table.filter(pa.concat_arrays([pa.array([True]), pc.fill_null(changed, True).combine_chunks()]))
