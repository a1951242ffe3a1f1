"""Released task models: key sets and shapes equal to the reference for every task and size
(both families, built on the meta device), the released forward, and loading by name with a
strict key check and one-line refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from models.io import StateDictMismatchError, save_state_dict_file
from models.registry import WeightsFamilyError
from models.task_models import (
    TASK_MODELS,
    build_task_model,
    check_task_weights_file,
    describe_task_weights,
    infer_task_model,
    list_task_models,
)

V1_KINDS = (
    "pose_goliath",
    "pose_coco",
    "pose_coco_wholebody",
    "seg_goliath",
    "seg_lip_cihp",
    "seg_face",
    "depth",
    "normal",
)


def _reference(name: str) -> dict:
    repo = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("SAPIENS2_REFERENCE_DIR"), repo / "shared/reference", repo.parent / "shared/reference"]
    for c in candidates:
        if c and (Path(c) / name).exists():
            return json.loads((Path(c) / name).read_text())
    pytest.fail(f"{name} not found in shared/reference; set SAPIENS2_REFERENCE_DIR")


@pytest.fixture(scope="module")
def sapiens2_heads() -> dict:
    return _reference("sapiens2_heads_reference.json")


def _shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def test_every_released_task_and_size_is_registered(sapiens2_heads):
    tasks = sapiens2_heads["tasks"]
    want = {f"sapiens2_{size}_{task}" for task, t in tasks.items() for size in t["sizes"]}
    assert want <= set(list_task_models("sapiens2"))
    released = sapiens2_heads["released_checkpoints"]["tasks"]
    for task, sizes in released.items():
        for size in sizes if isinstance(sizes, list) else []:
            assert TASK_MODELS[f"sapiens2_{size}_{task}"].released_file == tasks[task]["checkpoints"][size]["file"]
    assert TASK_MODELS["sapiens2_1b_albedo"].released_file == ""  # configs only, no published file


@pytest.mark.parametrize("task", ["pose", "seg", "normal", "pointmap", "albedo"])
def test_sapiens2_keys_and_shapes_equal_the_reference(task, sapiens2_heads):
    backbones = _reference("sapiens2_reference.json")
    for size, ref in sapiens2_heads["tasks"][task]["sizes"].items():
        spec = TASK_MODELS[f"sapiens2_{size}_{task}"]
        assert spec.head_class.__name__ == ref["head_class"]
        model = build_task_model(spec, device="meta")
        want = dict(ref["state_dict"]) | {
            f"backbone.{k}": v for k, v in backbones[ref["backbone"]["arch"]]["state_dict"].items()
        }
        assert _shapes(model) == want, f"{spec.name}"
        head = sum(p.numel() for p in model.task_head.parameters())
        assert head == ref["num_params_head"], spec.name


@pytest.mark.parametrize("size", ["0.3b", "0.6b", "1b", "2b"])
def test_sapiens1_keys_and_shapes_equal_the_reference(size):
    ref = _reference("sapiens1_reference.json")
    for kind in V1_KINDS:
        spec = TASK_MODELS[f"sapiens_{size}_{kind}"]
        heads = ref["heads_all_sizes"][f"sapiens_{size}"][kind]
        assert spec.head_prefix == heads["prefix"]
        model = build_task_model(spec, device="meta")
        assert _shapes(model) == dict(heads["state_dict"]) | ref[f"sapiens_{size}"]["state_dict"], spec.name
        assert sum(p.numel() for p in model.task_head.parameters()) == heads["num_params"]
        assert spec.released_file == (ref[f"sapiens_{size}"]["released_checkpoints"].get(kind) or "")


def test_sapiens1_head_classes_equal_the_heads_reference():
    ref = _reference("sapiens1_heads_reference.json")["tasks"]
    names = {"pose_goliath308": "pose_goliath", "pose_coco17": "pose_coco", "seg_goliath28": "seg_goliath"}
    names |= {"pose_coco_wholebody133": "pose_coco_wholebody", "depth": "depth", "normal": "normal"}
    for ref_name, kind in names.items():
        spec = TASK_MODELS[f"sapiens_0.3b_{kind}"]
        args = ref[ref_name]["sizes"]["0.3b"]["args"]
        assert (spec.head.deconv_out_channels, spec.head.conv_out_channels, spec.head.out_channels) == (
            tuple(args["deconv_out_channels"]),
            tuple(args["conv_out_channels"]),
            args.get("out_channels", args.get("num_classes")),
        )


@pytest.mark.parametrize(
    ("name", "shapes"),
    [
        ("sapiens2_tiny_pose", [(2, 308, 16, 12)]),
        ("sapiens2_tiny_seg", [(2, 29, 64, 48)]),
        ("sapiens2_tiny_pointmap", [(2, 3, 256, 192), (2, 1)]),
        ("sapiens_tiny_pose_coco", [(2, 17, 16, 12)]),
        ("sapiens_tiny_depth", [(2, 1, 64, 48)]),
    ],
)
def test_forward_is_the_head_on_the_final_norm_patch_tokens(name, shapes):
    torch.manual_seed(0)
    model = build_task_model(name).eval()
    x = torch.randn(2, 3, *TASK_MODELS[name].image_hw)
    with torch.no_grad():
        out = model(x)
        tokens_BPD = model.backbone(x).patch_tokens
        h, w = x.shape[-2] // 16, x.shape[-1] // 16
        featmap = tokens_BPD.reshape(2, h, w, -1).permute(0, 3, 1, 2)  # row-major, as released
        direct = model.task_head(featmap)
    outs, directs = (out, direct) if isinstance(out, tuple) else ((out,), (direct,))
    assert [tuple(o.shape) for o in outs] == shapes
    assert all(torch.equal(a, b) for a, b in zip(outs, directs))


def test_a_tiny_released_layout_checkpoint_loads_like_a_real_one(tmp_path):
    torch.manual_seed(0)
    source = build_task_model("sapiens2_tiny_seg").eval()
    path = save_state_dict_file(source, tmp_path / "sapiens2_tiny_seg.safetensors")
    keys = set(source.state_dict())
    assert {k.split(".")[0] for k in keys} == {"backbone", "decode_head"} and "backbone.rope_embed.periods" in keys
    assert infer_task_model(path).name == "sapiens2_tiny_seg"
    check_task_weights_file("sapiens2_tiny_seg", path)
    loaded = build_task_model("sapiens2_tiny_seg", weights=path).eval()
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


def test_a_sapiens1_pth_in_the_released_container_loads(tmp_path):
    torch.manual_seed(0)
    source = build_task_model("sapiens_tiny_pose_goliath").eval()
    state = {k: v.clone() for k, v in source.state_dict().items()}
    assert all(k.startswith(("backbone.", "head.")) for k in state)
    path = tmp_path / "sapiens_tiny_goliath.pth"
    torch.save({"state_dict": state, "meta": {"epoch": 210, "mmengine_version": "0.10.3"}}, path)
    loaded = build_task_model("sapiens_tiny_pose_goliath", weights=path).eval()
    assert infer_task_model(path).name == "sapiens_tiny_pose_goliath"
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


def test_a_file_of_another_task_or_size_is_refused_in_one_line(tmp_path):
    path = save_state_dict_file(build_task_model("sapiens2_tiny_seg"), tmp_path / "weights.safetensors")
    with pytest.raises(WeightsFamilyError) as e:
        build_task_model("sapiens2_tiny_pose", weights=path)
    assert str(e.value) == f"{path} looks like sapiens2_tiny seg (29 classes), not sapiens2_tiny pose (308 keypoints)"
    with pytest.raises(WeightsFamilyError, match=r"looks like sapiens2_tiny seg \(29 classes\), not sapiens2_0.4b seg"):
        check_task_weights_file("sapiens2_0.4b_seg", path)
    big = build_task_model("sapiens2_1b_seg", device="meta").state_dict()  # shapes only: nothing allocated
    with pytest.raises(WeightsFamilyError) as e:
        build_task_model("sapiens2_0.4b_pose", weights=big)
    assert (
        str(e.value) == "the state dict looks like sapiens2_1b seg (29 classes), not sapiens2_0.4b pose (308 keypoints)"
    )
    v1 = save_state_dict_file(build_task_model("sapiens_tiny_normal"), tmp_path / "normal.pth")
    with pytest.raises(WeightsFamilyError, match=r"looks like sapiens_tiny normal, not sapiens2_tiny normal$") as e:
        build_task_model("sapiens2_tiny_normal", weights=v1)
    assert "\n" not in str(e.value)


def test_same_task_with_other_keys_fails_the_strict_check(tmp_path):
    state = build_task_model("sapiens2_tiny_pose").state_dict()
    state.pop("decode_head.conv_layers.3.bias")
    state["decode_head.extra.weight"] = torch.zeros(1)
    with pytest.raises(StateDictMismatchError) as e:
        build_task_model("sapiens2_tiny_pose", weights=state)
    assert e.value.missing == ["decode_head.conv_layers.3.bias"] and e.value.unexpected == ["decode_head.extra.weight"]


def test_v1_conv_seg_heads_are_told_apart_by_their_channels():
    seen = {
        kind: describe_task_weights(build_task_model(f"sapiens_0.3b_{kind}", device="meta").state_dict()).label
        for kind in ("seg_goliath", "depth", "normal", "pose_coco")
    }
    assert seen == {
        "seg_goliath": "sapiens_0.3b seg (28 classes)",
        "depth": "sapiens_0.3b depth",
        "normal": "sapiens_0.3b normal",
        "pose_coco": "sapiens_0.3b pose (17 keypoints)",
    }
