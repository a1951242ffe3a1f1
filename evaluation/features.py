"""The frozen backbone as a feature source, with an optional on-disk feature cache.

``FrozenBackbone(images)`` returns the chosen blocks' feature maps concatenated along
channels, (B, D * len(blocks), H / stride, W / stride), and the final CLS token (B, D).
A cache file holds the features of one split, keyed by everything that decides them
(backbone and its weights digest, blocks, data digest, crop settings), so re-runs and
other probes on the same data reuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from models import build_backbone

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_frozen_backbone(
    name: str, checkpoint: str = "", *, weights_prefix: str = "", seed: int = 0, device: torch.device | str = "cpu"
) -> nn.Module:
    """The named backbone with ``checkpoint``'s weights, or randomly initialised from ``seed``
    when ``checkpoint`` is empty; in eval mode, gradients off."""
    if checkpoint:
        model = build_backbone(name, weights=checkpoint, weights_prefix=weights_prefix, device=device)
    else:  # initialised on the CPU, so a seed means the same weights on every device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_backbone(name).to(device)
    model.eval().requires_grad_(False)
    return model


class FrozenBackbone:
    def __init__(self, backbone: nn.Module, blocks: list[int], dtype: str = "float32") -> None:
        self.backbone, self.blocks = backbone, tuple(blocks)
        self.dtype = _DTYPES[dtype]
        self.dim = backbone.embed_dim
        self.stride = backbone.feature_stride
        self.device = next(backbone.parameters()).device

    @property
    def out_dim(self) -> int:
        return self.dim * len(self.blocks)

    @torch.no_grad()
    def __call__(self, images_BCHW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = images_BCHW.to(self.device)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            out = self.backbone(x, out_indices=self.blocks)
        return torch.cat(out.feature_maps, dim=1).float(), out.cls.float()


def check_grid(image_size, stride: int, what: str = "image_size") -> None:
    """Raise unless both sides are multiples of the backbone's feature stride."""
    if image_size[0] % stride or image_size[1] % stride:
        fit = [max(stride, round(v / stride) * stride) for v in image_size]
        raise ValueError(
            f"{what} {list(image_size)} must be a multiple of the backbone's feature stride {stride}, e.g. {fit}"
        )


def cache_key(**parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def extract_features(
    extractor: FrozenBackbone,
    dataset: Dataset,
    *,
    batch_size: int,
    cache_file: str | Path | None = None,
    keep_maps: bool = True,
) -> dict[str, torch.Tensor]:
    """``{"maps": (N, D', h, w), "cls": (N, D)}`` for every item of ``dataset`` (``cls``
    only without ``keep_maps``), read from ``cache_file`` when it exists, else computed
    (and written there)."""
    if cache_file is not None and Path(cache_file).is_file():
        return torch.load(cache_file, map_location="cpu", weights_only=True)
    maps, cls = [], []
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        m, c = extractor(batch["image"])
        if keep_maps:
            maps.append(m.cpu())
        cls.append(c.cpu())
    feats = {"cls": torch.cat(cls)} | ({"maps": torch.cat(maps)} if keep_maps else {})
    if cache_file is not None:
        cache_file = Path(cache_file)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.tmp{os.getpid()}")
        torch.save(feats, tmp)
        os.replace(tmp, cache_file)  # a killed run never leaves half a cache
    return feats


class CachedFeatureDataset(Dataset):
    """Items of ``base`` (loaded without images) with their cached ``features`` added."""

    def __init__(self, base: Dataset, feats: dict[str, torch.Tensor]) -> None:
        if len(feats["maps"]) != len(base):
            raise ValueError(f"feature cache holds {len(feats['maps'])} items but the data set has {len(base)}")
        self.base, self.feats = base, feats
        base.with_image = False

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict:
        item = self.base[i]
        item["features"] = self.feats["maps"][i]
        return item
