"""Sapiens2 pretraining meta-architecture: student, EMA teacher, heads and losses.

    student: backbone -> MAE decoder (masked global views)   -> L_MAE
             backbone -> DINO head   (CLS of all views)       -> L_CL  (vs teacher)
             backbone CLS of the global views                 -> KoLeo
    teacher: backbone -> DINO head   (CLS of unmasked global views), no gradient

    L = mae_weight * L_MAE + cl_weight * L_CL + koleo_weight * KoLeo   (1 : 0.4 : 0.04)

The student encodes each masked global view from its visible tokens only (one pass
serves the MAE decoder and the CLS loss); local views are encoded unmasked. The teacher
sees the full global views. Its parameters follow the student's by EMA
(``update_teacher``); it is built on the meta device and materialised from the student
(``materialize_teacher``) after sharding, so it costs no initialisation.

Sapiens v1 (a ``sapiens_*`` model) trains with ``MAEMetaArch`` instead: MAE only, no
teacher, no CLS losses; the backbone in its pretrain layout (CLS token, frozen sin-cos
table over ``crops.global_size``) and the released MAEPretrainDecoder. ``build_meta_arch``
picks the class from the model's family; both have the same interface for the loop.

Shape legend: G global views, L local views, B samples, P grid patches, K prototypes,
D backbone width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from models.io import weight_shapes
from models.layers import init_transformer_weights
from models.pretrain_heads import DINOHead, MAEDecoder, MAEDecoderConfig
from models.registry import backbone_prefix, build_backbone, family_of, get_config
from models.sapiens1 import Sapiens1Backbone, Sapiens1MAEDecoder
from models.sapiens2 import Sapiens2Backbone
from training.config import PretrainConfig, TrainConfig
from training.distill_config import DistillConfig
from training.ema import copy_params, update_ema
from training.losses import DINOLoss, FeatureDistillLoss, KoLeoLoss, MAELoss


@dataclass
class ArchOutput:
    """``loss`` (scalar, with graph), its parts (detached fp32 scalars), the teacher's
    global logits (for the centre update) and, when asked, MAE inputs, masks and
    predictions of the first global view of up to 4 samples (for the reconstruction grid)."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor]
    teacher_logits: torch.Tensor | None
    viz: dict[str, torch.Tensor] = field(default_factory=dict)


