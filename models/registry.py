"""Backbones of both Sapiens families by name, with parameter and FLOP counts.

One registry: the config type decides the class (``Sapiens2Config`` -> ``Sapiens2Backbone``,
``Sapiens1Config`` -> ``Sapiens1Backbone``); ``family_of(config)`` names it.

Sapiens2 sizes follow the public model card (patch 16, 1024x768; the 4K variant adds the
window tokenizer). ``sapiens2_tiny`` / ``sapiens2_tiny_4k`` are the configuration of the
reference parity vectors, ``sapiens2_small`` a CPU-sized model for benchmarks and
smoke runs, and ``sapiens2_nano`` a student smaller than ``sapiens2_tiny`` (distillation on a
CPU: tiny -> nano, as the released sizes distil 5b / 1b -> 0.4b / 0.1b); none of these has
released weights.

Sapiens v1 (``sapiens_0.3b`` .. ``sapiens_2b``) are registered in the layout of the
released *task* checkpoints (1024x768, no CLS, learnable ``pos_embed``); they also load
the released pretrain ``*_clean.pth`` (CLS slot dropped, 64x64 sin-cos table resized),
and ``get_config(name).as_pretrain()`` is the pretrain layout itself. ``sapiens_tiny`` is
the configuration of the v1 parity vectors (pretrain-like: CLS, 64x64 table) and
``sapiens_small`` a CPU-sized v1 model; neither has released weights.

Weights of the wrong family or size fail with one line naming the file, what the weights
look like and what was expected (``WeightsFamilyError``), before any key-by-key check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from models.io import check_state_dict, load_state_dict_file, load_weights, weight_shapes
from models.sapiens1 import Sapiens1Backbone, Sapiens1Config, adapt_state_dict
from models.sapiens2 import Sapiens2Backbone, Sapiens2Config

BackboneConfig = Sapiens2Config | Sapiens1Config
Backbone = Sapiens2Backbone | Sapiens1Backbone

MODEL_REGISTRY: dict[str, BackboneConfig] = {
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
    # Half of sapiens2_tiny's width, a third of its depth; GQA in its middle third as in sapiens2_small.
    "sapiens2_nano": Sapiens2Config(embed_dim=32, depth=6, num_heads=2, gqa_range=(2, 4), tokenizer_depth=2),
    "sapiens_0.3b": Sapiens1Config(embed_dim=1024, depth=24, num_heads=16),
    "sapiens_0.6b": Sapiens1Config(embed_dim=1280, depth=32, num_heads=16),
    "sapiens_1b": Sapiens1Config(embed_dim=1536, depth=40, num_heads=24),
    "sapiens_2b": Sapiens1Config(embed_dim=1920, depth=48, num_heads=32),
    "sapiens_tiny": Sapiens1Config(embed_dim=64, depth=4, num_heads=4, img_size=(64, 64), with_cls_token=True),
    "sapiens_small": Sapiens1Config(embed_dim=256, depth=12, num_heads=4, img_size=(128, 96)),
}

_CLASSES: dict[type, tuple[str, type[nn.Module]]] = {
    Sapiens2Config: ("sapiens2", Sapiens2Backbone),
    Sapiens1Config: ("sapiens1", Sapiens1Backbone),
}


class WeightsFamilyError(ValueError):
    """Weights of another family or size than the model they were given to (one line)."""


def list_models() -> list[str]:
    return list(MODEL_REGISTRY)


def family_of(config: BackboneConfig | str) -> str:
    """``"sapiens1"`` or ``"sapiens2"`` for a config or a registered name."""
    config = get_config(config) if isinstance(config, str) else config
    return _CLASSES[type(config)][0]


def get_config(name: str, **overrides) -> BackboneConfig:
    """The named configuration, with any field replaced by ``overrides``."""
    if name not in MODEL_REGISTRY:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[name].replace(**overrides)


def backbone_class(config: BackboneConfig) -> type[nn.Module]:
    return _CLASSES[type(config)][1]


def build_backbone(
    name: str | BackboneConfig,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    weights: str | Path | None = None,
    weights_prefix: str = "",
    **overrides,
) -> Backbone:
    """Build a backbone on ``device``: freshly initialised, or loaded from ``weights``.

    ``device="meta"`` allocates nothing (shape inspection, FLOP counting, FSDP init);
    call ``model.to_empty(device=...)`` then ``model.init_weights()`` to materialise.
    ``weights``: an official-layout ``.safetensors``/``.pt`` file (keys must match
    exactly; ``weights_prefix`` is stripped first; a v1 task checkpoint's ``backbone.``
    prefix is found by itself and its head keys ignored). The model is then built on meta
    and takes the file's tensors, so no time or memory goes into a throw-away init.
    """
    config = name.replace(**overrides) if not isinstance(name, str) else get_config(name, **overrides)
    cls = backbone_class(config)
    if weights is not None:
        state = _backbone_state(load_state_dict_file(weights), config, weights_prefix)
        check_family(state, config, source=str(weights), expected=name if isinstance(name, str) else None)
        with torch.device("meta"):
            model = cls(config)
        load_weights(model, _adapt(state, config))
        return model.to(device=device or "cpu", dtype=dtype)
    with torch.device(device or "cpu"):
        model = cls(config)
    return model.to(dtype) if dtype is not None else model


def check_weights_file(name: str | BackboneConfig, path: str | Path, prefix: str = "") -> None:
    """Family, size, key and shape check of a weights file against a model, from shapes alone
    (the safetensors header; a ``.pt`` is memory-mapped): a config check before any run."""
    config = get_config(name) if isinstance(name, str) else name
    shapes = {k: torch.empty(s, device="meta") for k, s in weight_shapes(path).items()}
    state = _backbone_state(shapes, config, prefix)
    check_family(state, config, source=str(path), expected=name if isinstance(name, str) else None)
    with torch.device("meta"):
        model = backbone_class(config)(config)
    check_state_dict(model, _adapt(state, config))


def backbone_prefix(keys) -> str:
    """``"backbone."`` when a file's keys carry it (a task checkpoint, some pretrain files), else ``""``."""
    return "backbone." if any(k.startswith("backbone.") for k in keys) else ""


