"""The curation job: plan -> score (streaming, Ray Data) -> global dedup -> write -> stats -> MLflow.

1. **Plan** the input into partitions with deterministic ids (``readers.plan_partitions``).
2. **Score** every partition not yet complete: read -> decode -> cheap filters -> models, as
   one streaming Ray Data pipeline (model stages on actor pools), into staging part files.
3. **Dedup** globally on metadata only (hashes), across every partition of the run.
4. **Write** each partition's shard, sidecar and manifest part (skipping committed ones).
5. **Stats** from the manifest, MLflow record, then the completion marker ``_SUCCESS``.

Resume is by files: a re-run of the same job into the same output redoes only the
partitions that were not complete, and produces byte-identical outputs. A re-run with a
different job configuration into the same output is refused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from curation import readers, schema, staging, writer
from curation.config import CurationConfig
from curation.content import build_content_stages, content_filter_report
from curation.decode import DecodeStage
from curation.dedup.run import NEAR_INDEX_DIR, global_decisions
from curation.detection import PersonDetectionStage, check_detector_config
from curation.filters import GeometryFilterStage
from curation.stages import Stage, apply_stage, check_fits
from curation.versions import code_version, dataset_version_id
from curation.stats import READ_REASONS, compute_stats, format_summary
from infra import storage
from infra.config import config_digest, config_to_dict, dump_config

log = logging.getLogger("curation")

CONFIG_FILE, PLAN_FILE, STATS_FILE, SUCCESS_FILE = "config.yaml", "partitions.jsonl", "stats.json", "_SUCCESS"
DEDUP_DIR = "_dedup"


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
        lines = [format_summary(self.stats),
                 f"shards:   {storage.join(self.output_dir, writer.SHARDS)} ({len(self.shards)} files)",
                 f"manifest: {self.manifest_uri}",
                 f"stats:    {storage.join(self.output_dir, STATS_FILE)}",
                 f"dataset version: {self.dataset_id}"]
        if self.mlflow_run_id:
            lines.append(f"mlflow run: {self.mlflow_run_id}")
        return "\n".join(lines)


_CONTENT_STAGE_NAMES_BY_KEY = {"embedding": "clip_embedding", "artistic": "artistic_filter",
                               "watermark": "watermark_filter", "text": "text_filter"}
_CONTENT_STAGE_NAMES = set(_CONTENT_STAGE_NAMES_BY_KEY.values())


def build_stages(cfg: CurationConfig) -> list[Stage]:
    """The recipe, in order. Each stage annotates; the writer's single decision drops and counts."""
    stages: list[Stage] = [DecodeStage(cfg.decode), GeometryFilterStage(cfg.filters)]
    if cfg.detector.backend != "none":
        stages.append(PersonDetectionStage(cfg.detector))
    stages += build_content_stages(cfg.content)  # after detection: models only see images with people
    return stages


def describe_stages(cfg: CurationConfig, stages: list[Stage]) -> list[dict]:
    described = [s.describe() for s in stages if s.name not in _CONTENT_STAGE_NAMES]
    if cfg.detector.backend == "none":
        described.append({"name": "person_detection", "applied": False, "why": "detector.backend=none"})
    for key, report in content_filter_report(cfg.content).items():
        described.append({"name": _CONTENT_STAGE_NAMES_BY_KEY[key], **{k: v for k, v in report.items() if k != "name"}})
    described.append({"name": "exact_dedup", "applied": cfg.dedup.exact, "against": cfg.dedup.against})
    described.append({"name": "near_dedup", "applied": cfg.dedup.near.enabled, "hash": cfg.dedup.near.hash,
                      "max_distance": cfg.dedup.near.max_distance, "match_mirrored": cfg.dedup.near.match_mirrored})
    described.append({"name": "semantic_dedup", "applied": cfg.dedup.semantic.enabled,
                      "threshold": cfg.dedup.semantic.threshold})
    return described


