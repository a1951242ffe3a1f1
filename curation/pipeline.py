"""The curation job: plan -> pass 1 -> global dedup -> pass 2 (survivors) -> ... -> write -> stats -> MLflow.

``run_curation`` runs the recipe (``curation.recipe``) in these steps, one function each:

1. **Prepare**: build the recipe from the config (every start-up check, before any Ray work),
   digest the job, claim the output folder (refusing one that holds another job).
2. **Plan** the input into partitions with deterministic ids; skip what is already done.
3. **Pass 1** over every partition not yet complete: read -> the cheap row steps (decode: header,
   size, SHA-256, PHash; geometry) inside each read task, into staging part files.
4. **Global steps** of the pass (exact + near dedup) on metadata only, across the run.
5. **Pass 2** over the survivors, read back from pass 1's staging; the survivors' image bytes
   are read from the input by reference where staging holds none (``curation.staging``: a
   file or an uncompressed tar member kept as it is), checked against pass 1's SHA-256, so a
   source that changed or vanished since fails the run instead of making the passes disagree:
   the model steps on actor pools; rows that ended earlier ride along without their image
   bytes so that every input stays one manifest row. Then its global steps (semantic dedup
   on pass 2's embeddings).
6. **Write** each partition's shard, sidecar and manifest part (skipping committed ones); kept
   images staged by reference are copied from the input into the shard, checked the same way.
7. **Finish**: stats from the manifest, the dataset version, MLflow, then ``_SUCCESS``.

Resume is by files: a re-run of the same job into the same output redoes only the
partitions that were not complete in the pass where it stopped (the global steps are
recomputed: they are deterministic), and produces byte-identical outputs. A re-run with a
different job configuration into the same output is refused.
"""

from __future__ import annotations

import copy
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

from curation import output, readers, schema, staging
from curation.dedup.decisions import GlobalDedupInput, decided_steps, partition_decisions
from curation.dedup.eval_overlap import EvalSet
from curation.dedup.steps import (
    Decontaminate,
    DedupContext,
    DedupStep,
    NearDedup,
    SemanticDedup,
    candidate_columns,
    run_global_dedup,
    steps_before,
)
from curation.eval_set import eval_reader, read_eval_set
from curation.recipe import HUMANS1B, CurationConfig
from curation.sharding import Layout, first_numbers
from curation.stats import (
    SUMMARY_COLUMNS,
    format_summary,
    manifest_counts,
    merge_counts,
    stats_from_counts,
    tracking_record,
)
from curation.steps import BuiltRecipe, Pass, Recipe, apply_step, check_fits, run_steps_locally, section_of
from curation.versions import code_version, combine_digests, partition_digest
from curation.writer import PLACE, count_kept, placed_rows, survivors_only, write_mixed_shard
from infra import storage
from infra.config import config_to_dict, dump_config

log = logging.getLogger("curation")


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


@dataclasses.dataclass
class Job:
    """One curation job, prepared: its config, built steps, digest and output folder."""

    cfg: Any
    steps: BuiltRecipe
    digest: str
    fs: Any
    root: str

    @property
    def uri(self) -> str:
        return storage.to_uri(self.fs, self.root)


# ---- identity ------------------------------------------------------------------------------------

# Where and how wide a step runs, never what it decides: a job killed on one cluster shape can
# resume on another (more GPUs, fewer actors) into the same output.
RESOURCE_KEYS = frozenset({"num_cpus", "num_gpus", "num_actors"})
NOT_IDENTITY = ("tracking", "ray", "output_dir", "name", "dataset_name")


def _without_resources(value):
    if isinstance(value, dict):
        return {k: _without_resources(v) for k, v in value.items() if k not in RESOURCE_KEYS}
    return value


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_digest(path: str) -> dict:
    """A weight file (or a model folder's files) by content: sha256 and size, never its path."""
    p = Path(path).expanduser()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    digests = [
        (
            f.relative_to(p).as_posix() if p.is_dir() else "",
            _file_digest(str(f), f.stat().st_size, f.stat().st_mtime_ns),
        )
        for f in files
    ]
    total = sum(f.stat().st_size for f in files)
    one = digests[0][1] if len(digests) == 1 else hashlib.sha256(json.dumps(digests).encode()).hexdigest()
    return {"sha256": one, "bytes": total}


