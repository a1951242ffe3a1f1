"""``benchmarks/backbone_step.py`` runs end to end at its smallest size and prints its figures."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "backbone_step.py"
SMALLEST = ["--model", "sapiens2_tiny", "--hw", "64", "48", "--batch", "1", "--steps", "1", "--warmup", "0"]
NUMBER = r"\d+\.\d+"


def test_prints_each_model_and_the_ratios():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *SMALLEST], capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "model sapiens2_tiny: dim 64, depth 18" in out
    assert "1 timed steps after 0" in out
    for label in ("sapiens2", "plain"):
        assert re.search(
            rf"^ *{label}: +{NUMBER} M params +{NUMBER} ms/step .* GFLOP/step +{NUMBER} TFLOP/s$", out, re.M
        )
    assert re.search(rf"^ratio sapiens2/plain: time {NUMBER}x .* FLOPs 1\.30x; time per FLOP {NUMBER}x", out, re.M)
    assert re.search(rf"^  per-step ratios, process CPU time: median {NUMBER} .* = {NUMBER}x per FLOP", out, re.M)
