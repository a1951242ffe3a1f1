"""The annotation job: a dataset version's shards through the task models, one annotation shard per
source shard, on a Ray Data actor pool.

``run_annotation(cfg)`` in steps, one function each:

1. **Prepare** (``prepare``): resolve the dataset version (``curation.output.resolve_dataset``),
   describe every enabled task's model from its files (``models.describe``: a bad setting or
   file is a ``ValueError`` before any Ray work), compute the annotation version id (a
   ``stage_digest`` of the dataset version id, the models' sha256, the settings that decide
   the outputs and this package's code) and claim the output folder with it: a folder holding
   another version's annotations is refused.
2. **Plan**: the source shards whose annotation table (the shard's commit marker) is not there
   yet; what a killed run left half-written is removed.
3. **Annotate**: the shards to do through ``ShardWorker`` actors (``ray.data.ActorPoolStrategy``,
   ``actors.num_actors`` x ``actors.num_cpus`` CPUs and ``actors.num_gpus`` GPUs each, a shard
   per call): each actor loads the models once and writes each shard's tar and table itself
   (``annotator.annotate_shard``), so a shard is annotated by exactly one actor and committed
   whole; a re-run redoes only the shards that were not committed, giving the same bytes.
   A failure that is not a sample's (``annotator.AnnotationFailed``: a bug, a model whose
   outputs post-processing cannot take, an I/O error) fails the job with its message; the
   shards committed before it stay, and a re-run resumes from them.
4. **Finish**: every sample of the version accounted for once (counted from the tables, with
   the samples not annotated by reason); when their share is over ``max_error_share`` the
   counts go to ``_FAILED`` and the job raises ``TooManyErrors`` naming the top reasons (a
   re-run with a higher ``max_error_share`` finishes from the same shards: the setting is not
   part of the version); else the gallery page, the MLflow run (params, lineage tags, the
   dataset version as input, small artifacts), then ``_SUCCESS`` (last).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

import evaluation.annotate.layout as layout
from curation.output import DatasetVersion, resolve_dataset
from evaluation.annotate.config import TASKS, AnnotateConfig
from evaluation.annotate.models import ModelInfo, describe
from evaluation.annotate.shards import SourceShard, source_shards
from infra import storage
from infra.config import config_to_dict, dump_config
from infra.stage import stage_digest

log = logging.getLogger("annotate")

# Where and how wide the models run, never what they output: a killed job resumes on another shape.
RESOURCE_KEYS = ("num_cpus", "num_gpus", "num_actors")
CODE_ROOT = Path(__file__).resolve().parent
READ_ONLY = ("gallery.py", "stage.py", "record.py")  # read finished outputs: cannot change what is written


@dataclasses.dataclass
class Job:
    """One annotation job, prepared: its config, dataset version, models and version id."""

    cfg: AnnotateConfig
    version: DatasetVersion
    infos: dict[str, ModelInfo]
    version_id: str
    fs: Any
    root: str
    tracking_uri: str | None

    @property
    def uri(self) -> str:
        return storage.to_uri(self.fs, self.root)


class TooManyErrors(RuntimeError):
    """More samples than ``max_error_share`` could not be annotated (the job wrote what it could)."""


@dataclasses.dataclass
class AnnotationResult:
    output_dir: str
    version_id: str
    dataset_id: str
    stats: dict
    mlflow_run_id: str | None
    gallery: str | None
    skipped: bool = False

    def summary(self) -> str:
        s = self.stats
        lines = [
            f"annotated {s['samples']} samples of dataset version {self.dataset_id} in {s['shards']} shards: "
            f"{s['ok']} ok, {s['errors']} error, {s['missing']} missing ({', '.join(s['tasks'])})",
            *([f"not annotated, by reason: {by_reason(s['reasons'])}"] if s["reasons"] else []),
            f"annotations: {storage.join(self.output_dir, layout.ANNOTATIONS)}",
            f"annotation version: {self.version_id}",
        ]
        if self.gallery:
            lines.append(f"gallery: {self.gallery}")
        if self.mlflow_run_id:
            lines.append(f"mlflow run: {self.mlflow_run_id}")
        return "\n".join(lines)


# ---- identity -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Digest of the modules that decide what an annotation shard holds (this package's and the
    released processing's source)."""
    from models import sapiens_processing

    h = hashlib.sha256()
    files = [p for p in sorted(CODE_ROOT.glob("*.py")) if p.name not in READ_ONLY]
    for p in [*files, Path(sapiens_processing.__file__)]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def identity_settings(cfg: AnnotateConfig, infos: dict[str, ModelInfo]) -> dict:
    """The settings that decide the annotations: each enabled task's (files by digest, the model
    and input size as resolved) and the actors' precision, device and batch size."""
    tasks = {}
    for task, info in infos.items():
        s = config_to_dict(cfg.tasks.of(task))
        for key in ("checkpoint", "onnx", "model", "input_hw"):
            s.pop(key)
        tasks[task] = {**s, **info.digests(), "model": info.name, "input_hw": list(info.input_hw)}
    actors = {k: v for k, v in config_to_dict(cfg.actors).items() if k not in RESOURCE_KEYS}
    return {"tasks": tasks, "actors": actors}