def funnel_of(stages: list[Stage]) -> list[tuple[str, tuple[str, ...]]]:
    funnel = [("read", READ_REASONS)]
    for s in stages:
        owned = tuple(r for r in s.reasons if r not in READ_REASONS)
        funnel.append((s.name, owned))
    funnel += [("exact_dedup", (schema.EXACT_DUPLICATE,)), ("near_dedup", (schema.NEAR_DUPLICATE,)),
               ("semantic_dedup", (schema.SEMANTIC_DUPLICATE,))]
    return funnel


# Where and how wide a stage runs, never what it decides: a job killed on one cluster shape can
# resume on another (more GPUs, fewer actors) into the same output.
RESOURCE_KEYS = frozenset({"num_cpus", "num_gpus", "num_actors"})


def _without_resources(value):
    if isinstance(value, dict):
        return {k: _without_resources(v) for k, v in value.items() if k not in RESOURCE_KEYS}
    return value


def job_digest(cfg: CurationConfig, *, with_resources: bool = False) -> str:
    """Digest of everything that decides the outputs (not where they are logged, how Ray runs,
    or the resources each stage gets). ``with_resources``: the digest as outputs written before
    2026-11-29 recorded it (resources included), so those outputs still resume."""
    d = config_to_dict(cfg)
    for k in ("tracking", "ray", "output_dir", "name"):
        d.pop(k, None)
    d = d if with_resources else _without_resources(d)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _prepare_output(fs, out: str, cfg: CurationConfig, digest: str) -> None:
    storage.makedirs(fs, out)
    marker = storage.join(out, "job_digest")
    if storage.exists(fs, marker):
        previous = storage.read_bytes(fs, marker).decode().strip()
        if previous not in (digest, job_digest(cfg, with_resources=True)):
            raise ValueError(f"output_dir {cfg.output_dir!r} holds a run of a different configuration "
                             f"(job digest {previous}, this one {digest}); use a new output_dir")
    else:
        storage.atomic_write_bytes(fs, marker, digest.encode())
    storage.atomic_write_bytes(fs, storage.join(out, CONFIG_FILE), dump_config(cfg).encode())


def _read_and_list(p: readers.Partition, cfg: CurationConfig, output: str):
    tables = list(readers.read_partition(p, cfg.input, cfg.decode.max_bytes))
    fs, root = storage.resolve(output)
    keys = [k for t in tables for k in t.column("key").to_pylist()]
    staging.write_listing(fs, root, p.id, keys)
    yield from tables


def score_partitions(partitions: list[readers.Partition], stages: list[Stage], cfg: CurationConfig, output: str) -> None:
    """Stream the partitions through the stages into staging (the expensive, parallel part)."""
    import ray.data

    source = readers.partition_datasource(partitions, lambda p: _read_and_list(p, cfg, output))
    ds = ray.data.read_datasource(source, override_num_blocks=len(partitions), num_cpus=cfg.input.num_cpus)
    for stage in stages:
        ds = apply_stage(ds, stage, autoscale=cfg.ray.actor_pools == "autoscaling")
    ds.write_datasink(staging.StagingSink(output))


def global_dedup(fs, out: str, pids: list[str], cfg: CurationConfig, stages: list[Stage]) -> pa.Table:
    """Dedup decisions over the whole run, from metadata only; saved with the output."""
    have_person = any(isinstance(s, PersonDetectionStage) for s in stages)
    columns = ["key", "sha256", "phash", "phash_mirror", "width", "height", "partition"]
    columns += ["person_score_max"] if have_person else []
    columns += [cfg.dedup.semantic.embedding_column] if cfg.dedup.semantic.enabled else []
    candidates = staging.read_candidates(fs, out, pids, columns)
    if not have_person:
        candidates = candidates.append_column("person_score_max", pa.nulls(candidates.num_rows, pa.float32()))
    against_kept = against_index = None
    if cfg.dedup.against:
        against_kept, against_index = _load_against(cfg)
    decisions, index = global_decisions(candidates, cfg.dedup, engine=cfg.dedup.engine,
                                        against_kept=against_kept, against_index=against_index)
    storage.write_parquet(fs, storage.join(out, DEDUP_DIR, "decisions.parquet"), decisions)
    if index is not None and storage.is_local(fs):
        index.save(storage.join(out, DEDUP_DIR, NEAR_INDEX_DIR))
    return decisions


