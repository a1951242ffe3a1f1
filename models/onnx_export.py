"""ONNX export of task models (backbone + head), checked against the eager model.

``export_onnx(model, path, input_hw=..., precision=...)`` writes one graph with a dynamic batch
axis: input ``image`` (B, 3, H, W) float32 (normalised, see ``models.sapiens_processing``), one
float32 output per name in ``output_names`` (a dict-returning model's keys, a tuple's entries).
``precision`` "fp32" keeps the model's weights and arithmetic; "fp16" exports a half-precision
copy of the model (weights and activations fp16, the input cast to fp16 first and the outputs
back to fp32 last, so both graphs take and give the same arrays); the graph records it in its
metadata (``graph_precision``). ``onnx_errors`` runs a graph with onnxruntime next to the
eager fp32 model and ``within_tolerance`` judges the errors by its precision's ``TOLERANCE``.
``export_checkpoint`` does all of it for a task checkpoint file (``models.task_checkpoints``).

bf16 arithmetic: the Sapiens2 backbone computes RoPE in bf16, which onnxruntime's CPU
kernels lack. ``emulate_bf16`` rewrites every bf16 computing node to compute in fp32 between
Casts (inputs up, the result rounded back to bf16), which is what PyTorch's CPU kernels do
for bf16, so the graph keeps the eager model's roundings.

Needs ``onnx``, ``onnxscript`` (torch's exporter) and ``onnxruntime`` (the check).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

INPUT_NAME = "image"
PRECISIONS = ("fp32", "fp16")
PRECISION_KEY = "humanvision.precision"  # the graph's metadata entry naming its precision
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}
"""How far a graph's outputs may be from the eager fp32 model's, per precision: fp32 in absolute
terms (the max abs difference); fp16 relative to each output's largest magnitude (fp16 keeps
11 significant bits, so its error scales with the values). Each bound is several times the
largest difference measured on the task models (docs/results/annotate.md, fp16 export)."""
# Ops that move or reinterpret values and never round: they keep their bf16 inputs as they are.
_NO_ARITHMETIC = frozenset(
    {"Cast", "CastLike", "Concat", "Constant", "Expand", "Flatten", "Gather", "Identity", "Reshape", "Shape", "Slice"}
    | {"Split", "Squeeze", "Transpose", "Unsqueeze"}
)


class _NamedOutputs(nn.Module):
    """The model with its outputs as a tuple in ``names`` order (dict keys, or tuple entries),
    run in ``dtype`` between a float32 input and float32 outputs."""

    def __init__(self, model: nn.Module, names: Sequence[str], dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.model, self.names, self.dtype = model, tuple(names), dtype

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = as_outputs(self.model(image.to(self.dtype)), self.names)
        return tuple(o.float() for o in out) if self.dtype != torch.float32 else out


def as_outputs(out, names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """A model's output as a tuple in ``names`` order."""
    if isinstance(out, dict):
        return tuple(out[n] for n in names)
    out = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    if len(out) != len(names):
        raise ValueError(f"the model returns {len(out)} outputs, {len(names)} names given: {list(names)}")
    return out


def _onnx_ir():
    try:
        import onnx_ir as ir
    except ImportError as e:  # pragma: no cover - a dependency of onnxscript
        raise ImportError("ONNX export needs onnx and onnxscript: pip install onnx onnxscript") from e
    return ir


def emulate_bf16(model) -> int:
    """Rewrite every bf16-producing arithmetic node of an ``onnx_ir.Model`` to compute in
    fp32 and round its results to bf16 (Casts around it), in place; returns how many."""
    ir = _onnx_ir()
    bf16, f32 = ir.DataType.BFLOAT16, ir.DataType.FLOAT
    graph = model.graph
    nodes = [n for n in graph if n.op_type not in _NO_ARITHMETIC and any(o.dtype == bf16 for o in n.outputs)]
    for node in nodes:
        for i, value in enumerate(node.inputs):
            if value is not None and value.dtype == bf16:
                up = ir.node("Cast", [value], {"to": int(f32)})
                graph.insert_before(node, up)
                node.replace_input_with(i, up.outputs[0])
        for out in node.outputs:
            if out.dtype != bf16 or out.is_graph_output():
                continue
            shape = out.shape.copy() if out.shape is not None else None
            rounded = ir.Value(name=f"{out.name}_bf16", type=ir.TensorType(bf16), shape=shape)
            ir.convenience.replace_all_uses_with(out, rounded)
            out.dtype = f32
            graph.insert_after(node, ir.node("Cast", [out], {"to": int(bf16)}, outputs=[rounded]))
    return len(nodes)


