"""Every registered size matches the official layout: state-dict keys and shapes,
parameter counts, and forward FLOPs at 1024x768 (built on the meta device)."""

import json
import os
from pathlib import Path

import pytest
import torch

from models import Sapiens2Config, build_backbone, count_flops, count_params, get_config, list_models


def _reference_dir() -> Path:
    repo = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("SAPIENS2_REFERENCE_DIR"), repo / "shared/reference", repo.parent / "shared/reference"]
    for c in candidates:
        if c and (Path(c) / "sapiens2_reference.json").exists():
            return Path(c)
    pytest.fail("shared/reference not found; set SAPIENS2_REFERENCE_DIR")


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads((_reference_dir() / "sapiens2_reference.json").read_text())


SIZES = ["sapiens2_0.1b", "sapiens2_0.4b", "sapiens2_0.8b", "sapiens2_1b", "sapiens2_1b_4k", "sapiens2_5b"]


def test_registry_lists_every_released_size():
    assert set(SIZES) <= set(list_models())


@pytest.mark.parametrize("name", SIZES)
def test_state_dict_layout_and_param_count(name, reference):
    ref = reference[name]
    model = build_backbone(name, device="meta")
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == ref["state_dict"]
    assert count_params(model) == ref["num_params"]


@pytest.mark.parametrize("name", [s for s in SIZES if s != "sapiens2_1b_4k"])
def test_forward_flops_at_1024x768(name, reference):
    want = reference[name]["flops_fwd_1x1024x768"]
    got = count_flops(name, hw=(1024, 768))
    assert abs(got - want) / want < 0.02, (got, want)


def test_4k_tokenizer_cuts_global_tokens_16x():
    out = build_backbone("sapiens2_1b_4k", device="meta")(torch.empty(1, 3, 4096, 3072, device="meta"))
    assert out.grid_hw == (64, 48)
    assert out.tokens.shape == (1, 9 + 64 * 48, 1536)


def test_gqa_only_in_middle_blocks():
    model = build_backbone("sapiens2_0.4b", device="meta")
    kv_heads = [block.attn.num_kv_heads for block in model.blocks]
    assert kv_heads == [16] * 8 + [8] * 8 + [16] * 8
    tiny = build_backbone("sapiens2_tiny", device="meta")
    assert [i for i, b in enumerate(tiny.blocks) if b.attn.num_kv_heads != 4] == [8, 9]


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"num_heads": 5}, "divisible by num_heads"),
        ({"num_heads": 32}, "divisible by 4"),  # head dim 2
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"gqa_range": (4, 40)}, "gqa_range"),
        ({"use_tokenizer": True, "tokenizer_depth": 0}, "tokenizer_depth"),
        ({"out_indices": (18,)}, "out_indices"),
        ({"rope_dtype": "float64"}, "unknown dtype"),
    ],
)
def test_bad_config_raises_value_error(changes, needle):
    with pytest.raises(ValueError, match=needle):
        get_config("sapiens2_tiny", **changes)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model"):
        build_backbone("sapiens2_7b", device="meta")


def test_config_defaults_follow_the_sapiens2_rules():
    cfg = Sapiens2Config(embed_dim=1024, depth=24, num_heads=16)
    assert (cfg.kv_heads, cfg.ffn_dim, cfg.gqa_blocks, cfg.feature_stride) == (8, 4096, range(8, 16), 16)
    assert cfg.replace(use_tokenizer=True, tokenizer_depth=2).feature_stride == 64


def test_meta_build_materialises_with_init_weights():
    """The FSDP path: build on meta, allocate with to_empty, then init_weights."""
    model = build_backbone("sapiens2_tiny", device="meta")
    model.to_empty(device="cpu")
    model.init_weights()
    fresh = build_backbone("sapiens2_tiny")
    assert torch.equal(model.rope_embed.periods, fresh.rope_embed.periods)
    assert torch.equal(model.rope_embed.periods, torch.tensor([1.0, 3.15625, 10.0, 31.625]))  # bf16-rounded
    assert torch.equal(model.blocks[5].attn.gamma.weight, torch.full((64,), 1e-4))
    assert torch.isfinite(model(torch.randn(1, 3, 32, 32)).tokens).all()
