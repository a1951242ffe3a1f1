"""``benchmarks/probe_trained_vs_random.py``: its smallest real run pretrains one step through Ray Train
on the session's curated demo (``--dataset``, so it does not curate again) and probes two backbones
through Ray Train, so it is marked slow; ``--help`` checks the script's imports and options every time."""

import json
import re

import pytest

SMALLEST = [
    *("--pretrain-steps", "1", "--quick"),
    *("--set", "tasks=[seg]", "seg.steps=1", "synthetic.train_images=4", "synthetic.val_images=2"),
    *("--pretrain-set", "batch_size_per_worker=2", "ray.num_workers=1"),
]


def test_help_lists_the_options(bench):
    out = bench("probe_trained_vs_random.py", "--help")
    for option in ("--pretrain-steps", "--quick", "--standins", "--checkpoint", "--set", "--dataset"):
        assert option in out


@pytest.mark.slow
def test_prints_the_headline_table(bench, demo_curated):
    out_dir = bench.tmp / "out"
    dataset = demo_curated[0] / "curated"
    out = bench("probe_trained_vs_random.py", "--out", str(out_dir), "--dataset", str(dataset), *SMALLEST, timeout=900)
    assert re.search(r"^pretrained 1 steps in \d+s, loss ", out, re.M), out
    assert "**Headline: backbones this platform pretrained vs random init (same probe settings)**" in out
    for metric in ("mIoU", "mAcc"):
        assert re.search(
            rf"^\| seg \| {metric} \| higher \| [\d.]+ \| [\d.]+ \| [-+][\d.e-]+ \| (yes|NO|tie) \|$", out, re.M
        )
    assert re.search(r"^pretrained vs random: better on \d of 2 metrics", out, re.M), out
    assert re.search(
        r"^pretrained: checkpoint .*student_backbone\.safetensors -> pretraining run \w+ \(found by", out, re.M
    )
    assert (out_dir / "table.md").is_file()
    assert set(json.loads((out_dir / "bench.json").read_text())["metrics"]) == {"pretrained", "random"}
