"""``benchmarks/finetune_step.py`` at its smallest size prints both steps and their ratio."""

import re

MS = r"\d+\.\d ms wall +\d+\.\d ms CPU +\d+\.\d\d images/s"


def test_prints_finetune_and_probe_steps(bench):
    out = bench("finetune_step.py", "--hw", "64", "48", "--batch", "2", "--steps", "1", "--warmup", "0")
    assert re.search(r"^sapiens2_tiny \+ seg head \(width 64\), 64x48, batch 2, cpu fp32, median of 1 steps", out, re.M)
    assert re.search(rf"^  fine-tune step +{MS}$", out, re.M), out
    assert re.search(rf"^  frozen-probe step +{MS} +\(baseline\)$", out, re.M), out
    assert re.search(r"^  fine-tune / probe: \d+\.\d\dx wall, \d+\.\d\dx CPU time$", out, re.M), out


def test_gpu_mode_is_offered(bench):
    """The GPU mode (MFU) needs a CUDA device: here only its option is checked."""
    assert "--gpu" in bench("finetune_step.py", "--help")
