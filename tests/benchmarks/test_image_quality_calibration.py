"""``benchmarks/image_quality_calibration.py`` at its smallest size: the per-photo tables and, per
kind of copy, whether every copy scored worse than its original and how many the thresholds flag."""

import re


def test_prints_the_tables_and_the_verdict_per_kind_of_copy(bench):
    out = bench("image_quality_calibration.py", "--photos", "2")
    assert re.search(r"^bus +810x1080( +\d+\.\d{3}){6}$", out, re.M), out
    for kind, column in (("blur 1%", "sharpness"), ("+2 EV", "clipped_bright"), ("-2 EV", "clipped_dark")):
        assert re.search(rf"^{re.escape(kind)} +{column} +every copy worse than its original: (yes|NO);", out, re.M), (
            out
        )
    assert re.search(r"flagged \(rank_quality > 0\) at the shipped thresholds: \d+ of 2$", out, re.M), out
