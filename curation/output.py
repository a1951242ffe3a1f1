"""A curated output: the one place that knows its folder layout and how to read it back.

```
<output>/
  shards/<partition>.tar        WebDataset shard: <key>.jpg + <key>.json per kept sample (shards.samples_per_shard=0)
  shards/<index>.tar            ... or a shard of exactly samples_per_shard samples, sources mixed (> 0)
  shards/<stem>.parquet         the shard's samples as a table (no pixels), in the tar's order
  shardindex.json               the shards with their sample counts, as WebDataset's ``wids`` reads them
  manifest/<partition>.parquet  one row per input image (kept, dropped or error)
  manifest/_empty-<partition>   commit marker of a partition that wrote no manifest rows
  stats.json  config.yaml  partitions.jsonl  job_digest
  _dedup/decisions/<step>/<partition>.parquet   global dedup decisions, by step and partition
  _dedup/near_index/index.json, parts/<id>/...   the near-dup index, bucketed by band key (index_store)
  clusters.json                 with clusters on: k and kept samples per cluster of each level, parents, embedding
  _staging/                     scored rows waiting for the global steps (removed at the end)
  _staging/attributes/<step>/<partition>.parquet  an annotating global step's columns (key + cluster ids), by partition
  _SUCCESS                      written last: dataset version id, MLflow run id
```

Writers (the pipeline, the shard writer, staging) build paths with the functions here;
readers (training, audits, the DAG, dataset versions) read through ``CuratedOutput`` and
``resolve_dataset``. The WebDataset member-name rule (``split_member``) is here too, for the
readers of tar inputs and the training loader alike.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pyarrow as pa

from curation.stats import upgrade
from infra import storage

SHARDS, MANIFEST = "shards", "manifest"
STATS_FILE, SUCCESS_FILE, CONFIG_FILE, PLAN_FILE = "stats.json", "_SUCCESS", "config.yaml", "partitions.jsonl"
JOB_DIGEST_FILE = "job_digest"
SHARD_INDEX_FILE = "shardindex.json"  # wids' own default name (``widsindex create``)
SHARD_INDEX_KIND = "wids-shard-index-v1"
DEDUP_DIR, STAGING_DIR, LISTING_FILE = "_dedup", "_staging", "_listing.json"
NEAR_INDEX_DIR = "near_index"  # _dedup/near_index/: the partitioned near-dup index (curation.dedup.index_store)
NEAR_INDEX_HEADER = "index.json"
DECISIONS_DIR = "decisions"  # _dedup/decisions/<step>/<partition>.parquet: one step's drops in one partition
CLUSTERS_FILE = "clusters.json"  # the cluster hierarchy of the kept samples (curation.clusters)
ATTRIBUTES_DIR = "attributes"  # _staging/attributes/<step>/<partition>.parquet: columns the writer joins by key

_MEMBER = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext, exactly


def split_member(name: str) -> tuple[str, str] | None:
    """WebDataset's rule for a tar member: (key, extension), the key being the path up to the
    first dot of the base name; None for a name with no extension."""
    match = _MEMBER.match(name)
    return (match.group(1), match.group(2).lower()) if match else None


# ---- paths, for the code that writes an output ------------------------------------------------


def path(output: str, *parts: str) -> str:
    return storage.join(output, *parts)


def shard_file_name(stem: str) -> str:
    """A shard's file name (the manifest's ``shard`` column): an input partition's id, or a mixed shard's index."""
    return f"{stem}.tar"


def shard_path(output: str, stem: str) -> str:
    return storage.join(output, SHARDS, shard_file_name(stem))


def sidecar_path(output: str, stem: str) -> str:
    return storage.join(output, SHARDS, f"{stem}.parquet")


def sidecar_stem(path: str) -> str:
    """The shard stem of a sidecar's path."""
    return path.rsplit("/", 1)[-1].removesuffix(".parquet")


def manifest_part_path(output: str, pid: str) -> str:
    return storage.join(output, MANIFEST, f"{pid}.parquet")


def empty_marker_path(output: str, pid: str) -> str:
    return storage.join(output, MANIFEST, f"_empty-{pid}")


def decisions_path(output: str, step: str, pid: str) -> str:
    return storage.join(output, DEDUP_DIR, DECISIONS_DIR, step, f"{pid}.parquet")


def attributes_path(output: str, step: str, pid: str) -> str:
    """An annotating global step's columns for partition ``pid`` (key + its columns), until the writer joins them."""
    return storage.join(output, STAGING_DIR, ATTRIBUTES_DIR, step, f"{pid}.parquet")


