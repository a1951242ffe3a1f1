"""FLOPs of one training step, counted with ``FlopCounterMode`` on the meta device.

Distillation: the frozen teacher's forward on the G global views, the student's forward on
the same views (masked, with its MAE decoder, when the MAE term is on) and its projection
heads; backward as twice the student's forward.

Per sample: teacher forward on the G full global views; student forward on the G
masked global views (visible tokens only, after a full patch embedding), the L local
views, the MAE decoder (all P positions) and the DINO head on G + L CLS tokens; the
student's backward is counted as twice its forward (the usual 6ND convention:
activation-checkpoint recomputation is not useful work and is not counted). Sapiens v1's
MAE has no teacher, local views or DINO head: its step is 3x (masked encoder + decoder).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from models.pretrain_heads import DINOHead, MAEDecoder, MAEDecoderConfig
from models.registry import family_of, get_config
from models.sapiens1 import Sapiens1Backbone, Sapiens1MAEDecoder
from models.sapiens2 import Sapiens2Backbone
from training.config import PretrainConfig, TrainConfig
from training.distill_config import DistillConfig
from training.meta_arch import DistillMetaArch


@dataclass(frozen=True)
class StepCost:
    """FLOPs and patch tokens of one training step of one rank's batch."""

    flops: int  # per step, one rank's batch
    tokens: int  # patch tokens through the encoders per step, one rank's batch
    teacher_flops: int
    student_forward_flops: int