def _load_against(cfg: CurationConfig):
    """The earlier version's kept images (key, sha256) and its saved near-dup index."""
    from curation.dedup.incremental import NearDupIndex

    afs, aroot = storage.resolve(cfg.dedup.against)
    if not storage.exists(afs, storage.join(aroot, SUCCESS_FILE)):
        raise ValueError(f"dedup.against={cfg.dedup.against!r} is not a finished curation output (no _SUCCESS)")
    manifest = read_manifest(afs, aroot)
    kept = manifest.filter(pa.compute.equal(manifest.column("status"), schema.KEPT)).select(["key", "sha256"])
    index_dir = storage.join(aroot, DEDUP_DIR, NEAR_INDEX_DIR)
    index = NearDupIndex.load(index_dir) if cfg.dedup.near.enabled else None
    return kept, index


def write_all(partitions: list[str], output: str, decisions: pa.Table) -> list[dict]:
    import ray
    import ray.data

    if not partitions:
        return []
    decisions_ref = ray.put(decisions)

    def _write(row: dict) -> dict:
        return writer.write_partition(output, row["pid"], ray.get(decisions_ref))

    ds = ray.data.from_items([{"pid": p} for p in partitions], override_num_blocks=len(partitions))
    return ds.map(_write, num_cpus=1).take_all()


def read_manifest(fs, out: str) -> pa.Table:
    files = [f.path for f in storage.list_files(fs, storage.join(out, writer.MANIFEST), (".parquet",))]
    return pads.dataset(files, format="parquet", filesystem=fs).to_table().sort_by("key")


def _shard_files(fs, out: str) -> list[str]:
    d = storage.join(out, writer.SHARDS)
    return [f.path for f in storage.list_files(fs, d, (".tar",))] if storage.exists(fs, d) else []


def _samples_in_shards(fs, out: str) -> int:
    d = storage.join(out, writer.SHARDS)
    if not storage.exists(fs, d):
        return 0
    total = 0
    for f in storage.list_files(fs, d, (".parquet",)):
        with fs.open_input_file(f.path) as fh:
            total += pq.ParquetFile(fh).metadata.num_rows
    return total


def absolutize(cfg: CurationConfig) -> CurationConfig:
    """Relative local paths are taken from the driver's working directory, before workers see them."""
    def local(path: str) -> str:
        return path if not path or "://" in path else str(Path(path).expanduser().resolve())
    return dataclasses.replace(cfg, output_dir=local(cfg.output_dir),
                               input=dataclasses.replace(cfg.input, uri=local(cfg.input.uri)),
                               detector=dataclasses.replace(cfg.detector, weights=local(cfg.detector.weights)))


