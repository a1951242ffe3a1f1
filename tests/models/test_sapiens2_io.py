"""Saving and loading official-layout weights: round trips and mismatch errors."""

import json
from fractions import Fraction

import pytest
import torch
from safetensors import safe_open

from models import StateDictMismatchError, build_backbone, load_state_dict_file, load_weights, save_state_dict_file


def _model(seed=0):
    torch.manual_seed(seed)
    return build_backbone("sapiens2_tiny_4k").eval()


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_round_trip_restores_weights_and_outputs(tmp_path, suffix):
    src, dst = _model(0), _model(1)
    path = save_state_dict_file(src, tmp_path / f"w{suffix}", metadata={"arch": "sapiens2_tiny_4k"})
    load_weights(dst, path)
    for (k, a), (k2, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    x = torch.randn(1, 3, 256, 192)
    with torch.no_grad():
        assert torch.equal(src(x).tokens, dst(x).tokens)


def test_safetensors_keeps_official_keys_and_metadata(tmp_path):
    model = _model()
    path = save_state_dict_file(model, tmp_path / "w.safetensors", metadata={"arch": "sapiens2_tiny_4k"})
    with safe_open(path, "pt") as f:
        assert set(f.keys()) == set(model.state_dict())
        assert json.loads(f.metadata()["meta"]) == {"arch": "sapiens2_tiny_4k"}
    assert "tokenizer.w_cls" in load_state_dict_file(path)


def test_build_from_weights_skips_init_and_matches(tmp_path):
    src = _model()
    path = save_state_dict_file(src, tmp_path / "w.safetensors")
    built = build_backbone("sapiens2_tiny_4k", weights=path)
    assert all(not t.is_meta for t in built.state_dict().values())
    for k, v in src.state_dict().items():
        assert torch.equal(v, built.state_dict()[k]), k


def test_mismatch_lists_missing_unexpected_and_misshaped_keys(tmp_path):
    state = dict(_model().state_dict())
    del state["blocks.3.attn.wq.bias"]
    state["head.weight"] = torch.zeros(2)
    state["ln1.weight"] = torch.zeros(32)
    path = save_state_dict_file(state, tmp_path / "bad.safetensors")
    with pytest.raises(StateDictMismatchError) as err:
        load_weights(_model(), path)
    assert isinstance(err.value, ValueError)
    assert err.value.missing == ["blocks.3.attn.wq.bias"]
    assert err.value.unexpected == ["head.weight"]
    assert err.value.mismatched == [("ln1.weight", (64,), (32,))]
    message = str(err.value)
    for needle in ("missing keys (1): blocks.3.attn.wq.bias", "unexpected keys (1): head.weight", "ln1.weight"):
        assert needle in message


def test_a_plain_model_rejects_4k_weights_naming_the_tokenizer_keys(tmp_path):
    path = save_state_dict_file(_model(), tmp_path / "w.safetensors")
    with pytest.raises(StateDictMismatchError) as err:
        load_weights(build_backbone("sapiens2_tiny"), path)
    assert err.value.missing == []
    assert "tokenizer.w_cls" in err.value.unexpected and "tokenizer.local_pos_embed" in err.value.unexpected


def test_prefix_and_wrapped_pt_checkpoints(tmp_path):
    src = _model()
    wrapped = {"model": {f"backbone.{k}": v for k, v in src.state_dict().items()}, "epoch": 3}
    torch.save(wrapped, tmp_path / "ckpt.pt")
    dst = load_weights(_model(1), tmp_path / "ckpt.pt", prefix="backbone.")
    assert torch.equal(dst.cls_token, src.cls_token)


def test_pt_files_load_with_weights_only(tmp_path):
    # Any non-allowlisted class would run code on unpickling; weights_only refuses it.
    torch.save({"state_dict": {"x": torch.zeros(1)}, "obj": Fraction(1, 3)}, tmp_path / "evil.pt")
    with pytest.raises(Exception, match="[Ww]eights only"):
        load_state_dict_file(tmp_path / "evil.pt")


def test_unknown_suffix():
    with pytest.raises(ValueError, match="use .safetensors or .pt"):
        load_state_dict_file("weights.ckpt")
