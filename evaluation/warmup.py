"""Stand-ins for the pretraining stage on the synthetic set: short runs that give a
backbone "that has learned something", to probe against a random one when no pretraining
checkpoint is at hand. Both train on freshly rendered images apart from the probe splits
(``synthetic_stream``), for a few hundred steps; neither is a pretraining recipe.

``ssl_warmup`` (no labels) is a small version of the Sapiens2 objective,
L = L_MAE + ``contrastive_weight`` * L_CL:

- L_MAE: masked-patch reconstruction (``models.MAEDecoder``, normalised-pixel targets,
  patch-wise random masking at ``mask_ratio``) on two views of each image. Visible patches
  are reconstructed too, with weight ``visible_weight``: with only a few hundred steps this
  keeps the local detail that dense probes read off the last block.
- L_CL: InfoNCE between the two views' CLS tokens (a linear projection, temperature 0.1),
  the views differing in crop, flip, brightness and their masks.

``supervised_warmup`` uses two of the synthetic labels: each patch token predicts the
part-class shares of its patch (soft cross-entropy through a linear layer) and the CLS token
the pose category. It tells whether the probes see what a backbone knows; keypoints,
normals, albedo and depth are not in its objective.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from evaluation.datasets import to_tensor
from evaluation.probe_trainer import warmup_cosine
from evaluation.synthetic import render_sample
from models import MAEDecoder, MAEDecoderConfig, normalized_pixel_targets


def synthetic_stream(count: int, hw: tuple[int, int], seed: int) -> dict[str, torch.Tensor]:
    """``images`` (N, 3, H, W) normalised, ``parts`` (N, H, W) part classes and ``category``
    (N,) of ``count`` synthetic images (a stream apart from the probe splits)."""
    samples = [render_sample(np.random.default_rng([seed, 2, i]), hw) for i in range(count)]
    return {
        "images": torch.stack([to_tensor(s["image"]) for s in samples]),
        "parts": torch.from_numpy(np.stack([s["seg"] for s in samples]).astype(np.int64)),
        "category": torch.tensor([s["category"] for s in samples]),
    }


def _view(x_BCHW: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A random crop (70-100% of each side) resized back, a horizontal flip for half the
    batch, and a brightness/contrast change."""
    B, _, H, W = x_BCHW.shape
    s = 0.7 + 0.3 * torch.rand(2, generator=gen)
    h, w = int(H * s[0]), int(W * s[1])
    top = int(torch.randint(H - h + 1, (1,), generator=gen))
    left = int(torch.randint(W - w + 1, (1,), generator=gen))
    v = F.interpolate(x_BCHW[:, :, top : top + h, left : left + w], size=(H, W), mode="bilinear", align_corners=False)
    flip = torch.rand(B, generator=gen) < 0.5
    v = torch.where(flip[:, None, None, None], v.flip(-1), v)
    gain = 0.8 + 0.4 * torch.rand(B, 1, 1, 1, generator=gen)
    return v * gain + 0.2 * torch.randn(B, 1, 1, 1, generator=gen)


def ssl_warmup(
    backbone: torch.nn.Module,
    images_NCHW: torch.Tensor,
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    mask_ratio: float = 0.75,
    visible_weight: float = 0.5,
    contrastive_weight: float = 0.4,
    seed: int = 0,
) -> list[float]:
    """Train ``backbone`` in place (see the module docstring); returns the loss per step."""
    gen = torch.Generator().manual_seed(seed)
    stride = backbone.feature_stride
    h, w = images_NCHW.shape[2] // stride, images_NCHW.shape[3] // stride
    dim = backbone.embed_dim
    decoder = MAEDecoder(
        dim,
        pixels_per_token=stride * stride * images_NCHW.shape[1],
        config=MAEDecoderConfig(embed_dim=dim, depth=2, num_heads=max(1, dim // 16)),
    )
    projection = torch.nn.Linear(dim, dim)
    num_visible = max(1, round(h * w * (1 - mask_ratio)))

    def step_loss() -> torch.Tensor:
        x = images_NCHW[torch.randint(len(images_NCHW), (batch_size,), generator=gen)]
        recon, cls = [], []
        for view in (_view(x, gen), _view(x, gen)):
            visible = torch.rand(batch_size, h * w, generator=gen).argsort(dim=1).argsort(dim=1) < num_visible
            out = backbone(view, visible_mask=visible)
            pred = decoder(out.tokens, out.ids_keep, out.grid_hw, backbone.num_prefix_tokens)
            err = ((pred - normalized_pixel_targets(view, stride)) ** 2).mean(dim=-1)
            recon.append(err[~visible].mean() + visible_weight * err[visible].mean())
            cls.append(F.normalize(projection(out.cls), dim=-1))
        logits = cls[0] @ cls[1].T / 0.1
        target = torch.arange(batch_size)
        contrastive = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
        return (recon[0] + recon[1]) / 2 + contrastive_weight * contrastive

    return _train(backbone, [decoder, projection], step_loss, steps=steps, lr=lr)


def supervised_warmup(
    backbone: torch.nn.Module,
    stream: dict[str, torch.Tensor],
    *,
    steps: int,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Train ``backbone`` in place on ``synthetic_stream`` labels (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    stride, dim = backbone.feature_stride, backbone.embed_dim
    num_parts = int(stream["parts"].max()) + 1
    shares_NPC = F.avg_pool2d(F.one_hot(stream["parts"], num_parts).permute(0, 3, 1, 2).float(), stride)
    shares_NPC = shares_NPC.flatten(2).transpose(1, 2)
    part_head, category_head = torch.nn.Linear(dim, num_parts), torch.nn.Linear(dim, int(stream["category"].max()) + 1)

    def step_loss() -> torch.Tensor:
        idx = torch.randint(len(stream["images"]), (batch_size,), generator=gen)
        out = backbone(stream["images"][idx])
        part_loss = -(shares_NPC[idx] * F.log_softmax(part_head(out.patch_tokens), dim=-1)).sum(dim=-1).mean()
        return part_loss + F.cross_entropy(category_head(out.cls), stream["category"][idx])

    return _train(backbone, [part_head, category_head], step_loss, steps=steps, lr=lr)


def _train(backbone: torch.nn.Module, heads: list[torch.nn.Module], step_loss, *, steps: int, lr: float) -> list[float]:
    """AdamW (weight decay 0.05) with warm-up + cosine and gradient clipping at 1 on the
    backbone and ``heads``; ``step_loss()`` samples a batch and returns its loss. The backbone
    is left in eval mode and frozen; returns the loss per step."""
    params = list(backbone.parameters()) + [p for head in heads for p in head.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: warmup_cosine(step, steps, max(1, steps // 10)))
    backbone.train().requires_grad_(True)
    losses = []
    for _ in range(steps):
        loss = step_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    backbone.eval().requires_grad_(False)
    return losses
