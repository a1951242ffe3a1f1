"""``benchmarks/dedup_scaling.py`` at its smallest size: every family's statistics, a row per
(method, family, size) with the search's counts, and the decisions check against imagededup."""

import re

NUMBER = r"-?\d+\.\d+"


def test_prints_families_runs_counts_and_the_decisions_check(bench):
    out = bench("dedup_scaling.py", "--smallest")
    for kind in ("uniform", "correlated"):
        assert re.search(
            rf"^hash family {kind}.*: mean \|corr\| between bits {NUMBER}; Hamming distance between unrelated "
            rf"hashes mean {NUMBER}, sd {NUMBER} .*; bits set {NUMBER}$",
            out,
            re.M,
        ), out
        for n in (1000, 2000):  # seconds, rss, traced, dropped, B/bands, candidates/item, true and accidental pairs
            assert re.search(
                rf"^ours +{kind} +{n} +{NUMBER} +-?\d+ +\d+ +\d+ +\d+/\d+ +{NUMBER} +\d+ +\d+$", out, re.M
            ), out
        assert re.search(rf"^  ours {kind} +: 1e\+03->2e\+03: work \S+->\S+ n\^{NUMBER}, candidates", out, re.M), out
    assert re.search(rf"^imagededup +uniform +1000 +{NUMBER} ", out, re.M), out
    assert re.search(r"^  uniform +n= +1000: dropped ours=(\d+) imagededup=\1, .*: equal$", out, re.M), out
    assert "  1 comparisons, all equal" in out
    assert "dct" not in out
