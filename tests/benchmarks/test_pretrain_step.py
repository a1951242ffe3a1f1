"""``benchmarks/pretrain_step.py`` at its smallest size: the step-only mode (the GPU mode's code on
CPU/gloo) and, marked slow, the default mode through Ray Train with its loader."""

import re

import pytest


def test_step_only_prints_step_time_and_loss(bench):
    out = bench("pretrain_step.py", "--step-only", "--steps", "1", "--warmup", "0", "--batch", "2")
    assert re.search(
        r"^sapiens2_tiny \(\d\.\d\d B backbone params\), 1 x CPU process \(\d+ threads\), torch ", out, re.M
    )
    assert re.search(r"^batch 2/GPU: 2 x 96x64 global \+ \d+ x 48x32 local crops, mask ratio 0\.75; ", out, re.M), out
    assert re.search(r"^\d+\.\d ms/step \(median of 1; min \d+\.\d\)  \d+\.\d img/s  [\d,]+ tokens/s  ", out, re.M)
    assert re.search(r"^last loss \d+\.\d{4}$", out, re.M), out


@pytest.mark.slow
def test_ray_train_mode_prints_images_per_second(bench):
    out = bench("pretrain_step.py", "--workers", "1", "--steps", "1", "--warmup", "0", "--batch", "2")
    assert "(the real path: Ray Train, FSDP2, loader processes decoding JPEG shards" in out
    assert re.search(
        r"^1 worker\(s\) x 1 thread\(s\), batch 2/worker, \d+ loader process\(es\)/worker: +\d+\.\d ms/step "
        r"\(median\) +\d+\.\d\d img/s  data wait +\d+\.\d% of step  \(run wall \d+ s\)$",
        out,
        re.M,
    ), out


def test_gpu_mode_is_offered(bench):
    """``--device cuda`` needs a GPU: here only its options are checked."""
    out = bench("pretrain_step.py", "--help")
    assert "--device {cpu,cuda}" in out and "--peak-tflops" in out