class SSLMetaArch(nn.Module):
    export_roles = ("student", "teacher")  # the backbones a finished run exports
    export_format = "sapiens2-official"  # exported backbones: the released Sapiens2 key layout

    def __init__(self, cfg: PretrainConfig) -> None:
        super().__init__()
        self.cfg = cfg
        backbone_cfg = get_config(cfg.model)
        self.num_global, self.num_local = cfg.crops.num_global, cfg.crops.num_local
        self.stride = backbone_cfg.feature_stride
        loss = cfg.loss
        self.student = self.build_student(cfg)
        with torch.device("meta"):
            self.teacher = nn.ModuleDict({"backbone": Sapiens2Backbone(backbone_cfg), "dino_head": _dino_head(cfg)})
        self.teacher.requires_grad_(False)
        self.mae_loss = MAELoss(self.stride, norm_pix=loss.norm_pix)
        self.dino_loss = DINOLoss(
            loss.num_prototypes, student_temp=loss.student_temp, center_momentum=loss.center_momentum
        )
        self.koleo_loss = KoLeoLoss()

    @staticmethod
    def build_student(cfg: PretrainConfig) -> nn.ModuleDict:
        """The trained modules (on the current default device): backbone, DINO head, MAE decoder."""
        backbone_cfg = get_config(cfg.model)
        decoder_cfg = MAEDecoderConfig(
            embed_dim=cfg.decoder.embed_dim, depth=cfg.decoder.depth, num_heads=cfg.decoder.num_heads
        )
        pixels = backbone_cfg.feature_stride**2 * backbone_cfg.in_chans
        return nn.ModuleDict(
            {
                "backbone": Sapiens2Backbone(backbone_cfg),
                "dino_head": _dino_head(cfg),
                "mae_decoder": MAEDecoder(backbone_cfg.embed_dim, pixels_per_token=pixels, config=decoder_cfg),
            }
        )

    def ema_pairs(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(teacher params, the student params they track), in matching order."""
        teacher = list(self.teacher["backbone"].parameters()) + list(self.teacher["dino_head"].parameters())
        student = list(self.student["backbone"].parameters()) + list(self.student["dino_head"].parameters())
        return teacher, student

    @torch.no_grad()
    def materialize_teacher(self, device: torch.device | str) -> None:
        """Allocate the (possibly sharded) teacher on ``device`` and copy the student into it."""
        self.teacher.to_empty(device=device)
        for name in ("backbone", "dino_head"):
            copy_params(self.teacher[name], self.student[name])

    @torch.no_grad()
    def update_teacher(self, momentum: float) -> None:
        update_ema(*self.ema_pairs(), momentum)

    def forward(
        self,
        global_crops: torch.Tensor,
        local_crops: torch.Tensor,
        masks: torch.Tensor,
        *,
        teacher_temp: float,
        return_viz: bool = False,
    ) -> ArchOutput:
        """``global_crops`` (G*B, 3, H, W), ``local_crops`` (L*B, 3, h, w), ``masks``
        (G*B, P) bool True = masked; rows are view-major (row g*B + b)."""
        G, L = self.num_global, self.num_local
        w = self.cfg.loss

        with torch.no_grad():
            t_cls = self.teacher["backbone"](global_crops).cls
            t_logits = self.teacher["dino_head"](t_cls).float()
            t_probs = self.dino_loss.teacher_probs(t_logits, teacher_temp).chunk(G)

        backbone = self.student["backbone"]
        s_glob = backbone(global_crops, visible_mask=~masks)
        pred = self.student["mae_decoder"](s_glob.tokens, s_glob.ids_keep, s_glob.grid_hw, backbone.num_prefix_tokens)
        loss_mae = self.mae_loss(pred, global_crops, masks)

        cls = [s_glob.cls]
        if L > 0:
            cls.append(backbone(local_crops).cls)
        s_logits = self.student["dino_head"](torch.cat(cls)).float().chunk(G + L)
        loss_cl = self.dino_loss(list(s_logits), list(t_probs))

        loss_koleo = sum(self.koleo_loss(c) for c in s_glob.cls.chunk(G)) / G
        loss = w.mae_weight * loss_mae + w.cl_weight * loss_cl + w.koleo_weight * loss_koleo
        parts = {"mae": loss_mae.detach(), "cl": loss_cl.detach(), "koleo": loss_koleo.detach()}
        viz = _viz(global_crops, masks, pred, G) if return_viz else {}
        return ArchOutput(loss=loss, parts=parts, teacher_logits=t_logits.detach(), viz=viz)


def _dino_head(cfg: PretrainConfig) -> DINOHead:
    loss = cfg.loss
    return DINOHead(
        get_config(cfg.model).embed_dim,
        num_prototypes=loss.num_prototypes,
        hidden_dim=loss.head_hidden_dim,
        bottleneck_dim=loss.head_bottleneck_dim,
        num_layers=loss.head_layers,
    )


def _viz(
    global_crops: torch.Tensor, masks: torch.Tensor, pred: torch.Tensor, num_global: int
) -> dict[str, torch.Tensor]:
    """The first global view of up to 4 samples: images, masks and MAE predictions on the CPU."""
    n = min(4, global_crops.shape[0] // num_global)
    return {
        "images": global_crops[:n].detach().float().cpu(),
        "masks": masks[:n].detach().cpu(),
        "preds": pred[:n].detach().float().cpu(),
    }


class MAEMetaArch(nn.Module):
    """Sapiens v1 pretraining: the backbone encodes each masked global view from its visible
    tokens, the MAE decoder reconstructs every patch, L = L_MAE (normalised pixels, per-patch
    unbiased variance as in the released recipe) on the masked patches. No teacher: the
    EMA/centre hooks of the loop are no-ops, ``teacher`` is empty."""

    export_roles = ("student",)
    export_format = "sapiens1-pretrain-clean"  # the released *_clean.pth keys: cls_token, [1, 1+P, D] table

    def __init__(self, cfg: PretrainConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_global = cfg.crops.num_global
        self.stride = get_config(cfg.model).feature_stride
        self.student = self.build_student(cfg)
        self.teacher = nn.ModuleDict()
        self.mae_loss = MAELoss(self.stride, norm_pix=cfg.loss.norm_pix, unbiased_var=True)

    @staticmethod
    def build_student(cfg: PretrainConfig) -> nn.ModuleDict:
        """The backbone in its pretrain layout and the released MAE decoder."""
        backbone_cfg = student_backbone_config(cfg)
        s = backbone_cfg.feature_stride
        h, w = cfg.crops.global_size
        return nn.ModuleDict(
            {
                "backbone": Sapiens1Backbone(backbone_cfg),
                "mae_decoder": Sapiens1MAEDecoder(
                    backbone_cfg.embed_dim,
                    pixels_per_token=s**2 * backbone_cfg.in_chans,
                    grid_hw=(h // s, w // s),
                    embed_dim=cfg.decoder.embed_dim,
                    depth=cfg.decoder.depth,
                    num_heads=cfg.decoder.num_heads,
                    norm_eps=backbone_cfg.norm_eps,
                ),
            }
        )

    def materialize_teacher(self, device: torch.device | str) -> None:
        """No teacher to materialise."""

    def update_teacher(self, momentum: float) -> None:
        """No teacher to update."""

    def forward(
        self,
        global_crops: torch.Tensor,
        local_crops: torch.Tensor,
        masks: torch.Tensor,
        *,
        teacher_temp: float,
        return_viz: bool = False,
    ) -> ArchOutput:
        """Same call as ``SSLMetaArch``; ``local_crops`` (empty) and ``teacher_temp`` are unused."""
        backbone = self.student["backbone"]
        out = backbone(global_crops, visible_mask=~masks)
        pred = self.student["mae_decoder"](out.tokens, out.ids_keep, out.grid_hw, backbone.num_prefix_tokens)
        loss = self.mae_loss(pred, global_crops, masks)
        viz = _viz(global_crops, masks, pred, self.num_global) if return_viz else {}
        return ArchOutput(loss=loss, parts={"mae": loss.detach().float()}, teacher_logits=None, viz=viz)


class ProjectionHead(nn.Module):
    """A light per-token map from the student's width to the teacher's: one linear layer, or
    Linear -> GELU -> Linear with ``hidden_dim`` > 0 (distillation's projection heads)."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int = 0) -> None:
        super().__init__()
        layers = [nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out_dim)] if hidden_dim else []
        self.mlp = nn.Sequential(*(layers or [nn.Linear(in_dim, out_dim)]))
        init_transformer_weights(self.mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


class DistillMetaArch(nn.Module):
    """Feature distillation (``DistillConfig``): a frozen teacher backbone, loaded from its file,
    and a smaller student whose CLS and patch tokens are mapped to the teacher's width by two
    projection heads and matched to the teacher's tokens on the same global crops
    (``FeatureDistillLoss``); with ``loss.mae_weight`` > 0, the student encodes the masked views
    and an MAE decoder adds the MAE term (one student pass for both). The teacher is no EMA
    (``update_teacher`` is a no-op) and stays out of the checkpoints (``checkpoint_excludes``):
    every session reloads it from its file, whose content the run record pins."""

    export_roles = ("student",)
    export_format = "sapiens2-official"
    checkpoint_excludes = ("teacher.",)

    def __init__(self, cfg: DistillConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_global = cfg.crops.num_global
        self.stride = get_config(cfg.model).feature_stride
        self.student = self.build_student(cfg)
        teacher = build_backbone(
            cfg.teacher.model,
            weights=cfg.teacher.checkpoint,
            weights_prefix=backbone_prefix(weight_shapes(cfg.teacher.checkpoint)),
            dtype=torch.float32,
        )
        self.teacher = nn.ModuleDict({"backbone": teacher}).requires_grad_(False)
        w = cfg.loss
        self.feature_loss = FeatureDistillLoss(
            cosine_weight=w.cosine_weight, smooth_l1_weight=w.smooth_l1_weight, beta=w.smooth_l1_beta
        )
        self.mae_loss = MAELoss(self.stride, norm_pix=w.norm_pix) if w.mae_weight else None

    @staticmethod
    def build_student(cfg: DistillConfig) -> nn.ModuleDict:
        """The trained modules: student backbone, CLS and patch projection heads (and the MAE decoder)."""
        student_cfg, teacher_dim = get_config(cfg.student.model), get_config(cfg.teacher.model).embed_dim
        modules = {
            "backbone": Sapiens2Backbone(student_cfg),
            "cls_proj": ProjectionHead(student_cfg.embed_dim, teacher_dim, cfg.loss.proj_hidden_dim),
            "patch_proj": ProjectionHead(student_cfg.embed_dim, teacher_dim, cfg.loss.proj_hidden_dim),
        }
        if cfg.loss.mae_weight:
            decoder_cfg = MAEDecoderConfig(
                embed_dim=cfg.decoder.embed_dim, depth=cfg.decoder.depth, num_heads=cfg.decoder.num_heads
            )
            pixels = student_cfg.feature_stride**2 * student_cfg.in_chans
            modules["mae_decoder"] = MAEDecoder(student_cfg.embed_dim, pixels_per_token=pixels, config=decoder_cfg)
        return nn.ModuleDict(modules)

    def materialize_teacher(self, device: torch.device | str) -> None:
        """The teacher was loaded from its file when built: nothing to materialise."""

    def update_teacher(self, momentum: float) -> None:
        """A frozen teacher: no EMA."""

    def forward(
        self,
        global_crops: torch.Tensor,
        local_crops: torch.Tensor,
        masks: torch.Tensor,
        *,
        teacher_temp: float,
        return_viz: bool = False,
    ) -> ArchOutput:
        """Same call as ``SSLMetaArch``; ``local_crops`` (empty) and ``teacher_temp`` are unused,
        ``masks`` only with the MAE term."""
        w = self.cfg.loss
        with torch.no_grad():
            t = self.teacher["backbone"](global_crops)
        backbone = self.student["backbone"]
        s = backbone(global_crops, visible_mask=~masks if self.mae_loss is not None else None)
        t_patch = t.patch_tokens
        if s.ids_keep is not None:  # the teacher's tokens at the student's visible positions
            t_patch = torch.gather(t_patch, 1, s.ids_keep[..., None].expand(-1, -1, t_patch.shape[-1]))
        loss_cls = self.feature_loss(self.student["cls_proj"](s.cls), t.cls)
        loss_patch = self.feature_loss(self.student["patch_proj"](s.patch_tokens), t_patch)
        loss = w.cls_weight * loss_cls + w.patch_weight * loss_patch
        parts = {"cls": loss_cls.detach(), "patch": loss_patch.detach()}
        viz = {}
        if self.mae_loss is not None:
            pred = self.student["mae_decoder"](s.tokens, s.ids_keep, s.grid_hw, backbone.num_prefix_tokens)
            loss_mae = self.mae_loss(pred, global_crops, masks)
            loss = loss + w.mae_weight * loss_mae
            parts["mae"] = loss_mae.detach()
            viz = _viz(global_crops, masks, pred, self.num_global) if return_viz else {}
        return ArchOutput(loss=loss, parts=parts, teacher_logits=None, viz=viz)


def student_backbone_config(cfg: TrainConfig):
    """The configuration of the backbone the run trains: the registry's ``cfg.model``; for
    Sapiens v1 its pretrain layout over ``crops.global_size`` (CLS token, frozen sin-cos table)."""
    config = get_config(cfg.model)
    return config.as_pretrain(cfg.crops.global_size) if family_of(config) == "sapiens1" else config


def meta_arch_class(cfg: TrainConfig) -> type[SSLMetaArch] | type[MAEMetaArch] | type[DistillMetaArch]:
    """The objective of the config: distillation, else by the model's family Sapiens2 pretraining
    (MAE + CLS + KoLeo, EMA teacher) or v1 (MAE only)."""
    if isinstance(cfg, DistillConfig):
        return DistillMetaArch
    return MAEMetaArch if family_of(cfg.model) == "sapiens1" else SSLMetaArch


def build_meta_arch(cfg: TrainConfig) -> SSLMetaArch | MAEMetaArch | DistillMetaArch:
    return meta_arch_class(cfg)(cfg)
