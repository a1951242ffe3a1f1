"""``benchmarks/near_index_partial.py`` at its smallest size prints the index and one line per batch."""

import re


def test_prints_index_and_each_batch(bench):
    out = bench("near_index_partial.py", "--n", "2000", "--batches", "10", "200")
    assert re.search(r"^index: 2000 rows, P=\d+, written in \d+\.\d s, \d+\.\d MiB$", out, re.M), out
    for b in (10, 200):
        assert re.search(
            rf"^batch +{b}: \d+ dropped \(equal: True\); partitioned: \d+/\d+ files, .* rows streamed, "
            r".* \| whole index: 2000 rows held, \d+\.\d\d s \| ratios: held \d+\.\dx, time \d+\.\d\dx$",
            out,
            re.M,
        ), out