def annotation_version_id(dataset_id: str, cfg: AnnotateConfig, infos: dict[str, ModelInfo]) -> str:
    return stage_digest("annotate", dataset_id, identity_settings(cfg, infos), code_version())


# ---- 1. prepare ------------------------------------------------------------------------------------


def absolutize(cfg: AnnotateConfig) -> AnnotateConfig:
    """Local paths (output, dataset folder, checkpoints, graphs) taken from the driver's working directory."""
    tasks = {
        t: dataclasses.replace(
            cfg.tasks.of(t),
            checkpoint=storage.local_path(cfg.tasks.of(t).checkpoint),
            onnx=storage.local_path(cfg.tasks.of(t).onnx),
        )
        for t in TASKS
    }
    dataset = cfg.data.dataset
    if "/" in dataset and "://" not in dataset:
        dataset = storage.local_path(dataset)
    return dataclasses.replace(
        cfg,
        output_dir=storage.local_path(cfg.output_dir),
        data=dataclasses.replace(cfg.data, dataset=dataset),
        tasks=dataclasses.replace(cfg.tasks, **tasks),
    )


def resolve_version(cfg: AnnotateConfig, tracking_uri: str | None) -> DatasetVersion:
    try:
        return resolve_dataset(cfg.data.dataset, cfg.data.tracking_uri or tracking_uri)
    except ValueError as err:
        raise ValueError(f"data.dataset={cfg.data.dataset!r}: {err}") from None


def _tracking_uri(cfg: AnnotateConfig) -> str | None:
    from infra.tracking import resolve_tracking_uri

    if not cfg.tracking.enabled and not cfg.data.tracking_uri:
        return None
    return resolve_tracking_uri(cfg.tracking.uri, cfg.output_dir)


def _claim(fs, root: str, version_id: str, output_dir: str) -> None:
    marker = layout.path(root, layout.ID_FILE)
    if storage.exists(fs, marker):
        previous = storage.read_bytes(fs, marker).decode().strip()
        if previous != version_id:
            raise ValueError(
                f"output_dir {output_dir!r} holds annotations of another job (annotation version {previous}, "
                f"this one {version_id}); use a new output_dir"
            )
    else:
        storage.atomic_write_bytes(fs, marker, version_id.encode())


def prepare(cfg: AnnotateConfig) -> Job:
    """Checks, the version id and the output folder; raises ``ValueError`` before any Ray work."""
    cfg.validate()
    cfg = absolutize(cfg)
    uri = _tracking_uri(cfg)
    version = resolve_version(cfg, uri)
    infos = {t: describe(t, cfg.tasks.of(t)) for t in cfg.tasks.enabled()}
    version_id = annotation_version_id(version.id, cfg, infos)
    fs, root = storage.resolve(cfg.output_dir)
    storage.makedirs(fs, root)
    _claim(fs, root, version_id, cfg.output_dir)
    storage.atomic_write_bytes(fs, layout.path(root, layout.CONFIG_FILE), dump_config(cfg).encode())
    return Job(cfg, version, infos, version_id, fs, root, uri if cfg.tracking.enabled else None)


# ---- 2. plan ---------------------------------------------------------------------------------------


def plan(job: Job) -> list[SourceShard]:
    """The shards not committed yet (half-written files of a killed run removed first)."""
    storage.remove_temp_files(job.fs, job.root)
    shards = source_shards(job.version)
    todo = [s for s in shards if not layout.is_committed(job.fs, job.root, s.id)]
    log.info("%d shards: %d to annotate, %d already done", len(shards), len(todo), len(shards) - len(todo))
    return todo


# ---- 3. annotate -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What every actor is built from (pickled once per actor)."""

    infos: dict[str, ModelInfo]
    cfg: AnnotateConfig
    output: str


