"""The Sapiens2 4K tokenizer: windowed attention that pools each window to one token.

Patch tokens are cut into ``window x window`` windows; a shared learnable CLS (``w_cls``)
is prepended to each window and a learnt local position embedding (``local_pos_embed``,
window**2 + 1 entries) added; a few plain transformer blocks (no QK-norm, no LayerScale,
no RoPE) run inside each window, and only the window's CLS token goes on. The global
transformer so sees ``window**2`` times fewer tokens.

Windows are processed in chunks to bound activation memory; while training (and with
grad enabled) each chunk is activation-checkpointed.

Shape legend: B batch, D width, h/w patch grid, M windows in a batch (B * h/win * w/win),
T tokens in a window (win**2, + 1 with the CLS).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from models.layers import Block


class WindowTokenizer(nn.Module):
    def __init__(
        self,
        dim: int,
        *,
        depth: int,
        num_heads: int,
        ffn_hidden_dim: int,
        window: int = 4,
        chunk_size: int = 4096,
        checkpoint_chunks: bool = True,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.window = window
        self.chunk_size = chunk_size
        self.checkpoint_chunks = checkpoint_chunks
        self.w_cls = nn.Parameter(torch.empty(1, 1, dim))
        self.local_pos_embed = nn.Parameter(torch.empty(1, window * window + 1, dim))
        self.blocks = nn.ModuleList(
            Block(
                dim,
                num_heads=num_heads,
                num_kv_heads=num_heads,
                ffn_hidden_dim=ffn_hidden_dim,
                qk_norm=False,
                layerscale_init=None,
                norm_eps=norm_eps,
            )
            for _ in range(depth)
        )

    def init_weights(self) -> None:
        nn.init.trunc_normal_(self.w_cls, std=0.02)
        nn.init.trunc_normal_(self.local_pos_embed, std=0.02)

    def _encode_windows(self, x_MTD: torch.Tensor) -> torch.Tensor:
        """(M, win**2, D) window tokens -> (M, D) window CLS outputs."""
        # Cast the learnt tokens so bf16 activations (autocast) stay bf16.
        w_cls = self.w_cls.to(x_MTD.dtype).expand(x_MTD.shape[0], -1, -1)
        x_MTD = torch.cat((w_cls, x_MTD), dim=1) + self.local_pos_embed.to(x_MTD.dtype)
        for block in self.blocks:
            x_MTD = block(x_MTD)
        return x_MTD[:, 0]

    def forward(self, x_BhwD: torch.Tensor) -> torch.Tensor:
        """(B, h, w, D) patch grid -> (B, h/win, w/win, D) window tokens."""
        B, h, w, D = x_BhwD.shape
        win = self.window
        if h % win or w % win:
            raise ValueError(
                f"the 4K tokenizer needs a patch grid divisible by the window ({win}); got {h}x{w} "
                f"patches: use image sides that are multiples of patch_size * {win}"
            )
        hw, ww = h // win, w // win
        windows_MTD = x_BhwD.view(B, hw, win, ww, win, D).permute(0, 1, 3, 2, 4, 5).reshape(B * hw * ww, win * win, D)
        use_checkpoint = self.checkpoint_chunks and self.training and torch.is_grad_enabled()
        outs = []
        for chunk_MTD in windows_MTD.split(self.chunk_size):
            if use_checkpoint:
                outs.append(checkpoint(self._encode_windows, chunk_MTD, use_reentrant=False))
            else:
                outs.append(self._encode_windows(chunk_MTD))
        return torch.cat(outs).view(B, hw, ww, D)
