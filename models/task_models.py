"""Released task models: a backbone and its task head, by name, loaded with a strict key check.

A task model's forward is the released one: the head on the backbone's patch tokens after
the final norm, reshaped row-major to (B, D, h, w). Names:

- Sapiens2 ``sapiens2_<size>_<task>``: size 0.4b / 0.8b / 1b / 5b, task pose (308 keypoints),
  seg (29 classes), normal, pointmap, albedo; released files ``sapiens2_<size>_<task>.safetensors``
  with ``backbone.`` + ``decode_head.`` keys (albedo has configurations but no released file).
- Sapiens v1 ``sapiens_<size>_<kind>``: size 0.3b / 0.6b / 1b / 2b, kind pose_goliath (308),
  pose_coco (17), pose_coco_wholebody (133), seg_goliath (28), seg_lip_cihp (20), seg_face (19),
  depth, normal; released ``.pth`` files ``{"state_dict", "meta"}`` with ``backbone.`` keys and
  ``head.`` (pose) or ``decode_head.`` (the rest).
- ``sapiens2_tiny_<task>``: every head at the configuration of the Sapiens2 head parity vectors,
  on the ``sapiens2_tiny`` backbone, at the vectors' token grids (64 x 48 images; pointmap
  256 x 192). ``sapiens_tiny_<kind>``: v1 heads of our choosing on ``sapiens_tiny`` in the task
  layout (no CLS, learnt positions for 64 x 48). No weights are released for either; they make
  released-layout checkpoints that load and run like real ones.

``build_task_model(name, weights=path)`` refuses a file of another task, size or family in
one line (``WeightsFamilyError``: what the file looks like and what was expected), then
checks every key and shape (``StateDictMismatchError``). ``infer_task_model(path)`` names
the task model a file holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from models.io import check_state_dict, load_state_dict_file, load_weights, weight_shapes
from models.registry import WeightsFamilyError, build_backbone, describe_weights, family_of
from models.sapiens_heads import (
    AlbedoHead,
    DeconvHeadConfig,
    DenseHeadConfig,
    NormalHead,
    PointmapHead,
    PoseHeatmapHead,
    Sapiens1HeatmapHead,
    Sapiens1VitHead,
    SegHead,
)

HeadConfig = DeconvHeadConfig | DenseHeadConfig

TASK_OUTPUTS: dict[str, tuple[str, ...]] = {
    "pose": ("heatmaps",),
    "seg": ("logits",),
    "normal": ("normal",),
    "pointmap": ("pointmap", "scale"),
    "albedo": ("albedo",),
    "depth": ("depth",),
}
"""What each task's head returns, in order (the released forward's outputs)."""


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """One task model: its backbone (a registered name plus overrides), head and layout.

    ``image_hw``: the input size it was trained at (the released heads' output sizes and the
    pointmap scale branch depend on it). ``vocab``: the ``models/vocab`` name of its labels
    ("" when the checkpoint alone does not say)."""

    name: str
    task: str
    backbone: str
    head_class: type[nn.Module]
    head: HeadConfig
    head_prefix: str = "decode_head."
    image_hw: tuple[int, int] = (1024, 768)
    backbone_overrides: tuple[tuple[str, object], ...] = ()
    released_file: str = ""
    vocab: str = ""

    @property
    def family(self) -> str:
        return family_of(self.backbone)

    @property
    def outputs(self) -> tuple[str, ...]:
        return TASK_OUTPUTS[self.task]

    @property
    def label(self) -> str:
        """What the weights of this model look like: ``"sapiens2_0.4b pose (308 keypoints)"``."""
        return task_label(self.backbone, self.task, self.head.out_channels)


def task_label(backbone: str, task: str | None, channels: int | None) -> str:
    unit = {"pose": "keypoints", "seg": "classes"}.get(task or "")
    detail = f" ({channels} {unit})" if unit and channels is not None else ""
    return f"{backbone} {task or 'with no known task head'}{detail}"


# ---- the table: every released task and size, and the tiny configurations --------------------

_S2_WIDTH = {"0.4b": 1024, "0.8b": 1280, "1b": 1536, "5b": 2432, "tiny": 64}
_S2_POSE = {  # deconv, conv channels; 5B reuses the 0.4B widths
    **dict.fromkeys(("0.4b", "0.8b", "5b"), ((1024, 768), (512, 512, 256))),
    "1b": ((1536, 1024), (768, 512, 256)),
    "tiny": ((32, 24), (16, 16, 8)),
}
_S2_SEG = {
    **dict.fromkeys(("0.4b", "0.8b", "1b", "5b"), ((512, 256, 128, 64), (64, 64))),
    "tiny": ((32, 16, 16, 8), (8, 8)),
}
_TINY_DENSE = ((32, 16, 16, 8), (8, 8, 4))
_S2_DENSE = {  # task -> size -> (upsample, conv) channels
    "normal": {
        **dict.fromkeys(("0.4b", "0.8b", "1b"), ((768, 512, 256, 128), (64, 32, 16))),
        "5b": ((1536, 768, 512, 256), (128, 64, 32)),
        "tiny": _TINY_DENSE,
    },
    "albedo": {
        **dict.fromkeys(("0.4b", "0.8b", "1b"), ((768, 512, 256, 128), (64, 32, 16))),
        "5b": ((1536, 768, 512, 256), (64, 32, 16)),
        "tiny": _TINY_DENSE,
    },
    "pointmap": {
        **dict.fromkeys(("0.4b", "0.8b", "1b"), ((1536, 768, 512, 256), (64, 32, 16))),
        "5b": ((1536, 768, 768, 768), (128, 64, 32)),
        "tiny": _TINY_DENSE,
    },
}
_S2_SCALE = {  # pointmap scale branch: strided conv channels, MLP widths (flattened input first)
    "released": ((1536, 512, 128), (6144, 512, 128, 1)),
    "tiny": ((32, 16, 8), (32, 16, 8, 1)),
}
_S2_TASKS = {  # task -> head class, output channels, vocabulary
    "pose": (PoseHeatmapHead, 308, "goliath_308"),
    "seg": (SegHead, 29, "seg_sapiens2_29"),
    "normal": (NormalHead, 3, ""),
    "pointmap": (PointmapHead, 3, ""),
    "albedo": (AlbedoHead, 3, ""),
}
_S2_RELEASED = ("pose", "seg", "normal", "pointmap")  # albedo: configurations only


def _sapiens2_head(size: str, task: str) -> HeadConfig:
    width, out = _S2_WIDTH[size], _S2_TASKS[task][1]
    if task in ("pose", "seg"):
        deconv, conv = (_S2_POSE if task == "pose" else _S2_SEG)[size]
        return DeconvHeadConfig(in_channels=width, out_channels=out, deconv_out_channels=deconv, conv_out_channels=conv)
    up, conv = _S2_DENSE[task][size]
    scale_conv, mlp = _S2_SCALE["tiny" if size == "tiny" else "released"] if task == "pointmap" else ((), ())
    return DenseHeadConfig(
        in_channels=width,
        upsample_channels=up,
        conv_out_channels=conv,
        out_channels=out,
        scale_conv_out_channels=scale_conv,
        scale_final_layer=mlp,
    )


def _sapiens2_spec(size: str, task: str) -> TaskSpec:
    name, tiny = f"sapiens2_{size}_{task}", size == "tiny"
    # Tiny: the parity vectors' token grids (4 x 3; pointmap 16 x 12, which its scale branch needs).
    hw = ((256, 192) if task == "pointmap" else (64, 48)) if tiny else (1024, 768)
    cls, _, vocab = _S2_TASKS[task]
    return TaskSpec(
        name=name,
        task=task,
        backbone=f"sapiens2_{size}",
        head_class=cls,
        head=_sapiens2_head(size, task),
        image_hw=hw,
        released_file=f"{name}.safetensors" if not tiny and task in _S2_RELEASED else "",
        vocab=vocab,
    )


_S1_WIDTH = {"0.3b": 1024, "0.6b": 1280, "1b": 1536, "2b": 1920, "tiny": 64}
# kind -> (task, out channels, patch padding of its configs, vocab)
_S1_KINDS = {
    "pose_goliath": ("pose", 308, 2, "goliath_308"),
    "pose_coco": ("pose", 17, 2, "coco_17"),
    "pose_coco_wholebody": ("pose", 133, 2, "coco_wholebody_133"),
    "seg_goliath": ("seg", 28, 0, "seg_goliath_28"),
    "seg_lip_cihp": ("seg", 20, 2, ""),
    "seg_face": ("seg", 19, 0, ""),
    "depth": ("depth", 1, 0, ""),
    "normal": ("normal", 3, 2, ""),
}
_S1_CHANNELS = {  # task -> (deconv, conv) channels: released, tiny (our choice)
    "pose": (((768, 768), (768, 768)), ((32, 24), (16, 16))),
    "seg": (((768,) * 3, (768,) * 3), ((32, 16, 16), (8, 8, 8))),
    "normal": (((768,) * 3, (768,) * 3), ((32, 16, 16), (8, 8, 8))),
    "depth": (((384,) * 4, (384, 384)), ((16, 16, 8, 8), (8, 8))),
}
_S1_RELEASED = {  # size -> kind -> released file (docs model zoos; 2B goliath pose / seg are not listed)
    "0.3b": {
        "pose_coco": "sapiens_0.3b_coco_best_coco_AP_796.pth",
        "pose_coco_wholebody": "sapiens_0.3b_coco_wholebody_best_coco_wholebody_AP_620.pth",
        "pose_goliath": "sapiens_0.3b_goliath_best_goliath_AP_573.pth",
        "seg_goliath": "sapiens_0.3b_goliath_best_goliath_mIoU_7673_epoch_194.pth",
        "depth": "sapiens_0.3b_render_people_epoch_100.pth",
        "normal": "sapiens_0.3b_normal_render_people_epoch_66.pth",
    },
    "0.6b": {
        "pose_coco": "sapiens_0.6b_coco_best_coco_AP_812.pth",
        "pose_coco_wholebody": "sapiens_0.6b_coco_wholebody_best_coco_wholebody_AP_695.pth",
        "pose_goliath": "sapiens_0.6b_goliath_best_goliath_AP_609.pth",
        "seg_goliath": "sapiens_0.6b_goliath_best_goliath_mIoU_7777_epoch_178.pth",
        "depth": "sapiens_0.6b_render_people_epoch_70.pth",
        "normal": "sapiens_0.6b_normal_render_people_epoch_200.pth",
    },
    "1b": {
        "pose_coco": "sapiens_1b_coco_best_coco_AP_821.pth",
        "pose_coco_wholebody": "sapiens_1b_coco_wholebody_best_coco_wholebody_AP_727.pth",
        "pose_goliath": "sapiens_1b_goliath_best_goliath_AP_639.pth",
        "seg_goliath": "sapiens_1b_goliath_best_goliath_mIoU_7994_epoch_151.pth",
        "depth": "sapiens_1b_render_people_epoch_88.pth",
        "normal": "sapiens_1b_normal_render_people_epoch_115.pth",
    },
    "2b": {
        "pose_coco": "sapiens_2b_coco_best_coco_AP_822.pth",
        "pose_coco_wholebody": "sapiens_2b_coco_wholebody_best_coco_wholebody_AP_745.pth",
        "depth": "sapiens_2b_render_people_epoch_25.pth",
        "normal": "sapiens_2b_normal_render_people_epoch_70.pth",
    },
}


def _sapiens1_spec(size: str, kind: str) -> TaskSpec:
    task, out, padding, vocab = _S1_KINDS[kind]
    tiny = size == "tiny"
    deconv, conv = _S1_CHANNELS[task][1 if tiny else 0]
    head = DeconvHeadConfig(
        in_channels=_S1_WIDTH[size], out_channels=out, deconv_out_channels=deconv, conv_out_channels=conv
    )
    # Tiny: the task layout (no CLS, learnt positions) at 64 x 48.
    overrides = (("with_cls_token", False), ("img_size", (64, 48))) if tiny else ()
    return TaskSpec(
        name=f"sapiens_{size}_{kind}",
        task=task,
        backbone=f"sapiens_{size}",
        head_class=Sapiens1HeatmapHead if task == "pose" else Sapiens1VitHead,
        head=head,
        head_prefix="head." if task == "pose" else "decode_head.",
        image_hw=(64, 48) if tiny else (1024, 768),
        backbone_overrides=(*overrides, ("patch_padding", padding)),
        released_file=_S1_RELEASED.get(size, {}).get(kind, ""),
        vocab=vocab,
    )


TASK_MODELS: dict[str, TaskSpec] = {
    s.name: s
    for s in [
        *(_sapiens2_spec(size, task) for size in _S2_WIDTH for task in _S2_TASKS),
        *(_sapiens1_spec(size, kind) for size in _S1_WIDTH for kind in _S1_KINDS),
    ]
}


def list_task_models(family: str | None = None) -> list[str]:
    return [n for n, s in TASK_MODELS.items() if family is None or s.family == family]


def get_task_spec(name: str | TaskSpec) -> TaskSpec:
    if isinstance(name, TaskSpec):
        return name
    if name not in TASK_MODELS:
        raise ValueError(f"unknown task model {name!r}; known: {', '.join(TASK_MODELS)}")
    return TASK_MODELS[name]


# ---- the model ----------------------------------------------------------------------------------


class TaskModel(nn.Module):
    """A backbone and a task head, in the released layout (``backbone.`` + ``head_prefix`` keys).

    ``forward(x)`` is ``head(features(x))``: whatever the head returns (a tensor, the
    pointmap's ``(pointmap, scale)``, or the platform heads' dict). ``features`` is block
    ``feature_block``'s map as (B, D, h, w); the last block's is after the final norm."""

    def __init__(
        self, backbone: nn.Module, head: nn.Module, *, head_prefix: str = "decode_head.", feature_block: int = -1
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head_name = head_prefix.rstrip(".")
        self.add_module(self.head_name, head)
        self.feature_block = feature_block

    @property
    def task_head(self) -> nn.Module:
        return self._modules[self.head_name]

    def features(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        return self.backbone(x_BCHW, out_indices=(self.feature_block,)).feature_maps[0]

    def forward(self, x_BCHW: torch.Tensor):
        return self.task_head(self.features(x_BCHW))


def _build(spec: TaskSpec, device: torch.device | str) -> TaskModel:
    backbone = build_backbone(spec.backbone, device=device, **dict(spec.backbone_overrides))
    with torch.device(device):
        head = spec.head_class(spec.head)
    return TaskModel(backbone, head, head_prefix=spec.head_prefix)


def build_task_model(
    name: str | TaskSpec,
    *,
    weights: str | Path | Mapping[str, torch.Tensor] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> TaskModel:
    """The named task model: freshly initialised, or with ``weights`` (a released-layout
    file or state dict; family, size and task checked in one line, then every key and shape).

    ``device="meta"`` allocates nothing (key and shape inspection)."""
    spec = get_task_spec(name)
    if weights is None:
        model = _build(spec, device or "cpu")
        return model.to(dtype) if dtype is not None else model
    state = load_state_dict_file(weights) if isinstance(weights, (str, Path)) else dict(weights)
    source = str(weights) if isinstance(weights, (str, Path)) else "the state dict"
    check_task_weights(state, spec, source=source)
    model = _build(spec, "meta")
    load_weights(model, state)
    return model.to(device=device or "cpu", dtype=dtype)


# ---- what a task checkpoint is, from its keys and shapes ----------------------------------------

# (head prefix, output layer) -> task; v1's conv_seg is told apart by its channels
_OUTPUT_LAYERS = {
    ("decode_head.", "conv_pose"): "pose",
    ("decode_head.", "conv_seg"): "seg",
    ("decode_head.", "conv_normal"): "normal",
    ("decode_head.", "conv_pointmap"): "pointmap",
    ("decode_head.", "conv_albedo"): "albedo",
    ("head.", "final_layer"): "pose",
}
_CONV_SEG_BY_CHANNELS = {1: "depth", 3: "normal"}


@dataclass(frozen=True)
class TaskWeightsShape:
    """What a task checkpoint is, read off its keys: backbone (a registered name, or a
    description), task (None when no released head's output layer is there) and the
    output channels (keypoints, classes)."""

    backbone: str
    task: str | None
    channels: int | None

    @property
    def label(self) -> str:
        return task_label(self.backbone, self.task, self.channels)


def describe_task_weights(state: Mapping[str, object]) -> TaskWeightsShape:
    """Backbone, task and output channels of a task state dict (tensors, or anything with a
    ``.shape``, e.g. the shapes of a file's header on the meta device)."""
    backbone_state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
    seen = describe_weights(backbone_state)
    backbone = seen.label if seen is not None else "no known backbone"
    for (prefix, layer), task in _OUTPUT_LAYERS.items():
        weight = state.get(f"{prefix}{layer}.weight")
        if weight is not None:
            channels = int(weight.shape[0])
            if layer == "conv_seg" and seen is not None and seen.family == "sapiens1":
                task = _CONV_SEG_BY_CHANNELS.get(channels, "seg")
            return TaskWeightsShape(backbone, task, channels)
    return TaskWeightsShape(backbone, None, None)


def check_task_weights(state: Mapping[str, object], spec: TaskSpec, *, source: str) -> None:
    """Raise ``WeightsFamilyError`` (one line) unless ``state`` is ``spec``'s backbone and task."""
    seen = describe_task_weights(state)
    if (seen.backbone, seen.task, seen.channels) != (spec.backbone, spec.task, spec.head.out_channels):
        raise WeightsFamilyError(f"{source} looks like {seen.label}, not {spec.label}")


def _file_shapes(path: str | Path) -> dict[str, torch.Tensor]:
    return {k: torch.empty(s, device="meta") for k, s in weight_shapes(path).items()}


def check_task_weights_file(name: str | TaskSpec, path: str | Path) -> None:
    """The one-line check, then every key and shape, from the file's header alone (a ``.pth``
    is memory-mapped): a configuration check before any run."""
    spec = get_task_spec(name)
    shapes = _file_shapes(path)
    check_task_weights(shapes, spec, source=str(path))
    check_state_dict(_build(spec, "meta"), shapes)


def infer_task_model(source: str | Path | Mapping[str, object]) -> TaskSpec:
    """The task model whose keys and shapes a file (or state dict) holds exactly; a one-line
    ``ValueError`` saying what it looks like when no registered task model fits."""
    shapes = _file_shapes(source) if isinstance(source, (str, Path)) else dict(source)
    seen = describe_task_weights(shapes)
    for spec in TASK_MODELS.values():
        if (spec.backbone, spec.task, spec.head.out_channels) != (seen.backbone, seen.task, seen.channels):
            continue
        expected = _build(spec, "meta").state_dict()
        if expected.keys() == shapes.keys() and all(expected[k].shape == shapes[k].shape for k in expected):
            return spec
    name = str(source) if isinstance(source, (str, Path)) else "the state dict"
    raise ValueError(f"{name} looks like {seen.label}, which is no registered task model; name it (--model)")
