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

from models.pretrain_heads import DINOHead, MAEDecoder, MAEDecoderConfig
from models.registry import family_of, get_config
from models.sapiens1 import Sapiens1Backbone, Sapiens1MAEDecoder
from models.sapiens2 import Sapiens2Backbone
from training.config import PretrainConfig
from training.ema import copy_params, update_ema
from training.losses import DINOLoss, KoLeoLoss, MAELoss


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
    has_teacher = True
    export_format = "sapiens2-official"  # exported backbones: the released Sapiens2 key layout

    def __init__(self, cfg: PretrainConfig) -> None:
        super().__init__()
        self.cfg = cfg
        backbone_cfg = get_config(cfg.model)
        self.num_global, self.num_local = cfg.crops.num_global, cfg.crops.num_local
        self.stride = backbone_cfg.feature_stride
        loss = cfg.loss

        def head() -> DINOHead:
            return DINOHead(
                backbone_cfg.embed_dim,
                num_prototypes=loss.num_prototypes,
                hidden_dim=loss.head_hidden_dim,
                bottleneck_dim=loss.head_bottleneck_dim,
                num_layers=loss.head_layers,
            )

        decoder_cfg = MAEDecoderConfig(
            embed_dim=cfg.decoder.embed_dim, depth=cfg.decoder.depth, num_heads=cfg.decoder.num_heads
        )
        self.student = nn.ModuleDict(
            {
                "backbone": Sapiens2Backbone(backbone_cfg),
                "dino_head": head(),
                "mae_decoder": MAEDecoder(
                    backbone_cfg.embed_dim, pixels_per_token=self.stride**2 * backbone_cfg.in_chans, config=decoder_cfg
                ),
            }
        )
        with torch.device("meta"):
            self.teacher = nn.ModuleDict({"backbone": Sapiens2Backbone(backbone_cfg), "dino_head": head()})
        self.teacher.requires_grad_(False)
        self.mae_loss = MAELoss(self.stride, norm_pix=loss.norm_pix)
        self.dino_loss = DINOLoss(
            loss.num_prototypes, student_temp=loss.student_temp, center_momentum=loss.center_momentum
        )
        self.koleo_loss = KoLeoLoss()

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

    has_teacher = False
    export_format = "sapiens1-pretrain-clean"  # the released *_clean.pth keys: cls_token, [1, 1+P, D] table

    def __init__(self, cfg: PretrainConfig) -> None:
        super().__init__()
        self.cfg = cfg
        backbone_cfg = get_config(cfg.model).as_pretrain(cfg.crops.global_size)
        self.num_global = cfg.crops.num_global
        self.stride = backbone_cfg.feature_stride
        h, w = cfg.crops.global_size
        self.student = nn.ModuleDict(
            {
                "backbone": Sapiens1Backbone(backbone_cfg),
                "mae_decoder": Sapiens1MAEDecoder(
                    backbone_cfg.embed_dim,
                    pixels_per_token=self.stride**2 * backbone_cfg.in_chans,
                    grid_hw=(h // self.stride, w // self.stride),
                    embed_dim=cfg.decoder.embed_dim,
                    depth=cfg.decoder.depth,
                    num_heads=cfg.decoder.num_heads,
                    norm_eps=backbone_cfg.norm_eps,
                ),
            }
        )
        self.teacher = nn.ModuleDict()
        self.mae_loss = MAELoss(self.stride, norm_pix=cfg.loss.norm_pix, unbiased_var=True)

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


def build_meta_arch(cfg: PretrainConfig) -> SSLMetaArch | MAEMetaArch:
    """The objective of the model's family: Sapiens2 (MAE + CLS + KoLeo, EMA teacher) or v1 (MAE only)."""
    return MAEMetaArch(cfg) if family_of(cfg.model) == "sapiens1" else SSLMetaArch(cfg)
