"""FLOPs of one training step, counted with ``FlopCounterMode`` on the meta device.

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
from training.config import PretrainConfig


@dataclass(frozen=True)
class StepCost:
    flops: int  # per step, one rank's batch
    tokens: int  # patch tokens through the encoders per step, one rank's batch
    teacher_flops: int
    student_forward_flops: int


def tokens_per_step(cfg: PretrainConfig, batch: int) -> int:
    """Patch tokens through the encoders per step and rank: teacher G*P, student G*V + L*P_local
    (Sapiens v1: the student's G*V alone, there is no teacher)."""
    s = get_config(cfg.model).feature_stride
    (H, W), (h, w) = cfg.crops.global_size, cfg.crops.local_size
    P, P_local = (H // s) * (W // s), (h // s) * (w // s)
    V = P - int(round(cfg.masking.ratio * P))
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


def step_cost(cfg: PretrainConfig, batch: int) -> StepCost:
    if family_of(cfg.model) == "sapiens1":
        return _mae_step_cost(cfg, batch)
    bcfg = get_config(cfg.model)
    G, L = cfg.crops.num_global, cfg.crops.num_local
    (H, W), (h, w) = cfg.crops.global_size, cfg.crops.local_size
    s = bcfg.feature_stride
    P = (H // s) * (W // s)
    V = P - int(round(cfg.masking.ratio * P))
    prefix = 1 + bcfg.num_storage_tokens
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

    def meta(*shape, dtype=torch.float32):
        return torch.empty(*shape, device="meta", dtype=dtype)

    def masked_encoder():
        backbone.embed(meta(G * batch, 3, H, W))
        rope_dtype = backbone.rope_embed.table_dtype
        x = meta(G * batch, prefix + V, bcfg.embed_dim)
        rope = (meta(V, bcfg.head_dim, dtype=rope_dtype), meta(V, bcfg.head_dim, dtype=rope_dtype))
        for block in backbone.blocks:
            x = block(x, rope)
        backbone.ln1(x)

    teacher = _count(lambda: (backbone(meta(G * batch, 3, H, W)), head(meta(G * batch, bcfg.embed_dim))))
    student = _count(masked_encoder)
    student += _count(
        lambda: decoder(
            meta(G * batch, prefix + V, bcfg.embed_dim), meta(G * batch, V, dtype=torch.long), (H // s, W // s), prefix
        )
    )
    if L:
        student += _count(lambda: backbone(meta(L * batch, 3, h, w)))
    student += _count(lambda: head(meta((G + L) * batch, bcfg.embed_dim)))
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
