"""Finishing a curation job: its shards written, its stats and version id, MLflow, then ``_SUCCESS``.

``write_shards`` hands the decisions and the last pass's staging to the recipe's writer, which
alone knows the output's layout. ``finish`` summarises the manifest part by part (no process
reads the whole manifest), writes ``shardindex.json`` and ``stats.json``, derives the dataset
version id, records the MLflow run and writes ``_SUCCESS`` last: an output with that marker is
complete, and a re-run of the same job only reads it back (``finished_result``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections import Counter

from curation import output
from curation.job import CurationJob
from curation.passes import attributes_of, decisions_of
from curation.stats import (
    SUMMARY_COLUMNS,
    format_summary,
    manifest_counts,
    merge_counts,
    stats_from_counts,
    tracking_record,
)
from curation.steps import AttributeStep
from curation.versions import code_version, combine_digests, partition_digest
from infra import storage

log = logging.getLogger("curation")

# Manifest parts summarised per task: parts are small (summary columns only), tasks are not free.
SUMMARY_PARTS_PER_TASK = 16


@dataclasses.dataclass
class CurationResult:
    output_dir: str
    stats: dict
    manifest_uri: str
    shards: list[str]
    dataset_id: str
    mlflow_run_id: str | None
    resumed_partitions: int = 0
    skipped: bool = False

    def summary(self) -> str:
        lines = [
            format_summary(self.stats),
            f"shards:   {storage.join(self.output_dir, output.SHARDS)} ({len(self.shards)} files)",
            f"manifest: {self.manifest_uri}",
            f"stats:    {storage.join(self.output_dir, output.STATS_FILE)}",
            f"dataset version: {self.dataset_id}",
        ]
        if self.mlflow_run_id:
            lines.append(f"mlflow run: {self.mlflow_run_id}")
        return "\n".join(lines)


def write_shards(job: CurationJob, partitions: list[str], pending: list[str], staged_at: str | None = None) -> None:
    """The writer's output of the ``pending`` partitions (of all ``partitions``), from the rows
    staged at ``staged_at`` (default: the output folder, pass 1's staging)."""
    decisions = functools.partial(decisions_of, job.uri)
    annotators = tuple(s.name for s in job.steps.of_kind(AttributeStep))
    attributes = functools.partial(attributes_of, job.uri, annotators) if annotators else None
    job.steps.writer.write_all(job.uri, partitions, pending, decisions, staged_at, job.cfg.input.num_cpus, attributes)


def _summarise_parts(paths: list[str], uri: str) -> list[dict]:
    """Stats counts and version digest of each manifest part (read where it lies, summary columns only)."""
    out = output.CuratedOutput.at(uri)
    rows = []
    for path in paths:
        part = out.read_part(path, SUMMARY_COLUMNS)
        rows.append(
            {"pid": output.part_id(path), "counts": json.dumps(manifest_counts(part)), "digest": partition_digest(part)}
        )
    return rows


def summarise_manifest(job: CurationJob) -> tuple[dict, dict[str, str]]:
    """(summed stats counts, per-partition version digests): one Ray task per batch of parts."""
    from infra.ray_runtime import map_tasks

    files = output.CuratedOutput(job.fs, job.root).manifest_files()
    if not files:
        return merge_counts([]), {}
    batches = [files[i : i + SUMMARY_PARTS_PER_TASK] for i in range(0, len(files), SUMMARY_PARTS_PER_TASK)]
    rows = [
        r
        for rs in map_tasks(
            functools.partial(_summarise_parts, uri=job.uri), batches, num_cpus=1, name="curation.summaries"
        )
        for r in rs
    ]
    counts = merge_counts(
        {k: (Counter(v) if isinstance(v, dict) else v) for k, v in json.loads(r["counts"]).items()} for r in rows
    )
    return counts, {r["pid"]: r["digest"] for r in rows}


def finish(job: CurationJob, partitions: int, phases: dict[str, float], t0: float) -> dict:
    """stats.json, the dataset version id, the MLflow record, then ``_SUCCESS`` (last); returns the
    stats. Stats and the id come from per-part summaries (``summarise_manifest``): no process reads
    the whole manifest."""
    out = output.CuratedOutput(job.fs, job.root)
    counts, digests = summarise_manifest(job)
    name = job.cfg.dataset_name or job.cfg.name
    index = write_shard_index(job, out, name)
    stats = stats_from_counts(
        counts,
        job.steps.funnel(),
        samples_in_shards=sum(s["nsamples"] for s in index["shardlist"]),
        shards=len(index["shardlist"]),
        descriptions=job.steps.describe(),
    )
    stats.update(partitions=partitions, job_digest=job.digest, samples_per_shard=job.steps.writer.cfg.samples_per_shard)
    if not stats["reconciled"]:
        raise RuntimeError(f"accounting does not reconcile: {format_summary(stats)}")
    storage.atomic_write_bytes(
        job.fs, output.path(job.root, output.STATS_FILE), json.dumps(stats, indent=2, sort_keys=True).encode()
    )
    dataset_id = combine_digests(digests, job.digest)
    t = time.time()
    run_id = _record(job, stats, out.manifest_schema(), dataset_id, name, output.absolute_index(index, job.uri))
    phases["stats_and_tracking"] += time.time() - t
    phases = {k: round(v, 3) for k, v in phases.items()}
    log.info("seconds per phase (this session): %s", phases)
    done = {
        "dataset_id": dataset_id,
        "dataset_name": name,
        "job_digest": job.digest,
        "code_version": code_version(),
        "mlflow_run_id": run_id,
        "kept": stats["kept"],
        "seconds": round(time.time() - t0, 3),
        "phase_seconds": phases,
    }
    storage.atomic_write_bytes(
        job.fs, output.path(job.root, output.SUCCESS_FILE), json.dumps(done, sort_keys=True).encode()
    )
    return stats


def write_shard_index(job: CurationJob, out: output.CuratedOutput, name: str) -> dict:
    """``shardindex.json`` (``CuratedOutput.shard_index``: URLs relative to the output folder), once
    the writer has checked the shards' sizes against its layout."""
    index = out.shard_index(name)
    job.steps.writer.check_shard_sizes([s["nsamples"] for s in index["shardlist"]])
    storage.atomic_write_bytes(
        job.fs, output.path(job.root, output.SHARD_INDEX_FILE), json.dumps(index, indent=2, sort_keys=True).encode()
    )
    return index


def _record(job: CurationJob, stats: dict, schema, dataset_id: str, name: str, index: dict) -> str | None:
    """The MLflow run of the dataset version: stats, ``shards.txt`` and the shard index with absolute URIs."""
    if not job.cfg.tracking.enabled:
        return None
    shards = [s["url"] for s in index["shardlist"]]
    from infra.tracking import arrow_to_mlflow_schema, log_dataset_run, resolve_tracking_uri

    metrics, run_tags, profile = tracking_record(stats)
    documents = {output.STATS_FILE: stats, "shards.txt": "\n".join(shards) + "\n", output.SHARD_INDEX_FILE: index}
    version = output.CuratedOutput(job.fs, job.root)
    if version.has(output.CLUSTERS_FILE):  # O(clusters): small beside the shards it describes
        documents[output.CLUSTERS_FILE] = version.clusters()
    tags = {"humanvision.stage": "curate", "curation.output": job.uri, "curation.job_digest": job.digest}
    run_tags.update(
        {
            "dataset.id": dataset_id,
            "dataset.name": name,
            "dataset.uri": job.uri,
            "dataset.shards": json.dumps(len(shards)),
            "curation.code_version": code_version(),
        }
    )
    return log_dataset_run(
        job.cfg.tracking,
        resolve_tracking_uri(job.cfg.tracking.uri, job.cfg.output_dir),
        job.cfg,
        output_uri=job.uri,
        tags=tags,
        metrics=metrics,
        run_tags=run_tags,
        documents=documents,
        dataset_name=name,
        dataset_id=dataset_id,
        dataset_schema=arrow_to_mlflow_schema(schema),
        profile=profile,
    )


def finished_result(job: CurationJob, stats: dict | None = None, resumed: int = 0) -> CurationResult:
    """The result of a complete output: ``stats`` of the session that finished it, or (None) read
    back from the output when it was complete before this session (nothing is recomputed)."""
    out = output.CuratedOutput(job.fs, job.root)
    done = out.success()
    drop_staging(job)
    return CurationResult(
        job.uri,
        out.stats() if stats is None else stats,
        storage.join(job.uri, output.MANIFEST),
        out.shard_uris(),
        done["dataset_id"],
        done.get("mlflow_run_id"),
        resumed_partitions=resumed,
        skipped=stats is None,
    )


def drop_staging(job: CurationJob) -> None:
    d = output.path(job.root, output.STAGING_DIR)
    if storage.exists(job.fs, d):
        job.fs.delete_dir(d)