def _backbone_state(state: Mapping[str, torch.Tensor], config: BackboneConfig, prefix: str) -> dict:
    """The backbone's tensors: ``prefix`` stripped; for v1 without a prefix, a task
    checkpoint's ``backbone.`` keys (its ``head.`` / ``decode_head.`` keys left out)."""
    if not prefix and isinstance(config, Sapiens1Config) and "backbone.patch_embed.projection.weight" in state:
        prefix = "backbone."
    if not prefix:
        return dict(state)
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _adapt(state: dict, config: BackboneConfig) -> dict:
    return adapt_state_dict(state, config) if isinstance(config, Sapiens1Config) else state


@dataclass(frozen=True)
class WeightsShape:
    """What a backbone state dict is, read off its keys: family, width, depth, 4K tokenizer."""

    family: str
    embed_dim: int | None
    depth: int
    tokenizer: bool
    marker: str

    @property
    def label(self) -> str:
        """The registered name these weights fit, else the family."""
        for name, c in MODEL_REGISTRY.items():
            if (family_of(c), c.embed_dim, c.depth, getattr(c, "use_tokenizer", False)) == (
                self.family,
                self.embed_dim,
                self.depth,
                self.tokenizer,
            ):
                return name
        return f"an unregistered {self.family} model"


def describe_weights(state: Mapping[str, torch.Tensor]) -> WeightsShape | None:
    """The family and size of backbone weights, or None when no known family's keys are there."""
    if "layers.0.attn.qkv.weight" in state:
        family, marker, block_key = "sapiens1", "layers.0.attn.qkv.weight", "layers."
    elif "storage_tokens" in state or any(k.startswith("blocks.") for k in state):
        family, marker, block_key = "sapiens2", "storage_tokens" if "storage_tokens" in state else "blocks.0", "blocks."
    else:
        return None
    patch = state.get("patch_embed.projection.weight")
    return WeightsShape(
        family=family,
        embed_dim=int(patch.shape[0]) if patch is not None else None,
        depth=len({k.split(".")[1] for k in state if k.startswith(block_key)}),
        tokenizer=any(k.startswith("tokenizer.") for k in state),
        marker=marker,
    )


def check_family(
    state: Mapping[str, torch.Tensor], config: BackboneConfig, *, source: str, expected: str | None = None
) -> None:
    """Raise ``WeightsFamilyError`` (one line) when ``state`` is another family, width or depth."""
    seen = describe_weights(state)
    if seen is None:
        return  # no recognisable backbone keys: the key-by-key check says what is wrong
    if (seen.family, seen.embed_dim, seen.depth) == (family_of(config), config.embed_dim, config.depth):
        return
    want = expected or f"a {family_of(config)} model"
    raise WeightsFamilyError(
        f"weights {source} look like {seen.label} (key {seen.marker} / embed dim {seen.embed_dim}, "
        f"{seen.depth} blocks), expected {want} (embed dim {config.embed_dim}, {config.depth} blocks)"
    )


def count_params(model: nn.Module | str) -> int:
    """Number of parameters (buffers such as the RoPE periods excluded; frozen tables included)."""
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


def _meta_copy(model: Backbone) -> Backbone:
    # Count on meta whatever device the given model lives on: no memory, same graph, and
    # meta SDPA decomposes into matmuls that FlopCounterMode sees (the CPU kernel it misses).
    return build_backbone(model.config, device="meta")
