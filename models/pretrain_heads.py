"""Pretraining heads: the MAE decoder and the DINO / iBOT projection heads.

Losses live with training; this module holds the modules and the pixel-target
reshapes that define what the MAE decoder predicts.

Shape legend: B batch, C channels, P grid tokens, V visible tokens, N tokens with
prefix (CLS + storage), D width, X pixels per grid token (stride**2 * C).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.layers import Block, RMSNorm, init_transformer_weights
from models.rope import RopePositionEmbedding


def patchify(images_BCHW: torch.Tensor, stride: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, P, stride*stride*C), row-major tokens, pixels (dy, dx, c)."""
    B, C, H, W = images_BCHW.shape
    if H % stride or W % stride:
        raise ValueError(f"image size {H}x{W} must be a multiple of {stride}")
    h, w = H // stride, W // stride
    x = images_BCHW.reshape(B, C, h, stride, w, stride)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, h * w, stride * stride * C)


def unpatchify(patches_BPX: torch.Tensor, stride: int, grid_hw: tuple[int, int]) -> torch.Tensor:
    """Inverse of ``patchify``."""
    B, P, X = patches_BPX.shape
    h, w = grid_hw
    C = X // (stride * stride)
    x = patches_BPX.reshape(B, h, w, stride, stride, C)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(B, C, h * stride, w * stride)


def normalized_pixel_targets(
    images_BCHW: torch.Tensor, stride: int, eps: float = 1e-6, *, unbiased: bool = False
) -> torch.Tensor:
    """MAE targets (B, P, X): each patch's pixels standardised by its own mean and variance
    (the population variance, or the unbiased one with ``unbiased``: Sapiens v1's recipe)."""
    patches_BPX = patchify(images_BCHW, stride)
    mean = patches_BPX.mean(dim=-1, keepdim=True)
    var = patches_BPX.var(dim=-1, keepdim=True, unbiased=unbiased)
    return (patches_BPX - mean) / (var + eps).sqrt()


def scatter_visible(
    x_BND: torch.Tensor,
    mask_token: torch.Tensor,
    ids_keep_BV: torch.Tensor,
    grid_hw: tuple[int, int],
    num_prefix_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefix tokens, the full grid): the V visible tokens put back at their positions, the
    mask token everywhere else. The MAE decoders' first step (both families)."""
    prefix_BSD, visible_BVD = x_BND[:, :num_prefix_tokens], x_BND[:, num_prefix_tokens:]
    B, _, D = visible_BVD.shape
    h, w = grid_hw
    full_BPD = mask_token.to(x_BND.dtype).expand(B, h * w, D).clone()
    return prefix_BSD, full_BPD.scatter(1, ids_keep_BV[..., None].expand(-1, -1, D), visible_BVD)


@dataclass(frozen=True, kw_only=True)
class MAEDecoderConfig:
    """A light transformer; the defaults are Sapiens v1's 8 layers x 512 wide."""

    embed_dim: int = 512
    depth: int = 8
    num_heads: int = 16
    ffn_ratio: int = 4
    norm_eps: float = 1e-6
    rope_base: float = 100.0

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads or (self.embed_dim // self.num_heads) % 4:
            raise ValueError("MAE decoder: embed_dim / num_heads must be an integer divisible by 4 (2-D RoPE)")


class MAEDecoder(nn.Module):
    """Reconstructs every grid token's normalised pixels from the visible-only encoding.

    Visible tokens are projected, mask tokens fill the other positions, and positions are
    given by RoPE on the full grid (no position table, so any image size works). Train on
    the masked positions only: ``pred[~visible]`` against ``normalized_pixel_targets``.
    """

    def __init__(self, encoder_dim: int, *, pixels_per_token: int, config: MAEDecoderConfig | None = None) -> None:
        super().__init__()
        config = config or MAEDecoderConfig()
        self.config = config
        dim = config.embed_dim
        self.decoder_embed = nn.Linear(encoder_dim, dim)
        self.mask_token = nn.Parameter(torch.empty(1, 1, dim))
        # Our own module: no checkpoint to match, so fp32 RoPE tables.
        self.rope_embed = RopePositionEmbedding(dim // config.num_heads, base=config.rope_base, table_dtype="float32")
        self.blocks = nn.ModuleList(
            Block(
                dim,
                num_heads=config.num_heads,
                num_kv_heads=config.num_heads,
                ffn_hidden_dim=config.ffn_ratio * dim,
                qk_norm=True,
                layerscale_init=None,
                norm_eps=config.norm_eps,
            )
            for _ in range(config.depth)
        )
        self.norm = RMSNorm(dim, eps=config.norm_eps)
        self.pred = nn.Linear(dim, pixels_per_token)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        init_transformer_weights(self)
        nn.init.normal_(self.mask_token, std=0.02)
        self.rope_embed.init_weights()

    def forward(
        self,
        tokens_BND: torch.Tensor,
        ids_keep_BV: torch.Tensor,
        grid_hw: tuple[int, int],
        num_prefix_tokens: int,
    ) -> torch.Tensor:
        """Encoder output (prefix + V visible tokens) -> predictions (B, P, X) for all tokens."""
        x_BND = self.decoder_embed(tokens_BND)
        prefix_BSD, full_BPD = scatter_visible(x_BND, self.mask_token, ids_keep_BV, grid_hw, num_prefix_tokens)
        h, w = grid_hw
        x_BND = torch.cat((prefix_BSD, full_BPD), dim=1)
        rope = self.rope_embed(h, w)
        for block in self.blocks:
            x_BND = block(x_BND, rope)
        return self.pred(self.norm(x_BND[:, num_prefix_tokens:]))


class WeightNormLinear(nn.Module):
    """Bias-free linear layer whose rows are L2-normalised in the forward pass.

    Weight normalisation with the norm fixed to 1 (DINO's ``norm_last_layer``): the
    prototype logits are cosine similarities of the bottleneck vector to each prototype.
    Done in the forward rather than by a parametrisation so FSDP sees one plain tensor.
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))
        nn.init.trunc_normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, F.normalize(self.weight, dim=1))


class DINOHead(nn.Module):
    """MLP -> L2-normalised bottleneck -> weight-normalised prototype layer.

    Works on any leading shape: (B, D) CLS tokens for the DINO loss, or (B, N, D) patch
    tokens, as a second instance, for the optional iBOT patch loss.
    """

    def __init__(
        self,
        in_dim: int,
        *,
        num_prototypes: int = 65536,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        num_layers: int = 3,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("DINOHead needs num_layers >= 1")
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < num_layers - 1:
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        self.last_layer = WeightNormLinear(bottleneck_dim, num_prototypes)
        init_transformer_weights(self.mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.normalize(self.mlp(x), dim=-1, eps=1e-6)
        return self.last_layer(z)
