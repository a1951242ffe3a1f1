"""The Ray Train worker of one fine-tune task: build, restore the newest checkpoint, train with
a DCP checkpoint every ``checkpoint.every`` steps (and at the session's end), then evaluate and
export. Every rank takes the same control path (the collectives require it); rank 0 writes
the step history (``history.jsonl``, one line per step, replayed steps again after a resume),
logs to MLflow, writes the overlays and the export.

Export: ``<task dir>/export/model.safetensors`` in the released layout (``backbone.`` +
``decode_head.`` keys), its sha256 in ``export.json`` and in the final report.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import warnings
from pathlib import Path

import torch

import training.checkpoint as checkpoint
from evaluation.config import SplitPaths
from evaluation.finetune.config import FinetuneConfig
from evaluation.finetune.data import train_loader
from evaluation.finetune.engine import Finetuner, build_finetuner, evaluate, train_step
from evaluation.finetune.tasks import TaskInputs
from evaluation.tasks import TaskData
from evaluation.visualize import save_png
from infra import jsonl
from infra.config import from_dict
from infra.tracking import MetricsLogger
from training.loop import set_determinism

log = logging.getLogger("evaluation.finetune")
HISTORY = "history.jsonl"
EXPORT_DIR, EXPORT_FILE, EXPORT_MANIFEST = "export", "model.safetensors", "export.json"


def _context(cfg: FinetuneConfig):
    """(rank, world, device, mesh) of this Ray Train worker."""
    import ray.train
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device("cuda", ctx.get_local_rank()) if cfg.ray.use_gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = None
    if dist.is_available() and dist.is_initialized():
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
    return rank, world, device, mesh


def _restore(ft: Finetuner, rank: int) -> int:
    import ray.train

    restored = ray.train.get_checkpoint()
    if restored is None:
        return 0
    with restored.as_directory() as directory:
        step, _, _ = checkpoint.load(directory, ft.model, ft.optimizer, rank=rank)
    log.info("rank %d resumed %s from %s at step %d", rank, ft.task, restored.path, step)
    return step


def finetune_worker(payload: dict) -> None:
    """Ray Train loop for one task; ``payload``: config, task, its data and vocabulary, task
    folder, MLflow run (see ``evaluation.finetune.run``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    cfg = from_dict(FinetuneConfig, payload["config"])
    rank, world, device, mesh = _context(cfg)
    set_determinism(cfg, device)
    inputs = TaskInputs(task_data(payload["data"]), _vocab(payload))
    ft = build_finetuner(cfg, payload["task"], inputs, device=device, mesh=mesh)
    step = _restore(ft, rank)
    logger = None
    if rank == 0 and payload.get("mlflow_run_id"):
        logger = MetricsLogger(payload["tracking_uri"], payload["mlflow_run_id"], flush_every=cfg.log_every)
    try:
        step = _train(ft, payload, step, rank, world, logger)
        if step >= cfg.steps:
            _finish(ft, payload, rank)
    finally:
        if logger is not None:
            logger.flush()


def task_data(d: dict) -> TaskData:
    return TaskData(
        train=SplitPaths(**d["train"]),
        val=SplitPaths(**d["val"]),
        num_classes=d["num_classes"],
        class_names=d["class_names"],
    )


def _vocab(payload: dict):
    from models.vocab import keypoint_vocab, seg_vocab

    name = payload.get("vocab", "")
    if not name:
        return None
    return keypoint_vocab(name) if payload["task"] == "pose" else seg_vocab(name)


def _train(ft: Finetuner, payload: dict, step: int, rank: int, world: int, logger) -> int:
    cfg = ft.cfg
    stop = cfg.steps if cfg.max_steps_this_session <= 0 else min(cfg.steps, step + cfg.max_steps_this_session)
    loader = train_loader(
        ft.train_set,
        global_batch=cfg.batch_size_per_worker * world,
        seed=cfg.seed,
        start=step,
        stop=stop,
        rank=rank,
        world=world,
        workers=cfg.loader_workers,
    )
    history = Path(payload["task_dir"]) / HISTORY
    if rank == 0:
        jsonl.append(history, {"session_start": step})
    tick = time.perf_counter()
    for batch in loader:
        values = train_step(ft, batch, step)
        step += 1
        now = time.perf_counter()
        values.update(step_time_s=now - tick, images_per_s=world * cfg.batch_size_per_worker / (now - tick))
        if rank == 0:
            jsonl.append(history, {"step": step, **values})
            if logger is not None:
                logger.log(step, {f"{ft.task}.{k}": v for k, v in values.items()})
        if step % cfg.checkpoint.every == 0 or step == stop:
            _save(ft, step, rank, values)
        tick = time.perf_counter()
    return step


def _save(ft: Finetuner, step: int, rank: int, values: dict) -> None:
    import ray.train

    with tempfile.TemporaryDirectory(prefix="finetune-ckpt-") as tmp:
        checkpoint.save(
            tmp, ft.model, ft.optimizer, step=step, rank=rank, data_state={"step": step}, meta={"task": ft.task}
        )
        ray.train.report(
            {"step": step, **values},
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
            checkpoint_dir_name=f"checkpoint_{step:08d}",
        )


def _finish(ft: Finetuner, payload: dict, rank: int) -> None:
    """Evaluate, write overlays and metrics, export; report the metrics (no checkpoint)."""
    import ray.train

    evaluator = evaluate(ft)
    task_dir = Path(payload["task_dir"])
    metrics, info = {}, {}
    if rank == 0:
        metrics = evaluator.compute()
        for name, image in evaluator.visuals():
            save_png(task_dir / "overlays" / f"{name}.png", image)
        (task_dir / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
    info = export(ft, task_dir, rank, payload.get("meta", {}))
    ray.train.report({"step": ft.cfg.steps, "task": ft.task, **metrics, **info}, checkpoint=None)


def export(ft: Finetuner, task_dir: Path, rank: int, meta: dict) -> dict:
    """The whole model (``backbone.`` + ``decode_head.``) as safetensors; its sha256."""
    path = task_dir / EXPORT_DIR / EXPORT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        **{k: str(v) for k, v in meta.items()},
        "task": ft.task,
        "step": str(ft.cfg.steps),
        "backbone": ft.cfg.backbone.name,
        "format": "released-task-layout",
    }
    digest = checkpoint.export_backbone(ft.model, path, rank=rank, metadata=metadata)
    info = {"export": str(path), "export_sha256": digest or ""}
    if rank == 0:
        (task_dir / EXPORT_DIR / EXPORT_MANIFEST).write_text(json.dumps({"step": ft.cfg.steps, **info}, indent=1))
    return info
