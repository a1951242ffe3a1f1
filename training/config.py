"""Settings of a training run: typed, keyword-only dataclasses. ``TrainConfig`` is what every
objective shares, ``PretrainConfig`` pretraining's (distillation's: ``training.distill_config``).

The defaults are the Sapiens2 recipe (SPEC section 3) at 1024x768: MAE + 0.4 DINO CLS loss
+ 0.04 KoLeo, EMA teacher 0.992 -> 1, 2 global + 4 local crops, mixed block/patch masking
at 0.75, AdamW lr 1e-4 wd 0.05 with warm-up + cosine. ``configs/pretrain_*.yaml`` override
what differs per size; ``configs/pretrain_tiny.yaml`` trains on a CPU in minutes.

Fields that only steer *this session* (``RESUME_FREE``) may change between a run and its
resumption; every other field is part of the run's identity and must not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from infra.config import config_digest, config_to_dict
from infra.ray_runtime import RayConfig, ray_section
from infra.tracking import TrackingConfig, tracking_section


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """Thresholds on one attribute: a sample passes when ``min <= value <= max`` (None: no
    bound on that side); a sample without a value (null) never passes."""

    min: float | None = None
    max: float | None = None


@dataclass(frozen=True, kw_only=True)
class WeightConfig:
    """A sample's weight from one attribute: ``z = scale * value + offset``, then ``linear``:
    ``w = z``; ``power``: ``w = max(z, 0) ** exponent``; ``exp``: ``w = exp(z)``; clipped to
    ``clip = (lo, hi)``. A sample without a value (null, NaN) weighs ``lo``."""

    column: str = ""
    fn: Literal["linear", "power", "exp"] = "linear"
    scale: float = 1.0
    offset: float = 0.0
    exponent: float = 1.0
    clip: tuple[float, float] = (0.0, 1.0)


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """Which samples of the version the stream draws, and how often (``training.sampling``).

    ``policy``: ``uniform`` (every sample once per epoch); ``filter`` (only the samples within
    ``filter``'s bounds: ``{column: {min, max}}`` on any sidecar column); ``weighted`` (drawn in
    proportion to ``weight``, within ``filter``'s bounds if any); ``balanced`` (hierarchical
    balancing over the version's cluster levels: uniform over the top-level clusters, then
    within each). ``cap``: weighted and balanced accept a sample with probability
    ``min(1, w / cap)``; 0 = the policy's largest weight (exact; fewer samples read than
    accepted otherwise): a lower cap accepts more of what is read at the price of flattening
    the weights above it.
    """

    policy: Literal["uniform", "filter", "weighted", "balanced"] = "uniform"
    filter: dict[str, Bounds] = field(default_factory=dict)
    weight: WeightConfig = field(default_factory=WeightConfig)
    cap: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the setting when the section cannot work (checked when it
        is built; the columns themselves are checked against the version's sidecars when the run
        starts)."""
        key = "data.sampling"
        if self.policy in ("uniform", "balanced") and self.filter:
            raise ValueError(
                f"{key}.filter is set but {key}.policy={self.policy} draws every sample: use "
                f"{key}.policy=filter (or weighted, which honours the filter too)"
            )
        if self.policy == "filter" and not self.filter:
            raise ValueError(
                f"{key}.policy=filter needs {key}.filter, e.g. {key}.filter={{aesthetic_score: {{min: 5}}}}"
            )
        for column, b in self.filter.items():
            if (b.min is None and b.max is None) or (b.min is not None and b.max is not None and b.min > b.max):
                raise ValueError(f"{key}.filter.{column} needs min <= max, at least one of them set")
        if self.policy == "weighted":
            self.weight_check()
        if self.cap < 0:
            raise ValueError(f"{key}.cap must be >= 0 (0 = the policy's largest weight), got {self.cap}")

    def weight_check(self) -> None:
        w, key = self.weight, "data.sampling.weight"
        if not w.column:
            raise ValueError(f"data.sampling.policy=weighted needs {key}.column (the sidecar column to weight by)")
        lo, hi = w.clip
        if not 0 <= lo <= hi or hi <= 0:
            raise ValueError(f"{key}.clip = {list(w.clip)} must satisfy 0 <= lo <= hi and hi > 0")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the images come from and how they are streamed.

    ``dataset``: a dataset version id, a dataset name (its latest version) or a curation
    output folder; ids and names are looked up in ``tracking_uri``, the MLflow store the
    curation recorded the version in (default: the run's own store, ``tracking.uri``; a
    separate key because a dataset may be curated into another store than the one this run
    logs to). ``shuffle_buffer``: samples held per loader worker (raw bytes).
    ``loader_workers``: decode/augment processes per training worker (0 = in the training
    process). ``sampling``: which samples are drawn and how often (``SamplingConfig``).
    """

    dataset: str = ""
    tracking_uri: str | None = None
    shuffle_buffer: int = 256
    loader_workers: int = 6
    prefetch_factor: int = 2
    mp_context: Literal["fork", "forkserver", "spawn"] = "fork"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass(frozen=True, kw_only=True)
class CropConfig:
    """Multi-crop views; sizes are (H, W) and must be multiples of the patch size.

    No colour augmentation ever touches the global views (colour is signal for the
    human-centric tasks); the local views get colour jitter, grayscale and blur.
    ``ratio``: range of the crop's aspect (w/h) relative to the output's aspect.
    """

    global_size: tuple[int, int] = (1024, 768)
    local_size: tuple[int, int] = (256, 192)
    num_global: int = 2
    num_local: int = 4
    global_scale: tuple[float, float] = (0.32, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.32)
    ratio: tuple[float, float] = (0.75, 1.3333333333333333)
    hflip_prob: float = 0.5
    local_jitter_prob: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    local_grayscale_prob: float = 0.2
    local_blur_prob: float = 0.5
    blur_sigma: tuple[float, float] = (0.1, 2.0)


@dataclass(frozen=True, kw_only=True)
class MaskingConfig:
    """MAE masking of the student's global views: blockwise with ``block_prob``, else
    patchwise; exactly ``round(ratio * P)`` patches are masked in every view."""

    ratio: float = 0.75
    block_prob: float = 0.4
    min_block_patches: int = 4
    max_block_fraction: float = 0.5
    block_aspect: tuple[float, float] = (0.3, 3.3333333333333335)


@dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """The MAE decoder (Sapiens v1: 8 layers x 512 wide)."""

    embed_dim: int = 512
    depth: int = 8
    num_heads: int = 16


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Loss weights (MAE : CLS : KoLeo = 1 : 0.4 : 0.04), the DINO head and temperatures.

    The teacher temperature rises linearly from ``warmup_teacher_temp`` to
    ``teacher_temp`` over ``teacher_temp_warmup_steps``.
    """

    mae_weight: float = 1.0
    cl_weight: float = 0.4
    koleo_weight: float = 0.04
    num_prototypes: int = 65536
    head_hidden_dim: int = 2048
    head_bottleneck_dim: int = 256
    head_layers: int = 3
    student_temp: float = 0.1
    teacher_temp: float = 0.07
    warmup_teacher_temp: float = 0.04
    teacher_temp_warmup_steps: int = 30000
    center_momentum: float = 0.9
    freeze_last_layer_steps: int = 1250
    norm_pix: bool = True


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Fused AdamW (falls back to foreach where the device has no fused kernel), linear
    warm-up then cosine to ``min_lr``; weight decay skips norms, biases and tokens."""

    lr: float = 1e-4
    min_lr: float = 1e-6
    warmup_steps: int = 10000
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    clip_grad: float = 3.0
    fused: bool = True


@dataclass(frozen=True, kw_only=True)
class TeacherConfig:
    """EMA teacher: momentum follows a cosine from ``momentum`` to ``final_momentum``."""

    momentum: float = 0.992
    final_momentum: float = 1.0


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """FSDP2 and compute settings. ``precision``: bf16 = ``MixedPrecisionPolicy(param_dtype
    =bf16, reduce_dtype=fp32)`` over fp32 master weights. ``shard_blocks``: one FSDP unit per
    transformer block (memory scales to the largest sizes); false = one unit per sub-model
    (fewer, larger collectives: for small models, where per-collective latency dominates)."""

    precision: Literal["bf16", "fp32"] = "bf16"
    activation_checkpointing: bool = True
    compile: bool = False
    reshard_after_forward: bool = True
    shard_blocks: bool = True


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """DCP checkpoints every ``every`` steps (and at the end of every session), newest
    ``keep`` kept; ``export``: student/teacher backbones as official-layout safetensors at
    the end. Every ``preemption_check_every`` steps the ranks ask Ray whether a node is
    about to be preempted and, if so, checkpoint at once (0 = never ask)."""

    every: int = 1000
    keep: int = 3
    export: bool = True
    preemption_check_every: int = 10


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """What rank 0 sends to the run's MLflow record (``tracking``): every step's values,
    flushed every ``log_every`` steps; the MAE reconstruction grid every ``images_every``
    steps (0 = never)."""

    log_every: int = 10
    images_every: int = 1000


RESUME_FREE = (
    "run_name",
    "storage_path",
    "max_steps_this_session",
    "peak_tflops",
    "record_batch_keys",
    "data.dataset",
    "data.tracking_uri",
    "data.prefetch_factor",
    "data.mp_context",
    "checkpoint.keep",
    "checkpoint.export",
    "checkpoint.preemption_check_every",
    "ray.address",
    "ray.num_cpus",
    "ray.object_store_memory",
    "ray.temp_dir",
    "ray.progress_bars",
    "ray.actor_pools",
    "ray.shuffle",
    "ray.max_failures",
    "ray.timeout_s",
    "metrics",
    "tracking",
    "init",
)
"""Settings that may differ between a run and its resumption (where and how, not what).
``data.dataset`` is checked separately: it must resolve to the run's recorded version; the weight
files (``init``, a distillation's ``teacher.checkpoint``) are where, and enter by their content
(``TrainConfig.weight_files``), which must be the recorded content.
Of the ``ray`` section only ``num_workers``, ``cpus_per_worker`` (the CPU thread count) and
``use_gpu`` shape the trajectory; with the rest (and ``metrics``, ``tracking``) left out, a
run's identity digest is what it was before these sections were shared with the other stages."""


@dataclass(frozen=True, kw_only=True)
class InitConfig:
    """Weights a new run starts from (a resumed run takes its checkpoint instead and never reads
    these files again). ``backbone``: a backbone file for the student (and the EMA teacher, which
    starts as a copy of it): a released Sapiens2 or Sapiens v1 pretrain checkpoint (official
    keys, with or without a ``backbone.`` prefix) or a platform export
    (``export/student_backbone.safetensors``), checked strictly against ``model``. ``heads``: a
    platform DCP checkpoint folder (``<run>/checkpoint_<step>``) whose student heads (DINO head,
    MAE decoder, projection heads) the run starts from; without it they start fresh. Both
    enter the run's identity by their content's sha256, never by their path (and the default
    ``run_name``: a run named by default needs its files to find itself again)."""

    backbone: str = ""
    heads: str = ""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """What every training objective (pretraining, distillation) shares: the run, its data,
    views, optimiser, parallelism, checkpoints, metrics and cluster. ``steps``: total optimiser
    steps of the run; ``max_steps_this_session``: stop (with a checkpoint) after this many steps
    in this session (0 = no limit), to be resumed by re-running with the same ``run_name``.
    ``deterministic``: deterministic kernels (bit-exact resume on CPU).
    ``peak_tflops``: per-device peak for MFU (0 = look up the GPU; no MFU on CPU).
    ``record_batch_keys``: each rank appends its batch keys per step to
    ``<run>/batch_keys/rank_<r>.jsonl`` (a debugging aid for data-order checks).
    ``objective``: the MLflow stage tag and run-name prefix of the subclass's runs."""

    objective: ClassVar[str] = ""
    resume_free: ClassVar[tuple[str, ...]] = RESUME_FREE
    loss_parts: ClassVar[tuple[str, ...]] = ()  # logged as loss_<part>

    run_name: str = ""
    storage_path: str = "runs/pretrain"
    steps: int = 500000
    batch_size_per_worker: int = 8
    seed: int = 0
    deterministic: bool = False
    max_steps_this_session: int = 0
    peak_tflops: float = 0.0
    record_batch_keys: bool = False
    init: InitConfig = field(default_factory=InitConfig)
    data: DataConfig = field(default_factory=DataConfig)
    crops: CropConfig = field(default_factory=CropConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    # Ray Train scaling (num_workers, cpus_per_worker, use_gpu, max_failures, timeout_s) and
    # where the cluster is; one GPU node of 8 by default.
    ray: RayConfig = ray_section(num_workers=8, cpus_per_worker=8.0, use_gpu=True)
    tracking: TrackingConfig = tracking_section("pretrain")

    def backbone_files(self) -> dict[str, tuple[str, str]]:
        """The backbone files the run reads, by setting: (path, the model they must fit)."""
        return {"init.backbone": (self.init.backbone, self.model)} if self.init.backbone else {}

    def weight_files(self) -> dict[str, str]:
        """The weight files the run reads, by setting (those set): they enter its identity by content."""
        return {k: v for k, v in (("init.backbone", self.init.backbone), ("init.heads", self.init.heads)) if v}

    def _validate_views(self, stride: int) -> None:
        """The dataset reference, the crop sizes and the masking, for a model of ``stride``."""
        if not self.data.dataset:
            raise ValueError(
                "data.dataset is empty: give a dataset version id, a dataset name or a curation output folder"
            )
        for name, (h, w) in (
            ("crops.global_size", self.crops.global_size),
            ("crops.local_size", self.crops.local_size),
        ):
            if h % stride or w % stride or h <= 0 or w <= 0:
                raise ValueError(f"{name} = {h}x{w} must be positive multiples of the model's stride {stride}")
        if self.crops.num_local < 0:
            raise ValueError("crops.num_local must be >= 0")
        if not 0.0 < self.masking.ratio < 1.0:
            raise ValueError(f"masking.ratio must lie in (0, 1), got {self.masking.ratio}")
        h, w = self.crops.global_size
        if round(self.masking.ratio * (h // stride) * (w // stride)) >= (h // stride) * (w // stride):
            raise ValueError(
                "masking.ratio masks every patch of the global view: lower it or enlarge crops.global_size"
            )

    def _validate_schedule(self) -> None:
        """Steps, batch, checkpoints, loader, optimiser, metrics and tracking."""
        if self.steps < 1 or self.batch_size_per_worker < 1:
            raise ValueError("steps and batch_size_per_worker must be >= 1")
        if self.checkpoint.every < 1 or self.checkpoint.keep < 1 or self.checkpoint.preemption_check_every < 0:
            raise ValueError(
                "checkpoint.every and checkpoint.keep must be >= 1, checkpoint.preemption_check_every >= 0"
            )
        if self.data.shuffle_buffer < 1 or self.data.loader_workers < 0:
            raise ValueError("data.shuffle_buffer must be >= 1 and data.loader_workers >= 0")
        if self.optim.warmup_steps < 0 or self.optim.lr <= 0:
            raise ValueError("optim.lr must be > 0 and optim.warmup_steps >= 0")
        if self.metrics.log_every < 1 or self.metrics.images_every < 0:
            raise ValueError("metrics.log_every must be >= 1 and metrics.images_every >= 0")
        if not self.tracking.enabled:
            raise ValueError(
                "tracking.enabled=false: a training run keeps its losses, resume record and lineage "
                "in MLflow; leave tracking enabled (tracking.uri chooses the store)"
            )


@dataclass(frozen=True, kw_only=True)
class PretrainConfig(TrainConfig):
    """A pretraining run. The model's family picks the objective: a Sapiens2 model trains
    with the defaults' recipe, a Sapiens v1 model (``sapiens_*``) with MAE alone (no teacher,
    CLS or KoLeo loss; ``configs/pretrain_v1_*.yaml``). ``model`` is the student's (and the EMA
    teacher's) backbone."""

    objective: ClassVar[str] = "pretrain"
    loss_parts: ClassVar[tuple[str, ...]] = ("mae", "cl", "koleo")

    model: str = "sapiens2_0.4b"
    loss: LossConfig = field(default_factory=LossConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the setting when the run cannot work."""
        from models.registry import family_of, get_config

        v1 = family_of(self.model) == "sapiens1"
        self._validate_views(get_config(self.model).feature_stride)
        if v1:
            self._validate_v1()
        elif self.crops.num_global < 2:
            raise ValueError("crops.num_global must be >= 2 (the CLS loss pairs each teacher view with another view)")
        self._validate_schedule()
        if self.batch_size_per_worker < 2 and self.loss.koleo_weight > 0 and not v1:
            raise ValueError("KoLeo needs batch_size_per_worker >= 2 (nearest neighbours within the batch)")
        if not v1 and (
            self.decoder.embed_dim % self.decoder.num_heads or (self.decoder.embed_dim // self.decoder.num_heads) % 4
        ):
            raise ValueError("decoder.embed_dim / decoder.num_heads must be an integer divisible by 4 (2-D RoPE)")

    def _validate_v1(self) -> None:
        """Sapiens v1 (a ``sapiens_*`` model): MAE only, on ``crops.num_global`` masked views."""
        if self.crops.num_global < 1:
            raise ValueError("crops.num_global must be >= 1 (the views the MAE reconstructs)")
        if self.crops.num_local:
            raise ValueError(
                f"crops.num_local = {self.crops.num_local}: Sapiens v1 pretraining is MAE only and "
                "uses no local views; set crops.num_local=0"
            )
        if self.decoder.embed_dim % self.decoder.num_heads or self.decoder.embed_dim % 4:
            raise ValueError("decoder.embed_dim must be divisible by decoder.num_heads and by 4 (2-D sin-cos table)")


def identity_dict(cfg: TrainConfig) -> dict:
    """The settings that define a run's trajectory (all but ``cfg.resume_free``). ``data.sampling``
    at its default (uniform) is left out too: such a run streams what runs made before the
    section existed, and keeps their identity."""
    d = config_to_dict(cfg)
    for dotted in cfg.resume_free:
        node, *rest = dotted.split(".")
        if rest:
            d[node].pop(rest[0], None)
        else:
            d.pop(node, None)
    if cfg.data.sampling == SamplingConfig():
        d["data"].pop("sampling")
    return d


def identity_digest(cfg: TrainConfig) -> str:
    return config_digest(identity_dict(cfg))


def default_run_name(cfg: TrainConfig, weight_digests: dict[str, str] | None = None) -> str:
    """``<objective>-<model>-<digest of the run-defining settings, the dataset reference and the
    weight files' sha256 (``weight_digests``, setting -> sha256)>``: re-running the same command resumes."""
    parts = {"identity": identity_dict(cfg), "dataset": cfg.data.dataset}
    if weight_digests:
        parts["weights"] = weight_digests
    return f"{cfg.objective}-{cfg.model.replace('.', '')}-{config_digest(parts)[:10]}"


def with_run_name(cfg: TrainConfig, weight_digests: dict[str, str] | None = None) -> TrainConfig:
    return cfg if cfg.run_name else dataclasses.replace(cfg, run_name=default_run_name(cfg, weight_digests))
