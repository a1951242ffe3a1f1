"""The Ray Train worker loop: build, shard, restore, train, checkpoint, export.

Every rank runs ``train_loop_per_worker``; all ranks take the same control path (same
steps, same checkpoints, same reports), which Ray Train and the collectives require.
Rank 0 also logs to MLflow.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from infra import storage
from infra.config import from_dict
from training import checkpoint
from training.config import PretrainConfig
from training.data import ResumableLoader
from training.flops import peak_tflops, step_cost, tokens_per_step
from training.meta_arch import SSLMetaArch
from training.optim import build_optimizer
from training.parallelize import parallelize
from training.schedules import values_at
from training.step import train_step

log = logging.getLogger(__name__)

EXPORT_DIR = "export"
EXPORT_MANIFEST = "export.json"


def set_determinism(cfg: PretrainConfig, device: torch.device) -> None:
    torch.manual_seed(cfg.seed)
    if device.type == "cpu":
        # Results on CPU depend on the thread count: pin it to the worker's share.
        torch.set_num_threads(max(1, int(cfg.ray.cpus_per_worker)))
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.benchmark = False


def build(cfg: PretrainConfig, device: torch.device, world_size: int):
    """The sharded meta-architecture and its optimiser, initialised identically on every rank."""
    arch = SSLMetaArch(cfg)  # student initialised on CPU from the seed; teacher on meta
    mesh = None
    if dist.is_available() and dist.is_initialized():
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world_size,))
    parallelize(arch, mesh, cfg.parallel)
    if mesh is None:
        arch.to(device)
    arch.materialize_teacher(device)
    return arch, build_optimizer(arch.student, cfg.optim)


def train_loop_per_worker(payload: dict) -> None:
    import ray.train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # BackboneOutput's cls/patch_tokens are views of its tokens; nothing here modifies
    # them in place, which is what this FSDP2 warning is about.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    cfg = from_dict(PretrainConfig, payload["config"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device("cuda", ctx.get_local_rank()) if cfg.ray.use_gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    set_determinism(cfg, device)
    arch, optimizer = build(cfg, device, world)

    step, data_state = 0, None
    restored = ray.train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as directory:
            step, data_state, train_state = checkpoint.load(directory, arch, optimizer, rank=rank)
        if train_state.get("dataset_id") != payload["dataset"]["id"]:
            raise ValueError(f"checkpoint {restored.path} was trained on dataset {train_state.get('dataset_id')}, "
                             f"this run streams {payload['dataset']['id']}")
        log.info("rank %d resumed from %s at step %d", rank, restored.path, step)

    loader = ResumableLoader(
        tuple(payload["shards"]), rank=rank, world_size=world, loader_workers=cfg.data.loader_workers,
        batch_size=cfg.batch_size_per_worker, crops=cfg.crops, masking=cfg.masking, patch_stride=arch.stride,
        seed=cfg.seed, buffer_size=cfg.data.shuffle_buffer, prefetch_factor=cfg.data.prefetch_factor,
        mp_context=cfg.data.mp_context, pin_memory=device.type == "cuda", state=data_state)
    run_dir = payload["run_dir"]
    logger = None
    if rank == 0 and payload.get("mlflow_run_id") and _tracking_reachable(payload["tracking_uri"]):
        from training.tracking import MetricsLogger

        logger = MetricsLogger(payload["tracking_uri"], payload["mlflow_run_id"], flush_every=cfg.mlflow.log_every)
    keys_file = None
    if cfg.record_batch_keys and "://" not in run_dir:
        keys_file = Path(run_dir) / "batch_keys" / f"rank_{rank:05d}.jsonl"
        keys_file.parent.mkdir(parents=True, exist_ok=True)

    peak = peak_tflops(cfg.peak_tflops, device)
    tokens = tokens_per_step(cfg, cfg.batch_size_per_worker)
    flops = step_cost(cfg, cfg.batch_size_per_worker).flops if peak else None  # counting takes seconds: only for MFU
    session_end = cfg.steps if cfg.max_steps_this_session <= 0 else min(cfg.steps, step + cfg.max_steps_this_session)
    meta = {"run_name": cfg.run_name, "dataset_id": payload["dataset"]["id"], "model": cfg.model}
    last = {}
    saved_for_notice = False
    tick = time.perf_counter()
    try:
        while step < session_end:
            waited = time.perf_counter()
            batch = next(loader)
            data_wait = time.perf_counter() - waited
            batch = batch.to(device, non_blocking=True)
            images_now = bool(logger and cfg.mlflow.images_every and (step + 1) % cfg.mlflow.images_every == 0)
            result = train_step(arch, optimizer, batch, values_at(cfg, step), step=step + 1,
                                clip_grad=cfg.optim.clip_grad, return_viz=images_now)
            step += 1
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            elapsed, tick = now - tick, now
            last = dict(result.values)
            last.update(step_time_s=elapsed, data_wait_s=data_wait,
                        images_per_s=world * batch.size / elapsed, tokens_per_s=world * tokens / elapsed)
            if flops:
                last["mfu"] = flops / elapsed / (peak * 1e12)
            if keys_file is not None:
                with open(keys_file, "a") as f:
                    f.write(json.dumps({"step": step, "keys": batch.keys}) + "\n")
            if logger is not None:
                logger.log(step, last)
                if images_now:
                    from training.tracking import reconstruction_grid

                    grid = reconstruction_grid(result.viz, arch.stride, scale=max(1, 256 // cfg.crops.global_size[0]))
                    logger.log_image(grid, f"reconstructions/step_{step:08d}.png")
            if step % cfg.checkpoint.every == 0 or step == session_end:
                _save_and_report(arch, optimizer, loader, step=step, rank=rank, meta=meta, metrics=last,
                                 run_dir=run_dir, logger=logger)
                tick = time.perf_counter()  # checkpoint time is not step time
            elif _preemption_notice(cfg, step, saved_for_notice):
                log.warning("rank %d: a node of this run is about to be preempted: checkpointing at step %d", rank, step)
                _save_and_report(arch, optimizer, loader, step=step, rank=rank, meta=meta, metrics=last,
                                 run_dir=run_dir, logger=logger)
                saved_for_notice = True
                tick = time.perf_counter()
        if step >= cfg.steps and cfg.checkpoint.export:
            exported = _export(arch, step=step, rank=rank, run_dir=run_dir, cfg=cfg, meta=meta)
            ray.train.report({"step": step, **last, **exported}, checkpoint=None)
    finally:
        loader.close()
        if logger is not None:
            logger.flush()


def _tracking_reachable(uri: str) -> bool:
    """A SQLite store lives on the driver's disk: rank 0 on another node (without a shared
    file system) would silently start an empty database of its own."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        log.warning("MLflow store %s is not visible from this node: no per-step metrics will be logged. "
                    "Use an MLflow server (mlflow.uri=http://...) for multi-node runs.", uri)
        return False
    return True


