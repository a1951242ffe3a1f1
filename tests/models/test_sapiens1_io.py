"""Loading v1 weights in both released layouts (our own random init, saved and reloaded),
and the one-line errors for weights of the wrong family or size."""

import pytest
import torch

from models import StateDictMismatchError, build_backbone, get_config, save_state_dict_file
from models.registry import WeightsFamilyError, check_weights_file
from models.sapiens1 import pretrain_state_dict

SMALL = "sapiens_small"  # fine-tune layout, 128x96 (8x6 grid)


def _pretrain_model(seed=0, img_size=(128, 128)):
    torch.manual_seed(seed)
    return build_backbone(get_config(SMALL).as_pretrain(img_size)).eval()


def test_pretrain_clean_pt_loads_into_the_pretrain_layout(tmp_path):
    src = _pretrain_model()
    torch.save(pretrain_state_dict(src), tmp_path / "sapiens_small_clean.pth")  # flat dict, like the release
    dst = build_backbone(get_config(SMALL).as_pretrain((128, 128)), weights=tmp_path / "sapiens_small_clean.pth")
    x = torch.randn(1, 3, 128, 96)
    with torch.no_grad():
        assert torch.equal(src(x).tokens, dst.eval()(x).tokens)
    assert not dst.pos_embed.requires_grad


def test_pretrain_clean_loads_into_the_finetune_layout(tmp_path):
    """CLS dropped, 8x8 sin-cos grid bicubic-resized to 8x6 once at load time: the fine-tune
    model then equals the pretrain model run at 128x96 without its CLS token's influence
    on the table (the CLS token itself is gone, so only the table is compared)."""
    src = _pretrain_model()
    path = save_state_dict_file(pretrain_state_dict(src), tmp_path / "clean.safetensors")
    model = build_backbone(SMALL, weights=path)
    assert model.pos_embed.shape == (1, 8 * 6, 256) and model.pos_embed.requires_grad
    assert not hasattr(model, "cls_token")
    grid = src.pos_embed[:, 1:].reshape(1, 8, 8, 256).permute(0, 3, 1, 2)
    want = torch.nn.functional.interpolate(grid, size=(8, 6), mode="bicubic", align_corners=False)
    assert torch.allclose(model.pos_embed, want.flatten(2).transpose(1, 2))
    assert torch.equal(model.layers[3].attn.qkv.weight, src.layers[3].attn.qkv.weight)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_finetuned_state_dict_with_backbone_and_head_keys(tmp_path, suffix):
    torch.manual_seed(1)
    src = build_backbone(SMALL).eval()
    state = {f"backbone.{k}": v for k, v in src.state_dict().items()}
    state["decode_head.conv_seg.weight"] = torch.randn(28, 768, 1, 1)
    state["decode_head.conv_seg.bias"] = torch.randn(28)
    if suffix == ".pth":
        torch.save({"state_dict": state, "meta": {"epoch": 3}}, tmp_path / f"task{suffix}")
    else:
        save_state_dict_file(state, tmp_path / f"task{suffix}")
    dst = build_backbone(SMALL, weights=tmp_path / f"task{suffix}").eval()
    x = torch.randn(2, 3, 128, 96)
    with torch.no_grad():
        assert torch.equal(src(x).feature_maps[0], dst(x).feature_maps[0])
    check_weights_file(SMALL, tmp_path / f"task{suffix}")  # the header-only check agrees


def _sapiens2_file(tmp_path, name="sapiens2_tiny"):
    return save_state_dict_file(build_backbone(name, device="meta").to_empty(device="cpu"), tmp_path / "s2.safetensors")


def test_sapiens2_weights_into_a_v1_model_name_both(tmp_path):
    path = _sapiens2_file(tmp_path)
    for call in (
        lambda: build_backbone("sapiens_tiny", weights=path),
        lambda: check_weights_file("sapiens_tiny", path),
    ):
        with pytest.raises(WeightsFamilyError) as err:
            call()
        message = str(err.value)
        assert "\n" not in message and str(path) in message
        assert "look like sapiens2_tiny (key storage_tokens / embed dim 64, 18 blocks)" in message
        assert "expected sapiens_tiny" in message


def test_v1_weights_into_a_sapiens2_model(tmp_path):
    path = save_state_dict_file(_pretrain_model(), tmp_path / "v1.safetensors")
    with pytest.raises(
        WeightsFamilyError, match=r"look like sapiens_small \(key layers.0.attn.qkv.weight .*expected sapiens2_small"
    ):
        build_backbone("sapiens2_small", weights=path)


def test_wrong_v1_size_names_the_size(tmp_path):
    torch.manual_seed(0)
    path = save_state_dict_file(build_backbone("sapiens_tiny"), tmp_path / "tiny.safetensors")
    with pytest.raises(WeightsFamilyError) as err:
        check_weights_file("sapiens_small", path)
    assert str(err.value) == (
        f"weights {path} look like sapiens_tiny (key layers.0.attn.qkv.weight / embed dim 64, "
        f"4 blocks), expected sapiens_small (embed dim 256, 12 blocks)"
    )


def test_same_size_with_a_missing_key_lists_it(tmp_path):
    state = dict(build_backbone(SMALL).state_dict())
    del state["layers.2.ln2.bias"]
    path = save_state_dict_file(state, tmp_path / "bad.safetensors")
    with pytest.raises(StateDictMismatchError, match="missing keys \\(1\\): layers.2.ln2.bias"):
        build_backbone(SMALL, weights=path)


def test_a_square_grid_without_cls_slot_is_resized_whole():
    """7x7 = 49 tokens (odd, but no CLS slot before them) into the 8x6 fine-tune grid: all 49
    are resized, none dropped."""
    from models.sapiens1 import adapt_state_dict

    src = build_backbone(SMALL, img_size=(112, 112))
    state = adapt_state_dict(dict(src.state_dict()), get_config(SMALL))
    grid = src.pos_embed.reshape(1, 7, 7, 256).permute(0, 3, 1, 2)
    want = torch.nn.functional.interpolate(grid, size=(8, 6), mode="bicubic", align_corners=False)
    assert torch.allclose(state["pos_embed"], want.flatten(2).transpose(1, 2))
