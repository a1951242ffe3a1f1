"""Every Sapiens v1 size matches the released layouts (built on the meta device): the
fine-tuned task checkpoints' backbone keys, shapes, parameter count and forward FLOPs at
1024x768, the pretrain ``*_clean`` layout and the MAE decoder's ``neck.*`` keys."""

import json
import os
from pathlib import Path

import pytest
import torch

from models import build_backbone, count_flops, count_params, get_config, list_models
from models.registry import family_of
from models.sapiens1 import Sapiens1MAEDecoder, sincos_pos_embed

SIZES = ["sapiens_0.3b", "sapiens_0.6b", "sapiens_1b", "sapiens_2b"]


def reference_dir() -> Path:
    repo = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("SAPIENS1_REFERENCE_DIR"), repo / "shared/reference", repo.parent / "shared/reference"]
    for c in candidates:
        if c and (Path(c) / "sapiens1_reference.json").exists():
            return Path(c)
    pytest.fail("shared/reference not found; set SAPIENS1_REFERENCE_DIR")


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads((reference_dir() / "sapiens1_reference.json").read_text())


def test_registry_lists_every_v1_size_in_the_sapiens1_family():
    assert set(SIZES) <= set(list_models())
    assert {family_of(n) for n in SIZES} == {"sapiens1"}
    assert family_of("sapiens2_0.4b") == "sapiens2"


@pytest.mark.parametrize("name", SIZES)
def test_finetune_layout_keys_shapes_and_params(name, reference):
    ref = reference[name]
    model = build_backbone(name, device="meta")
    got = {f"backbone.{k}": list(v.shape) for k, v in model.state_dict().items()}
    assert got == ref["state_dict"]
    assert count_params(model) == ref["num_params"]
    assert len(got) == ref["num_state_dict_tensors"]


@pytest.mark.parametrize("name", SIZES)
def test_pretrain_layout_keys_shapes_and_params(name, reference):
    ref = reference[name]
    model = build_backbone(get_config(name).as_pretrain(), device="meta")
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == ref["state_dict_pretrain_clean"]
    assert count_params(model) == ref["num_params_pretrain_backbone"]
    assert not model.pos_embed.requires_grad and model.cls_token.requires_grad


@pytest.mark.parametrize("name", SIZES)
def test_forward_flops_at_1024x768(name, reference):
    want = reference[name]["flops_fwd_1x1024x768"]
    got = count_flops(name, hw=(1024, 768))
    assert abs(got - want) / want < 0.02, (got, want)


@pytest.mark.parametrize("name", ["sapiens_0.3b", "sapiens_2b"])
def test_pretrain_module_flops_square_and_resized(name, reference):
    model = build_backbone(get_config(name).as_pretrain(), device="meta")
    for hw, key in (
        ((1024, 1024), "flops_fwd_pretrain_backbone_1x1024x1024_nomask"),
        ((1024, 768), "flops_fwd_pretrain_backbone_1x1024x768_nomask"),
    ):
        want = reference[name][key]
        assert abs(count_flops(model, hw=hw) - want) / want < 0.02, (hw, want)


@pytest.mark.parametrize("name", SIZES)
def test_mae_decoder_neck_layout_and_params(name, reference):
    cfg = get_config(name)
    with torch.device("meta"):
        decoder = Sapiens1MAEDecoder(cfg.embed_dim, pixels_per_token=16 * 16 * 3, grid_hw=(64, 64))
    got = {f"neck.{k}": list(v.shape) for k, v in decoder.state_dict().items()}
    assert got == reference[name]["state_dict_pretrain_full_extra_neck"]
    assert sum(p.numel() for p in decoder.parameters()) == reference["pretrain_mae"]["decoder"]["params"][name]


def test_sincos_table_follows_the_stated_formula():
    dim, (h, w) = 32, (3, 5)
    table = sincos_pos_embed((h, w), dim)
    q = dim // 4
    r, c, i = 2, 4, 3  # token t = r*w + c, frequency i
    omega = 10000.0 ** (-i / q)
    row = table[r * w + c]
    expected = [row[i], row[q + i], row[2 * q + i], row[3 * q + i]]
    for got, want in zip(
        expected,
        [
            torch.sin(torch.tensor(r * omega)),
            torch.cos(torch.tensor(r * omega)),
            torch.sin(torch.tensor(c * omega)),
            torch.cos(torch.tensor(c * omega)),
        ],
    ):
        assert abs(float(got) - float(want)) < 1e-6


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"num_heads": 5}, "divisible by num_heads"),
        ({"embed_dim": 66, "num_heads": 2}, "divisible by 4"),
        ({"patch_padding": 16}, "patch_padding"),
        ({"out_indices": (4,)}, "out_indices"),
        ({"img_size": (0, 64)}, "img_size"),
    ],
)
def test_bad_config_raises_value_error(changes, needle):
    with pytest.raises(ValueError, match=needle):
        get_config("sapiens_tiny", **changes)
