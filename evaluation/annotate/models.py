"""The task models an annotation job runs: what each checkpoint is (read on the driver from the
file's header, before any Ray work) and the model itself (loaded once per actor), run by
PyTorch or, when ``tasks.<task>.onnx`` is set, by onnxruntime.

``describe`` checks a task's files and says what they hold (``ModelInfo``): the task model's
name and layout (a released head, or a fine-tune export's platform head), the backbone family
(which decides the pre- and post-processing of seg, normal and depth), the input size, the
output names, the label vocabulary, the files' sha256 and the ONNX graph's precision (fp32 or
fp16, as ``pipelines/export.py`` recorded it). ``Runner`` is one loaded model:
``runner(x_BCHW)`` -> its outputs as float32 tensors in ``ModelInfo.outputs`` order, with
the seconds spent in forwards counted in ``runner.seconds``.

A graph runs on the execution providers ``onnx_providers`` picks from what the installed
onnxruntime reports: CUDA (with the CPU for any op CUDA lacks) on a GPU, the CPU on a CPU. A GPU
actor whose onnxruntime has no CUDA provider, or whose session did not start it, stops with an
error that says so, rather than running the graph on the CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from pathlib import Path

from evaluation.annotate.config import TaskSettings

RELEASED, PLATFORM = "released", "platform"


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """One task's model as the job runs it (see the module docstring)."""

    task: str
    name: str
    layout: str  # RELEASED or PLATFORM
    family: str  # sapiens1 or sapiens2
    input_hw: tuple[int, int]
    outputs: tuple[str, ...]
    vocab: str  # models/vocab name of its keypoints or classes ("" when not known)
    checkpoint: str
    sha256: str
    onnx: str = ""
    onnx_sha256: str = ""
    onnx_precision: str = ""  # fp32 or fp16, as the graph records it
    feature_block: int = -1

    def digests(self) -> dict[str, str]:
        """What the model enters the annotation version id by: its files' content, never their paths."""
        return {"checkpoint_sha256": self.sha256, **({"onnx_sha256": self.onnx_sha256} if self.onnx else {})}


@functools.lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """A file's sha256 (cached per path, size and modification time)."""
    st = Path(path).stat()
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def _existing(path: str, setting: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"{setting}={path!r}: no such file")
    return str(p.resolve())


def _released(task: str, path: str, s: TaskSettings) -> dict:
    from models.task_models import check_task_weights_file, get_task_spec, infer_task_model

    spec = get_task_spec(s.model) if s.model else infer_task_model(path)
    if s.model:
        check_task_weights_file(spec, path)
    if spec.task != task:
        raise ValueError(f"tasks.{task}.checkpoint={path!r} is a {spec.task} model ({spec.name}), not a {task} one")
    hw = tuple(s.input_hw or spec.image_hw)
    return dict(
        name=spec.name, layout=RELEASED, family=spec.family, input_hw=hw, outputs=spec.outputs, vocab=spec.vocab
    )


def _platform(task: str, path: str, s: TaskSettings) -> dict:
    from models.registry import family_of
    from models.task_checkpoints import PLATFORM_OUTPUTS, file_metadata

    meta = file_metadata(path)
    if meta.get("task", task) != task:
        raise ValueError(f"tasks.{task}.checkpoint={path!r} is a fine-tune export for {meta['task']}, not {task}")
    if s.input_hw is None:
        raise ValueError(
            f"tasks.{task}.checkpoint={path!r} is a fine-tune export, which does not record its input size: "
            f"set tasks.{task}.input_hw=[H, W] (the size it was fine-tuned at)"
        )
    backbone = s.model or meta.get("backbone", "")
    if not backbone:
        raise ValueError(f"tasks.{task}.checkpoint={path!r} does not name its backbone: set tasks.{task}.model")
    return dict(
        name=f"{backbone} {task} (fine-tune export)",
        layout=PLATFORM,
        family=family_of(backbone),
        input_hw=tuple(s.input_hw),
        outputs=PLATFORM_OUTPUTS[task],
        vocab=meta.get("vocab", ""),
    )


def describe(task: str, s: TaskSettings) -> ModelInfo:
    """What ``tasks.<task>`` runs, from the files' headers; a ``ValueError`` naming the setting
    when a file is missing or holds something else."""
    from models.io import weight_shapes
    from models.onnx_export import graph_precision
    from models.task_checkpoints import PLATFORM_HEAD_KEY

    path = _existing(s.checkpoint, f"tasks.{task}.checkpoint")
    platform = any(k.startswith(PLATFORM_HEAD_KEY) for k in weight_shapes(path))
    fields = (_platform if platform else _released)(task, path, s)
    info = ModelInfo(task=task, checkpoint=path, sha256=file_sha256(path), feature_block=s.feature_block, **fields)
    if s.onnx:
        onnx = _existing(s.onnx, f"tasks.{task}.onnx")
        check_onnx(onnx, info, f"tasks.{task}.onnx")
        info = dataclasses.replace(info, onnx=onnx, onnx_sha256=file_sha256(onnx), onnx_precision=graph_precision(onnx))
    return info


