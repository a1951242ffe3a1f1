"""The task heads of the released Sapiens2 and Sapiens v1 task checkpoints, in their layout.

Every head reads the backbone's feature map ``x_BDhw``: the patch tokens after the final
norm, reshaped row-major to (B, D, h, w). Attribute names are the released state-dict keys
(after the ``decode_head.`` / ``head.`` prefix), so the checkpoints load without renaming.

Sapiens2 (``decode_head.``):

- ``PoseHeatmapHead``: deconvs, 1x1 convs, ``conv_pose`` -> heatmaps (B, K, 4h, 4w).
- ``SegHead``: four deconvs, 1x1 convs, ``conv_seg`` -> logits (B, classes, 16h, 16w).
- ``NormalHead``: 3x3 ``input_conv``, PixelShuffle ``upsample_blocks``, 3x3 convs,
  ``conv_normal`` -> (B, 3, 16h, 16w), not normalised (post-processing does that).
- ``PointmapHead``: the normal head's layout with ``conv_pointmap``, plus a scale branch on
  the raw feature map (strided 1x1 convs, flatten in (C, H, W) order, an MLP); ``forward``
  returns ``(pointmap (B, 3, 16h, 16w), scale (B, 1))``.
- ``AlbedoHead``: the normal head's layout with ``RMSNorm2d`` norms and ``conv_albedo``.

Sapiens v1: ``Sapiens1HeatmapHead`` (pose, ``head.``, ``final_layer``) and ``Sapiens1VitHead``
(seg / depth / normal, ``decode_head.``, ``conv_seg``; a train-only ``Dropout2d(0.1)``).

Norms: ``InstanceNorm2d`` with PyTorch defaults (no affine, no running statistics, no
state-dict keys) everywhere but the albedo head. Activations: SiLU. The configurations of
every released task and size are in ``models.task_models``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# ConvTranspose2d (padding, output_padding) for a stride-2 deconv that exactly doubles the map.
_DECONV_PADDING = {4: (1, 0), 3: (1, 1), 2: (0, 0)}


@dataclass(frozen=True, kw_only=True)
class DeconvHeadConfig:
    """Deconvs (stride 2), then convs, then a 1x1 output conv to ``out_channels``.

    Kernel sizes default to 4 for every deconv and 1 for every conv (all released configs)."""

    in_channels: int
    out_channels: int
    deconv_out_channels: tuple[int, ...]
    conv_out_channels: tuple[int, ...]
    deconv_kernel_sizes: tuple[int, ...] = ()
    conv_kernel_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        bad = [k for k in self.deconv_kernels if k not in _DECONV_PADDING]
        if bad:
            raise ValueError(f"deconv kernel sizes must be one of {sorted(_DECONV_PADDING)}, got {bad}")
        if len(self.deconv_kernels) != len(self.deconv_out_channels):
            raise ValueError("deconv_kernel_sizes must have one entry per deconv")
        if len(self.conv_kernels) != len(self.conv_out_channels):
            raise ValueError("conv_kernel_sizes must have one entry per conv")

    @property
    def deconv_kernels(self) -> tuple[int, ...]:
        return self.deconv_kernel_sizes or (4,) * len(self.deconv_out_channels)

    @property
    def conv_kernels(self) -> tuple[int, ...]:
        return self.conv_kernel_sizes or (1,) * len(self.conv_out_channels)


@dataclass(frozen=True, kw_only=True)
class DenseHeadConfig:
    """Input conv, PixelShuffle(2) blocks, convs, a 1x1 output conv (normal, pointmap, albedo).

    The ``scale_*`` fields are the pointmap head's scale branch: strided convs over the raw
    feature map and the widths of its MLP, ``scale_final_layer[0]`` being the flattened size."""

    in_channels: int
    upsample_channels: tuple[int, ...]
    conv_out_channels: tuple[int, ...]
    conv_kernel_sizes: tuple[int, ...] = ()
    out_channels: int = 3
    scale_conv_out_channels: tuple[int, ...] = ()
    scale_conv_kernel_sizes: tuple[int, ...] = ()
    scale_final_layer: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.conv_kernels) != len(self.conv_out_channels):
            raise ValueError("conv_kernel_sizes must have one entry per conv")
        if self.scale_conv_out_channels and len(self.scale_final_layer) < 2:
            raise ValueError("scale_final_layer must list the MLP widths, input first, output last")

    @property
    def conv_kernels(self) -> tuple[int, ...]:
        return self.conv_kernel_sizes or (3,) * len(self.conv_out_channels)


class RMSNorm2d(nn.Module):
    """``nn.RMSNorm`` over the channels of a (B, C, H, W) map, at every pixel (key ``norm.weight``)."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(channels, eps=eps)

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        return self.norm(x_BCHW.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _norm(kind: str, channels: int) -> nn.Module:
    return RMSNorm2d(channels) if kind == "rms" else nn.InstanceNorm2d(channels)


def deconv_layers(in_channels: int, out_channels: tuple[int, ...], kernels: tuple[int, ...]) -> nn.Sequential:
    """[ConvTranspose2d(stride 2, no bias), InstanceNorm2d, SiLU] per entry: indices 0, 3, 6, ..."""
    layers: list[nn.Module] = []
    for out, k in zip(out_channels, kernels):
        pad, out_pad = _DECONV_PADDING[k]
        deconv = nn.ConvTranspose2d(in_channels, out, k, stride=2, padding=pad, output_padding=out_pad, bias=False)
        layers += [deconv, nn.InstanceNorm2d(out), nn.SiLU()]
        in_channels = out
    return nn.Sequential(*layers)


def conv_layers(
    in_channels: int,
    out_channels: tuple[int, ...],
    kernels: tuple[int, ...],
    *,
    norm: str = "instance",
    stride: int = 1,
) -> nn.Sequential:
    """[Conv2d(padding (k-1)//2), norm, SiLU] per entry: indices 0, 3, 6, ..."""
    layers: list[nn.Module] = []
    for out, k in zip(out_channels, kernels):
        layers += [nn.Conv2d(in_channels, out, k, stride=stride, padding=(k - 1) // 2), _norm(norm, out), nn.SiLU()]
        in_channels = out
    return nn.Sequential(*layers)


def _last(channels: tuple[int, ...], default: int) -> int:
    return channels[-1] if channels else default


class _DeconvHead(nn.Module):
    """``deconv_layers`` -> ``conv_layers`` -> the output conv named ``output_layer``."""

    output_layer = "conv_seg"

    def __init__(self, config: DeconvHeadConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.deconv_layers = deconv_layers(c.in_channels, c.deconv_out_channels, c.deconv_kernels)
        width = _last(c.deconv_out_channels, c.in_channels)
        self.conv_layers = conv_layers(width, c.conv_out_channels, c.conv_kernels)
        self.add_module(self.output_layer, nn.Conv2d(_last(c.conv_out_channels, width), c.out_channels, 1))

    def features(self, x_BDhw: torch.Tensor) -> torch.Tensor:
        return self.conv_layers(self.deconv_layers(x_BDhw))

    def forward(self, x_BDhw: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.output_layer)(self.features(x_BDhw))


class PoseHeatmapHead(_DeconvHead):
    """Sapiens2 pose: one heatmap per keypoint at 4x the token grid (two deconvs)."""

    output_layer = "conv_pose"


class SegHead(_DeconvHead):
    """Sapiens2 body-part segmentation: class logits at 16x the token grid (four deconvs)."""

    output_layer = "conv_seg"


class Sapiens1HeatmapHead(_DeconvHead):
    """Sapiens v1 pose (mmpose ``HeatmapHead``): heatmaps at 4x the token grid."""

    output_layer = "final_layer"


class Sapiens1VitHead(_DeconvHead):
    """Sapiens v1 seg / depth / normal (``VitHead``, ``VitDepthHead``, ``VitNormalHead``):
    the output conv after a ``Dropout2d(0.1)`` that acts in training only (no keys)."""

    output_layer = "conv_seg"

    def __init__(self, config: DeconvHeadConfig) -> None:
        super().__init__(config)
        self.dropout = nn.Dropout2d(0.1)

    def forward(self, x_BDhw: torch.Tensor) -> torch.Tensor:
        return self.conv_seg(self.dropout(self.features(x_BDhw)))


class _PixelShuffleHead(nn.Module):
    """``input_conv`` (3x3) -> ``upsample_blocks`` (conv 3x3 to 4c, PixelShuffle(2), norm,
    SiLU; each doubles h and w) -> ``conv_layers`` -> the 1x1 output conv ``output_layer``."""

    output_layer = "conv_normal"
    norm = "instance"

    def __init__(self, config: DenseHeadConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.input_conv = conv_layers(c.in_channels, (c.in_channels,), (3,), norm=self.norm)
        blocks, width = [], c.in_channels
        for out in c.upsample_channels:
            blocks.append(
                nn.Sequential(
                    nn.Conv2d(width, 4 * out, 3, padding=1), nn.PixelShuffle(2), _norm(self.norm, out), nn.SiLU()
                )
            )
            width = out
        self.upsample_blocks = nn.ModuleList(blocks)
        self.conv_layers = conv_layers(width, c.conv_out_channels, c.conv_kernels, norm=self.norm)
        self.add_module(self.output_layer, nn.Conv2d(_last(c.conv_out_channels, width), c.out_channels, 1))

    def dense(self, x_BDhw: torch.Tensor) -> torch.Tensor:
        x = self.input_conv(x_BDhw)
        for block in self.upsample_blocks:
            x = block(x)
        return getattr(self, self.output_layer)(self.conv_layers(x))

    def forward(self, x_BDhw: torch.Tensor) -> torch.Tensor:
        return self.dense(x_BDhw)


class NormalHead(_PixelShuffleHead):
    """Sapiens2 surface normals (unnormalised) at 16x the token grid."""

    output_layer = "conv_normal"


class AlbedoHead(_PixelShuffleHead):
    """Sapiens2 albedo (RGB, clamped to [0, 1] only in post-processing); RMSNorm2d norms."""

    output_layer = "conv_albedo"
    norm = "rms"


class PointmapHead(_PixelShuffleHead):
    """Sapiens2 pointmap: canonical-camera XYZ at 16x the token grid and one scale per image.

    The scale branch fixes the token grid: its flattened size (``scale_final_layer[0]``)
    is the last strided conv's width times its map size (released: 128 x 8 x 6, a 64 x 48 grid)."""

    output_layer = "conv_pointmap"

    def __init__(self, config: DenseHeadConfig) -> None:
        super().__init__(config)
        c = config
        kernels = c.scale_conv_kernel_sizes or (1,) * len(c.scale_conv_out_channels)
        self.scale_conv_layers = conv_layers(c.in_channels, c.scale_conv_out_channels, kernels, stride=2)
        mlp: list[nn.Module] = [nn.Flatten()]
        widths = c.scale_final_layer
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            mlp += [nn.Linear(a, b)] + ([nn.SiLU()] if i < len(widths) - 2 else [])
        self.scale_final_layer = nn.Sequential(*mlp)

    def forward(self, x_BDhw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale_B1 = self.scale_final_layer(self.scale_conv_layers(x_BDhw))
        return self.dense(x_BDhw), scale_B1