def job_digest(cfg: CurationConfig, recipe: Recipe = HUMANS1B) -> str:
    """Digest of everything that decides the outputs: not where they are logged, how Ray runs,
    the resources each step gets, nor where the model weights live (they enter by content)."""
    d = config_to_dict(cfg)
    for k in NOT_IDENTITY:
        d.pop(k, None)
    d["dedup"]["near"].pop("index_locations", None)  # where earlier index parts lie now: not what the job is
    if not cfg.shards.samples_per_shard:  # one shard per partition (the seed is unused): the identity outputs
        d.pop("shards", None)  # written before the setting existed still have, so they resume and are reused
    if cfg.dedup.against:  # the earlier version by content (its id), not where it lies
        d["dedup"]["against"] = {"dataset_id": output.from_output(cfg.dedup.against).id}
    eval_images = getattr(getattr(cfg.dedup, "decontaminate", None), "eval_images", "")
    if eval_images and "://" not in eval_images:  # the evaluation set by content, not where it lies
        d["dedup"]["decontaminate"]["eval_images"] = content_digest(eval_images)
    for setting, path in recipe.build(cfg).weight_files().items():
        *parents, leaf = setting.split(".")
        node = d
        for p in parents:
            node = node[p]
        node[leaf] = content_digest(path)
    return hashlib.sha256(json.dumps(_without_resources(d), sort_keys=True).encode()).hexdigest()[:16]


def absolutize(cfg: CurationConfig, recipe: Recipe = HUMANS1B) -> CurationConfig:
    """Relative local paths (output, input, weights) are taken from the driver's working
    directory, before workers see them."""

    def local(path: str) -> str:
        return path if not path or "://" in path else str(Path(path).expanduser().resolve())

    cfg = copy.deepcopy(cfg)
    cfg.output_dir, cfg.input.uri = local(cfg.output_dir), local(cfg.input.uri)
    for step in recipe.steps:
        settings = section_of(cfg, step.section) if step.section else None
        for name in ("weights", "head_weights", "clip_head_weights", "eval_images"):
            if isinstance(getattr(settings, name, None), str):
                setattr(settings, name, local(getattr(settings, name)))
    return cfg


# ---- the job's steps -----------------------------------------------------------------------------


def prepare(cfg: CurationConfig, recipe: Recipe) -> Job:
    """Checks, digest and the output folder; raises ``ValueError`` before any Ray work."""
    cfg.validate()
    cfg = absolutize(cfg, recipe)
    steps = recipe.build(cfg)
    fs, root = _output_folder(cfg.output_dir)
    job = Job(cfg, steps, job_digest(cfg, recipe), fs, root)
    marker = output.path(root, output.JOB_DIGEST_FILE)
    if storage.exists(fs, marker):
        previous = storage.read_bytes(fs, marker).decode().strip()
        if previous != job.digest:
            raise ValueError(
                f"output_dir {cfg.output_dir!r} holds a run of a different configuration "
                f"(job digest {previous}, this one {job.digest}); use a new output_dir"
            )
    else:
        storage.atomic_write_bytes(fs, marker, job.digest.encode())
    if not storage.exists(fs, output.path(root, output.SUCCESS_FILE)):  # a finished output keeps the config it ran
        storage.atomic_write_bytes(fs, output.path(root, output.CONFIG_FILE), dump_config(cfg).encode())
    return job


def _output_folder(output_dir: str):
    fs, root = storage.resolve(output_dir)
    try:
        storage.makedirs(fs, root)
    except (NotADirectoryError, FileExistsError, PermissionError) as err:
        raise ValueError(
            f"output_dir={output_dir!r} cannot be created ({type(err).__name__}: {err}); "
            "give a folder that can be written"
        ) from None
    return fs, root


def finished_result(job: Job) -> CurationResult:
    """The result of an output that is already complete (nothing is recomputed)."""
    out = output.CuratedOutput(job.fs, job.root)
    done = out.success()
    _drop_staging(job)
    return CurationResult(
        job.uri,
        out.stats(),
        storage.join(job.uri, output.MANIFEST),
        out.shard_uris(),
        done["dataset_id"],
        done.get("mlflow_run_id"),
        skipped=True,
    )