def check_onnx(path: str, info: ModelInfo, setting: str) -> None:
    """The graph's outputs are the model's and its input is float32 (B, 3, H, W) at the model's input size."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    outputs = tuple(o.name for o in graph.output)
    dims = [d.dim_value or d.dim_param for d in graph.input[0].type.tensor_type.shape.dim]
    if outputs != info.outputs:
        raise ValueError(f"{setting}={path!r} has outputs {list(outputs)}, the {info.task} model {list(info.outputs)}")
    if tuple(dims[2:]) != info.input_hw:
        raise ValueError(f"{setting}={path!r} takes {dims[2:]} images, the job feeds {list(info.input_hw)}")
    if graph.input[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        raise ValueError(
            f"{setting}={path!r} takes {onnx.helper.tensor_dtype_to_np_dtype(graph.input[0].type.tensor_type.elem_type)}"
            " images, the job feeds float32 (pipelines/export.py writes a float32 input at every precision)"
        )


# ---- running a model --------------------------------------------------------------------------


class Runner:
    """One loaded model; ``runner(x_BCHW)`` -> float32 outputs on ``device`` (see the module docstring)."""

    def __init__(self, info: ModelInfo, device: str) -> None:
        self.info, self.device, self.seconds = info, device, 0.0

    def __call__(self, x_BCHW):
        start = time.perf_counter()
        out = self.forward(x_BCHW)
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        return out

    def forward(self, x_BCHW):
        raise NotImplementedError


class TorchRunner(Runner):
    def __init__(self, info: ModelInfo, device: str, precision: str) -> None:
        from models.task_checkpoints import load_task_checkpoint

        super().__init__(info, device)
        model = info.name if info.layout == RELEASED else None
        loaded = load_task_checkpoint(info.checkpoint, model=model, task=info.task, feature_block=info.feature_block)
        self.model, self.precision = loaded.model.to(device).eval(), precision

    def forward(self, x_BCHW):
        import torch

        from curation.filters.model import autocast
        from models.onnx_export import as_outputs

        with torch.inference_mode(), autocast(self.precision, self.device):
            out = as_outputs(self.model(x_BCHW.to(self.device)), self.info.outputs)
        return tuple(o.float() for o in out)


CUDA_PROVIDER, CPU_PROVIDER = "CUDAExecutionProvider", "CPUExecutionProvider"


def onnx_providers(device: str) -> list[str]:
    """The onnxruntime execution providers for ``device`` (see the module docstring); a ValueError
    naming ``actors.device`` when it is cuda and onnxruntime offers no CUDA provider."""
    import onnxruntime as ort

    if device != "cuda":
        return [CPU_PROVIDER]
    available = ort.get_available_providers()
    if CUDA_PROVIDER not in available:
        raise ValueError(
            f"actors.device=cuda: onnxruntime {ort.__version__} offers {available}, no {CUDA_PROVIDER}; "
            "install onnxruntime-gpu, or set actors.device=cpu to run the ONNX graphs on the CPU"
        )
    return [CUDA_PROVIDER, CPU_PROVIDER]


class OnnxRunner(Runner):
    def __init__(self, info: ModelInfo, device: str, threads: int) -> None:
        import onnxruntime as ort

        super().__init__(info, device)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = max(1, threads), 1
        wanted = onnx_providers(device)
        self.session = ort.InferenceSession(info.onnx, options, providers=wanted)
        self.providers = self.session.get_providers()
        if self.providers[0] != wanted[0]:  # onnxruntime logs a failed provider and goes on without it
            raise RuntimeError(
                f"tasks.{info.task}.onnx: onnxruntime started {self.providers}, not {wanted[0]} "
                "(see its log above for why), so the graph would run on the CPU"
            )
        print(f"tasks.{info.task}.onnx: {info.onnx_precision or 'fp32'} graph on {self.providers[0]}", flush=True)

    def forward(self, x_BCHW):
        import torch

        got = self.session.run(list(self.info.outputs), {"image": x_BCHW.detach().cpu().numpy()})
        return tuple(torch.from_numpy(g).float().to(self.device) for g in got)


def load_runner(info: ModelInfo, device: str, precision: str, threads: int) -> Runner:
    """The model of ``info`` on ``device``: onnxruntime when it has a graph, else PyTorch."""
    return OnnxRunner(info, device, threads) if info.onnx else TorchRunner(info, device, precision)
