"""``benchmarks/dedup_scaling.py`` at its smallest size: every family's statistics (the real family's
checked against real PHashes), a row per (method, family, size) with the search's counts, and the
decisions check against imagededup. The image hashes are made afresh (an empty cache folder)."""

import re

NUMBER = r"-?\d+\.\d+"
KINDS = ("uniform", "correlated", "real", "stress")


def test_prints_families_runs_counts_and_the_decisions_check(bench):
    out = bench("dedup_scaling.py", "--smallest", "--cache-dir", str(bench.tmp / "cache"))
    for kind in KINDS:
        assert re.search(
            rf"^hash family {kind}.*: \d+ hashes; DC bit set {NUMBER}%; .*mean \|corr\| between bits {NUMBER}; "
            rf"Hamming distance between unrelated hashes mean {NUMBER}, sd {NUMBER} .*; bits set {NUMBER}$",
            out,
            re.M,
        ), out
        for n in (1000, 2000):  # seconds, rss, traced, dropped, B/bands, per item: band, checked, wasted pairs;
            assert re.search(  # largest bucket, true and accidental pairs
                rf"^ours +{kind} +{n} +{NUMBER} +-?\d+ +\d+ +\d+ +\d+/\d+ +{NUMBER} +{NUMBER} +{NUMBER}"
                rf" +\d+ +\d+ +\d+$",
                out,
                re.M,
            ), out
        assert re.search(rf"^  ours {kind} +: 1e\+03->2e\+03: work \S+->\S+ n\^{NUMBER}, checked pairs", out, re.M), out
    # the real family: made with the pipeline's hash, a PHash's DC bit always set, held against real photos
    assert re.search(r"^  made 2000 real hashes in \d+ s", out, re.M), out
    assert re.search(r"^hash family real: \d+ hashes; DC bit set 100\.0%", out, re.M), out
    # by default every base image is a two-photo collage (a scene of its own)
    assert re.search(r"^  \d+ real photos; base images 100\.0% collages \(--collage-share 1\.0\)", out, re.M), out
    assert re.search(r"^pipeline hash check: (\d+) of \1 generated JPEGs .* hash as Decode does", out, re.M), out
    reference = re.search(r"^  reference: untouched real photos: (\d+) hashes; DC bit set 100\.0%", out, re.M)
    assert reference and int(reference.group(1)) >= 8, out
    assert re.search(r"^    checked at its size: DC bit set 1\.000 \(family 1\.000-1\.000: within\); ", out, re.M), out
    assert re.search(r"^  \d+ blank images \(5% of 2000; .*\): \d+ distinct hashes", out, re.M), out
    for kind in ("uniform", "real"):
        assert re.search(rf"^imagededup +{kind} +1000 +{NUMBER} ", out, re.M), out
        assert re.search(rf"^  {kind} +n= +1000: dropped:groups digest ours=(\S+) imagededup=\1: equal$", out, re.M), (
            out
        )
    assert "  2 comparisons, all equal" in out
    assert "dct" not in out
