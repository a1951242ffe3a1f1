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
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

import training.checkpoint as checkpoint
from infra import jsonl, storage
from infra.config import from_dict
from infra.tracking import MetricsLogger
from training.config import PretrainConfig, TrainConfig
from training.data import RankSpec, ResumableLoader
from training.distill_config import DistillConfig
from training.flops import peak_tflops, step_cost, tokens_per_step
from training.init import initialise
from training.meta_arch import DistillMetaArch, MAEMetaArch, SSLMetaArch, build_meta_arch
from training.optim import build_optimizer
from training.parallelize import parallelize
from training.schedules import values_at
from training.step import train_step
from training.visualize import reconstruction_grid

log = logging.getLogger(__name__)

EXPORT_DIR = "export"
EXPORT_MANIFEST = "export.json"
CONFIG_CLASSES: dict[str, type[TrainConfig]] = {c.objective: c for c in (PretrainConfig, DistillConfig)}
"""The config class of each objective (``TrainConfig.objective``), as the driver's payload names it."""


def set_determinism(cfg: TrainConfig, device: torch.device) -> None:
    """Before anything is built on this rank: the seed, on CPU the thread count, and with
    ``cfg.deterministic`` the deterministic-algorithm flags."""
    torch.manual_seed(cfg.seed)
    if device.type == "cpu":
        # Results on CPU depend on the thread count: pin it to the worker's share.
        torch.set_num_threads(max(1, int(cfg.ray.cpus_per_worker)))
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.benchmark = False


def build(cfg: TrainConfig, device: torch.device, world_size: int, *, from_files: bool = False):
    """The sharded meta-architecture and its optimiser, initialised identically on every rank.
    ``from_files``: a new run, whose student starts from ``cfg.init``'s files where set (a
    resumed run's state comes from its checkpoint instead)."""
    arch = build_meta_arch(cfg)  # student initialised on CPU from the seed; teacher (if any) on meta
    if from_files:
        initialise(arch, cfg)
    mesh = None
    if dist.is_available() and dist.is_initialized():
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world_size,))
    parallelize(arch, mesh, cfg.parallel)
    if mesh is None:
        arch.to(device)
    arch.materialize_teacher(device)
    return arch, build_optimizer(arch.student, cfg.optim)


@dataclass
class Session:
    """One rank's state in this session: what was built and restored in ``_start``, and where
    the loop is (``step``; ``last``: the latest step's values; ``tick``: when the step clock
    last started)."""

    cfg: TrainConfig
    payload: dict
    rank: int
    world: int
    device: torch.device
    arch: SSLMetaArch | MAEMetaArch | DistillMetaArch
    optimizer: torch.optim.Optimizer
    loader: ResumableLoader
    logger: MetricsLogger | None
    keys_file: Path | None
    step: int
    last: dict = field(default_factory=dict)
    tick: float = 0.0
    saved_for_notice: bool = False
    step_tokens: int = 0  # patch tokens per step (throughput)
    step_flops: float | None = None  # FLOPs per step, counted only when the device's peak is known (MFU)
    peak_tflops: float | None = None

    @property
    def run_dir(self) -> str:
        return self.payload["run_dir"]

    @property
    def meta(self) -> dict:
        return {"run_name": self.cfg.run_name, "dataset_id": self.payload["dataset"]["id"], "model": self.cfg.model}


def train_loop_per_worker(payload: dict) -> None:
    """Build, shard, restore, train (checkpointing as it goes), export."""
    import ray.train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # BackboneOutput's cls/patch_tokens are views of its tokens; nothing here modifies
    # them in place, which is what this FSDP2 warning is about.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    session = _start(from_dict(CONFIG_CLASSES[payload["objective"]], payload["config"]), payload)
    try:
        _train(session)
        cfg = session.cfg
        if session.step >= cfg.steps and cfg.checkpoint.export:
            exported = _export(
                session.arch, step=session.step, rank=session.rank, run_dir=session.run_dir, cfg=cfg, meta=session.meta
            )
            ray.train.report({"step": session.step, **session.last, **exported}, checkpoint=None)
    finally:
        session.loader.close()
        if session.logger is not None:
            session.logger.flush()


