"""ONNX export of task models (backbone + head), checked against the eager model.

``export_onnx(model, path, input_hw=...)`` writes one graph with a dynamic batch axis: input
``image`` (B, 3, H, W) (normalised, see ``models.sapiens_processing``), one output per name
in ``output_names`` (a dict-returning model's keys, a tuple's entries). ``onnx_max_errors``
runs it with onnxruntime next to the eager model. ``export_checkpoint`` does both for a task
checkpoint file (``models.task_checkpoints``).

bf16 arithmetic: the Sapiens2 backbone computes RoPE in bf16, which onnxruntime's CPU
kernels lack. ``emulate_bf16`` rewrites every bf16 computing node to compute in fp32 between
Casts (inputs up, the result rounded back to bf16), which is what PyTorch's CPU kernels do
for bf16, so the graph keeps the eager model's roundings.

Needs ``onnx``, ``onnxscript`` (torch's exporter) and ``onnxruntime`` (the check).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

INPUT_NAME = "image"
# Ops that move or reinterpret values and never round: they keep their bf16 inputs as they are.
_NO_ARITHMETIC = frozenset(
    {"Cast", "CastLike", "Concat", "Constant", "Expand", "Flatten", "Gather", "Identity", "Reshape", "Shape", "Slice"}
    | {"Split", "Squeeze", "Transpose", "Unsqueeze"}
)


class _NamedOutputs(nn.Module):
    """The model with its outputs as a tuple in ``names`` order (dict keys, or tuple entries)."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.names = model, tuple(names)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return as_outputs(self.model(image), self.names)


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
    example_batch: int = 2,
    opset: int = 18,
) -> Path:
    """Write ``model`` (eval mode, fp32) as ONNX at ``path`` with a dynamic batch axis; the
    input's height and width are fixed at ``input_hw``. Weights over 2 GB go to external data."""
    _onnx_ir()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapped = _NamedOutputs(model.eval(), output_names).eval()
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
    program.save(str(path))
    return path


def onnx_max_errors(
    path: str | Path,
    model: nn.Module,
    *,
    input_hw: tuple[int, int],
    output_names: Sequence[str],
    batch_sizes: Sequence[int] = (1, 3),
    seed: int = 0,
) -> dict[int, float]:
    """Batch size -> max abs difference over all outputs between onnxruntime (CPU) and the
    eager model, on the same random inputs."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(seed)
    errors = {}
    for b in batch_sizes:
        x = torch.randn(b, 3, *input_hw, generator=generator)
        with torch.no_grad():
            want = as_outputs(model.eval()(x), output_names)
        got = session.run(list(output_names), {INPUT_NAME: x.numpy()})
        errors[b] = max(float((torch.from_numpy(g) - w).abs().max()) for g, w in zip(got, want))
    return errors


def export_checkpoint(
    checkpoint: str | Path,
    output: str | Path,
    *,
    model: str | None = None,
    task: str | None = None,
    image_hw: tuple[int, int] | None = None,
    feature_block: int = -1,
    check_batch_sizes: Sequence[int] = (1, 3),
) -> dict:
    """Export a task checkpoint (released task model or fine-tune export) and check it.

    ``image_hw`` defaults to the size the model was trained at (released models; a
    fine-tune export does not record it, so it must be given). Returns what was exported:
    the model's name, task, input size, outputs and the max abs error per batch size."""
    from models.task_checkpoints import load_task_checkpoint

    loaded = load_task_checkpoint(checkpoint, model=model, task=task, feature_block=feature_block)
    hw = tuple(image_hw or loaded.image_hw or ())
    if len(hw) != 2:
        raise ValueError(f"{checkpoint} does not record its input size; pass --image-size H W")
    path = export_onnx(loaded.model, output, input_hw=hw, output_names=loaded.outputs)
    errors = onnx_max_errors(
        path, loaded.model, input_hw=hw, output_names=loaded.outputs, batch_sizes=check_batch_sizes
    )
    return {
        "onnx": str(path),
        "model": loaded.name,
        "task": loaded.task,
        "layout": loaded.layout,
        "image_hw": list(hw),
        "outputs": list(loaded.outputs),
        "max_abs_error": errors,
    }
