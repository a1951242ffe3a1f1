"""The passes of a curation job over its partitions, and the global steps between them.

- **Plan** (``plan``): the reader's partitions, and which of them pass 1 must still score.
- **Pass 1** (``score_partitions``): read -> the cheap row steps (decode: header, size, SHA-256,
  PHash; geometry) inside each partition's read task, into staging part files.
- **Global steps** of a pass (``global_dedup``: exact, near, semantic dedup, decontamination) on
  staged metadata only, across the run; their decisions are files under the output. Then its
  annotators (``annotate``: cluster ids) on the rows those decisions left, their columns files
  the writer joins (``attributes_of``).
- **Pass k > 1** (``score_survivors``): the survivors, read back from the previous pass's staging;
  their image bytes are read from the input by reference where staging holds none
  (``curation.staging``: a file or an uncompressed tar member kept as it is), checked against
  pass 1's SHA-256, so a source that changed or vanished since fails the run instead of making
  the passes disagree. The model steps run on actor pools; rows that ended earlier ride along
  without their image bytes so that every input stays one manifest row.

A pass resumes by files: a partition whose staging is complete in it is not scored again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import pyarrow as pa

from curation import output, schema, staging
from curation.dedup.decisions import GlobalDedupInput, clear_step, decided_steps, partition_decisions
from curation.dedup.eval_overlap import EvalSet
from curation.dedup.steps import (
    DedupContext,
    DedupDecontaminate,
    DedupNear,
    DedupSemantic,
    DedupStep,
    candidate_columns,
    run_global_dedup,
    steps_before,
)
from curation.eval_set import eval_reader, read_eval_set
from curation.job import CurationJob, content_digest
from curation.partitions import Partition, partition_datasource, partition_to_json
from curation.readers import ROWS_PER_BLOCK
from curation.stats import FORMAT1_STEP_NAMES
from curation.steps import AttributeStep, Pass, Reader, apply_step, check_fits, run_steps_locally
from curation.writer import survivors_only
from infra import storage

log = logging.getLogger("curation")

# Rows per staging write after a model step's actor pool. Its small output blocks, one part
# file each, cost a write task and a file per batch (125 parts for 1,000 rows at batch 8).
STAGING_BATCH_ROWS = 256
# Bytes per block fed to the model steps' actor pools (a block is the unit an actor takes): ~100
# web images of ~80 KB.
POOL_INPUT_BYTES = 8 * 2**20


def plan(job: CurationJob) -> tuple[list[Partition], set[str], list[Partition]]:
    """(all partitions, those already written, those to score); unfinished staging is cleared."""
    storage.remove_temp_files(job.fs, job.root)
    for former in FORMAT1_STEP_NAMES:  # until the next release: a run resumed from one begun under them
        clear_step(job.fs, job.root, former)  # (the global steps decide again, under the current names)
    partitions = job.steps.reader.plan()
    storage.atomic_write_bytes(
        job.fs,
        output.path(job.root, output.PLAN_FILE),
        "".join(partition_to_json(p) + "\n" for p in partitions).encode(),
    )
    written = {p.id for p in partitions if output.is_written(job.fs, job.root, p.id)}
    to_score = [p for p in partitions if p.id not in written and not staging.is_complete(job.fs, job.root, p.id)]
    for p in to_score:
        staging.clear_partition(job.fs, job.root, p.id)
    log.info(
        "%d partitions: %d to score, %d already done", len(partitions), len(to_score), len(partitions) - len(to_score)
    )
    return partitions, written, to_score


def start_ray(job: CurationJob, scoring: bool) -> None:
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


def split_inline(steps: list) -> tuple[list, list]:
    """(the leading cheap row steps, the rest). The cheap ones run inside each partition's read task:
    as separate Ray Data operators, every image's bytes would cross the object store once more
    per step (Ray Data does not fuse them with the read), for work that costs less than the copy."""
    n = next((i for i, s in enumerate(steps) if s.uses_model), len(steps))
    return steps[:n], steps[n:]


def staging_task_resources(job: CurationJob) -> dict:
    """A staging write task's CPUs: the read task's (``input.num_cpus``), not Ray's default of one
    CPU, which a fixed model pool leaving less than a CPU free would starve until the pool ends."""
    return {"num_cpus": job.cfg.input.num_cpus}


def _read_and_list(p: Partition, reader: Reader, inline: list, out_uri: str):
    tables = list(reader.read(p))
    fs, root = storage.resolve(out_uri)
    staging.write_listing(fs, root, p.id, [k for t in tables for k in t.column("key").to_pylist()])
    for table in tables:
        yield run_steps_locally(table, inline) if inline else table


def _score_partition(p: Partition, reader: Reader, inline: list, out_uri: str) -> int:
    """One partition through the cheap row steps into staging, in one task; rows staged."""
    fs, root = storage.resolve(out_uri)
    return sum(staging.write_parts(fs, root, table) for table in _read_and_list(p, reader, inline, out_uri))


def score_partitions(job: CurationJob, partitions: list[Partition]) -> None:
    """Pass 1: the partitions through the first pass's row steps into staging. Cheap steps only
    (the two-pass recipe): one Ray task per partition (``infra.ray_runtime.map_tasks``: no
    stream between operators to manage, and none of Ray Data's per-task dispatch gaps); with a
    model step in pass 1, a Ray Data stream through its actor pool."""
    import ray.data

    from infra.ray_runtime import map_tasks

    reader, uri = job.steps.reader, job.uri
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
    source = partition_datasource(
        partitions, lambda p: _read_and_list(p, reader, inline, uri), schema=None if inline else schema.RAW_SCHEMA
    )
    ds = ray.data.read_datasource(source, override_num_blocks=len(partitions), num_cpus=job.cfg.input.num_cpus)
    for step in pooled:
        ds = apply_step(ds, step, autoscale=job.cfg.ray.actor_pools == "autoscaling")
    ds.write_datasink(staging.StagingSink(uri), ray_remote_args=staging_task_resources(job))


def pass_job(job: CurationJob, p: Pass) -> CurationJob:
    """The job as pass ``p``'s global steps see it: its staging root, the columns written so far
    and only its own global steps. Pass 1 writes its staging under the output; pass k under
    ``_staging/pass<k>`` (dropped with the rest of staging when the job completes)."""
    root = job.root if p.index == 1 else output.path(job.root, output.STAGING_DIR, f"pass{p.index}")
    return dataclasses.replace(job, steps=job.steps.up_to(p), root=root)


def last_staging(job: CurationJob) -> str:
    """Where the last pass staged its rows: what the writer writes from."""
    return pass_job(job, job.steps.passes()[-1]).uri


def _survivors(pid: str, src_uri: str, dst_uri: str, out_uri: str, inline: list, images: bool = True):
    """Pass k's rows of partition ``pid``; ``images``: the pending rows get their image bytes
    (read from the input where staged by reference)."""
    fs, src = storage.resolve(src_uri)
    dst = storage.resolve(dst_uri)[1]
    rows = staging.read_partition_rows(fs, src, pid)
    staging.write_listing(fs, dst, pid, [] if rows is None else rows.column("key").to_pylist())
    if rows is None:
        return
    rows = survivors_only(rows, decisions_of(out_uri, pid))
    if images:
        rows = staging.load_image_bytes(rows, schema.pending_mask(rows))
    for start in range(0, rows.num_rows, ROWS_PER_BLOCK):
        chunk = rows.slice(start, ROWS_PER_BLOCK)
        yield run_steps_locally(chunk, inline) if inline else chunk


def _same_rows(batch: pa.Table) -> pa.Table:
    return batch


def score_survivors(job: CurationJob, p: Pass, pids: list[str]) -> None:
    """Pass ``p`` (2 or later) over the partitions ``pids`` not yet complete in it: rows read back
    from the previous pass's staging with the decisions so far marked; only pending rows carry
    image bytes, so only they reach the models."""
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
    parts = [Partition(id=pid, kind="staged", uris=(src.uri,)) for pid in todo]
    source = partition_datasource(parts, lambda q: _survivors(q.id, src.uri, dst.uri, job.uri, inline, images), None)
    ds = ray.data.read_datasource(source, override_num_blocks=len(parts), num_cpus=job.cfg.input.num_cpus)
    if pooled:
        pool_sized_blocks(ds)
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


def pool_sized_blocks(ds) -> None:
    """Blocks of at most ``POOL_INPUT_BYTES`` for the dataset ``ds`` and those made from it, and
    for nothing else: ``ds.context`` is the copy of the process's DataContext that
    ``read_datasource`` made for this dataset, so the setting reaches neither the process-wide
    context nor another dataset."""
    # A read task's output is merged into blocks of up to target_max_block_size (Ray's default,
    # 128 MiB: a whole partition here), and a block goes to one actor: with fewer partitions than
    # actors, actors would idle (735 survivors in one partition, 2 detector actors: one worked).
    # (A repartition operator instead would need a CPU of its own beside fixed pools that hold
    # the rest: it deadlocked.)
    ds.context.target_max_block_size = POOL_INPUT_BYTES


def run_passes(job: CurationJob, pids: list[str], pending: list[str]) -> tuple[dict[str, int], dict[str, float]]:
    """Every pass after the first, each followed by its global steps (pass 1's are run first).
    ``pids``: all partitions (the global steps see the whole run); ``pending``: those not yet
    written. Returns rows dropped per dedup step (the decisions are on disk, per partition), and
    seconds per phase."""
    dropped, phases = {}, {"dedup": 0.0, "score_survivors": 0.0, "annotate": 0.0}
    for p in job.steps.passes():
        if p.index > 1:
            t = time.time()
            score_survivors(job, p, pending)
            phases["score_survivors"] += time.time() - t
        if p.global_steps:
            t = time.time()
            dropped.update(global_dedup(pass_job(job, p), pids))
            phases["dedup"] += time.time() - t
            t = time.time()
            annotate(job, p, pids)
            phases["annotate"] += time.time() - t
    return dropped, phases


def annotate(job: CurationJob, p: Pass, pids: list[str]) -> None:
    """Pass ``p``'s annotators (``AttributeStep``: cluster ids), each on the rows of its staging that no
    dedup step before it dropped (their decisions are on disk by now)."""
    fs, out_root = storage.resolve(job.cfg.output_dir)
    decided = set(decided_steps(fs, out_root))
    staged = pass_job(job, p).uri
    for step in (s for s in p.global_steps if isinstance(s, AttributeStep)):
        before = job.steps.steps[: job.steps.steps.index(step)]
        earlier = tuple(s.name for s in before if isinstance(s, DedupStep) and s.name in decided)
        columns = ("key", "partition", *step.columns_read())
        inp = GlobalDedupInput(staged, tuple(pids), columns, (), earlier, job.cfg.output_dir)
        step.annotate(inp, {c: column_source(job, c) for c in step.columns_read()})


def column_source(job: CurationJob, column: str) -> str:
    """What wrote ``column``: its row step's ``source`` (model and weights by content), else its
    name and weights' digests."""
    step = next((s for s in job.steps.row_steps if column in s.columns_written()), None)
    if step is None:
        return "unknown"
    digests = {k: content_digest(v)["sha256"] for k, v in step.weight_files().items()}
    if hasattr(step, "source"):
        return step.source(digests)
    return ":".join([step.name, *digests.values()])


def attributes_of(uri: str, steps: tuple[str, ...], pid: str) -> pa.Table | None:
    """The columns the annotators ``steps`` wrote for partition ``pid`` of the output at ``uri``
    (key + theirs), or None without annotators."""
    import pyarrow.parquet as pq

    fs, root = storage.resolve(uri)
    table = None
    for step in steps:
        with fs.open_input_file(output.attributes_path(root, step, pid)) as fh:
            part = pq.read_table(fh)
        table = part if table is None else table.join(part, "key")
    return table


def decisions_of(uri: str, pid: str) -> pa.Table:
    """Every dedup decision on partition ``pid`` of the output at ``uri``, by key."""
    return partition_decisions(*storage.resolve(uri), pid)


def global_dedup(job: CurationJob, pids: list[str], steps: list[DedupStep] | None = None) -> dict[str, int]:
    """Dedup decisions over the whole run (``steps``: the recipe's dedup steps by default), from
    the staged metadata the steps read; written under ``_dedup/decisions/<step>/<partition>.parquet``
    (``output.decisions_path``), each step on the rows the earlier steps' files left. Returns rows
    dropped per step. May be called more than once per run with different steps (e.g. semantic
    dedup after a second pass): later calls see the decisions of the earlier ones on disk.
    With ``dedup.engine=ray`` exact and near dedup run as Ray Data shuffles (``curation.dedup.distributed``)."""
    steps = job.steps.of_kind(DedupStep) if steps is None else steps
    if not steps:  # a pass whose global steps are annotators only
        return {}
    fs, out_root = storage.resolve(job.cfg.output_dir)
    earlier = steps_before(steps, decided_steps(fs, out_root))
    columns, absent = candidate_columns(steps, job.steps.available())
    # staging: this pass's (job.root); decisions: always under the output folder itself
    inp = GlobalDedupInput(job.uri, tuple(pids), tuple(columns), tuple(absent), tuple(earlier), job.cfg.output_dir)
    ctx = DedupContext.open(job.cfg.dedup, next((s.cfg for s in steps if isinstance(s, DedupNear)), None))
    ctx.eval_set = evaluation_set(job, steps)
    dropped = run_global_dedup(steps, inp, ctx)
    ctx.save_index(fs, output.path(out_root, output.DEDUP_DIR, output.NEAR_INDEX_DIR))
    log.info("global dedup dropped %s", dropped)
    return dropped


def evaluation_set(job: CurationJob, steps: list[DedupStep]) -> EvalSet | None:
    """The evaluation images of ``dedup.decontaminate`` read and hashed by the recipe's own reader
    and decode step (``curation.eval_set``), with the CLIP step's embedding when ``steps`` hold
    semantic dedup; None when no step here uses them."""
    uri = getattr(getattr(job.cfg.dedup, "decontaminate", None), "eval_images", "")
    semantic = next((s for s in steps if isinstance(s, DedupSemantic)), None)
    if not uri or (semantic is None and not any(isinstance(s, DedupDecontaminate) for s in steps)):
        return None
    rows = job.steps.row_steps
    embedding = None
    if semantic is not None:
        embedding = next((s for s in rows if semantic.cfg.embedding_column in s.columns_written()), None)
        if embedding is None:
            return None
    decode = next(s for s in rows if "phash" in s.columns_written())
    reader = eval_reader(job.steps.reader, uri)
    column = semantic.cfg.embedding_column if semantic is not None else "clip_embedding"
    where = storage.to_uri(*storage.resolve(uri))
    return EvalSet(read_eval_set(reader, decode, embedding, embedding_column=column, relative_to=where))
