"""MAE decoder, pixel targets and the DINO / iBOT heads."""

import pytest
import torch

from models import (
    DINOHead,
    MAEDecoder,
    MAEDecoderConfig,
    build_backbone,
    normalized_pixel_targets,
    patchify,
    unpatchify,
)

SMALL_DECODER = MAEDecoderConfig(embed_dim=32, depth=2, num_heads=2)


def test_patchify_round_trip_and_layout():
    images = torch.randn(2, 3, 64, 48)
    patches = patchify(images, 16)
    assert patches.shape == (2, 12, 768)
    # Token 4 is grid (1, 1); its first values are pixel (16, 16) channels 0..2.
    assert torch.equal(patches[0, 4, :3], images[0, :, 16, 16])
    assert torch.equal(unpatchify(patches, 16, (4, 3)), images)


def test_normalized_pixel_targets_are_standardised_per_patch():
    targets = normalized_pixel_targets(torch.rand(2, 3, 64, 48) * 5 + 2, 16)
    torch.testing.assert_close(targets.mean(-1), torch.zeros(2, 12), rtol=0, atol=1e-5)
    torch.testing.assert_close(targets.var(-1, unbiased=False), torch.ones(2, 12), rtol=0, atol=1e-4)


def _encode(seed=0):
    torch.manual_seed(seed)
    encoder = build_backbone("sapiens2_tiny")
    visible = torch.zeros(2, 24, dtype=torch.bool)
    visible[0, [0, 5, 7, 20, 23, 11]] = True
    visible[1, [1, 2, 3, 4, 9, 10]] = True
    return encoder, encoder(torch.randn(2, 3, 96, 64), visible_mask=visible)


def test_mae_decoder_predicts_every_grid_token():
    encoder, enc = _encode()
    decoder = MAEDecoder(encoder.embed_dim, pixels_per_token=16 * 16 * 3, config=SMALL_DECODER)
    pred = decoder(enc.tokens, enc.ids_keep, enc.grid_hw, encoder.num_prefix_tokens)
    assert pred.shape == (2, 24, 768)


@torch.no_grad()
def test_mae_decoder_places_tokens_by_id_not_by_order():
    encoder, enc = _encode()
    decoder = MAEDecoder(encoder.embed_dim, pixels_per_token=768, config=SMALL_DECODER).eval()
    pred = decoder(enc.tokens, enc.ids_keep, enc.grid_hw, 9)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = torch.cat((enc.tokens[:, :9], enc.patch_tokens[:, perm]), dim=1)
    torch.testing.assert_close(decoder(shuffled, enc.ids_keep[:, perm], enc.grid_hw, 9), pred, rtol=0, atol=1e-5)


def test_mae_loss_backpropagates_into_the_encoder():
    encoder, enc = _encode()
    decoder = MAEDecoder(encoder.embed_dim, pixels_per_token=768, config=SMALL_DECODER)
    pred = decoder(enc.tokens, enc.ids_keep, enc.grid_hw, 9)
    pred.square().mean().backward()
    grad = encoder.blocks[0].attn.wq.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_dino_head_on_cls_and_on_patches():
    head = DINOHead(64, num_prototypes=100, hidden_dim=48, bottleneck_dim=16)
    assert head(torch.randn(4, 64)).shape == (4, 100)
    assert head(torch.randn(4, 7, 64)).shape == (4, 7, 100)  # iBOT: one instance per patch set


@torch.no_grad()
def test_dino_prototypes_are_weight_normalised():
    head = DINOHead(64, num_prototypes=100, hidden_dim=48, bottleneck_dim=16)
    x = torch.randn(4, 64)
    logits = head(x)
    assert logits.abs().max() <= 1 + 1e-5  # cosine similarities
    head.last_layer.weight.mul_(torch.rand(100, 1) * 10 + 0.1)  # rescale each prototype
    torch.testing.assert_close(head(x), logits)


def test_bad_decoder_config():
    with pytest.raises(ValueError, match="divisible by 4"):
        MAEDecoderConfig(embed_dim=48, num_heads=8)
