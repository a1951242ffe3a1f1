"""``benchmarks/onnx_precision.py`` on the tiny pose model at a small input (each model costs two
exports): both graphs within the export's tolerance, and how far fp16 moves the heatmap peaks."""

import re

from models.onnx_export import TOLERANCE


def test_prints_each_graphs_error_and_the_fp16_agreement(bench):
    args = ("--models", "sapiens2_tiny_pose", "--seeds", "1", "--hw", "64", "48")
    out = bench("onnx_precision.py", *args, timeout=900)  # two ONNX exports: minutes on a loaded 2-core machine
    lines = {
        m[1]: m
        for m in re.finditer(
            r"^(sapiens2_tiny_\w+) +64x48 +seed 0: vs eager fp32: fp32 graph abs ([\d.e+-]+), fp16 graph rel ([\d.e+-]+) "
            r"\| fp16 vs fp32 graph on \d+ photos: (.*)$",
            out,
            re.M,
        )
    }
    assert set(lines) == {"sapiens2_tiny_pose"}, out
    for m in lines.values():
        assert float(m[2]) <= TOLERANCE["fp32"] and float(m[3]) <= TOLERANCE["fp16"], m[0]
    assert re.search(r"same maximum [\d.]+% of keypoints, furthest [\d.]+ px", lines["sapiens2_tiny_pose"][4]), out
