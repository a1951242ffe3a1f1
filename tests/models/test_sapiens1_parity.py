"""The v1 backbone reproduces the official tiny ViT's outputs (weights, input and outputs
in ``sapiens1_parity_tiny.safetensors``): pretrain-style (CLS, 4x4 table resized to 4x3
at forward time) and fine-tune-style (CLS dropped and table resized at load time, with
and without the pose configs' patch padding 2)."""

import pytest
import torch
from safetensors.torch import load_file

from models import build_backbone, get_config, load_weights, save_state_dict_file
from models.sapiens1 import adapt_state_dict, resize_pos_embed
from tests.models.test_sapiens1_reference import reference_dir

# Max abs error measured (2-core x86_64 CPU, shared; torch 2.14.1, fp32): 7.2e-7 for the
# pretrain-style outputs, 9.5e-7 fine-tune style (outputs up to ~4.2: 1-2 fp32 ulp), 0 for the
# resized position tables. 1e-5 leaves ~20 ulp for another BLAS's summation order.
TOL = 1e-5


@pytest.fixture(scope="module")
def parity() -> dict:
    return load_file(reference_dir() / "sapiens1_parity_tiny.safetensors")


def _weights(parity):
    return {k[len("model/") :]: v for k, v in parity.items() if k.startswith("model/")}


def test_pretrain_style_outputs(parity):
    model = load_weights(build_backbone("sapiens_tiny").eval(), _weights(parity))
    with torch.no_grad():
        out = model(parity["input"])
    assert (out.feature_maps[0] - parity["output"]).abs().max() < TOL
    assert (out.tokens - parity["output_raw"]).abs().max() < TOL
    assert out.grid_hw == (4, 3)


def test_forward_time_pos_embed_resize(parity):
    model = build_backbone("sapiens_tiny")
    load_weights(model, _weights(parity))
    resized = resize_pos_embed(model.pos_embed, (4, 4), (4, 3), num_extra=1)
    assert (resized - parity["pos_embed_resized_4x3"]).abs().max() < TOL
    assert torch.equal(resized[:, 0], model.pos_embed[:, 0])  # the CLS slot is untouched


@pytest.mark.parametrize("padding, key", [(0, "output_finetune_style"), (2, "output_finetune_style_pad2")])
def test_finetune_style_load_hook(parity, padding, key):
    cfg = get_config("sapiens_tiny", img_size=(64, 48), with_cls_token=False, patch_padding=padding)
    state = adapt_state_dict(_weights(parity), cfg)
    assert "cls_token" not in state
    assert (state["pos_embed"] - parity["finetune_style/pos_embed"]).abs().max() < TOL
    model = load_weights(build_backbone(cfg).eval(), state)
    with torch.no_grad():
        assert (model(parity["input"]).feature_maps[0] - parity[key]).abs().max() < TOL


def test_finetune_style_through_build_backbone(parity, tmp_path):
    path = save_state_dict_file(_weights(parity), tmp_path / "tiny_clean.safetensors")
    model = build_backbone("sapiens_tiny", weights=path, img_size=(64, 48), with_cls_token=False).eval()
    with torch.no_grad():
        assert (model(parity["input"]).feature_maps[0] - parity["output_finetune_style"]).abs().max() < TOL