def plan(job: Job) -> tuple[list[readers.Partition], set[str], list[readers.Partition]]:
    """(all partitions, those already written, those to score); unfinished staging is cleared."""
    storage.remove_temp_files(job.fs, job.root)
    partitions = job.steps.steps[0].plan()
    storage.atomic_write_bytes(
        job.fs,
        output.path(job.root, output.PLAN_FILE),
        "".join(readers.partition_to_json(p) + "\n" for p in partitions).encode(),
    )
    written = {p.id for p in partitions if output.is_written(job.fs, job.root, p.id)}
    to_score = [p for p in partitions if p.id not in written and not staging.is_complete(job.fs, job.root, p.id)]
    for p in to_score:
        staging.clear_partition(job.fs, job.root, p.id)
    log.info(
        "%d partitions: %d to score, %d already done", len(partitions), len(to_score), len(partitions) - len(to_score)
    )
    return partitions, written, to_score


def start_ray(job: Job, scoring: bool) -> None:
    """Start or join Ray; on a local cluster, refuse actor pools that cannot all fit."""
    from infra.ray_runtime import joins_a_cluster
    from infra.ray_runtime import start_ray as start

    start(job.cfg.ray)
    if scoring and not joins_a_cluster(job.cfg.ray.address):  # a cluster's size is not known up front
        import ray

        check_fits(
            split_inline(job.steps.row_steps)[1],
            job.cfg.input.num_cpus,
            ray.cluster_resources().get("CPU", 0.0),
            autoscale=job.cfg.ray.actor_pools == "autoscaling",
        )


def _read_and_list(p: readers.Partition, reader: readers.ReadImages, inline: list, out_uri: str):
    tables = list(reader.read(p))
    fs, root = storage.resolve(out_uri)
    staging.write_listing(fs, root, p.id, [k for t in tables for k in t.column("key").to_pylist()])
    for table in tables:
        yield run_steps_locally(table, inline) if inline else table


def staging_task_resources(job: Job) -> dict:
    """A staging write task's CPUs: the read task's (``input.num_cpus``), not Ray's default of one
    CPU, which a fixed model pool leaving less than a CPU free would starve until the pool ends."""
    return {"num_cpus": job.cfg.input.num_cpus}


def split_inline(steps: list) -> tuple[list, list]:
    """(the leading cheap row steps, the rest). The cheap ones run inside each partition's read task:
    as separate Ray Data operators, every image's bytes would cross the object store once more
    per step (Ray Data does not fuse them with the read), for work that costs less than the copy."""
    n = next((i for i, s in enumerate(steps) if s.uses_model), len(steps))
    return steps[:n], steps[n:]


def _score_partition(p: readers.Partition, reader: readers.ReadImages, inline: list, out_uri: str) -> int:
    """One partition through the cheap row steps into staging, in one task; rows staged."""
    fs, root = storage.resolve(out_uri)
    return sum(staging.write_parts(fs, root, table) for table in _read_and_list(p, reader, inline, out_uri))


def score_partitions(job: Job, partitions: list[readers.Partition]) -> None:
    """Pass 1: the partitions through the first pass's row steps into staging. Cheap steps only
    (the two-pass recipe): one Ray task per partition (``infra.ray_runtime.map_tasks``: no
    stream between operators to manage, and none of Ray Data's per-task dispatch gaps); with a
    model step in pass 1, a Ray Data stream through its actor pool."""
    import ray.data

    from infra.ray_runtime import map_tasks

    reader, uri = job.steps.steps[0], job.uri
    inline, pooled = split_inline(job.steps.passes()[0].row_steps)
    if not pooled:  # the task runs the read and every cheap step: it needs the most any of them asks
        cpus = max([job.cfg.input.num_cpus, *(s.resources().num_cpus for s in inline)])
        map_tasks(
            functools.partial(_score_partition, reader=reader, inline=inline, out_uri=uri),
            partitions,
            num_cpus=cpus,
            name="curation.pass1",
        )
        return
    source = readers.partition_datasource(
        partitions, lambda p: _read_and_list(p, reader, inline, uri), schema=None if inline else readers.RAW_SCHEMA
    )
    ds = ray.data.read_datasource(source, override_num_blocks=len(partitions), num_cpus=job.cfg.input.num_cpus)
    for step in pooled:
        ds = apply_step(ds, step, autoscale=job.cfg.ray.actor_pools == "autoscaling")
    ds.write_datasink(staging.StagingSink(uri), ray_remote_args=staging_task_resources(job))


