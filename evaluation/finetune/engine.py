"""One process's fine-tune: build (backbone + head, sharded when a device mesh is given),
train step by step, evaluate, export. ``loop.finetune_worker`` runs it under Ray Train; tests
and benchmarks can run it in a plain process (``mesh=None``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from evaluation.finetune.config import FinetuneConfig
from evaluation.finetune.data import TrainSet
from evaluation.finetune.optim import backbone_factor, base_lr, build_optimizer, set_step_lr
from evaluation.finetune.pose_eval import flip_heatmaps
from evaluation.finetune.tasks import FinetuneModel, TaskInputs, backbone_blocks, build_model
from evaluation.tasks import TASKS
from training.step import NonFiniteLossError, clip_gradients


def load_backbone(cfg: FinetuneConfig, device: torch.device) -> nn.Module:
    """The backbone with ``backbone.checkpoint``'s weights, or initialised from the seed."""
    from models import build_backbone

    bb = cfg.backbone
    if bb.checkpoint:
        return build_backbone(bb.name, weights=bb.checkpoint, weights_prefix=bb.weights_prefix)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return build_backbone(bb.name)


def shard(model: FinetuneModel, mesh, cfg_parallel) -> None:
    """Activation checkpointing / compile per block, then FSDP2 per block, sub-model and root
    (``training.parallelize``'s order and mixed-precision policy); ``mesh=None``: no sharding."""
    from training.parallelize import apply_activation_checkpointing, mp_policy

    blocks = backbone_blocks(model.backbone)
    if cfg_parallel.activation_checkpointing:
        apply_activation_checkpointing(blocks)
    if cfg_parallel.compile:
        for block in blocks:
            block.compile(fullgraph=False)
    if mesh is None:
        return
    from torch.distributed.fsdp import fully_shard

    policy, reshard = mp_policy(cfg_parallel.precision), cfg_parallel.reshard_after_forward
    units = list(blocks) if cfg_parallel.shard_blocks else []
    for unit in [*units, model.backbone, model.decode_head, model]:
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)


@dataclass
class Finetuner:
    cfg: FinetuneConfig
    task: str
    inputs: TaskInputs
    model: FinetuneModel
    optimizer: torch.optim.Optimizer
    train_set: TrainSet
    val_set: object
    loss_fn: object
    device: torch.device
    sharded: bool

    @property
    def settings(self):
        return self.cfg.task(self.task)

    def autocast(self):
        # Sharded: FSDP2's policy casts; unsharded: autocast (bf16 on the CPU is slow but works).
        on = self.cfg.parallel.precision == "bf16" and not self.sharded
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=on)


def task_settings(cfg: FinetuneConfig, task: str, inputs: TaskInputs):
    """The task section, with the vocabulary's class weights where the section names none."""
    s = cfg.task(task)
    weights = getattr(inputs.vocab, "class_weights", ())
    if task == "seg" and weights and not s.class_weights:
        s = dataclasses.replace(s, class_weights=list(weights))
    return s


def build_finetuner(
    cfg: FinetuneConfig, task: str, inputs: TaskInputs, *, device: torch.device, mesh=None
) -> Finetuner:
    cfg = dataclasses.replace(cfg, **{task: task_settings(cfg, task, inputs)})
    s = cfg.task(task)
    train_ds, val_ds = TASKS[task].datasets(s, inputs.data)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task, train_ds, load_backbone(cfg, device))
    model.train().requires_grad_(True)
    num_layers = model.num_layers
    shard(model, mesh, cfg.parallel)
    if mesh is None:
        model.to(device)
    optimizer = build_optimizer(model, num_layers, cfg.optim)
    return Finetuner(
        cfg=cfg,
        task=task,
        inputs=inputs,
        model=model,
        optimizer=optimizer,
        train_set=TrainSet(task, train_ds, cfg.augment, inputs.vocab, cfg.seed),
        val_set=val_ds,
        loss_fn=TASKS[task].loss(s, train_ds),
        device=device,
        sharded=mesh is not None,
    )


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _mean_over_ranks(x: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(x)
        x = x / dist.get_world_size()
    return x


def train_step(ft: Finetuner, batch: dict, step: int) -> dict[str, float]:
    """One AdamW step at 0-based ``step``: returns loss (mean over ranks), lr, grad_norm."""
    lr, backbone = base_lr(step, ft.cfg.steps, ft.cfg.optim), backbone_factor(step, ft.cfg.optim)
    set_step_lr(ft.optimizer, lr, backbone)
    ft.optimizer.zero_grad(set_to_none=True)
    batch = _to(batch, ft.device)
    with ft.autocast():  # a frozen backbone (LP-FT) gets no gradients: AdamW leaves it and its moments alone
        out = ft.model(batch["image"], train_backbone=backbone > 0)
    loss = ft.loss_fn({k: v.float() for k, v in out.items()}, batch)
    mean = float(_mean_over_ranks(loss.detach().float().clone()))
    if mean != mean or abs(mean) == float("inf"):
        raise NonFiniteLossError(f"{ft.task} step {step + 1}: non-finite loss {mean}; the step was stopped")
    loss.backward()
    params = [p for g in ft.optimizer.param_groups for p in g["params"]]
    grad_norm = float(clip_gradients(params, ft.cfg.optim.clip_grad))
    if grad_norm != grad_norm or grad_norm == float("inf"):
        raise NonFiniteLossError(f"{ft.task} step {step + 1}: non-finite gradient norm (loss {mean})")
    ft.optimizer.step()
    return {"loss": mean, "lr": lr, "grad_norm": grad_norm}


@torch.no_grad()
def predict(ft: Finetuner, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """Eval-mode outputs (pose with ``flip_test``: averaged with the mirrored crop's)."""
    with ft.autocast():
        out = {k: v.float() for k, v in ft.model(images.to(ft.device)).items()}
        if ft.task == "pose" and ft.cfg.flip_test:
            flipped = ft.model(images.to(ft.device).flip(-1))["heatmaps"].float()
            out["heatmaps"] = (out["heatmaps"] + flip_heatmaps(flipped, ft.inputs.vocab.flip_indices)) / 2
    return {k: v.cpu() for k, v in out.items()}


def evaluate(ft: Finetuner):
    """The task's evaluator over the validation set (every rank runs the forwards: FSDP's
    collectives need them all); returns it (``compute()`` for the metrics, ``visuals()``)."""
    evaluator = TASKS[ft.task].evaluator(ft.settings, ft.val_set)
    ft.model.eval()
    for batch in DataLoader(ft.val_set, batch_size=ft.settings.eval_batch_size, shuffle=False):
        evaluator.update(predict(ft, batch["image"]), batch)
    ft.model.train()
    return evaluator
