"""The Sapiens v1 backbone: a plain pre-norm ViT (LayerNorm, qkv attention with bias,
GELU MLP, 2-D sin-cos position table), in the released key layout, and its MAE decoder.

API (the same shape as ``models.sapiens2``, so training and evaluation drive either family):

- ``Sapiens1Config``: the architecture. The registry's ``sapiens_0.3b`` / ``0.6b`` / ``1b``
  / ``2b`` are the *fine-tune* layout of the released task checkpoints (1024x768, no CLS,
  learnable ``pos_embed`` [1, 3072, C]); ``config.as_pretrain(img_size)`` is the *pretrain*
  layout of the released ``*_clean.pth`` (CLS token, frozen sin-cos table with a zero CLS
  slot, [1, 1 + 64*64, C] at 1024x1024).
- ``Sapiens1Backbone(config)(x, visible_mask=None, out_indices=None) -> BackboneOutput``
  (the Sapiens2 dataclass). ``visible_mask`` (B, P) bool, True = keep: MAE encoding of
  the visible tokens only, positions added before the gather (as MAEViT does). Without a
  CLS token, ``cls`` is the mean of the final patch tokens; ``storage`` is always empty.
  Feature maps of intermediate blocks are *not* normalised (the official ``out_indices``
  behaviour: only the last block's output goes through ``ln1``).
- ``adapt_state_dict(state, config)``: the official load hook. A pretrain-layout dict
  loads into a fine-tune-layout model: the CLS token is dropped, the CLS slot of an odd
  length ``pos_embed`` removed and the square grid bicubic-resized to the model's grid.
- ``Sapiens1MAEDecoder``: MAEPretrainDecoder in the released ``neck.*`` layout (fixed
  sin-cos positions, 8 x 512 LayerNorm blocks, ``decoder_pred``); same call signature as
  ``models.pretrain_heads.MAEDecoder``.

For fine-tuning: parameters are named as released (``patch_embed.projection``, ``pos_embed``,
``cls_token`` = embeddings; ``layers.<i>.*`` = block i, also reachable as ``.blocks``; ``ln1``
= final norm). The pose / LIP / CIHP / normal configs' ``patch_cfg=dict(padding=2)`` is
``get_config(name, patch_padding=2)`` (same keys, same 64x48 grid). Load weights through
``models.build_backbone(name, weights=...)``: it finds a task checkpoint's ``backbone.``
prefix, adapts a pretrain file and refuses another family or size in one line.

Shape legend: B batch, C image channels, D width, P grid tokens (h * w), V visible grid
tokens, N all tokens (prefix + P or prefix + V), F FFN width.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.pretrain_heads import scatter_visible
from models.sapiens2 import BackboneOutput, block_ids, visible_ids


@dataclass(frozen=True, kw_only=True)
class Sapiens1Config:
    """Architecture of a Sapiens v1 backbone.

    ``img_size`` (H, W): the grid of the stored ``pos_embed`` (other input sizes resize it
    bicubically at every forward). ``with_cls_token``: a CLS token and a CLS slot in
    ``pos_embed`` (the pretrain layout). ``frozen_pos_embed``: the table is a fixed 2-D
    sin-cos (pretrain) rather than learnable (fine-tune). ``patch_padding``: zero padding
    of the patch conv (2 in the official pose / LIP / CIHP / normal configs).
    """

    embed_dim: int
    depth: int
    num_heads: int
    ffn_hidden_dim: int | None = None
    patch_size: int = 16
    in_chans: int = 3
    img_size: tuple[int, int] = (1024, 768)
    with_cls_token: bool = False
    frozen_pos_embed: bool = False
    patch_padding: int = 0
    norm_eps: float = 1e-6
    out_indices: tuple[int, ...] = (-1,)

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})")
        if self.embed_dim % 4:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be divisible by 4 for the 2-D sin-cos table")
        if any(s <= 0 for s in self.img_size) or len(self.img_size) != 2:
            raise ValueError(f"img_size must be a positive (H, W), got {self.img_size}")
        if not 0 <= self.patch_padding < self.patch_size:
            raise ValueError(f"patch_padding must lie in [0, patch_size), got {self.patch_padding}")
        bad = [i for i in self.out_indices if not -self.depth <= i < self.depth]
        if bad or not self.out_indices:
            raise ValueError(f"out_indices must be a non-empty tuple of block ids in [-{self.depth}, {self.depth})")

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def ffn_dim(self) -> int:
        return self.ffn_hidden_dim if self.ffn_hidden_dim is not None else 4 * self.embed_dim

    @property
    def feature_stride(self) -> int:
        return self.patch_size

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.with_cls_token else 0

    def grid_for(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Token grid of an (H, W) input: the patch conv's output size."""
        p, pad = self.patch_size, self.patch_padding
        return ((hw[0] + 2 * pad - p) // p + 1, (hw[1] + 2 * pad - p) // p + 1)

    @property
    def grid(self) -> tuple[int, int]:
        return self.grid_for(self.img_size)

    def as_pretrain(self, img_size: tuple[int, int] = (1024, 1024)) -> Sapiens1Config:
        """The MAE pretraining layout: CLS token, frozen sin-cos table over ``img_size``, no padding."""
        return self.replace(img_size=tuple(img_size), with_cls_token=True, frozen_pos_embed=True, patch_padding=0)

    def replace(self, **changes) -> Sapiens1Config:
        return dataclasses.replace(self, **changes)


def sincos_pos_embed(grid_hw: tuple[int, int], dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """(h*w, dim) fixed 2-D table, row-major tokens t = r*w + c: [sin(r w_i), cos(r w_i),
    sin(c w_i), cos(c w_i)], w_i = temperature^(-i / (dim/4)) (the released MAEViT table)."""
    h, w = grid_hw
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    rows = torch.arange(h, dtype=torch.float32).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float32).repeat(h)
    out_r, out_c = torch.outer(rows, omega), torch.outer(cols, omega)
    return torch.cat([out_r.sin(), out_r.cos(), out_c.sin(), out_c.cos()], dim=1)


def resize_pos_embed(
    pos_1ND: torch.Tensor, src_hw: tuple[int, int], dst_hw: tuple[int, int], num_extra: int
) -> torch.Tensor:
    """Bicubic (align_corners=False, fp32) resize of the grid part; extra (CLS) slots kept."""
    if tuple(src_hw) == tuple(dst_hw):
        return pos_1ND
    extra, grid = pos_1ND[:, :num_extra], pos_1ND[:, num_extra:]
    D = grid.shape[-1]
    grid = grid.reshape(1, src_hw[0], src_hw[1], D).permute(0, 3, 1, 2)
    grid = F.interpolate(grid.float(), size=tuple(dst_hw), mode="bicubic", align_corners=False)
    grid = grid.flatten(2).transpose(1, 2).to(pos_1ND.dtype)
    return torch.cat((extra, grid), dim=1)


class Sapiens1Attention(nn.Module):
    """qkv Linear(D, 3D) with bias (rows q, k, v; heads contiguous), SDPA, proj Linear."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x_BND: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``attn_mask``: optional SDPA mask broadcastable to (B, heads, N, N), True = attend."""
        B, N, D = x_BND.shape
        qkv = self.qkv(x_BND).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=attn_mask)
        return self.proj(o.transpose(1, 2).reshape(B, N, D))


