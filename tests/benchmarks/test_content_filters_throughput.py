"""``benchmarks/content_filters_throughput.py`` at its smallest size: every stage (CLIP embedding
with its bare-model closure, the NSFW head, artistic, watermark, the aesthetic head, OCR) beside
its bare model, one row each."""

import re

RATES = r"\d+\.\d +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d"
SMALLEST = [
    *("--images", "2", "--batch-sizes", "2", "--repeats", "1", "--threads", "1"),
    *("--clip-models", "ViT-B-32", "--ocr-max-sides", "320", "--head-rows", "16", "--head-batch-sizes", "8"),
]


def test_prints_each_stage_beside_its_bare_model(bench):
    out = bench("content_filters_throughput.py", *SMALLEST)
    assert re.search(r"^# \d+ CPUs, .* \(1 threads\), .* 2 real photos timed per row, 1 warm-up batch", out, re.M)
    rows = {
        "content.embedding": r"ViT-B-32 random init \(cpu\) +2",
        "content.nsfw": r"LAION nsfw head on ViT-B-32 \(cpu\) +8",
        "content.artistic": r"zero-shot on ViT-B-32, \d+ prompts +2",
        "content.aesthetic": r"LAION aesthetic head on ViT-B-32 \(cpu\) +8",
        "content.watermark": r"efficientnet_b3@\d+ \(cpu\) +2",
        "content.text": r"rapidocr det\+rec, max_side 320 \(1 thr\) +\d+",
    }
    for step, model in rows.items():
        assert re.search(rf"^{re.escape(step)} +{model} +{RATES}$", out, re.M), (step, out)
    assert re.search(r"^# total \d+s, load average", out, re.M)