def _start(cfg: TrainConfig, payload: dict) -> Session:
    """This rank's device, the sharded model and optimiser, restored with the data position
    from the newest checkpoint, the rank's data stream, and (rank 0) the metrics logger."""
    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device("cuda", ctx.get_local_rank()) if cfg.ray.use_gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    set_determinism(cfg, device)
    restored = ray.train.get_checkpoint()
    arch, optimizer = build(cfg, device, world, from_files=restored is None)
    step, data_state = _restore(restored, arch, optimizer, rank, payload["dataset"]["id"])
    spec = RankSpec.of(cfg, rank=rank, world_size=world, patch_stride=arch.stride, pin_memory=device.type == "cuda")
    loader = ResumableLoader(
        tuple(payload["shards"]), cfg.data, spec, state=data_state, dataset_uri=payload["dataset"]["uri"]
    )
    logger = None
    if rank == 0 and payload.get("mlflow_run_id") and _tracking_reachable(payload["tracking_uri"]):
        logger = MetricsLogger(payload["tracking_uri"], payload["mlflow_run_id"], flush_every=cfg.metrics.log_every)
    keys_file = _keys_file(cfg, payload["run_dir"], rank)
    _mark_session_start(keys_file, step)
    return Session(
        cfg=cfg,
        payload=payload,
        rank=rank,
        world=world,
        device=device,
        arch=arch,
        optimizer=optimizer,
        loader=loader,
        logger=logger,
        keys_file=keys_file,
        step=step,
    )


def _restore(restored, arch, optimizer, rank: int, dataset_id: str) -> tuple[int, dict | None]:
    """(step, data position) of Ray Train's newest checkpoint ``restored``, loaded into ``arch``
    and ``optimizer``; (0, None) for a fresh run (``restored`` None)."""
    if restored is None:
        return 0, None
    with restored.as_directory() as directory:
        step, data_state, train_state = checkpoint.load(directory, arch, optimizer, rank=rank)
    if train_state.get("dataset_id") != dataset_id:
        raise ValueError(
            f"checkpoint {restored.path} was trained on dataset {train_state.get('dataset_id')}, "
            f"this run streams {dataset_id}"
        )
    log.info("rank %d resumed from %s at step %d", rank, restored.path, step)
    return step, data_state


def _keys_file(cfg: TrainConfig, run_dir: str, rank: int) -> Path | None:
    if not cfg.record_batch_keys or "://" in run_dir:
        return None
    keys_file = Path(run_dir) / "batch_keys" / f"rank_{rank:05d}.jsonl"
    keys_file.parent.mkdir(parents=True, exist_ok=True)
    return keys_file


def _mark_session_start(keys_file: Path | None, step: int) -> None:
    """Record ``{"session_start": step}``: the step this session resumed from (0: fresh)."""
    if keys_file is not None:
        jsonl.append(keys_file, {"session_start": step})


def _train(s: Session) -> None:
    """Steps until the session's end, with a checkpoint every ``checkpoint.every`` steps, at
    the end, and when Ray says a node is about to be preempted."""
    cfg = s.cfg
    s.peak_tflops = peak_tflops(cfg.peak_tflops, s.device)
    s.step_tokens = tokens_per_step(cfg, cfg.batch_size_per_worker)
    if s.peak_tflops:  # counting takes seconds
        s.step_flops = step_cost(cfg, cfg.batch_size_per_worker).flops
    session_end = cfg.steps if cfg.max_steps_this_session <= 0 else min(cfg.steps, s.step + cfg.max_steps_this_session)
    s.tick = time.perf_counter()
    while s.step < session_end:
        _one_step(s)
        if s.step % cfg.checkpoint.every == 0 or s.step == session_end:
            _save_and_report(s)
        elif _preemption_notice(cfg, s.step, s.saved_for_notice):
            log.warning(
                "rank %d: a node of this run is about to be preempted: checkpointing at step %d", s.rank, s.step
            )
            _save_and_report(s)
            s.saved_for_notice = True


