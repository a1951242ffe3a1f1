"""An annotation version's rows, by key, for the explorer's image page.

An annotation output (``evaluation.annotate``) holds one Parquet table per source shard, named
by the shard's stem; a kept image's row is read from the table of the shard its manifest row
names, filtered by key. Maps (seg PNG, normals, pointmaps) are shown as what they are, not drawn.
"""

from __future__ import annotations

import pyarrow.parquet as pq

from infra import storage


def summarise(value):
    """A value of an annotation row as the page shows it."""
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, list):
        inner = f" of {len(value[0])}" if value and isinstance(value[0], list) else ""
        return f"<list of {len(value)}{inner}>"
    return value


class AnnotationLookup:
    """The finished annotation output at ``uri`` of dataset version ``dataset_id``."""

    def __init__(self, uri: str, dataset_id: str) -> None:
        from evaluation.annotate import layout

        self.layout = layout
        self.fs, self.root = storage.resolve(uri)
        done = layout.read_success(self.fs, self.root)
        if done is None:
            raise ValueError(f"--annotations {uri!r} is not a finished annotation output (no _SUCCESS)")
        found = done.get("dataset_id")
        if found != dataset_id:
            raise ValueError(f"--annotations {uri!r} annotates dataset version {found!r}, not {dataset_id!r}")
        self.uri, self.version_id = uri, done.get("annotation_version_id")

    def row(self, key: str, shard: str | None) -> dict | None:
        """The annotation row of ``key`` (kept in ``shard``), values summarised; None when absent."""
        if not shard:
            return None
        path = self.layout.table_path(self.root, self.layout.shard_id(shard))
        if not storage.exists(self.fs, path):
            return None
        with self.fs.open_input_file(path) as fh:
            table = pq.read_table(fh, filters=[("key", "=", key)])
        rows = table.to_pylist()
        return {k: summarise(v) for k, v in rows[0].items()} if rows else None
