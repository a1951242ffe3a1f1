"""Any task checkpoint in the released layout, loaded as a ``TaskModel``: the released task
models (``models.task_models``) and the platform's fine-tune exports.

A fine-tune export (``evaluation.finetune``: ``<task dir>/export/model.safetensors``) has the
released key prefixes (``backbone.`` + ``decode_head.``) but the platform's light head
(``models.task_heads``, keys ``decode_head.decoder.*``); its task and backbone name are in
the file's metadata (``task``, ``backbone``), its head's widths in its shapes. Its input size
is not recorded.

``load_task_checkpoint(path)`` tells the two apart by the head's keys, names the released
task model by the file's keys and shapes (``model=`` to say it), and checks every key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from models.io import SAFETENSORS_SUFFIXES, load_state_dict_file, load_weights, weight_shapes
from models.registry import build_backbone, check_family, describe_weights
from models.task_heads import build_task_head
from models.task_models import TaskModel, build_task_model, get_task_spec, infer_task_model

PLATFORM_HEAD_KEY = "decode_head.decoder."
PLATFORM_OUTPUTS: dict[str, tuple[str, ...]] = {
    "pose": ("heatmaps",),
    "seg": ("logits",),
    "pointmap": ("xyz", "scale"),
    "normal": ("normal",),
    "albedo": ("albedo",),
    "depth": ("depth",),
}
"""The platform heads' output dict keys, in the order an export lists them."""


@dataclass(frozen=True)
class TaskCheckpoint:
    """A loaded task checkpoint. ``layout``: ``"released"`` (a released head) or
    ``"platform"`` (a fine-tune export's light head); ``image_hw``: the size it was trained
    at where the checkpoint says (None otherwise); ``outputs``: names of what it returns."""

    model: TaskModel
    name: str
    task: str
    layout: str
    image_hw: tuple[int, int] | None
    outputs: tuple[str, ...]


def file_metadata(path: str | Path) -> dict:
    """The ``meta`` a weights file carries (``models.io.save_state_dict_file``'s), else {}."""
    path = Path(path)
    if path.suffix in SAFETENSORS_SUFFIXES:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            meta = (f.metadata() or {}).get("meta")
    else:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        meta = obj.get("meta") if isinstance(obj, Mapping) else None
    if isinstance(meta, str):
        meta = json.loads(meta) if meta else {}
    return dict(meta) if isinstance(meta, Mapping) else {}


def load_task_checkpoint(
    path: str | Path, *, model: str | None = None, task: str | None = None, feature_block: int = -1
) -> TaskCheckpoint:
    """Load a released-layout task checkpoint (see the module docstring).

    ``model``: the task model name (released heads) or the backbone name (fine-tune
    exports); ``task`` and ``feature_block`` (the block whose map feeds the head) are for
    fine-tune exports, whose metadata names their task but not their feature block."""
    shapes = weight_shapes(path)
    if any(k.startswith(PLATFORM_HEAD_KEY) for k in shapes):
        return _load_platform(path, shapes, model=model, task=task, feature_block=feature_block)
    spec = get_task_spec(model) if model else infer_task_model(path)
    loaded = build_task_model(spec, weights=path).eval()
    return TaskCheckpoint(loaded, spec.name, spec.task, "released", spec.image_hw, spec.outputs)


def platform_head_kwargs(task: str, head_shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """``build_task_head`` arguments of a platform head, from its shapes (keys without
    ``decode_head.``): the hidden width, the upsampling (2 ** the number of 2x steps) and
    the keypoint / class count."""
    body = {int(k.split(".")[2]): s for k, s in head_shapes.items() if k.startswith("decoder.body.") and len(s) == 4}
    steps = sum(1 for i in body if i > 0)  # after the 1x1 reduce, one conv (or deconv) per 2x step
    kwargs = {"hidden_dim": body[0][0], "upsample": 2**steps}
    out = head_shapes["decoder.out.weight"][0]
    if task == "pose":
        kwargs["num_keypoints"] = out
    elif task == "seg":
        kwargs["num_classes"] = out
    return kwargs


def _load_platform(
    path: str | Path, shapes: dict, *, model: str | None, task: str | None, feature_block: int
) -> TaskCheckpoint:
    meta = file_metadata(path)
    task = task or meta.get("task")
    if task not in PLATFORM_OUTPUTS:
        raise ValueError(
            f"{path}: a fine-tune export whose task is {task!r}; pass --task ({', '.join(PLATFORM_OUTPUTS)})"
        )
    state = load_state_dict_file(path)
    backbone_state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
    seen = describe_weights(backbone_state)
    name = model or meta.get("backbone") or (seen.label if seen is not None else "")
    backbone = build_backbone(name, device="meta")
    check_family(backbone_state, backbone.config, source=str(path), expected=name)
    head_shapes = {k.removeprefix("decode_head."): s for k, s in shapes.items() if k.startswith("decode_head.")}
    with torch.device("meta"):
        head = build_task_head(task, backbone.embed_dim, **platform_head_kwargs(task, head_shapes))
    loaded = load_weights(TaskModel(backbone, head, feature_block=feature_block), state).to("cpu").eval()
    label = f"{name} {task} (fine-tune export, platform head)"
    return TaskCheckpoint(loaded, label, task, "platform", None, PLATFORM_OUTPUTS[task])
