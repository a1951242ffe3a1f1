"""``benchmarks/annotate_throughput.py`` at its smallest size: the plain loop, two plain loops in two
processes and the job on the same samples, their ratios per core and forward shares, and the job
and the loop writing the same bytes; the runtimes (PyTorch, ONNX fp32 and fp16) on the same
samples; a GPU run without ONNX Runtime's CUDA provider saying so before any work; and its
refusal of samples that could not be annotated."""

import importlib.util
import re
import subprocess
import sys

import onnxruntime as ort
import pytest
import torch

from evaluation.annotate import TooManyErrors
from tests.benchmarks.conftest import BENCHMARKS
from tests.evaluation.annotate.conftest import sample, write_version

pytestmark = pytest.mark.slow  # a local Ray cluster and an actor pool

NUMBER = r"\d+\.\d+"
LOOP = rf"loop 1 process +{NUMBER} img/s \(forward +\d+%, +{NUMBER} per CPU-s\) \| "
JOB = (
    rf"job 2 actors +{NUMBER} img/s = +{NUMBER} per core \(forward +\d+%, outside shards +{NUMBER} s per actor\) = "
    rf"{NUMBER}x of the loop per core; same bytes: True$"
)


def test_prints_the_job_against_the_same_work_loop(bench):
    out = bench("annotate_throughput.py", "--smallest", "--parallel-loops", timeout=180)
    assert re.search(r"^tiny: 12 samples in 4 shards of 3; batch 8, fp32$", out, re.M), out
    line = (
        r"^tiny +seg +sapiens2_tiny_seg +trained +torch-fp32 +"
        + LOOP
        + rf"2 loop processes +{NUMBER} img/s per core = {NUMBER}x \| "
        + JOB
    )
    assert re.search(line, out, re.M), out


def test_compares_torch_and_the_fp32_and_fp16_graphs_on_the_same_samples(bench):
    args = ["--sizes", "tiny", "--tasks", "depth", "--images", "12", "--per-shard", "3"]
    out = bench("annotate_throughput.py", *args, "--runtimes", "torch,onnx-fp32,onnx-fp16", timeout=900)
    for runtime in ("torch-fp32", "onnx-fp32", "onnx-fp16"):
        assert re.search(rf"^tiny +depth +sapiens_tiny_depth +trained +{runtime} +" + LOOP + JOB, out, re.M), out
    for precision in ("fp32", "fp16"):
        check = rf"^ +exported sapiens_tiny_depth {precision} in \d+ s \(max abs error \S+, relative \S+ at batch 1\)$"
        assert re.search(check, out, re.M), out
        assert re.search(rf"^ +onnx-{precision}: {NUMBER}x of torch's images/s$", out, re.M), out


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA")
def test_onnx_on_a_gpu_without_the_cuda_provider_is_not_measured():
    args = ["--device", "cuda", "--sizes", "0.4b", "--tasks", "pose", "--runtimes", "torch,onnx-fp16", "--no-loop"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "annotate_throughput.py"), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert re.fullmatch(
        r"onnx-fp16 NOT MEASURED: ONNX Runtime \S+ has no CUDA provider .*install onnxruntime-gpu\n", done.stdout
    )


def test_a_sample_that_could_not_be_annotated_stops_the_loop_and_the_job(tmp_path, ray_local):
    spec = importlib.util.spec_from_file_location("annotate_throughput", BENCHMARKS / "annotate_throughput.py")
    throughput = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(throughput)
    good = sample("a", "obama.jpg", [(0.1, 0.1, 0.6, 0.95)], [0.9])
    corrupt = {**sample("b", "messi5.jpg", [(0.1, 0.1, 0.6, 0.95)], [0.9]), "image": b"\xff\xd8\xff not a jpeg"}
    dataset = write_version(tmp_path / "curated", [[good, corrupt]])
    ckpt = throughput.make_checkpoint("sapiens2_tiny_seg", tmp_path, "cpu")
    args = throughput.parse(["--smallest", "--actors", "1"])
    config = lambda name: throughput.annotate_config(args, dataset, tmp_path / name, "seg", ckpt, None)  # noqa: E731
    threads = torch.get_num_threads()
    try:
        with pytest.raises(RuntimeError, match=r"^the plain loop could not annotate 1 of 2 samples"):
            throughput.plain_loop(config("loop"), tmp_path / "loop")
    finally:
        torch.set_num_threads(threads)  # the loop runs on one thread
    with pytest.raises(TooManyErrors, match=r"^1 of 2 samples \(50.0%\) were not annotated, over max_error_share=0: "):
        throughput.run_job(config("job"))
