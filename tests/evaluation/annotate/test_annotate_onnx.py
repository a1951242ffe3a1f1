"""``tasks.<task>.onnx``: the graph ``pipelines/export.py`` writes from a checkpoint, run by
onnxruntime in place of PyTorch, gives the same outputs within 1e-4 (fp32: the model's outputs and
the post-processed maps, before their float16 / PNG encoding) or within the fp16 tolerance (an
fp16 graph); a graph of another model is refused; the execution providers are what the installed
onnxruntime offers, and a GPU job without its CUDA provider is refused in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from evaluation.annotate.annotator import Annotator
from evaluation.annotate.config import ActorSettings, TasksConfig, TaskSettings
from evaluation.annotate.models import OnnxRunner, TorchRunner, describe, onnx_providers
from evaluation.annotate.shards import Record
from evaluation.annotate.tasks import PREDICTORS, Sample
from models.onnx_export import TOLERANCE
from models.sapiens_processing import resize_map
from tests.evaluation.annotate.conftest import npy, photo

pytestmark = pytest.mark.slow  # one ONNX export (torch.export + onnxscript)

MAX_ABS_ERROR = 1e-4


@pytest.fixture(scope="module")
def depth_onnx(tiny_models, tmp_path_factory):
    """The v1 tiny depth model's graph (4 blocks: the cheapest export of the task models)."""
    from pipelines.export import main

    path = tmp_path_factory.mktemp("onnx") / "depth.onnx"
    assert main(["--checkpoint", str(tiny_models["depth"]), "--output", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def depth_onnx_fp16(tiny_models, tmp_path_factory):
    from pipelines.export import main

    path = tmp_path_factory.mktemp("onnx") / "depth.fp16.onnx"
    assert main(["--checkpoint", str(tiny_models["depth"]), "--output", str(path), "--precision", "fp16"]) == 0
    return path


def _records(n: int = 3) -> list[Record]:
    out = []
    for i, name in enumerate(("obama.jpg", "messi5.jpg", "franz_kafka.jpg")[:n]):
        data, w, h = photo(name, 0.4)
        out.append(Record(f"k{i}", data, {"width": w, "height": h, "person_boxes": [], "person_scores": []}))
    return out


def test_onnxruntime_gives_the_pytorch_outputs_within_tolerance(tiny_models, depth_onnx):
    from evaluation.annotate.annotator import decode

    s = TaskSettings(checkpoint=str(tiny_models["depth"]), onnx=str(depth_onnx))
    info = describe("depth", s)
    assert info.onnx == str(depth_onnx) and info.onnx_sha256 and "onnx_sha256" in info.digests()
    onnx_run, torch_run = OnnxRunner(info, "cpu", 1), TorchRunner(info, "cpu", "fp32")
    predictor = PREDICTORS["depth"](info, s)
    samples = [Sample(r.key, decode(r), [], []) for r in _records()]
    x = torch.stack([predictor.inputs(smp)[0][0] for smp in samples])
    (got,), (want,) = onnx_run(x), torch_run(x)
    assert got.shape == want.shape and float((got - want).abs().max()) <= MAX_ABS_ERROR
    for i, smp in enumerate(samples):
        a, b = (resize_map(resize_map(o[i : i + 1], info.input_hw), smp.hw) for o in (got, want))
        assert float((a - b).abs().max()) <= MAX_ABS_ERROR


def test_the_annotator_runs_the_graph_when_the_setting_names_one(tiny_models, depth_onnx):
    tasks = TasksConfig(depth=TaskSettings(checkpoint=str(tiny_models["depth"]), onnx=str(depth_onnx)))
    infos = {"depth": describe("depth", tasks.depth)}
    annotator = Annotator(infos, tasks, ActorSettings(batch_size=2), "cpu")
    assert isinstance(annotator.runners["depth"], OnnxRunner)
    plain = dataclasses.replace(tasks, depth=dataclasses.replace(tasks.depth, onnx=""))
    eager = Annotator({"depth": describe("depth", plain.depth)}, plain, ActorSettings(batch_size=2), "cpu")

    for a, b in zip(annotator.annotate(_records()), eager.annotate(_records())):
        assert a["status"] == b["status"] == "ok"
        x, y = (npy(r["depth_npy"]).astype(np.float32) for r in (a, b))
        # the same maps, up to one float16 step where a 1e-6 difference crosses a rounding
        assert np.allclose(x, y, rtol=1e-3, atol=1e-4)


def test_a_graph_of_another_model_is_refused(tiny_models, depth_onnx):
    with pytest.raises(ValueError, match=r"tasks.seg.onnx=.* has outputs \['depth'\], the seg model \['logits'\]"):
        describe("seg", TaskSettings(checkpoint=str(tiny_models["seg"]), onnx=str(depth_onnx)))
    with pytest.raises(ValueError, match=r"takes \[64, 48\] images, the job feeds \[128, 96\]"):
        describe("depth", TaskSettings(checkpoint=str(tiny_models["depth"]), onnx=str(depth_onnx), input_hw=(128, 96)))


def test_an_fp16_graph_runs_within_its_tolerance_on_the_providers_onnxruntime_reports(tiny_models, depth_onnx_fp16):
    from evaluation.annotate.annotator import decode

    s = TaskSettings(checkpoint=str(tiny_models["depth"]), onnx=str(depth_onnx_fp16))
    info = describe("depth", s)
    assert info.onnx_precision == "fp16"
    onnx_run, torch_run = OnnxRunner(info, "cpu", 1), TorchRunner(info, "cpu", "fp32")
    assert onnx_run.providers == ["CPUExecutionProvider"]
    predictor = PREDICTORS["depth"](info, s)
    x = torch.stack([predictor.inputs(Sample(r.key, decode(r), [], []))[0][0] for r in _records()])
    (got,), (want,) = onnx_run(x), torch_run(x)
    rel = float((got - want).abs().max() / want.abs().max())
    print(
        f"tiny depth fp16 graph against eager fp32: max abs {float((got - want).abs().max()):.3g}, relative {rel:.3g}"
    )
    assert got.dtype == torch.float32 and rel <= TOLERANCE["fp16"]


def test_a_gpu_actor_gets_cuda_only_when_onnxruntime_offers_it():
    import onnxruntime as ort

    assert onnx_providers("cpu") == ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert onnx_providers("cuda") == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    else:  # this machine's onnxruntime: the job says so instead of running the graph on the CPU
        with pytest.raises(ValueError, match=r"^actors.device=cuda: onnxruntime .* no CUDAExecutionProvider; install"):
            onnx_providers("cuda")