def pass_job(job: Job, p: Pass) -> Job:
    """The job as pass ``p``'s global steps see it: its staging root, the columns written so far
    and only its own global steps. Pass 1 writes its staging under the output; pass k under
    ``_staging/pass<k>`` (dropped with the rest of staging when the job completes)."""
    root = job.root if p.index == 1 else output.path(job.root, output.STAGING_DIR, f"pass{p.index}")
    return dataclasses.replace(job, steps=job.steps.up_to(p), root=root)


def _survivors(pid: str, src_uri: str, dst_uri: str, out_uri: str, inline: list, images: bool = True):
    """Pass k's rows of partition ``pid``; ``images``: the pending rows get their image bytes
    (read from the input where staged by reference)."""
    fs, src = storage.resolve(src_uri)
    dst = storage.resolve(dst_uri)[1]
    rows = staging.read_partition_rows(fs, src, pid)
    staging.write_listing(fs, dst, pid, [] if rows is None else rows.column("key").to_pylist())
    if rows is None:
        return
    rows = survivors_only(rows, partition_decisions(*storage.resolve(out_uri), pid))
    if images:
        rows = staging.load_image_bytes(rows, schema.pending_mask(rows))
    for start in range(0, rows.num_rows, readers.ROWS_PER_BLOCK):
        chunk = rows.slice(start, readers.ROWS_PER_BLOCK)
        yield run_steps_locally(chunk, inline) if inline else chunk


# Rows per staging write after a model step's actor pool. Its small output blocks, one part
# file each, cost a write task and a file per batch (125 parts for 1,000 rows at batch 8).
STAGING_BATCH_ROWS = 256
# Bytes per block fed to the model steps' actor pools (a block is the unit an actor takes): ~100
# web images of ~80 KB.
POOL_INPUT_BYTES = 8 * 2**20


def _same_rows(batch: pa.Table) -> pa.Table:
    return batch


def score_survivors(job: Job, p: Pass, pids: list[str]) -> None:
    """Pass ``p`` (2 or later) over the partitions ``pids`` not yet complete in it: rows read back
    from the previous pass's staging with the decisions so far marked; only pending rows carry
    image bytes, so only they reach the models."""
    import ray
    import ray.data

    src, dst = pass_job(job, dataclasses.replace(p, index=p.index - 1)), pass_job(job, p)
    todo = [pid for pid in pids if not staging.is_complete(job.fs, dst.root, pid)]
    log.info("pass %d: %d partitions to score, %d already done", p.index, len(todo), len(pids) - len(todo))
    if not todo:
        return
    for pid in todo:
        staging.clear_partition(job.fs, dst.root, pid)
    inline, pooled = split_inline(p.row_steps)
    images = any("image" in s.columns_read() for s in p.row_steps)
    parts = [readers.Partition(id=pid, kind="staged", uris=(src.uri,)) for pid in todo]
    source = readers.partition_datasource(
        parts, lambda q: _survivors(q.id, src.uri, dst.uri, job.uri, inline, images), schema=None
    )
    # A read task's output is merged into blocks of up to DataContext.target_max_block_size (128 MiB: a
    # whole partition here), and a block goes to one actor: with fewer partitions than actors, actors
    # would idle (735 survivors in one partition, 2 detector actors: one worked). The dataset keeps the
    # context it is created with, so smaller blocks are set for this read only. (A repartition operator
    # instead would need a CPU of its own beside fixed pools that hold the rest: it deadlocked.)
    ctx = ray.data.DataContext.get_current()
    default_block = ctx.target_max_block_size
    if pooled:
        ctx.target_max_block_size = POOL_INPUT_BYTES
    try:
        ds = ray.data.read_datasource(source, override_num_blocks=len(parts), num_cpus=job.cfg.input.num_cpus)
    finally:
        ctx.target_max_block_size = default_block
    for step in pooled:
        ds = apply_step(ds, step, autoscale=job.cfg.ray.actor_pools == "autoscaling")
    if pooled:  # an actor returns a block per batch (8 rows for the detector): staged in fewer, larger parts
        ds = ds.map_batches(
            _same_rows,
            batch_size=STAGING_BATCH_ROWS,
            batch_format="pyarrow",
            zero_copy_batch=True,
            num_cpus=job.cfg.input.num_cpus,
        )
    ds.write_datasink(staging.StagingSink(dst.uri), ray_remote_args=staging_task_resources(job))


