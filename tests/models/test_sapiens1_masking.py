"""Visible-only (MAE) encoding of the v1 backbone: the same tokens as a full pass whose
attention ignores the masked tokens; the interface matches Sapiens2's."""

import pytest
import torch

from models import build_backbone, get_config
from models.sapiens1 import Sapiens1Backbone


def _masked_reference(model: Sapiens1Backbone, x, visible_BP):
    """Full-grid pass with an attention mask that hides the masked tokens as keys."""
    x_BPD, _, prefix = model.embed(x)
    B = x_BPD.shape[0]
    x_BND = torch.cat((prefix.expand(B, -1, -1), x_BPD), dim=1)
    keep_BN = torch.cat((torch.ones(B, model.num_prefix_tokens, dtype=torch.bool), visible_BP), dim=1)
    attn_mask = keep_BN[:, None, None, :]
    for block in model.layers:
        x_BND = block(x_BND, attn_mask)
    return model.ln1(x_BND)


@pytest.mark.parametrize("pretrain", [True, False])
def test_visible_only_equals_full_pass_on_visible_tokens(pretrain):
    torch.manual_seed(0)
    cfg = get_config("sapiens_small")
    model = build_backbone(cfg.as_pretrain((128, 128)) if pretrain else cfg).eval()
    x = torch.randn(2, 3, 128, 128)
    P = 64
    gen = torch.Generator().manual_seed(1)
    visible = torch.zeros(2, P, dtype=torch.bool)
    for b in range(2):
        visible[b, torch.randperm(P, generator=gen)[:16]] = True
    with torch.no_grad():
        out = model(x, visible_mask=visible)
        ref = _masked_reference(model, x, visible)
    s = model.num_prefix_tokens
    assert out.tokens.shape == (2, s + 16, 256) and out.feature_maps == []
    for b in range(2):
        ids = visible[b].nonzero().squeeze(1)
        assert torch.equal(out.ids_keep[b], ids)
        assert torch.allclose(out.patch_tokens[b], ref[b, s:][ids], atol=1e-5)
        if s:
            assert torch.allclose(out.cls[b], ref[b, 0], atol=1e-5)


def test_all_visible_equals_the_plain_forward():
    model = build_backbone(get_config("sapiens_small").as_pretrain((128, 128))).eval()
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        full = model(x)
        masked = model.forward_masked(x, torch.ones(1, 64, dtype=torch.bool))
    assert torch.allclose(full.tokens, masked.tokens, atol=1e-6)


def test_unequal_visible_counts_are_refused():
    model = build_backbone("sapiens_small")
    visible = torch.zeros(2, 48, dtype=torch.bool)
    visible[0, :10], visible[1, :11] = True, True
    with pytest.raises(ValueError, match="same, non-zero number"):
        model(torch.randn(2, 3, 128, 96), visible_mask=visible)


def test_other_sizes_resize_the_table_and_intermediate_maps_are_unnormalised():
    model = build_backbone("sapiens_small").eval()  # table for 8x6
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 160), out_indices=(3, -1))
    assert out.grid_hw == (4, 10) and [m.shape for m in out.feature_maps] == [(1, 256, 4, 10)] * 2
    assert out.storage.shape == (1, 0, 256)
    assert torch.allclose(out.cls, out.patch_tokens.mean(1))  # no CLS token in the fine-tune layout