def run_curation(cfg: CurationConfig, stages: list[Stage] | None = None) -> CurationResult:
    """Run (or resume, or recognise as done) one curation job."""
    from infra.ray_runtime import init_ray, joins_a_cluster

    cfg.validate()
    cfg = absolutize(cfg)
    check_detector_config(cfg.detector)
    stages = stages if stages is not None else build_stages(cfg)
    fs, out = storage.resolve(cfg.output_dir)
    out_uri = storage.to_uri(fs, out)
    digest = job_digest(cfg)
    _prepare_output(fs, out, cfg, digest)
    if storage.exists(fs, storage.join(out, SUCCESS_FILE)):
        done = json.loads(storage.read_bytes(fs, storage.join(out, SUCCESS_FILE)))
        _drop_staging(fs, out)
        stats = json.loads(storage.read_bytes(fs, storage.join(out, STATS_FILE)))
        return CurationResult(out_uri, stats, storage.join(out_uri, writer.MANIFEST),
                              [storage.to_uri(fs, p) for p in _shard_files(fs, out)], done["dataset_id"],
                              done.get("mlflow_run_id"), skipped=True)
    storage.remove_temp_files(fs, out)

    partitions = readers.plan_partitions(cfg.input)
    storage.atomic_write_bytes(fs, storage.join(out, PLAN_FILE),
                               "".join(readers.partition_to_json(p) + "\n" for p in partitions).encode())
    written = {p.id for p in partitions if writer.is_written(fs, out, p.id)}
    to_score = [p for p in partitions if p.id not in written and not staging.is_complete(fs, out, p.id)]
    resumed = len(partitions) - len(to_score)
    for p in to_score:
        staging.clear_partition(fs, out, p.id)
    log.info("%d partitions: %d to score, %d already done", len(partitions), len(to_score), resumed)

    local = not joins_a_cluster(cfg.ray.address)
    init_ray(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.progress_bars, cfg.ray.object_store_memory,
             cfg.ray.temp_dir)
    if local and to_score:  # a cluster's size is not known up front (it may autoscale)
        import ray

        check_fits(stages, cfg.input.num_cpus, ray.cluster_resources().get("CPU", 0.0),
                   autoscale=cfg.ray.actor_pools == "autoscaling")
    t0 = time.time()
    phases: dict[str, float] = {}
    if to_score:
        score_partitions(to_score, stages, cfg, out_uri)
    phases["score"] = time.time() - t0
    incomplete = [p.id for p in partitions if p.id not in written and not staging.is_complete(fs, out, p.id)]
    if incomplete:
        raise RuntimeError(f"{len(incomplete)} partitions did not complete scoring (e.g. {incomplete[:3]}); re-run to resume")

    t = time.time()
    decisions = global_dedup(fs, out, [p.id for p in partitions], cfg, stages)
    phases["dedup"], t = time.time() - t, time.time()
    write_all([p.id for p in partitions if p.id not in written], out_uri, decisions)
    phases["write"], t = time.time() - t, time.time()

    manifest = read_manifest(fs, out)
    stats = compute_stats(manifest, funnel_of(stages), samples_in_shards=_samples_in_shards(fs, out),
                          shards=len(_shard_files(fs, out)), stages=describe_stages(cfg, stages))
    stats["partitions"] = len(partitions)
    stats["job_digest"] = digest
    if not stats["reconciled"]:
        raise RuntimeError(f"accounting does not reconcile: {format_summary(stats)}")
    storage.atomic_write_bytes(fs, storage.join(out, STATS_FILE), json.dumps(stats, indent=2, sort_keys=True).encode())
    dataset_id = dataset_version_id(manifest, digest)
    dataset_name = cfg.tracking.dataset_name or cfg.name
    shards = [storage.to_uri(fs, p) for p in _shard_files(fs, out)]
    run_id = None
    if cfg.tracking.enabled:
        from curation.tracking import log_curation_run
        run_id = log_curation_run(cfg, out_uri, stats, manifest, dataset_id, dataset_name, shards, digest)
    phases["stats_and_tracking"] = time.time() - t
    phases = {k: round(v, 3) for k, v in phases.items()}
    log.info("seconds per phase (this session): %s", phases)
    storage.atomic_write_bytes(fs, storage.join(out, SUCCESS_FILE), json.dumps(
        {"dataset_id": dataset_id, "dataset_name": dataset_name, "job_digest": digest, "code_version": code_version(),
         "mlflow_run_id": run_id, "kept": stats["kept"], "seconds": round(time.time() - t0, 3),
         "phase_seconds": phases}, sort_keys=True).encode())
    _drop_staging(fs, out)
    return CurationResult(out_uri, stats, storage.join(out_uri, writer.MANIFEST), shards, dataset_id, run_id,
                          resumed_partitions=resumed)


def _drop_staging(fs, out: str) -> None:
    d = storage.join(out, staging.STAGING)
    if storage.exists(fs, d):
        fs.delete_dir(d)