def export_onnx(
    model: nn.Module,
    path: str | Path,
    *,
    input_hw: tuple[int, int],
    output_names: Sequence[str],
    precision: str = "fp32",
    example_batch: int = 2,
    opset: int = 18,
) -> Path:
    """Write ``model`` (eval mode, fp32) as ONNX at ``path`` with a dynamic batch axis in
    ``precision`` (fp16: a half-precision copy; ``model`` is left as it is); the input's height
    and width are fixed at ``input_hw``. Weights over 2 GB go to external data."""
    _onnx_ir()
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval() if precision == "fp32" else copy.deepcopy(model).eval().half()
    wrapped = _NamedOutputs(model, output_names, torch.float32 if precision == "fp32" else torch.float16).eval()
    example = torch.randn(example_batch, 3, *input_hw)  # > 1: torch.export specialises size-1 dims
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.onnx.export(
        wrapped,
        (example,),
        dynamo=True,
        input_names=[INPUT_NAME],
        output_names=list(output_names),
        dynamic_shapes=({0: batch},),
        opset_version=opset,
        verbose=False,
    )
    emulate_bf16(program.model)
    program.model.metadata_props[PRECISION_KEY] = precision
    program.save(str(path))
    return path


def graph_precision(path: str | Path) -> str:
    """The precision ``export_onnx`` recorded in a graph ("fp32" for a graph that records none)."""
    import onnx

    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return props.get(PRECISION_KEY, "fp32")


def onnx_errors(
    path: str | Path,
    model: nn.Module,
    *,
    input_hw: tuple[int, int],
    output_names: Sequence[str],
    batch_sizes: Sequence[int] = (1, 3),
    seed: int = 0,
) -> dict[str, dict[int, float]]:
    """``max_abs_error`` (the largest abs difference over all outputs) and ``max_rel_error``
    (the largest of each output's max abs difference over its largest magnitude), each per
    batch size, between onnxruntime (CPU) and the eager fp32 model on the same random inputs."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(seed)
    errors: dict[str, dict[int, float]] = {"max_abs_error": {}, "max_rel_error": {}}
    for b in batch_sizes:
        x = torch.randn(b, 3, *input_hw, generator=generator)
        with torch.no_grad():
            want = as_outputs(model.eval()(x), output_names)
        got = [torch.from_numpy(g) for g in session.run(list(output_names), {INPUT_NAME: x.numpy()})]
        diffs = [float((g - w).abs().max()) for g, w in zip(got, want)]
        rel = [d / max(float(w.abs().max()), 1e-12) for d, w in zip(diffs, want)]
        errors["max_abs_error"][b], errors["max_rel_error"][b] = max(diffs), max(rel)
    return errors


def tolerance_measure(precision: str) -> str:
    """The ``onnx_errors`` entry that ``TOLERANCE[precision]`` bounds."""
    return "max_abs_error" if precision == "fp32" else "max_rel_error"


def within_tolerance(errors: dict[str, dict[int, float]], precision: str) -> bool:
    """Whether ``onnx_errors`` of a ``precision`` graph are within its ``TOLERANCE``."""
    return max(errors[tolerance_measure(precision)].values()) <= TOLERANCE[precision]


def export_checkpoint(
    checkpoint: str | Path,
    output: str | Path,
    *,
    model: str | None = None,
    task: str | None = None,
    image_hw: tuple[int, int] | None = None,
    feature_block: int = -1,
    precision: str = "fp32",
    check_batch_sizes: Sequence[int] = (1, 3),
) -> dict:
    """Export a task checkpoint (released task model or fine-tune export) in ``precision`` and
    check it against the eager fp32 model.

    ``image_hw`` defaults to the size the model was trained at (released models; a
    fine-tune export does not record it, so it must be given). Returns what was exported:
    the model's name, task, input size, outputs, precision, the errors per batch size
    (``onnx_errors``), the tolerance and whether they are within it."""
    from models.task_checkpoints import load_task_checkpoint

    loaded = load_task_checkpoint(checkpoint, model=model, task=task, feature_block=feature_block)
    hw = tuple(image_hw or loaded.image_hw or ())
    if len(hw) != 2:
        raise ValueError(f"{checkpoint} does not record its input size; pass --image-size H W")
    path = export_onnx(loaded.model, output, input_hw=hw, output_names=loaded.outputs, precision=precision)
    errors = onnx_errors(path, loaded.model, input_hw=hw, output_names=loaded.outputs, batch_sizes=check_batch_sizes)
    return {
        "onnx": str(path),
        "model": loaded.name,
        "task": loaded.task,
        "layout": loaded.layout,
        "image_hw": list(hw),
        "outputs": list(loaded.outputs),
        "precision": precision,
        **errors,
        "tolerance": {tolerance_measure(precision): TOLERANCE[precision]},
        "within_tolerance": within_tolerance(errors, precision),
    }
