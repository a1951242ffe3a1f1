"""``benchmarks/shard_layout.py`` at a small size prints both layouts and the placement time."""

import re


def test_prints_both_layouts(bench):
    out = bench("shard_layout.py", "--partitions", "20", "--per-partition", "50", "--samples-per-shard", "8")
    assert re.search(r"^per partition +shards= +20 ", out, re.M), out
    assert re.search(r"^mixed N=8 +shards= +\d+  size min/median/max=\d+/8/8  last=\d ", out, re.M), out
    assert re.search(r"^placement: \d+\.\d{3} CPU s", out, re.M), out