def run_passes(job: Job, pids: list[str], pending: list[str]) -> tuple[dict[str, int], dict[str, float]]:
    """Every pass after the first, each followed by its global steps (pass 1's are run first).
    ``pids``: all partitions (the global steps see the whole run); ``pending``: those not yet
    written. Returns rows dropped per dedup step (the decisions are on disk, per partition), and
    seconds per phase."""
    dropped, phases = {}, {"dedup": 0.0, "score_survivors": 0.0}
    for p in job.steps.passes():
        if p.index > 1:
            t = time.time()
            score_survivors(job, p, pending)
            phases["score_survivors"] += time.time() - t
        if p.global_steps:
            t = time.time()
            dropped.update(global_dedup(pass_job(job, p), pids))
            phases["dedup"] += time.time() - t
    job.steps.steps[-1].staged_at = pass_job(job, job.steps.passes()[-1]).uri
    return dropped, phases


def global_dedup(job: Job, pids: list[str], steps: list[DedupStep] | None = None) -> dict[str, int]:
    """Dedup decisions over the whole run (``steps``: the recipe's dedup steps by default), from
    the staged metadata the steps read; written under ``_dedup/decisions/<step>/<partition>.parquet``
    (``output.decisions_path``), each step on the rows the earlier steps' files left. Returns rows
    dropped per step. May be called more than once per run with different steps (e.g. semantic
    dedup after a second pass): later calls see the decisions of the earlier ones on disk.
    With ``dedup.engine=ray`` exact and near dedup run as Ray Data shuffles (``curation.dedup.distributed``)."""
    steps = job.steps.of_kind(DedupStep) if steps is None else steps
    fs, out_root = storage.resolve(job.cfg.output_dir)
    earlier = steps_before(steps, decided_steps(fs, out_root))
    columns, absent = candidate_columns(steps, job.steps.available())
    # staging: this pass's (job.root); decisions: always under the output folder itself
    inp = GlobalDedupInput(job.uri, tuple(pids), tuple(columns), tuple(absent), tuple(earlier), job.cfg.output_dir)
    ctx = DedupContext.open(job.cfg.dedup, next((s.cfg for s in steps if isinstance(s, NearDedup)), None))
    ctx.eval_set = evaluation_set(job, steps)
    dropped = run_global_dedup(steps, inp, ctx)
    ctx.save_index(fs, output.path(out_root, output.DEDUP_DIR, output.NEAR_INDEX_DIR))
    log.info("global dedup dropped %s", dropped)
    return dropped


def _decisions(uri: str, pid: str) -> pa.Table:
    return partition_decisions(*storage.resolve(uri), pid)


def evaluation_set(job: Job, steps: list[DedupStep]) -> EvalSet | None:
    """The evaluation images of ``dedup.decontaminate`` read and hashed by the recipe's own reader
    and decode step (``curation.eval_set``), with the CLIP step's embedding when ``steps`` hold
    semantic dedup; None when no step here uses them."""
    uri = getattr(getattr(job.cfg.dedup, "decontaminate", None), "eval_images", "")
    semantic = next((s for s in steps if isinstance(s, SemanticDedup)), None)
    if not uri or (semantic is None and not any(isinstance(s, Decontaminate) for s in steps)):
        return None
    rows = job.steps.row_steps
    embedding = None
    if semantic is not None:
        embedding = next((s for s in rows if semantic.cfg.embedding_column in s.columns_written()), None)
        if embedding is None:
            return None
    decode = next(s for s in rows if "phash" in s.columns_written())
    reader = eval_reader(job.steps.steps[0], uri)
    column = semantic.cfg.embedding_column if semantic is not None else "clip_embedding"
    where = storage.to_uri(*storage.resolve(uri))
    return EvalSet(read_eval_set(reader, decode, embedding, embedding_column=column, relative_to=where))


