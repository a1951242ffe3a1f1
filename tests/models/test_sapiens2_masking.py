"""Visible-only (MAE) encoding, feature maps and variable input sizes.

Models here use LayerScale 1.0 so attention visibly shapes the outputs, and fp32 RoPE
tables so that the two computations compared round identically (bf16 tables would add
rare 1-ulp flips between differently-sized matmuls, not a difference in meaning).
"""

import pytest
import torch

from models import build_backbone

PREFIX = 9  # CLS + 8 storage tokens


def _model(name="sapiens2_tiny", **overrides):
    torch.manual_seed(0)
    return build_backbone(name, layerscale_init=1.0, rope_dtype="float32", **overrides).eval()


def _random_visible(B, P, V, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(P, generator=g)[:V] for _ in range(B)])
    return torch.zeros(B, P, dtype=torch.bool).scatter(1, ids, True)


def _full_encoding_with_key_mask(model, x, visible_BP):
    """All tokens in the sequence, but masked tokens hidden as attention keys."""
    x_BPD, (h, w) = model.embed(x)
    B = x.shape[0]
    prefix = torch.cat((model.cls_token, model.storage_tokens), dim=1).expand(B, -1, -1)
    x_BND = torch.cat((prefix, x_BPD), dim=1)
    keys_BN = torch.cat((torch.ones(B, PREFIX, dtype=torch.bool), visible_BP), dim=1)
    rope = model.rope_embed(h, w)
    for block in model.blocks:
        x_BND = block(x_BND, rope, attn_mask=keys_BN[:, None, None, :])
    return model.ln1(x_BND)


@torch.no_grad()
def test_all_visible_equals_plain_forward():
    model = _model()
    x = torch.randn(2, 3, 64, 48)
    full = model(x)
    masked = model.forward_masked(x, torch.ones(2, 12, dtype=torch.bool))
    assert torch.equal(masked.ids_keep, torch.arange(12).expand(2, -1))
    torch.testing.assert_close(masked.tokens, full.tokens, rtol=0, atol=1e-6)


@torch.no_grad()
def test_visible_only_equals_full_sequence_with_masked_keys():
    model = _model()
    x = torch.randn(2, 3, 96, 64)  # 6 x 4 = 24 patches
    visible = _random_visible(2, 24, 6)
    out = model(x, visible_mask=visible)
    ref_BND = _full_encoding_with_key_mask(model, x, visible)
    assert out.tokens.shape == (2, PREFIX + 6, 64)
    assert out.feature_maps == []
    torch.testing.assert_close(out.tokens[:, :PREFIX], ref_BND[:, :PREFIX], rtol=0, atol=1e-5)
    ref_visible = ref_BND[:, PREFIX:][visible].view(2, 6, -1)  # grid order == ids_keep order
    torch.testing.assert_close(out.patch_tokens, ref_visible, rtol=0, atol=1e-5)
    # ... and masking does matter: the plain forward differs.
    plain = model(x).patch_tokens[visible].view(2, 6, -1)
    assert (plain - out.patch_tokens).abs().max() > 1e-2


@torch.no_grad()
def test_each_sample_uses_only_its_own_mask():
    model = _model()
    x = torch.randn(3, 3, 64, 48)
    visible = _random_visible(3, 12, 4, seed=7)
    batch = model(x, visible_mask=visible).tokens
    for b in range(3):
        alone = model(x[b : b + 1], visible_mask=visible[b : b + 1]).tokens
        torch.testing.assert_close(batch[b : b + 1], alone, rtol=0, atol=1e-5)


@torch.no_grad()
def test_masking_with_the_4k_tokenizer_selects_window_tokens():
    model = _model("sapiens2_tiny_4k")
    x = torch.randn(2, 3, 256, 192)  # 16 x 12 patches -> 4 x 3 windows
    full = model(x)
    assert full.grid_hw == (4, 3)
    masked = model(x, visible_mask=torch.ones(2, 12, dtype=torch.bool))
    torch.testing.assert_close(masked.tokens, full.tokens, rtol=0, atol=1e-6)
    visible = _random_visible(2, 12, 3)
    ref_BND = _full_encoding_with_key_mask(model, x, visible)
    out = model(x, visible_mask=visible)
    torch.testing.assert_close(out.patch_tokens, ref_BND[:, PREFIX:][visible].view(2, 3, -1), rtol=0, atol=1e-5)


def test_bad_masks_raise():
    model = _model()
    x = torch.randn(2, 3, 64, 48)
    uneven = torch.zeros(2, 12, dtype=torch.bool)
    uneven[0, :3] = True
    uneven[1, :4] = True
    with pytest.raises(ValueError, match="same, non-zero number"):
        model(x, visible_mask=uneven)
    with pytest.raises(ValueError, match="shape"):
        model(x, visible_mask=torch.ones(2, 11, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        model(x, visible_mask=torch.ones(2, 12))


@torch.no_grad()
def test_outputs_and_feature_maps_for_variable_sizes():
    model = _model(out_indices=(3, 9, -1))
    for H, W in [(64, 48), (80, 112)]:
        out = model(torch.randn(2, 3, H, W))
        h, w = H // 16, W // 16
        assert out.grid_hw == (h, w)
        assert out.tokens.shape == (2, PREFIX + h * w, 64)
        assert out.cls.shape == (2, 64) and out.storage.shape == (2, 8, 64)
        assert [tuple(f.shape) for f in out.feature_maps] == [(2, 64, h, w)] * 3
        # The last map is the final tokens laid out on the grid.
        torch.testing.assert_close(out.feature_maps[-1], out.patch_tokens.transpose(1, 2).reshape(2, 64, h, w))
    with pytest.raises(ValueError, match="multiple of the patch size"):
        model(torch.randn(1, 3, 60, 48))


@torch.no_grad()
def test_intermediate_feature_maps_are_normed_block_outputs():
    model = _model()
    x = torch.randn(1, 3, 64, 48)
    shallow = model(x, out_indices=(0,)).feature_maps[0]
    prefix = torch.cat((model.cls_token, model.storage_tokens), dim=1)
    x_BPD, (h, w) = model.embed(x)
    block0 = model.blocks[0](torch.cat((prefix, x_BPD), dim=1), model.rope_embed(h, w))
    want = model.ln1(block0)[:, PREFIX:].transpose(1, 2).reshape(1, 64, h, w)
    torch.testing.assert_close(shallow, want)


def test_out_indices_override_is_checked():
    with pytest.raises(ValueError, match="out_indices"):
        _model()(torch.randn(1, 3, 32, 32), out_indices=(18,))
