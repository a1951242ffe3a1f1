"""Dataset versions with per-sample attributes for the sampling tests, in the attribute contract
curation writes (``curation.output``): each shard's sidecar carries the attributes, and
hierarchical clusters are ``cluster_l<level>`` sidecar columns plus the version's
``clusters.json``. Written here by hand; a real curated version's come from its ``clusters``
step (configs/curate_demo.yaml)."""

from __future__ import annotations

import collections
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from curation.output import CLUSTERS_FILE, SUCCESS_FILE, CuratedOutput, shard_path, sidecar_path, split_member
from tests.training.conftest import write_shards


def tar_keys(path: str) -> list[str]:
    """The sample keys of a tar, in its order."""
    with tarfile.open(path) as tar:
        return list(dict.fromkeys(split_member(n)[0] for n in tar.getnames()))


def stem(shard: str) -> str:
    return Path(shard).name.removesuffix(".tar")


def synthetic_version(
    root: Path, counts: list[int], attributes: Callable[[str], dict], *, size=(48, 36)
) -> tuple[str, list[str]]:
    """A finished version folder of ``write_shards`` tars (``counts`` samples each) whose sidecars
    hold ``key`` and ``attributes(key)`` per sample; returns (its URI, the shard paths)."""
    folder = Path(shard_path(str(root), "x")).parent
    shards = write_shards(folder, counts, size=size)
    for shard in shards:
        keys = tar_keys(shard)
        rows = [{"key": k, **attributes(k)} for k in keys]
        pq.write_table(pa.Table.from_pylist(rows), sidecar_path(str(root), stem(shard)))
    marker = {"dataset_id": f"synthetic-{'-'.join(map(str, counts))}", "dataset_name": root.name, "kept": sum(counts)}
    Path(root, SUCCESS_FILE).write_text(json.dumps(marker))
    return str(root), shards


def add_clusters(root: Path, ids: Callable[[dict], list[int]], ks: list[int], embedding: str = "test") -> dict:
    """Every sidecar of the version at ``root`` gets ``cluster_l0..`` (int32, ``ids(row)`` per
    sample: one id per level, coarsest first), and the version ``clusters.json`` (counts and
    parents derived from the rows). Returns clusters.json's content."""
    out = CuratedOutput.at(str(root))
    counts = [collections.Counter() for _ in ks]
    parents: list[dict] = [{} for _ in ks]
    for path in out.sidecar_files():
        table = pq.read_table(path)
        per_row = [ids(row) for row in table.to_pylist()]
        for level in range(len(ks)):
            column = pa.array([p[level] for p in per_row], pa.int32())
            table = table.append_column(f"cluster_l{level}", column)
        pq.write_table(table, path)
        for p in per_row:
            for level, cid in enumerate(p):
                counts[level][cid] += 1
                if level:
                    assert parents[level].setdefault(cid, p[level - 1]) == p[level - 1], "a cluster with two parents"
    clusters = {
        "format": 1,
        "levels": [{"k": k, "counts": {str(c): n for c, n in sorted(cs.items())}} for k, cs in zip(ks, counts)],
        "parents": [None, *({str(c): p for c, p in sorted(ps.items())} for ps in parents[1:])],
        "embedding": embedding,
    }
    Path(root, CLUSTERS_FILE).write_text(json.dumps(clusters))
    return clusters