def _one_step(s: Session) -> None:
    """Next batch, one optimiser step, its values (with timings and throughput) recorded."""
    cfg = s.cfg
    waited = time.perf_counter()
    batch = next(s.loader)
    data_wait = time.perf_counter() - waited
    batch = batch.to(s.device, non_blocking=True)
    images_every = cfg.metrics.images_every
    images_now = bool(s.logger and images_every and (s.step + 1) % images_every == 0)
    result = train_step(
        s.arch,
        s.optimizer,
        batch,
        values_at(cfg, s.step),
        step=s.step + 1,
        clip_grad=cfg.optim.clip_grad,
        return_viz=images_now,
    )
    s.step += 1
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)
    now = time.perf_counter()
    elapsed, s.tick = now - s.tick, now
    s.last = dict(result.values)
    s.last.update(
        step_time_s=elapsed,
        data_wait_s=data_wait,
        images_per_s=s.world * batch.size / elapsed,
        tokens_per_s=s.world * s.step_tokens / elapsed,
        **s.loader.metrics(),
    )
    if s.step_flops:
        s.last["mfu"] = s.step_flops / elapsed / (s.peak_tflops * 1e12)
    if s.keys_file is not None:
        jsonl.append(s.keys_file, {"step": s.step, "keys": batch.keys})
    if s.logger is not None:
        s.logger.log(s.step, s.last)
        if images_now and result.viz:  # a distillation without the MAE term reconstructs nothing
            grid = reconstruction_grid(result.viz, s.arch.stride, scale=max(1, 256 // cfg.crops.global_size[0]))
            s.logger.log_image(grid, f"reconstructions/step_{s.step:08d}.png")


def _tracking_reachable(uri: str) -> bool:
    """A SQLite store lives on the driver's disk: rank 0 on another node (without a shared
    file system) would silently start an empty database of its own."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        log.warning(
            "MLflow store %s is not visible from this node: no per-step metrics will be logged. "
            "Use an MLflow server (tracking.uri=http://...) for multi-node runs.",
            uri,
        )
        return False
    return True


def _preemption_notice(cfg: TrainConfig, step: int, already_saved: bool) -> bool:
    """Ask Ray (a barrier: every rank asks at the same steps) whether a node is going away."""
    every = cfg.checkpoint.preemption_check_every
    if not every or step % every or already_saved:
        return False
    import ray.train

    return ray.train.get_preemption_info() is not None


def _save_and_report(s: Session) -> None:
    """A DCP checkpoint with the data position, reported to Ray Train; the step clock restarts
    after it (checkpoint time is not step time)."""
    import ray.train

    name = f"checkpoint_{s.step:08d}"
    with tempfile.TemporaryDirectory(prefix="pretrain-ckpt-") as tmp:
        checkpoint.save(
            tmp, s.arch, s.optimizer, step=s.step, rank=s.rank, data_state=s.loader.state_dict(), meta=s.meta
        )
        ray.train.report(
            {"step": s.step, **s.last}, checkpoint=ray.train.Checkpoint.from_directory(tmp), checkpoint_dir_name=name
        )
    if s.logger is not None:
        s.logger.flush()
        s.logger.set_tag("checkpoint.latest", storage.join(s.run_dir, name))
        s.logger.log(s.step, {"checkpoint_step": float(s.step)})
    s.tick = time.perf_counter()


def _export(arch, *, step: int, rank: int, run_dir: str, cfg: TrainConfig, meta: dict) -> dict:
    """The backbones of ``arch.export_roles`` as official-layout safetensors under ``<run>/export``:
    student and teacher (Sapiens v1: the student alone, in the released pretrain ``*_clean`` key
    layout; distillation: the student alone)."""
    fs, root = storage.resolve(run_dir)
    local = storage.is_local(fs)
    out = Path(storage.join(root, EXPORT_DIR)) if local else Path(tempfile.mkdtemp(prefix="pretrain-export-"))
    out.mkdir(parents=True, exist_ok=True)
    info = {}
    inner = arch.module if hasattr(arch, "module") else arch
    for role in inner.export_roles:
        path = out / f"{role}_backbone.safetensors"
        digest = checkpoint.export_backbone(
            getattr(arch, role)["backbone"],
            path,
            rank=rank,
            metadata={**meta, "role": role, "step": step, "format": inner.export_format},
        )
        target = storage.join(root, EXPORT_DIR, path.name)
        if rank == 0 and not local:
            import pyarrow.fs as pafs

            pafs.copy_files(str(path), target, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        info[f"export_{role}"] = storage.to_uri(fs, target)
        info[f"export_{role}_sha256"] = digest or ""
    if rank == 0:
        manifest = {"step": step, **meta, **info}
        storage.atomic_write_bytes(
            fs, storage.join(root, EXPORT_DIR, EXPORT_MANIFEST), json.dumps(manifest, indent=2).encode()
        )
    return info