def _preemption_notice(cfg: PretrainConfig, step: int, already_saved: bool) -> bool:
    """Ask Ray (a barrier: every rank asks at the same steps) whether a node is going away."""
    every = cfg.checkpoint.preemption_check_every
    if not every or step % every or already_saved:
        return False
    import ray.train

    return ray.train.get_preemption_info() is not None


def _save_and_report(arch, optimizer, loader, *, step, rank, meta, metrics, run_dir, logger) -> None:
    import ray.train

    name = f"checkpoint_{step:08d}"
    with tempfile.TemporaryDirectory(prefix="pretrain-ckpt-") as tmp:
        checkpoint.save(tmp, arch, optimizer, step=step, rank=rank, data_state=loader.state_dict(), meta=meta)
        ray.train.report({"step": step, **metrics}, checkpoint=ray.train.Checkpoint.from_directory(tmp),
                         checkpoint_dir_name=name)
    if logger is not None:
        logger.flush()
        logger.set_tag("checkpoint.latest", storage.join(run_dir, name))
        logger.log(step, {"checkpoint_step": float(step)})


def _export(arch, *, step: int, rank: int, run_dir: str, cfg: PretrainConfig, meta: dict) -> dict:
    """Student and teacher backbones as official-layout safetensors under ``<run>/export``."""
    fs, root = storage.resolve(run_dir)
    local = storage.is_local(fs)
    out = Path(storage.join(root, EXPORT_DIR)) if local else Path(tempfile.mkdtemp(prefix="pretrain-export-"))
    out.mkdir(parents=True, exist_ok=True)
    info = {}
    for role in ("student", "teacher"):
        path = out / f"{role}_backbone.safetensors"
        digest = checkpoint.export_backbone(getattr(arch, role)["backbone"], path, rank=rank,
                                            metadata={**meta, "role": role, "step": step, "format": "sapiens2-official"})
        target = storage.join(root, EXPORT_DIR, path.name)
        if rank == 0 and not local:
            import pyarrow.fs as pafs

            pafs.copy_files(str(path), target, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        info[f"export_{role}"] = storage.to_uri(fs, target)
        info[f"export_{role}_sha256"] = digest or ""
    if rank == 0:
        manifest = {"step": step, **meta, **info}
        storage.atomic_write_bytes(fs, storage.join(root, EXPORT_DIR, EXPORT_MANIFEST),
                                   json.dumps(manifest, indent=2).encode())
    return info
