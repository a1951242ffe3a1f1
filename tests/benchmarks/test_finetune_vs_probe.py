"""``benchmarks/finetune_vs_probe.py`` at its smallest size: the ssl stand-in, then probe, fine-tune and
fine-tune from random init on seg and depth, one seed, and the table."""

import json
import re

CELL = r"\d+\.\d{4} ± \d+\.\d{4}"
VERDICT = r"(better|WORSE|same)( \(clear\))?, [01]/1 seeds"
SMALLEST = [
    *("--tasks", "seg,depth", "--steps", "2", "--seeds", "0"),
    *("--pretrain", "ssl", "--pretrain-steps", "2", "--pretrain-images", "8"),
    *("--set", "synthetic.height=64", "synthetic.width=48", "synthetic.train_images=8", "synthetic.val_images=4"),
    *("batch_size_per_worker=2", "optim.warmup_steps=1"),
]


def test_prints_each_run_and_the_table(bench):
    out_dir = bench.tmp / "fvp"
    out = bench("finetune_vs_probe.py", "--out", str(out_dir), *SMALLEST)
    assert re.search(r"^ssl stand-in: 2 steps in \d+s, loss \d\.\d{3} -> \d\.\d{3}$", out, re.M), out
    assert re.search(r"^seg seed 0: probe mIoU=\d\.\d{4}  finetune mIoU=\d\.\d{4}  finetune_random mIoU=", out, re.M)
    assert re.search(r"^steps per run \{'seg': 2, 'depth': 2\}, batch 2, 64x48, seeds \[0\]", out, re.M), out
    for task, metric in [("seg", "mIoU (higher)"), ("depth", "abs_rel (lower)"), ("depth", "rmse (lower)")]:
        row = rf"^\| {task} \| {re.escape(metric)} \| {CELL} \| {CELL} \| {CELL} \| {VERDICT} \| {VERDICT} \|$"
        assert re.search(row, out, re.M), (task, metric, out)
    assert re.search(r"^depth finetune_random per seed: rmse \d\.\d{4}, abs_rel \d+\.\d{4}, delta1 ", out, re.M)
    saved = json.loads((out_dir / "bench.json").read_text())
    assert saved["steps"] == {"seg": 2, "depth": 2} and saved["checkpoint"].endswith("ssl_backbone.safetensors")
    assert set(saved["results"]["seg"]) == {"probe", "finetune", "finetune_random"}
