"""The Sapiens2 backbone: a ViT with RMSNorm, QK-norm, SwiGLU, LayerScale, 2-D RoPE,
CLS + storage tokens, GQA in the middle blocks and an optional 4K window tokenizer.

Parameter and buffer names follow the official state-dict layout, so released
checkpoints load directly (see ``models.io``).

Shape legend: B batch, C image channels, D width, P grid tokens (h * w, after the
tokenizer when there is one), V visible grid tokens, S storage tokens, N all tokens
(1 + S + P or 1 + S + V).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from models.layers import Block, RMSNorm, Rope, init_transformer_weights
from models.rope import RopePositionEmbedding, resolve_dtype
from models.tokenizer import WindowTokenizer

FULL_ATTENTION_EDGE_BLOCKS = 8
"""Blocks at each end that keep full multi-head attention; GQA runs in between."""


@dataclass(frozen=True, kw_only=True)
class Sapiens2Config:
    """Architecture of a Sapiens2 backbone. Unset optional fields take the Sapiens2 rule.

    ``num_kv_heads``: k/v heads of the GQA blocks (default ``num_heads // 2``).
    ``gqa_range``: [start, stop) of the GQA blocks (default: all but the first and last
    ``FULL_ATTENTION_EDGE_BLOCKS``; empty for 16 blocks or fewer).
    ``ffn_hidden_dim``: SwiGLU hidden width (default ``4 * embed_dim``).
    ``out_indices``: blocks whose outputs become feature maps (negative = from the end).
    ``tokenizer_*``: the 4K window tokenizer, built only when ``use_tokenizer``.
    """

    embed_dim: int
    depth: int
    num_heads: int
    num_kv_heads: int | None = None
    gqa_range: tuple[int, int] | None = None
    ffn_hidden_dim: int | None = None
    patch_size: int = 16
    in_chans: int = 3
    num_storage_tokens: int = 8
    rope_base: float = 100.0
    rope_dtype: str = "bfloat16"
    norm_eps: float = 1e-6
    layerscale_init: float = 1e-4
    use_tokenizer: bool = False
    tokenizer_depth: int = 0
    tokenizer_window: int = 4
    tokenizer_chunk_size: int = 4096
    tokenizer_checkpoint: bool = True
    out_indices: tuple[int, ...] = (-1,)

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})")
        if self.head_dim % 4:
            raise ValueError(f"head dim embed_dim/num_heads = {self.head_dim} must be divisible by 4 for 2-D RoPE")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads ({self.kv_heads})")
        start, stop = self.gqa_blocks.start, self.gqa_blocks.stop
        if not 0 <= start <= stop <= self.depth:
            raise ValueError(f"gqa_range {self.gqa_range} must satisfy 0 <= start <= stop <= depth ({self.depth})")
        if self.use_tokenizer and self.tokenizer_depth < 1:
            raise ValueError("use_tokenizer=True needs tokenizer_depth >= 1")
        if self.tokenizer_window < 1 or self.tokenizer_chunk_size < 1:
            raise ValueError("tokenizer_window and tokenizer_chunk_size must be positive")
        bad = [i for i in self.out_indices if not -self.depth <= i < self.depth]
        if bad or not self.out_indices:
            raise ValueError(f"out_indices must be a non-empty tuple of block ids in [-{self.depth}, {self.depth})")
        resolve_dtype(self.rope_dtype)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads // 2

    @property
    def ffn_dim(self) -> int:
        return self.ffn_hidden_dim if self.ffn_hidden_dim is not None else 4 * self.embed_dim

    @property
    def gqa_blocks(self) -> range:
        if self.gqa_range is not None:
            return range(*self.gqa_range)
        start = min(FULL_ATTENTION_EDGE_BLOCKS, self.depth)
        return range(start, max(start, self.depth - FULL_ATTENTION_EDGE_BLOCKS))

    @property
    def feature_stride(self) -> int:
        """Input pixels per grid token side: patch size, times the window with the tokenizer."""
        return self.patch_size * (self.tokenizer_window if self.use_tokenizer else 1)

    def replace(self, **changes) -> Sapiens2Config:
        return dataclasses.replace(self, **changes)


@dataclass
class BackboneOutput:
    """What the backbone returns. All tokens are after the final RMSNorm.

    ``tokens`` (B, N, D): CLS, S storage tokens, then grid tokens (all P row-major, or
    the V visible ones in ``ids_keep`` order). ``feature_maps``: one (B, D, h, w) map per
    ``out_indices`` block (final norm applied), empty for masked input. ``ids_keep``
    (B, V): grid indices of the visible tokens, None without a mask.
    """

    tokens: torch.Tensor
    cls: torch.Tensor
    storage: torch.Tensor
    patch_tokens: torch.Tensor
    feature_maps: list[torch.Tensor]
    grid_hw: tuple[int, int]
    ids_keep: torch.Tensor | None = None


def block_ids(out_indices: tuple[int, ...], depth: int) -> set[int]:
    """Block indices (negative from the end) as ids in [0, depth); out of range -> ValueError."""
    if any(not -depth <= i < depth for i in out_indices):
        raise ValueError(f"out_indices {out_indices} must be block ids in [-{depth}, {depth})")
    return {i % depth for i in out_indices}


def visible_ids(visible_mask_BP: torch.Tensor) -> torch.Tensor:
    """Sorted grid indices (B, V) of the True entries; every row must have the same count."""
    if visible_mask_BP.dtype != torch.bool or visible_mask_BP.dim() != 2:
        raise ValueError("visible_mask must be a (B, P) bool tensor, True = visible")
    counts = visible_mask_BP.sum(dim=1)
    num_visible = int(counts[0])
    if not bool((counts == num_visible).all()) or num_visible == 0:
        raise ValueError(f"every sample needs the same, non-zero number of visible tokens; got {counts.tolist()}")
    # A stable sort puts the visible (False after `~`) positions first, in grid order.
    return torch.argsort((~visible_mask_BP).to(torch.int8), dim=1, stable=True)[:, :num_visible]


def _gather_visible(x_BPD: torch.Tensor, rope: Rope, ids_keep_BV: torch.Tensor) -> tuple[torch.Tensor, Rope]:
    """The visible tokens and their own RoPE rows, (B, 1, V, K): one table per sample."""
    x_BVD = torch.gather(x_BPD, 1, ids_keep_BV[..., None].expand(-1, -1, x_BPD.shape[-1]))
    sin_PK, cos_PK = rope
    return x_BVD, (sin_PK[ids_keep_BV][:, None], cos_PK[ids_keep_BV][:, None])


class PatchEmbed(nn.Module):
    """Non-overlapping patch projection; the conv is named ``projection`` (official layout)."""

    def __init__(self, in_chans: int, dim: int, patch_size: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.projection = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, H/p, W/p, D)."""
        H, W = x_BCHW.shape[-2:]
        if H % self.patch_size or W % self.patch_size:
            raise ValueError(f"image size {H}x{W} must be a multiple of the patch size {self.patch_size}")
        return self.projection(x_BCHW).permute(0, 2, 3, 1)


class Sapiens2Backbone(nn.Module):
    """Sapiens2 encoder. ``forward(x)`` -> ``BackboneOutput``; see ``forward`` for masking."""

    def __init__(self, config: Sapiens2Config) -> None:
        super().__init__()
        self.config = config
        self.patch_size = config.patch_size
        self.embed_dim = config.embed_dim
        self.feature_stride = config.feature_stride
        self.num_prefix_tokens = 1 + config.num_storage_tokens
        dim = config.embed_dim

        self.patch_embed = PatchEmbed(config.in_chans, dim, config.patch_size)
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim))
        self.storage_tokens = nn.Parameter(torch.empty(1, config.num_storage_tokens, dim))
        self.rope_embed = RopePositionEmbedding(config.head_dim, base=config.rope_base, table_dtype=config.rope_dtype)
        self.tokenizer = (
            WindowTokenizer(
                dim,
                depth=config.tokenizer_depth,
                num_heads=config.num_heads,
                ffn_hidden_dim=config.ffn_dim,
                window=config.tokenizer_window,
                chunk_size=config.tokenizer_chunk_size,
                checkpoint_chunks=config.tokenizer_checkpoint,
                norm_eps=config.norm_eps,
            )
            if config.use_tokenizer
            else None
        )
        gqa = config.gqa_blocks
        self.blocks = nn.ModuleList(
            Block(
                dim,
                num_heads=config.num_heads,
                num_kv_heads=config.kv_heads if i in gqa else config.num_heads,
                ffn_hidden_dim=config.ffn_dim,
                qk_norm=True,
                layerscale_init=config.layerscale_init,
                norm_eps=config.norm_eps,
            )
            for i in range(config.depth)
        )
        self.ln1 = RMSNorm(dim, eps=config.norm_eps)  # the final norm (official name)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer, e.g. after ``to_empty`` from meta."""
        init_transformer_weights(self)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.storage_tokens, std=0.02)
        self.rope_embed.init_weights()
        if self.tokenizer is not None:
            self.tokenizer.init_weights()

    def embed(self, x_BCHW: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Image -> grid tokens (B, P, D) and the grid size (h, w), tokenizer included."""
        x_BhwD = self.patch_embed(x_BCHW)
        if self.tokenizer is not None:
            x_BhwD = self.tokenizer(x_BhwD)
        B, h, w, D = x_BhwD.shape
        return x_BhwD.reshape(B, h * w, D), (h, w)

    def forward(
        self,
        x_BCHW: torch.Tensor,
        *,
        visible_mask: torch.Tensor | None = None,
        out_indices: tuple[int, ...] | None = None,
    ) -> BackboneOutput:
        """Encode images (sides multiples of ``feature_stride``).

        ``visible_mask`` (B, P) bool, True = keep: the blocks then run on the CLS, storage
        and visible grid tokens only (MAE encoder); each sample must keep the same number.
        RoPE positions follow the kept tokens, so visible-only encoding equals full
        encoding with masked tokens excluded from attention.
        ``out_indices`` overrides ``config.out_indices``; feature maps come in block
        order, on the (H / feature_stride, W / feature_stride) grid.
        """
        wanted = block_ids(out_indices or self.config.out_indices, len(self.blocks))
        x_BPD, (h, w) = self.embed(x_BCHW)
        B = x_BPD.shape[0]
        rope = self.rope_embed(h, w)
        ids_keep_BV = None
        if visible_mask is not None:
            if visible_mask.shape != (B, h * w):
                raise ValueError(f"visible_mask must have shape (B, P) = {(B, h * w)}, got {tuple(visible_mask.shape)}")
            ids_keep_BV = visible_ids(visible_mask)
            x_BPD, rope = _gather_visible(x_BPD, rope, ids_keep_BV)
            wanted = set()  # a partial grid makes no feature map

        prefix_BSD = torch.cat((self.cls_token, self.storage_tokens), dim=1).expand(B, -1, -1)
        x_BND = torch.cat((prefix_BSD.to(x_BPD.dtype), x_BPD), dim=1)
        collected = {}
        for i, block in enumerate(self.blocks):
            x_BND = block(x_BND, rope)
            if i in wanted:
                collected[i] = x_BND
        tokens_BND = self.ln1(x_BND)
        p = self.num_prefix_tokens
        return BackboneOutput(
            tokens=tokens_BND,
            cls=tokens_BND[:, 0],
            storage=tokens_BND[:, 1:p],
            patch_tokens=tokens_BND[:, p:],
            feature_maps=self._feature_maps(tokens_BND, collected, (h, w)),
            grid_hw=(h, w),
            ids_keep=ids_keep_BV,
        )

    def _feature_maps(
        self, tokens_BND: torch.Tensor, collected: dict[int, torch.Tensor], grid_hw: tuple[int, int]
    ) -> list[torch.Tensor]:
        """Normalised grid tokens of the collected blocks as (B, D, h, w) maps, in block order."""
        p, (h, w) = self.num_prefix_tokens, grid_hw
        maps = []
        for i in sorted(collected):
            normed_BND = tokens_BND if i == len(self.blocks) - 1 else self.ln1(collected[i])
            maps.append(normed_BND[:, p:].transpose(1, 2).reshape(tokens_BND.shape[0], -1, h, w))
        return maps

    def forward_masked(self, x_BCHW: torch.Tensor, visible_mask_BP: torch.Tensor) -> BackboneOutput:
        """MAE encoder pass: ``forward(x, visible_mask=...)``."""
        return self.forward(x_BCHW, visible_mask=visible_mask_BP)
