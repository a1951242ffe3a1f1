"""Settings of a fine-tuning run. Defaults fine-tune the tiny backbone on the synthetic set;
``configs/finetune_*.yaml`` override them and ``key=value`` overrides go on top.

The recipe defaults are the reference's (``shared/reference/sapiens1_reference.json``
``finetune.common``): AdamW (0.9, 0.999), weight decay 0.1, layer-wise decay 0.85, gradient
clipping at 1.0, linear warm-up from 0.001 x lr, then poly (power 1) decay to 0
(``schedule=multistep``: the pose configs' x0.1 at 170/210 and 200/210 of the run).

Each task in ``tasks`` is its own fine-tune (its own model, Ray Train run and checkpoints,
under ``<output_dir>/<task>``), run one after another. A task's data come from its section
(``pose``, ``seg``, ...: the probe suite's data settings, ``evaluation.config``); of that
section the data paths, ``image_size``, ``head_hidden_dim``, ``eval_batch_size``,
``max_*_samples``, ``num_visuals`` and the task's own options (heatmap sigma, person boxes,
classes) are used; its probe schedule (``steps``, ``lr``...) is not: this file's is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Literal

from evaluation.config import BackboneConfig, ProbePoseConfig, ProbeSegConfig, ProbeTaskConfig, SyntheticConfig
from infra.ray_runtime import RayConfig, ray_section
from infra.tracking import TrackingConfig, tracking_section
from training.config import CheckpointConfig, ParallelConfig

FINETUNE_TASKS = ("pose", "seg", "depth", "normal", "pointmap", "albedo")


@dataclasses.dataclass(kw_only=True)
class FinetuneOptim:
    """AdamW over layer-wise lr decay groups (``optim``): ``layer_decay`` per block (embeddings
    lowest, head 1.0), ``warmup_steps`` from ``warmup_start_factor``, then ``schedule`` (``poly``
    with ``poly_power``, ``multistep`` at ``milestones`` (fractions of the steps) by ``gamma``, or
    ``cosine``); ``clip_grad`` 0 = no clipping; the backbone's extra lr factor and LP-FT's frozen
    first steps below."""

    lr: float = 5e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    layer_decay: float = 0.85  # per-block lr factor (embeddings lowest, head 1.0)
    clip_grad: float = 1.0  # 0 = no clipping
    warmup_steps: int = 500
    warmup_start_factor: float = 0.001
    schedule: Literal["poly", "multistep", "cosine"] = "poly"
    poly_power: float = 1.0
    milestones: list[float] = field(default_factory=lambda: [170 / 210, 200 / 210])  # fractions of steps
    gamma: float = 0.1
    # The backbone's embeddings and blocks (LLRD layers 0..L; the final norm goes with the head):
    # an extra lr factor, and LP-FT (linear probe, then fine-tune): lr 0 for the first
    # ``freeze_backbone_steps`` steps (the head alone, as a probe), then a linear ramp over
    # ``warmup_steps`` steps. Defaults (1.0, 0): the reference's recipe.
    backbone_lr_scale: float = 1.0
    freeze_backbone_steps: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.layer_decay <= 1:
            raise ValueError(f"optim.layer_decay must be in (0, 1], got {self.layer_decay}")
        if self.lr <= 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("optim.lr must be > 0, optim.weight_decay and optim.warmup_steps >= 0")
        if not 0 < self.warmup_start_factor <= 1:
            raise ValueError(f"optim.warmup_start_factor must be in (0, 1], got {self.warmup_start_factor}")
        if self.backbone_lr_scale < 0:
            raise ValueError(f"optim.backbone_lr_scale must be >= 0, got {self.backbone_lr_scale}")
        if self.freeze_backbone_steps < 0:
            raise ValueError(f"optim.freeze_backbone_steps must be >= 0, got {self.freeze_backbone_steps}")


@dataclasses.dataclass(kw_only=True)
class AugmentConfig:
    """Random scale / rotation / flip (keypoint flip pairs, left/right class swaps, mirrored
    normals and points), half-body crops (pose), photometric jitter, and compositing the
    person onto a random image of ``backgrounds`` (a folder of photos without people; seg and
    the dense tasks, which have a person mask). ``enabled=false``: none of them."""

    enabled: bool = True
    scale: tuple[float, float] = (0.75, 1.25)
    rotation_deg: float = 30.0
    rotation_prob: float = 0.6
    flip_prob: float = 0.5
    half_body_prob: float = 0.3
    photometric_prob: float = 0.5
    brightness_delta: float = 32.0
    contrast: tuple[float, float] = (0.5, 1.5)
    saturation: tuple[float, float] = (0.5, 1.5)
    hue_delta: float = 18.0
    background_prob: float = 0.5
    backgrounds: str = ""  # folder of person-free images; empty = no compositing


@dataclasses.dataclass(kw_only=True)
class FinetuneConfig:
    """``vocab``: the keypoint or class vocabulary the labels use (``models/vocab``; empty =
    the synthetic set's for synthetic data, else by the label file's keypoint count / the
    section's num_classes). ``steps``: optimiser steps per task; ``max_steps_this_session``:
    stop (with a checkpoint) after this many (0 = no limit), resumed by re-running."""

    name: str = "finetune"
    output_dir: str = ""
    seed: int = 0
    deterministic: bool = False
    tasks: list[Literal["pose", "seg", "depth", "normal", "pointmap", "albedo"]] = field(
        default_factory=lambda: ["seg"]
    )
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    feature_block: int = -1  # the block whose (normalised) map feeds the head
    steps: int = 200
    max_steps_this_session: int = 0
    batch_size_per_worker: int = 8
    loader_workers: int = 0
    flip_test: bool = True  # pose: average with the flipped crop's heatmaps
    vocab: str = ""
    optim: FinetuneOptim = field(default_factory=FinetuneOptim)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    parallel: ParallelConfig = field(default_factory=lambda: ParallelConfig(activation_checkpointing=False))
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(every=100, keep=2))
    log_every: int = 10
    pose: ProbePoseConfig = field(default_factory=ProbePoseConfig)
    seg: ProbeSegConfig = field(default_factory=ProbeSegConfig)
    depth: ProbeTaskConfig = field(default_factory=ProbeTaskConfig)
    normal: ProbeTaskConfig = field(default_factory=ProbeTaskConfig)
    pointmap: ProbeTaskConfig = field(default_factory=ProbeTaskConfig)
    albedo: ProbeTaskConfig = field(default_factory=ProbeTaskConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    tracking: TrackingConfig = tracking_section("finetuning")
    ray: RayConfig = ray_section(max_failures=0)

    def task(self, name: str) -> ProbeTaskConfig:
        return getattr(self, name)

    def validate(self) -> None:
        if not self.output_dir:
            raise ValueError("output_dir is required, e.g. output_dir=runs/finetune")
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must name each of {list(FINETUNE_TASKS)} at most once, got {self.tasks}")
        if self.steps < 1 or self.batch_size_per_worker < 1:
            raise ValueError("steps and batch_size_per_worker must be >= 1")
        if self.checkpoint.every < 1 or self.log_every < 1:
            raise ValueError("checkpoint.every and log_every must be >= 1")
        for name in self.tasks:
            s = self.task(name)
            if bool(s.train.images) != bool(s.val.images):
                raise ValueError(
                    f"{name}: set both {name}.train.images and {name}.val.images, or neither "
                    "(neither = the synthetic set)"
                )
            if s.train.images and not (s.train.labels and s.val.labels):
                raise ValueError(f"{name}: {name}.train.labels and {name}.val.labels are required with real data")