def part_id(path: str) -> str:
    """The partition id of a manifest part's path."""
    return path.rsplit("/", 1)[-1].removesuffix(".parquet")


def is_written(fs, output: str, pid: str) -> bool:
    """Whether partition ``pid`` is committed (its manifest part or empty marker exists)."""
    return storage.exists(fs, manifest_part_path(output, pid)) or storage.exists(fs, empty_marker_path(output, pid))


# ---- reading an output back ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CuratedOutput:
    """A curation output folder (local or an object-store URI), read lazily."""

    fs: object
    root: str

    @classmethod
    def at(cls, uri: str) -> CuratedOutput:
        fs, root = storage.resolve(uri)
        return cls(fs, root)

    @property
    def uri(self) -> str:
        return storage.to_uri(self.fs, self.root)

    def has(self, *parts: str) -> bool:
        return storage.exists(self.fs, storage.join(self.root, *parts))

    def read_json(self, name: str) -> dict:
        return json.loads(storage.read_bytes(self.fs, storage.join(self.root, name)))

    @property
    def finished(self) -> bool:
        return self.has(SUCCESS_FILE)

    def success(self) -> dict:
        if not self.finished:
            raise ValueError(f"{self.uri!r} is not a finished curation output (no {SUCCESS_FILE} marker)")
        return self.read_json(SUCCESS_FILE)

    def stats(self) -> dict:
        """stats.json in the current format, whichever format the output was written in."""
        return upgrade(self.read_json(STATS_FILE))

    def _files(self, folder: str, suffix: str) -> list[str]:
        d = storage.join(self.root, folder)
        return [f.path for f in storage.list_files(self.fs, d, (suffix,))] if storage.exists(self.fs, d) else []

    def shard_files(self) -> list[str]:
        """Paths (in this output's filesystem) of the WebDataset shards, sorted."""
        return self._files(SHARDS, ".tar")

    def shard_uris(self) -> list[str]:
        return [storage.to_uri(self.fs, p) for p in self.shard_files()]

    def sidecar_files(self) -> list[str]:
        """Paths of the shards' Parquet sidecars, sorted (a sidecar is written after its tar)."""
        return self._files(SHARDS, ".parquet")

    def read_sidecar(self, shard: str, columns: list[str]) -> pa.Table:
        """``columns`` of one shard's sidecar, in the tar's order, read by projection (nothing else
        of the file is decoded). ``shard``: the tar's path or URI, or its stem. A column the sidecar
        lacks is a ``ValueError`` naming it and the columns it has."""
        import pyarrow.parquet as pq

        stem = shard.rsplit("/", 1)[-1].removesuffix(".tar")
        with self.fs.open_input_file(sidecar_path(self.root, stem)) as fh:
            parquet = pq.ParquetFile(fh)
            missing = [c for c in columns if c not in parquet.schema_arrow.names]
            if missing:
                raise ValueError(
                    f"the sidecar of shard {stem!r} has no column {', '.join(map(repr, missing))} "
                    f"(it has {', '.join(parquet.schema_arrow.names)})"
                )
            return parquet.read(columns=columns)

    def clusters(self) -> dict:
        """The kept samples' hierarchical clusters (``CLUSTERS_FILE``): ``{"format": 1, "levels":
        [{"k": clusters, "counts": {"<id>": kept samples}}, ...] (level 0 the coarsest), "parents":
        [None, {"<level-1 id>": <level-0 id>}, ...], "embedding": what embedded the images}``; each
        sidecar row carries its ids in ``cluster_l0``, ``cluster_l1``, .... A ``ValueError`` when the
        version has none."""
        if not self.has(CLUSTERS_FILE):
            raise ValueError(f"{self.uri!r} has no {CLUSTERS_FILE}: it was curated without hierarchical clusters")
        return self.read_json(CLUSTERS_FILE)

    def samples_in_shards(self) -> int:
        """Samples written to shards, counted from the sidecars' Parquet footers."""
        import pyarrow.parquet as pq

        total = 0
        for f in self.sidecar_files():
            with self.fs.open_input_file(f) as fh:
                total += pq.ParquetFile(fh).metadata.num_rows
        return total

    def shard_index(self, name: str | None = None) -> dict:
        """The shards as a ``wids`` shard index (``SHARD_INDEX_KIND``, ``wids_version`` 1): per tar
        its URL relative to the output folder (wids resolves it against the index file's folder,
        so a moved output still opens), its sample count (its sidecar's Parquet footer) and size."""
        import pyarrow.parquet as pq

        d = storage.join(self.root, SHARDS)
        tars = [f for f in storage.list_files(self.fs, d, (".tar",))] if storage.exists(self.fs, d) else []
        shardlist = []
        for tar in tars:
            with self.fs.open_input_file(sidecar_path(self.root, tar.base_name.removesuffix(".tar"))) as fh:
                nsamples = pq.ParquetFile(fh).metadata.num_rows
            shardlist.append({"url": f"{SHARDS}/{tar.base_name}", "nsamples": nsamples, "filesize": tar.size})
        index = {"__kind__": SHARD_INDEX_KIND, "wids_version": 1, "shardlist": shardlist}
        return {**index, "name": name} if name else index

    def manifest_files(self) -> list[str]:
        return self._files(MANIFEST, ".parquet")

    def read_part(self, path: str, columns: list[str] | None = None) -> pa.Table:
        """One manifest part (a path from ``manifest_files``), ``columns`` only."""
        import pyarrow.parquet as pq

        with self.fs.open_input_file(path) as fh:
            return pq.read_table(fh, columns=columns)

    def manifest_schema(self) -> pa.Schema:
        import pyarrow.dataset as pads

        return pads.dataset(self.manifest_files(), format="parquet", filesystem=self.fs).schema

    def read_manifest(self, columns: list[str] | None = None, skip: frozenset[str] = frozenset()) -> pa.Table:
        """The manifest sorted by key: ``columns`` only (all when None), less ``skip``."""
        import pyarrow.dataset as pads

        dataset = pads.dataset(self.manifest_files(), format="parquet", filesystem=self.fs)
        names = [n for n in (columns or dataset.schema.names) if n not in skip]
        return dataset.to_table(columns=names).sort_by("key")

    def version(self) -> DatasetVersion:
        """The dataset version this finished output holds (from its ``_SUCCESS`` marker)."""
        done = self.success()
        try:
            return DatasetVersion(
                id=done["dataset_id"],
                name=done.get("dataset_name", Path(self.root).name),
                uri=self.uri,
                shards=tuple(self.shard_uris()),
                run_id=done.get("mlflow_run_id"),
                num_samples=done.get("kept"),
            )
        except KeyError as err:
            raise ValueError(
                f"{self.uri!r} was written by an older curation version (its {SUCCESS_FILE} marker "
                f"has no {err}); re-run the curation"
            ) from None