def write_all(job: Job, partitions: list[str], pending: list[str]) -> list[dict]:
    """The shards with their sidecars, and the manifest parts of the ``pending`` partitions; a
    task reads its partition's decisions only. One shard per partition: each pending partition's
    task writes its shard, then its manifest part. Mixed shards (``shards.samples_per_shard``):
    the kept counts of all ``partitions`` (a task each), the shards not yet complete
    (``write_mixed_shards``), then the manifest parts naming them."""
    from infra.ray_runtime import map_tasks

    uri, writer = job.uri, job.steps.steps[-1]
    if not writer.cfg.samples_per_shard:

        def _write(pid: str) -> dict:
            return writer.write(uri, pid, _decisions(uri, pid))

        return map_tasks(_write, pending, num_cpus=1, name="curation.write")

    def _count(pid: str) -> dict:
        return count_kept(uri, pid, _decisions(uri, pid), writer.staged_at)

    counts = map_tasks(_count, partitions, num_cpus=1, name="curation.count_kept")
    layout = writer.layout(sum(c["kept"] for c in counts))
    firsts = first_numbers({c["partition"]: c["kept"] for c in counts})
    write_mixed_shards(job, layout, [c for c in counts if c["kept"]], firsts)

    def _manifest(pid: str) -> dict:
        return writer.write(uri, pid, _decisions(uri, pid), (layout, firsts[pid]))

    return map_tasks(_manifest, pending, num_cpus=1, name="curation.write_manifest")


# Kept input bytes per group of the shuffle that carries the samples to their mixed shards.
SHUFFLE_GROUP_BYTES = 512 * 2**20


def _placed(batch: pa.Table, uri: str, layout: Layout, done, staged_at: str | None) -> pa.Table:
    pid, first = batch.column("partition")[0].as_py(), batch.column("first")[0].as_py()
    return placed_rows(uri, pid, first, _decisions(uri, pid), layout, done, staged_at)


