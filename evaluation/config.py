"""Settings of a probe suite run. Defaults probe the tiny backbone on the synthetic set; YAML
files under ``configs/probe_*.yaml`` override them and ``key=value`` overrides go on top
(``infra.config.load_config``).

Every task has its own block (``pose``, ``seg``, ``pointmap``, ``normal``, ``albedo``,
``knn``) holding the training schedule, the frozen-feature settings and the data paths;
only the tasks listed in ``tasks`` run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Literal

from infra.ray_runtime import RayConfig, ray_section
from infra.tracking import TrackingConfig, tracking_section

TASK_NAMES = ("pose", "seg", "pointmap", "normal", "albedo", "knn")
DENSE_TASKS = ("pointmap", "normal", "albedo")


@dataclasses.dataclass(kw_only=True)
class SplitPaths:
    """Where one split of a task's data is. Empty ``images`` = the synthetic set.

    - pose: ``images`` folder, ``labels`` = COCO keypoint JSON (file names relative to ``images``).
    - seg: ``images`` folder, ``labels`` = folder of PNG class-index masks (same stems).
    - pointmap / normal / albedo: ``images`` folder, ``labels`` = folder of float maps
      (``.npy`` H x W x 3, or ``.exr``), ``masks`` = optional folder of PNG validity masks
      (non-zero = valid; without it, finite non-zero targets are valid).
    - knn: ``images`` = folder with one sub-folder per class, or with ``labels`` = a CSV
      file of ``path,label`` rows (paths relative to ``images``).
    """

    images: str = ""
    labels: str = ""
    masks: str = ""


@dataclasses.dataclass(kw_only=True)
class ProbeTaskConfig:
    """One probe: frozen features from ``feature_blocks`` feed one light head trained for
    ``steps`` AdamW steps (cosine schedule after ``warmup_steps``)."""

    steps: int = 300
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 20
    batch_size: int = 16
    eval_batch_size: int = 32
    feature_blocks: list[int] = field(default_factory=lambda: [-1])  # backbone blocks (negative = from the end)
    image_size: list[int] = field(default_factory=lambda: [128, 96])  # H, W; multiples of the feature stride
    head_hidden_dim: int = 64
    cache_features: bool = True  # extract frozen features once per split; off for big models/data sets
    max_train_samples: int = 0  # 0 = all
    max_val_samples: int = 0  # 0 = all
    num_visuals: int = 6  # validation samples drawn as overlays
    train: SplitPaths = field(default_factory=SplitPaths)
    val: SplitPaths = field(default_factory=SplitPaths)

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("steps must be >= 0 and batch sizes >= 1")
        if len(self.image_size) != 2 or min(self.image_size) < 1:
            raise ValueError(f"image_size must be [H, W], got {self.image_size}")
        if not self.feature_blocks:
            raise ValueError("feature_blocks must name at least one block, e.g. [-1]")


@dataclasses.dataclass(kw_only=True)
class ProbePoseConfig(ProbeTaskConfig):
    """Top-down pose: one crop per person box (``box_padding`` x the box, at the input's aspect)."""

    heatmap_sigma: float = 2.0  # UDP Gaussian sigma in heatmap pixels (Sapiens: 6 at 256x192)
    box_padding: float = 1.25
    sigmas: list[float] = field(default_factory=list)  # OKS sigmas; empty: COCO-17 / WholeBody-133 / from the JSON
    person_boxes: str = ""  # val: COCO detection results JSON; empty = ground-truth boxes
    box_score_threshold: float = 0.0


@dataclasses.dataclass(kw_only=True)
class ProbeSegConfig(ProbeTaskConfig):
    """Body-part segmentation probe (``seg``): ``num_classes`` 0 takes the synthetic set's (else
    required for real data), ``class_names`` for per-class IoU, ``ignore_index``, ``dice_weight``
    of the Dice term beside cross-entropy, ``class_weights`` (empty: inverse-sqrt frequency)."""

    num_classes: int = 0  # 0: from the synthetic set (7), else required for real data
    class_names: list[str] = field(default_factory=list)  # optional, for per-class IoU names
    ignore_index: int = 255
    dice_weight: float = 1.0
    class_weights: list[float] = field(default_factory=list)  # CE weights; empty = inverse-sqrt frequency


@dataclasses.dataclass(kw_only=True)
class KnnConfig(ProbeTaskConfig):
    """k-NN on the CLS token, temperature-weighted vote (DINO): no training, ``steps`` unused."""

    k: list[int] = field(default_factory=lambda: [10, 20])
    temperature: float = 0.07


@dataclasses.dataclass(kw_only=True)
class SyntheticConfig:
    """The offline probe set generated under ``<output_dir>/synthetic`` when a task has no data paths."""

    train_images: int = 160
    val_images: int = 48
    height: int = 128
    width: int = 96
    seed: int = 0


@dataclasses.dataclass(kw_only=True)
class BackboneConfig:
    """The frozen backbone (``backbone``): ``name`` a registered model, ``checkpoint`` an
    official-layout ``.safetensors``/``.pt`` (empty: random init, recorded as such),
    ``weights_prefix`` stripped from its keys, ``pretrain_run_id`` the MLflow run that made it
    (empty: found by the file's digest), ``dtype`` of the forward."""

    name: str = "sapiens2_tiny"
    checkpoint: str = ""  # official-layout .safetensors/.pt; empty = random init (recorded as such)
    weights_prefix: str = ""  # stripped from the file's keys, e.g. "backbone."
    pretrain_run_id: str = ""  # MLflow run that produced the checkpoint; empty = search by digest
    dtype: Literal["float32", "bfloat16"] = "float32"


@dataclasses.dataclass(kw_only=True)
class ProbeConfig:
    """The probe suite (``pipelines/probe.py``): frozen-backbone heads for each task in ``tasks``
    (and k-NN on the CLS token), on real data given per task or on the synthetic set, on Ray
    Train; metrics to MLflow with the backbone's lineage."""

    name: str = "probe"
    output_dir: str = ""
    seed: int = 0
    tasks: list[Literal["pose", "seg", "pointmap", "normal", "albedo", "knn"]] = field(
        default_factory=lambda: list(TASK_NAMES)
    )
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    pose: ProbePoseConfig = field(default_factory=ProbePoseConfig)
    seg: ProbeSegConfig = field(default_factory=ProbeSegConfig)
    pointmap: ProbeTaskConfig = field(default_factory=ProbeTaskConfig)
    normal: ProbeTaskConfig = field(default_factory=ProbeTaskConfig)
    albedo: ProbeTaskConfig = field(default_factory=ProbeTaskConfig)
    knn: KnnConfig = field(default_factory=KnnConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # tracking.run_name None: the output folder's name.
    tracking: TrackingConfig = tracking_section("probing")
    # One Ray Train worker runs every probe in turn (num_workers must stay 1); cpus_per_worker
    # below the machine's count leaves CPUs free, or Ray Train can hang on small machines.
    # max_failures 0: a failed probe fails the suite at once (Ray Train's own default, which
    # the suite has always run with); re-running redoes the probes.
    ray: RayConfig = ray_section(max_failures=0)

    def task(self, name: str) -> ProbeTaskConfig:
        return getattr(self, name)

    def validate(self) -> None:
        """Checks that need the whole config (called before any work starts)."""
        if not self.output_dir:
            raise ValueError("output_dir is required, e.g. output_dir=runs/probe")
        if self.ray.num_workers != 1:
            raise ValueError(
                f"ray.num_workers={self.ray.num_workers}: the probe suite runs in one Ray Train worker "
                "(probes run one after another on one backbone); set ray.num_workers=1"
            )
        if not self.tasks:
            raise ValueError(f"tasks is empty; choose from {list(TASK_NAMES)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks lists a task twice: {self.tasks}")
        for name in self.tasks:
            s = self.task(name)
            if bool(s.train.images) != bool(s.val.images):
                raise ValueError(
                    f"{name}: set both {name}.train.images and {name}.val.images, or neither "
                    "(neither = the synthetic set)"
                )
            if s.train.images and name != "knn" and not (s.train.labels and s.val.labels):
                raise ValueError(f"{name}: {name}.train.labels and {name}.val.labels are required with real data")
        if "seg" in self.tasks and self.seg.train.images and self.seg.num_classes < 2:
            raise ValueError("seg.num_classes is required (>= 2) with real segmentation data")
