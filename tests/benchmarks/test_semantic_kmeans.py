"""``benchmarks/semantic_kmeans.py`` at a small size: both k-means forms find every planted copy."""

import re


def test_flat_and_tree_find_the_planted_copies(bench):
    out = bench("semantic_kmeans.py", "--sizes", "4000", "--cluster-size", "50")
    for name in ("flat", "tree"):
        m = re.search(
            rf"k= +80 {name}: call .* dropped ([\d,]+) of ([\d,]+) planted \(recall ([\d.]+), outside planted groups 0\)",
            out,
        )
        assert m, out
        assert m.group(1) == m.group(2) and float(m.group(3)) == 1.0, out  # separated copies share a cluster
    assert re.search(r"flat / tree: call \d+\.\d\dx, fit \+ assign \d+\.\d\dx; agreement 1\.0000$", out, re.M), out