class ShardWorker:
    """Ray Data callable class: loads the models once, then annotates and writes one shard per row."""

    def __init__(self, spec: WorkerSpec) -> None:
        from curation.filters.model import resolve_device
        from evaluation.annotate.annotator import Annotator

        device = resolve_device(spec.cfg.actors.device, "actors")
        self.annotator = Annotator(spec.infos, spec.cfg.tasks, spec.cfg.actors, device)
        self.output = spec.output

    def __call__(self, batch: pa.Table) -> pa.Table:
        from evaluation.annotate.annotator import annotate_shard

        done = [annotate_shard(self.annotator, SourceShard(**row), self.output) for row in batch.to_pylist()]
        return pa.Table.from_pylist(done)


def check_fits(cfg: AnnotateConfig, actors: int) -> None:
    """On a local cluster (size known): the pool's actors must fit, or the job would wait forever."""
    import ray

    from infra.ray_runtime import joins_a_cluster

    if joins_a_cluster(cfg.ray.address):
        return
    cpus = ray.cluster_resources().get("CPU", 0.0)
    if actors * cfg.actors.num_cpus > cpus + 1e-9:
        raise ValueError(
            f"actors.num_actors={actors} x actors.num_cpus={cfg.actors.num_cpus:g} do not fit the local "
            f"cluster's {cpus:g} CPUs: lower either, or raise ray.num_cpus"
        )


def largest_first(shards: list[SourceShard]) -> list[SourceShard]:
    """The shards by tar size, largest first (ties by id): the pool's last shards are its smallest."""

    def size(s: SourceShard) -> int:
        fs, p = storage.resolve(s.tar)
        return fs.get_file_info(p).size or 0

    return sorted(shards, key=lambda s: (-size(s), s.id))


def annotate_shards(job: Job, todo: list[SourceShard]) -> list[dict]:
    """Every shard of ``todo`` through the actor pool, largest first; their counts and timings."""
    import ray.data

    from evaluation.annotate.annotator import AnnotationFailed

    actors = min(job.cfg.actors.num_actors, len(todo))
    check_fits(job.cfg, actors)
    a = job.cfg.actors
    items = [dataclasses.asdict(s) for s in largest_first(todo)]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(
        ShardWorker,
        fn_constructor_args=(WorkerSpec(job.infos, job.cfg, job.uri),),
        batch_size=1,
        batch_format="pyarrow",
        zero_copy_batch=True,
        # Two shards in flight per actor: the next one is there when a shard ends (one in flight left
        # each actor waiting ~0.2 s for work after every shard); largest first, so the queue at the
        # end holds the smallest shards.
        compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=2),
        num_cpus=a.num_cpus,
        **({"num_gpus": a.num_gpus} if a.num_gpus else {}),
    )
    ds.context.raise_original_map_exception = True  # this dataset's own context: an actor's AnnotationFailed
    try:
        return ds.take_all()
    except AnnotationFailed as err:  # Ray's RayTaskError(AnnotationFailed): the traceback, then the message
        raise AnnotationFailed(str(getattr(err, "cause", err)).split("\n", 1)[0]) from err


# ---- 4. finish ---------------------------------------------------------------------------------------


def count_annotations(job: Job) -> dict:
    """Samples per status, and those not annotated by reason (most first) and their share, over
    every committed table; refuses a version not annotated exactly once."""
    import pyarrow.parquet as pq

    keys, statuses, reasons = [], [], []
    tables = layout.committed_tables(job.fs, job.root)
    for p in tables:
        with job.fs.open_input_file(p) as fh:
            t = pq.read_table(fh, columns=["key", "status", "reason"])
        keys += t.column("key").to_pylist()
        statuses += t.column("status").to_pylist()
        reasons += t.column("reason").to_pylist()
    expected = job.version.num_samples
    if len(set(keys)) != len(keys) or (expected is not None and len(keys) != expected):
        raise RuntimeError(
            f"{len(keys)} annotation rows ({len(set(keys))} keys) for {expected} samples of dataset version "
            f"{job.version.id}: not every sample was annotated exactly once"
        )
    failed = Counter(r for r, s in zip(reasons, statuses) if s != "ok")
    return {
        "shards": len(tables),
        "samples": len(keys),
        **{s: statuses.count(s) for s in ("ok", "missing")},
        "errors": statuses.count("error"),
        "reasons": dict(sorted(failed.items(), key=lambda kv: (-kv[1], kv[0]))),
        "error_share": sum(failed.values()) / len(keys) if keys else 0.0,
        "tasks": list(job.infos),
    }


def by_reason(reasons: dict[str, int]) -> str:
    return ", ".join(f"{r} {n}" for r, n in reasons.items())