class Sapiens1FFN(nn.Module):
    """Linear -> exact GELU -> Linear, keyed ``layers.0.0`` / ``layers.1`` (mmcv FFN)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Sequential(nn.Linear(dim, hidden), nn.GELU()), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Sapiens1Block(nn.Module):
    """``x + attn(ln1(x))`` then ``x + ffn(ln2(x))``; LayerNorm, no layer-scale."""

    def __init__(self, dim: int, num_heads: int, ffn_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Sapiens1Attention(dim, num_heads)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.ffn = Sapiens1FFN(dim, ffn_dim)

    def forward(self, x_BND: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x_BND = x_BND + self.attn(self.ln1(x_BND), attn_mask)
        return x_BND + self.ffn(self.ln2(x_BND))


def init_vit_weights(module: nn.Module) -> None:
    """The released init: xavier-uniform linears (and the patch conv, viewed 2-D), zero
    biases, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight.view(m.weight.shape[0], -1))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class Sapiens1Backbone(nn.Module):
    """Sapiens v1 encoder. ``forward(x)`` -> ``BackboneOutput``; see the module docstring."""

    def __init__(self, config: Sapiens1Config) -> None:
        super().__init__()
        self.config = config
        self.patch_size = config.patch_size
        self.embed_dim = dim = config.embed_dim
        self.feature_stride = config.feature_stride
        self.num_prefix_tokens = config.num_prefix_tokens
        self.patch_embed = nn.Module()
        self.patch_embed.projection = nn.Conv2d(
            config.in_chans, dim, config.patch_size, stride=config.patch_size, padding=config.patch_padding
        )
        if config.with_cls_token:
            self.cls_token = nn.Parameter(torch.empty(1, 1, dim))
        h, w = config.grid
        self.pos_embed = nn.Parameter(
            torch.empty(1, self.num_prefix_tokens + h * w, dim), requires_grad=not config.frozen_pos_embed
        )
        self.layers = nn.ModuleList(
            Sapiens1Block(dim, config.num_heads, config.ffn_dim, config.norm_eps) for _ in range(config.depth)
        )
        self.ln1 = nn.LayerNorm(dim, eps=config.norm_eps)  # the final norm (official name)
        self.init_weights()

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks (``layers`` in the official layout; Sapiens2 calls them ``blocks``)."""
        return self.layers

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter, e.g. after ``to_empty`` from meta."""
        init_vit_weights(self)
        table = sincos_pos_embed(self.config.grid, self.embed_dim)
        if self.num_prefix_tokens:
            nn.init.normal_(self.cls_token, std=0.02)
            table = torch.cat((torch.zeros(1, self.embed_dim), table))
        self.pos_embed.copy_(table[None])

    def embed(self, x_BCHW: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int], torch.Tensor]:
        """Patch tokens with their positions added (B, P, D), the grid, and the prefix (1, S, D)."""
        p, pad = self.patch_size, self.config.patch_padding
        H, W = x_BCHW.shape[-2:]
        if not pad and (H % p or W % p):
            raise ValueError(f"image size {H}x{W} must be a multiple of the patch size {p}")
        x = self.patch_embed.projection(x_BCHW)
        h, w = x.shape[-2:]
        pos = resize_pos_embed(self.pos_embed, self.config.grid, (h, w), self.num_prefix_tokens)
        x_BPD = x.flatten(2).transpose(1, 2) + pos[:, self.num_prefix_tokens :]
        prefix = self.cls_token + pos[:, :1] if self.num_prefix_tokens else pos[:, :0]
        return x_BPD, (h, w), prefix

    def forward(
        self,
        x_BCHW: torch.Tensor,
        *,
        visible_mask: torch.Tensor | None = None,
        out_indices: tuple[int, ...] | None = None,
    ) -> BackboneOutput:
        """Encode images. ``visible_mask`` (B, P) bool, True = keep: the blocks run on the
        prefix and the visible tokens only (MAE encoder), each sample keeping the same count,
        which equals a full pass whose attention ignores the masked tokens.
        ``out_indices`` overrides ``config.out_indices``; feature maps come in block order."""
        wanted = block_ids(out_indices or self.config.out_indices, len(self.layers))
        x_BPD, (h, w), prefix = self.embed(x_BCHW)
        B, P, D = x_BPD.shape
        ids_keep_BV = None
        if visible_mask is not None:
            if visible_mask.shape != (B, P):
                raise ValueError(f"visible_mask must have shape (B, P) = {(B, P)}, got {tuple(visible_mask.shape)}")
            ids_keep_BV = visible_ids(visible_mask)
            x_BPD = torch.gather(x_BPD, 1, ids_keep_BV[..., None].expand(-1, -1, D))
            wanted = set()  # a partial grid makes no feature map
        x_BND = torch.cat((prefix.expand(B, -1, -1).to(x_BPD.dtype), x_BPD), dim=1)
        collected = {}
        for i, block in enumerate(self.layers):
            x_BND = block(x_BND)
            if i in wanted:
                collected[i] = x_BND
        tokens_BND = self.ln1(x_BND)
        return self._output(tokens_BND, collected, (h, w), ids_keep_BV)

    def _output(
        self,
        tokens_BND: torch.Tensor,
        collected: dict[int, torch.Tensor],
        grid_hw: tuple[int, int],
        ids_keep_BV: torch.Tensor | None,
    ) -> BackboneOutput:
        s, (h, w), last = self.num_prefix_tokens, grid_hw, len(self.layers) - 1
        B = tokens_BND.shape[0]
        maps = [
            (tokens_BND if i == last else collected[i])[:, s:].transpose(1, 2).reshape(B, -1, h, w)
            for i in sorted(collected)
        ]
        patch_BPD = tokens_BND[:, s:]
        return BackboneOutput(
            tokens=tokens_BND,
            cls=tokens_BND[:, 0] if s else patch_BPD.mean(dim=1),
            storage=tokens_BND[:, s:s],
            patch_tokens=patch_BPD,
            feature_maps=maps,
            grid_hw=(h, w),
            ids_keep=ids_keep_BV,
        )

    def forward_masked(self, x_BCHW: torch.Tensor, visible_mask_BP: torch.Tensor) -> BackboneOutput:
        """MAE encoder pass: ``forward(x, visible_mask=...)``."""
        return self.forward(x_BCHW, visible_mask=visible_mask_BP)