def tokens_per_step(cfg: TrainConfig, batch: int) -> int:
    """Patch tokens through the encoders per step and rank: teacher G*P, student G*V + L*P_local
    (Sapiens v1: the student's G*V alone, there is no teacher; distillation without the MAE
    term: the student sees all G*P)."""
    s = get_config(cfg.model).feature_stride
    (H, W), (h, w) = cfg.crops.global_size, cfg.crops.local_size
    P, P_local = (H // s) * (W // s), (h // s) * (w // s)
    V = P - int(round(cfg.masking.ratio * P))
    if isinstance(cfg, DistillConfig) and not cfg.loss.mae_weight:
        V = P
    teacher = P if family_of(cfg.model) == "sapiens2" else 0
    return batch * (cfg.crops.num_global * (teacher + V) + cfg.crops.num_local * P_local)


def _count(fn) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _meta(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype)


def _mae_step_cost(cfg: PretrainConfig, batch: int) -> StepCost:
    """Sapiens v1: patch embedding of the full views, the blocks on CLS + V visible tokens,
    the decoder on every position; no teacher."""
    bcfg = get_config(cfg.model).as_pretrain(cfg.crops.global_size)
    G, (H, W), s = cfg.crops.num_global, cfg.crops.global_size, bcfg.feature_stride
    P = (H // s) * (W // s)
    V = P - int(round(cfg.masking.ratio * P))
    with torch.device("meta"):
        backbone = Sapiens1Backbone(bcfg)
        decoder = Sapiens1MAEDecoder(
            bcfg.embed_dim,
            pixels_per_token=s * s * bcfg.in_chans,
            grid_hw=(H // s, W // s),
            embed_dim=cfg.decoder.embed_dim,
            depth=cfg.decoder.depth,
            num_heads=cfg.decoder.num_heads,
        )

    def masked_encoder():
        backbone.embed(_meta(G * batch, 3, H, W))
        x = _meta(G * batch, 1 + V, bcfg.embed_dim)
        for block in backbone.layers:
            x = block(x)
        backbone.ln1(x)

    student = _count(masked_encoder)
    student += _count(
        lambda: decoder(
            _meta(G * batch, 1 + V, bcfg.embed_dim), _meta(G * batch, V, dtype=torch.long), (H // s, W // s), 1
        )
    )
    return StepCost(
        flops=3 * student, tokens=tokens_per_step(cfg, batch), teacher_flops=0, student_forward_flops=student
    )


def step_cost(cfg: TrainConfig, batch: int) -> StepCost:
    """FLOPs of one rank's step (``batch`` samples) for ``cfg``'s objective."""
    if isinstance(cfg, DistillConfig):
        return _distill_step_cost(cfg, batch)
    if family_of(cfg.model) == "sapiens1":
        return _mae_step_cost(cfg, batch)
    return _sapiens2_step_cost(cfg, batch)


def _distill_step_cost(cfg: DistillConfig, batch: int) -> StepCost:
    """The frozen teacher on the G global views; the student on the same views (the masked ones
    with the MAE term, plus its decoder) and its projection heads on every token it encodes."""
    with torch.device("meta"):
        teacher = Sapiens2Backbone(get_config(cfg.teacher.model))
        student = DistillMetaArch.build_student(cfg)
    backbone, bcfg = student["backbone"], student["backbone"].config
    G, (H, W), s = cfg.crops.num_global, cfg.crops.global_size, bcfg.feature_stride
    P, prefix, D = (H // s) * (W // s), 1 + bcfg.num_storage_tokens, bcfg.embed_dim
    V = P - int(round(cfg.masking.ratio * P)) if cfg.loss.mae_weight else P
    rows = G * batch
    teacher_flops = _count(lambda: teacher(_meta(rows, 3, H, W)))
    if cfg.loss.mae_weight:
        decoder = student["mae_decoder"]
        flops = masked_encoder_flops(backbone, rows, (H, W), V)
        flops += _count(
            lambda: decoder(_meta(rows, prefix + V, D), _meta(rows, V, dtype=torch.long), (H // s, W // s), prefix)
        )
    else:
        flops = _count(lambda: backbone(_meta(rows, 3, H, W)))
    flops += _count(lambda: (student["cls_proj"](_meta(rows, D)), student["patch_proj"](_meta(rows, V, D))))
    return StepCost(
        flops=teacher_flops + 3 * flops,
        tokens=tokens_per_step(cfg, batch),
        teacher_flops=teacher_flops,
        student_forward_flops=flops,
    )


def _sapiens2_modules(cfg: PretrainConfig) -> tuple[Sapiens2Backbone, DINOHead, MAEDecoder]:
    """Backbone, DINO head and MAE decoder of ``cfg`` on the meta device."""
    bcfg = get_config(cfg.model)
    s = bcfg.feature_stride
    with torch.device("meta"):
        backbone = Sapiens2Backbone(bcfg)
        head = DINOHead(
            bcfg.embed_dim,
            num_prototypes=cfg.loss.num_prototypes,
            hidden_dim=cfg.loss.head_hidden_dim,
            bottleneck_dim=cfg.loss.head_bottleneck_dim,
            num_layers=cfg.loss.head_layers,
        )
        decoder = MAEDecoder(
            bcfg.embed_dim,
            pixels_per_token=s * s * bcfg.in_chans,
            config=MAEDecoderConfig(
                embed_dim=cfg.decoder.embed_dim, depth=cfg.decoder.depth, num_heads=cfg.decoder.num_heads
            ),
        )
    return backbone, head, decoder


def masked_encoder_flops(backbone: Sapiens2Backbone, rows: int, hw: tuple[int, int], visible: int) -> int:
    """A Sapiens2 MAE encoder pass over ``rows`` images of size ``hw``: the patch embedding of
    the full image, then the blocks and the final norm on the prefix and ``visible`` grid tokens."""
    bcfg = backbone.config
    prefix = 1 + bcfg.num_storage_tokens

    def run():
        backbone.embed(_meta(rows, 3, *hw))
        rope_dtype = backbone.rope_embed.table_dtype
        x = _meta(rows, prefix + visible, bcfg.embed_dim)
        rope = (_meta(visible, bcfg.head_dim, dtype=rope_dtype), _meta(visible, bcfg.head_dim, dtype=rope_dtype))
        for block in backbone.blocks:
            x = block(x, rope)
        backbone.ln1(x)

    return _count(run)


def _sapiens2_step_cost(cfg: PretrainConfig, batch: int) -> StepCost:
    """Teacher on the G full global views (+ DINO head); student on the masked global views,
    the MAE decoder on every position, the L local views and the DINO head on G + L CLS tokens."""
    backbone, head, decoder = _sapiens2_modules(cfg)
    bcfg = backbone.config
    G, L = cfg.crops.num_global, cfg.crops.num_local
    (H, W), (h, w) = cfg.crops.global_size, cfg.crops.local_size
    s, prefix, D = bcfg.feature_stride, 1 + bcfg.num_storage_tokens, bcfg.embed_dim
    P = (H // s) * (W // s)
    V = P - int(round(cfg.masking.ratio * P))
    teacher = _count(lambda: (backbone(_meta(G * batch, 3, H, W)), head(_meta(G * batch, D))))
    student = masked_encoder_flops(backbone, G * batch, (H, W), V)
    student += _count(
        lambda: decoder(
            _meta(G * batch, prefix + V, D), _meta(G * batch, V, dtype=torch.long), (H // s, W // s), prefix
        )
    )
    if L:
        student += _count(lambda: backbone(_meta(L * batch, 3, h, w)))
    student += _count(lambda: head(_meta((G + L) * batch, D)))
    return StepCost(
        flops=teacher + 3 * student,
        tokens=tokens_per_step(cfg, batch),
        teacher_flops=teacher,
        student_forward_flops=student,
    )


PEAK_BF16_TFLOPS = {
    "GB200": 2500.0,
    "B200": 2250.0,
    "H200": 989.0,
    "H100": 989.0,
    "H800": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
}  # first match wins: longer names first


def peak_tflops(configured: float, device: torch.device) -> float | None:
    """Dense bf16 peak per device: the configured value, else looked up by GPU name."""
    if configured > 0:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in name:
            return value
    return None