def absolute_index(index: dict, uri: str) -> dict:
    """A shard index (``CuratedOutput.shard_index``) with its URLs made absolute against the output ``uri``."""
    return {**index, "shardlist": [{**s, "url": storage.join(uri, s["url"])} for s in index["shardlist"]]}


@dataclasses.dataclass(frozen=True)
class DatasetVersion:
    id: str
    name: str
    uri: str  # the curation output folder
    shards: tuple[str, ...]  # WebDataset tar URIs, sorted
    run_id: str | None = None
    num_samples: int | None = None


def from_output(output: str) -> DatasetVersion:
    """The version a finished curation output holds."""
    return CuratedOutput.at(output).version()


def _looks_like_path(ref: str) -> bool:
    return "/" in ref or "://" in ref or Path(ref).exists()


def resolve_dataset(ref: str, tracking_uri: str | None = None) -> DatasetVersion:
    """A version by output folder, by id, or by name (the latest version of that name).

    An id or name matches only runs of the curation stage: training runs carry ``dataset.id``
    tags too (they name what they trained on) and must not be taken for the version itself.
    """
    if _looks_like_path(ref):
        out = CuratedOutput.at(ref)
        if not storage.exists(out.fs, out.root):
            raise ValueError(f"dataset folder {ref!r} does not exist")
        return out.version()
    if tracking_uri is None:
        raise ValueError(f"dataset {ref!r} is not a curation output folder; give tracking_uri to look it up in MLflow")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    for query in (f"tags.`dataset.id` = '{ref}'", f"tags.`dataset.name` = '{ref}'"):
        runs = client.search_runs(
            experiments,
            filter_string=f"{query} and tags.`humanvision.stage` = 'curate' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if runs:
            run = runs[0]
            listing = Path(client.download_artifacts(run.info.run_id, "shards.txt")).read_text()
            return DatasetVersion(
                id=run.data.tags["dataset.id"],
                name=run.data.tags["dataset.name"],
                uri=run.data.tags["dataset.uri"],
                shards=tuple(x for x in listing.splitlines() if x),
                run_id=run.info.run_id,
                num_samples=int(run.data.metrics.get("kept", 0)) or None,
            )
    raise ValueError(
        f"no curated dataset version with id or name {ref!r} in {tracking_uri}; "
        "give the curation's MLflow store or the curation output folder"
    )
