"""``benchmarks/annotate_throughput.py`` at its smallest size: the plain loop, two plain loops in two
processes and the job on the same samples, their ratios per core and forward shares, and the job
and the loop writing the same bytes; and its refusal of samples that could not be annotated."""

import importlib.util
import re

import pytest
import torch

from evaluation.annotate import TooManyErrors
from tests.benchmarks.conftest import BENCHMARKS
from tests.evaluation.annotate.conftest import sample, write_version

pytestmark = pytest.mark.slow  # a local Ray cluster and an actor pool

NUMBER = r"\d+\.\d+"


def test_prints_the_job_against_the_same_work_loop(bench):
    out = bench("annotate_throughput.py", "--smallest", "--parallel-loops", timeout=180)
    assert re.search(r"^tiny: 12 samples in 4 shards of 3; batch 8, fp32$", out, re.M), out
    line = (
        rf"^tiny +seg +sapiens2_tiny_seg +trained +loop 1 process +{NUMBER} img/s \(forward +\d+%\) \| "
        rf"2 loop processes +{NUMBER} img/s per core = {NUMBER}x \| "
        rf"job 2 actors +{NUMBER} img/s = +{NUMBER} per core \(forward +\d+%, outside shards +{NUMBER} s per actor\) = "
        rf"{NUMBER}x of the loop per core; "
        r"same bytes: True$"
    )
    assert re.search(line, out, re.M), out


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