def write_mixed_shards(job: Job, layout: Layout, counts: list[dict], firsts: dict[str, int]) -> None:
    """The mixed shards whose sidecar is not written yet: a Ray Data task per partition with kept
    samples reads those bound for them (``curation.writer.placed_rows``), one shuffle by shard
    brings each shard's samples together, and each group is written as its shard
    (``write_mixed_shard``). What reaches the driver: one flag per shard and one row per shard written."""
    import numpy as np
    import ray.data

    done = np.zeros(layout.num_shards, bool)
    for path in output.CuratedOutput(job.fs, job.root).sidecar_files():
        done[int(output.sidecar_stem(path))] = True
    todo = int((~done).sum())
    log.info("mixed shards: %d of %d to write (%d samples each)", todo, layout.num_shards, layout.samples_per_shard)
    if not todo:
        return
    items = [{"partition": c["partition"], "first": firsts[c["partition"]]} for c in counts]
    kwargs = {"uri": job.uri, "layout": layout, "done": done, "staged_at": job.steps.steps[-1].staged_at}
    ds = ray.data.from_items(items, override_num_blocks=min(len(items), 1000)).map_batches(
        _placed, batch_size=1, batch_format="pyarrow", fn_kwargs=kwargs, num_cpus=job.cfg.input.num_cpus
    )
    groups = max(1, min(todo, -(-sum(c["bytes"] for c in counts) // SHUFFLE_GROUP_BYTES)))
    written = (
        ds.groupby(PLACE[0], num_partitions=groups)
        .map_groups(write_mixed_shard, fn_kwargs={"output": job.uri, "layout": layout}, batch_format="pyarrow")
        .take_all()
    )
    if len(written) != todo:
        raise RuntimeError(f"{len(written)} mixed shards written, {todo} expected")


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


# Manifest parts summarised per task: parts are small (summary columns only), tasks are not free.
SUMMARY_PARTS_PER_TASK = 16


def summarise_manifest(job: Job) -> tuple[dict, dict[str, str]]:
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


def finish(job: Job, partitions: int, phases: dict[str, float], t0: float) -> tuple[dict, str, str | None]:
    """stats.json, the dataset version id, the MLflow record, then ``_SUCCESS`` (last). Stats and the
    id come from per-part summaries (``summarise_manifest``): no process reads the whole manifest."""
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
    stats.update(
        partitions=partitions, job_digest=job.digest, samples_per_shard=job.steps.steps[-1].cfg.samples_per_shard
    )
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
    storage.atomic_write_bytes(
        job.fs,
        output.path(job.root, output.SUCCESS_FILE),
        json.dumps(
            {
                "dataset_id": dataset_id,
                "dataset_name": name,
                "job_digest": job.digest,
                "code_version": code_version(),
                "mlflow_run_id": run_id,
                "kept": stats["kept"],
                "seconds": round(time.time() - t0, 3),
                "phase_seconds": phases,
            },
            sort_keys=True,
        ).encode(),
    )
    return stats, dataset_id, run_id


def write_shard_index(job: Job, out: output.CuratedOutput, name: str) -> dict:
    """``shardindex.json`` (``CuratedOutput.shard_index``: URLs relative to the output folder); in a
    mixed layout, every shard but the last must hold exactly ``samples_per_shard`` samples."""
    index = out.shard_index(name)
    n, sizes = job.steps.steps[-1].cfg.samples_per_shard, [s["nsamples"] for s in index["shardlist"]]
    if n and (any(c != n for c in sizes[:-1]) or (sizes and not 0 < sizes[-1] <= n)):
        raise RuntimeError(f"shards of {n} samples expected, the shards hold {sizes}")
    storage.atomic_write_bytes(
        job.fs, output.path(job.root, output.SHARD_INDEX_FILE), json.dumps(index, indent=2, sort_keys=True).encode()
    )
    return index


def _record(job: Job, stats: dict, schema, dataset_id: str, name: str, index: dict) -> str | None:
    """The MLflow run of the dataset version: stats, ``shards.txt`` and the shard index with absolute URIs."""
    if not job.cfg.tracking.enabled:
        return None
    shards = [s["url"] for s in index["shardlist"]]
    from infra.tracking import log_dataset_run, resolve_tracking_uri

    metrics, run_tags, profile = tracking_record(stats)
    tags = {"humanvision.stage": "curation", "curation.output": job.uri, "curation.job_digest": job.digest}
    run_tags.update(
        {
            "dataset.id": dataset_id,
            "dataset.name": name,
            "dataset.uri": job.uri,
            "dataset.shards": json.dumps(len(shards)),
            "curation.code_version": code_version(),
        }
    )
    from infra.tracking import arrow_to_mlflow_schema

    return log_dataset_run(
        job.cfg.tracking,
        resolve_tracking_uri(job.cfg.tracking.uri, job.cfg.output_dir),
        job.cfg,
        output_uri=job.uri,
        tags=tags,
        metrics=metrics,
        run_tags=run_tags,
        documents={output.STATS_FILE: stats, "shards.txt": "\n".join(shards) + "\n", output.SHARD_INDEX_FILE: index},
        dataset_name=name,
        dataset_id=dataset_id,
        dataset_schema=arrow_to_mlflow_schema(schema),
        profile=profile,
    )


def run_curation(cfg: CurationConfig, recipe: Recipe = HUMANS1B) -> CurationResult:
    """Run (or resume, or recognise as done) one curation job."""
    job = prepare(cfg, recipe)
    if output.CuratedOutput(job.fs, job.root).finished:
        return finished_result(job)
    partitions, written, to_score = plan(job)
    start_ray(job, scoring=bool(to_score))
    t0 = time.time()
    if to_score:
        score_partitions(job, to_score)
    phases = {"score": time.time() - t0}
    incomplete = [p.id for p in partitions if p.id not in written and not staging.is_complete(job.fs, job.root, p.id)]
    if incomplete:
        raise RuntimeError(
            f"{len(incomplete)} partitions did not complete scoring (e.g. {incomplete[:3]}); re-run to resume"
        )
    pending = [p.id for p in partitions if p.id not in written]
    _, more = run_passes(job, [p.id for p in partitions], pending)
    phases.update(more)
    t = time.time()
    write_all(job, [p.id for p in partitions], pending)
    phases["write"], phases["stats_and_tracking"] = time.time() - t, 0.0
    stats, dataset_id, run_id = finish(job, len(partitions), phases, t0)
    _drop_staging(job)
    out = output.CuratedOutput(job.fs, job.root)
    return CurationResult(
        job.uri,
        stats,
        storage.join(job.uri, output.MANIFEST),
        out.shard_uris(),
        dataset_id,
        run_id,
        resumed_partitions=len(partitions) - len(to_score),
    )


def _drop_staging(job: Job) -> None:
    d = output.path(job.root, output.STAGING_DIR)
    if storage.exists(job.fs, d):
        job.fs.delete_dir(d)