def adapt_state_dict(state: dict[str, torch.Tensor], config: Sapiens1Config) -> dict[str, torch.Tensor]:
    """Backbone tensors of either released layout, shaped for a model of ``config``.

    Into a model without CLS: ``cls_token`` is dropped, and a ``pos_embed`` of a CLS slot
    before a square grid (length 1 + n^2, itself not a square) loses its first slot (the
    official hook drops it for any odd length). A square grid that differs from the model's
    is then bicubic-resized (fp32, align_corners=False), as the official load hook does.
    Anything else is left for the strict key/shape check.
    """
    state = dict(state)
    s = config.num_prefix_tokens
    if not s:
        state.pop("cls_token", None)
    pos = state.get("pos_embed")
    if pos is None or pos.dim() != 3:
        return state
    h, w = config.grid
    if not s and pos.shape[1] != h * w and _is_square(pos.shape[1] - 1) and not _is_square(pos.shape[1]):
        pos = pos[:, 1:]
    side = math.isqrt(pos.shape[1] - s)
    if pos.shape[1] != s + h * w and side * side == pos.shape[1] - s:
        pos = resize_pos_embed(pos, (side, side), (h, w), s)
    state["pos_embed"] = pos
    return state


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def pretrain_state_dict(backbone: Sapiens1Backbone) -> dict[str, torch.Tensor]:
    """The released pretrain (``*_clean.pth``) layout of a pretrain-layout backbone: flat
    backbone keys with ``cls_token`` and the [1, 1 + h*w, D] table."""
    if not backbone.config.with_cls_token:
        raise ValueError("pretrain layout needs a backbone built with with_cls_token=True (config.as_pretrain())")
    return dict(backbone.state_dict())


