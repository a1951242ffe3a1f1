"""Sapiens2 backbones by name, with parameter and FLOP counts.

Sizes follow the public model card (patch 16, 1024x768; the 4K variant adds the window
tokenizer). ``sapiens2_tiny`` / ``sapiens2_tiny_4k`` are the configuration of the
reference parity vectors, and ``sapiens2_small`` a CPU-sized model for benchmarks and
smoke runs; none of these three has released weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from models.io import load_weights
from models.sapiens2 import Sapiens2Backbone, Sapiens2Config

MODEL_REGISTRY: dict[str, Sapiens2Config] = {
    "sapiens2_0.1b": Sapiens2Config(embed_dim=768, depth=12, num_heads=12, tokenizer_depth=2),
    "sapiens2_0.4b": Sapiens2Config(embed_dim=1024, depth=24, num_heads=16, tokenizer_depth=2),
    "sapiens2_0.8b": Sapiens2Config(embed_dim=1280, depth=32, num_heads=16, tokenizer_depth=3),
    "sapiens2_1b": Sapiens2Config(embed_dim=1536, depth=40, num_heads=24, tokenizer_depth=4),
    "sapiens2_1b_4k": Sapiens2Config(embed_dim=1536, depth=40, num_heads=24, use_tokenizer=True, tokenizer_depth=4),
    "sapiens2_5b": Sapiens2Config(embed_dim=2432, depth=56, num_heads=32, tokenizer_depth=6),
    "sapiens2_tiny": Sapiens2Config(embed_dim=64, depth=18, num_heads=4, tokenizer_depth=2),
    "sapiens2_tiny_4k": Sapiens2Config(embed_dim=64, depth=18, num_heads=4, use_tokenizer=True, tokenizer_depth=2),
    # Too shallow for the 8-block rule; GQA in its middle third keeps every block kind.
    "sapiens2_small": Sapiens2Config(embed_dim=256, depth=12, num_heads=4, gqa_range=(4, 8), tokenizer_depth=2),
}


def list_models() -> list[str]:
    return list(MODEL_REGISTRY)


def get_config(name: str, **overrides) -> Sapiens2Config:
    """The named configuration, with any field replaced by ``overrides``."""
    if name not in MODEL_REGISTRY:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[name].replace(**overrides)


def build_backbone(
    name: str | Sapiens2Config,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    weights: str | Path | None = None,
    weights_prefix: str = "",
    **overrides,
) -> Sapiens2Backbone:
    """Build a backbone on ``device``: freshly initialised, or loaded from ``weights``.

    ``device="meta"`` allocates nothing (shape inspection, FLOP counting, FSDP init);
    call ``model.to_empty(device=...)`` then ``model.init_weights()`` to materialise.
    ``weights``: an official-layout ``.safetensors``/``.pt`` file (keys must match
    exactly; ``weights_prefix`` is stripped first). The model is then built on meta and
    takes the file's tensors, so no time or memory goes into a throw-away init.
    """
    config = name.replace(**overrides) if isinstance(name, Sapiens2Config) else get_config(name, **overrides)
    if weights is not None:
        with torch.device("meta"):
            model = Sapiens2Backbone(config)
        load_weights(model, weights, prefix=weights_prefix)
        return model.to(device=device or "cpu", dtype=dtype)
    with torch.device(device or "cpu"):
        model = Sapiens2Backbone(config)
    return model.to(dtype) if dtype is not None else model


def count_params(model: nn.Module | str) -> int:
    """Number of parameters (buffers such as the RoPE periods excluded)."""
    if isinstance(model, str):
        model = build_backbone(model, device="meta")
    return sum(p.numel() for p in model.parameters())


def count_flops(model: nn.Module | str, hw: tuple[int, int] = (1024, 768), batch: int = 1) -> int:
    """Forward FLOPs for ``batch`` images of size ``hw``, counted by ``FlopCounterMode``
    on the meta device (2 per multiply-add; matmuls, convs and attention)."""
    if isinstance(model, str):
        model = build_backbone(model, device="meta")
    else:
        model = _meta_copy(model)
    x = torch.empty(batch, model.config.in_chans, *hw, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def _meta_copy(model: Sapiens2Backbone) -> Sapiens2Backbone:
    # Count on meta whatever device the given model lives on: no memory, same graph, and
    # meta SDPA decomposes into matmuls that FlopCounterMode sees (the CPU kernel it misses).
    return build_backbone(model.config, device="meta")
