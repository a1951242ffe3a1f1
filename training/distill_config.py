"""Settings of a distillation run (``pipelines/distill.py``, ``configs/distill_*.yaml``): a frozen
teacher backbone's features into a smaller student, on the pretraining machinery.

The real sizes distil ``sapiens2_5b`` / ``sapiens2_1b`` into ``sapiens2_0.4b`` / ``sapiens2_0.1b``
(the small, fast students the Sapiens2 paper names); ``configs/distill_tiny.yaml`` distils
``sapiens2_tiny`` into ``sapiens2_nano`` on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from infra.tracking import TrackingConfig, tracking_section
from training.config import RESUME_FREE, CropConfig, TrainConfig


@dataclass(frozen=True, kw_only=True)
class DistillTeacherConfig:
    """Distillation's frozen teacher: ``checkpoint`` a backbone file (a released Sapiens2 pretrain
    file, with or without a ``backbone.`` prefix, or a platform export), ``model`` the registered
    model it must fit (checked strictly before any work). The file enters the run's identity by
    its sha256 and is read again by every session (the teacher is not in the checkpoints)."""

    checkpoint: str = ""
    model: str = "sapiens2_1b"


@dataclass(frozen=True, kw_only=True)
class StudentConfig:
    """Distillation's student: a registered Sapiens2 model with fewer parameters than the teacher
    and the same patch stride; fresh, or from ``init.backbone``."""

    model: str = "sapiens2_0.1b"


@dataclass(frozen=True, kw_only=True)
class DistillLossConfig:
    """Feature distillation on the same crops: a light projection head each (student width ->
    teacher width; ``proj_hidden_dim`` 0 = one linear layer) maps the student's CLS token and
    patch tokens onto the teacher's, matched by ``cosine_weight`` * (1 - cosine) +
    ``smooth_l1_weight`` * smooth-L1 (``smooth_l1_beta``); the two token kinds weigh
    ``cls_weight`` and ``patch_weight``. ``mae_weight`` > 0 adds the MAE term: the student then
    encodes the masked global views (visible tokens only, one pass for both terms) and the patch
    term covers the visible tokens; ``norm_pix`` as in pretraining."""

    cls_weight: float = 1.0
    patch_weight: float = 1.0
    cosine_weight: float = 1.0
    smooth_l1_weight: float = 1.0
    smooth_l1_beta: float = 1.0
    mae_weight: float = 0.0
    proj_hidden_dim: int = 2048
    norm_pix: bool = True


@dataclass(frozen=True, kw_only=True)
class DistillConfig(TrainConfig):
    """A distillation run: the frozen ``teacher``'s features into a smaller ``student``, on the
    pretraining machinery (data path, loop, FSDP2, checkpoints, tracking). No local views: both
    models see the same global crops. ``model`` is the student's (the model the run trains)."""

    objective: ClassVar[str] = "distill"
    loss_parts: ClassVar[tuple[str, ...]] = ("cls", "patch", "mae")
    resume_free: ClassVar[tuple[str, ...]] = (*RESUME_FREE, "teacher.checkpoint")

    storage_path: str = "runs/distill"
    crops: CropConfig = field(default_factory=lambda: CropConfig(num_local=0))
    teacher: DistillTeacherConfig = field(default_factory=DistillTeacherConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    loss: DistillLossConfig = field(default_factory=DistillLossConfig)
    tracking: TrackingConfig = tracking_section("distill")

    @property
    def model(self) -> str:
        return self.student.model

    def backbone_files(self) -> dict[str, tuple[str, str]]:
        return {**super().backbone_files(), "teacher.checkpoint": (self.teacher.checkpoint, self.teacher.model)}

    def weight_files(self) -> dict[str, str]:
        return {**super().weight_files(), "teacher.checkpoint": self.teacher.checkpoint}

    def validate(self) -> None:
        """Raise ``ValueError`` naming the setting when the run cannot work."""
        from models.registry import count_params, family_of, get_config

        for key, name in (("teacher.model", self.teacher.model), ("student.model", self.student.model)):
            if family_of(get_config(name)) != "sapiens2":
                raise ValueError(f"{key}={name}: distillation runs between Sapiens2 models")
        teacher, student = get_config(self.teacher.model), get_config(self.student.model)
        if teacher.feature_stride != student.feature_stride:
            raise ValueError(
                f"student.model={self.student.model} has patch stride {student.feature_stride}, the teacher "
                f"{teacher.feature_stride}: their patch tokens must cover the same pixels"
            )
        if count_params(self.student.model) >= count_params(self.teacher.model):
            raise ValueError(
                f"student.model={self.student.model} is not smaller than teacher.model={self.teacher.model}"
            )
        if not self.teacher.checkpoint:
            raise ValueError("teacher.checkpoint is empty: give the teacher's backbone file (.safetensors or .pt)")
        self._validate_views(student.feature_stride)
        if self.crops.num_global < 1 or self.crops.num_local:
            raise ValueError(
                f"crops.num_global = {self.crops.num_global}, crops.num_local = {self.crops.num_local}: "
                "distillation matches the teacher on the global crops only (num_global >= 1, num_local=0)"
            )
        self._validate_schedule()
        self._validate_loss()

    def _validate_loss(self) -> None:
        w = self.loss
        weights = (w.cls_weight, w.patch_weight, w.cosine_weight, w.smooth_l1_weight, w.mae_weight)
        if min(weights) < 0 or not (w.cls_weight or w.patch_weight) or not (w.cosine_weight or w.smooth_l1_weight):
            raise ValueError(
                "loss weights must be >= 0, with loss.cls_weight or loss.patch_weight and "
                "loss.cosine_weight or loss.smooth_l1_weight above 0"
            )
        if w.smooth_l1_beta <= 0 or w.proj_hidden_dim < 0:
            raise ValueError("loss.smooth_l1_beta must be > 0 and loss.proj_hidden_dim >= 0")
        if w.mae_weight and (
            self.decoder.embed_dim % self.decoder.num_heads or (self.decoder.embed_dim // self.decoder.num_heads) % 4
        ):
            raise ValueError("decoder.embed_dim / decoder.num_heads must be an integer divisible by 4 (2-D RoPE)")
