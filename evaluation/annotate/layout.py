"""An annotation output folder: the one place that knows its layout.

```
<output_dir>/
  annotations/<shard>.tar       WebDataset: per sample <key>.json (status, size, pose, pointmap scale)
                                and its maps (<key>.seg.png, .normal.npy, .pointmap.npy, .depth.npy,
                                .albedo.png), the keys and order of the source shard <shard>.tar
  annotations/<shard>.parquet   the same, one row per kept sample of the source shard; written after
                                the tar: the shard's commit marker
  annotation_id                 the annotation version id: claims the folder for one job
  config.yaml                   the resolved config
  gallery.html                  the predictions drawn on a few samples (self-contained page)
  _SUCCESS                      written last: version id, dataset version id, counts (by reason), MLflow run id
  _FAILED                       instead of _SUCCESS when more samples than max_error_share could not be
                                annotated: the same counts and why the job failed (removed on success)
```

Source shards are named by their curation partition (``curation.output``), so an annotation
shard and its source share a file stem.
"""

from __future__ import annotations

import json

from curation.output import SUCCESS_FILE
from infra import storage

ANNOTATIONS = "annotations"
ID_FILE, CONFIG_FILE, GALLERY_FILE, FAILED_FILE = "annotation_id", "config.yaml", "gallery.html", "_FAILED"
TAR, TABLE = ".tar", ".parquet"


def path(root: str, *parts: str) -> str:
    return storage.join(root, *parts)


def tar_path(root: str, shard: str) -> str:
    return storage.join(root, ANNOTATIONS, shard + TAR)


def table_path(root: str, shard: str) -> str:
    return storage.join(root, ANNOTATIONS, shard + TABLE)


def success_path(root: str) -> str:
    return storage.join(root, SUCCESS_FILE)


def failed_path(root: str) -> str:
    return storage.join(root, FAILED_FILE)


def shard_id(uri: str) -> str:
    """A source shard's id: its file stem (the curation partition)."""
    return uri.rstrip("/").rsplit("/", 1)[-1].removesuffix(TAR)


def is_committed(fs, root: str, shard: str) -> bool:
    return storage.exists(fs, table_path(root, shard))


def read_success(fs, root: str) -> dict | None:
    """The finished job's ``_SUCCESS`` record, or None while it is not finished."""
    p = success_path(root)
    return json.loads(storage.read_bytes(fs, p)) if storage.exists(fs, p) else None


def committed_tables(fs, root: str) -> list[str]:
    d = storage.join(root, ANNOTATIONS)
    return [f.path for f in storage.list_files(fs, d, (TABLE,))] if storage.exists(fs, d) else []