def check_error_share(stats: dict, cfg: AnnotateConfig, where: str) -> None:
    """``TooManyErrors`` when more of the samples than ``max_error_share`` were not annotated."""
    failed = stats["samples"] - stats["ok"]
    if stats["error_share"] > cfg.max_error_share:
        top = by_reason(dict(list(stats["reasons"].items())[:3]))
        raise TooManyErrors(
            f"{failed} of {stats['samples']} samples ({stats['error_share']:.1%}) were not annotated, over "
            f"max_error_share={cfg.max_error_share:g}: {top}; the rows with their errors and the counts are in {where}"
        )


def session_stats(done: list[dict], wall: float, actors: int) -> dict:
    """This session's throughput and the shares of the actors' time (wall x actors) spent in model
    forwards and in shards at all (the rest: start-up, model loads, waits for work)."""
    samples = sum(d["samples"] for d in done)
    forward = sum(d["forward_seconds"] for d in done)
    busy = sum(d["seconds"] for d in done)
    share = lambda seconds: round(seconds / (wall * actors), 4) if wall > 0 and actors else 0.0  # noqa: E731
    return {
        "session_shards": len(done),
        "session_seconds": round(wall, 3),
        "session_images_per_s": round(samples / wall, 3) if wall > 0 and samples else 0.0,
        "session_forward_share": share(forward),
        "session_busy_share": share(busy),
    }


def accounting(job: Job, stats: dict, **more: Any) -> bytes:
    """The JSON of ``_SUCCESS`` and ``_FAILED``: the version, its models and the counts."""
    record = {
        "annotation_version_id": job.version_id,
        "dataset_id": job.version.id,
        "dataset_uri": job.version.uri,
        "models": {t: {"name": i.name, **i.digests()} for t, i in job.infos.items()},
        "max_error_share": job.cfg.max_error_share,
        **more,
        **stats,
    }
    return json.dumps(record, sort_keys=True).encode()


def finish(job: Job, done: list[dict], wall: float) -> AnnotationResult:
    """Counts; over ``max_error_share``, ``_FAILED`` and ``TooManyErrors``; else the gallery, the
    MLflow record, then ``_SUCCESS`` (last)."""
    from evaluation.annotate.gallery import write_gallery
    from evaluation.annotate.record import record_run

    stats = {**count_annotations(job), **session_stats(done, wall, min(job.cfg.actors.num_actors, len(done)))}
    failed = layout.failed_path(job.root)
    try:
        check_error_share(stats, job.cfg, storage.to_uri(job.fs, failed))
    except TooManyErrors as err:
        storage.atomic_write_bytes(job.fs, failed, accounting(job, stats, failure=str(err)))
        raise
    gallery = write_gallery(job) if job.cfg.gallery.samples else None
    run_id = record_run(job, stats, gallery)
    success = accounting(job, stats, mlflow_run_id=run_id, gallery=gallery)
    storage.atomic_write_bytes(job.fs, layout.success_path(job.root), success)
    if storage.exists(job.fs, failed):  # an earlier attempt's, under a lower max_error_share
        job.fs.delete_file(failed)
    return AnnotationResult(job.uri, job.version_id, job.version.id, stats, run_id, gallery)


def finished_result(job: Job, done: dict) -> AnnotationResult:
    """A finished version's result, checked against this job's ``max_error_share``."""
    stats = {k: done[k] for k in ("shards", "samples", "ok", "errors", "missing", "reasons", "error_share", "tasks")}
    check_error_share(stats, job.cfg, storage.to_uri(job.fs, layout.success_path(job.root)))
    return AnnotationResult(
        job.uri, job.version_id, job.version.id, stats, done.get("mlflow_run_id"), done.get("gallery"), skipped=True
    )


def run_annotation(cfg: AnnotateConfig) -> AnnotationResult:
    """Run (or resume, or recognise as done) one annotation job."""
    from infra.ray_runtime import start_ray

    job = prepare(cfg)
    done = layout.read_success(job.fs, job.root)
    if done is not None:
        return finished_result(job, done)
    todo = plan(job)
    if todo:
        start_ray(job.cfg.ray)
    start = time.time()  # Ray's own start-up left out: the job's throughput from its first actor on
    finished = annotate_shards(job, todo) if todo else []
    missing = [s.id for s in source_shards(job.version) if not layout.is_committed(job.fs, job.root, s.id)]
    if missing:
        raise RuntimeError(f"{len(missing)} shards were not annotated (e.g. {missing[:3]}); re-run to resume")
    return finish(job, finished, time.time() - start)