class Sapiens1MAEDecoder(nn.Module):
    """MAEPretrainDecoder, released ``neck.*`` layout: ``decoder_embed``, ``mask_token``,
    frozen sin-cos ``decoder_pos_embed`` [1, 1 + P, Dd] (zero CLS slot), ``decoder_blocks``
    (v1 blocks), ``ln1``, ``decoder_pred`` Linear(Dd, stride^2 * C).

    ``forward(tokens_BND, ids_keep_BV, grid_hw, num_prefix_tokens)`` -> (B, P, X), the same
    call as ``models.pretrain_heads.MAEDecoder``; a grid other than ``grid_hw`` at build
    time resizes the table bicubically.
    """

    def __init__(
        self,
        encoder_dim: int,
        *,
        pixels_per_token: int,
        grid_hw: tuple[int, int],
        embed_dim: int = 512,
        depth: int = 8,
        num_heads: int = 16,
        ffn_ratio: int = 4,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads or embed_dim % 4:
            raise ValueError(f"MAE decoder: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}) and 4")
        self.grid_hw = tuple(grid_hw)
        self.mask_token = nn.Parameter(torch.empty(1, 1, embed_dim))
        self.decoder_pos_embed = nn.Parameter(
            torch.empty(1, 1 + grid_hw[0] * grid_hw[1], embed_dim), requires_grad=False
        )
        self.decoder_embed = nn.Linear(encoder_dim, embed_dim)
        self.decoder_blocks = nn.ModuleList(
            Sapiens1Block(embed_dim, num_heads, ffn_ratio * embed_dim, norm_eps) for _ in range(depth)
        )
        self.ln1 = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.decoder_pred = nn.Linear(embed_dim, pixels_per_token)
        self.init_weights()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.decoder_blocks

    @torch.no_grad()
    def init_weights(self) -> None:
        init_vit_weights(self)
        nn.init.normal_(self.mask_token, std=0.02)
        table = sincos_pos_embed(self.grid_hw, self.decoder_pos_embed.shape[-1])
        self.decoder_pos_embed.copy_(torch.cat((torch.zeros(1, table.shape[1]), table))[None])

    def forward(
        self, tokens_BND: torch.Tensor, ids_keep_BV: torch.Tensor, grid_hw: tuple[int, int], num_prefix_tokens: int
    ) -> torch.Tensor:
        """Encoder output (prefix + V visible tokens) -> predictions (B, P, X) for every grid token."""
        x_BND = self.decoder_embed(tokens_BND)
        prefix_BSD, full_BPD = scatter_visible(x_BND, self.mask_token, ids_keep_BV, grid_hw, num_prefix_tokens)
        h, w = grid_hw
        pos = resize_pos_embed(self.decoder_pos_embed, self.grid_hw, (h, w), 1).to(x_BND.dtype)
        x_BND = torch.cat((prefix_BSD + pos[:, :1], full_BPD + pos[:, 1:]), dim=1)
        for block in self.decoder_blocks:
            x_BND = block(x_BND)
        return self.decoder_pred(self.ln1(x_BND[:, num_prefix_tokens:]))
