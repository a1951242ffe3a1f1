"""``benchmarks/dino_diagnostics.py`` at its smallest size prints a row per step and the tail means."""

import json
import re

COLUMNS = "step mae cl koleo H_t H_s H_mean_t pmax_t cls_std logit_sd |c| z_mean proto_mean g_head g_bb gcl_bb gmae_bb"


def test_prints_header_rows_and_tail(bench):
    rows = bench.tmp / "rows.json"
    out = bench(
        "dino_diagnostics.py",
        *("--steps", "2", "--every", "1", "--images", "8", "--image-hw", "64", "48", "--batch", "2"),
        *("--shards", str(bench.tmp / "shards"), "--per-loss-grads", "--json", str(rows)),
    )
    assert re.search(r"^# .*pretrain_tiny\.yaml .*\| steps 2 batch 2 K 4096 \(ln K = 8\.318\) ", out, re.M), out
    assert re.search(r"\| 1 shards, 8 images$", out, re.M), out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == COLUMNS.split())
    for step in (1, 2):
        values = lines[header + step].split()
        assert values[0] == str(step) and len(values) == len(COLUMNS.split())
        assert all(re.fullmatch(r"-?[\d.]+(e[-+]\d+)?", v) for v in values[1:]), values
    assert re.search(
        r"^# last 1 steps: mae \d\.\d{4} cl \d\.\d{4} \(ln K 8\.3178\) koleo -?\d+\.\d{4}; \d+s$", out, re.M
    )
    assert [r["step"] for r in json.loads(rows.read_text())["rows"]] == [1, 2]


def test_help_explains_the_columns(bench):
    out = bench("dino_diagnostics.py", "--help")
    assert "columns:" in out
    for column in ("H_t", "cls_std", "z_mean", "proto_mean", "gcl_bb, gmae_bb"):
        assert re.search(rf"^  {re.escape(column)} +\S", out, re.M), column
