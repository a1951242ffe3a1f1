"""Light task heads for probing and fine-tuning on backbone feature maps.

Every head takes a (B, C, h, w) feature map, or a list of them (concatenated along C,
e.g. several ``out_indices``), and returns a dict of named outputs:

- pose: ``heatmaps`` (B, K, 4h, 4w), K keypoints (17 COCO, 133 WholeBody, 308 Sapiens).
- seg: ``logits`` (B, num_classes, 4h, 4w), 29 body-part classes by default.
- pointmap: ``xyz`` (B, 3, s*h, s*w) focal-normalised points and ``scale`` (B, 1) > 0.
- normal: ``normal`` (B, 3, s*h, s*w) unit vectors.
- albedo: ``albedo`` (B, 3, s*h, s*w) RGB, unconstrained (clamp for display).
- depth: ``depth`` (B, 1, s*h, s*w) > 0 (softplus), for Sapiens v1's depth fine-tuning.

Pose and segmentation upsample 4x (``upsample``) with transposed convs (as in Sapiens); the dense
regressions go back to full resolution (s = feature stride, 16 by default) with
PixelShuffle stages, as in Sapiens2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

Features = torch.Tensor | Sequence[torch.Tensor]


def _as_map(features: Features) -> torch.Tensor:
    return features if isinstance(features, torch.Tensor) else torch.cat(list(features), dim=1)


def _norm(channels: int) -> nn.GroupNorm:
    # GroupNorm: independent of the (often small, per-GPU) probing batch size.
    return nn.GroupNorm(math.gcd(32, channels), channels)


def _log2(factor: int, what: str) -> int:
    if factor < 1 or factor & (factor - 1):
        raise ValueError(f"{what} must be a power of two, got {factor}")
    return factor.bit_length() - 1


class DeconvHead(nn.Module):
    """1x1 reduce, ``log2(upsample)`` x (transposed conv 4x4 stride 2, norm, GELU), 1x1 out."""

    def __init__(self, in_dim: int, out_channels: int, *, hidden_dim: int = 256, upsample: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_dim, hidden_dim, 1), _norm(hidden_dim), nn.GELU()]
        for _ in range(_log2(upsample, "upsample")):
            layers += [nn.ConvTranspose2d(hidden_dim, hidden_dim, 4, stride=2, padding=1), _norm(hidden_dim), nn.GELU()]
        self.body = nn.Sequential(*layers)
        self.out = nn.Conv2d(hidden_dim, out_channels, 1)

    def forward(self, features: Features) -> torch.Tensor:
        return self.out(self.body(_as_map(features)))


class PixelShuffleUpsampler(nn.Module):
    """1x1 reduce, then per 2x step: conv3x3 to 4*c' channels, PixelShuffle(2), norm, GELU.

    Widths halve at each step (down to ``min_dim``) so the full-resolution stages stay cheap.
    """

    def __init__(
        self, in_dim: int, out_channels: int, *, hidden_dim: int = 256, min_dim: int = 32, upsample: int = 16
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_dim, hidden_dim, 1), _norm(hidden_dim), nn.GELU()]
        width = hidden_dim
        for _ in range(_log2(upsample, "upsample")):
            nxt = max(min_dim, width // 2)
            layers += [nn.Conv2d(width, 4 * nxt, 3, padding=1), nn.PixelShuffle(2), _norm(nxt), nn.GELU()]
            width = nxt
        self.body = nn.Sequential(*layers)
        self.out = nn.Conv2d(width, out_channels, 3, padding=1)

    def forward(self, features: Features) -> torch.Tensor:
        return self.out(self.body(_as_map(features)))


class LightPoseHeatmapHead(nn.Module):
    def __init__(self, in_dim: int, *, num_keypoints: int = 308, upsample: int = 4, hidden_dim: int = 256) -> None:
        super().__init__()
        if num_keypoints < 1:
            raise ValueError("num_keypoints must be positive (17, 133 or 308 for the usual sets)")
        self.decoder = DeconvHead(in_dim, num_keypoints, hidden_dim=hidden_dim, upsample=upsample)

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        return {"heatmaps": self.decoder(features)}


class SegmentationHead(nn.Module):
    def __init__(self, in_dim: int, *, num_classes: int = 29, upsample: int = 4, hidden_dim: int = 256) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError("num_classes must be at least 2")
        self.decoder = DeconvHead(in_dim, num_classes, hidden_dim=hidden_dim, upsample=upsample)

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        return {"logits": self.decoder(features)}


class LightNormalHead(nn.Module):
    def __init__(self, in_dim: int, *, upsample: int = 16, hidden_dim: int = 256) -> None:
        super().__init__()
        self.decoder = PixelShuffleUpsampler(in_dim, 3, hidden_dim=hidden_dim, upsample=upsample)

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        return {"normal": F.normalize(self.decoder(features), dim=1, eps=1e-6)}


class LightAlbedoHead(nn.Module):
    def __init__(self, in_dim: int, *, upsample: int = 16, hidden_dim: int = 256) -> None:
        super().__init__()
        self.decoder = PixelShuffleUpsampler(in_dim, 3, hidden_dim=hidden_dim, upsample=upsample)

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        return {"albedo": self.decoder(features)}


class DepthHead(nn.Module):
    def __init__(self, in_dim: int, *, upsample: int = 16, hidden_dim: int = 256) -> None:
        super().__init__()
        self.decoder = PixelShuffleUpsampler(in_dim, 1, hidden_dim=hidden_dim, upsample=upsample)

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        return {"depth": F.softplus(self.decoder(features)) + 1e-6}


class LightPointmapHead(nn.Module):
    """Per-pixel focal-normalised XYZ plus one positive scale per image (from pooled features)."""

    def __init__(self, in_dim: int, *, upsample: int = 16, hidden_dim: int = 256) -> None:
        super().__init__()
        self.decoder = PixelShuffleUpsampler(in_dim, 3, hidden_dim=hidden_dim, upsample=upsample)
        self.scale_mlp = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, 1))

    def forward(self, features: Features) -> dict[str, torch.Tensor]:
        x = _as_map(features)
        log_scale_B1 = self.scale_mlp(x.mean(dim=(2, 3)))
        return {"xyz": self.decoder(x), "scale": log_scale_B1.exp()}


TASK_HEADS: dict[str, type[nn.Module]] = {
    "pose": LightPoseHeatmapHead,
    "seg": SegmentationHead,
    "pointmap": LightPointmapHead,
    "normal": LightNormalHead,
    "albedo": LightAlbedoHead,
    "depth": DepthHead,
}


def build_task_head(task: str, in_dim: int, **kwargs) -> nn.Module:
    """``build_task_head("pose", 1024, num_keypoints=133)``; kwargs go to the head class."""
    if task not in TASK_HEADS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASK_HEADS)}")
    return TASK_HEADS[task](in_dim, **kwargs)
